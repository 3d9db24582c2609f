"""The ``"llamacpp"`` profile: llama.cpp's sampler chain as ``llama-server`` runs it.

Source: the llama.cpp tree vendored by llama-cpp-python 0.3.36 (``common/sampling.cpp``,
``src/llama-sampler.cpp``, ``tools/server/server-schema.cpp``, ``server-context.cpp``). The
adapter (:mod:`specfuzz.engines.llamacpp_engine`) sends every sampler parameter on every
request (``top_k=0``, ``top_p=1``, ``min_p=0`` ... when off: llama-server's own defaults are
40 / 0.95 / 0.05) and keeps the default sampler order, so a request runs, for an output
prefix ``out`` of length ``t`` (``last`` = last token of prompt + out):

1. ``logits = L[last]`` (float32 in the engine; float64 here).
2. ``logit_bias`` added (``llama_sampler_logit_bias``, first in the chain, before the
   penalties). ``ignore_eos`` adds ``-inf`` to every end-of-generation token
   (``server-schema.cpp``: the EOG biases are appended to ``logit_bias``): EOS is *masked*,
   not merely ignored (vLLM lets it be sampled and goes on).
3. Penalties (``llama_sampler_penalties``) over a window of the last ``penalty_last_n`` =
   :data:`PENALTY_LAST_N` tokens of prompt + output: the server feeds every prompt token to
   the sampler (``server_slot::init_sampler``), so the prompt counts for all three penalties.
   For each token with count ``c > 0`` in the window: ``l * r`` if ``l <= 0`` else ``l / r``,
   then ``l -= c * frequency + presence``.
4. The default order of the chain (``common_params_sampling::samplers``): penalties, DRY
   (off), top-n-sigma (off), **top-k** (keep exactly ``k`` after a partial sort; a tie
   across the k-th value is ambiguous), typical (off), **top-p** (softmax of what is left at
   temperature 1, sorted descending, keep the shortest prefix whose float32 cumulative sum
   is ``>= top_p``), **min-p** (keep ``l >= max l + log(min_p)``, at temperature 1), XTC
   (off), **temperature** last: ``l / T``; ``T <= 0`` keeps only the first maximum in the
   candidates' current order (token order unless top-k or top-p sorted them: then an exact
   tie at the maximum is ambiguous).
5. ``dist``: softmax of what is left, one draw.

Differences from the ``"vllm"`` profile: temperature comes *after* top-k / top-p / min-p
(vLLM: before), top-p keeps the shortest prefix reaching ``top_p`` (vLLM masks
``cumsum <= 1 - top_p`` from the bottom), penalties see the prompt for frequency and
presence too and only within the last 64 tokens, the logit bias comes before the
penalties, and ``ignore_eos`` masks EOS. Not available (``InvalidInput`` naming the field):
allowed tokens, bad words, min_tokens, stop token ids (llama-server stops on strings only),
thinking budgets, regex / choice constraints.

Not drawn (the oracle has no parameters for them; the adapter sends them off): typical-p,
DRY, XTC, top-n-sigma, mirostat, dynamic temperature, a ``samplers`` order other than the
default, ``penalty_last_n`` other than :data:`PENALTY_LAST_N`.

Ambiguity rules are the vLLM profile's (same helpers), with llama.cpp's own top-p and min-p
boundaries: a cumulative sum within ``TOP_P_ATOL`` of ``top_p`` before or at the cut, a cut
between (near-)tied probabilities, a logit within :data:`MIN_P_LOG_ATOL` of the min-p
threshold ``max l + log(min_p)`` (float32 rounds that sum).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from .profile import History, Profile, RequestSpec
from .steps import NEAR_TIE_RTOL, NEG_INF, TOP_P_ATOL, add_bias, apply_top_k, greedy_probs, softmax
from .steps import check_rows as _check

# llama-server's default repeat_last_n, which the adapter sends: the penalties' window.
PENALTY_LAST_N = 64
# A logit this close (absolute) to the min-p threshold max + log(min_p) may compare either
# way in float32 (the threshold is a float32 sum of the maximum and logf(min_p)).
MIN_P_LOG_ATOL = 1e-5

# SamplingParams fields llama-server has no equivalent for (value when off).
LLAMACPP_UNSUPPORTED: dict[str, object] = {
    "allowed_token_ids": None,
    "bad_words": (),
    "min_tokens": 0,
    "stop_token_ids": (),
    "thinking_budget": None,
    "think_end_token_id": None,
    "regex": None,
    "choice": None,
}


def window_counts(prompt: tuple[int, ...], outs: np.ndarray, vocab_size: int, last_n: int = PENALTY_LAST_N) -> np.ndarray:
    """Occurrences of each token among the last ``last_n`` tokens of prompt + output. [N, V]"""
    N, t = outs.shape
    ctx = np.concatenate([np.broadcast_to(np.asarray(prompt, dtype=np.int64), (N, len(prompt))), outs], axis=1)  # [N, P+t]
    win = ctx[:, -last_n:] if last_n > 0 else ctx[:, :0]  # [N, <=last_n]
    flat = (np.arange(N, dtype=np.int64)[:, None] * vocab_size + win).ravel()
    return np.bincount(flat, minlength=N * vocab_size).reshape(N, vocab_size)  # [N, V]


def llamacpp_penalties(logits: np.ndarray, counts: np.ndarray, repetition: float, frequency: float, presence: float) -> np.ndarray:
    """``llama_sampler_penalties``: on tokens with window count ``c > 0``: ``l * r`` if
    ``l <= 0`` else ``l / r``, then ``l -= c * frequency + presence``. [N, V] -> [N, V]"""
    seen = counts > 0  # [N, V]
    rep = np.where(logits <= 0, logits * repetition, logits / repetition)  # [N, V]
    pen = rep - counts * frequency - presence
    return np.where(seen, pen, logits)


def llamacpp_top_p_keep(x: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the shortest prefix (by descending probability of ``softmax(x)``) whose cumulative
    sum reaches ``top_p``. [N, V] -> kept [N, V] bool."""
    N, V = x.shape
    ps = softmax(x)  # [N, V]
    order = np.argsort(-ps, axis=1, kind="stable")  # [N, V]
    psd = np.take_along_axis(ps, order, axis=1)  # [N, V] descending
    cs = np.cumsum(psd, axis=1)  # [N, V]
    reach = cs >= top_p  # [N, V]
    m = np.where(reach.any(axis=1), reach.argmax(axis=1) + 1, V)  # [N] kept count
    idx = np.arange(V)[None, :]
    # Sums before and at the cut that float32 could put on the other side of top_p.
    close = (idx < m[:, None]) & (psd > 0) & (np.abs(cs - top_p) <= TOP_P_ATOL)  # [N, V]
    _check(close.any(axis=1), lambda r: f"top_p={top_p!r}: cumulative probability {float(cs[r][close[r]][0])!r} is within {TOP_P_ATOL:g} of top_p")
    rows = np.flatnonzero(m < V)
    a = psd[rows, m[rows] - 1]  # [R] last kept
    b = psd[rows, m[rows]]  # [R] first dropped
    tie = np.zeros(N, dtype=bool)
    tie[rows] = (b > 0) & (a - b <= NEAR_TIE_RTOL * a)
    _check(tie, lambda r: f"top_p={top_p!r}: the cut falls between (near-)tied probabilities {float(psd[r, m[r] - 1])!r} and {float(psd[r, m[r]])!r} (the kept set depends on sort order)")
    keep_sorted = idx < m[:, None]  # [N, V]
    keep = np.empty_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=1)
    return keep


def llamacpp_min_p_keep(x: np.ndarray, min_p: float) -> np.ndarray:
    """Keep ``x >= max x + log(min_p)``. [N, V] -> kept [N, V] bool."""
    top = x.max(axis=1, keepdims=True)  # [N, 1]
    thr = top + np.log(min_p)  # [N, 1]
    near = np.isfinite(x) & (x < top) & (np.abs(x - thr) <= MIN_P_LOG_ATOL)  # [N, V]
    _check(near.any(axis=1), lambda r: f"min_p={min_p!r}: logit {float(x[r][near[r]][0])!r} is within {MIN_P_LOG_ATOL:g} of the threshold {float(thr[r, 0])!r}")
    return x >= thr


class LlamaCppProfile(Profile):
    """llama-server's sampler chain (see the module docstring)."""

    name = "llamacpp"
    # Every processor name is accepted for ``stale`` (bug laws); only "penalties" is live here.
    unsupported = LLAMACPP_UNSUPPORTED
    engine_label = "llama.cpp (llama-server)"

    def _probs(self, spec: RequestSpec, outs: np.ndarray, views: Mapping[str, History]) -> np.ndarray:
        p = spec.params
        N, t = outs.shape
        V = spec.vocab_size
        last = outs[:, -1] if t else np.full(N, spec.prompt[-1], dtype=np.int64)  # [N]
        logits = spec.table[last]  # [N, V] (a copy)
        if spec.bias is not None:
            logits = add_bias(logits, spec.bias)
        if p.ignore_eos and spec.eos_token_id is not None:
            logits[:, spec.eos_token_id] = NEG_INF
        if spec.has_penalties:
            counts = window_counts(spec.prompt, views["penalties"].outs, V)
            logits = llamacpp_penalties(logits, counts, p.repetition_penalty, p.frequency_penalty, p.presence_penalty)
        _check(~np.isfinite(logits).any(axis=1), lambda r: "every token is masked (logit_bias / ignore_eos)")
        exact = spec.bias is None and not spec.has_penalties
        keep = np.isfinite(logits)  # [N, V]
        x = logits
        if p.top_k >= 1:
            x = apply_top_k(x, p.top_k, exact=exact, ambiguous_ties=True)
        if p.top_p < 1.0:
            x = np.where(llamacpp_top_p_keep(x, p.top_p), x, NEG_INF)
        if p.min_p > 0.0:
            x = np.where(llamacpp_min_p_keep(x, p.min_p), x, NEG_INF)
        keep &= np.isfinite(x)
        x = np.where(keep, x, NEG_INF)
        if p.greedy:
            if p.top_k >= 1 or p.top_p < 1.0:
                top = x.max(axis=1)  # [N]
                n_top = (x == top[:, None]).sum(axis=1)  # [N]
                _check(n_top > 1, lambda r: f"greedy: {int(n_top[r])} tokens tie at the maximum logit {float(top[r])!r} after "
                       "top-k/top-p sorted the candidates (which one comes first is unspecified)")
            return greedy_probs(x, exact)
        return softmax(x / p.temperature)
