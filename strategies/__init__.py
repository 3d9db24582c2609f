"""Hypothesis strategies for cases (SPEC §6). Each part is a strategy of its own.

Every choice shrinks toward the simplest value: small vocabularies, K=1, temperature
1, no optional sampling feature, the shortest output.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from specfuzz.case import Case
from specfuzz.oracle.params import SamplingParams
from specfuzz.oracle.speculative import SpecConfig

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
def draft_tables(draw, target: np.ndarray, v_draft: int) -> np.ndarray:
    """A draft table [max(V, V_draft), V_draft]: identical, perturbed or unrelated to the target."""
    V = target.shape[0]
    rows = max(V, v_draft)
    rel = draw(st.sampled_from(["unrelated", "identical", "perturbed"]))
    if rel == "unrelated" or v_draft != V:
        return draw(tables(rows, v_draft))
    base = np.where(np.isfinite(target), target, -8.0)
    if rel == "identical":
        return base
    noise = np.array(draw(st.lists(_LOGIT, min_size=V * V, max_size=V * V))).reshape(V, V) / 2
    return base + noise


@st.composite
def sampling_params(draw, V: int, max_tokens: int, eos: int | None) -> SamplingParams:
    """Sampling settings; each optional feature is off unless drawn on."""
    kw: dict = {"max_tokens": max_tokens}
    if draw(st.booleans()):
        kw["temperature"] = draw(st.sampled_from([1.0, 0.0, 0.5, 2.0]))
    if draw(st.booleans()):
        kw["top_k"] = draw(st.integers(1, V))
    if draw(st.booleans()):
        kw["top_p"] = draw(st.sampled_from([0.9, 0.7, 0.5]))
    if draw(st.booleans()):
        kw["min_p"] = draw(st.sampled_from([0.05, 0.2]))
    if draw(st.booleans()):
        kw["repetition_penalty"] = draw(st.sampled_from([1.5, 0.8]))
    if draw(st.booleans()):
        kw["frequency_penalty"] = draw(st.sampled_from([0.5, -0.5]))
    if draw(st.booleans()):
        kw["presence_penalty"] = draw(st.sampled_from([0.5, -0.5]))
    if draw(st.booleans()):
        kw["min_tokens"] = draw(st.integers(0, max_tokens))
    if draw(st.booleans()):
        kw["stop_token_ids"] = (draw(st.integers(0, V - 1)),)
    if eos is not None and draw(st.booleans()):
        kw["ignore_eos"] = True
    if draw(st.booleans()):
        kw["thinking_budget"] = draw(st.integers(0, max_tokens))
        kw["think_end_token_id"] = draw(st.integers(0, V - 1))
    return SamplingParams(**kw)


def spec_configs(methods=("draft_model", "ngram", "eagle_tree", "ngram_tree"), max_k: int = 3, inject: str | None = None):
    """Speculation settings for the reference engine."""

    @st.composite
    def _spec(draw) -> SpecConfig:
        method = draw(st.sampled_from(methods))
        kw: dict = {"method": method, "num_speculative_tokens": draw(st.integers(1, max_k)), "inject": inject}
        if method in ("draft_model", "ngram"):
            kw["verify"] = draw(st.sampled_from(["token", "block"]))
        if method in ("draft_model", "eagle_tree"):
            kw["draft_sampling"] = draw(st.sampled_from(["sampled", "greedy"]))
        if method in ("ngram", "ngram_tree"):
            lo = draw(st.integers(1, 2))
            kw["ngram_min"], kw["ngram_max"] = lo, draw(st.integers(lo, 3))
        if method in ("eagle_tree", "ngram_tree"):
            kw["tree_topk"] = draw(st.integers(1, 3))
            kw["tree_budget"] = draw(st.integers(1, 6))
        return SpecConfig(**kw)

    return _spec()


@st.composite
def cases(draw, max_vocab: int = 4, max_tokens: int = 3, max_k: int = 3, methods=None, inject: str | None = None) -> Case:
    """A whole case: target table, prompt, request, speculation and (if needed) a draft."""
    V = draw(st.integers(2, max_vocab))
    target = draw(tables(V, V))
    eos = draw(st.none() | st.integers(0, V - 1))
    prompt = tuple(draw(st.lists(st.integers(0, V - 1), min_size=1, max_size=5)))
    mt = draw(st.integers(1, max_tokens))
    params = draw(sampling_params(V, mt, eos))
    spec = draw(spec_configs(methods or ("draft_model", "ngram", "eagle_tree", "ngram_tree"), max_k, inject))
    draft = None
    if spec.uses_draft_model:
        v_draft = draw(st.integers(2, V + 1)) if spec.method == "draft_model" else draw(st.integers(1, V).map(lambda v: max(v, 2) if V >= 2 else v))
        v_draft = min(v_draft, V) if spec.is_tree else v_draft
        draft = draw(draft_tables(target, v_draft))
    return Case(target, prompt, params, eos_token_id=eos, spec=spec, draft_table=draft)
