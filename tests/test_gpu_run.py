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
