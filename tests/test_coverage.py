"""Coverage of speculation events in campaigns (fuzz/coverage.py) and the steering it drives."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specfuzz.case import Case
from specfuzz.fuzz.coverage import COVERED_P, Coverage, coverage_table, family_is_multi_position, multi_position_line
from specfuzz.oracle.events import case_events, expressible
from specfuzz.oracle.params import SamplingParams
from specfuzz.oracle.speculative import SpecConfig


def _case(K: int, method: str = "draft_model", **params) -> Case:
    t = np.array([[0.0, 1.0, 0.5], [1.0, 0.0, 0.5], [0.5, 0.5, 0.0]])  # [3, 3]
    draft = None if method.startswith("ngram") else np.array([[1.0, 0.0, 0.0]] * 3)  # [3, 3]
    return Case(t, (0, 1, 0), SamplingParams(max_tokens=4, **params), eos_token_id=2, spec=SpecConfig(method, K),
                draft_table=draft)


def test_coverage_keeps_the_largest_probability_and_adds_expected_occurrences():
    cov = Coverage()
    a, b = _case(3), _case(3, frequency_penalty=0.5)  # one family: two patterns
    cov.record([a, b], [100, 300])
    ea, eb = case_events(a), case_events(b)
    ev = cov.data["methods"]["draft_model"]["events"]
    for e in set(ea.probability) | set(eb.probability):
        assert ev[e][0] == pytest.approx(max(ea.probability.get(e, 0), eb.probability.get(e, 0)))
        assert ev[e][1] == pytest.approx(100 * ea.expected.get(e, 0) + 300 * eb.expected.get(e, 0))
    assert "lag:penalties" in ev and "lag:penalties" not in ea.probability
    row = cov.data["methods"]["draft_model"]
    assert (row["families"], row["multi_config"], row["multi_events"]) == (1, 1, 1)
    cov.record([_case(1)], [50])
    assert (row["families"], row["multi_config"], row["multi_events"]) == (2, 1, 1)
    # Workers' coverage adds up: max of max, sum of expected, counts summed.
    merged = Coverage.merge(json.loads(json.dumps(cov.data)), cov.data)
    m = merged["methods"]["draft_model"]
    assert m["families"] == 4 and m["events"]["reject@1"][0] == ev["reject@1"][0]
    assert m["events"]["reject@1"][1] == pytest.approx(2 * ev["reject@1"][1])


def test_report_marks_unreachable_events_not_uncovered():
    cov = Coverage()
    cov.record([_case(1)], [1000])
    reach = {"draft_model": expressible("draft_model", 1, sampling={"top_k"})}
    rep = cov.report(reach)["draft_model"]["events"]
    assert rep["reject@1"]["status"] == "covered" and rep["reject@1"]["max_probability"] >= COVERED_P
    assert rep["stop_mid_round"]["status"].startswith("n/a: needs K >= 2")
    assert rep["lag:min_tokens"]["status"].startswith("n/a")
    assert rep["draft_truncated"]["status"] == "uncovered"
    assert "1/1" not in multi_position_line(cov.report(reach))  # K=1: no multi-position family
    table = coverage_table(cov.report(reach))
    assert table.row_count > 5


def test_steer_favours_the_highest_thin_position_and_thin_features():
    cov = Coverage()
    reach = expressible("draft_model", 3, verify=("token", "block"), sampling={"min_tokens", "top_k", "repetition_penalty"},
                        narrower_draft=True)
    s = cov.steer("draft_model", reach, 3)
    assert s.k_weights[2] > s.k_weights[1] > s.k_weights[0] == 1
    # Before the method ran a family: not the costly narrower drafts; long outputs already (bonus@3 is thin).
    assert not s.narrower and s.long and s.near and s.block and {"min_tokens", "top_k"} <= set(s.features)
    cov.record([_case(1)], [1000])
    s2 = cov.steer("draft_model", reach, 3)
    assert s2.k_weights[2] > s2.k_weights[0] == 1
    assert {"min_tokens", "top_k", "repetition_penalty"} <= set(s2.features) and s2.narrower and s2.block and s2.long


def test_family_is_multi_position():
    assert family_is_multi_position(SpecConfig("draft_model", 2))
    assert not family_is_multi_position(SpecConfig("draft_model", 1))
    assert not family_is_multi_position(SpecConfig("eagle_tree", 3, tree_budget=1))
    assert not family_is_multi_position(None)


@pytest.mark.slow
def test_steering_raises_the_least_covered_multi_position_event_over_an_unsteered_campaign(tmp_path):
    """Equal budgets on the reference engine: the steered campaign (CLI, --json) covers both
    multi-position events of K <= 2 chains (a rejection after an accepted draft, a bonus after
    two), the unsteered one (its first search at the simplest shape, K=1) less; the summary and
    the JSON report show the coverage."""
    from ci_helpers import run_cli, valid_json

    from specfuzz.fuzz.campaign import Campaign, CampaignConfig

    args = ["fuzz", "--engine", "reference", "--method", "draft_model", "--budget", "25s", "--seed", "2",
            "--corpus", str(tmp_path / "steered"), "--work-dir", str(tmp_path / "w1"), "--quiet", "--json", str(tmp_path / "r.json")]
    done = run_cli(args + ["--max-k", "2"], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "speculation coverage" in done.stdout and "multi-position:" in done.stdout
    report = valid_json(tmp_path / "r.json")["coverage"]["draft_model"]
    steered = Coverage(json.loads((tmp_path / "steered" / ".specfuzz" / "state.json").read_text())["totals"]["coverage"])
    assert report["events"]["reject@2"]["max_probability"] == pytest.approx(steered.data["methods"]["draft_model"]["events"]["reject@2"][0], abs=1e-6)
    # (a share of families is not asserted: once K=2's events are covered, steering stops
    # favouring K=2, and at --max-k 2 that can happen within the first search)
    assert report["multi_events"] > 0

    cfg = CampaignConfig(budget_s=25, corpus_dir=tmp_path / "plain", work_dir=tmp_path / "w2", seed=2,
                         methods=("draft_model",), max_k=2, steer=False)
    plain = Campaign(cfg)
    plain.run()
    lo_steered, lo_plain = steered.min_multi_position(), plain.coverage.min_multi_position()
    assert lo_steered >= COVERED_P and lo_steered > lo_plain, (lo_steered, lo_plain)


def test_every_third_search_of_a_method_runs_unsteered(tmp_path):
    """Steering favours K >= 2; every STEER_EXPLORE_EVERY-th search of a method (its 3rd, 6th)
    draws uniformly, so that shapes no thin event asks for (K = 1 above all) keep a share;
    --no-steer leaves every search unsteered."""
    from specfuzz.fuzz.campaign import STEER_EXPLORE_EVERY, Campaign, CampaignConfig

    assert STEER_EXPLORE_EVERY == 3
    for steer, want in ((True, [True, True, False, True, True, False]), (False, [False] * 6)):
        cfg = CampaignConfig(budget_s=10, corpus_dir=tmp_path / f"c{steer}", work_dir=tmp_path / f"w{steer}", seed=1,
                             methods=("draft_model", "ngram"), steer=steer)
        c = Campaign(cfg)
        got = []
        for index in range(1, 13):
            shape = c._shape(index)
            if shape.spec.method == "draft_model":
                got.append(c._steer is not None)
        assert got == want, (steer, got)


def test_the_background_event_worker_runs_at_a_lower_cpu_priority_than_the_campaign():
    """Event laws are computed on a worker thread while the engine samples; on Linux the thread is
    niced by WORKER_NICE so that the engine processes come first on a small machine."""
    import os
    import sys
    import threading

    from specfuzz.fuzz.coverage import WORKER_NICE, Coverage

    if not sys.platform.startswith("linux"):
        pytest.skip("per-thread niceness is Linux's")
    cov = Coverage()
    cov.record([_case(2)], [10], background=True)  # starts the worker
    fut = cov._pool.submit(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
    assert fut.result() == min(19, os.getpriority(os.PRIO_PROCESS, 0) + WORKER_NICE)
    cov.drain(wait=True, timeout_s=30)
