"""The mixture e-process of one case: universal tree test plus catalogued bug laws.

:class:`SequentialTest` mixes the universal tree e-process (power against any
deviation) with the likelihood ratio of every catalogued bug law μD (the optimal test
against that bug); :func:`position_test` tests one output position; the power of a test
against μD (:func:`kl_divergence`, :func:`optimal_sample_count`: about ln(1/α)/KL).

By Ville's inequality ``P_μ(sup_n E_n >= 1/α) <= α``: a case may be looked at after
every sample and stopped at any time.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Iterable, Mapping

import numpy as np
from scipy.special import logsumexp

from specfuzz.errors import InvalidInput
from specfuzz.oracle.cells import (
    EnumeratedLaw,
    Law,
    _cell_path,
    _check_alpha,
    _check_alternatives,
    _check_counts,
    _check_distribution,
    _check_tolerance,
    _is_int,
    _MuCells,
    _resolve_law,
)
from specfuzz.oracle.universal import _NORMAL, _POOL_END, _Tree, ripr_projection
from specfuzz.oracle.verdict import Verdict, _enumerated_g, _p_from_g, _status_and_evidence, _tree_g, _tv, _worst_token

# An alternative whose KL(μD || μ) is at most this is "identical to μ": no test can see it.
IDENTICAL_KL = 1e-10

_INF = math.inf


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
