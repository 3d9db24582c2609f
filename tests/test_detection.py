"""Verdicts on the reference sampler: no false alarms when correct, every bug found and named."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings

from specfuzz.errors import AmbiguousSemantics
from specfuzz.oracle.catalogue import catalogue
from specfuzz.oracle.judge import CaseTest
from specfuzz.oracle.law import OutputSpaceTooLarge
from example_engines import ResampleFromTargetProcess
from specfuzz.oracle.speculative import BUG_CLASSES, MonteCarloDriver
from specfuzz.oracle.speculative import SpecConfig
from specfuzz.oracle.stats import AlphaSpender
from specfuzz.strategies import cases

ALPHA = 1e-3


def _run_until_decided(ct: CaseTest, driver: MonteCarloDriver, max_samples: int, batch: int = 10) -> None:
    threshold = math.log(1 / ct.alpha)
    while ct.n < max_samples:
        ct.update(driver.sample_many(batch))
        if ct.test.log_e >= threshold:
            return


@pytest.mark.parametrize("bug", sorted(BUG_CLASSES))
def test_each_injected_bug_is_detected_and_attributed_to_its_class(bug):
    case = catalogue()[bug].case
    ct = CaseTest(case, alpha=ALPHA)
    _run_until_decided(ct, MonteCarloDriver(case.process(target=ct.law), np.random.default_rng(99)), 5000)
    j = ct.judgement()
    assert j.verdict.status == "fail", j.verdict.evidence
    assert j.attribution.label == bug, j.attribution.reason
    assert j.broken_condition == BUG_CLASSES[bug][0]


def test_correct_reference_sampler_raises_no_false_alarm_over_200_random_cases():
    """Campaign-level control: α=0.001 spent over 200 cases, 400 samples each, looked at every 50."""
    spender = AlphaSpender(ALPHA)
    rng = np.random.default_rng(2026)
    draw = cases(max_vocab=4, max_tokens=3, max_k=3)
    checked = 0
    failures = []

    @seed(31337)
    @settings(max_examples=400, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(draw)
    def collect(case):
        nonlocal checked
        if checked >= 200:
            return
        try:
            ct = CaseTest(case, alpha=spender.peek())
        except (AmbiguousSemantics, OutputSpaceTooLarge):
            return
        spender.next()
        checked += 1
        driver = MonteCarloDriver(case.process(target=ct.law), rng)
        for _ in range(8):
            ct.update(driver.sample_many(50))
            if ct.test.log_e >= math.log(1 / ct.alpha):
                failures.append((case.to_json(), ct.judgement().verdict.evidence))
                return

    collect()
    assert checked == 200
    assert failures == []
    assert spender.spent <= ALPHA


def test_a_bug_outside_the_catalogue_is_detected_and_labelled_unknown():
    case = catalogue()["N5"].case
    case = case.with_(spec=SpecConfig("draft_model", 2), draft_table=np.array([[2.0, 0, 0, 0]] * 4))
    ct = CaseTest(case, alpha=ALPHA)
    proc = ResampleFromTargetProcess(ct.law, case.prompt, case.params.max_tokens, case.spec, case.draft, 1.0)
    _run_until_decided(ct, MonteCarloDriver(proc, np.random.default_rng(5)), 20000)
    j = ct.judgement()
    assert j.verdict.status == "fail", j.verdict.evidence
    assert j.attribution.label == "unknown", j.attribution.reason
