# Template: the engine part of a repro.py for llama.cpp's llama-server (specfuzz.fuzz.draft.repro
# renders it), driven over HTTP as specfuzz's llamacpp adapter drives it. The imports above the
# "repro.py begins" line are for linting and testing this file alone; in the script these names are its own.
from specfuzz.fuzz.draft.templates.repro_common import (
    DRAFT_TABLE, ENGINE_SETTINGS, ENGINE_VERSION, EOS_TOKEN_ID, MASKED_LOGIT, MAX_MODEL_LEN, PROMPT, SPECULATION,
    TARGET_TABLE, TOKEN_TEXTS, VOCAB_SIZE,
)

# ---- repro.py begins ----

# ---- the engine: llama-server over HTTP (POST /completion), as specfuzz's llamacpp adapter runs it ----
DEFAULT_BATCH = 200
GREEDY_TEMPERATURE_EPS = 1e-5
PENALTY_LAST_N = 64
SETTING_DEFAULTS = {"slots": 4, "threads": 1, "cache_prompt": True, "ngram_type": "ngram-simple", "draft_n_min": 0,
                    "draft_p_min": 0.0, "extra_args": []}


def add_engine_arguments(ap):
    ap.add_argument("--server", default="llama-server",
                    help="the llama-server binary (default: llama-server on PATH; build it from llama.cpp, "
                         "e.g. the tree vendored in the llama-cpp-python sdist of the version above)")


def describe(args):
    import subprocess

    try:
        got = subprocess.run([args.server, "--version"], capture_output=True, text=True, timeout=30)
        ver = " ".join(ln.strip() for ln in (got.stdout + got.stderr).splitlines() if ln.startswith("version"))
    except OSError as exc:
        ver = f"not runnable ({exc})"
    return f"engine: {args.server} {ver} (the finding: llama-cpp-python {ENGINE_VERSION})"


def write_gguf(path, table, eos):
    """A float32 GGUF whose logits after token i are table[i] (one-hot embeddings, zero attention
    and MLP outputs, the table in the output matrix), plus a pad token (id V) of probability 0."""
    import math

    import gguf
    import numpy as np

    T = np.where(np.isfinite(np.asarray(table, dtype=np.float32)), np.asarray(table, dtype=np.float32), MASKED_LOGIT)
    V = T.shape[0]
    H = 16
    while H < V + 1:
        H *= 4
    s, inter, qo = math.isqrt(H), max(64, H), 64
    embed = np.zeros((V + 1, H), dtype=np.float32)
    embed[np.arange(V + 1), np.arange(V + 1)] = s
    out = np.zeros((V + 1, H), dtype=np.float32)
    out[:V, :V] = T.T
    out[V, :] = MASKED_LOGIT
    w = gguf.GGUFWriter(path, "llama")
    w.add_uint32("specfuzz.table_model", 1)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(256)
    w.add_embedding_length(H)
    w.add_block_count(1)
    w.add_feed_forward_length(inter)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_key_length(qo)
    w.add_value_length(qo)
    w.add_rope_dimension_count(qo)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(2.0 ** -60)
    w.add_vocab_size(V + 1)
    w.add_tokenizer_model("llama")
    w.add_token_list(list(TOKEN_TEXTS[:V]) + ["<pad>"])
    w.add_token_scores([0.0] * (V + 1))
    w.add_token_types([3 if i == V or i == eos else 1 for i in range(V + 1)])
    w.add_bos_token_id(V)
    w.add_unk_token_id(V)
    w.add_eos_token_id(V if eos is None else int(eos))
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_tensor("token_embd.weight", embed)
    z = np.zeros
    for name, shape in (("attn_q", (qo, H)), ("attn_k", (qo, H)), ("attn_v", (qo, H)), ("attn_output", (H, qo)),
                        ("ffn_gate", (inter, H)), ("ffn_up", (inter, H)), ("ffn_down", (H, inter))):
        w.add_tensor(f"blk.0.{name}.weight", z(shape, dtype=np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(H, dtype=np.float32))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(H, dtype=np.float32))
    w.add_tensor("output_norm.weight", np.full(H, 1.0 / s, dtype=np.float32))
    w.add_tensor("output.weight", out)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def server_command(args, target, draft, port, s):
    cmd = [args.server, "--host", "127.0.0.1", "--port", str(port), "-m", target, "-np", str(s["slots"]),
           "-c", str(s["slots"] * (MAX_MODEL_LEN + 32)), "-t", str(s["threads"]), "-tb", str(s["threads"]),
           "--no-warmup", "--no-webui", *s["extra_args"]]
    spec = SPECULATION
    if spec is None:
        return cmd
    K = str(spec["num_speculative_tokens"])
    if spec["method"] == "draft_model":
        cmd += ["-md", draft, "--spec-type", "draft-simple"]
        if not spec.get("engine_default"):
            cmd += ["--spec-draft-n-max", K, "--spec-draft-n-min", str(s["draft_n_min"]), "--spec-draft-p-min", str(s["draft_p_min"])]
        return cmd
    kind = s["ngram_type"]
    cmd += ["--spec-type", kind]
    if spec.get("engine_default"):
        return cmd
    if kind == "ngram-mod":
        return cmd + ["--spec-ngram-mod-n-match", str(spec["ngram_max"]), "--spec-ngram-mod-n-min", "1", "--spec-ngram-mod-n-max", K]
    flag = kind.replace("ngram-", "--spec-ngram-")
    return cmd + [f"{flag}-size-n", str(spec["ngram_max"]), f"{flag}-size-m", K]


def completion_body(p, prompt, seed, cache_prompt):
    """specfuzz's SamplingParams -> /completion JSON (every sampler parameter stated: llama-server's
    own defaults are top-k 40, top-p 0.95, min-p 0.05, temperature 0.8)."""
    return {"prompt": list(prompt), "n_predict": int(p["max_tokens"]), "return_tokens": True, "stream": False,
            "seed": int(seed) & 0xFFFFFFFF, "cache_prompt": bool(cache_prompt),
            "temperature": 0.0 if p["temperature"] < GREEDY_TEMPERATURE_EPS else float(p["temperature"]),
            "top_k": max(int(p["top_k"]), 0), "top_p": float(p["top_p"]), "min_p": float(p["min_p"]),
            "typical_p": 1.0, "xtc_probability": 0.0, "top_n_sigma": -1.0, "dry_multiplier": 0.0, "mirostat": 0,
            "dynatemp_range": 0.0, "repeat_last_n": PENALTY_LAST_N, "repeat_penalty": float(p["repetition_penalty"]),
            "frequency_penalty": float(p["frequency_penalty"]), "presence_penalty": float(p["presence_penalty"]),
            "ignore_eos": bool(p["ignore_eos"]), "n_probs": 0, "min_keep": 0,
            "logit_bias": [[int(t), float(b)] for t, b in p["logit_bias"].items()]}


def start_engine(ckpt, args):
    import atexit
    import http.client
    import json
    import os
    import socket
    import subprocess
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    s = {**SETTING_DEFAULTS, **{k: v for k, v in ENGINE_SETTINGS.items() if k in SETTING_DEFAULTS}}
    root = os.path.dirname(ckpt.target)
    target = write_gguf(os.path.join(root, "target.gguf"), TARGET_TABLE, EOS_TOKEN_ID)
    draft = None
    if SPECULATION is not None and SPECULATION["method"] == "draft_model":
        draft = write_gguf(os.path.join(root, "draft.gguf"), [row[:VOCAB_SIZE] for row in DRAFT_TABLE[:VOCAB_SIZE]], EOS_TOKEN_ID)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = server_command(args, target, draft, port, s)
    print("server:", " ".join(cmd))
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    atexit.register(proc.kill)
    for _ in range(1200):
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with status {proc.returncode} while starting")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            ok = c.getresponse().status == 200
            c.close()
            if ok:
                break
        except OSError:
            pass
        time.sleep(0.05)
    local = threading.local()

    def post(body):
        if getattr(local, "conn", None) is None:
            local.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        local.conn.request("POST", "/completion", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = local.conn.getresponse()
        text = r.read()
        if r.status != 200:
            raise RuntimeError(f"llama-server answered HTTP {r.status}: {text[:300]!r}")
        return tuple(int(t) for t in json.loads(text)["tokens"])

    pool = ThreadPoolExecutor(max_workers=int(s["slots"]))

    def generate(sampling, seeds, prompts=None):
        # one request per seed; sampling and prompts may also be lists, one per seed (a mixed batch)
        samplings = sampling if isinstance(sampling, list) else [sampling] * len(seeds)
        bodies = [completion_body(p, pr, sd, s["cache_prompt"])
                  for p, sd, pr in zip(samplings, seeds, prompts or [PROMPT] * len(seeds))]
        return list(pool.map(post, bodies))

    def close():
        pool.shutdown(wait=True)
        proc.terminate()
        proc.wait(timeout=30)

    generate.close = close
    return generate
