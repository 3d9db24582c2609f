"""Pure statistics for verdicts: anytime-valid e-processes against the exact law μ.

Everything here is numpy/scipy arithmetic on observed outputs; no engine code.

Vocabulary of this module
-------------------------
* An *output* is a complete generation, a tuple of token ids. It may hold ids that are
  impossible under μ (``-1``, ids ``>= vocab_size``), tokens after a stop point, or stop
  before μ allows it.
* A *law* μ is either a :class:`Law` (exact next-token conditionals plus a deterministic
  stop rule) or an *enumerated law*: a mapping ``{output: probability}`` over complete
  outputs summing to 1 (wrapped by :class:`EnumeratedLaw`).
* A *catalogued alternative* μD (the law of a known bug class, SPEC §4) is always an
  enumerated mapping; it may put mass on outputs impossible under μ.
* *Cells*: at an output prefix (a *context*) the next event is one of ``K = V + 2``
  cells: a token ``0..V-1``, the single lumped out-of-vocabulary cell ``V`` (every id
  outside ``[0, V)``), or ``END`` (= ``V + 1``: the output stops here).

Evidence (SPEC §5)
------------------
The verdict's evidence is a mixture e-process ``E_n`` (a non-negative supermartingale
with ``E_0 = 1`` under μ); by Ville's inequality ``P_μ(sup_n E_n >= 1/α) <= α`` so a
case may be looked at after every sample and stopped at any time. Components:

1. the *universal* tree e-process (Krichevsky–Trofimov predictive per context), which
   has power against every law different from μ: half the KT product over all contexts,
   half a sparse mixture that finds deviations confined to a few contexts;
2. one likelihood ratio per catalogued bug law μD_j, which is the optimal test against
   that bug (and refutes it when ``1/LR_j >= 1/α``).

A campaign spreads its α over cases with :class:`AlphaSpender`, so the false-alarm rate
of the whole campaign is at most ``alpha_total``.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping, Protocol, runtime_checkable

import numpy as np
from scipy.special import gammaln, logsumexp
from scipy.stats import chi2

from specfuzz.errors import InvalidInput

__all__ = [
    "Law",
    "EnumeratedLaw",
    "Verdict",
    "TokenDeviation",
    "SequentialTest",
    "AlphaSpender",
    "Attribution",
    "attribute",
    "position_test",
    "kl_divergence",
    "optimal_sample_count",
    "ripr_projection",
    "universal_log_e",
    "SCHEMA_VERSION",
]

SCHEMA_VERSION = 1
# KT prior: 1/2 per token μ allows; a total of 1/2 spread over the cells μ forbids.
KT_POSSIBLE_PRIOR = 0.5
KT_IMPOSSIBLE_TOTAL = 0.5
# Enumerated laws (μ and every μD) must sum to 1 within this.
DISTRIBUTION_SUM_TOLERANCE = 1e-9
# Law.conditional(prefix) must sum to 1 within this.
CONDITIONAL_SUM_TOLERANCE = 1e-9
# An alternative whose KL(μD || μ) is at most this is "identical to μ": no test can see it.
IDENTICAL_KL = 1e-10
# Attribution names a class only with LR >= 1/ATTRIBUTION_ALPHA against μ ...
ATTRIBUTION_ALPHA = 1e-3
# ... and a likelihood within this factor of the best explanation (universal included).
ATTRIBUTION_MARGIN = math.log(100.0)
# Classic (fixed-n, information only) G-tests pool cells with expected count below this.
MIN_EXPECTED_COUNT = 5.0
# Tolerant e-process: re-fit a context's bet when its count doubles while it has fewer
# than this many events, then whenever its count grew by 1/REFRESH_DIVISOR.
REFRESH_DIVISOR = 8
# Sparse universal part: prior weight of a context of length d is
# (1 - SPARSE_DEPTH_DECAY) * SPARSE_DEPTH_DECAY**d / V**d (sums to <= 1 over all prefixes).
SPARSE_DEPTH_DECAY = 0.5
# Labels for the two non-token cells in reports.
OOV_LABEL = "<oov>"
END_LABEL = "<end>"

_INF = math.inf


# ----------------------------------------------------------------------------- laws


@runtime_checkable
class Law(Protocol):
    """An exact law over complete outputs given by next-token conditionals.

    ``conditional(prefix)`` is ``P(next token | output prefix)``: a float64 array of
    shape ``[vocab_size]`` summing to 1, asked only for prefixes that μ can reach and
    where ``is_terminal(prefix)`` is False. ``is_terminal(output)`` says whether
    generation stops after ``output`` (stop token, max length, ...); stopping is
    deterministic given the output.
    """

    vocab_size: int

    def conditional(self, prefix: tuple[int, ...]) -> np.ndarray: ...  # [V]

    def is_terminal(self, output: tuple[int, ...]) -> bool: ...


class EnumeratedLaw:
    """A :class:`Law` built from an enumerated mapping ``{output: probability}``.

    Unlike a generic :class:`Law`, the support need not be prefix-free: an output may be
    both complete and a prefix of another, in which case :meth:`stop_probability` is
    strictly between 0 and 1 and the tree tests treat ``END`` as an ordinary cell.
    ``vocab_size`` defaults to ``1 + max token id`` of the support.
    """

    def __init__(self, probabilities: Mapping[tuple[int, ...], float], vocab_size: int | None = None) -> None:
        probs = _check_distribution("law", probabilities, allow_oov=False)
        top = max((max(x) for x in probs if x), default=-1)
        if vocab_size is None:
            vocab_size = max(top + 1, 1)
        _check_vocab_size(vocab_size)
        if top >= vocab_size:
            raise InvalidInput("law token id", top, f"ids in [0, vocab_size={vocab_size})")
        self.vocab_size = int(vocab_size)
        self._probs = probs
        self._mass: dict[tuple[int, ...], float] = defaultdict(float)  # prefix -> μ(outputs extending it)
        self._children: dict[tuple[int, ...], dict[int, float]] = defaultdict(dict)
        for x, p in probs.items():
            for t in range(len(x) + 1):
                self._mass[x[:t]] += p
        for prefix in list(self._mass):
            if prefix:
                self._children[prefix[:-1]][prefix[-1]] = self._mass[prefix]
        self._mass = dict(self._mass)
        self._children = dict(self._children)

    @property
    def probabilities(self) -> dict[tuple[int, ...], float]:
        """The validated mapping (outputs of probability 0 dropped)."""
        return dict(self._probs)

    def probability(self, output: tuple[int, ...]) -> float:
        return self._probs.get(tuple(output), 0.0)

    def _reachable_mass(self, prefix: tuple[int, ...]) -> float:
        m = self._mass.get(tuple(prefix), 0.0)
        if m <= 0.0:
            raise InvalidInput("prefix", prefix, "a prefix with positive probability under the law")
        return m

    def stop_probability(self, prefix: tuple[int, ...]) -> float:
        """``P(output == prefix | output starts with prefix)``."""
        prefix = tuple(prefix)
        m = self._reachable_mass(prefix)
        if prefix not in self._children:
            return 1.0
        return min(1.0, self._probs.get(prefix, 0.0) / m)

    def is_terminal(self, output: tuple[int, ...]) -> bool:
        return self.stop_probability(output) >= 1.0

    def conditional(self, prefix: tuple[int, ...]) -> np.ndarray:
        """``P(next token | prefix, the output continues)``, shape ``[V]``."""
        prefix = tuple(prefix)
        self._reachable_mass(prefix)
        kids = self._children.get(prefix)
        if not kids:
            raise InvalidInput("prefix", prefix, "a prefix after which the law can continue")
        out = np.zeros(self.vocab_size)  # [V]
        for tok, m in kids.items():
            out[tok] = m
        return out / out.sum()

    def _cell_probabilities(self, prefix: tuple[int, ...]) -> np.ndarray:
        """μ(cell | prefix) over the ``V + 2`` cells, shape ``[K]``."""
        m = self._reachable_mass(prefix)
        out = np.zeros(self.vocab_size + 2)  # [K]
        for tok, cm in self._children.get(prefix, {}).items():
            out[tok] = cm / m
        out[self.vocab_size + 1] = self._probs.get(prefix, 0.0) / m
        return out


# ------------------------------------------------------------------------ validation


def _is_int(t: object) -> bool:
    return isinstance(t, (int, np.integer)) and not isinstance(t, (bool, np.bool_))


def _as_output(name: str, x: object) -> tuple[int, ...]:
    if isinstance(x, (str, bytes)) or not hasattr(x, "__iter__"):
        raise InvalidInput(name, x, "a sequence of integer token ids")
    out = tuple(x)  # type: ignore[arg-type]
    for t in out:
        if not _is_int(t):
            raise InvalidInput(name, x, "a sequence of integer token ids")
    return tuple(int(t) for t in out)


def _check_alpha(alpha: object, name: str = "alpha") -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.floating)) or not 0.0 < float(alpha) < 1.0:
        raise InvalidInput(name, alpha, "a number in (0, 1)")
    return float(alpha)


def _check_tolerance(tolerance: object) -> float:
    if (
        isinstance(tolerance, bool)
        or not isinstance(tolerance, (int, float, np.floating))
        or not math.isfinite(float(tolerance))
        or not 0.0 <= float(tolerance) < 1.0
    ):
        raise InvalidInput("tolerance", tolerance, "a number in [0, 1) (per-token conditional probability)")
    return float(tolerance)


def _check_vocab_size(v: object) -> int:
    if not _is_int(v) or int(v) < 1:  # type: ignore[call-overload]
        raise InvalidInput("vocab_size", v, "an integer >= 1")
    return int(v)  # type: ignore[call-overload]


def _check_distribution(name: str, mapping: object, *, allow_oov: bool) -> dict[tuple[int, ...], float]:
    """Validate an enumerated law; return ``{output: p}`` without zero entries."""
    if not isinstance(mapping, Mapping):
        raise InvalidInput(name, mapping, "a mapping from outputs (token-id tuples) to probabilities")
    out: dict[tuple[int, ...], float] = {}
    values = []
    for k, p in mapping.items():
        key = _as_output(f"{name} key", k)
        if not allow_oov and any(t < 0 for t in key):
            raise InvalidInput(f"{name} key", k, "outputs of token ids >= 0")
        if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)):
            raise InvalidInput(f"{name}[{k!r}]", p, "a finite probability >= 0")
        pf = float(p)
        if not math.isfinite(pf) or pf < 0.0:
            raise InvalidInput(f"{name}[{k!r}]", p, "a finite probability >= 0")
        values.append(pf)
        if pf > 0.0:
            out[key] = out.get(key, 0.0) + pf
    total = math.fsum(values)
    if not abs(total - 1.0) <= DISTRIBUTION_SUM_TOLERANCE:
        raise InvalidInput(f"sum of {name}", total, f"probabilities summing to 1 within {DISTRIBUTION_SUM_TOLERANCE:g}")
    return out


def _check_counts(counts: object) -> dict[tuple[int, ...], int]:
    if not isinstance(counts, Mapping):
        raise InvalidInput("counts", counts, "a mapping from outputs to counts")
    out: dict[tuple[int, ...], int] = {}
    for k, c in counts.items():
        key = _as_output("counts key", k)
        if not _is_int(c) or int(c) < 0:
            raise InvalidInput(f"counts[{k!r}]", c, "an integer >= 0")
        if int(c) > 0:
            out[key] = out.get(key, 0) + int(c)
    return out


def _check_alternatives(alternatives: object) -> dict[str, dict[tuple[int, ...], float]]:
    if alternatives is None:
        return {}
    if not isinstance(alternatives, Mapping):
        raise InvalidInput("alternatives", alternatives, "a mapping from class names to enumerated laws")
    out = {}
    for name, law in alternatives.items():
        if not isinstance(name, str) or not name or name == "universal":
            raise InvalidInput("alternative name", name, "a non-empty string other than 'universal'")
        out[name] = _check_distribution(f"alternatives[{name!r}]", law, allow_oov=True)
    return out


def _resolve_law(law: object, vocab_size: int | None) -> tuple[Law, dict[tuple[int, ...], float] | None]:
    """Return (a Law, the enumerated mapping if μ was given enumerated)."""
    if isinstance(law, EnumeratedLaw):
        if vocab_size is not None and _check_vocab_size(vocab_size) != law.vocab_size:
            raise InvalidInput("vocab_size", vocab_size, f"the law's own vocab_size {law.vocab_size}")
        return law, law.probabilities
    if isinstance(law, Mapping):
        e = EnumeratedLaw(law, vocab_size)
        return e, e.probabilities
    if isinstance(law, Law):
        _check_vocab_size(law.vocab_size)
        if vocab_size is not None and _check_vocab_size(vocab_size) != law.vocab_size:
            raise InvalidInput("vocab_size", vocab_size, f"the law's own vocab_size {law.vocab_size}")
        return law, None
    raise InvalidInput("law", law, "a Law (vocab_size, conditional, is_terminal) or a mapping {output: probability}")


# ------------------------------------------------------------------- μ per context


@dataclass(frozen=True)
class _CtxInfo:
    probs: np.ndarray  # [K] μ(cell | prefix); terminal contexts put all mass on END
    terminal: bool  # μ stops here with probability 1


class _MuCells:
    """μ's cell-level conditionals, cached per prefix (each prefix is asked once)."""

    def __init__(self, law: Law) -> None:
        self.law = law
        self.V = int(law.vocab_size)
        self.K = self.V + 2
        self.OOV = self.V
        self.END = self.V + 1
        self._cache: dict[tuple[int, ...], _CtxInfo] = {}

    def cell(self, token: int) -> int:
        return token if 0 <= token < self.V else self.OOV

    def info(self, prefix: tuple[int, ...]) -> _CtxInfo:
        hit = self._cache.get(prefix)
        if hit is not None:
            return hit
        law = self.law
        if isinstance(law, EnumeratedLaw):
            probs = law._cell_probabilities(prefix)  # [K]
            terminal = probs[self.END] >= 1.0
        else:
            terminal = bool(law.is_terminal(prefix))
            probs = np.zeros(self.K)  # [K]
            if not terminal:
                cond = np.asarray(law.conditional(prefix), dtype=np.float64)  # [V]
                if (
                    cond.shape != (self.V,)
                    or not np.all(np.isfinite(cond))
                    or np.any(cond < 0)
                    or abs(math.fsum(cond.tolist()) - 1.0) > CONDITIONAL_SUM_TOLERANCE
                ):
                    raise InvalidInput(
                        f"law.conditional({prefix!r})",
                        cond,
                        f"a float64 array of shape [{self.V}], entries >= 0, summing to 1 within {CONDITIONAL_SUM_TOLERANCE:g}",
                    )
                probs[: self.V] = cond
        if terminal:
            probs = np.zeros(self.K)
            probs[self.END] = 1.0
        probs.setflags(write=False)
        info = _CtxInfo(probs, bool(terminal))
        self._cache[prefix] = info
        return info

    def log_prob(self, x: tuple[int, ...]) -> float:
        """Exact ``log μ(x)`` of a complete output (``-inf`` when impossible)."""
        total = 0.0
        for t in range(len(x) + 1):
            info = self.info(x[:t])
            if info.terminal:
                return total if t == len(x) else -_INF
            p = info.probs[self.END if t == len(x) else self.cell(x[t])]
            if p <= 0.0:
                return -_INF
            total += math.log(p)
        return total


# Kinds of scored steps.
_NORMAL, _POOL_END, _POOL_CONT = 0, 1, 2


def _walk(
    mu: _MuCells, x: tuple[int, ...], depth: int | None = None
) -> tuple[list[tuple[tuple[int, ...], int, int]], bool]:
    """The scored steps of output ``x``: ``[(context prefix, cell, kind)]`` and whether
    ``x`` is impossible under μ.

    Steps follow ``x`` while μ can reach the prefix. At a context where μ stops for sure
    (terminal) the step is the pooled stop check (kind ``_POOL_END`` if ``x`` ends there,
    ``_POOL_CONT`` if it continues, which μ forbids). Scoring stops after the first step
    μ forbids (its conditional beyond is undefined); nothing after it is scored. With
    ``depth`` the walk ends after the step at that position.
    """
    steps = []
    n = len(x)
    for t in range(n + 1 if depth is None else min(n, depth) + 1):
        prefix = x[:t]
        info = mu.info(prefix)
        if info.terminal:
            if t == n:
                steps.append((prefix, mu.END, _POOL_END))
                return steps, False
            steps.append((prefix, mu.cell(x[t]), _POOL_CONT))
            return steps, True
        cell = mu.END if t == n else mu.cell(x[t])
        steps.append((prefix, cell, _NORMAL))
        if info.probs[cell] <= 0.0:
            return steps, True
        if t == n:
            return steps, False
    return steps, False  # stopped at ``depth``


def _kt_prior(probs: np.ndarray) -> tuple[np.ndarray, float]:
    """Dirichlet prior of a context: 1/2 per possible cell, 1/2 spread over impossible ones.

    ``probs`` is ``[K]``; returns ``(a [K], sum(a))``. The OOV cell is always impossible,
    so the impossible set is never empty.
    """
    possible = probs > 0.0  # [K]
    k = int(possible.sum())
    k0 = probs.shape[0] - k
    a = np.where(possible, KT_POSSIBLE_PRIOR, KT_IMPOSSIBLE_TOTAL / k0)  # [K]
    return a, KT_POSSIBLE_PRIOR * k + KT_IMPOSSIBLE_TOTAL


def _log_dm(counts: np.ndarray, a: np.ndarray) -> float:
    """log Dirichlet-multinomial marginal of a count sequence: ``[K]`` counts, ``[K]`` prior.

    Equals the log of the product of the sequential KT predictives
    ``(a_v + n_v) / (A + N)`` over the sequence (in any order).
    """
    n = float(counts.sum())
    A = float(a.sum())
    return float(gammaln(A) - gammaln(A + n) + np.sum(gammaln(a + counts) - gammaln(a)))


# ------------------------------------------------------------ tolerant projection


def ripr_projection(q: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """KL projection of ``q`` onto the tolerant null set ``{p : 0 <= p <= caps, sum p = 1}``.

    ``q`` is ``[K]`` (a distribution), ``caps`` is ``[K]`` with ``sum(caps) >= 1`` and
    ``caps > 0`` wherever ``q > 0``. The minimiser of ``KL(q || p)`` is
    ``p_v = min(caps_v, q_v / λ)`` with λ set so ``sum p = 1`` (water filling).

    Why it matters (reverse information projection, Grünwald–de Heide–Koolen): for a
    convex null set H, ``f = q / p*`` satisfies ``E_P[f] <= 1`` for every ``P`` in H
    (first-order optimality: ``sum_v (P_v - p*_v) q_v / p*_v <= 0``), and it is the
    log-optimal such bet against ``q``. When ``q`` is itself in H, ``p* = q``: no bet.
    """
    q = np.asarray(q, dtype=np.float64)  # [K]
    caps = np.asarray(caps, dtype=np.float64)  # [K]
    if np.all(q <= caps):
        return q.copy()
    K = q.shape[0]
    r = np.divide(q, caps, out=np.full(K, _INF), where=caps > 0.0)  # [K] q_v / caps_v
    r[q <= 0.0] = 0.0
    order = np.argsort(-r, kind="stable")  # [K]
    rs = r[order]  # [K] descending
    sq_next = np.zeros(K)  # [K] sq_next[i] = sum(q[order][i+1:]): mass of the uncapped cells
    sq_next[:-1] = np.cumsum(q[order][:0:-1])[::-1]
    cu = np.cumsum(caps[order])  # [K]
    # g(λ) = sum_v min(caps_v, q_v / λ) is decreasing; at breakpoint λ = rs[i] the first
    # i+1 cells are capped: g = cu[i] + sq_next[i] / rs[i]. Find the first i with g >= 1;
    # then λ lies in [rs[i], rs[i-1]] with the first i cells capped.
    g = cu + np.divide(sq_next, rs, out=np.full(K, _INF), where=rs > 0.0)  # [K]
    hits = g >= 1.0  # [K]
    i = int(np.argmax(hits)) if hits.any() else K - 1
    lam = (sq_next[i - 1] / (1.0 - cu[i - 1])) if i > 0 else 1.0
    positive = q > 0.0  # [K]
    if lam > 0.0:
        with np.errstate(over="ignore"):
            p = np.minimum(caps, q / lam)  # [K]
            if abs(p.sum() - 1.0) > 1e-9:  # rounding at a breakpoint: solve g(λ) = 1 by bisection
                lo, hi = 0.0, float(np.max(r[positive]))
                for _ in range(200):
                    mid = 0.5 * (lo + hi)
                    if mid <= 0.0 or np.minimum(caps, q / mid).sum() > 1.0:
                        lo = mid
                    else:
                        hi = mid
                p = np.minimum(caps, q / hi)
    else:
        p = np.where(positive, caps, 0.0)  # [K]
    # λ -> 0: every cell with q > 0 sits at its cap and they hold less than 1; the rest
    # goes to cells where q = 0 (where it does not change the bet q/p). Rounding
    # shortfalls (subnormal q) go to the cells below their caps: raising p only makes
    # the bet q/p more cautious.
    for room in (np.where(positive, 0.0, caps), caps - p):  # [K] each
        left = 1.0 - p.sum()
        room = np.maximum(room, 0.0)
        if left > 0.0 and room.sum() > 0.0:
            p = p + room * min(1.0, left / room.sum())
    return p


class _Bettor:
    """Tolerant (τ > 0) e-process of one context: bets ``q̂ / p*`` on each event.

    ``q̂`` is the KT predictive of the context's past counts, re-fitted on a geometric
    schedule (after events 1, 2, 4, ... while the context has fewer than
    ``REFRESH_DIVISOR`` events, then each time its count grew by ``1/REFRESH_DIVISOR``).
    Any predictable ``q̂`` is valid; refreshing less often costs a little power and makes
    the cost per event O(1). ``p*`` is the :func:`ripr_projection` of ``q̂`` onto the tolerant
    null set ``{P : P(v) <= min(1, μ(v) + τ)}``.
    """

    __slots__ = ("a", "A", "caps", "counts", "n", "next_refresh", "log_f", "log_e")

    def __init__(self, a: np.ndarray, caps: np.ndarray) -> None:
        self.a = a  # [K] KT prior
        self.A = float(a.sum())
        self.caps = caps  # [K] min(1, μ + τ)
        self.counts = np.zeros(a.shape[0])  # [K]
        self.n = 0
        self.log_e = 0.0  # log of this context's e-process so far
        self._refresh()

    def _refresh(self) -> None:
        q = (self.a + self.counts) / (self.A + self.n)  # [K]
        p = ripr_projection(q, self.caps)  # [K]
        self.log_f = (np.log(q) - np.log(p)).tolist()  # [K] log bet per cell
        n = self.n
        self.next_refresh = 2 * n if 0 < n < REFRESH_DIVISOR else n + max(1, n // REFRESH_DIVISOR)

    def observe(self, cell: int) -> float:
        lf = self.log_f[cell]
        self.log_e += lf
        self.counts[cell] += 1.0
        self.n += 1
        if self.n >= self.next_refresh:
            self._refresh()
        return lf


# ------------------------------------------------------------------ universal tree


class _Tree:
    """Observed outputs, their scored steps, and the universal tree e-process.

    Each context c has its own e-process ``E_c`` (the product of its KT bets). The
    universal e-process is ``½ E_product + ½ E_sparse`` with

    * ``E_product = Π_c E_c`` (the KT tree test; strong when many contexts deviate), and
    * ``E_sparse = Π_c (1 − π_c + π_c E_c)`` with prior weights ``π_c`` summing to at most
      1 over all possible contexts (``½^(d+1) / V^d`` at length d; ``1 / V^d`` when
      restricted to one depth). Each factor is a test martingale that moves only on
      events at c, so the product is one too (for any weights in [0, 1]; their sum only
      bounds the cost). Under μ it loses at most ``Σ -log(1 − π_c)``, about one nat,
      where the product form pays the KT regret (~ (k−1)/2 · log n) in every context. It
      finds deviations confined to a few contexts, which the product form drowns in the
      regret of all the others.

    ``depth`` restricts both to contexts of that length (per-position test).
    """

    def __init__(self, mu: _MuCells, tolerance: float, depth: int | None = None) -> None:
        self.mu = mu
        self.tau = tolerance
        self.depth = depth
        # contexts (every scored prefix)
        self.ctx_id: dict[tuple[int, ...], int] = {}
        self.ctx_prefix: list[tuple[int, ...]] = []
        self.ctx_A: list[float] = []
        self.ctx_a: list[np.ndarray] = []  # [K] each
        self.ctx_log_pi: list[float] = []  # log prior weight in the sparse part
        self.ctx_bettor: list[_Bettor | None] = []
        self.pool_bettor: _Bettor | None = None
        if tolerance > 0.0:
            self.pool_bettor = _Bettor(np.array([0.5, 0.5]), np.array([1.0, tolerance]))
        # (context, cell) pairs the e-process scores
        self.pair_id: dict[tuple[int, int], int] = {}
        self.pair_ctx: list[int] = []
        self.pair_cell: list[int] = []
        self.pair_kind: list[int] = []
        self.pair_a: list[float] = []
        self.pair_logp: list[float] = []
        self.pair_bet: list[tuple[_Bettor, int] | None] = []
        # distinct outputs
        self.out_id: dict[tuple, int] = {}
        self.outputs: list[tuple[int, ...]] = []
        self.out_counts: list[int] = []
        self.out_steps: list[list[tuple[int, int, int]]] = []  # [(ctx id, cell, kind)] (at depth only, if set)
        self.out_log_mu: list[float] = []  # sum of log μ over those steps (= log μ(x) without depth)
        self.out_bets: list[list[tuple[_Bettor, int]]] = []
        self.flat_pair: list[int] = []
        self.flat_out: list[int] = []
        self.n = 0
        self.first_impossible: tuple[int, ...] | None = None

    # -- registration

    def _context(self, prefix: tuple[int, ...]) -> int:
        cid = self.ctx_id.get(prefix)
        if cid is None:
            cid = len(self.ctx_prefix)
            self.ctx_id[prefix] = cid
            self.ctx_prefix.append(prefix)
            info = self.mu.info(prefix)
            a, A = _kt_prior(info.probs)
            self.ctx_a.append(a)
            self.ctx_A.append(A)
            d, logv = len(prefix), math.log(self.mu.V)
            if self.depth is None:
                self.ctx_log_pi.append(math.log1p(-SPARSE_DEPTH_DECAY) + d * (math.log(SPARSE_DEPTH_DECAY) - logv))
            else:
                self.ctx_log_pi.append(-d * logv)
            bettor = None
            if self.tau > 0.0 and not info.terminal:
                bettor = _Bettor(a, np.minimum(1.0, info.probs + self.tau))
            self.ctx_bettor.append(bettor)
        return cid

    def _pair(self, cid: int, cell: int, kind: int) -> int:
        pid = self.pair_id.get((cid, cell))
        if pid is None:
            pid = len(self.pair_ctx)
            self.pair_id[(cid, cell)] = pid
            self.pair_ctx.append(cid)
            self.pair_cell.append(cell)
            self.pair_kind.append(kind)
            self.pair_a.append(float(self.ctx_a[cid][cell]))
            p = self.mu.info(self.ctx_prefix[cid]).probs[cell] if kind == _NORMAL else (1.0 if kind == _POOL_END else 0.0)
            self.pair_logp.append(math.log(p) if p > 0 else -_INF)
            if self.tau > 0.0:
                if kind == _NORMAL:
                    self.pair_bet.append((self.ctx_bettor[cid], cell))  # type: ignore[arg-type]
                else:
                    self.pair_bet.append((self.pool_bettor, 0 if kind == _POOL_END else 1))  # type: ignore[arg-type]
            else:
                self.pair_bet.append(None)
        return pid

    def _register(self, key: tuple, x: tuple[int, ...]) -> int:
        oid = self.out_id.get(x)
        if oid is not None:
            self.out_id[key] = oid
            return oid
        oid = len(self.outputs)
        self.out_id[x] = oid
        self.out_id[key] = oid
        self.outputs.append(x)
        self.out_counts.append(0)
        steps, _ = _walk(self.mu, x, self.depth)
        rec = []
        log_mu = 0.0
        bets = []
        for prefix, cell, kind in steps:
            if self.depth is not None and len(prefix) != self.depth:
                continue
            cid = self._context(prefix)
            rec.append((cid, cell, kind))
            if kind == _NORMAL:
                p = self.mu.info(prefix).probs[cell]
                log_mu += math.log(p) if p > 0 else -_INF
            elif kind == _POOL_CONT:
                log_mu = -_INF
            pid = self._pair(cid, cell, kind)
            self.flat_pair.append(pid)
            self.flat_out.append(oid)
            if self.tau > 0.0:
                bets.append(self.pair_bet[pid])
            forbidden = kind == _POOL_CONT or (kind == _NORMAL and self.mu.info(prefix).probs[cell] <= 0.0)
            if forbidden and self.first_impossible is None:
                self.first_impossible = x
        self.out_steps.append(rec)
        self.out_log_mu.append(log_mu)
        self.out_bets.append(bets)
        return oid

    def _lookup(self, raw: object) -> int:
        try:
            oid = self.out_id.get(raw)  # type: ignore[call-overload]
        except TypeError:  # unhashable (list, array)
            raw = tuple(raw)  # type: ignore[arg-type]
            oid = self.out_id.get(raw)
        if oid is not None:
            return oid
        x = _as_output("output", raw)
        return self._register(raw, x)  # type: ignore[arg-type]

    def add(self, outputs: Iterable[object]) -> None:
        """Add samples in arrival order."""
        if not isinstance(outputs, (list, tuple)):
            outputs = list(outputs)
        if self.tau == 0.0:
            try:
                batch = Counter(outputs)
            except TypeError:  # unhashable items (lists, arrays)
                batch = Counter(tuple(x) for x in outputs)  # type: ignore[arg-type]
            for raw, c in batch.items():
                oid = self._lookup(raw)
                self.out_counts[oid] += c
                self.n += c
            return
        for raw in outputs:
            oid = self._lookup(raw)
            self.out_counts[oid] += 1
            self.n += 1
            for b, c in self.out_bets[oid]:
                b.observe(c)

    def add_counts(self, counts: Mapping[tuple[int, ...], int]) -> None:
        """Add ``counts`` (already validated); under tolerance the events are replayed
        in the mapping's order."""
        if self.tau == 0.0:
            for x, c in counts.items():
                oid = self._lookup(x)
                self.out_counts[oid] += c
                self.n += c
            return
        for x, c in counts.items():
            self.add([x] * c)

    # -- evidence

    def pair_counts(self) -> np.ndarray:
        """Observed count of each (context, cell) pair, ``[P]``."""
        if not self.flat_pair:
            return np.zeros(len(self.pair_ctx))
        w = np.asarray(self.out_counts, dtype=np.float64)[np.asarray(self.flat_out)]  # [F]
        return np.bincount(np.asarray(self.flat_pair), weights=w, minlength=len(self.pair_ctx))  # [P]

    def _context_log_e(self) -> tuple[np.ndarray, float]:
        """(log E_c per context ``[C]``, log of the pooled stop check's e-process)."""
        C = len(self.ctx_prefix)
        if self.tau > 0.0:
            per = np.fromiter((0.0 if b is None else b.log_e for b in self.ctx_bettor), dtype=np.float64, count=C)  # [C]
            return per, (self.pool_bettor.log_e if self.pool_bettor is not None else 0.0)
        if not self.flat_pair:
            return np.zeros(C), 0.0
        pc = self.pair_counts()  # [P]
        kind = np.asarray(self.pair_kind)  # [P]
        # Terminal contexts (μ stops for sure): with τ = 0 the bet there is
        # "END: factor 1, any continuation: factor ∞" (valid as μ never continues).
        pool = _INF if np.any(pc[kind == _POOL_CONT] > 0) else 0.0
        normal = kind == _NORMAL  # [P]
        pn = pc[normal]  # [Pn]
        lp = np.asarray(self.pair_logp)[normal]  # [Pn]
        a = np.asarray(self.pair_a)[normal]  # [Pn]
        with np.errstate(invalid="ignore"):
            # a forbidden cell (log μ = -inf) observed: + inf
            term = gammaln(a + pn) - gammaln(a) - np.where(pn > 0, pn * lp, 0.0)  # [Pn]
        ctx = np.asarray(self.pair_ctx)[normal]  # [Pn]
        per = np.bincount(ctx, weights=term, minlength=C)  # [C]
        nc = np.bincount(ctx, weights=pn, minlength=C)  # [C]
        A = np.asarray(self.ctx_A)  # [C]
        per += np.where(nc > 0, gammaln(A) - gammaln(A + nc), 0.0)
        return per, pool

    def log_e_parts(self) -> tuple[float, float]:
        """(log E_product, log E_sparse); see the class docstring."""
        per, pool = self._context_log_e()  # [C], scalar
        if pool == _INF or np.any(per == _INF):
            return _INF, _INF
        product = float(per.sum()) + pool
        log_pi = np.asarray(self.ctx_log_pi)  # [C]
        with np.errstate(divide="ignore"):
            stay = np.log1p(-np.exp(log_pi))  # [C] log(1 - π_c); -inf when π_c = 1
        sparse = float(np.sum(np.logaddexp(stay, log_pi + per)))
        if self.tau > 0.0:  # pooled stop check: weight 1/2
            sparse += float(np.logaddexp(math.log(0.5), math.log(0.5) + pool))
        return product, sparse

    def log_e(self) -> float:
        """log of the universal tree e-process ``½ E_product + ½ E_sparse``."""
        product, sparse = self.log_e_parts()
        if product == _INF or sparse == _INF:
            return _INF
        return float(np.logaddexp(product, sparse)) - math.log(2.0)

    def context_counts(self) -> dict[int, np.ndarray]:
        """Observed cell counts per scored context (terminal ones included), ``{ctx: [K]}``."""
        pc = self.pair_counts()
        out: dict[int, np.ndarray] = {}
        for pid, c in enumerate(pc.tolist()):
            if c <= 0:
                continue
            cid = self.pair_ctx[pid]
            vec = out.get(cid)
            if vec is None:
                vec = out[cid] = np.zeros(self.mu.K)  # [K]
            vec[self.pair_cell[pid]] += c
        return out

    def n_scored(self) -> int:
        """Samples with a scored step in the e-process (all of them when depth is None)."""
        if self.depth is None:
            return self.n
        seen = np.zeros(len(self.outputs), dtype=bool)
        if self.flat_out:
            seen[np.asarray(self.flat_out)] = True
        return int(np.asarray(self.out_counts)[seen].sum())


def universal_log_e(
    outputs: Iterable[tuple[int, ...]], law: Law | Mapping[tuple[int, ...], float], tolerance: float = 0.0
) -> float:
    """log of the universal tree e-process after ``outputs`` (in this order).

    With ``tolerance == 0`` its product part is
    ``Σ_ctx [log DM(n_ctx; a_ctx) − Σ_v n_ctx,v log μ(v|ctx)]``, a function of the counts
    only; see :class:`SequentialTest` for the construction and its validity.
    """
    tau = _check_tolerance(tolerance)
    law_, _ = _resolve_law(law, None)
    tree = _Tree(_MuCells(law_), tau)
    tree.add(outputs)
    return tree.log_e()


# --------------------------------------------------------------- alternatives


class _Alternative:
    """A catalogued bug law μD (enumerated), with prefix masses for its conditionals."""

    def __init__(self, name: str, probs: dict[tuple[int, ...], float]) -> None:
        self.name = name
        self.probs = probs
        self._mass: dict[tuple[int, ...], float] = defaultdict(float)
        for x, p in probs.items():
            for t in range(len(x) + 1):
                self._mass[x[:t]] += p
        self._children: dict[tuple[int, ...], dict[int, float]] = defaultdict(dict)
        for prefix, m in self._mass.items():
            if prefix:
                self._children[prefix[:-1]][prefix[-1]] = m

    def log_prob(self, x: tuple[int, ...]) -> float:
        p = self.probs.get(x, 0.0)
        return math.log(p) if p > 0 else -_INF

    def cell_conditional(self, prefix: tuple[int, ...], V: int) -> np.ndarray | None:
        """μD(cell | prefix) over ``V + 2`` cells ``[K]``; None if μD never reaches prefix."""
        m = self._mass.get(prefix, 0.0)
        if m <= 0.0:
            return None
        q = np.zeros(V + 2)  # [K]
        for tok, cm in self._children.get(prefix, {}).items():
            q[tok if 0 <= tok < V else V] += cm
        q[V + 1] = self.probs.get(prefix, 0.0)
        return q / m

    def cell_path_masses(self, mu: _MuCells) -> dict[tuple[int, ...], float]:
        """μD coarsened to cell paths (every out-of-vocabulary id -> the OOV cell)."""
        out: dict[tuple[int, ...], float] = defaultdict(float)
        for x, p in self.probs.items():
            out[_cell_path(mu, x)] += p
        return dict(out)


def _cell_path(mu: _MuCells, x: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(mu.cell(t) for t in x) + (mu.END,)


def _power_terms(log_mu, mu_d: Mapping[tuple[int, ...], float]) -> tuple[float, float, float]:
    """(KL(μD||μ), drift on μ's support Σ_{μ>0} μD log(μD/μ), ε = μD mass where μ = 0)."""
    drift_terms = []
    eps_terms = []
    for x, p in mu_d.items():
        if p <= 0:
            continue
        lm = log_mu(x)
        if lm == -_INF:
            eps_terms.append(p)
        else:
            drift_terms.append(p * (math.log(p) - lm))
    eps = math.fsum(eps_terms)
    drift = math.fsum(drift_terms)
    kl = _INF if eps > 0 else max(drift, 0.0)
    return kl, drift, eps


def _optimal_from_terms(drift: float, eps: float, alpha: float) -> float:
    n_kl = math.log(1.0 / alpha) / drift if drift > 0 else _INF
    n_imp = 1.0 / eps if eps > 0 else _INF
    return min(n_kl, n_imp)


def kl_divergence(p: Mapping[tuple[int, ...], float], q: Mapping[tuple[int, ...], float]) -> float:
    """``KL(p || q) = Σ_x p(x) log(p(x)/q(x))`` in nats; ``+inf`` when ``p`` has mass where ``q`` has none."""
    pp = _check_distribution("p", p, allow_oov=True)
    qq = _check_distribution("q", q, allow_oov=True)
    terms = []
    for x, px in pp.items():
        qx = qq.get(x, 0.0)
        if qx <= 0.0:
            return _INF
        terms.append(px * (math.log(px) - math.log(qx)))
    return max(math.fsum(terms), 0.0)


def optimal_sample_count(
    mu: Mapping[tuple[int, ...], float] | Law, mu_d: Mapping[tuple[int, ...], float], alpha: float
) -> float:
    """About how many samples from μD a level-α sequential test needs to reject μ.

    * When μD lives on μ's support: ``ln(1/α) / KL(μD || μ)`` (Wald: the log likelihood
      ratio drifts up by KL per sample and rejects at ``ln(1/α)``); ``inf`` if KL = 0.
    * When μD puts mass ε on outputs μ forbids, one such output rejects at once, and the
      expected wait for it is ``1/ε``. Before it, the samples on μ's support drift by
      ``D = Σ_{μ(x)>0} μD(x) log(μD(x)/μ(x))`` per sample (this is
      ``(1-ε)(KL(μD₊||μ) + log(1-ε))`` with μD₊ μD given μ's support, and may be <= 0),
      giving ``ln(1/α)/D`` samples when ``D > 0``. The result is the smaller of the two.

    ``mu`` may be enumerated or a :class:`Law` (then ``μ(x)`` comes from its conditionals).
    """
    a = _check_alpha(alpha)
    md = _check_distribution("mu_d", mu_d, allow_oov=True)
    if isinstance(mu, Mapping) and not isinstance(mu, EnumeratedLaw):
        mm = _check_distribution("mu", mu, allow_oov=False)

        def log_mu(x):
            p = mm.get(x, 0.0)
            return math.log(p) if p > 0 else -_INF
    else:
        law, _ = _resolve_law(mu, None)
        log_mu = _MuCells(law).log_prob
    _, drift, eps = _power_terms(log_mu, md)
    return _optimal_from_terms(drift, eps, a)


# ------------------------------------------------------------------------ reports


@dataclass(frozen=True)
class TokenDeviation:
    """Where the counts disagree with μ: the context with the most evidence against μ
    (largest per-context e-value) and, in it, the cell whose observed conditional
    frequency is furthest from μ's.

    ``token`` is a token id, ``"<oov>"`` (any id outside the vocabulary) or ``"<end>"``
    (the output stopped). ``observed``/``expected`` are conditional probabilities at
    ``context``: ``count / context_count`` and μ(token | context).
    """

    context: tuple[int, ...]
    token: int | str
    count: int
    context_count: int
    observed: float
    expected: float

    def to_dict(self) -> dict:
        return {
            "context": list(self.context),
            "token": self.token,
            "count": self.count,
            "context_count": self.context_count,
            "observed": self.observed,
            "expected": self.expected,
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> "TokenDeviation":
        return cls(tuple(d["context"]), d["token"], int(d["count"]), int(d["context_count"]), float(d["observed"]), float(d["expected"]))


def _enc(v: float | None) -> float | str | None:
    if v is None or math.isfinite(v):
        return v
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


def _dec(v: object) -> float | None:
    if v is None:
        return None
    return float(v)  # float("inf") / float("-inf") / float("nan") parse the strings


@dataclass(frozen=True)
class Verdict:
    """Outcome of one case's statistical test.

    ``status``:
      * ``"fail"``: ``log_e >= threshold = log(1/α)``. Anytime-valid: under μ this happens
        with probability <= α however often the case was looked at.
      * ``"pass"``: not failed, and either ``n >= n_planned`` (the planned budget was
        spent without evidence against μ; a statement about power, not a proof), or every
        catalogued bug law is refuted (``log LR_j <= -threshold`` for each; ``1/LR_j`` is
        an e-process under μD_j, so each refutation is itself a level-α test).
      * ``"undecided"``: neither.

    ``log_e_components`` holds ``"universal"`` (tree e-process) and each alternative's
    log likelihood ratio; ``log_e`` is their mixture (weights in :class:`SequentialTest`).
    ``universal_parts`` splits the universal e-process into its ``"product"`` (KT over
    every context) and ``"sparse"`` (few deviating contexts) halves.
    ``p_value_classic`` (method in ``p_value_method``), ``worst_token``, ``tv_distance``
    and ``optimal_samples`` (ln(1/α)/KL per alternative, see
    :func:`optimal_sample_count`) are information for humans, not the decision.
    """

    status: str
    n: int
    alpha: float
    tolerance: float
    log_e: float
    log_e_components: dict[str, float]
    threshold: float
    p_value_classic: float | None
    p_value_method: str | None
    worst_token: TokenDeviation | None
    tv_distance: float | None
    evidence: str
    n_planned: int | None = None
    optimal_samples: dict[str, float] | None = None
    excluded_alternatives: tuple[str, ...] = ()
    impossible_example: tuple[int, ...] | None = None
    position: int | None = None
    universal_parts: dict[str, float] | None = None

    @property
    def decided(self) -> bool:
        return self.status != "undecided"

    @property
    def e_value(self) -> float:
        return math.exp(self.log_e) if self.log_e < 700 else _INF

    def to_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": "verdict",
            "status": self.status,
            "n": self.n,
            "alpha": self.alpha,
            "tolerance": self.tolerance,
            "log_e": _enc(self.log_e),
            "log_e_components": {k: _enc(v) for k, v in self.log_e_components.items()},
            "threshold": self.threshold,
            "p_value_classic": _enc(self.p_value_classic),
            "p_value_method": self.p_value_method,
            "worst_token": None if self.worst_token is None else self.worst_token.to_dict(),
            "tv_distance": _enc(self.tv_distance),
            "evidence": self.evidence,
            "n_planned": self.n_planned,
            "optimal_samples": None if self.optimal_samples is None else {k: _enc(v) for k, v in self.optimal_samples.items()},
            "excluded_alternatives": list(self.excluded_alternatives),
            "impossible_example": None if self.impossible_example is None else list(self.impossible_example),
            "position": self.position,
            "universal_parts": None if self.universal_parts is None else {k: _enc(v) for k, v in self.universal_parts.items()},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | Mapping) -> "Verdict":
        d = json.loads(text) if isinstance(text, str) else dict(text)
        if d.get("schema_version") != SCHEMA_VERSION or d.get("kind") != "verdict":
            raise InvalidInput("verdict schema", (d.get("kind"), d.get("schema_version")), f"('verdict', {SCHEMA_VERSION})")
        return cls(
            status=d["status"],
            n=int(d["n"]),
            alpha=float(d["alpha"]),
            tolerance=float(d["tolerance"]),
            log_e=_dec(d["log_e"]),  # type: ignore[arg-type]
            log_e_components={k: _dec(v) for k, v in d["log_e_components"].items()},  # type: ignore[misc]
            threshold=float(d["threshold"]),
            p_value_classic=_dec(d["p_value_classic"]),
            p_value_method=d["p_value_method"],
            worst_token=None if d["worst_token"] is None else TokenDeviation.from_dict(d["worst_token"]),
            tv_distance=_dec(d["tv_distance"]),
            evidence=d["evidence"],
            n_planned=d["n_planned"],
            optimal_samples=None if d["optimal_samples"] is None else {k: _dec(v) for k, v in d["optimal_samples"].items()},  # type: ignore[misc]
            excluded_alternatives=tuple(d["excluded_alternatives"]),
            impossible_example=None if d["impossible_example"] is None else tuple(d["impossible_example"]),
            position=d.get("position"),
            universal_parts=None if d.get("universal_parts") is None else {k: _dec(v) for k, v in d["universal_parts"].items()},  # type: ignore[misc]
        )


def _fmt_exp(log_x: float) -> str:
    """Format ``exp(log_x)`` compactly: ``812``, ``0.41``, ``3.2e7``, ``1e3``, ``inf``."""
    if math.isnan(log_x):
        return "nan"
    if log_x == _INF:
        return "inf"
    if log_x == -_INF:
        return "0"
    l10 = log_x / math.log(10.0)
    if -3.0 <= l10 < 3.0 - 1e-12:
        return f"{math.exp(log_x):.3g}"
    e = math.floor(l10 + 1e-12)
    m = f"{10 ** (l10 - e):.2g}"
    if m == "10":
        e, m = e + 1, "1"
    return f"{m}e{e}"


def _pooled_g(observed: np.ndarray, expected: np.ndarray) -> tuple[float, int]:
    """G statistic and degrees of freedom after pooling cells of small expected count.

    ``observed``/``expected`` are ``[K]`` counts. A count where μ expects nothing gives
    ``G = inf``. Cells with expected count below ``MIN_EXPECTED_COUNT`` are pooled into
    one; if that pool is still below it, it joins the smallest other group.
    """
    if np.any((observed > 0) & (expected <= 0)):
        return _INF, 0
    live = expected > 0
    o, e = observed[live], expected[live]
    big = e >= MIN_EXPECTED_COUNT
    go, ge = list(o[big]), list(e[big])
    if np.any(~big):
        so, se = float(o[~big].sum()), float(e[~big].sum())
        if se < MIN_EXPECTED_COUNT and ge:
            j = int(np.argmin(ge))
            go[j] += so
            ge[j] += se
        else:
            go.append(so)
            ge.append(se)
    if len(go) < 2:
        return 0.0, 0
    oa, ea = np.asarray(go), np.asarray(ge)
    with np.errstate(divide="ignore", invalid="ignore"):
        g = 2.0 * float(np.sum(np.where(oa > 0, oa * np.log(oa / ea), 0.0)))
    return max(g, 0.0), len(go) - 1


def _p_from_g(g: float, df: int) -> float:
    if g == _INF:
        return 0.0
    if df <= 0:
        return 1.0
    return float(chi2.sf(g, df))


def _cell_label(mu: _MuCells, cell: int) -> int | str:
    if cell == mu.OOV:
        return OOV_LABEL
    if cell == mu.END:
        return END_LABEL
    return int(cell)


def _worst_token(tree: _Tree) -> TokenDeviation | None:
    """Where the evidence is: the context whose own e-process ``E_c`` is largest (a
    continuation where μ stops counts as the pooled stop check's), and in it the cell
    with the largest ``|observed − expected|`` conditional frequency."""
    per, pool = tree._context_log_e()  # [C], scalar
    best: tuple[float, float, int] | None = None  # (score, context count, ctx id)
    counts = tree.context_counts()
    for cid, obs in counts.items():
        info = tree.mu.info(tree.ctx_prefix[cid])
        n = float(obs.sum())
        if info.terminal:
            score = pool if obs[: tree.mu.END].sum() > 0 else -_INF
        else:
            score = float(per[cid])
        key = (score, n, -cid)
        if best is None or key > best:
            best = key
    if best is None:
        return None
    cid = -best[2]
    prefix = tree.ctx_prefix[cid]
    obs = counts[cid]  # [K]
    probs = tree.mu.info(prefix).probs  # [K]
    n = float(obs.sum())
    v = int(np.argmax(np.abs(obs / n - probs)))
    return TokenDeviation(prefix, _cell_label(tree.mu, v), int(obs[v]), int(n), float(obs[v] / n), float(probs[v]))


def _tree_g(tree: _Tree) -> tuple[float, int]:
    g_total, df_total = 0.0, 0
    for cid, obs in tree.context_counts().items():
        probs = tree.mu.info(tree.ctx_prefix[cid]).probs
        g, df = _pooled_g(obs, float(obs.sum()) * probs)
        if g == _INF:
            return _INF, 0
        g_total += g
        df_total += df
    return g_total, df_total


def _enumerated_g(tree: _Tree, enumerated: Mapping[tuple[int, ...], float]) -> tuple[float, int]:
    n = tree.n
    support = list(enumerated)
    idx = {x: i for i, x in enumerate(support)}
    obs = np.zeros(len(support) + 1)  # [M+1]; last cell: outputs μ forbids
    for x, c in zip(tree.outputs, tree.out_counts):
        obs[idx.get(x, len(support))] += c
    exp = np.append(n * np.fromiter((enumerated[x] for x in support), dtype=np.float64, count=len(support)), 0.0)  # [M+1]
    return _pooled_g(obs, exp)


def _tv(tree: _Tree, enumerated: Mapping[tuple[int, ...], float]) -> float | None:
    n = tree.n
    if n == 0:
        return None
    terms = []
    seen_mass = []
    for x, c in zip(tree.outputs, tree.out_counts):
        p = enumerated.get(x, 0.0)
        seen_mass.append(p)
        terms.append(abs(c / n - p))
    return 0.5 * (math.fsum(terms) + max(0.0, 1.0 - math.fsum(seen_mass)))


def _status_and_evidence(
    *,
    log_e: float,
    threshold: float,
    n: int,
    n_planned: int | None,
    tolerance: float,
    lr: dict[str, float],
    universal: float,
    impossible: tuple[int, ...] | None,
    what: str = "samples",
) -> tuple[str, str]:
    inv_alpha = _fmt_exp(threshold)
    tail = f"anytime-valid; tolerance {tolerance:g}"
    if log_e >= threshold:
        comps = {"universal": universal, **lr}
        driver = max(comps, key=lambda k: comps[k])
        drv = "the universal tree test" if driver == "universal" else f"bug class {driver}"
        if log_e == _INF and impossible is not None and comps["universal"] == _INF:
            return "fail", (
                f"e-value inf ≥ 1/α = {inv_alpha} after {n} {what}: output {impossible} is impossible under μ ({tail})"
            )
        return "fail", f"e-value {_fmt_exp(log_e)} ≥ 1/α = {inv_alpha} after {n} {what}, driven by {drv} ({tail})"
    if n_planned is not None and n >= n_planned:
        return "pass", (
            f"e-value {_fmt_exp(log_e)} < 1/α = {inv_alpha} after {n} of {n_planned} planned {what}: no evidence against μ ({tail})"
        )
    if lr and all(v <= -threshold for v in lr.values()):
        worst = max(lr.values())
        return "pass", (
            f"e-value {_fmt_exp(log_e)} < 1/α = {inv_alpha} after {n} {what}, and every catalogued bug law "
            f"({', '.join(sorted(lr))}) is refuted with likelihood ratio ≤ {_fmt_exp(worst)} ≤ α ({tail})"
        )
    return "undecided", f"e-value {_fmt_exp(log_e)} < 1/α = {inv_alpha} after {n} {what}; undecided ({tail})"


# -------------------------------------------------------------------- the test


class SequentialTest:
    """Anytime-valid test of "the engine samples from μ" for one case.

    Construction of the evidence (``log_e``):

    **Universal tree e-process.** For each sample and each position ``t`` of its output,
    with context ``c = x_<t`` (the output prefix), bet the factor
    ``q̂_c(x_t) / μ'(x_t | c)`` where ``q̂_c`` is the KT predictive of the past counts at
    ``c``: ``q̂_c(v) = (a_v + n_c,v) / (A_c + N_c)`` with Dirichlet prior ``a_v = 1/2`` for
    cells μ allows at ``c`` and a total of ``1/2`` spread evenly over the cells μ forbids
    (tokens with μ = 0, the lumped out-of-vocabulary cell, and stopping too early). Under
    μ, ``E[q̂(X)/μ(X)] = Σ_{μ(v)>0} q̂(v) <= 1``, so the running product is a test
    supermartingale; a forbidden cell gives factor ``q̂/0 = ∞``. With tolerance 0 the
    product over a context's events is the Dirichlet-multinomial marginal, so
    ``log E = Σ_c [log DM(n_c; a_c) − Σ_v n_c,v log μ(v|c)]`` is computed from counts.
    A context where μ stops for sure (stop token, max length) has no further position; an
    output continuing there is impossible and gives ``∞``; an output ending there costs
    nothing. Scoring of a sample stops at its first forbidden step.

    The product pays the KT regret (about ``(k−1)/2 · log n_c``) in *every* context, so a
    deviation confined to a few contexts of a large tree can stay invisible for tens of
    thousands of samples. ``E_universal = ½ Π_c E_c + ½ Π_c (1 − π_c + π_c E_c)`` therefore
    adds a sparse part with prior weights ``π_c = ½^(d+1)/V^d`` (d = context length;
    ``Σ π_c <= 1``), which costs at most about one nat under μ and bets on single
    contexts; see ``Verdict.universal_parts``. Both parts are test supermartingales
    (each context's factor moves only at its own events), so their average is one.

    **Tolerance τ > 0** (numeric noise; SPEC §5): the null becomes every P with
    ``P(v|c) <= μ'(v|c) = min(1, μ(v|c) + τ)`` at every context. The plain bet
    ``q̂/μ'`` stays valid (``E_P[q̂/μ'] = Σ P q̂/μ' <= Σ q̂ = 1``) but, as ``Σ μ' > 1``, it
    cannot see deviations of a few τ. We bet ``q̂ / p*`` instead, with ``p*`` the
    :func:`ripr_projection` of ``q̂`` onto the tolerant null set, which is valid for every
    such P and never smaller than ``q̂/μ'``; terminal contexts share one pooled bet on
    "stop vs continue" (``P(continue) <= τ``). These factors depend on arrival order, so
    under tolerance samples are processed one by one.

    **Catalogued alternatives.** ``log LR_j = Σ_x n_x [log μD_j(x) − log μ'(x)]``; with
    τ = 0, ``μ'(x) = μ(x)`` (``+inf`` when μ forbids an observed x that μD_j allows;
    ``-inf``, "refuted", when μD_j forbids an observed x). With τ > 0 each step's
    denominator is the projection of μD_j's own conditional onto the tolerant null set
    (again valid and never weaker than ``Π min(1, μ + τ)``). Each is a test martingale
    under μ; alternatives identical to μ (KL = 0) are excluded.

    **Mixture.** ``log_e = logsumexp(log ½ + log E_universal, log(½/J) + log LR_j ...)``
    (weight 1 on the universal part when there are no alternatives). Reject when
    ``log_e >= log(1/α)``.

    Memory is O(distinct outputs + contexts); μ's conditionals are cached per context.
    """

    def __init__(
        self,
        law: Law | Mapping[tuple[int, ...], float],
        alternatives: Mapping[str, Mapping[tuple[int, ...], float]] | None = None,
        alpha: float = 1e-3,
        tolerance: float = 0.0,
        *,
        enumerated: Mapping[tuple[int, ...], float] | None = None,
        vocab_size: int | None = None,
    ) -> None:
        self.alpha = _check_alpha(alpha)
        self.tolerance = _check_tolerance(tolerance)
        self.threshold = math.log(1.0 / self.alpha)
        law_, enum = _resolve_law(law, vocab_size)
        if enumerated is not None:
            enum = _check_distribution("enumerated", enumerated, allow_oov=False)
        self._enumerated = enum
        self._mu = _MuCells(law_)
        self._tree = _Tree(self._mu, self.tolerance)
        alts = _check_alternatives(alternatives)
        self._alts: list[_Alternative] = []
        self._excluded: list[str] = []
        self._optimal: dict[str, float] = {}
        self._kl: dict[str, float] = {}
        for name, probs in alts.items():
            kl, drift, eps = _power_terms(self._mu.log_prob, probs)
            if kl <= IDENTICAL_KL:
                self._excluded.append(name)
                continue
            self._alts.append(_Alternative(name, probs))
            self._kl[name] = kl
            self._optimal[name] = _optimal_from_terms(drift, eps, self.alpha)
        self._lr_rows: list[np.ndarray] = []  # [J] per distinct output: log LR_j per copy
        self._den_cache: dict[tuple[int, int, int], np.ndarray] = {}
        self._cached: tuple[int, float, dict[str, float]] | None = None

    # -- data

    def update(self, outputs: Iterable[tuple[int, ...]]) -> None:
        """Add samples (complete outputs, in arrival order)."""
        self._tree.add(outputs)

    def update_counts(self, counts: Mapping[tuple[int, ...], int]) -> None:
        """Add samples given as counts (under tolerance replayed in the mapping's order)."""
        self._tree.add_counts(_check_counts(counts))

    @property
    def n(self) -> int:
        return self._tree.n

    @property
    def counts(self) -> dict[tuple[int, ...], int]:
        return {x: c for x, c in zip(self._tree.outputs, self._tree.out_counts) if c > 0}

    @property
    def alternatives(self) -> tuple[str, ...]:
        """Names of the alternatives in use (identical-to-μ ones excluded)."""
        return tuple(a.name for a in self._alts)

    @property
    def excluded_alternatives(self) -> tuple[str, ...]:
        return tuple(self._excluded)

    @property
    def kl_divergences(self) -> dict[str, float]:
        """KL(μD_j || μ) in nats per alternative in use (``inf`` if μD_j reaches outputs μ forbids)."""
        return dict(self._kl)

    @property
    def optimal_samples(self) -> dict[str, float]:
        """ln(1/α)/KL(μD_j||μ) per alternative (see :func:`optimal_sample_count`)."""
        return dict(self._optimal)

    # -- evidence

    def _denominator(self, j: int, cid: int, cell: int, kind: int) -> float:
        """log p*_j(cell | context) under tolerance (projection of μD_j's conditional)."""
        key = (j, cid, 0 if kind == _NORMAL else 1)
        logp = self._den_cache.get(key)
        if logp is None:
            prefix = self._tree.ctx_prefix[cid]
            q = self._alts[j].cell_conditional(prefix, self._mu.V)  # [K]
            assert q is not None  # the output has μD_j-mass, so its prefixes do
            tau = self.tolerance
            if kind == _NORMAL:
                caps = np.minimum(1.0, self._mu.info(prefix).probs + tau)  # [K]
                qq = q
            else:
                stop = float(q[self._mu.END])
                qq = np.array([stop, 1.0 - stop])  # [2] (END, continue)
                caps = np.array([1.0, tau])
            with np.errstate(divide="ignore"):
                logp = np.log(ripr_projection(qq, caps))
            self._den_cache[key] = logp
        if kind == _NORMAL:
            return float(logp[cell])
        return float(logp[0 if kind == _POOL_END else 1])

    def _lr_row(self, oid: int) -> np.ndarray:
        x = self._tree.outputs[oid]
        row = np.empty(len(self._alts))  # [J]
        for j, alt in enumerate(self._alts):
            lp = alt.log_prob(x)
            if lp == -_INF:
                row[j] = -_INF
            elif self.tolerance == 0.0:
                den = self._tree.out_log_mu[oid]
                row[j] = _INF if den == -_INF else lp - den
            else:
                den = math.fsum(self._denominator(j, cid, cell, kind) for cid, cell, kind in self._tree.out_steps[oid])
                row[j] = lp - den
        return row

    def _log_lr(self) -> dict[str, float]:
        if not self._alts:
            return {}
        tree = self._tree
        while len(self._lr_rows) < len(tree.outputs):
            self._lr_rows.append(self._lr_row(len(self._lr_rows)))
        if not self._lr_rows:
            return {a.name: 0.0 for a in self._alts}
        U = np.vstack(self._lr_rows)  # [M, J]
        n = np.asarray(tree.out_counts, dtype=np.float64)[:, None]  # [M, 1]
        live = n > 0  # [M, 1]
        refuted = np.any(np.isneginf(U) & live, axis=0)  # [J]
        with np.errstate(invalid="ignore"):
            total = np.sum(np.where(live & ~np.isneginf(U), n * U, 0.0), axis=0)  # [J]
        total = np.where(refuted, -_INF, total)
        return {a.name: float(v) for a, v in zip(self._alts, total)}

    def _evaluate(self) -> tuple[float, dict[str, float]]:
        key = self._tree.n
        if self._cached is not None and self._cached[0] == key:
            return self._cached[1], dict(self._cached[2])
        uni = self._tree.log_e()
        lr = self._log_lr()
        comps = {"universal": uni, **lr}
        if lr:
            logs = [math.log(0.5) + uni] + [math.log(0.5 / len(lr)) + v for v in lr.values()]
        else:
            logs = [uni]
        if any(v == _INF for v in logs):
            total = _INF
        else:
            total = float(logsumexp(np.asarray(logs)))
        self._cached = (key, total, comps)
        return total, dict(comps)

    @property
    def log_e(self) -> float:
        """log of the mixture e-process (anytime-valid under μ)."""
        return self._evaluate()[0]

    @property
    def universal_parts(self) -> dict[str, float]:
        """``{"product": log E_product, "sparse": log E_sparse}`` of the universal part."""
        return dict(zip(("product", "sparse"), self._tree.log_e_parts()))

    @property
    def log_e_components(self) -> dict[str, float]:
        """``{"universal": log E_universal, name: log LR_name, ...}``."""
        return self._evaluate()[1]

    def verdict(self, n_planned: int | None = None) -> Verdict:
        """The verdict now; ``n_planned`` is the planned sample budget (see :class:`Verdict`)."""
        if n_planned is not None and (not _is_int(n_planned) or int(n_planned) < 0):
            raise InvalidInput("n_planned", n_planned, "None or an integer >= 0")
        log_e, comps = self._evaluate()
        lr = {k: v for k, v in comps.items() if k != "universal"}
        tree = self._tree
        status, evidence = _status_and_evidence(
            log_e=log_e,
            threshold=self.threshold,
            n=tree.n,
            n_planned=None if n_planned is None else int(n_planned),
            tolerance=self.tolerance,
            lr=lr,
            universal=comps["universal"],
            impossible=tree.first_impossible,
        )
        if tree.n == 0:
            p, method, tv = None, None, None
        elif self._enumerated is not None:
            p, method = _p_from_g(*_enumerated_g(tree, self._enumerated)), "G-test over enumerated outputs (fixed n)"
            tv = _tv(tree, self._enumerated)
        else:
            p, method, tv = _p_from_g(*_tree_g(tree)), "G-test summed over tree conditionals (fixed n)", None
        return Verdict(
            status=status,
            n=tree.n,
            alpha=self.alpha,
            tolerance=self.tolerance,
            log_e=log_e,
            log_e_components=comps,
            threshold=self.threshold,
            p_value_classic=p,
            p_value_method=method,
            worst_token=_worst_token(tree),
            tv_distance=tv,
            evidence=evidence,
            n_planned=None if n_planned is None else int(n_planned),
            optimal_samples=dict(self._optimal),
            excluded_alternatives=tuple(self._excluded),
            impossible_example=tree.first_impossible,
            universal_parts=dict(zip(("product", "sparse"), tree.log_e_parts())),
        )


# -------------------------------------------------------------- per position


def position_test(
    outputs: Iterable[tuple[int, ...]],
    law: Law | Mapping[tuple[int, ...], float],
    position: int,
    alpha: float,
    tolerance: float = 0.0,
    *,
    n_planned: int | None = None,
) -> Verdict:
    """Test μ's exact next-token conditionals at one position (0-based).

    The universal tree e-process restricted to the contexts of length ``position``: each
    output that reaches that depth contributes its token there (or ``END``, or a
    continuation where μ stops), grouped by its prefix, compared with μ(· | prefix). The
    sparse part's prior weight is ``1/V^position`` per context.
    Needs no enumeration of μ, so it scales to long outputs and large vocabularies. The
    verdict's ``n`` counts the outputs that reached the position; ``p_value_classic`` is
    the G-test summed over that depth's contexts.
    """
    a = _check_alpha(alpha)
    tau = _check_tolerance(tolerance)
    if not _is_int(position) or int(position) < 0:
        raise InvalidInput("position", position, "an integer >= 0")
    if n_planned is not None and (not _is_int(n_planned) or int(n_planned) < 0):
        raise InvalidInput("n_planned", n_planned, "None or an integer >= 0")
    law_, _ = _resolve_law(law, None)
    tree = _Tree(_MuCells(law_), tau, depth=int(position))
    tree.add(outputs)
    log_e = tree.log_e()
    threshold = math.log(1.0 / a)
    n = tree.n_scored()
    status, evidence = _status_and_evidence(
        log_e=log_e,
        threshold=threshold,
        n=n,
        n_planned=n_planned,
        tolerance=tau,
        lr={},
        universal=log_e,
        impossible=tree.first_impossible,
        what=f"outputs reaching position {int(position)}",
    )
    return Verdict(
        status=status,
        n=n,
        alpha=a,
        tolerance=tau,
        log_e=log_e,
        log_e_components={"universal": log_e},
        threshold=threshold,
        p_value_classic=_p_from_g(*_tree_g(tree)) if n else None,
        p_value_method="G-test summed over the position's contexts (fixed n)" if n else None,
        worst_token=_worst_token(tree),
        tv_distance=None,
        evidence=evidence,
        n_planned=n_planned,
        optimal_samples=None,
        impossible_example=tree.first_impossible,
        position=int(position),
        universal_parts=dict(zip(("product", "sparse"), tree.log_e_parts())),
    )


# ---------------------------------------------------------------- alpha spending


class AlphaSpender:
    """Spreads a campaign's false-alarm budget over its cases.

    The i-th call of :meth:`next` (i = 1, 2, ...) returns ``α_i = alpha_total / (i(i+1))``,
    so after k cases ``Σ α_i = alpha_total · k/(k+1) < alpha_total``: with each case
    tested at its α_i (anytime-valid), the probability that any case of the campaign
    raises a false alarm is below ``alpha_total``. The state (``count``) serialises, so a
    resumed campaign continues the same sequence.
    """

    def __init__(self, alpha_total: float, count: int = 0) -> None:
        self.alpha_total = _check_alpha(alpha_total, "alpha_total")
        if not _is_int(count) or int(count) < 0:
            raise InvalidInput("count", count, "an integer >= 0")
        self.count = int(count)

    def peek(self) -> float:
        """The α the next case would get."""
        i = self.count + 1
        return self.alpha_total / (i * (i + 1))

    def next(self) -> float:
        a = self.peek()
        self.count += 1
        return a

    @property
    def spent(self) -> float:
        """``Σ α_i`` handed out so far (= alpha_total · count/(count+1))."""
        return self.alpha_total * self.count / (self.count + 1)

    @property
    def remaining(self) -> float:
        return self.alpha_total - self.spent

    def to_json(self) -> str:
        return json.dumps(
            {"schema_version": SCHEMA_VERSION, "kind": "alpha_spender", "alpha_total": self.alpha_total, "count": self.count},
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | Mapping) -> "AlphaSpender":
        d = json.loads(text) if isinstance(text, str) else dict(text)
        if d.get("schema_version") != SCHEMA_VERSION or d.get("kind") != "alpha_spender":
            raise InvalidInput("alpha spender schema", (d.get("kind"), d.get("schema_version")), f"('alpha_spender', {SCHEMA_VERSION})")
        return cls(d["alpha_total"], d["count"])


# ---------------------------------------------------------------- attribution


@dataclass(frozen=True)
class Attribution:
    """Which catalogued bug class explains the counts (SPEC §5), or ``"unknown"``.

    Rule: among the classes that are neither excluded (identical to μ) nor refuted (an
    observed output they forbid), take the one with the highest likelihood, ``best``.
    It becomes the ``label`` only if

    (a) its likelihood ratio against μ is at least ``1/α`` (``log_lr[best] >= threshold``,
        α = 1e-3 by default): the data clearly are not from μ and fit the class; and
    (b) its log likelihood is within ``log 100`` of the best explanation among the
        universal alternative and all classes
        (``log_likelihood[best] >= log_likelihood["universal"] - log 100``): a flexible
        model that knows no bug does not explain the data much better.

    Otherwise the label is ``"unknown"``. ``log_likelihood`` is over outputs coarsened to
    cells (every out-of-vocabulary id counts as one symbol), the same for every model, so
    the comparison is fair; ``"universal"`` is the marginal likelihood of the model behind
    the universal e-process (see :func:`_universal_log_likelihood`) and ``"mu"`` is μ's.
    ``ambiguous_with`` lists other classes within ``log 100`` of ``best``.
    """

    label: str
    best: str | None
    log_lr: dict[str, float]
    log_likelihood: dict[str, float]
    threshold: float
    n: int
    refuted: tuple[str, ...]
    excluded: tuple[str, ...]
    ambiguous_with: tuple[str, ...]
    reason: str

    def to_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": "attribution",
            "label": self.label,
            "best": self.best,
            "log_lr": {k: _enc(v) for k, v in self.log_lr.items()},
            "log_likelihood": {k: _enc(v) for k, v in self.log_likelihood.items()},
            "threshold": self.threshold,
            "n": self.n,
            "refuted": list(self.refuted),
            "excluded": list(self.excluded),
            "ambiguous_with": list(self.ambiguous_with),
            "reason": self.reason,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


def _universal_log_likelihood(mu: _MuCells, counts: Mapping[tuple[int, ...], int]) -> float:
    """Marginal log likelihood of the cell-coarsened outputs under the universal model.

    The model mirrors the universal e-process: ``½ product + ½ sparse``, where per μ
    context the product part uses the KT mixture and the sparse part uses
    ``(1 − π_c) · μ + π_c · KT`` (chosen once per context); μ's stop points share one KT
    stop-vs-continue check, and contexts after a step μ forbids use a plain KT (μ says
    nothing there) in both parts.
    """
    K = mu.K
    mu_ctx: dict[tuple[int, ...], np.ndarray] = {}
    free_ctx: dict[tuple[int, ...], np.ndarray] = {}
    cont_ctx: dict[tuple[int, ...], np.ndarray] = {}
    pool = np.zeros(2)  # [2] (END, continue) at μ's stop points
    for x, n in counts.items():
        cp = _cell_path(mu, x)
        reachable = True
        for t, cell in enumerate(cp):
            prefix = cp[:t]
            if reachable:
                info = mu.info(x[:t])
                if info.terminal:
                    if cell == mu.END:
                        pool[0] += n
                        break
                    pool[1] += n
                    cont_ctx.setdefault(prefix, np.zeros(K - 1))[cell] += n  # [K-1] tokens + OOV
                    reachable = False
                    continue
                mu_ctx.setdefault(prefix, np.zeros(K))[cell] += n
                if info.probs[cell] <= 0.0:
                    reachable = False
            else:
                free_ctx.setdefault(prefix, np.zeros(K))[cell] += n
    half = math.log(0.5)
    shared = math.fsum(_log_dm(c, np.full(K, 0.5)) for c in free_ctx.values())
    shared += math.fsum(_log_dm(c, np.full(K - 1, 0.5)) for c in cont_ctx.values())
    pool_kt = _log_dm(pool, np.array([0.5, 0.5])) if pool.sum() else 0.0
    pool_mu = 0.0 if pool[1] == 0 else -_INF
    product = shared + pool_kt
    sparse = shared + float(np.logaddexp(half + pool_mu, half + pool_kt))
    logv = math.log(mu.V)
    for prefix, c in mu_ctx.items():
        probs = mu.info(prefix).probs  # [K]
        a, _ = _kt_prior(probs)
        kt = _log_dm(c, a)
        with np.errstate(divide="ignore", invalid="ignore"):
            lmu = float(np.sum(np.where(c > 0, c * np.log(probs), 0.0)))  # -inf if μ forbids a cell seen
        d = len(prefix)
        log_pi = math.log1p(-SPARSE_DEPTH_DECAY) + d * (math.log(SPARSE_DEPTH_DECAY) - logv)
        product += kt
        sparse += float(np.logaddexp(math.log1p(-math.exp(log_pi)) + lmu, log_pi + kt))
    return float(np.logaddexp(product, sparse)) + half


def attribute(
    counts: Mapping[tuple[int, ...], int],
    mu: Law | Mapping[tuple[int, ...], float],
    alternatives: Mapping[str, Mapping[tuple[int, ...], float]],
    *,
    alpha: float = ATTRIBUTION_ALPHA,
    tolerance: float = 0.0,
    vocab_size: int | None = None,
) -> Attribution:
    """Name the catalogued bug class that explains ``counts``, or ``"unknown"``.

    See :class:`Attribution` for the rule. ``mu`` may be a :class:`Law` or enumerated.
    """
    cnt = _check_counts(counts)
    test = SequentialTest(mu, alternatives, alpha=alpha, tolerance=tolerance, vocab_size=vocab_size)
    # Likelihood ratios only: the universal e-process is not needed, so tolerance does
    # not force a replay here.
    tree = test._tree
    for x, c in cnt.items():
        oid = tree._lookup(x)
        tree.out_counts[oid] += c
        tree.n += c
    log_lr = test._log_lr()
    mu_cells = test._mu
    thr = test.threshold
    n = tree.n
    ll: dict[str, float] = {"universal": _universal_log_likelihood(mu_cells, cnt)}
    ll["mu"] = math.fsum(c * mu_cells.log_prob(x) for x, c in cnt.items()) if cnt else 0.0
    if math.isnan(ll["mu"]):
        ll["mu"] = -_INF
    for alt in test._alts:
        masses = alt.cell_path_masses(mu_cells)
        terms = []
        for x, c in cnt.items():
            m = masses.get(_cell_path(mu_cells, x), 0.0)
            terms.append(c * math.log(m) if m > 0 else -_INF)
        ll[alt.name] = -_INF if any(t == -_INF for t in terms) else math.fsum(terms)
    refuted = tuple(a.name for a in test._alts if log_lr[a.name] == -_INF or ll[a.name] == -_INF)
    cands = [a.name for a in test._alts if a.name not in refuted]
    best = max(cands, key=lambda k: ll[k]) if cands else None
    label = "unknown"
    if best is None:
        reason = "unknown: no catalogued class is left (none given, all identical to μ, or all refuted)"
        ambiguous: tuple[str, ...] = ()
    else:
        ambiguous = tuple(k for k in cands if k != best and ll[k] >= ll[best] - ATTRIBUTION_MARGIN)
        strong = log_lr[best] >= thr
        close = ll[best] >= ll["universal"] - ATTRIBUTION_MARGIN
        if strong and close:
            label = best
            reason = (
                f"{best}: likelihood ratio vs μ {_fmt_exp(log_lr[best])} ≥ 1/α = {_fmt_exp(thr)}, and within 100x "
                f"of the best explanation (log-likelihood {ll[best]:.1f} vs universal {ll['universal']:.1f}) after {n} samples"
            )
        elif not strong:
            reason = (
                f"unknown: best class {best} has likelihood ratio vs μ {_fmt_exp(log_lr[best])} < 1/α = {_fmt_exp(thr)} "
                f"after {n} samples"
            )
        else:
            reason = (
                f"unknown: best class {best} explains the data {_fmt_exp(ll['universal'] - ll[best])}x worse than the "
                f"universal alternative (more than 100x) after {n} samples"
            )
    return Attribution(
        label=label,
        best=best,
        log_lr=log_lr,
        log_likelihood=ll,
        threshold=thr,
        n=n,
        refuted=refuted,
        excluded=test.excluded_alternatives,
        ambiguous_with=ambiguous,
        reason=reason,
    )
