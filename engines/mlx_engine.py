"""mlx-lm behind the Engine interface (MLX's CPU backend on Linux, Metal on macOS).

What it runs
------------
Every request is one ``mlx_lm.stream_generate`` call, as a library user (and
``mlx_lm.server``) makes it: batch size 1, a fresh KV cache per request.

* Speculation off: ``stream_generate(model, tokenizer, prompt, max_tokens, sampler=...,
  logits_processors=...)``, i.e. ``generate_step``.
* ``draft_model``: the same call with ``draft_model=`` and ``num_draft_tokens=K``, i.e.
  ``speculative_generate_step``. Each round the draft model samples K tokens with the
  request's sampler and processors, the target samples a token at each of the K + 1
  positions in one forward pass, the drafts are kept up to the first one that differs
  from the target's sample, and the target's sample at that position (or after the last
  draft) is emitted; both KV caches are trimmed. The engine-default variant sends no
  ``num_draft_tokens`` (``speculative_generate_step``'s default, 2; mlx_lm's CLI and
  server default to 3).

Mapping of :class:`SamplingParams` (:func:`sampling_args`): ``make_sampler(temp, top_p,
min_p, top_k=...)`` with ``temp=0`` (mlx-lm's greedy) for ``temperature < 1e-5`` and
``top_k=0`` (off) for ``top_k >= V`` (mlx-lm raises ValueError for such a k; it keeps every
token, as the oracle says); ``make_logits_processors(logit_bias, repetition_penalty,
presence_penalty=, frequency_penalty=)`` with the default context sizes (20), a processor
only for a feature that is on. ``stop_token_ids`` and ``ignore_eos`` set the tokenizer's
``eos_token_ids`` (the set ``stream_generate`` stops on): EOS unless ``ignore_eos``, plus
the stop ids. A seeded request calls ``mx.random.seed(seed)`` first (what mlx_lm.server does
for a request's ``seed``); unseeded requests continue the global random state.

Semantics: the ``"mlx"`` profile (:mod:`specfuzz.oracle.semantics_mlx`). Unsupported (no
mlx-lm option): min_tokens, allowed tokens, bad words, grammars, thinking budgets
(InvalidInput). Only float32: mlx-lm computes the sampler's log-probabilities in the model's
dtype, which in bfloat16/float16 rounds the law itself.

Table checkpoints are checked row by row through the models' own logits
(:meth:`MLXEngine.check_tables`) at start (a mismatch raises :class:`TableMismatch`: a crash,
never a verdict) and after every swap; swaps load new tables into the running models
(``load_weights``, in place).

Engine settings (``EngineConfig.settings``): :data:`SETTINGS`.
"""

from __future__ import annotations

import json
import platform
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from specfuzz.engines.base import (
    Capabilities, Completion, Engine, EngineConfig, Request, SwapReport, SwapUnsupported, TableCheck, read_config,
    check_speculation, merged_settings, refuse_unsupported, swap_parts,
)
from specfuzz.errors import InvalidInput
from specfuzz.oracle.params import SamplingParams
from specfuzz.oracle.semantics_mlx import MLX_UNSUPPORTED
from specfuzz.tablegen.checkpoint import META_FILE

ENGINE_NAME = "mlx-lm"
METHODS = ("draft_model",)
DTYPES = ("float32",)
SAMPLING = frozenset({
    "temperature", "top_k", "top_p", "min_p", "logit_bias", "repetition_penalty", "presence_penalty",
    "frequency_penalty", "max_tokens", "stop_token_ids", "ignore_eos",
})
# speculative_generate_step's num_draft_tokens when none is passed (read from the installed
# mlx-lm when it can be; this is 0.32.2's).
DEFAULT_NUM_DRAFT_TOKENS = 2
WEIGHTS_FILE = "model.safetensors"

# Engine settings: name -> (default, what is allowed).
SETTINGS: dict[str, tuple[Any, str]] = {
    # Prompt tokens per prefill chunk (stream_generate's prefill_step_size); None: mlx-lm's
    # default (2048 for generate_step, 512 for speculative_generate_step).
    "prefill_step_size": (None, "None or an integer >= 1"),
    # Seed of the global random state at start (requests without a seed continue from it).
    "seed": (None, "None or an integer >= 0"),
}
# Settings other adapters' callers pass that this engine accepts and ignores (the draft's
# checkpoint says its width; a draft of another width is refused by validate()).
PASSTHROUGH_SETTINGS = ("draft_vocab_size", "draft_d2t")


def default_num_draft_tokens() -> int:
    """speculative_generate_step's default ``num_draft_tokens`` in the installed mlx-lm."""
    try:
        import inspect

        from mlx_lm.generate import speculative_generate_step

        return int(inspect.signature(speculative_generate_step).parameters["num_draft_tokens"].default)
    except Exception:  # noqa: BLE001 - mlx-lm missing or another layout: the pinned release's value
        return DEFAULT_NUM_DRAFT_TOKENS


def check_params(params: SamplingParams, vocab_size: int) -> None:
    """Raise InvalidInput for a parameter mlx-lm has no option for."""
    refuse_unsupported(params, MLX_UNSUPPORTED, "mlx-lm (make_sampler / make_logits_processors)", vocab_size)


def sampling_args(params: SamplingParams, vocab_size: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(make_sampler keyword arguments, make_logits_processors keyword arguments) for one request."""
    check_params(params, vocab_size)
    k = int(params.top_k)
    sampler = {"temp": 0.0 if params.greedy else float(params.temperature), "top_p": float(params.top_p),
               "min_p": float(params.min_p), "top_k": k if 1 <= k < vocab_size else 0}
    procs: dict[str, Any] = {}
    if params.logit_bias:
        procs["logit_bias"] = {int(t): float(b) for t, b in dict(params.logit_bias).items()}
    if params.repetition_penalty != 1.0:
        procs["repetition_penalty"] = float(params.repetition_penalty)
    if params.presence_penalty != 0.0:
        procs["presence_penalty"] = float(params.presence_penalty)
    if params.frequency_penalty != 0.0:
        procs["frequency_penalty"] = float(params.frequency_penalty)
    return sampler, procs


def stop_ids(params: SamplingParams, eos_token_id: int | None) -> set[int]:
    """The tokenizer's ``eos_token_ids`` for a request: EOS unless ignore_eos, plus the stop ids."""
    ids = {int(t) for t in params.stop_token_ids}
    if eos_token_id is not None and not params.ignore_eos:
        ids.add(int(eos_token_id))
    return ids


def proposed_drafts(from_draft: Sequence[bool], max_tokens: int, k: int) -> int:
    """Draft tokens speculative_generate_step proposed for an output whose tokens came from
    the draft (accepted) or the target as ``from_draft`` says: its rounds replayed (each
    proposes ``min(max_tokens - emitted, k)``, emits the accepted drafts and then, below
    max_tokens, the target's token)."""
    proposed = emitted = i = 0
    n = len(from_draft)
    while i < n:
        proposed += min(max_tokens - emitted, k)
        while i < n and from_draft[i]:
            i += 1
            emitted += 1
        if i < n and emitted < max_tokens:
            i += 1
            emitted += 1
    return proposed


def checkpoint_table(d: Path) -> np.ndarray:
    """The [V, V] float32 table a checkpoint's lm_head holds (``table[prev, next]``), read with
    mlx (tablegen.load_table reads it with torch, which an mlx-lm environment need not have)."""
    import mlx.core as mx

    lm_head = np.array(mx.load(str(Path(d) / WEIGHTS_FILE))["lm_head.weight"].astype(mx.float32))  # [V, H]
    v = lm_head.shape[0]
    return np.ascontiguousarray(lm_head[:, :v].T)  # [V, V]


class TableMismatch(RuntimeError):
    """A table checkpoint whose logits the loaded model does not reproduce (checked at start)."""


def _eos_of(cfg: Mapping) -> int | None:
    eos = cfg.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return eos


def _check_rope_theta(cfg: dict, name: str) -> None:
    """mlx-lm reads config.json itself and takes RoPE's base from the top-level ``rope_theta``
    (default 10,000), not from transformers 5's ``rope_parameters``: a checkpoint with only the
    latter would run another network than the one HF and the oracle see. Refused, saying what to add."""
    rope = cfg.get("rope_parameters")
    want = rope.get("rope_theta") if isinstance(rope, dict) else None
    if want is not None and cfg.get("rope_theta") != want:
        raise InvalidInput(f"{name} config.json rope_theta", cfg.get("rope_theta"),
                           f"{want}, rope_parameters' value (mlx-lm reads the top-level key only; add it to config.json)")


class MLXEngine(Engine):
    """mlx-lm's ``stream_generate`` (see the module docstring)."""

    name = ENGINE_NAME

    def __init__(self, **default_settings: Any) -> None:
        self._defaults = dict(default_settings)
        self._config: EngineConfig | None = None
        self._plan: dict[str, Any] = {}
        self._model = None
        self._draft = None
        self._tokenizer = None
        self._sampling_cache: OrderedDict[str, tuple[Any, list]] = OrderedDict()

    # -- description -----------------------------------------------------------------

    def capabilities(self) -> Capabilities:
        from specfuzz.tablegen.vocab import MAX_VOCAB

        return Capabilities(
            methods=METHODS, sampling=SAMPLING, dtypes=DTYPES, profile="mlx", max_vocab=MAX_VOCAB, draft_vocab="equal",
            # The draft samples with the request's own sampler; verification keeps drafts equal to
            # the target's samples (token by token).
            spec_knobs={"verify": ("token",), "draft_sampling": ("sampled",), "draft_temperature": (None,)},
            swap=frozenset({"target", "draft"}),
            spec_defaults={"draft_model": {"num_speculative_tokens": default_num_draft_tokens()}},
        )

    def version(self) -> Mapping[str, str]:
        import mlx.core as mx
        import mlx_lm

        from specfuzz.engines.base import _cpu_model

        dev = mx.default_device()
        return {
            "name": ENGINE_NAME,
            "version": mlx_lm.__version__,
            "mlx_lm": mlx_lm.__version__,
            "mlx": mx.__version__,
            "device": f"cpu {_cpu_model()}" if dev == mx.cpu else f"gpu {platform.machine()}",
            "machine": platform.machine(),
            "python": platform.python_version(),
        }

    # -- start -------------------------------------------------------------------------

    def _settings(self, config: EngineConfig) -> dict[str, Any]:
        out = merged_settings(SETTINGS, self._defaults, config.settings, passthrough=PASSTHROUGH_SETTINGS)
        for name, lo in (("prefill_step_size", 1), ("seed", 0)):
            v = out[name]
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < lo):
                raise InvalidInput(name, v, SETTINGS[name][1])
        return out

    def validate(self, config: EngineConfig) -> dict[str, Any]:
        """Everything :meth:`start` checks before loading a model; returns the plan."""
        if config.dtype not in DTYPES:
            raise InvalidInput("dtype", config.dtype, f"one of {DTYPES} (mlx-lm computes the sampler's log-probabilities "
                               "in the model's dtype, which rounds the law in bfloat16/float16)")
        settings = self._settings(config)
        tcfg = read_config(config.target_dir, "target_dir")
        V = tcfg.get("vocab_size")
        if isinstance(V, bool) or not isinstance(V, int) or V < 2:
            raise InvalidInput("target vocab_size", V, "an integer >= 2 in config.json")
        _check_rope_theta(tcfg, "target_dir")
        plan: dict[str, Any] = {"settings": settings, "vocab_size": V, "eos": _eos_of(tcfg), "k": None}
        spec = config.speculation
        if spec is None:
            return plan
        check_speculation(spec, METHODS, "mlx-lm: a draft model")
        for field, allowed in (("verify", "token"), ("draft_sampling", "sampled"), ("draft_temperature", None)):
            if getattr(spec, field) != allowed:
                raise InvalidInput(field, getattr(spec, field), f"{allowed!r}: mlx-lm's draft samples with the request's "
                                   "sampler and its drafts are kept while they equal the target's samples")
        if spec.inject is not None:
            raise InvalidInput("inject", spec.inject, "None (bug injection is the reference engine's)")
        if config.draft_dir is None:
            raise InvalidInput("draft_dir", None, "a draft checkpoint folder for method 'draft_model'")
        dcfg = read_config(config.draft_dir, "draft_dir")
        _check_rope_theta(dcfg, "draft_dir")
        if dcfg.get("vocab_size") != V:
            raise InvalidInput("draft vocab_size", dcfg.get("vocab_size"),
                               f"{V}, the target's (mlx-lm refuses a draft whose tokenizer differs from the target's)")
        d2t = config.draft_d2t
        if d2t is not None and tuple(d2t) != tuple(range(len(tuple(d2t)))):
            raise InvalidInput("draft_d2t", tuple(d2t), "None: mlx-lm's draft shares the target's token ids")
        plan["k"] = None if spec.engine_default else spec.num_speculative_tokens
        return plan

    def _load(self, d: Path, name: str):
        """A table checkpoint as mlx-lm loads it (``mlx_lm.utils.load_model``); InvalidInput
        when it is not one mlx-lm can read."""
        from mlx_lm.utils import load_model

        try:
            model, _ = load_model(Path(d))
        except (FileNotFoundError, ValueError, KeyError) as exc:
            raise InvalidInput(name, str(d), f"a checkpoint mlx-lm can load ({type(exc).__name__}: {exc})") from None
        return model

    @staticmethod
    def _load_tokenizer(d: Path, plan: Mapping[str, Any]):
        """mlx-lm's TokenizerWrapper of the checkpoint's tokenizer. A table checkpoint's tokenizer
        has no unknown token, which mlx-lm's detokenizer probes for (it encodes "a ,b"): the HF
        adapter's normalizer, which drops characters outside the vocabulary, is added to it."""
        from mlx_lm.tokenizer_utils import TokenizerWrapper
        from mlx_lm.utils import load_tokenizer

        from specfuzz.engines.hf_engine import _load_tokenizer

        eos = [] if plan["eos"] is None else [int(plan["eos"])]
        if (Path(d) / META_FILE).is_file():
            return TokenizerWrapper(_load_tokenizer(d, plan["vocab_size"], "native"), eos_token_ids=eos)
        return load_tokenizer(Path(d), eos_token_ids=eos or None)

    def start(self, config: EngineConfig) -> None:
        plan = self.validate(config)  # before loading anything
        import mlx.core as mx

        self.close()
        self._model = self._load(config.target_dir, "target_dir")
        if config.speculation is not None:
            self._draft = self._load(config.draft_dir, "draft_dir")
        self._tokenizer = self._load_tokenizer(config.target_dir, plan)
        if plan["settings"]["seed"] is not None:
            mx.random.seed(int(plan["settings"]["seed"]))
        self._plan = plan
        self._config = config
        if (Path(config.target_dir) / META_FILE).is_file():
            check = self.check_tables()
            if not check.ok:
                self.close()
                raise TableMismatch(f"mlx-lm's logits do not reproduce the table checkpoint {config.target_dir} "
                                    f"(max |diff| {check.max_abs_diff:g}; {check.detail}): not a table model, or mlx-lm "
                                    "computes it otherwise")

    def swap(self, config: EngineConfig) -> SwapReport:
        """Load ``config``'s tables into the running models (``load_weights``, in place)."""
        import mlx.core as mx

        if self._config is None or self._model is None:
            raise SwapUnsupported("no running model")
        parts = swap_parts(self._config, config)
        plan = self.validate(config)
        t0 = time.perf_counter()
        for part, model, d in (("target", self._model, config.target_dir), ("draft", self._draft, config.draft_dir)):
            if part not in parts:
                continue
            if model is None:
                raise SwapUnsupported(f"no running {part} model")
            try:
                # As mlx_lm.utils.load_model reads a checkpoint: mx.load, the model's sanitize, load_weights.
                weights = mx.load(str(Path(d) / WEIGHTS_FILE))
                if hasattr(model, "sanitize"):
                    weights = model.sanitize(weights)
                model.load_weights(list(weights.items()), strict=True)
            except (ValueError, FileNotFoundError, RuntimeError) as exc:
                raise SwapUnsupported(f"checkpoint {Path(d).name} does not load into the running {part}: {exc}") from None
            mx.eval(model.parameters())
        self._plan = plan
        self._config = config
        return SwapReport(seconds=time.perf_counter() - t0, parts=parts)

    def check_tables(self) -> TableCheck:
        """Every row of the target table (and of the draft's) from the running models' own
        logits, bit for bit: one forward pass over every token, twice (two positions each)."""
        if self._config is None:
            raise RuntimeError("check_tables() before start()")
        worst, bad, rows = 0.0, [], 0
        parts = [("target", self._model, self._config.target_dir)]
        if self._draft is not None:
            parts.append(("draft", self._draft, self._config.draft_dir))
        for name, model, d in parts:
            want = checkpoint_table(d)  # [V, V] what the checkpoint holds
            got, ids = self.model_logits(model, want.shape[0])  # [2V, V], [2V]
            diff = np.abs(got.astype(np.float64) - want[ids].astype(np.float64))  # [2V, V]
            worst = max(worst, float(diff.max()))
            wrong = sorted({int(ids[i]) for i in np.flatnonzero((got != want[ids]).any(axis=1))})
            if wrong:
                bad.append(f"{name}: rows {wrong}")
            if name == "target":
                rows = int(want.shape[0])
        return TableCheck(ok=not bad, rows=rows, max_abs_diff=worst, tolerance=0.0,
                          detail="mlx-lm logits of " + " and ".join(p[0] for p in parts) + (("; " + "; ".join(bad)) if bad else ""))

    @staticmethod
    def model_logits(model, vocab: int) -> tuple[np.ndarray, np.ndarray]:
        """(logits [2V, V] after each token of ``0..V-1, V-1..0``, those tokens [2V]) from ``model``."""
        import mlx.core as mx

        ids = np.concatenate([np.arange(vocab), np.arange(vocab)[::-1]])  # [2V]
        out = model(mx.array(ids[None, :]))  # [1, 2V, V_model]
        return np.array(out[0, :, :vocab].astype(mx.float32)), ids

    def logits_match_table(self, prompt_tokens: Sequence[int], *, max_tokens: int = 4, tolerance: float | None = None):
        """The target model's own logits after each token of ``prompt_tokens`` against its
        table, bit for bit (``specfuzz calibrate``'s "logits" row)."""
        import mlx.core as mx

        from specfuzz.engines.vllm_calibration import LogitsReport

        if self._config is None:
            raise RuntimeError("logits_match_table() before start()")
        want = checkpoint_table(self._config.target_dir)  # [V, V]
        V = want.shape[0]
        prompt = [int(t) for t in prompt_tokens]
        if not prompt or any(not 0 <= t < V for t in prompt):
            raise InvalidInput("prompt_tokens", prompt_tokens, f"a non-empty list of token ids in [0, {V})")
        got = np.array(self._model(mx.array([prompt]))[0, :, :V].astype(mx.float32))  # [P, V]
        exp = want[prompt]  # [P, V]
        diff = np.abs(got.astype(np.float64) - exp.astype(np.float64))  # [P, V]
        mism = tuple((prompt[i], j, float(got[i, j]), float(exp[i, j])) for i, j in zip(*np.nonzero(got != exp)))
        return LogitsReport(ok=not mism, mode="mlx-lm logits", positions=len(prompt), max_abs_diff=float(diff.max()),
                            tolerance=0.0 if tolerance is None else float(tolerance), contexts=tuple(prompt), mismatches=mism)

    def close(self) -> None:
        self._model = None
        self._draft = None
        self._tokenizer = None
        self._config = None
        self._sampling_cache.clear()

    # -- generation ------------------------------------------------------------------------

    def _sampling(self, params: SamplingParams) -> tuple[Any, list]:
        """(sampler, logits processors) for ``params``, made by mlx-lm's own factories."""
        from mlx_lm.sample_utils import make_logits_processors, make_sampler

        key = json.dumps(params.to_json(), sort_keys=True)
        hit = self._sampling_cache.get(key)
        if hit is None:
            s_kw, p_kw = sampling_args(params, self._plan["vocab_size"])
            hit = (make_sampler(s_kw.pop("temp"), **s_kw), make_logits_processors(**p_kw) if p_kw else [])
            self._sampling_cache[key] = hit
            if len(self._sampling_cache) > 256:
                self._sampling_cache.popitem(last=False)
        return hit

    def _run(self, prompt: tuple[int, ...], params: SamplingParams, seed: int | None) -> Completion:
        import mlx.core as mx
        from mlx_lm import stream_generate

        sampler, processors = self._sampling(params)
        self._tokenizer.eos_token_ids = stop_ids(params, self._plan["eos"])
        kw: dict[str, Any] = {"max_tokens": int(params.max_tokens), "sampler": sampler}
        if processors:
            kw["logits_processors"] = processors
        if self._plan["settings"]["prefill_step_size"] is not None:
            kw["prefill_step_size"] = int(self._plan["settings"]["prefill_step_size"])
        if self._draft is not None:
            kw["draft_model"] = self._draft
            if self._plan["k"] is not None:
                kw["num_draft_tokens"] = int(self._plan["k"])
        if seed is not None:
            mx.random.seed(int(seed))
        tokens: dict[int, tuple[int, bool]] = {}  # generation_tokens -> (token, from_draft)
        reason = "length"
        for r in stream_generate(self._model, self._tokenizer, list(prompt), **kw):
            tokens[int(r.generation_tokens)] = (int(r.token), bool(r.from_draft))
            reason = r.finish_reason or reason
        out = [tokens[i] for i in sorted(tokens)]
        if self._draft is None:
            return Completion(tuple(t for t, _ in out), reason)
        flags = [f for _, f in out]
        k = self._plan["k"] if self._plan["k"] is not None else default_num_draft_tokens()
        return Completion(tuple(t for t, _ in out), reason, proposed_drafts(flags, int(params.max_tokens), int(k)), sum(flags))

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        if self._config is None:
            raise RuntimeError("generate() before start()")
        V = self._plan["vocab_size"]
        checked: set[tuple] = set()
        for req in requests:  # every request checked before any runs
            fast = (tuple(req.prompt), id(req.params))
            if fast in checked:
                continue
            prompt = tuple(int(t) for t in req.prompt)
            if not prompt or any(not 0 <= t < V for t in prompt):
                raise InvalidInput("prompt", req.prompt, f"a non-empty list of token ids in [0, {V})")
            check_params(req.params, V)
            checked.add(fast)
        return [self._run(tuple(int(t) for t in r.prompt), r.params, r.seed) for r in requests]
