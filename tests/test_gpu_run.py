"""bin/gpu-run's kernel-cache round trip (the H200 lease machines start with no compiled
kernels: `cache` packs them into $OUT, a later lease carries them as .ship_cache/ and every
step unpacks them first). Shell only: no GPU or engine involved."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("split") is None, reason="needs coreutils split")
def test_kernel_caches_pack_into_parts_and_unpack_once_where_they_were(tmp_path):
    a, b = tmp_path / "home" / ".cache" / "tvm-ffi" / "mod", tmp_path / "home" / ".triton" / "cache" / "k"
    a.mkdir(parents=True), b.mkdir(parents=True)
    (a / "mod.so").write_bytes(os.urandom(40_000))
    (a / "mod.o").write_bytes(b"intermediate")  # build intermediates are left out
    (b / "kernel.cubin").write_text("cubin")
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "bin", repo / "bin")
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "HOME": str(tmp_path / "home"), "OUT": str(out), "JIT_MARK": str(tmp_path / "mark"),
           "JIT_CACHES": f"{tmp_path / 'home' / '.cache' / 'tvm-ffi'} {tmp_path / 'home' / '.triton' / 'cache'} {tmp_path / 'absent'}"}
    p = subprocess.run(["bash", "bin/gpu-run", "cache"], cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    parts = sorted(out.glob("jit_cache.tgz.part-*"))
    assert parts and "WARNING" not in p.stdout
    # A fresh machine: the caches are gone; the parts travel as .ship_cache/.
    shutil.rmtree(tmp_path / "home")
    (repo / ".ship_cache").mkdir()
    for f in parts:
        shutil.copy(f, repo / ".ship_cache" / f.name)
        f.unlink()
    p = subprocess.run(["bash", "bin/gpu-run", "cache"], cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "kernel caches unpacked" in p.stdout, p.stdout + p.stderr
    assert (a / "mod.so").stat().st_size == 40_000 and (b / "kernel.cubin").read_text() == "cubin"
    assert not (a / "mod.o").exists()
    # Unpacked once per machine: a second step leaves what is there alone.
    (b / "kernel.cubin").write_text("newer")
    p = subprocess.run(["bash", "bin/gpu-run", "cache"], cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    assert "kernel caches unpacked" not in p.stdout and (b / "kernel.cubin").read_text() == "newer"


def test_gpu_pool_keeps_running_shares_within_its_budget_and_exits_when_closed(tmp_path):
    """bin/gpu_pool.py (the GPU leases' drafts and impact runs share one GPU through it): jobs
    start first queued first while their memory shares fit the budget, a job that fits alone
    still runs, later-added jobs are taken, and a closed pool exits once its queue is empty."""
    import json
    import sys
    import time

    pool, d = [sys.executable, str(ROOT / "bin" / "gpu_pool.py")], tmp_path / "pool"
    log = tmp_path / "spans.txt"
    job = f"import time,sys; t=time.time(); time.sleep(0.6); open({str(log)!r},'a').write(f'{{sys.argv[1]}} {{t}} {{time.time()}}\\n')"
    for i, share in enumerate((0.3, 0.3, 0.3, 0.9)):
        subprocess.run([*pool, "add", "--dir", str(d), "--name", f"j{i}", "--share", str(share), "--",
                        sys.executable, "-c", job, str(share)], check=True, capture_output=True)
    out = subprocess.run([*pool, "ensure", "--dir", str(d), "--budget", "0.65"], check=True, capture_output=True, text=True)
    assert "pool started" in out.stdout
    subprocess.run([*pool, "add", "--dir", str(d), "--name", "late", "--share", "0.2", "--", sys.executable, "-c", job, "0.2"],
                   check=True, capture_output=True)
    subprocess.run([*pool, "add", "--dir", str(d), "--name", "nosuch", "--share", "0.1", "--", str(tmp_path / "no-such-program")],
                   check=True, capture_output=True)
    bad = subprocess.run([*pool, "add", "--dir", str(d), "--name", "x", "--share", "1.5", "--", "true"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--share 1.5" in bad.stderr
    busy = lambda *prefix: subprocess.run([*pool, "busy", "--dir", str(d), *prefix], capture_output=True).returncode  # noqa: E731
    assert busy() == 0 and busy("--prefix", "late") == 0 and busy("--prefix", "impact-") == 1  # by job name
    subprocess.run([*pool, "close", "--dir", str(d)], check=True)
    pid = int((d / "serve.pid").read_text())
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the closed pool did not exit")
    assert busy() == 1  # no pool, nothing to wait for
    spans = [(float(s), float(a), float(b)) for s, a, b in (line.split() for line in log.read_text().splitlines())]
    assert len(spans) == 5
    for _, a, _ in spans:  # at every job's start, the shares running then stay within 0.65 (one job alone may exceed it)
        running = [s for s, a2, b2 in spans if a2 <= a + 1e-3 and b2 > a]
        assert len(running) == 1 or sum(running) <= 0.65 + 1e-9, running
    done = {f.stem: json.loads(f.read_text())["rc"] for f in (d / "done").glob("*.json")}
    assert done == {"j0": 0, "j1": 0, "j2": 0, "j3": 0, "late": 0, "nosuch": 127}  # a job that cannot start ends alone
