"""Hypothesis strategies for cases (SPEC §6). Each part is a strategy of its own.

Every choice shrinks toward the simplest value: small vocabularies, K=1, temperature
1, no optional sampling feature, the shortest output.

Engine starts are expensive and table swaps are cheap, so a campaign splits a case in
two: a :class:`StartShape` (:func:`start_shapes`), everything one engine start serves
(vocabulary, EOS, speculation settings, the draft's width and id map), and, within a
shape, a stream of table models and request patterns (``case_families(shape=...)``)
that a running engine takes by swapping its tables.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from specfuzz.case import Case
from specfuzz.oracle.params import SamplingParams
from specfuzz.oracle.speculative import CHAIN_DRAFT_METHODS, CHAIN_METHODS, SpecConfig

@dataclass(frozen=True)
class Steer:
    """Weights toward speculation events a campaign has covered least (built by
    :meth:`specfuzz.fuzz.coverage.Coverage.steer`). ``None`` where a strategy takes a
    ``steer``: every choice uniform, as Hypothesis draws it.

    ``k_weights[k-1]``: the relative weight of K = k (chain length, tree depth); ``block``:
    block verification more often; ``narrower``: a draft narrower than the target more often;
    ``features``: sampling features drawn on 3 times in 4 instead of 1 in 2; ``near``: drafts
    close to the target (late rejections, small residuals); ``wide_trees``: trees of two or more
    children per node (siblings, unfilled nodes); ``truncated``: drafts that prefer
    what the target ranks last (drafts cut by top-k/top-p/min-p); ``stop``: an EOS in the
    start shape 3 times in 4, and drafts that favour it (stop tokens accepted mid-round,
    min_tokens and thinking budgets ending inside a round); ``long``: max_tokens at its largest
    half of the time (rounds that reach their bonus token). Every weighted choice still shrinks toward
    its simplest value."""

    k_weights: tuple[int, ...] = (1, 3, 3)
    block: bool = False
    wide_trees: bool = False
    narrower: bool = False
    features: tuple[str, ...] = ()
    near: bool = True
    truncated: bool = False
    stop: bool = False
    long: bool = False

    def k(self, draw, values: list[int]) -> int:
        """K among ``values`` (ascending), weighted by ``k_weights``; shrinks to the smallest."""
        if not values:
            raise InvalidArgument("no value of K to draw")
        weighted = [v for v in values for _ in range(self.k_weights[v - 1] if v - 1 < len(self.k_weights) else self.k_weights[-1])]
        return draw(st.sampled_from(weighted or values))


def _weighted(draw, options: list, weights: list[int]):
    """One of ``options`` with integer ``weights``; shrinks toward ``options[0]``."""
    return draw(st.sampled_from([o for o, w in zip(options, weights) for _ in range(w)]))


# Logit values are multiples of 1/4 in [-4, 4]: exact in bfloat16, float16 and float32,
# and coarse enough that a shrunk table reads like a hand-written one.
_LOGIT = st.integers(-16, 16).map(lambda i: i / 4.0)


@st.composite
def tables(draw, rows: int, cols: int, kind: str | None = None) -> np.ndarray:
    """A logit table [rows, cols]: flat, peaked, masked or random."""
    kind = kind or draw(st.sampled_from(["flat", "random", "peaked", "masked"]))
    if kind == "flat":
        return np.zeros((rows, cols))
    vals = np.array(draw(st.lists(_LOGIT, min_size=rows * cols, max_size=rows * cols)), dtype=float).reshape(rows, cols)
    if kind == "peaked":
        peak = draw(st.lists(st.integers(0, cols - 1), min_size=rows, max_size=rows))
        vals[np.arange(rows), peak] += 4.0
    elif kind == "masked":
        mask = np.array(draw(st.lists(st.booleans(), min_size=rows * cols, max_size=rows * cols))).reshape(rows, cols)
        mask[np.arange(rows), np.argmax(vals, axis=1)] = False  # keep at least one token per row
        vals[mask] = -np.inf
    return vals


@st.composite
def draft_tables(draw, target: np.ndarray, v_draft: int, steer: Steer | None = None, eos: int | None = None,
                 d2t: tuple[int, ...] | None = None) -> np.ndarray:
    """A draft table [max(V, V_draft), V_draft]: unrelated, identical or perturbed; with a
    ``steer`` also *near* the target (one logit per row moved by 1/4: p ~ q, so rejections
    come late and residuals are small), *reversed* (the target's logits negated: the draft
    prefers what the target ranks last, which top-k/top-p/min-p cut) and *stop-seeking*
    (the target's with EOS raised by 2: EOS drafted mid-round). A related draft narrower than
    the target takes the target's columns of its ids (``d2t``, else the first ``v_draft``);
    a wider one is unrelated."""
    V = target.shape[0]
    rows = max(V, v_draft)
    options, weights = ["unrelated", "identical", "perturbed"], [1, 1, 1]
    if steer is not None:
        options += ["near", "reversed", "stop-seeking"]
        weights += [3 if steer.near else 1, 3 if steer.truncated else 1, 3 if steer.stop and eos is not None else 0]
    rel = _weighted(draw, options, weights)
    if rel == "unrelated" or v_draft > V or (v_draft < V and steer is None):
        return draw(tables(rows, v_draft))
    cols = list(d2t) if d2t is not None else list(range(v_draft))
    base = np.where(np.isfinite(target), target, -8.0)[:, cols]  # [V, V_draft]
    if rel == "identical":
        return base
    if rel == "near":
        # One logit per row moved by 1/4: the rows' acceptance stays high and their residuals small.
        out = base.copy()
        for r in range(out.shape[0]):
            out[r, draw(st.integers(0, out.shape[1] - 1))] += draw(st.sampled_from([0.25, -0.25]))
        return out
    if rel == "reversed":
        return -base
    if rel == "stop-seeking":
        out = base.copy()
        if eos in cols:
            out[:, cols.index(eos)] += 2.0
        return out
    noise = np.array(draw(st.lists(_LOGIT, min_size=base.size, max_size=base.size))).reshape(base.shape) / 2
    return base + noise


ALL_SAMPLING = frozenset(SamplingParams.__dataclass_fields__)


@st.composite
def sampling_params(draw, V: int, max_tokens: int, eos: int | None, allowed: frozenset[str] = ALL_SAMPLING,
                    exclusive: tuple[frozenset[str], ...] = (), steer: Steer | None = None) -> SamplingParams:
    """Sampling settings; each optional feature is off unless drawn on, and only features in
    ``allowed``; of each pair in ``exclusive`` (Capabilities.sampling_exclusive) at most one.
    Features a ``steer`` names are drawn on 3 times in 4."""
    kw: dict = {"max_tokens": max_tokens}
    favoured = frozenset(steer.features) if steer is not None else frozenset()

    def on(name: str) -> bool:
        if any(name in pair and (pair - {name}) & kw.keys() for pair in exclusive):
            return False
        if name not in allowed:
            return False
        return draw(st.integers(0, 3)) > 0 if name in favoured else draw(st.booleans())

    if on("temperature"):
        kw["temperature"] = draw(st.sampled_from([1.0, 0.0, 0.5, 2.0]))
    if on("top_k"):
        kw["top_k"] = draw(st.integers(1, V))
    if on("top_p"):
        kw["top_p"] = draw(st.sampled_from([0.9, 0.7, 0.5]))
    if on("min_p"):
        kw["min_p"] = draw(st.sampled_from([0.05, 0.2]))
    if on("repetition_penalty"):
        kw["repetition_penalty"] = draw(st.sampled_from([1.5, 0.8]))
    if on("frequency_penalty"):
        kw["frequency_penalty"] = draw(st.sampled_from([0.5, -0.5]))
    if on("presence_penalty"):
        kw["presence_penalty"] = draw(st.sampled_from([0.5, -0.5]))
    if on("logit_bias"):
        kw["logit_bias"] = {draw(st.integers(0, V - 1)): draw(st.sampled_from([1.0, -1.0, -100.0]))}
    if on("allowed_token_ids"):
        kw["allowed_token_ids"] = tuple(sorted(set(draw(st.lists(st.integers(0, V - 1), min_size=1, max_size=V)))))
    if on("min_tokens"):
        kw["min_tokens"] = draw(st.integers(0, max_tokens))
    if on("stop_token_ids"):
        kw["stop_token_ids"] = (draw(st.integers(0, V - 1)),)
    if eos is not None and on("ignore_eos"):
        kw["ignore_eos"] = True
    if on("thinking_budget") and "think_end_token_id" in allowed:
        kw["thinking_budget"] = draw(st.integers(0, max_tokens))
        kw["think_end_token_id"] = draw(st.integers(0, V - 1))
    return SamplingParams(**kw)


def spec_configs(methods=("draft_model", "ngram", "eagle_tree", "ngram_tree"), max_k: int = 3, inject: str | None = None,
                 knobs: dict | None = None, vocab: int | None = None, steer: Steer | None = None):
    """Speculation settings; ``knobs`` restricts fields to the values an engine accepts.
    ``vocab``: the target vocabulary, which bounds a draft model's tree top-k (``eagle_tree``:
    the drafter proposes the top-k tokens of a distribution over that many; SGLang refuses a
    larger k, and on the H200 one search of an EAGLE tree with top-4 on V=3 had all its 357
    cases refused). ``steer``: K weighted by its ``k_weights``, block verification and trees
    with room for their depth more often."""
    knobs = dict(knobs or {})

    def pick(draw, name: str, values: list, method: str | None = None):
        # "method.field" keys override "field" (e.g. block verification for one method only).
        allowed = knobs.get(f"{method}.{name}", knobs.get(name))
        vals = [v for v in values if allowed is None or v in allowed]
        return draw(st.sampled_from(vals or list(allowed)))

    def values(name: str, lo: int, hi: int, method: str) -> list[int]:
        allowed = knobs.get(f"{method}.{name}", knobs.get(name))
        if allowed is None:
            return list(range(lo, hi + 1))
        return sorted(v for v in allowed if v is not None and v >= lo) or [lo]

    def ints(draw, name: str, lo: int, hi: int, method: str, cap: int | None = None) -> int:
        # An engine that states the values it accepts (e.g. SGLang's trees up to its default
        # sizes) gets them drawn, smallest first; otherwise lo..hi. ``cap``: none above it.
        allowed = knobs.get(f"{method}.{name}", knobs.get(name))
        if allowed is None:
            return draw(st.integers(lo, hi if cap is None else max(lo, min(hi, cap))))
        vals = sorted(v for v in allowed if v is not None and v >= lo and (cap is None or v <= cap))
        return draw(st.sampled_from(vals)) if vals else lo

    @st.composite
    def _spec(draw) -> SpecConfig:
        method = draw(st.sampled_from(methods))
        if steer is not None:
            K = steer.k(draw, values("num_speculative_tokens", 1, max_k, method))
        else:
            K = ints(draw, "num_speculative_tokens", 1, max_k, method)
        kw: dict = {"method": method, "num_speculative_tokens": K, "inject": inject}
        if method in CHAIN_METHODS:
            if steer is not None and steer.block:
                allowed = knobs.get(f"{method}.verify", knobs.get("verify"))
                modes = [v for v in ("token", "block") if allowed is None or v in allowed] or list(allowed)
                kw["verify"] = _weighted(draw, modes, [1] + [2] * (len(modes) - 1))
            else:
                kw["verify"] = pick(draw, "verify", ["token", "block"], method)
        if method in CHAIN_DRAFT_METHODS + ("eagle_tree",):
            kw["draft_sampling"] = pick(draw, "draft_sampling", ["sampled", "greedy"], method)
        if method in ("ngram", "ngram_tree"):
            lo = pick(draw, "ngram_min", [1, 2])
            kw["ngram_min"], kw["ngram_max"] = lo, ints(draw, "ngram_max", lo, 3, method)
        if method in ("eagle_tree", "ngram_tree"):
            cap = vocab if method == "eagle_tree" else None
            # Steered toward siblings: two or more children per node, where the engine takes it.
            wide = steer is not None and steer.wide_trees and 2 in values("tree_topk", 1, min(3, cap or 3), method)
            kw["tree_topk"] = ints(draw, "tree_topk", 2 if wide else 1, 3, method, cap=cap)
            # Steered: a budget that leaves room for the tree's depth (K levels).
            lo = min(6, max(1, K)) if steer is not None else 1
            kw["tree_budget"] = ints(draw, "tree_budget", lo, 6, method)
            mins = knobs.get(f"{method}.tree_topk_min", knobs.get("tree_topk_min"))
            if mins is not None and "tree_topk_min" in SpecConfig.__dataclass_fields__:
                kw["tree_topk_min"] = draw(st.sampled_from([m for m in mins if m is None or m <= kw["tree_topk"]]))
        return SpecConfig(**kw)

    return _spec()


# Long prompts: up to this many tokens; a long prompt repeats a motif, so that n-gram
# drafting with an engine's default window (vLLM: 5 tokens) finds matches.
LONG_PROMPT_MAX = 40


@st.composite
def prompts(draw, V: int, max_len: int = 6, long: bool = False, repeat: bool = False):
    """Prompts; half of them repeat an n-gram so that n-gram drafting fires. ``long``: a
    quarter of them are long (a motif of up to 8 tokens repeated, up to LONG_PROMPT_MAX);
    with ``repeat`` three quarters (an n-gram drafter proposes several tokens only where an
    earlier match has several tokens after it)."""
    if long and draw(st.integers(0, 3)) >= (1 if repeat else 3):
        # (a motif of one token gives an n-gram drafter one token after its earliest match)
        motif = draw(st.lists(st.integers(0, V - 1), min_size=2 if repeat else 1, max_size=8))
        n = draw(st.integers(max(2, 12 // len(motif)), max(2, LONG_PROMPT_MAX // len(motif))))
        tail = draw(st.lists(st.integers(0, V - 1), max_size=3))
        return tuple((motif * n + tail)[:LONG_PROMPT_MAX])
    base = draw(st.lists(st.integers(0, V - 1), min_size=1, max_size=max_len))
    if len(base) >= 2 and draw(st.booleans()):
        n = draw(st.integers(1, min(3, len(base))))
        base = base + base[-n:]
    return tuple(base[: max_len + 3])


def _draft_width(draw, V: int, spec: SpecConfig, draft_vocab: str, narrower: bool = False) -> int:
    if draft_vocab == "equal":
        return V
    if narrower and V > 2 and draw(st.integers(0, 3)) > 0:
        return V - draw(st.integers(1, V - 2))
    hi = V if (spec.is_tree or draft_vocab == "narrower") else V + 1
    # Shrinks toward the target's own width (the simplest draft).
    return V - draw(st.integers(0, V - 2)) if draw(st.booleans()) else min(hi, V + draw(st.integers(0, hi - V)))


# Vocabulary sizes a campaign's engine starts use: a few fixed widths, so that starts are
# reused by many table models.
VOCAB_WIDTHS: tuple[int, ...] = (2, 3, 4, 5, 6, 8, 12, 16)


@dataclass(frozen=True)
class StartShape:
    """What one engine start serves: everything a table swap cannot change."""

    vocab_size: int
    eos_token_id: int | None
    spec: SpecConfig | None  # None: speculation off
    draft_width: int | None = None  # columns of the draft table; None: no draft model
    draft_d2t: tuple[int, ...] | None = None  # an EAGLE-3 reduced vocabulary's id map

    @property
    def variant(self) -> str:
        if self.spec is None:
            return "off"
        return "engine default" if self.spec.engine_default else "drawn"

    def describe(self) -> str:
        if self.spec is None:
            return f"off V={self.vocab_size}"
        s = self.spec
        out = f"{s.method}{' (engine default)' if s.engine_default else ''} K={s.num_speculative_tokens} V={self.vocab_size}"
        if self.draft_width is not None and self.draft_width != self.vocab_size:
            out += f" draft width {self.draft_width}"
        return out


@st.composite
def start_shapes(
    draw,
    max_vocab: int = 4,
    max_k: int = 3,
    methods=None,
    speculation: bool = True,
    draft_vocab: str = "any",
    spec_knobs: dict | None = None,
    min_vocab: dict | None = None,
    spec_defaults: dict | None = None,
    engine_default: bool = False,
    inject: str | None = None,
    widths: tuple[int, ...] = VOCAB_WIDTHS,
    steer: Steer | None = None,
) -> StartShape:
    """A start shape: V from ``widths`` (within the methods' floors and ``max_vocab``), EOS,
    speculation settings and the draft's width. ``engine_default``: the method runs at the
    engine's own defaults (``spec_defaults[method]``); K is drawn only where those do not state it
    (vLLM requires K and has no default for it; SGLang's defaults fix it). ``steer``: K,
    verification, tree budget and draft width weighted toward thinly covered events."""
    floors = dict(min_vocab or {})
    methods = tuple(methods or ("draft_model", "ngram", "eagle_tree", "ngram_tree"))
    lo_v = min(max(2, floors.get(m, 2)) for m in methods) if speculation else 2
    Vs = [v for v in widths if lo_v <= v <= max_vocab] or ([max_vocab] if lo_v <= max_vocab else [])
    if not Vs:
        raise InvalidArgument(f"max_vocab={max_vocab}: methods {methods} need a vocabulary of at least {lo_v}")
    if engine_default and speculation:
        # A default tree drafts its top-k tokens: the vocabulary (and the draft's width) must
        # hold that many (SGLang's EAGLE default: top-4).
        need = {m: max(floors.get(m, 2), int((spec_defaults or {}).get(m, {}).get("tree_topk") or 1)) for m in methods}
        Vs = [v for v in Vs if any(v >= n for n in need.values())] or Vs
        floors = {**floors, **need}
    V = draw(st.sampled_from(Vs))
    if steer is not None and steer.stop and draw(st.integers(0, 3)) > 0:
        eos = draw(st.integers(0, V - 1))  # stop events are thin: an EOS 3 times in 4
    else:
        eos = draw(st.none() | st.integers(0, V - 1))
    if not speculation:
        return StartShape(V, eos, None)
    fit = tuple(m for m in methods if floors.get(m, 2) <= V) or methods
    if engine_default:
        method = draw(st.sampled_from(fit))
        kw = dict((spec_defaults or {}).get(method) or {})
        kw.update(method=method, engine_default=True, inject=inject)
        if "num_speculative_tokens" not in kw:  # an engine that requires K (vLLM) states no default for it
            ks = list(range(1, max_k + 1))
            kw["num_speculative_tokens"] = steer.k(draw, ks) if steer is not None else draw(st.integers(1, max_k))
        spec = SpecConfig(**kw)
    else:
        spec = draw(spec_configs(fit, max_k, inject, spec_knobs, vocab=V, steer=steer))
    width = d2t = None
    if spec.uses_draft_model:
        width = _draft_width(draw, V, spec, "narrower" if spec.method in ("eagle", "eagle3") else draft_vocab,
                             narrower=steer is not None and steer.narrower)
        if spec.engine_default and spec.method in ("eagle", "eagle3", "eagle_tree"):
            width = max(width, min(V, int(spec.tree_topk)))  # the default tree's top-k
        spec = _reduced_draft_sampling(draw, spec, V, width, spec_knobs)
        if spec.method == "eagle3" and width < V:
            d2t = draw(reduced_vocab_maps(V, width))
    return StartShape(V, eos, spec, width, d2t)


def _reduced_draft_sampling(draw, spec: SpecConfig, V: int, width: int, knobs: dict | None) -> SpecConfig:
    """``spec`` with a draft sampling the engine takes for a draft narrower than the target:
    the knob ``<method>.draft_sampling_reduced`` (SGLang's EAGLE rejection sampling needs the
    draft and target to share one vocabulary, so only greedy drafting there)."""
    allowed = (knobs or {}).get(f"{spec.method}.draft_sampling_reduced")
    if width >= V or not allowed or spec.draft_sampling in allowed:
        return spec
    return dataclasses.replace(spec, draft_sampling=draw(st.sampled_from(list(allowed))))


def _steered_multi_round(spec: SpecConfig | None, steer: Steer | None) -> bool:
    """A steered shape whose rounds can cover several positions (K >= 2, or a tree)."""
    return steer is not None and spec is not None and (spec.num_speculative_tokens >= 2 or spec.is_tree)


def _ngram_rounds(spec: SpecConfig | None, steer: Steer | None) -> bool:
    """Steered n-gram drafting with room for several positions a round: its prompts repeat a
    motif more often, so that the drafter proposes more than one token."""
    return _steered_multi_round(spec, steer) and spec.method in ("ngram", "ngram_tree")


def _max_tokens_floor(max_tokens: int, min_tokens_speculating: int, spec: SpecConfig | None,
                      steer: Steer | None) -> int:
    """The least max_tokens a pattern draws: 1 without speculation; with it, the engine's least
    that speculates; steered on a multi-position shape (K >= 2, or a tree), 2: a pattern of one
    output token reaches no round past its first position."""
    if spec is None:
        return 1
    lo = min(max_tokens, min_tokens_speculating)
    if _steered_multi_round(spec, steer):
        lo = max(lo, min(2, max_tokens))
    return lo


def _max_tokens(draw, lo: int, hi: int, steer: Steer | None) -> int:
    """max_tokens in [lo, hi]; with ``steer.long``, ``hi`` half of the time (room for rounds that
    reach their bonus token), else uniform (short outputs cut rounds: event max_tokens_cut)."""
    if steer is not None and steer.long and hi > lo and draw(st.booleans()):
        return hi
    return draw(st.integers(lo, hi))


@st.composite
def shape_cases(draw, shape: StartShape, max_tokens: int = 3, sampling: frozenset[str] = ALL_SAMPLING,
                min_tokens_speculating: int = 1, exclusive: tuple[frozenset[str], ...] = (),
                steer: Steer | None = None) -> Case:
    """A case of a given start shape: target and draft tables, prompt, request."""
    V = shape.vocab_size
    target = draw(tables(V, V))
    prompt = draw(prompts(V, long=True, repeat=_ngram_rounds(shape.spec, steer)))
    lo = _max_tokens_floor(max_tokens, min_tokens_speculating, shape.spec, steer)
    mt = _max_tokens(draw, lo, max_tokens, steer)
    params = draw(sampling_params(V, mt, shape.eos_token_id, sampling, exclusive, steer))
    draft = (draw(draft_tables(target, shape.draft_width, steer, shape.eos_token_id, shape.draft_d2t))
             if shape.draft_width is not None else None)
    return Case(target, prompt, params, eos_token_id=shape.eos_token_id, spec=shape.spec, draft_table=draft,
                draft_d2t=shape.draft_d2t)


@st.composite
def cases(
    draw,
    max_vocab: int = 4,
    max_tokens: int = 3,
    max_k: int = 3,
    methods=None,
    inject: str | None = None,
    sampling: frozenset[str] = ALL_SAMPLING,
    draft_vocab: str = "any",
    speculation: bool = True,
    spec_knobs: dict | None = None,
    min_tokens_speculating: int = 1,
    min_vocab: dict | None = None,
) -> Case:
    """A whole case: target table, prompt, request, speculation and (if needed) a draft.

    ``min_vocab``: the smallest vocabulary per method (an engine's floor); V is drawn from
    the smallest floor among ``methods`` up, and the method among those that start on V.
    """
    floors = dict(min_vocab or {})
    methods = tuple(methods or ("draft_model", "ngram", "eagle_tree", "ngram_tree"))
    lo_v = min(max(2, floors.get(m, 2)) for m in methods) if speculation else 2
    if lo_v > max_vocab:
        raise InvalidArgument(f"max_vocab={max_vocab}: methods {methods} need a vocabulary of at least {lo_v}")
    V = draw(st.integers(lo_v, max_vocab))
    target = draw(tables(V, V))
    eos = draw(st.none() | st.integers(0, V - 1))
    prompt = draw(prompts(V))
    # Engines that sample the first token in the prefill step only speculate from the
    # second token on: a shorter output never reaches their speculative path.
    lo = min(max_tokens, min_tokens_speculating) if speculation else 1
    mt = draw(st.integers(lo, max_tokens))
    params = draw(sampling_params(V, mt, eos, sampling))
    if not speculation:
        return Case(target, prompt, params, eos_token_id=eos)
    spec = draw(spec_configs(tuple(m for m in methods if floors.get(m, 2) <= V), max_k, inject, spec_knobs, vocab=V))
    draft = d2t = None
    if spec.uses_draft_model:
        # EAGLE heads draft over (a subset of) the target's vocabulary: never wider.
        width = _draft_width(draw, V, spec, "narrower" if spec.method in ("eagle", "eagle3") else draft_vocab)
        spec = _reduced_draft_sampling(draw, spec, V, width, spec_knobs)
        draft = draw(draft_tables(target, width))
        if spec.method == "eagle3" and width < V:
            d2t = draw(reduced_vocab_maps(V, width))
    return Case(target, prompt, params, eos_token_id=eos, spec=spec, draft_table=draft, draft_d2t=d2t)


@st.composite
def reduced_vocab_maps(draw, V: int, v_draft: int):
    """An EAGLE-3 draft-to-target id map: ``v_draft`` distinct target ids, sorted as
    EAGLE-3 training writes them (by id) or, sometimes, in any order; None (the first
    ``v_draft`` ids) is the shrink target."""
    if not draw(st.booleans()):
        return None
    ids = draw(st.lists(st.integers(0, V - 1), min_size=v_draft, max_size=v_draft, unique=True))
    return tuple(sorted(ids)) if draw(st.booleans()) else tuple(ids)


@st.composite
def case_families(draw, max_patterns: int = 3, shape: StartShape | None = None, **kw) -> list[Case]:
    """Several request patterns on one model family (same tables and speculation settings).

    One engine start (or swap) serves the whole family; the patterns differ in prompt and
    sampling settings, so a batch mixes them (greedy with random, different prompts, ...).
    ``shape``: every family has this start shape (kw then takes only ``max_tokens``,
    ``sampling``, ``min_tokens_speculating``, ``exclusive`` and ``steer``).
    """
    if shape is not None:
        kw = {k: v for k, v in kw.items() if k in ("max_tokens", "sampling", "min_tokens_speculating", "exclusive", "steer")}
        first = draw(shape_cases(shape, **kw))
        speculating = shape.spec is not None
    else:
        first = draw(cases(**kw))
        speculating = kw.get("speculation", True)
    V = first.vocab_size
    out = [first]
    # The same for every further pattern of the family: its least max_tokens and prompt kind.
    lo = _max_tokens_floor(kw.get("max_tokens", 3), kw.get("min_tokens_speculating", 1),
                           first.spec if speculating else None, kw.get("steer"))
    repeat = shape is not None and _ngram_rounds(shape.spec, kw.get("steer"))
    for _ in range(draw(st.integers(0, max_patterns - 1))):
        mt = _max_tokens(draw, lo, kw.get("max_tokens", 3), kw.get("steer"))
        params = draw(sampling_params(V, mt, first.eos_token_id, kw.get("sampling", ALL_SAMPLING), kw.get("exclusive", ()),
                                      kw.get("steer")))
        out.append(first.with_(prompt=draw(prompts(V, long=shape is not None, repeat=repeat)), params=params))
    return out
