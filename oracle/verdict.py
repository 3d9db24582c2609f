"""Verdicts and their evidence: the decision of one case's test, in words and numbers.

:class:`Verdict` (fail / pass / undecided, with the e-value, its components, and
information for humans: the classic G-test p-value, the worst token, the total variation
distance) and :class:`TokenDeviation`; the one-sentence evidence each verdict states.
Serialised with ``schema_version``; infinite values are written as strings.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

import numpy as np
from scipy.stats import chi2

from specfuzz.errors import InvalidInput
from specfuzz.oracle.cells import SCHEMA_VERSION, _MuCells

if TYPE_CHECKING:
    from specfuzz.oracle.universal import _Tree

# Classic (fixed-n, information only) G-tests pool cells with expected count below this.
MIN_EXPECTED_COUNT = 5.0
# Labels for the two non-token cells in reports.
OOV_LABEL = "<oov>"
END_LABEL = "<end>"

_INF = math.inf


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
