"""Prestarted engines: the next search's engine starts in the background while this one
samples; a start of a config with its swap key takes it, swaps the start's own tables in and
checks them, and waits only for what is left of its start. A prestart never serves a fresh
start (confirmations), never changes a verdict, and one that fails is not a finding."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from specfuzz.case import Case
from specfuzz.engines.base import Request, swap_key
from specfuzz.engines.isolation import IsolatedEngine
from specfuzz.fuzz.campaign import Campaign, CampaignConfig
from specfuzz.fuzz.run import engine_config, run_case
from specfuzz.oracle.params import SamplingParams
from specfuzz.oracle.speculative import SpecConfig

ENGINE = "tests.example_engines:SlowRestartEngine"


def _table(rng, V: int) -> np.ndarray:
    t = rng.integers(-16, 13, size=(V, V)) / 4.0
    t[np.arange(V), rng.integers(0, V, size=V)] = 4.0  # a unique maximum per row
    return t


def _case(rng, k: int, V: int = 4) -> Case:
    return Case(_table(rng, V), (0, 1), SamplingParams(temperature=0.0, max_tokens=3),
                spec=SpecConfig(method="draft_model", num_speculative_tokens=k), draft_table=_table(rng, V))


def _greedy(table: np.ndarray, last: int, n: int) -> tuple[int, ...]:
    out = []
    for _ in range(n):
        last = int(np.argmax(table[last]))
        out.append(last)
    return tuple(out)


def _await_prestart(eng: IsolatedEngine, more_s: float = 0.5) -> None:
    """Wait until the prestarted engine's start has answered (its process's imports take
    seconds on a loaded machine), then ``more_s`` longer."""
    deadline = time.monotonic() + 60
    while not eng._hot["conn"].poll(0.1):
        assert time.monotonic() < deadline, "the prestarted engine did not start within 60 s"
    time.sleep(more_s)


def test_a_prestarted_engine_serves_the_next_start_by_a_swap_and_hides_its_start(tmp_path):
    rng = np.random.default_rng(0)
    a, b, b2 = _case(rng, 1), _case(rng, 2), _case(rng, 2)  # b and b2: one start shape, other tables
    cfg_b, cfg_b2 = engine_config(b, tmp_path / "ck"), engine_config(b2, tmp_path / "ck")
    assert swap_key(cfg_b) == swap_key(cfg_b2) and cfg_b != cfg_b2
    with IsolatedEngine(ENGINE, spare=True, log_dir=tmp_path / "logs") as eng:
        eng.start(engine_config(a, tmp_path / "ck"))
        assert eng.prestart(cfg_b) and eng.prestarts == 1
        assert eng.prestart(cfg_b2) and eng.prestarts == 1  # the same key: the same prestarted engine
        hot_pid = eng._hot["proc"].pid
        # meanwhile the running engine samples its own tables
        out = eng.generate([Request(a.prompt, a.params, 1)])[0].token_ids
        assert out == _greedy(a.target_table, 1, 3)
        _await_prestart(eng)
        before = eng.seconds["start"]
        eng.start(cfg_b2)
        waited = eng.seconds["start"] - before
        assert waited < 1.0  # (a start on demand takes 2 s and more)
        assert (eng.starts, eng.hot_starts, eng.swaps, eng.swap_fallbacks) == (2, 1, 1, 0)
        assert eng.pid == hot_pid and eng.call("starts_here") == (hot_pid, 1)
        # every sample follows b2's tables, not the prestarted b's
        outs = eng.generate([Request(b2.prompt, b2.params, s) for s in range(20)])
        assert {o.token_ids for o in outs} == {_greedy(b2.target_table, 1, 3)}
        run = run_case(eng, b2.with_(params=SamplingParams(max_tokens=3)), alpha=1e-3, ckpt_root=tmp_path / "ck", max_samples=300)
        assert run.judgement is not None and not run.failed
        assert eng._hot is None


def test_a_prestart_of_another_shape_waits_unused_and_a_fresh_start_never_takes_it(tmp_path):
    rng = np.random.default_rng(1)
    a, b, c = _case(rng, 1), _case(rng, 2), _case(rng, 3)
    with IsolatedEngine(ENGINE, spare=True, log_dir=tmp_path / "logs") as eng:
        eng.start(engine_config(a, tmp_path / "ck"))
        assert eng.prestart(engine_config(b, tmp_path / "ck"))
        eng.start(engine_config(c, tmp_path / "ck"))  # another shape: an ordinary start
        assert (eng.starts, eng.hot_starts) == (2, 0) and eng._hot is not None
        eng.start(engine_config(b, tmp_path / "ck"), fresh=True)  # a confirmation: started afresh
        assert (eng.starts, eng.hot_starts) == (3, 0) and eng.call("starts_here")[1] == 1
        hot = eng._hot["proc"]
        assert eng.prestart(engine_config(c, tmp_path / "ck"))  # a new prestart ends the unused one
        assert any(e["event"] == "prestarted engine unused" for e in eng.events)
        hot.join(10)
        assert not hot.is_alive()
        last = eng._hot["proc"]
    last.join(10)
    assert not last.is_alive()  # close() ends the prestarted engine too


def test_a_prestart_that_fails_is_not_a_crash_and_the_start_runs_as_usual(tmp_path):
    rng = np.random.default_rng(2)
    a, bad = _case(rng, 1), _case(rng, 4)  # K=4: SlowRestartEngine dies at start
    with IsolatedEngine(ENGINE, spare=True, log_dir=tmp_path / "logs") as eng:
        eng.start(engine_config(a, tmp_path / "ck"))
        assert eng.prestart(engine_config(bad, tmp_path / "ck"))
        time.sleep(2.5)
        try:
            eng.start(engine_config(bad, tmp_path / "ck"))
        except Exception as exc:  # the ordinary start meets the engine's fault: that one is the crash
            assert "K=4" in str(exc)
        assert eng.crashes == 1 and eng.hot_starts == 0
        assert [e["event"] for e in eng.events] == ["prestarted engine failed"]


def test_a_prestarted_engine_warms_up_in_the_background_and_a_failed_warm_up_is_not_a_crash(tmp_path):
    warming = "tests.example_engines:WarmingRestartEngine"
    rng = np.random.default_rng(5)
    a, b, bad = _case(rng, 1), _case(rng, 2), _case(rng, 5)  # K=5: its warm-up raises
    with IsolatedEngine(warming, spare=True, log_dir=tmp_path / "logs") as eng:
        eng.start(engine_config(a, tmp_path / "ck"))
        assert eng.call("warm_ups_here") == 1  # an ordinary start warms up too, in the foreground
        assert [e["event"] for e in eng.events] == ["engine warmed up"]
        eng.events.clear()
        assert eng.prestart(engine_config(b, tmp_path / "ck"))
        _await_prestart(eng, more_s=2.0)  # the start (2 s), then the warm-up (1 s)
        before = eng.seconds["start"]
        eng.start(engine_config(b, tmp_path / "ck"))
        assert eng.seconds["start"] - before < 1.0 and eng.hot_starts == 1
        assert eng.call("warm_ups_here") == 1
        assert [e["event"] for e in eng.events] == ["prestarted engine warmed up"]
        assert eng.events[0]["seconds"] == 1.0
        eng.events.clear()
        # its samples follow its tables as after any prestart
        outs = eng.generate([Request(b.prompt, b.params, s) for s in range(5)])
        assert {o.token_ids for o in outs} == {_greedy(b.target_table, 1, 3)}
        assert eng.prestart(engine_config(bad, tmp_path / "ck"))
        _await_prestart(eng, more_s=2.0)
        hot_pid = eng._hot["proc"].pid
        eng.start(engine_config(bad, tmp_path / "ck"))  # the warm-up failed: an ordinary start
        assert eng.crashes == 0 and eng.hot_starts == 1 and eng.pid != hot_pid
        # whose own warm-up fails the same way: not a crash either, started again without one
        assert [e["event"] for e in eng.events] == ["prestarted engine failed", "engine warm-up failed; started again without one"]
        assert eng.events[0]["detail"].startswith("warm-up:") and "K=5" in eng.events[0]["detail"]
        assert "engine fault in its warm-up" in eng.events[0]["log_tail"]  # the child's traceback
        assert "K=5" in eng.events[1]["detail"] and "engine fault in its warm-up" in eng.events[1]["log_tail"]
        assert eng.call("warm_ups_here") == 0
        outs = eng.generate([Request(bad.prompt, bad.params, s) for s in range(5)])
        assert {o.token_ids for o in outs} == {_greedy(bad.target_table, 1, 3)}


def test_an_ordinary_start_s_warm_up_counts_as_starting_and_a_fresh_start_runs_none(tmp_path):
    """An engine with a ``warm_up`` (SGLang: the sampler paths it compiles on first use, 82-88 s
    of a cold H100's first families) runs it after every ordinary start, its seconds counted as
    starting; a fresh start (a confirmation's) runs none."""
    warming = "tests.example_engines:WarmingRestartEngine"
    rng = np.random.default_rng(6)
    a = _case(rng, 1)
    with IsolatedEngine(warming, log_dir=tmp_path / "logs") as eng:
        eng.start(engine_config(a, tmp_path / "ck"))
        assert eng.call("warm_ups_here") == 1 and eng.seconds["start"] >= 3.0  # 2-s start, 1-s warm-up
        assert [(e["event"], e["seconds"]) for e in eng.events] == [("engine warmed up", 1.0)]
        eng.start(engine_config(a, tmp_path / "ck"), fresh=True)
        assert eng.call("warm_ups_here") == 0 and eng.starts == 2 and len(eng.events) == 1


def test_no_prestart_without_spares_swaps_or_a_new_process_per_start(tmp_path):
    rng = np.random.default_rng(3)
    cfg = engine_config(_case(rng, 2), tmp_path / "ck")
    with IsolatedEngine(ENGINE, log_dir=tmp_path / "logs") as eng:  # no spare processes
        assert not eng.prestart(cfg)
    with IsolatedEngine(ENGINE, spare=True, swap=False, log_dir=tmp_path / "logs") as eng:
        assert not eng.prestart(cfg)
    with IsolatedEngine("reference", spare=True, log_dir=tmp_path / "logs") as eng:  # restarts in-process
        assert not eng.prestart(cfg)


def test_a_campaign_prestarts_each_next_search_and_stores_nothing_on_a_correct_engine(tmp_path):
    """A campaign on a slow-starting, correct engine with spare engines and prestarts on:
    searches after the first start on a prestarted engine (swapped to their own tables and
    checked), the totals count them, and nothing is stored."""
    cfg = CampaignConfig(engine=ENGINE, budget_s=30, corpus_dir=tmp_path / "c", methods=("draft_model", "ngram"),
                         work_dir=tmp_path / "wd", max_samples=200, max_k=3, spare_engines=True, prestart=True)
    camp = Campaign(cfg)
    stats = camp.run()
    eng = json.loads((tmp_path / "c" / ".specfuzz" / "state.json").read_text())["totals"]["engine"]
    assert stats.searches >= 2 and eng["prestarts"] >= 2 and eng["hot_starts"] >= 1
    assert eng["hot_starts"] <= eng["starts"] and eng["hot_starts"] <= eng["prestarts"]
    assert stats.findings_new == 0 and not list((tmp_path / "c").glob("*.json"))
    # the confirmation and speculation-off engines got a warmed-up process from the start,
    # though a correct engine never needed them (their first start would not wait for imports)
    assert camp._fresh_engine._spawned == 1 and camp._spec_off_engine._spawned == 1 and camp._fresh_engine.starts == 0
    off = Campaign(CampaignConfig(engine=ENGINE, budget_s=5, corpus_dir=tmp_path / "d", methods=("ngram",),
                                  work_dir=tmp_path / "wd2", max_samples=100, spare_engines=True, prestart=False))
    off.run()
    assert off.totals["engine"]["prestarts"] == 0


def test_a_discarded_engine_process_is_killed_at_once_and_a_closed_one_shuts_down(tmp_path):
    """A process ended to make way for another (a restart, a fresh confirmation done) is killed
    with its group at once; close() otherwise lets the engine shut down."""
    rng = np.random.default_rng(4)
    a, b = _case(rng, 1), _case(rng, 2)
    with IsolatedEngine("tests.example_engines:SlowCloseEngine", log_dir=tmp_path / "logs") as eng:
        eng.start(engine_config(a, tmp_path / "ck"))
        first = eng._proc
        t0 = time.monotonic()
        eng.start(engine_config(b, tmp_path / "ck"))  # a new config: the old process is discarded
        assert not first.is_alive() and eng.starts == 2
        assert time.monotonic() - t0 < 8.0  # the new start's 2 s (and a spawn), not the old one's 8-s shutdown too
        t0 = time.monotonic()
        eng.close()
        assert time.monotonic() - t0 >= 8.0  # asked to shut down, and it did


def test_a_search_slice_counts_sampling_not_its_engines_start(tmp_path, monkeypatch):
    """A search's slice counts the time its families sample, not its engine's start: with a
    start (2 s, and its process's imports) longer than the slice (3 s here; on the H200 SGLang's 25-60 s starts against
    a 41-s slice), the first search still runs several families, not one."""
    import specfuzz.fuzz.campaign as campaign

    monkeypatch.setattr(campaign, "SEARCH_SLICE_MIN_S", 3.0)
    monkeypatch.setattr(campaign, "SLICE_START_FACTOR", 0.5)
    monkeypatch.setattr(campaign, "FIRST_START_GUESS_S", 2.0)
    cfg = CampaignConfig(engine=ENGINE, budget_s=16, corpus_dir=tmp_path / "c", methods=("draft_model", "ngram"),
                         work_dir=tmp_path / "wd", max_samples=200, max_k=3, spare_engines=False, prestart=False)
    camp = Campaign(cfg)
    assert camp._slice_s() == 3.0
    stats = camp.run()
    fams = [json.loads(x) for x in (tmp_path / "c" / ".specfuzz" / "families.jsonl").read_text().splitlines()]
    by_search: dict[int, list] = {}
    for f in fams:
        if f["role"] == "search":
            by_search.setdefault(f["search"], []).append(f)
    # searches whose engine start (a new process: imports, then 2 s) outlasted the whole slice
    slow = [fs for fs in by_search.values() if fs[0]["seconds"]["start"] >= 3.0]
    assert slow and max(len(fs) for fs in slow) >= 3
    assert stats.searches >= 2 and stats.findings_new == 0


def test_a_search_slice_is_longer_with_more_workers_since_they_share_the_methods(tmp_path, monkeypatch):
    """The slice's cap keeps every method searched about twice over the campaign: budget x
    workers / (2 x methods), since W workers start at methods spread over the n. With one
    worker's cap (budget / (2 x methods)) three workers' slices were a third as long as their
    coverage needed: on the H200 (SGLang, 960 s, 6 methods) 80-s slices after ~30-s starts."""
    import specfuzz.fuzz.campaign as campaign

    monkeypatch.setattr(campaign, "SLICE_START_FACTOR", 1000.0)  # the cap decides
    slices = {}
    for workers in (1, 3):
        cfg = CampaignConfig(engine=ENGINE, budget_s=600, corpus_dir=tmp_path / f"c{workers}", methods=("draft_model", "ngram"),
                             work_dir=tmp_path / f"wd{workers}", max_samples=200, max_k=3, spare_engines=False, prestart=False,
                             worker=0, workers=workers)
        slices[workers] = Campaign(cfg)._slice_s()
    assert slices == {1: 600 / (2 * 2), 3: 600 * 3 / (2 * 2)}


def _refusing_campaign(tmp_path, budget_s: float):
    """A campaign on RefusingRestartEngine (every swap refused, a 2-s restart instead): its stats,
    its search families by search index, and its events."""
    cfg = CampaignConfig(engine="tests.example_engines:RefusingRestartEngine", budget_s=budget_s, corpus_dir=tmp_path / "c",
                         methods=("draft_model", "ngram"), work_dir=tmp_path / "wd", max_samples=200, max_k=3,
                         spare_engines=False, prestart=False)
    stats = Campaign(cfg).run()
    state = tmp_path / "c" / ".specfuzz"
    by_search: dict[int, list] = {}
    for f in (json.loads(x) for x in (state / "families.jsonl").read_text().splitlines()):
        if f["role"] == "search":
            by_search.setdefault(f["search"], []).append(f)
    return stats, by_search, [json.loads(x) for x in (state / "events.jsonl").read_text().splitlines()]


def test_a_search_slice_counts_restarts_after_its_opening_start(tmp_path, monkeypatch):
    """Restarts after a search's opening start count against its slice: on an engine that
    refuses every swap (each family restarts it, 2 s here; SGLang with a reduced EAGLE-3 draft
    vocabulary on the H200: 11 restarts, 394 s of one search), a search ends after its slice
    and the campaign goes on to other searches, instead of one search restarting the engine
    for every family of the budget."""
    import specfuzz.fuzz.campaign as campaign

    monkeypatch.setattr(campaign, "SEARCH_SLICE_MIN_S", 3.0)
    monkeypatch.setattr(campaign, "SLICE_START_FACTOR", 0.5)
    monkeypatch.setattr(campaign, "FIRST_START_GUESS_S", 2.0)
    stats, by_search, events = _refusing_campaign(tmp_path, 32)
    restarted = [fs for fs in by_search.values() if len(fs) > 1]
    # every family restarted, unless it loaded nothing: a family that repeats the running tables
    # (Hypothesis can draw one twice) needs no start and no swap (on the loaded 2-core CI machine,
    # 2026-12-04, a family of a restarted search started in under 2 s)
    fams_r = [f for fs in restarted for f in fs]
    assert restarted and all(f["seconds"]["start"] >= 2.0 or f["seconds"]["start"] == f["seconds"]["swap"] == 0.0
                             for f in fams_r), [(f["seconds"]["start"], f["seconds"]["swap"]) for f in fams_r]
    for fs in by_search.values():
        # the slice (3 s) counted every restart after the first family: at most one more
        # family (its restart and samples) once the slice was over
        after_opening = sum(f["wall_s"] for f in fs[1:])
        assert after_opening <= 3.0 + 2 * 2.0 + 2.0, [round(f["wall_s"], 2) for f in fs]
    # more than one search: the first ended after its slice (a slow run of the 2-core machine,
    # 2026-12-05, had 2 searches in 24 s)
    assert stats.searches >= 2 and len(by_search) >= 2
    assert any(e["event"] == "swap refused" for e in events)


def test_a_search_whose_swaps_the_engine_refuses_twice_in_a_row_ends_there(tmp_path, monkeypatch):
    """With slices long enough for many restarts, a search whose swaps the engine refuses ends
    after the second refusal in a row (each further family would restart the engine: SGLang
    with a reduced EAGLE-3 draft vocabulary on the H200, 2026-12-06, ran 5 families on 5 starts,
    180 s of a 907-s worker) and the campaign goes on to the next search."""
    import specfuzz.fuzz.campaign as campaign

    monkeypatch.setattr(campaign, "SEARCH_SLICE_MIN_S", 120.0)  # the slice cannot be what ends a search
    monkeypatch.setattr(campaign, "FIRST_START_GUESS_S", 2.0)
    stats, by_search, events = _refusing_campaign(tmp_path, 40)
    ended = [e for e in events if e["event"] == "search ended by refused swaps"]
    assert ended and all(e["refused"] == 2 for e in ended)
    refused = {}
    for e in events:
        if e["event"] == "swap refused":
            refused[e["search"]] = refused.get(e["search"], 0) + 1
    # a search ends at its second refused swap: never a third (its opening family needs no swap,
    # a family repeating the running tables none either)
    assert refused and max(refused.values()) <= 2, refused
    assert stats.searches >= 2 and len(by_search) >= 2 and {e["search"] for e in ended} <= set(by_search)


def test_the_next_search_s_speculation_off_engine_is_prestarted_once_one_has_run(tmp_path):
    """Once candidates have needed the speculation-off engine, the next search's one is
    prestarted along with its search engine, and that search's speculation-off check takes it
    by a swap instead of waiting for a start (on the H200, SGLang: ~22 s per search); before
    any has run, none is prestarted."""
    from specfuzz.engines.base import swap_key as key_of
    from specfuzz.fuzz.campaign import simplest_family

    cfg = CampaignConfig(engine=ENGINE, budget_s=60, corpus_dir=tmp_path / "c", methods=("draft_model", "ngram"),
                         work_dir=tmp_path / "wd", max_samples=100, max_k=3, spare_engines=True, prestart=True)
    camp = Campaign(cfg)
    camp._profile = camp.engine.capabilities().profile
    ck = tmp_path / "wd" / "checkpoints"

    def first_case(index):
        return simplest_family(camp._strategy(camp._shape(index)))[0]

    def off_key(index):
        return key_of(engine_config(first_case(index), ck, speculation=False))

    # three consecutive searches whose speculation-off engines need different starts (vocabularies)
    index = next(i for i in range(1, 40) if len({off_key(i), off_key(i + 1), off_key(i + 2)}) == 3)
    try:
        camp.search_index = index
        camp._prestart_next()
        assert camp._spec_off_engine.prestarts == 0  # no speculation-off engine has run yet
        camp._calibrate(first_case(index), seed=1, alpha=1e-3)
        off = camp._spec_off_engine
        assert off.starts == 1 and off.hot_starts == 0
        camp._prestart_next()
        assert off.prestarts == 1
        _await_prestart(off)
        camp.search_index = index + 1
        # The search's first family prestarts the engines of the search after it: the
        # speculation-off one waits, since the one prestarted for this search is not taken yet.
        camp._prestart_next()
        assert off.prestarts == 1 and off.prestarted_key() == off_key(index + 1)
        camp._calibrate(first_case(index + 1), seed=2, alpha=1e-3)
        assert off.starts == 2 and off.hot_starts == 1  # its start was the prestarted engine
        # once taken, the next search's is prestarted
        assert off.prestarts == 2 and off.prestarted_key() == off_key(index + 2)
        # A shrunk failure on another vocabulary: its speculation-off check is prestarted
        # (ahead of its fresh confirmation) and takes it; the next search's comes after.
        V = first_case(index + 1).vocab_size
        other = next(first_case(i) for i in range(index + 3, index + 60)
                     if first_case(i).vocab_size != V and off_key(i) != off_key(index + 2))
        _await_prestart(off)
        camp._prestart_calibration(other)
        assert off.prestarts == 3 and off.prestarted_key() == key_of(engine_config(other, ck, speculation=False))
        _await_prestart(off)
        camp._calibrate(other, seed=3, alpha=1e-3)
        assert off.starts == 3 and off.hot_starts == 2
        assert off.prestarts == 4 and off.prestarted_key() == off_key(index + 2)
    finally:
        for e in camp._engines:
            e.close()


def test_a_campaign_prestarts_the_speculation_off_engine_of_each_next_search(tmp_path):
    """A whole campaign on a slow-starting engine with a calibration bug: the speculation-off
    engine is prestarted for the searches after the first candidate (whether a search uses it
    depends on what it draws: the test above checks that one is taken), and shrinking is
    logged as such in the family log."""
    cfg = CampaignConfig(engine="tests.example_engines:SlowRestartTemperatureBugEngine", budget_s=45,
                         corpus_dir=tmp_path / "c", methods=("draft_model", "ngram"), work_dir=tmp_path / "wd",
                         max_samples=200, max_k=3, spare_engines=True, prestart=True)
    camp = Campaign(cfg)
    stats = camp.run()
    off = camp._spec_off_engine
    assert stats.searches >= 2 and off is not None and off.starts >= 1
    assert off.prestarts >= 1, (off.starts, off.prestarts, off.hot_starts)
    fams = [json.loads(x) for x in (tmp_path / "c" / ".specfuzz" / "families.jsonl").read_text().splitlines()]
    assert any(f["role"] == "calibration" for f in fams)
    assert any(f["role"] == "shrink" for f in fams)  # the calibration bug's shrink, logged as such
    # the shrink's seconds, split as the rest: its parts add up to it
    eng = json.loads((tmp_path / "c" / ".specfuzz" / "state.json").read_text())["totals"]["engine"]
    parts = eng["shrink_seconds"]
    assert eng["seconds"]["shrink"] > 0 and parts["sample"] > 0
    assert sum(parts.values()) == pytest.approx(eng["seconds"]["shrink"], rel=1e-6)


@pytest.mark.parametrize("prestart", [True, False])
def test_the_campaign_s_greedy_shrinker_starts_each_smaller_vocabulary_in_the_background(tmp_path, prestart):
    """On an engine that restarts for a smaller vocabulary (SGLang: ~20-25 s a start), the
    greedy shrinker tries the reductions that keep the vocabulary while the next smaller one
    starts in the background, so its starts are prestarted ones; it still reaches V=2, and the
    next search's engine is prestarted again afterwards. With --no-prestart (whose memory split
    leaves no room for one) it prestarts nothing."""
    from specfuzz.oracle.speculative import SpecConfig

    cfg = CampaignConfig(engine="tests.example_engines:SlowRestartTemperatureBugEngine", budget_s=60,
                         corpus_dir=tmp_path / "c", methods=("draft_model",), work_dir=tmp_path / "wd",
                         max_samples=2000, max_k=3, spare_engines=True, prestart=prestart)
    camp = Campaign(cfg)
    rng = np.random.default_rng(11)
    case = Case(rng.normal(0, 2, (4, 4)).astype(np.float32), (0,), SamplingParams(temperature=0.3, max_tokens=2),
                spec=SpecConfig(method="draft_model", num_speculative_tokens=1),
                draft_table=rng.normal(0, 2, (4, 4)).astype(np.float32))
    try:
        camp.search_index = 1
        camp.shape = camp._shape(1)  # spare processes on, as in a campaign
        camp._prestart_due = False
        run = camp._run([case], [1e-3], 1, speculation=True)[0]
        assert run.failed  # the engine ignores the temperature
        small, conf, j, res = camp._greedy_shrink(run, None, None, True, budget_s=120, seed=3)
        eng = camp.engine
        assert small.case.vocab_size == 2 and conf is not None and conf.failed, res.steps
        ev = [json.loads(x) for x in (tmp_path / "c" / ".specfuzz" / "events.jsonl").read_text().splitlines()]
        g = [e for e in ev if e["event"] == "greedy shrink"][-1]
        if not prestart:
            assert g["starts"] >= 2 and g["prestarted"] == 0 and eng.prestarts == 0, g
            return
        assert g["starts"] >= 2 and g["prestarted"] >= 1, g
        # the smallest case's fresh confirmation took the engine started for it in the
        # background when the shrinker kept it (one fresh prestart per kept reduction)
        fresh = camp._fresh_engine
        assert fresh is not None and fresh.starts == 1 and fresh.hot_starts == 1, (fresh.starts, fresh.hot_starts)
        assert fresh.prestarts == len(res.steps) >= 2
        # after it, the next search's engine is the one prestarting
        nxt = simplest_family_of(camp, 2)
        assert eng.prestarted_key() == swap_key(engine_config(nxt, tmp_path / "wd" / "checkpoints"))
    finally:
        for e in camp._engines:
            e.close()


def simplest_family_of(camp: Campaign, index: int) -> Case:
    from specfuzz.fuzz.campaign import simplest_family

    return simplest_family(camp._strategy(camp._shape(index)))[0]


def test_a_fresh_start_begun_early_serves_only_a_fresh_start_of_its_own_config(tmp_path):
    """prestart(fresh=True): a confirmation's fresh engine started in the background on exactly
    its case. It runs no warm-up, serves no ordinary start (not even of its own swap key) and
    no fresh start of another config (which ends it); taken by its own fresh start, it is an
    engine started once, on its own tables, in a process no engine ran in before."""
    warming = "tests.example_engines:WarmingRestartEngine"
    rng = np.random.default_rng(11)
    a, b, b2 = _case(rng, 1), _case(rng, 2), _case(rng, 2)  # b and b2: one start shape, other tables
    cfg_a, cfg_b, cfg_b2 = (engine_config(c, tmp_path / "ck") for c in (a, b, b2))
    with IsolatedEngine(warming, spare=True, log_dir=tmp_path / "logs") as eng:
        eng.start(cfg_a)
        assert eng.prestart(cfg_b, fresh=True) and eng.prestarted_fresh() == cfg_b
        assert eng.prestarted_key() is None  # not a start shape's prestart
        assert eng.prestart(cfg_b, fresh=True) and eng.prestarts == 1  # the same one
        _await_prestart(eng, more_s=1.5)
        eng.start(cfg_b2)  # an ordinary start of the same swap key: not served by it
        assert (eng.starts, eng.hot_starts) == (2, 0) and eng.prestarted_fresh() == cfg_b
        eng.start(cfg_b2, fresh=True)  # a fresh start of another config: ends it, starts anew
        assert (eng.starts, eng.hot_starts) == (3, 0) and eng.prestarted_fresh() is None
        # (the two ordinary starts ran the engine's warm-up, the fresh one none)
        assert [e["event"] for e in eng.events] == ["engine warmed up"] * 2 + ["prestarted engine unused"]
        eng.events.clear()
        assert eng.prestart(cfg_b, fresh=True) and eng.prestarts == 2
        hot_pid = eng._hot["proc"].pid
        _await_prestart(eng, more_s=1.5)
        before = eng.seconds["start"]
        eng.start(cfg_b, fresh=True)
        assert eng.seconds["start"] - before < 1.0  # (a start on demand takes 2 s)
        assert (eng.starts, eng.hot_starts, eng.swaps) == (4, 1, 0) and eng.pid == hot_pid
        assert eng.call("starts_here") == (hot_pid, 1) and eng.call("warm_ups_here") == 0
        assert eng.events == []
        outs = eng.generate([Request(b.prompt, b.params, s) for s in range(10)])
        assert {o.token_ids for o in outs} == {_greedy(b.target_table, 1, 3)}
        # ended unused on request, logged as such
        assert eng.prestart(cfg_a, fresh=True)
        unused = eng._hot["proc"]
        eng.end_prestart("the candidate passed again")
        unused.join(10)
        assert not unused.is_alive() and eng.prestarted_fresh() is None
        assert eng.events[-1]["event"] == "prestarted engine unused" and eng.events[-1]["detail"] == "the candidate passed again"


def test_launch_args_are_asked_once_per_config_not_of_a_new_process_each_time(tmp_path):
    """A family's launch record (the adapter's launch_args) is kept per engine and config:
    asked again, it takes no process (after a prestart took the spare, asking meant waiting
    for a new process's imports before the fresh start it was recorded for)."""
    from specfuzz.fuzz.run import launch_record

    rng = np.random.default_rng(12)
    a, b = _case(rng, 1), _case(rng, 2)
    cfg_a, cfg_b = engine_config(a, tmp_path / "ck"), engine_config(b, tmp_path / "ck")
    spec = "tests.example_engines:LaunchingEngine"
    with IsolatedEngine(spec, log_dir=tmp_path / "l1") as eng:
        first = launch_record(eng, cfg_a)
        assert eng.pid is not None and first["env"]["LAUNCHING_MODE"] == "exact"
    with IsolatedEngine(spec, log_dir=tmp_path / "l2") as other:
        again = launch_record(other, cfg_a)
        assert other.pid is None  # answered from what the first engine asked
        assert again == first
        again["kwargs"]["dtype"] = "changed"  # a caller's copy: the kept answer stays as it was
        assert launch_record(other, cfg_a)["kwargs"]["dtype"] == first["kwargs"]["dtype"]
        launch_record(other, cfg_b)  # another config is asked of an engine process
        assert other.pid is not None
    with IsolatedEngine(ENGINE, log_dir=tmp_path / "l3") as plain:
        assert launch_record(plain, cfg_a) is None and launch_record(plain, cfg_a) is None  # no launch_args


def test_a_candidate_s_fresh_confirmation_engine_starts_while_it_is_checked(tmp_path):
    """In a campaign, a candidate's fresh confirmation engine is prestarted on exactly its case
    before its speculation-off check and its second screening; the confirmation takes it.
    One that passed when screened again ends it unused."""
    from specfuzz.fuzz.run import run_family

    cfg = CampaignConfig(engine=ENGINE, budget_s=60, corpus_dir=tmp_path / "c", methods=("draft_model",),
                         work_dir=tmp_path / "wd", max_samples=100, max_k=3, spare_engines=True, prestart=True)
    camp = Campaign(cfg)
    camp._profile = camp.engine.capabilities().profile
    rng = np.random.default_rng(13)
    case = _case(rng, 2)
    try:
        camp._prestart_fresh(case, True)
        fresh = camp._fresh_engine
        assert fresh is not None and fresh.prestarts == 1 and fresh.prestarted_fresh() is not None
        _await_prestart(fresh)
        camp._calibrate(case, seed=1, alpha=1e-3)  # meanwhile: the speculation-off check
        run = run_family(camp.engine, [case], ckpt_root=tmp_path / "wd" / "checkpoints", alphas=[1e-3], max_samples=100)[0]
        conf, _ = camp._confirm(run, True)
        assert conf.judgement is not None and not conf.failed
        assert (fresh.starts, fresh.hot_starts) == (1, 1)
        assert fresh.seconds["start"] < 1.0  # (a start on demand takes 2 s)
        camp._prestart_fresh(_case(rng, 1), True)
        hot = fresh._hot["proc"]
        camp._end_fresh_prestart("the candidate passed when screened again")
        hot.join(10)
        assert not hot.is_alive() and fresh.prestarted_fresh() is None
        # with prestarts off, none
        camp.cfg.prestart = False
        camp._prestart_fresh(_case(rng, 1), True)
        assert fresh.prestarts == 2
    finally:
        for e in camp._engines:
            e.close()


def test_a_campaign_s_confirmations_take_their_fresh_engine_started_ahead(tmp_path):
    """A whole campaign on a slow-starting engine with a speculation bug (N6): its first
    candidate's fresh confirmation takes the engine prestarted on exactly its case while the
    candidate was checked (speculation off, screened again), and the failure is still
    confirmed, shrunk and stored."""
    cfg = CampaignConfig(engine=ENGINE, engine_kwargs={"inject": "N6"}, budget_s=40, corpus_dir=tmp_path / "c",
                         methods=("ngram",), work_dir=tmp_path / "wd", spare_engines=True, prestart=True, seed=1)
    camp = Campaign(cfg)
    stats = camp.run()
    fresh = camp._fresh_engine
    assert stats.findings_new >= 1 and stats.stored, stats
    assert fresh is not None and fresh.prestarts >= 1 and fresh.hot_starts >= 1, (fresh.starts, fresh.prestarts, fresh.hot_starts)
    fams = [json.loads(x) for x in (tmp_path / "c" / ".specfuzz" / "families.jsonl").read_text().splitlines()]
    assert any(f["role"] == "fresh" and f["failed"] for f in fams)


def test_a_candidate_s_fresh_confirmation_is_started_ahead_with_speculation_off_where_calibration_bugs_prevail(tmp_path, monkeypatch):
    """Where most candidates this run confirmed were calibration bugs (the target's sampler
    fails with speculation off too: SGLang's penalties on the H200), the next candidate's fresh
    confirmation engine is started ahead with speculation off; started with speculation on
    (before), it went unused whenever the candidate turned out a calibration bug (6 of 14 fresh
    starts on the H200, 2026-12-04) and the confirmation started cold. When the speculation-off
    check says otherwise, the other kind is started at once, and the confirmation takes it."""
    calls: list[tuple[dict, bool]] = []
    real = Campaign._prestart_fresh

    def spy(self, case, speculation):
        calls.append((case.to_json(), speculation))
        return real(self, case, speculation)

    monkeypatch.setattr(Campaign, "_prestart_fresh", spy)
    cfg = CampaignConfig(engine="tests.example_engines:SlowRestartTemperatureBugEngine", budget_s=30,
                         corpus_dir=tmp_path / "c", methods=("draft_model",), work_dir=tmp_path / "wd",
                         max_samples=400, max_k=3, spare_engines=True, prestart=True, seed=3)
    camp = Campaign(cfg)
    camp._confirmed_kinds = [0, 1]  # as after one calibration bug confirmed earlier in the run
    camp.run()
    assert calls and calls[0][1] is False  # the first candidate's, with speculation off
    fams = [json.loads(x) for x in (tmp_path / "c" / ".specfuzz" / "families.jsonl").read_text().splitlines()]
    first = next(f for f in fams if f["role"] == "fresh")
    if first["method"] is not None:  # its speculation-off check passed: the other kind, started at once
        assert calls[1] == (calls[0][0], True)
    fresh = camp._fresh_engine
    assert fresh is not None and fresh.hot_starts >= 1, (fresh.starts, fresh.prestarts, fresh.hot_starts)


def test_hypothesis_shrink_on_a_shape_whose_swaps_are_refused_runs_no_restarts(tmp_path):
    """Shrinking a failure on a start shape whose swaps the engine refuses: Hypothesis's
    candidates with other tables would each restart the engine, one after the other (SGLang,
    reduced EAGLE-3 draft vocabulary, H100 2026-12-06: 4 starts, 140 s); they are left to the
    greedy shrinker (its starts prestarted), and the failure is still shrunk and stored."""
    cfg = CampaignConfig(engine="tests.example_engines:RefusingBugEngine", budget_s=40, corpus_dir=tmp_path / "c",
                         methods=("draft_model",), work_dir=tmp_path / "wd", max_samples=2000, max_k=3, seed=1,
                         spare_engines=False, prestart=False, max_findings=1, steer=False)
    stats = Campaign(cfg).run()
    state = tmp_path / "c" / ".specfuzz"
    fams = [json.loads(x) for x in (state / "families.jsonl").read_text().splitlines()]
    events = [json.loads(x) for x in (state / "events.jsonl").read_text().splitlines()]
    found = sorted((tmp_path / "c").glob("finding-*.json"))
    assert found, stats
    assert any(e["event"] == "shrink candidates needing a restart left to the greedy shrinker" for e in events), \
        sorted({e["event"] for e in events})
    # Hypothesis's shrink candidates run as families of the role "shrink" on the search engine:
    # none of them restarted it (the greedy shrinker's candidates run through its reproducer)
    shrink = [f for f in fams if f["role"] == "shrink"]
    assert all(f["seconds"]["start"] == 0.0 for f in shrink), [(f["search"], f["seconds"]) for f in shrink]
    assert any(e["event"] == "greedy shrink" for e in events)


def test_an_error_of_the_search_s_own_code_is_logged_not_swallowed(tmp_path, monkeypatch):
    """Hypothesis takes an exception of specfuzz's search code for a second bug; while shrinking it
    may report the first and end the shrink without a word (a TypeError in the refused-swap check
    did so, 2026-12-06). The campaign logs it (event and traceback) and goes on."""
    def broken(self, eng, family, speculation):
        raise TypeError("'EngineConfig' object is not callable")

    monkeypatch.setattr(Campaign, "_needs_restart", broken)
    cfg = CampaignConfig(engine="tests.example_engines:RefusingBugEngine", budget_s=40, corpus_dir=tmp_path / "c",
                         methods=("draft_model",), work_dir=tmp_path / "wd", max_samples=2000, max_k=3, seed=1,
                         spare_engines=False, prestart=False, max_findings=1, steer=False)
    Campaign(cfg).run()
    events = [json.loads(x) for x in (tmp_path / "c" / ".specfuzz" / "events.jsonl").read_text().splitlines()]
    raised = [e for e in events if e["event"] == "search code raised"]
    assert raised and "TypeError: 'EngineConfig' object is not callable" in raised[0]["traceback"], events


def test_the_restart_check_of_a_shrink_candidate_sees_its_whole_family(tmp_path):
    """Campaign._needs_restart computes a candidate family's config as run_family does: the
    context length holds every pattern's prompt, so a family whose second pattern has a long
    prompt is served by the engine running it (the first pattern alone would ask for a shorter
    context, another config: a needless restart refused), and one that needs a longer context
    than the running engine's is not."""
    rng = np.random.default_rng(3)
    short = _case(rng, 2)
    long = short.with_(prompt=tuple([0, 1] * 40))
    cfg = CampaignConfig(engine="reference", budget_s=30, corpus_dir=tmp_path / "c", methods=("draft_model",),
                         work_dir=tmp_path / "wd", max_samples=50)
    camp = Campaign(cfg)
    camp._profile = camp.engine.capabilities().profile
    try:
        camp._run([short, long], [camp.cfg.screen_alpha] * 2, seed=1)
        assert not camp._needs_restart(camp.engine, [short, long], True)
        assert camp._needs_restart(camp.engine, [short], True)  # a 64-token context, not the running 128
        assert camp._needs_restart(camp.engine, [short, short.with_(prompt=tuple([0, 1] * 70))], True)
    finally:
        for e in camp._engines:
            e.close()
