"""A request in the engine's own terms, as specfuzz's adapter maps it: what a repro.py passes.

:func:`sampling_for` turns a finding's :class:`~specfuzz.oracle.params.SamplingParams` into the
engine's sampling arguments through the adapter's own pure mapping functions
(``vllm_engine.sampling_kwargs``, ``sglang_mapping.sampling_params_dict``,
``hf_engine.generation_kwargs``), so a repro.py sends what the campaign sent, and returns the
engine-specific data the script needs besides (bad words and structured outputs for vLLM, the
assistant model's settings for HF, specfuzz's own configs for the reference sampler and
third-party engines). Seeds are left out: the script adds one per request.
"""

from __future__ import annotations

from typing import Any

from specfuzz.engines.base import Request
from specfuzz.errors import SpecfuzzError


def sampling_for(data, params, prompt: list[int] | None = None) -> tuple[dict, dict]:
    """(sampling arguments, extra data block entries) of one request of the finding's case."""
    from specfuzz.fuzz.draft.data import DraftError
    from specfuzz.fuzz.draft.launch import max_model_len

    case, k = data.case, data.engine_kind
    req = Request(tuple(prompt or case.prompt), params, None)
    try:
        if k == "vllm":
            from specfuzz.engines.vllm_engine import sampling_kwargs

            kw = sampling_kwargs(req, vocab_size=case.vocab_size, max_model_len=max_model_len(case),
                                 speculating=case.spec is not None)
            kw.pop("seed", None)
            extra = {"BAD_WORDS": kw.pop("bad_words_token_ids", None), "STRUCTURED": kw.pop("structured_outputs", None)}
            return kw, {n: v for n, v in extra.items() if v is not None}
        if k == "sglang":
            from specfuzz.engines.sglang_mapping import sampling_params_dict

            launch = (data.launch or {}).get("kwargs") or {}
            kw = sampling_params_dict(req, vocab_size=case.vocab_size, max_model_len=max_model_len(case),
                                      tokenizer=not launch.get("skip_tokenizer_init", True),
                                      deterministic=bool(launch.get("enable_deterministic_inference")))
            return kw, {}
        if k == "hf-transformers":
            return _hf(data, req)
        if k == "llamacpp":
            return _llamacpp(data, req)
        if k == "mlx":
            return _mlx(data, req)
    except SpecfuzzError as exc:
        raise DraftError(f"{data.stem}: the request cannot be mapped to the engine's arguments: {exc}") from None
    spec = None if case.spec is None else {**case.spec.to_json(), "inject": None}
    if k == "reference":
        d2t = None if case.draft_d2t is None else [int(t) for t in case.draft_d2t]
        return params.to_json(), {"SPECULATION": spec, "INJECT_AS_FOUND": data.inject, "DRAFT_D2T": d2t}
    settings = dict(data.settings)
    if case.draft_table is not None:
        settings.setdefault("draft_vocab_size", int(case.draft_table.shape[1]))
    if case.draft_d2t is not None:
        settings.setdefault("draft_d2t", [int(t) for t in case.draft_d2t])
    return params.to_json(), {"SPECULATION": spec, "ENGINE_SETTINGS": settings, "MAX_MODEL_LEN": max_model_len(case)}


def _hf(data, req: Request) -> tuple[dict, dict]:
    from specfuzz.engines.hf_engine import SETTINGS, generation_kwargs

    case = data.case
    s = {name: default for name, (default, _) in SETTINGS.items()} | dict(data.settings)
    kw: dict[str, Any] = generation_kwargs(req.params, case.eos_token_id, case.vocab_size)
    spec = case.spec
    assistant = None
    if spec is not None and spec.method == "ngram":
        kw.update(prompt_lookup_num_tokens=int(spec.num_speculative_tokens), max_matching_ngram_size=int(spec.ngram_max))
    elif spec is not None:
        dv = int(case.draft_table.shape[0])  # the draft checkpoint's vocabulary (a square table)
        universal = dv != case.vocab_size if s["universal"] is None else bool(s["universal"])
        assistant = {
            "generation_config": {"num_assistant_tokens": int(spec.num_speculative_tokens),
                                  "num_assistant_tokens_schedule": s["num_assistant_tokens_schedule"],
                                  "assistant_confidence_threshold": float(s["assistant_confidence_threshold"])},
            "universal": universal, "vocab_order": s["assistant_vocab_order"],
            "greedy_separate": universal and s["uag_greedy_draft"] == "separate",
        }
    extra = {"THREADS": int(s["threads"]), "ATTENTION": s["attn_implementation"]}
    if assistant is not None:
        extra["ASSISTANT"] = assistant
    return kw, extra


def _llamacpp(data, req: Request) -> tuple[dict, dict]:
    from pathlib import Path

    from specfuzz.engines.base import EngineConfig
    from specfuzz.engines.llamacpp_engine import SETTINGS, completion_body, server_args
    from specfuzz.fuzz.draft.launch import max_model_len

    case = data.case
    s = {name: default for name, (default, _) in SETTINGS.items()} | dict(data.settings)
    draft = Path("{draft}") if case.spec is not None and case.spec.method == "draft_model" else None
    config = EngineConfig(target_dir=Path("{target}"), draft_dir=draft, speculation=case.spec, dtype="float32",
                          max_model_len=max_model_len(case), settings=dict(data.settings))
    body = completion_body(req, case.vocab_size)
    body.pop("prompt", None)
    body.pop("seed", None)
    return body, {"SERVER_ARGS": server_args(config, Path("{target}"), draft, s), "SLOTS": int(s["slots"])}


def _mlx(data, req: Request) -> tuple[dict, dict]:
    from specfuzz.engines.mlx_engine import SETTINGS, sampling_args, stop_ids

    case = data.case
    s = {name: default for name, (default, _) in SETTINGS.items()} | dict(data.settings)
    sampler, procs = sampling_args(req.params, case.vocab_size)
    spec = case.spec
    k = None if spec is None or spec.engine_default else int(spec.num_speculative_tokens)
    return ({"sampler": sampler, "processors": procs, "stop_ids": sorted(stop_ids(req.params, case.eos_token_id))},
            {"DRAFT_TOKENS": k, "PREFILL_STEP_SIZE": s["prefill_step_size"], "ENGINE_SEED": s["seed"]})
