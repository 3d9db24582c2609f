"""The universal tree e-process: power against every law other than μ.

Per context (output prefix) a Krichevsky-Trofimov predictive bets against μ's
conditional; the product over contexts and a sparse mixture over few deviating contexts
are averaged (:class:`_Tree`). With a numeric tolerance τ each context bets through the
reverse information projection onto the tolerant null set (:func:`ripr_projection`,
:class:`_Bettor`). See :class:`specfuzz.oracle.eprocess.SequentialTest` for the
construction and why each part is a test supermartingale under μ.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Iterable, Mapping

import numpy as np
from scipy.special import gammaln

from specfuzz.oracle.cells import Law, _as_output, _check_tolerance, _MuCells, _resolve_law

# KT prior: 1/2 per token μ allows; a total of 1/2 spread over the cells μ forbids.
KT_POSSIBLE_PRIOR = 0.5
KT_IMPOSSIBLE_TOTAL = 0.5
# Tolerant e-process: re-fit a context's bet when its count doubles while it has fewer
# than this many events, then whenever its count grew by 1/REFRESH_DIVISOR.
REFRESH_DIVISOR = 8
# Sparse universal part: prior weight of a context of length d is
# (1 - SPARSE_DEPTH_DECAY) * SPARSE_DEPTH_DECAY**d / V**d (sums to <= 1 over all prefixes).
SPARSE_DEPTH_DECAY = 0.5

_INF = math.inf


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
