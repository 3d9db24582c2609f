"""A confirmation samples as many as its level needs (campaign.confirmation_samples): a
candidate screened at 1e-3 is confirmed at a much smaller α_j, and a fresh engine start
(~30 s for SGLang on the H200) spent on a confirmation that stopped at --samples short of its
level is wasted."""

import math
from dataclasses import dataclass

import numpy as np

from specfuzz.case import Case
from specfuzz.fuzz.campaign import CONFIRM_MAX_FACTOR, Campaign, CampaignConfig, confirmation_samples
from specfuzz.oracle.params import SamplingParams


@dataclass
class _Verdict:
    log_e: float


@dataclass
class _Judgement:
    verdict: _Verdict


@dataclass
class _Run:
    n: int
    judgement: _Judgement | None


def _run(n, log_e):
    return _Run(n, None if log_e is None else _Judgement(_Verdict(log_e)))


def test_confirmation_samples_scale_with_the_evidence_the_candidate_showed():
    # screened at 1e-3 (log e 6.9) after 1000 samples, confirmed at 1e-9 (log 1/α 20.7): ~3x the
    # evidence, 1.5x margin
    assert confirmation_samples(_run(1000, math.log(1e3)), 1e-9, 1000) == math.ceil(1.5 * 1000 * math.log(1e9) / math.log(1e3))
    # strong evidence: never fewer than --samples
    assert confirmation_samples(_run(1000, 200.0), 1e-9, 1000) == 1000
    # an output μ forbids (e-value ∞), no judgement, no samples: --samples
    assert confirmation_samples(_run(1000, math.inf), 1e-9, 1000) == 1000
    assert confirmation_samples(_run(1000, None), 1e-9, 1000) == 1000
    assert confirmation_samples(_run(0, 3.0), 1e-9, 1000) == 1000
    # weak evidence: at most CONFIRM_MAX_FACTOR x --samples
    assert confirmation_samples(_run(1000, 0.01), 1e-9, 1000) == CONFIRM_MAX_FACTOR * 1000


def test_a_confirmation_of_a_subtle_bug_samples_past_samples_to_its_level(tmp_path):
    """The temperature bug (the engine samples at 1 whatever the request says) on a request at
    temperature 0.66: a screening run of --samples 300 crosses 1e-3, while a confirmation at
    the campaign's first α_j (5e-7 here) needs more than 300 samples; it gets them and confirms."""
    cfg = CampaignConfig(engine="tests.example_engines:TemperatureBugEngine", budget_s=60, corpus_dir=tmp_path / "c",
                         work_dir=tmp_path / "w", max_samples=300, methods=(), alpha=1e-6)
    camp = Campaign(cfg)
    camp._shape(1)  # the engine answers: its semantics profile is known
    table = np.array([[0.0, 1.5, 3.0]] * 3, dtype=np.float32)
    case = Case(target_table=table, prompt=(0,), params=SamplingParams(temperature=0.66, max_tokens=1))
    screened = None
    for seed in range(40):
        r = camp._run([case], [1e-3], 1000 + seed, speculation=False)[0]
        if r.failed and math.isfinite(r.judgement.verdict.log_e) and r.judgement.verdict.log_e < math.log(2e6):  # short of α_1's level
            screened = r
            break
    assert screened is not None, "no screening run crossed 1e-3 with weak evidence"
    conf, j = camp._confirm(screened, speculation=False)
    assert j == 1 and conf.failed
    assert 300 < conf.n <= confirmation_samples(screened, 1e-6 / 2, 300)
    for e in camp._engines:
        e.close()
