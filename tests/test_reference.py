"""The reference speculative sampler: lossless when correct, exactly the bug law when not."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from scipy import stats as sps

from specfuzz.errors import AmbiguousSemantics, InvalidInput
from specfuzz.oracle.catalogue import catalogue, n1_published_effect
from specfuzz.oracle.law import OutputSpaceTooLarge
from specfuzz.oracle.speculative import (
    BUG_CLASSES,
    DraftModel,
    ExactDriver,
    MonteCarloDriver,
    SpecConfig,
    SpeculativeProcess,
)
from specfuzz.strategies import cases


def _tv(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def _mu(case):
    try:
        return case.target_law().enumerate().as_dict()
    except (AmbiguousSemantics, OutputSpaceTooLarge):
        assume(False)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(cases(max_vocab=4, max_tokens=3, max_k=3))
def test_correct_speculation_has_exactly_the_target_law(case):
    """Every method, verification mode, draft width and sampling option: law(spec) == μ."""
    mu = _mu(case)
    law = ExactDriver(case.process()).law()
    assert abs(sum(law.values()) - 1.0) < 1e-12
    assert _tv(law, mu) < 1e-12, (case.to_json(), _tv(law, mu))


@pytest.mark.parametrize("bug", sorted(BUG_CLASSES))
def test_each_catalogued_bug_changes_the_law_of_its_case(bug):
    case = catalogue()[bug].case
    mu = case.target_law().enumerate().as_dict()
    bad = ExactDriver(case.process()).law()
    good = ExactDriver(case.process(replace(case.spec, inject=None))).law()
    assert _tv(good, mu) < 1e-12
    assert _tv(bad, mu) > 0.05  # N1's published case moves P(x3=a) by 1/12
    assert abs(sum(bad.values()) - 1.0) < 1e-12


def _pooled_chisquare(counts: dict, law: dict, n: int) -> float:
    """p-value of a chi-square test of counts against law, pooling cells with expectation < 5."""
    keys = sorted(set(law) | set(counts), key=lambda k: -law.get(k, 0.0))
    obs, exp = [], []
    o_pool = e_pool = 0.0
    for k in keys:
        e = law.get(k, 0.0) * n
        if e >= 5:
            obs.append(counts.get(k, 0))
            exp.append(e)
        else:
            o_pool += counts.get(k, 0)
            e_pool += e
    if e_pool > 0 or o_pool > 0:
        if e_pool == 0:
            return 0.0
        obs.append(o_pool)
        exp.append(e_pool)
    if len(obs) < 2:
        return 1.0
    return float(sps.chisquare(obs, exp).pvalue)


@pytest.mark.parametrize("bug", [None] + sorted(BUG_CLASSES))
def test_monte_carlo_samples_follow_the_exact_law(bug):
    """The sampler's draws agree with the law the exact driver computes for the same switch."""
    entry = catalogue()["N1" if bug is None else bug]
    case = entry.case if bug else entry.case.with_(spec=replace(entry.case.spec, inject=None))
    law = ExactDriver(case.process()).law()
    driver = MonteCarloDriver(case.process(), np.random.default_rng(1234))
    n = 6000
    counts: dict = {}
    for out in driver.sample_many(n):
        counts[out] = counts.get(out, 0) + 1
    assert set(counts) <= set(law), "sampled an output the exact law says is impossible"
    assert _pooled_chisquare(counts, law, n) > 1e-4


def test_monte_carlo_check_detects_a_wrong_law():
    """The agreement check above can fail: N1's samples do not follow μ."""
    case = catalogue()["N1"].case
    mu = case.target_law().enumerate().as_dict()
    driver = MonteCarloDriver(case.process(), np.random.default_rng(7))
    n = 6000
    counts: dict = {}
    for out in driver.sample_many(n):
        counts[out] = counts.get(out, 0) + 1
    assert _pooled_chisquare(counts, mu, n) < 1e-6


def test_n1_published_effect_is_exactly_five_twelfths():
    mu_p, n1_p = n1_published_effect()
    assert abs(mu_p - 0.5) < 1e-15
    assert abs(n1_p - 5 / 12) < 1e-15
    assert Fraction(n1_p).limit_denominator(1000) == Fraction(5, 12)


def _block_n1_rational(q: dict, K: int, max_tokens: int) -> dict:
    """Block verification (Sun et al. 2024) with reused slot uniforms, in exact rationals.

    Written independently of the module: V=2, flat target 1/2, drafter q[last][next].
    The state between rounds carries the interval each slot uniform is known to lie in.
    """
    one, half = Fraction(1), Fraction(1, 2)
    acc: dict = {}

    def drafts(last, k):
        if k == 0:
            yield (), one
            return
        for d in (0, 1):
            if q[last][d]:
                for rest, pr in drafts(d, k - 1):
                    yield (d,) + rest, q[last][d] * pr

    def go(out, ivs, mass):
        if len(out) >= max_tokens:
            acc[out[:max_tokens]] = acc.get(out[:max_tokens], 0) + mass
            return
        last = out[-1] if out else 0
        for ds, pd in drafts(last, K):
            ctx = (last,) + ds  # ctx[i]: the token before slot i+1
            w = [one]
            for i in range(K):
                w.append(min(one, w[-1] * half / q[ctx[i]][ds[i]]))
            h = []
            for i in range(1, K + 1):
                if i < K:
                    r = sum(max(w[i] * half - q[ctx[i]][x], 0) for x in (0, 1))
                    h.append(one if r + 1 - w[i] == 0 else r / (r + 1 - w[i]))
                else:
                    h.append(w[K])
            # enumerate which slots have eta_i <= h_i, within the known intervals
            def split(i, ivs_now, pr, below):
                if i == K:
                    tau = max([j + 1 for j in range(K) if below[j]], default=0)
                    kept = ds[:tau]
                    if tau == K:
                        nxt = {0: half, 1: half}
                    else:
                        res = {x: max(w[tau] * half - q[ctx[tau]][x], 0) for x in (0, 1)}
                        s = sum(res.values())
                        nxt = {x: res[x] / s for x in (0, 1)}
                    for y in (0, 1):
                        if nxt[y]:
                            go(out + kept + (y,), ivs_now, mass * pd * pr * nxt[y])
                    return
                lo, hi = ivs_now[i]
                cut = min(max(h[i], lo), hi)
                for is_below, (a, b) in ((True, (lo, cut)), (False, (cut, hi))):
                    if b > a or (b == a and lo == hi):
                        p = (b - a) / (hi - lo)
                        if p:
                            split(i + 1, ivs_now[:i] + ((a, b),) + ivs_now[i + 1 :], pr * p, below + (is_below,))

            split(0, ivs, one, ())

    go((), tuple((Fraction(0), one) for _ in range(K)), one)
    return acc


def test_n1_published_effect_matches_an_independent_rational_computation():
    q = {0: {0: Fraction(1, 2), 1: Fraction(1, 2)}, 1: {0: Fraction(1), 1: Fraction(0)}}
    acc = _block_n1_rational(q, K=3, max_tokens=3)
    assert sum(acc.values()) == 1
    assert sum(v for k, v in acc.items() if k[2] == 0) == Fraction(5, 12)
    law = ExactDriver(catalogue()["N1"].case.process()).law()
    assert _tv({k: float(v) for k, v in acc.items()}, law) < 1e-15


def test_bad_speculation_settings_are_rejected_with_the_value():
    with pytest.raises(InvalidInput, match="'medusa'"):
        SpecConfig(method="medusa")
    with pytest.raises(InvalidInput, match="num_speculative_tokens=0"):
        SpecConfig(num_speculative_tokens=0)
    with pytest.raises(InvalidInput, match="'block'"):
        SpecConfig(method="eagle_tree", verify="block")
    with pytest.raises(InvalidInput, match="'N9'"):
        SpecConfig(inject="N9")
    case = catalogue()["N5"].case
    law = case.target_law()
    with pytest.raises(InvalidInput, match="draft table rows"):
        SpeculativeProcess(law, case.prompt, 3, SpecConfig("draft_model", 1), DraftModel(np.zeros((2, 2))))
    with pytest.raises(InvalidInput, match="draft vocab"):
        SpeculativeProcess(law, case.prompt, 3, SpecConfig("eagle_tree", 1), DraftModel(np.zeros((6, 6))))
    with pytest.raises(InvalidInput, match="draft=None"):
        SpeculativeProcess(law, case.prompt, 3, SpecConfig("draft_model", 1), None)
