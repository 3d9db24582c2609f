"""Filling start waits: while a campaign's fresh confirmation engine or speculation-off engine
starts, the running search engine samples more families of the search by table swaps. The
wait's seconds are lent, not counted twice (the engines' seconds still add up to at most the
wall); a filling family that fails its screening is examined as a candidate after the search's
own failure; a wait is never filled by a start, and nothing a filler does changes a verdict."""

from __future__ import annotations

import json
import time

import numpy as np

from specfuzz.case import Case
from specfuzz.engines.isolation import IsolatedEngine
from specfuzz.fuzz.campaign import Campaign, CampaignConfig, state_problem
from specfuzz.fuzz.run import engine_config
from specfuzz.oracle.params import SamplingParams
from specfuzz.oracle.speculative import SpecConfig

ENGINE = "tests.example_engines:SlowRestartEngine"  # starts take 2 s, in a new process


def _case(seed: int, V: int = 4) -> Case:
    rng = np.random.default_rng(seed)
    t = rng.integers(-16, 13, size=(V, V)) / 4.0
    return Case(t, (0, 1), SamplingParams(temperature=1.0, max_tokens=2),
                spec=SpecConfig(method="ngram", num_speculative_tokens=2))


def test_an_engine_lends_its_start_wait_and_does_not_count_the_lent_seconds_as_starting(tmp_path):
    calls: list[float] = []

    def hook() -> None:
        calls.append(time.monotonic())
        time.sleep(0.3)

    with IsolatedEngine(ENGINE, log_dir=tmp_path / "logs") as eng:
        eng.while_waiting = hook
        cfg = engine_config(_case(1), tmp_path / "ck")
        t0 = time.monotonic()
        eng.start(cfg)
        wall = time.monotonic() - t0
        assert len(calls) >= 2  # about once a second over a start of 2 s and more (a new process's imports)
        assert eng.lent_s >= 0.3 * len(calls) - 1e-6
        # the start's seconds are the wall less what was lent: never both
        assert abs(eng.seconds["start"] + eng.lent_s - wall) < 0.25
        n = len(calls)
        eng.generate([])  # a generate call lends nothing
        assert len(calls) == n


def test_a_hook_that_outlasts_the_start_deadline_does_not_turn_a_finished_start_into_a_timeout(tmp_path):
    with IsolatedEngine(ENGINE, log_dir=tmp_path / "logs", start_timeout_s=4.0) as eng:
        eng.while_waiting = lambda: time.sleep(5.0)  # one lent call runs past the 4-s deadline
        eng.start(engine_config(_case(2), tmp_path / "ck"))
        assert eng.starts == 1 and eng.crashes == 0


def test_a_campaign_fills_its_confirmations_start_waits_with_search_families_and_still_stores_its_finding(tmp_path):
    """A whole campaign on a slow-starting engine with a speculation bug (N6) and start waits
    filled: the fresh confirmation and speculation-off starts lent their waits to families of the
    running search ("filler" in the family log, sampled on the search engine by swaps), the
    failure is still confirmed on a fresh engine, shrunk and stored, the time totals add up to
    the wall, and failing fillers were examined after the search's failure."""
    events: list[str] = []
    cfg = CampaignConfig(engine=ENGINE, engine_kwargs={"inject": "N6"}, budget_s=45, corpus_dir=tmp_path / "c",
                         methods=("ngram",), work_dir=tmp_path / "wd", spare_engines=True, prestart=True,
                         fill_waits=True, seed=1)
    camp = Campaign(cfg, on_event=lambda msg, stats: events.append(msg))
    t0 = time.monotonic()
    stats = camp.run()
    wall = time.monotonic() - t0
    assert stats.findings_new >= 1 and stats.stored, stats
    fams = [json.loads(x) for x in (tmp_path / "c" / ".specfuzz" / "families.jsonl").read_text().splitlines()]
    fillers = [f for f in fams if f["role"] == "filler"]
    assert fillers, [f["role"] for f in fams]
    # sampled on the running search engine, by swaps: no filler ever started an engine
    assert all(f["seconds"]["start"] == 0 for f in fillers) and all(f["method"] == "ngram" for f in fillers)
    lent = [f for f in fams if f["role"] in ("fresh", "calibration") and f["lent_s"] > 0]
    assert lent and any(f["role"] == "fresh" and f["failed"] for f in fams)
    state = json.loads((tmp_path / "c" / ".specfuzz" / "state.json").read_text())
    eng = state["totals"]["engine"]
    assert eng["filled_families"] == len(fillers)
    assert state_problem(state) is None
    assert abs(sum(eng["seconds"].values()) - state["totals"]["seconds"]) < 1e-6 * max(1.0, wall)
    assert state["totals"]["seconds"] <= wall + 1.0
    # N6 fails every family of the shape: fillers failed too and were examined afterwards
    # (met again as the stored finding, or passed), not dropped and not stored twice
    if any(f["failed"] for f in fillers):
        assert any(m.startswith("examining a family that failed while an engine started") for m in events), events
    assert len({json.loads(p.read_text())["signature"] for p in (tmp_path / "c").glob("finding-*.json")}) == len(stats.stored)


def test_a_state_with_failing_fillers_left_keeps_them_for_the_next_run_and_a_bad_list_is_refused(tmp_path):
    cfg = CampaignConfig(engine="reference", budget_s=0.01, corpus_dir=tmp_path / "c", methods=("ngram",),
                         work_dir=tmp_path / "wd")
    camp = Campaign(cfg)
    camp._deferred = [[_case(3)], [_case(4), _case(5)]]
    camp._save_state()
    state = json.loads((tmp_path / "c" / ".specfuzz" / "state.json").read_text())
    assert state_problem(state) is None and len(state["deferred"]) == 2
    again = Campaign(cfg)
    assert [[c.to_json() for c in f] for f in again._deferred] == state["deferred"]
    assert "deferred" in state_problem({**state, "deferred": [{"not": "a family"}]})
