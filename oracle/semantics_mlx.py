"""The ``"mlx"`` semantics profile: mlx-lm's sampler and logits processors, speculation off.

mlx-lm (0.32.2) generates one sequence at a time with ``generate_step`` (``stream_generate``
without a draft model). Each step applies the request's ``logits_processors`` (made by
``mlx_lm.sample_utils.make_logits_processors``) to the raw logits, normalises them to
log-probabilities (``logits - logsumexp(logits)``) and hands those to the ``sampler`` (made
by ``make_sampler``). For an output prefix ``out`` of length ``t``:

1. ``logits = L[last]`` (float32 in the engine; float64 here).
2. ``logit_bias`` added (``logit_bias_processor``).
3. The processors' history is ``prompt + out`` (``generate_step`` appends every prefill
   chunk and every sampled token), of which each penalty reads the last
   :data:`CONTEXT_SIZE` tokens (``tokens[-context_size:]``; 20 is the default of
   ``make_logits_processors`` and of ``mlx_lm.server``): repetition ``r`` on each distinct
   token of that window (``l * r`` if ``l < 0`` else ``l / r``), then presence ``l -= p``
   on each distinct token of it, then frequency ``l -= f * count`` (occurrences in it).
4. Greedy (``temp == 0``; the adapter sends ``temp=0`` for ``temperature < 1e-5``):
   ``argmax`` of the log-probabilities (lowest index among exact ties). top-p, min-p and
   top-k do not apply.
5. Sampling, all on the temperature-1 log-probabilities ``x``: top-p (``apply_top_p``:
   sort ascending; a token at sorted position ``i`` is dropped when the probability mass
   at the positions after it is ``>= top_p``; every token whose log-probability is ``>=``
   that of the first kept position stays, so ties at the cut are kept together), then
   min-p (``x < max x + log(min_p)`` masked; ``min_tokens_to_keep = 1``), then top-k
   (``argpartition``: exactly ``k`` tokens kept), then ``categorical(x / temp)``: the
   softmax of what is left at the request's temperature.

Differences from the ``"vllm"`` profile: the truncations (top-p, min-p, top-k) are decided
on the temperature-1 distribution and the temperature only shapes the sampling among the
tokens kept (vLLM divides by the temperature first); top-p comes first and drops a token
whose preceding mass equals ``top_p`` (vLLM: after min-p and top-k); penalties read a
window of the last 20 tokens of prompt + output, presence and frequency included (vLLM:
the output only, unwindowed); logit bias comes before the penalties. No ``min_tokens``,
allowed tokens, bad words, grammar constraints or thinking budgets (``InvalidInput``).

Ambiguity (:class:`~specfuzz.errors.AmbiguousSemantics`), as in the other profiles: a top-p
mass within ``TOP_P_ATOL`` of ``top_p``, or a cut between log-probabilities within float32
rounding of each other but not equal; a min-p ratio within ``MIN_P_RTOL`` of ``min_p``; a tie
across the top-k boundary (``argpartition`` keeps an unspecified one of the tied tokens);
near ties at the greedy maximum after bias or penalties.

Not modelled (left off the strategies, see docs/engines/mlx.md): ``xtc_probability`` /
``xtc_threshold`` (specfuzz's SamplingParams has no such field), ``min_tokens_to_keep`` > 1,
context sizes other than 20, and model dtypes other than float32 (mlx-lm computes the
log-probabilities in the model's dtype, which rounds the law itself in bfloat16/float16).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from .profile import History, Profile, RequestSpec
from .steps import (
    NEAR_TIE_RTOL, NEG_INF, TOP_P_ATOL, add_bias, apply_min_p, apply_top_k, check_rows, greedy_probs, softmax,
)

# The window of the penalties: ``repetition_context_size``, ``presence_context_size`` and
# ``frequency_context_size`` of ``make_logits_processors`` (and of mlx_lm.server requests).
CONTEXT_SIZE = 20

# SamplingParams fields mlx-lm's make_sampler / make_logits_processors have no option for.
MLX_UNSUPPORTED: dict[str, object] = {
    "min_tokens": 0,
    "allowed_token_ids": None,
    "bad_words": (),
    "thinking_budget": None,
    "think_end_token_id": None,
    "regex": None,
    "choice": None,
}


def window_counts(prompt: tuple[int, ...], outs: np.ndarray, vocab_size: int, size: int = CONTEXT_SIZE) -> np.ndarray:
    """Occurrences of each token in the last ``size`` tokens of ``prompt + out`` for each
    row of ``outs`` [N, t]. [N, V] int64"""
    N, t = outs.shape
    ctx = np.concatenate([np.broadcast_to(np.asarray(prompt, dtype=np.int64), (N, len(prompt))), outs], axis=1)  # [N, P+t]
    win = ctx[:, -size:]  # [N, W]
    flat = (np.arange(N, dtype=np.int64)[:, None] * vocab_size + win).ravel()  # [N*W]
    return np.bincount(flat, minlength=N * vocab_size).reshape(N, vocab_size).astype(np.int64)  # [N, V]


def mlx_penalties(logits: np.ndarray, counts: np.ndarray, repetition: float, presence: float, frequency: float) -> np.ndarray:
    """Repetition (``l * r`` if ``l < 0`` else ``l / r``), presence (``l -= p``) and frequency
    (``l -= f * count``) on the tokens of the window, in that order. [N, V] -> [N, V]

    ``counts`` [N, V]: occurrences in the window (:func:`window_counts`).
    """
    out = logits
    seen = counts > 0  # [N, V]
    if repetition != 1.0:
        out = np.where(seen, np.where(out < 0, out * repetition, out / repetition), out)
    if presence != 0.0:
        out = out - presence * seen
    if frequency != 0.0:
        out = out - frequency * counts
    return out


def mlx_top_p(x: np.ndarray, top_p: float) -> np.ndarray:
    """mlx-lm's ``apply_top_p`` on log-probabilities ``x`` [N, V] (masked = -inf).

    Ascending sort; position ``i`` is dropped when the mass at the positions after it is
    ``>= top_p`` (a prefix of the sort); the threshold is the value at the first kept
    position and every token ``>=`` it is kept (ties at the cut stay together). [N, V] -> [N, V]
    """
    N, V = x.shape
    order = np.argsort(x, axis=1, kind="stable")  # [N, V] ascending
    xs = np.take_along_axis(x, order, axis=1)  # [N, V]
    ps = softmax(xs)  # [N, V]
    above = np.cumsum(ps[:, ::-1], axis=1)[:, ::-1] - ps  # [N, V] mass at the positions after each
    close = (np.abs(above - top_p) <= TOP_P_ATOL) & (xs > NEG_INF)  # [N, V]
    check_rows(
        close.any(axis=1),
        lambda r: f"top_p={top_p!r}: the probability mass {float(above[r][close[r]][0])!r} above a token is within "
        f"{TOP_P_ATOL:g} of top_p",
    )
    dropped = (above >= top_p).sum(axis=1)  # [N], at most V - 1 (nothing lies above the largest)
    rows = np.arange(N)
    thr = xs[rows, dropped]  # [N] log-probability of the first kept position
    prev = np.where(dropped > 0, xs[rows, np.maximum(dropped - 1, 0)], NEG_INF)  # [N] the last dropped
    near = np.isfinite(prev) & (prev < thr) & (thr - prev <= NEAR_TIE_RTOL * np.maximum(1.0, np.abs(thr)))  # [N]
    check_rows(
        near,
        lambda r: f"top_p={top_p!r}: the cut falls between log-probabilities {float(prev[r])!r} and {float(thr[r])!r}, "
        "within float32 rounding of each other",
    )
    return np.where(x < thr[:, None], NEG_INF, x)


def mlx_random_probs(logits: np.ndarray, temperature: float, top_p: float, min_p: float, top_k: int) -> np.ndarray:
    """Step 5: top-p, min-p, top-k on the temperature-1 distribution, then the softmax of the
    kept logits divided by the temperature. [N, V] -> [N, V]"""
    x = logits - logits.max(axis=1, keepdims=True)  # [N, V] shifted (the truncations are shift-invariant)
    if 0.0 < top_p < 1.0:
        x = mlx_top_p(x, top_p)
    if min_p > 0.0:
        x = apply_min_p(x, min_p)
    if top_k >= 1:
        x = apply_top_k(x, top_k, ambiguous_ties=True)
    return softmax(x / temperature)


class MLXProfile(Profile):
    """mlx-lm 0.32.2's ``generate_step`` with ``make_sampler`` / ``make_logits_processors``
    (see the module docstring for the order). Stale processors: "penalties" (the window is
    taken on the stale view of the output)."""

    name = "mlx"
    unsupported = MLX_UNSUPPORTED
    engine_label = "mlx-lm"

    def _probs(self, spec: RequestSpec, outs: np.ndarray, views: Mapping[str, History]) -> np.ndarray:
        p = spec.params
        N, t = outs.shape
        last = outs[:, -1] if t else np.full(N, spec.prompt[-1], dtype=np.int64)  # [N]
        logits = spec.table[last]  # [N, V] (a copy)
        if spec.bias is not None:
            logits = add_bias(logits, spec.bias)
        if spec.has_penalties:
            counts = window_counts(spec.prompt, views["penalties"].outs, spec.vocab_size)  # [N, V]
            logits = mlx_penalties(logits, counts, p.repetition_penalty, p.presence_penalty, p.frequency_penalty)
        if p.greedy:
            return greedy_probs(logits, exact=spec.bias is None and not spec.has_penalties)
        top_k = p.top_k if p.top_k < spec.vocab_size else 0  # k >= V keeps everything
        return mlx_random_probs(logits, p.temperature, p.top_p, p.min_p, top_k)
