"""Build ``llama-server`` from the llama.cpp source that a llama-cpp-python sdist vendors.

llama-cpp-python is published as an sdist only; it carries the whole llama.cpp tree under
``vendor/llama.cpp/`` (``tools/server/``, ``common/speculative.cpp``). :func:`ensure_server`
downloads the sdist of one release with pip (``pip download --no-deps --no-binary :all:``),
configures llama.cpp with CMake (CPU backend, no network features, no web UI download) and
builds the one target ``llama-server``. The binary is kept under
``<cache>/llama.cpp/<key>/bin/llama-server`` (cache: ``$SPECFUZZ_CACHE`` or
``~/.cache/specfuzz``), where ``<key>`` names the release, the build flags and the CPU (the
build is ``-march=native``): a second call finds it and does nothing. The folder is written
to a temporary name and renamed into place, so an interrupted build never leaves a half
binary behind.

Run as ``python -m specfuzz.engines.llamacpp_build [VERSION]`` (``bin/setup`` does, for
:data:`LLAMA_CPP_PYTHON_VERSION`); it prints the binary's path.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from specfuzz.errors import InvalidInput

# The llama-cpp-python release whose vendored llama.cpp the engine runs by default.
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
# Environment variable naming a llama-server binary to use instead of the built one.
SERVER_ENV = "SPECFUZZ_LLAMA_SERVER"
CACHE_ENV = "SPECFUZZ_CACHE"
# CMake options: CPU backend only, no HTTPS/curl (nothing is downloaded at run time), no web UI
# assets fetched at build time, static libraries so the binary stands alone.
CMAKE_FLAGS: tuple[str, ...] = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=ON",
    "-DGGML_CUDA=OFF",
    "-DGGML_METAL=OFF",
    "-DGGML_VULKAN=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_APP=OFF",
)
TARGET = "llama-server"
# Bumped when the build changes what it produces.
BUILD_RECIPE = 1


def cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    return (Path(env) if env else Path.home() / ".cache" / "specfuzz") / "llama.cpp"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.machine()


def build_key(version: str) -> str:
    """The cache folder name of ``version``'s build: release, recipe, flags and CPU features."""
    h = hashlib.sha256(json.dumps([BUILD_RECIPE, list(CMAKE_FLAGS), _cpu_flags()]).encode()).hexdigest()[:10]
    return f"llama-cpp-python-{version}-cpu-{h}"


def server_path(version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    """Where ``version``'s llama-server is (or will be) cached."""
    return cache_root() / build_key(version) / "bin" / TARGET


def find_server(version: str = LLAMA_CPP_PYTHON_VERSION) -> Path | None:
    """The llama-server to run: ``$SPECFUZZ_LLAMA_SERVER`` if set, else the cached build
    of ``version``, else None (not built)."""
    env = os.environ.get(SERVER_ENV)
    if env:
        return Path(env)
    path = server_path(version)
    return path if path.is_file() and os.access(path, os.X_OK) else None


def _log(msg: str) -> None:
    print(f"llama.cpp build: {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], cwd: Path | None = None, log: Path | None = None) -> None:
    with open(log, "ab") if log else open(os.devnull, "wb") as out:
        rc = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        tail = log.read_text(errors="replace")[-3000:] if log else ""
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed with exit status {rc}\n{tail}")


def download_sdist(version: str, dest: Path) -> Path:
    """``llama-cpp-python==version``'s sdist, fetched by pip into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
          "-q", "-d", str(dest), f"llama-cpp-python=={version}"])
    found = sorted(dest.glob(f"llama_cpp_python-{version}.tar.gz")) + sorted(dest.glob(f"llama-cpp-python-{version}.tar.gz"))
    if not found:
        raise RuntimeError(f"pip downloaded no sdist of llama-cpp-python=={version} into {dest}")
    return found[0]


def _vendored_tree(sdist: Path, into: Path) -> Path:
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if "/vendor/llama.cpp/" in m.name + "/"]
        tar.extractall(into, members=members, filter="data")
    found = [p for p in into.glob("*/vendor/llama.cpp") if (p / "CMakeLists.txt").is_file()]
    if not found:
        raise RuntimeError(f"{sdist.name} has no vendor/llama.cpp/CMakeLists.txt")
    return found[0]


def ensure_server(version: str = LLAMA_CPP_PYTHON_VERSION, *, jobs: int | None = None, sdist: Path | None = None) -> Path:
    """The cached llama-server of ``version``, built first when missing (minutes)."""
    if not version or any(c not in "0123456789.abcrpost" for c in version):
        raise InvalidInput("llama-cpp-python version", version, "a release number such as 0.3.36")
    out = server_path(version)
    if out.is_file():
        return out
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"building llama-server needs {tool!r} on PATH (apt-get install cmake g++)")
    folder = out.parent.parent
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    t0 = time.monotonic()
    try:
        log = work / "build.log"
        if sdist is None:
            _log(f"downloading llama-cpp-python=={version} (sdist)")
            sdist = download_sdist(version, work / "sdist")
        src = _vendored_tree(Path(sdist), work / "src")
        build = work / "build"
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        _log(f"configuring {src.relative_to(work)} (log: {log})")
        _run(["cmake", "-S", str(src), "-B", str(build), *gen, *CMAKE_FLAGS], log=log)
        _log(f"building {TARGET} with {jobs or os.cpu_count()} jobs (takes minutes)")
        _run(["cmake", "--build", str(build), "--target", TARGET, "-j", str(jobs or os.cpu_count() or 1)], log=log)
        binary = build / "bin" / TARGET
        if not binary.is_file():
            raise RuntimeError(f"the build produced no {binary}")
        final = work / "final"
        (final / "bin").mkdir(parents=True)
        shutil.copy2(binary, final / "bin" / TARGET)
        (final / "build.json").write_text(json.dumps({
            "llama_cpp_python": version, "cmake_flags": list(CMAKE_FLAGS), "recipe": BUILD_RECIPE,
            "seconds": round(time.monotonic() - t0, 1)}, indent=1))
        try:
            os.rename(final, folder)
        except OSError:
            if not out.is_file():
                raise
        _log(f"built {out} in {time.monotonic() - t0:.0f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    version = args[0] if args else LLAMA_CPP_PYTHON_VERSION
    try:
        print(ensure_server(version))
    except (RuntimeError, InvalidInput) as exc:
        print(f"llama.cpp build failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
