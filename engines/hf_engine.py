"""HF transformers (CPU) behind the Engine interface: ``generate()`` with and without
assisted generation.

What it runs
------------
* Speculation off: ``model.generate(do_sample=..., ...)``. Requests with the same prompt
  and parameters are one ``generate`` call with ``num_return_sequences=N`` (N independent
  samples of one prompt), which is much faster than N calls.
* ``draft_model``: assisted generation (``assistant_model=draft``), one request at a time
  (HF allows batch size 1 only). The draft proposes ``num_assistant_tokens = K`` tokens
  per round, with ``num_assistant_tokens_schedule="constant"`` and no dynamic draft
  length (``assistant_confidence_threshold=0``) unless a setting asks for them. With
  ``do_sample=True`` and draft logits HF verifies with ``_speculative_sampling``
  (Leviathan et al. token-wise acceptance, residual resampling).
* A draft whose vocabulary differs from the target's (a wider table draft) goes through
  HF's universal assisted generation (``tokenizer`` + ``assistant_tokenizer``). Our
  tokenizers map token ``i`` to one character and have no unknown token, which HF's
  UAG set-up needs (it encodes ``" "``); the adapter adds a normalizer that drops
  characters outside the vocabulary (token ids and texts are unchanged).
* ``ngram``: prompt lookup decoding (``prompt_lookup_num_tokens = K``,
  ``max_matching_ngram_size = ngram_max``); HF always tries n-grams down to size 1.

Semantics: the ``"hf"`` profile (:class:`specfuzz.oracle.semantics.HFProfile`). The
mapping of :class:`SamplingParams` to ``generate`` options is :func:`generation_kwargs`:
every HF default that is not neutral is overridden (``top_k=0`` instead of 50, the
checkpoint's ``generation_config.json`` is replaced by an empty one, ``eos_token_id`` is
always passed), ``stop_token_ids`` become extra EOS ids, ``ignore_eos`` drops EOS from
that list, ``allowed_token_ids`` become ``suppress_tokens`` (the complement),
``logit_bias`` becomes one-token ``sequence_bias``. Frequency / presence penalties,
grammars and thinking budgets have no HF equivalent (``InvalidInput``).

Engine settings (``EngineConfig.settings``): :data:`SETTINGS`.

Known HF issues (findings in corpus/, strict xfails in tests/test_engine_hf.py)
--------------------------------------------------------------------------------
* Universal assisted generation with ``do_sample=True`` and an assistant that has tokens
  the target lacks prunes the assistant's LM head in the order of
  ``assistant_tokenizer.get_vocab()`` but writes the pruned logits back in ascending id
  order: the verifier's q is a permutation of the q the draft was sampled from (SPEC §3
  condition 3), so the output law is wrong whenever that dict is not sorted by id (the
  tokenizers library returns a per-process hash order). ``assistant_vocab_order="sorted"``
  avoids it; ``"reversed"`` reproduces it deterministically.
* After such a sampled call the assistant stays pruned; a greedy call with the same
  assistant crashes. ``uag_greedy_draft="separate"`` (default) avoids it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import platform
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from specfuzz.engines.base import (
    Capabilities, Completion, Engine, EngineConfig, Request, check_speculation, merged_settings, refuse_unsupported,
)
from specfuzz.errors import InvalidInput
from specfuzz.oracle.params import SamplingParams
from specfuzz.oracle.semantics import HF_UNSUPPORTED

ENGINE_NAME = "hf-transformers"
METHODS = ("draft_model", "ngram")
DTYPES = ("float32", "bfloat16", "float16")
# SamplingParams fields this engine honours (the rest must stay at their off values).
SAMPLING = frozenset(
    {
        "temperature", "top_k", "top_p", "min_p", "logit_bias", "allowed_token_ids", "bad_words",
        "repetition_penalty", "min_tokens", "max_tokens", "stop_token_ids", "ignore_eos",
    }
)
SCHEDULES = ("constant", "heuristic", "heuristic_transient")
SEED_MODES = ("batch", "request")
VOCAB_ORDERS = ("native", "sorted", "reversed")
ATTENTION = ("sdpa", "eager")

# Engine settings: name -> (default, what is allowed). All are knobs a fuzzer may vary.
SETTINGS: dict[str, tuple[Any, str]] = {
    # Draft length per round, HF's schedule: "constant" (K every round), "heuristic"
    # (+2 after a fully accepted round, -1 otherwise; persists across calls),
    # "heuristic_transient" (reset each call).
    "num_assistant_tokens_schedule": ("constant", f"one of {SCHEDULES}"),
    # Dynamic draft length: the draft stops when its token's probability is below this
    # (0 = off). Without scikit-learn HF keeps it fixed (no ROC adaptation).
    "assistant_confidence_threshold": (0.0, "a number in [0, 1) (0 = off)"),
    # Universal assisted generation (tokenizer + assistant_tokenizer): None or True = when
    # the vocabulary sizes differ (HF decides by vocab_size); False = never (a draft of
    # another width is then refused).
    "universal": (None, "None, True or False"),
    # Order of the assistant tokenizer's get_vocab() that HF sees (universal path only):
    # "native" = the tokenizers library's (hash) order, which varies between processes;
    # "sorted" / "reversed" = by token id, ascending / descending.
    "assistant_vocab_order": ("native", f"one of {VOCAB_ORDERS}"),
    # Universal path only: HF prunes the assistant's LM head in place on the first sampled
    # call, after which a greedy call with the same assistant crashes. "separate" gives
    # greedy requests their own copy of the draft; "shared" is HF as-is.
    "uag_greedy_draft": ("separate", "one of ('separate', 'shared')"),
    # How Request.seed is honoured: "batch" = one generate call per group of identical
    # requests, seeded from all their seeds (reproducible for the same batch);
    # "request" = one call per seeded request, seeded by its own seed (slow).
    "seed_mode": ("batch", f"one of {SEED_MODES}"),
    # Most samples in one generate call (num_return_sequences).
    "max_batch": (4096, "an integer >= 1"),
    # torch intra-op threads (process-wide; 1 is fastest for these tiny models).
    "threads": (1, "an integer >= 1"),
    # Seed of the engine's own randomness (requests without a seed); None = unseeded.
    "seed": (None, "None or an integer >= 0"),
    "attn_implementation": ("sdpa", f"one of {ATTENTION}"),
}
# Settings other adapters' callers pass that this engine accepts and ignores (the
# checkpoint itself says the draft's width; a non-identity d2t cannot be expressed).
PASSTHROUGH_SETTINGS = ("draft_vocab_size", "draft_d2t")


# ----------------------------------------------------------------------------- params


def eos_ids(params: SamplingParams, eos_token_id: int | None) -> list[int]:
    """HF's ``eos_token_id`` list for a request: EOS (unless ignore_eos) + stop ids."""
    ids: list[int] = []
    if eos_token_id is not None and not params.ignore_eos:
        ids.append(int(eos_token_id))
    for t in params.stop_token_ids:
        if int(t) not in ids:
            ids.append(int(t))
    return ids


def check_params(params: SamplingParams, vocab_size: int) -> None:
    """Raise InvalidInput for a parameter HF transformers cannot express."""
    refuse_unsupported(params, HF_UNSUPPORTED, "HF transformers", vocab_size)


def generation_kwargs(params: SamplingParams, eos_token_id: int | None, vocab_size: int) -> dict[str, Any]:
    """The ``GenerationConfig`` fields for one request (every non-neutral default overridden)."""
    check_params(params, vocab_size)
    stops = eos_ids(params, eos_token_id)
    kw: dict[str, Any] = {
        "max_new_tokens": int(params.max_tokens),
        "min_new_tokens": int(params.min_tokens) if params.min_tokens else None,
        "eos_token_id": stops or None,
        "pad_token_id": stops[0] if stops else None,
        "repetition_penalty": float(params.repetition_penalty),
        "num_beams": 1,
        "use_cache": True,
    }
    if params.greedy:
        kw.update(do_sample=False)
    else:
        kw.update(
            do_sample=True,
            temperature=float(params.temperature),
            top_k=int(params.top_k) if params.top_k >= 1 else 0,  # 0 disables HF's default top_k=50
            top_p=float(params.top_p),
            min_p=float(params.min_p) if params.min_p > 0 else None,
        )
    if params.bad_words:
        kw["bad_words_ids"] = [[int(t) for t in w] for w in params.bad_words]
    if params.logit_bias:
        kw["sequence_bias"] = {(int(t),): float(b) for t, b in dict(params.logit_bias).items()}
    if params.allowed_token_ids is not None:
        others = sorted(set(range(vocab_size)) - {int(t) for t in params.allowed_token_ids})
        if others:
            kw["suppress_tokens"] = others
    return kw


def _json_key(prompt: tuple[int, ...], params: SamplingParams) -> str:
    return json.dumps([list(prompt), params.to_json()], sort_keys=True)


def _batch_seed(seeds: Sequence[int]) -> int:
    h = hashlib.sha256(json.dumps([int(s) for s in seeds]).encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


# ----------------------------------------------------------------------------- checkpoints


def _read_config(d: Path, name: str) -> dict:
    path = Path(d) / "config.json"
    if not path.is_file():
        raise InvalidInput(name, str(d), "a checkpoint folder with config.json")
    cfg = json.loads(path.read_text())
    if not isinstance(cfg.get("vocab_size"), int):
        raise InvalidInput(f"{name} vocab_size", cfg.get("vocab_size"), "an integer in config.json")
    return cfg


def _eos_of(cfg: Mapping) -> int | None:
    eos = cfg.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return eos


@dataclass
class CalibrationResult:
    """Whether a loaded model's next-token logits reproduce its table exactly."""

    model: str  # "target" or "draft"
    dtype: str
    vocab_size: int
    positions: int  # logits rows compared
    exact: bool
    max_abs_diff: float
    mismatched_tokens: tuple[int, ...]

    def to_json(self) -> dict:
        return {
            "model": self.model, "dtype": self.dtype, "vocab_size": self.vocab_size, "positions": self.positions,
            "exact": self.exact, "max_abs_diff": self.max_abs_diff, "mismatched_tokens": list(self.mismatched_tokens),
        }


def check_logits(model, table: np.ndarray, dtype: str, name: str = "target") -> CalibrationResult:
    """Run ``model`` on every token (twice, at different positions) and compare its
    logits with ``round_table(table, dtype)`` bit for bit (float32 comparison)."""
    import torch

    from specfuzz.tablegen.rounding import round_table

    want = round_table(np.asarray(table), dtype).astype(np.float32)  # [V, V]
    V = want.shape[0]
    ids = np.concatenate([np.arange(V), np.arange(V)[::-1]])  # [2V]
    with torch.no_grad():
        got = model(torch.as_tensor(ids, dtype=torch.long)[None]).logits[0].to(torch.float32).numpy()  # [2V, V_model]
    got = got[:, :V]
    diff = np.abs(got.astype(np.float64) - want[ids].astype(np.float64))  # [2V, V]
    bad = sorted({int(ids[i]) for i in np.flatnonzero((got != want[ids]).any(axis=1))})
    return CalibrationResult(name, dtype, V, int(len(ids)), not bad, float(diff.max()), tuple(bad))


# ----------------------------------------------------------------------------- the engine


class HFEngine(Engine):
    """HF transformers ``generate()`` on CPU (see the module docstring)."""

    name = ENGINE_NAME

    def __init__(self, **default_settings: Any) -> None:
        self._defaults = dict(default_settings)
        self._config: EngineConfig | None = None
        self._model = None
        self._draft = None
        self._greedy_draft = None
        self._tokenizers: tuple[Any, Any] | None = None
        self._gen_cache: OrderedDict[str, Any] = OrderedDict()
        self.acceptance = {"proposed": 0, "accepted": 0, "rounds": 0}

    # -- description -----------------------------------------------------------------

    def capabilities(self) -> Capabilities:
        from specfuzz.tablegen.vocab import MAX_VOCAB

        return Capabilities(methods=METHODS, sampling=SAMPLING, dtypes=DTYPES, profile="hf",
                            max_vocab=MAX_VOCAB, draft_vocab="any",
                            spec_knobs={"verify": ("token",), "draft_sampling": ("sampled",), "ngram_min": (1,),
                                        "draft_temperature": (None,)},
                            # Tables load into the running models (state dicts); universal assisted
                            # generation prunes the assistant's lm_head, so its draft restarts.
                            swap=frozenset({"target", "draft"}))

    def version(self) -> Mapping[str, str]:
        import torch
        import transformers

        return {
            "name": ENGINE_NAME,
            "version": transformers.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "device": "cpu",
            "machine": platform.machine(),
            "python": platform.python_version(),
        }

    # -- start -------------------------------------------------------------------------

    def _settings(self, config: EngineConfig) -> dict[str, Any]:
        given = {**self._defaults, **dict(config.settings)}
        s = merged_settings(SETTINGS, given, passthrough=PASSTHROUGH_SETTINGS)
        if s["num_assistant_tokens_schedule"] not in SCHEDULES:
            raise InvalidInput("num_assistant_tokens_schedule", s["num_assistant_tokens_schedule"], SETTINGS["num_assistant_tokens_schedule"][1])
        t = s["assistant_confidence_threshold"]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 <= float(t) < 1.0:
            raise InvalidInput("assistant_confidence_threshold", t, SETTINGS["assistant_confidence_threshold"][1])
        if s["universal"] not in (None, True, False):
            raise InvalidInput("universal", s["universal"], SETTINGS["universal"][1])
        for name, allowed in (("assistant_vocab_order", VOCAB_ORDERS), ("seed_mode", SEED_MODES),
                              ("attn_implementation", ATTENTION), ("uag_greedy_draft", ("separate", "shared"))):
            if s[name] not in allowed:
                raise InvalidInput(name, s[name], SETTINGS[name][1])
        for name in ("max_batch", "threads"):
            v = s[name]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidInput(name, v, SETTINGS[name][1])
        seed = s["seed"]
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise InvalidInput("seed", seed, SETTINGS["seed"][1])
        d2t = given.get("draft_d2t")
        if d2t is not None and tuple(d2t) != tuple(range(len(tuple(d2t)))):
            raise InvalidInput("draft_d2t", tuple(d2t), "None or the identity: HF maps a draft token to the target token of the same text")
        return s

    def validate(self, config: EngineConfig) -> dict[str, Any]:
        """Everything :meth:`start` checks before loading a model; returns the plan."""
        if config.dtype not in DTYPES:
            raise InvalidInput("dtype", config.dtype, f"one of {DTYPES}")
        settings = self._settings(config)
        tcfg = _read_config(config.target_dir, "target_dir")
        V = int(tcfg["vocab_size"])
        spec = config.speculation
        plan: dict[str, Any] = {"settings": settings, "vocab_size": V, "eos": _eos_of(tcfg), "universal": False}
        if spec is None:
            return plan
        check_speculation(spec, METHODS, "HF: assisted generation, prompt lookup")
        if spec.verify != "token":
            raise InvalidInput("verify", spec.verify, "'token' (HF verifies token by token)")
        if spec.inject is not None:
            raise InvalidInput("inject", spec.inject, "None (bug injection is the reference engine's)")
        if spec.method == "ngram":
            if spec.ngram_min != 1:
                raise InvalidInput("ngram_min", spec.ngram_min, "1 (HF prompt lookup always tries n-grams down to size 1)")
            return plan
        if spec.draft_sampling != "sampled":
            raise InvalidInput("draft_sampling", spec.draft_sampling, "'sampled' (HF's assistant samples when the target does)")
        if spec.draft_temperature is not None:
            raise InvalidInput("draft_temperature", spec.draft_temperature, "None (HF's assistant uses the request's temperature)")
        if config.draft_dir is None:
            raise InvalidInput("draft_dir", None, "a draft checkpoint folder for method 'draft_model'")
        dcfg = _read_config(config.draft_dir, "draft_dir")
        Vd = int(dcfg["vocab_size"])
        universal = settings["universal"]
        if universal is None:
            universal = Vd != V
        if Vd != V and not universal:
            raise InvalidInput("draft vocab_size", Vd, f"{V} (the target's) unless universal assisted generation is allowed (setting universal=None)")
        if Vd == V and universal:
            raise InvalidInput("universal", True, "None or False when the draft's vocab_size equals the target's (HF then refuses an assistant_tokenizer)")
        if universal:
            for d, name in ((config.target_dir, "target_dir"), (config.draft_dir, "draft_dir")):
                if not (Path(d) / "tokenizer.json").is_file():
                    raise InvalidInput(name, str(d), "a checkpoint with tokenizer.json (universal assisted generation maps tokens by text)")
        plan.update(universal=bool(universal), draft_vocab_size=Vd)
        return plan

    def start(self, config: EngineConfig) -> None:
        plan = self.validate(config)  # before loading anything
        import torch
        import transformers

        transformers.logging.set_verbosity_error()
        try:
            transformers.utils.logging.disable_progress_bar()
        except AttributeError:  # pragma: no cover
            pass
        s = plan["settings"]
        torch.set_num_threads(int(s["threads"]))
        dtype = getattr(torch, config.dtype)
        self.close()

        def load(d: Path):
            m = transformers.AutoModelForCausalLM.from_pretrained(
                str(d), dtype=dtype, attn_implementation=s["attn_implementation"]
            )
            m.eval()
            # Nothing from the checkpoint's generation_config.json reaches generate().
            m.generation_config = transformers.GenerationConfig()
            return m

        self._model = load(config.target_dir)
        spec = config.speculation
        if spec is not None and spec.method == "draft_model":
            self._draft = load(config.draft_dir)
            self._draft.generation_config = transformers.GenerationConfig(
                num_assistant_tokens=int(spec.num_speculative_tokens),
                num_assistant_tokens_schedule=s["num_assistant_tokens_schedule"],
                assistant_confidence_threshold=float(s["assistant_confidence_threshold"]),
            )
            if plan["universal"] and s["uag_greedy_draft"] == "separate":
                self._greedy_draft = load(config.draft_dir)
                self._greedy_draft.generation_config = copy.deepcopy(self._draft.generation_config)
            if plan["universal"]:
                self._tokenizers = (
                    _load_tokenizer(config.target_dir, plan["vocab_size"], "native"),
                    _load_tokenizer(config.draft_dir, plan["draft_vocab_size"], s["assistant_vocab_order"]),
                )
        if s["seed"] is not None:
            torch.manual_seed(int(s["seed"]))
        self._watch_candidates()
        self._plan = plan
        self._config = config

    def swap(self, config: EngineConfig) -> "SwapReport":
        """Load ``config``'s tables into the running models (their state dicts, in place)."""
        import time

        import torch
        from safetensors.torch import load_file

        from specfuzz.engines.base import SwapReport, SwapUnsupported, swap_parts

        if self._config is None or self._model is None:
            raise SwapUnsupported("no running model")
        parts = swap_parts(self._config, config)
        if "draft" in parts and self._plan.get("universal"):
            raise SwapUnsupported("universal assisted generation prunes the assistant's lm_head: a new draft needs a start")
        plan = self.validate(config)
        t0 = time.perf_counter()

        def load_into(model, d: Path) -> None:
            state = load_file(str(Path(d) / "model.safetensors"))
            with torch.no_grad():
                missing, unexpected = model.load_state_dict(state, strict=False)
            if unexpected or any(not k.endswith("rotary_emb.inv_freq") for k in missing):
                raise SwapUnsupported(f"checkpoint {Path(d).name} does not match the running model "
                                      f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")

        if "target" in parts:
            load_into(self._model, config.target_dir)
        if "draft" in parts:
            for m in (self._draft, self._greedy_draft):
                if m is not None:
                    load_into(m, config.draft_dir)
        self._plan = plan
        self._config = config
        return SwapReport(seconds=time.perf_counter() - t0, parts=parts)

    def check_tables(self) -> "TableCheck":
        """Every row of the target table (and of a draft model's) from the running models' own
        logits, bit for bit (check_logits)."""
        from specfuzz.engines.base import TableCheck
        from specfuzz.tablegen import load_table

        res = self.calibrate()
        parts = [v for v in res.values() if isinstance(v, dict)]
        worst = max(v["max_abs_diff"] for v in parts)
        bad = [f"{v['model']}: rows {v['mismatched_tokens']}" for v in parts if not v["exact"]]
        return TableCheck(ok=bool(res["exact"]), rows=int(load_table(self._config.target_dir).shape[0]),
                          max_abs_diff=float(worst), tolerance=0.0,
                          detail="HF logits of " + " and ".join(v["model"] for v in parts) + (("; " + "; ".join(bad)) if bad else ""))

    def close(self) -> None:
        self._model = None
        self._draft = None
        self._greedy_draft = None
        self._tokenizers = None
        self._config = None
        self._gen_cache.clear()

    # -- calibration ---------------------------------------------------------------------

    def calibrate(self, table: np.ndarray | None = None, draft_table: np.ndarray | None = None) -> dict:
        """Check that the loaded models reproduce their tables exactly (every token).

        ``table`` defaults to the target checkpoint's own ``lm_head`` table; the draft is
        checked against ``draft_table`` or its own checkpoint.
        """
        from specfuzz.tablegen import load_table

        if self._config is None:
            raise RuntimeError("calibrate() before start()")
        cfg = self._config
        t = load_table(cfg.target_dir) if table is None else table
        res = {"target": check_logits(self._model, t, cfg.dtype, "target").to_json()}
        if self._draft is not None:
            d = load_table(cfg.draft_dir) if draft_table is None else draft_table
            # The greedy copy is never pruned by HF's universal path.
            draft = self._greedy_draft if self._greedy_draft is not None else self._draft
            res["draft"] = check_logits(draft, d, cfg.dtype, "draft").to_json()
        res["exact"] = all(v["exact"] for v in res.values() if isinstance(v, dict))
        return res

    # -- generation ------------------------------------------------------------------------

    def _watch_candidates(self) -> None:
        """Count proposed/accepted draft tokens per round (observation only: HF's own
        candidate generator runs unchanged, its update hook is wrapped)."""
        model = self._model
        original = type(model)._get_candidate_generator
        stats = self.acceptance

        def wrapped(*args, **kwargs):
            gen = original(model, *args, **kwargs)
            update = gen.update_candidate_strategy

            def counting_update(input_ids, scores, num_matches):
                stats["proposed"] += int(scores.shape[1]) - 1
                stats["accepted"] += int(num_matches)
                stats["rounds"] += 1
                return update(input_ids, scores, num_matches)

            gen.update_candidate_strategy = counting_update
            return gen

        model._get_candidate_generator = wrapped

    def _generation_config(self, params: SamplingParams, n: int):
        import transformers

        key = json.dumps([params.to_json(), n], sort_keys=True)
        gc = self._gen_cache.get(key)
        if gc is None:
            kw = generation_kwargs(params, self._plan["eos"], self._plan["vocab_size"])
            spec = self._config.speculation
            if spec is not None and spec.method == "ngram":
                kw["prompt_lookup_num_tokens"] = int(spec.num_speculative_tokens)
                kw["max_matching_ngram_size"] = int(spec.ngram_max)
            kw["num_return_sequences"] = n
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                gc = transformers.GenerationConfig(**kw)
            self._gen_cache[key] = gc
            if len(self._gen_cache) > 256:
                self._gen_cache.popitem(last=False)
        return gc

    def _run(self, prompt: tuple[int, ...], params: SamplingParams, n: int, seed: int | None) -> list[Completion]:
        import torch

        gc = self._generation_config(params, n)
        extra: dict[str, Any] = {}
        if self._draft is not None:
            extra["assistant_model"] = self._greedy_draft if params.greedy and self._greedy_draft is not None else self._draft
            if self._tokenizers is not None:
                extra["tokenizer"], extra["assistant_tokenizer"] = self._tokenizers
        if seed is not None:
            # The CPU generator alone: what torch.manual_seed seeds on a CPU-only run, without its
            # lazy seeding of CUDA/XPU/MTIA (1.1 ms a call, a tenth of a sample's time at K=3).
            torch.default_generator.manual_seed(int(seed))
        before = dict(self.acceptance)
        ids = torch.tensor([list(prompt)], dtype=torch.long)  # [1, P]
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            seqs = self._model.generate(ids, generation_config=gc, **extra)  # [n, P + T]
        new = seqs[:, len(prompt):].tolist()  # [n, <= max_tokens]
        stops = set(eos_ids(params, self._plan["eos"]))
        spec = self._config.speculation is not None
        proposed = self.acceptance["proposed"] - before["proposed"] if spec else None
        accepted = self.acceptance["accepted"] - before["accepted"] if spec else None
        out = []
        for row in new:
            toks: list[int] = []
            reason = "length"
            for t in row[: params.max_tokens]:
                toks.append(int(t))
                if int(t) in stops:  # the stop token is part of the output; padding after it dropped
                    reason = "stop"
                    break
            out.append(Completion(tuple(toks), reason, proposed, accepted))
        return out

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        if self._config is None:
            raise RuntimeError("generate() before start()")
        s = self._plan["settings"]
        V = self._plan["vocab_size"]
        results: list[Completion | None] = [None] * len(requests)
        groups: OrderedDict[str, list[int]] = OrderedDict()
        keys: dict[tuple, str] = {}  # (prompt, id(params)) -> group key: one check per distinct request
        for i, req in enumerate(requests):
            fast = (tuple(req.prompt), id(req.params))
            key = keys.get(fast)
            if key is None:
                prompt = tuple(int(t) for t in req.prompt)
                if not prompt or any(not 0 <= t < V for t in prompt):
                    raise InvalidInput("prompt", req.prompt, f"a non-empty list of token ids in [0, {V})")
                check_params(req.params, V)
                key = keys[fast] = _json_key(prompt, req.params)
            groups.setdefault(key, []).append(i)
        one_at_a_time = self._config.speculation is not None  # HF: assisted generation needs batch size 1
        for idx in groups.values():
            req0 = requests[idx[0]]
            prompt, params = tuple(int(t) for t in req0.prompt), req0.params
            seeded = [i for i in idx if requests[i].seed is not None]
            if one_at_a_time or (s["seed_mode"] == "request" and seeded):
                for i in idx:
                    results[i] = self._run(prompt, params, 1, requests[i].seed)[0]
                continue
            if params.greedy:  # deterministic (HF refuses num_return_sequences > 1 without sampling)
                first = self._run(prompt, params, 1, None)[0]
                for i in idx:
                    results[i] = first
                continue
            for lo in range(0, len(idx), s["max_batch"]):
                chunk = idx[lo : lo + s["max_batch"]]
                seeds = [requests[i].seed for i in chunk if requests[i].seed is not None]
                seed = _batch_seed([requests[i].seed if requests[i].seed is not None else -1 for i in chunk]) if seeds else None
                for i, c in zip(chunk, self._run(prompt, params, len(chunk), seed)):
                    results[i] = c
        return [r for r in results if r is not None]


def _load_tokenizer(d: Path, vocab_size: int, order: str):
    """The checkpoint's tokenizer, usable by HF's universal assisted generation.

    Adds a normalizer that drops characters outside the vocabulary (HF encodes ``" "``
    to find the space sign and our WordLevel tokenizer has no unknown token), and, for
    ``order`` "sorted"/"reversed", presents ``get_vocab()`` in token-id order.
    """
    import re

    import transformers
    from tokenizers import Regex, normalizers

    from specfuzz.tablegen.vocab import token_text

    tok = transformers.AutoTokenizer.from_pretrained(str(d))
    chars = "".join(re.escape(token_text(i)) for i in range(vocab_size))
    tok.backend_tokenizer.normalizer = normalizers.Replace(Regex(f"[^{chars}]"), "")
    if order != "native":
        base_get_vocab = tok.get_vocab
        reverse = order == "reversed"

        def get_vocab():
            return dict(sorted(base_get_vocab().items(), key=lambda kv: kv[1], reverse=reverse))

        tok.get_vocab = get_vocab
    return tok
