"""From a case and an engine's outputs to a verdict with attribution (SPEC §5).

``judge`` puts the pieces together: the exact target law μ of the case, the exact bug
law μD of every catalogued class under the case's speculation settings (computed by the
reference sampler's exact driver), the anytime-valid sequential test, and attribution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping

from specfuzz.case import Case
from specfuzz.errors import AmbiguousSemantics
from specfuzz.oracle.speculative import BUG_CLASSES, METHODS as REFERENCE_METHODS, ExactDriver
from specfuzz.oracle.attribution import Attribution, attribute
from specfuzz.oracle.eprocess import SequentialTest
from specfuzz.oracle.verdict import Verdict

# μD enumeration is skipped (the case is judged by the universal test alone) past this
# many replayed branches per round or states per step.
MAX_BUG_LAW_STATES = 200_000
# Bug laws closer than this (total variation) to μ change nothing observable.
SAME_LAW_TV = 1e-12


def _tv(a: Mapping, b: Mapping) -> float:
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def target_law_dict(case: Case, max_outcomes: int = 200_000, profile: str = "vllm") -> dict[tuple[int, ...], float] | None:
    """μ over complete outputs, or None when the output space is too large to enumerate."""
    from specfuzz.oracle.law import OutputSpaceTooLarge

    try:
        return case.target_law(profile).enumerate(max_outcomes=max_outcomes).as_dict()
    except OutputSpaceTooLarge:
        return None


def bug_laws(
    case: Case, mu: Mapping | None = None, classes: Iterable[str] | None = None, profile: str = "vllm"
) -> dict[str, dict]:
    """Exact μD of each catalogued class under the case's speculation settings.

    Classes whose law equals μ for this case (the bug cannot show here) and classes whose
    law is too large to enumerate are left out. Without speculation there are none.
    """
    if case.spec is None:
        return {}
    if case.spec.method not in REFERENCE_METHODS:
        return {}
    out: dict[str, dict] = {}
    target = case.target_law(profile)
    for bug in classes or BUG_CLASSES:
        try:
            law = ExactDriver(case.process(replace(case.spec, inject=bug), target=target), max_states=MAX_BUG_LAW_STATES).law()
        except (RuntimeError, AmbiguousSemantics):
            continue
        if mu is not None and _tv(law, mu) <= SAME_LAW_TV:
            continue
        out[bug] = law
    return out


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    attribution: Attribution | None
    optimal_samples: Mapping[str, float] = field(default_factory=dict)  # per class: ln(1/α)/KL or 1/ε
    broken_condition: int | None = None  # SPEC §3 condition of the attributed class

    @property
    def failed(self) -> bool:
        return self.verdict.status == "fail"

    def to_json(self) -> dict:
        return {
            "verdict": self.verdict.to_dict(),
            "attribution": None if self.attribution is None else self.attribution.to_dict(),
            "optimal_samples": {k: (v if math.isfinite(v) else "inf") for k, v in self.optimal_samples.items()},
            "broken_condition": self.broken_condition,
        }


class CaseTest:
    """A sequential test of one case: feed outputs in batches, ask for the verdict any time."""

    def __init__(
        self,
        case: Case,
        *,
        alpha: float,
        tolerance: float = 0.0,
        with_bug_laws: bool = True,
        profile: str = "vllm",
        law=None,
        mu: dict | None = None,
    ) -> None:
        """``law`` and ``mu``: the case's target law and its enumerated dict, where the caller
        computed them already (:func:`specfuzz.fuzz.run.run_family` does, before the engine
        runs, so that a case the oracle cannot take is refused first)."""
        self.case = case
        self.profile = profile
        self.law = case.target_law(profile) if law is None else law
        self.mu = target_law_dict(case, profile=profile) if mu is None and law is None else mu
        self.alternatives = bug_laws(case, self.mu, profile=profile) if with_bug_laws and self.mu is not None else {}
        self.alpha = alpha
        self.tolerance = tolerance
        self.test = SequentialTest(
            self.law, self.alternatives, alpha=alpha, tolerance=tolerance, enumerated=self.mu,
        )

    def update(self, outputs: Iterable[tuple[int, ...]]) -> None:
        self.test.update(outputs)

    @property
    def n(self) -> int:
        return self.test.n

    def judgement(self, n_planned: int | None = None) -> Judgement:
        verdict = self.test.verdict(n_planned=n_planned)
        attribution = None
        condition = None
        if verdict.status == "fail":
            attribution = attribute(
                self.test.counts, self.mu if self.mu is not None else self.law, self.alternatives,
                tolerance=self.tolerance, vocab_size=self.case.vocab_size,
            )
            if attribution.label in BUG_CLASSES:
                condition = BUG_CLASSES[attribution.label][0]
        return Judgement(verdict, attribution, dict(self.test.optimal_samples), condition)


def judge(
    case: Case, outputs: Iterable[tuple[int, ...]], *, alpha: float, tolerance: float = 0.0,
    n_planned: int | None = None, profile: str = "vllm",
) -> Judgement:
    """One-shot: the verdict and attribution for a case and all its outputs."""
    t = CaseTest(case, alpha=alpha, tolerance=tolerance, profile=profile)
    t.update(outputs)
    return t.judgement(n_planned)
