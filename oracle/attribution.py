"""Attribution: which catalogued bug class explains the counts, or "unknown" (SPEC §5).

A class is named only when its likelihood ratio against μ is at least 1/α and it
explains the counts within a factor 100 of the best model, the universal one included.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from specfuzz.oracle.cells import SCHEMA_VERSION, Law, _cell_path, _check_counts, _MuCells
from specfuzz.oracle.eprocess import SequentialTest
from specfuzz.oracle.universal import SPARSE_DEPTH_DECAY, _kt_prior, _log_dm
from specfuzz.oracle.verdict import _enc, _fmt_exp

# Attribution names a class only with LR >= 1/ATTRIBUTION_ALPHA against μ ...
ATTRIBUTION_ALPHA = 1e-3
# ... and a likelihood within this factor of the best explanation (universal included).
ATTRIBUTION_MARGIN = math.log(100.0)

_INF = math.inf


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
