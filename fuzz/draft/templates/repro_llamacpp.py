# Template: the engine part of a repro.py for llama.cpp's llama-server (specfuzz.fuzz.draft.repro renders
# it), driven over HTTP as specfuzz's llamacpp adapter drives it: TARGET_GGUF / DRAFT_GGUF are the GGUF
# files specfuzz.tablegen wrote for the campaign (key-value pairs, sparse tensors), SERVER_ARGS the
# options the adapter passed, SAMPLING its /completion body. The imports above the "repro.py begins"
# line are for linting and testing this file alone.
import json
import os

from specfuzz.fuzz.draft.templates.repro_common import ENGINE_VERSION

TARGET_GGUF = {"arch": "llama", "kv": {}, "tensors": {}}
DRAFT_GGUF = None
SERVER_ARGS = []
SLOTS = 4

# ---- repro.py begins ----


# ---- the engine: llama-server over HTTP (POST /completion), as specfuzz's llamacpp adapter runs it -----
def write_gguf(path, spec):
    """A GGUF file from its key-value pairs ([type, value, element type]) and [shape, fill, entries] tensors."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(path, spec["arch"])
    for key, (vtype, value, sub) in spec["kv"].items():
        w.add_key_value(key, value, gguf.GGUFValueType[vtype], sub_type=sub and gguf.GGUFValueType[sub])
    for name, (shape, fill, entries) in spec["tensors"].items():
        t = np.full(shape, fill, dtype=np.float32)
        for *index, value in entries:
            t[tuple(index)] = value
        w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_checkpoints(root):
    dirs = {"{target}": write_gguf(os.path.join(root, "target.gguf"), TARGET_GGUF)}
    if DRAFT_GGUF is not None:
        dirs["{draft}"] = write_gguf(os.path.join(root, "draft.gguf"), DRAFT_GGUF)
    return dirs


def start_engine(dirs, args):
    """generate(seeds, requests): one /completion request per seed, SLOTS at a time."""
    import atexit
    import subprocess
    import time
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    got = subprocess.run([args.server, "--version"], capture_output=True, text=True, timeout=60)
    version = " ".join(ln.strip() for ln in (got.stdout + got.stderr).splitlines() if ln.startswith("version"))
    print(f"engine: llama-server {version} (the finding: llama-cpp-python {ENGINE_VERSION})", flush=True)
    port = 20000 + int.from_bytes(os.urandom(2), "little") % 20000
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([args.server, "--host", "127.0.0.1", "--port", str(port), *[dirs.get(a, a) for a in SERVER_ARGS]],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    atexit.register(proc.kill)
    while not probe(url):
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with status {proc.returncode} while starting")
        time.sleep(0.1)

    def post(body):
        req = urllib.request.Request(f"{url}/completion", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            return tuple(int(t) for t in json.loads(r.read())["tokens"])

    pool = ThreadPoolExecutor(max_workers=SLOTS)

    def generate(seeds, requests):
        return list(pool.map(post, [{**s, "prompt": p, "seed": seed & 0xFFFFFFFF} for (p, s), seed in zip(requests, seeds)]))

    generate.close = lambda: (pool.shutdown(wait=True), proc.terminate(), proc.wait(timeout=30))
    return generate


def probe(url):
    import urllib.request

    try:
        return urllib.request.urlopen(f"{url}/health", timeout=5).status == 200
    except OSError:
        return False


def add_engine_arguments(ap):
    ap.add_argument("--server", default="llama-server",
                    help="the llama-server binary (build it from llama.cpp: the tree vendored by the release above)")
