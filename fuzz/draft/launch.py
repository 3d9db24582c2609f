"""How the engine was started when a finding was made: the launch a draft's repro.py replays.

Entries made since launch records exist carry ``extra["launch"]``: the environment
variables specfuzz's adapter set and the keyword arguments it passed (``vllm.LLM(...)``,
``sglang.Engine(...)`` = ServerArgs), as its ``launch_args(config)`` computed them
(:func:`specfuzz.fuzz.run.launch_record`), with the checkpoint folders as ``{target}`` and
``{draft}``, plus the engine variables the campaign's process environment held
(``inherited_env``).

Older entries lack the record. For them :func:`reconstruct` rebuilds what the adapter
applies for the entry's engine (name, version, device) and case, following the adapters'
code as of this version (``VLLMEngine.launch_args``, ``SGLangEngine.check_config``), and
marks the record ``"source": "reconstructed"`` with a note saying so:

* vLLM: speculation settings mapped as ``VLLMEngine.check_config`` maps them; the model
  runner "auto" rule (Model Runner V2 for EAGLE heads on CUDA, V1 otherwise: vLLM 0.25 on
  CUDA with a non-EAGLE method or speculation off runs V1, ``VLLM_USE_V2_MODEL_RUNNER=0``);
  ``logprobs_mode`` raw_logits (V1) or raw_logprobs (V2); the engine core in-process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: campaigns run engines in daemon child processes);
  on CPU ``VLLM_CPU_KVCACHE_SPACE`` and ``gpu_memory_utilization=0.3``; on CUDA the site
  settings ``bin/gpu-run`` gives every H200 campaign (:data:`GPU_RUN_VLLM_SETTINGS`, with
  the FlashInfer sampler off, :data:`GPU_RUN_VLLM_ENV`); per-request spec-decode metrics
  from vLLM 0.26 on.
* SGLang: the adapter's defaults, ``context_length`` and dtype, and the speculation
  mapping of :func:`specfuzz.engines.sglang_engine.speculative_kwargs` (a pure function).
"""

from __future__ import annotations

import re
from typing import Any, Mapping

TARGET = "{target}"
DRAFT = "{draft}"
# What bin/gpu-run sets for every vLLM engine on the H200 (env_vllm): SPECFUZZ_VLLM_SETTINGS
# (Triton attention, a fifth of the GPU, a fixed 2 GiB KV cache) and the environment.
GPU_RUN_VLLM_SETTINGS: dict[str, Any] = {
    "attention_config": {"backend": "TRITON_ATTN"}, "gpu_memory_utilization": 0.2, "kv_cache_memory_bytes": 2147483648,
}
GPU_RUN_VLLM_ENV: dict[str, str] = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_NO_USAGE_STATS": "1"}
# VLLMEngine's own settings (not vllm.LLM arguments) and its defaults.
VLLM_OWN_SETTINGS = ("multiprocessing", "env", "speculative_config", "cpu_kvcache_space_gib", "shutdown_timeout_s",
                     "model_runner")
VLLM_V2_METHODS = ("eagle", "eagle3")
VLLM_HEAD_METHODS = ("eagle", "eagle3")
VLLM_CPU_MEMORY_UTILIZATION = 0.3
VLLM_CPU_KVCACHE_SPACE_GIB = 1
# The first vLLM release whose EngineArgs has per_request_spec_decode_metrics (0.25 has not, 0.32 has).
VLLM_PER_REQUEST_METRICS_FROM = (0, 26)
SGLANG_OWN_SETTINGS = ("shutdown_timeout_s", "env")


def _version_tuple(v: object) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", str(v))[:3]) or (0,)


def is_record(rec: object) -> bool:
    """Whether ``rec`` is a usable launch record (env and kwargs dicts)."""
    return isinstance(rec, Mapping) and isinstance(rec.get("env"), Mapping) and isinstance(rec.get("kwargs"), Mapping)


def max_model_len(case) -> int:
    """The max_model_len specfuzz gives a case's engine (specfuzz.fuzz.run.engine_config)."""
    return max(64, len(case.prompt) + case.params.max_tokens + 16)


def on_cuda(engine: Mapping) -> bool:
    return "cuda" in str(engine.get("device", "")).lower()


def reconstruct_vllm(engine: Mapping, case, dtype: str, settings: Mapping) -> dict:
    """What VLLMEngine.launch_args gives for this entry (see the module docstring)."""
    cuda = on_cuda(engine)
    st = {**(GPU_RUN_VLLM_SETTINGS if cuda else {}), **dict(settings)}
    spec = case.spec
    runner = st.get("model_runner", "auto")
    if runner == "auto":
        runner = "v2" if cuda and spec is not None and spec.method in VLLM_V2_METHODS else "v1"
    env = {str(k): str(v) for k, v in dict(st.get("env") or {}).items()}
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if cuda:
        env.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1" if runner == "v2" else "0")
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    kwargs: dict[str, Any] = {
        "model": TARGET, "dtype": dtype, "enforce_eager": True, "max_model_len": max_model_len(case), "seed": 0,
        "skip_tokenizer_init": False, "max_logprobs": -1,
        "logprobs_mode": "raw_logprobs" if runner == "v2" else "raw_logits",
    }
    if not cuda:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(st.get("cpu_kvcache_space_gib", env.get("VLLM_CPU_KVCACHE_SPACE", VLLM_CPU_KVCACHE_SPACE_GIB)))
        kwargs["gpu_memory_utilization"] = VLLM_CPU_MEMORY_UTILIZATION
    if spec is not None:
        sc: dict[str, Any] = {"method": spec.method, "num_speculative_tokens": int(spec.num_speculative_tokens)}
        if spec.method == "ngram":
            sc.update(prompt_lookup_min=int(spec.ngram_min), prompt_lookup_max=int(spec.ngram_max))
        else:
            sc.update(model=DRAFT, draft_sample_method="probabilistic" if spec.draft_sampling == "sampled" else "greedy")
        if spec.verify == "block":
            sc["rejection_sample_method"] = "block"
        sc.update(dict(st.get("speculative_config") or {}))
        kwargs["speculative_config"] = sc
        if _version_tuple(engine.get("version")) >= VLLM_PER_REQUEST_METRICS_FROM:
            kwargs["per_request_spec_decode_metrics"] = "summary"
    kwargs.update({k: v for k, v in st.items() if k not in VLLM_OWN_SETTINGS})
    device = "CUDA" if cuda else "CPU"
    note = (f"reconstructed by specfuzz for an entry older than launch records: what the vLLM adapter applies for "
            f"vLLM {engine.get('version', '?')} on {device} and this case (Model Runner {runner.upper()}"
            + (", bin/gpu-run's site settings" if cuda else "") + ")")
    return {"source": "reconstructed", "note": note, "env": env,
            "inherited_env": dict(GPU_RUN_VLLM_ENV) if cuda else {}, "kwargs": kwargs}


def reconstruct_sglang(engine: Mapping, case, dtype: str, settings: Mapping) -> dict:
    """What SGLangEngine.launch_args gives for this entry (see the module docstring)."""
    from pathlib import Path

    from specfuzz.engines.sglang_engine import DEFAULT_SETTINGS, speculative_kwargs

    spec = case.spec
    V = int(case.vocab_size)
    dv = None
    if spec is not None and case.draft_table is not None:
        dv = int(case.draft_table.shape[1]) if spec.method in ("eagle", "eagle3") else V  # STANDALONE: padded square
    spec_kw = speculative_kwargs(spec, draft_dir=Path(DRAFT), target_vocab=V, draft_vocab=dv)
    kwargs = {**DEFAULT_SETTINGS, "model_path": TARGET, "dtype": dtype, "context_length": max_model_len(case), **spec_kw}
    kwargs.update({k: v for k, v in dict(settings).items() if k not in SGLANG_OWN_SETTINGS})
    env = {str(k): str(v) for k, v in dict(settings.get("env") or {}).items()}
    note = (f"reconstructed by specfuzz for an entry older than launch records: what the SGLang adapter applies for "
            f"SGLang {engine.get('version', '?')} and this case (its defaults and speculation mapping)")
    return {"source": "reconstructed", "note": note, "env": env, "inherited_env": {}, "kwargs": kwargs}


# Keyword arguments that load specfuzz's own code into the engine and change nothing on the
# sampling path (vLLM's worker_extension_cls: the table-swap extension): a maintainer's
# install has no specfuzz, so a draft leaves them out and says so.
SPECFUZZ_ONLY_KWARGS = ("worker_extension_cls",)


def replayable(rec: Mapping) -> dict:
    """A launch record as a repro.py can replay it on a stock install (see SPECFUZZ_ONLY_KWARGS)."""
    out = dict(rec)
    kw = dict(rec.get("kwargs") or {})
    dropped = [k for k in SPECFUZZ_ONLY_KWARGS if str(kw.get(k, "")).startswith("specfuzz.")]
    for k in dropped:
        kw.pop(k)
    out["kwargs"] = kw
    if dropped:
        out["left_out"] = {k: "specfuzz's table-swap worker extension: not on the sampling path, and not installed "
                              "with the engine" for k in dropped}
    return out


def launch_for(entry, case, kind: str, dtype: str, settings: Mapping) -> dict | None:
    """The launch a draft replays: the entry's record, or a reconstruction; None for engines
    without launch records (the reference sampler, HF transformers, third-party engines).
    Raises InvalidInput when the adapter could not have run the case (no reconstruction)."""
    rec = entry.extra.get("launch")
    if kind not in ("vllm", "sglang"):
        return dict(rec) if is_record(rec) else None
    if is_record(rec):
        out = {"source": "recorded", "inherited_env": {}, **dict(rec)}
        spec_now, spec_recorded = case.spec, _recorded_spec(rec)
        if spec_now is None and spec_recorded:
            # A calibration entry stored with the speculative run's record: draft it speculation off.
            return reconstruct_vllm(entry.engine, case, dtype, settings) if kind == "vllm" else \
                reconstruct_sglang(entry.engine, case, dtype, settings)
        return replayable(out)
    if kind == "vllm":
        return reconstruct_vllm(entry.engine, case, dtype, settings)
    return reconstruct_sglang(entry.engine, case, dtype, settings)


def _recorded_spec(rec: Mapping) -> bool:
    kw = rec.get("kwargs") or {}
    return bool(kw.get("speculative_config") or kw.get("speculative_algorithm"))
