"""A stored calibration bug met again under another speculation method is seen again, not
shrunk and stored once more (Campaign._known_calibration, corpus.calibration_key)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from specfuzz.case import Case
from specfuzz.fuzz.campaign import Campaign, CampaignConfig
from specfuzz.fuzz.corpus import Corpus, Entry, active_features, calibration_key, reduced_to_features, signature

REPO = Path(__file__).resolve().parents[1]


def _case(method: str, **params) -> Case:
    base = Case.from_json(json.loads((REPO / "corpus" / "regression" / "regression-N1.json").read_text())["case"])
    table = np.array([[2.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    spec = base.spec.__class__.from_json({**base.spec.to_json(), "method": method})
    return base.with_(target_table=table, params=base.params.__class__.from_json({**base.params.to_json(), **params}),
                      spec=spec, draft_table=table.copy() if method == "draft_model" else None)


def _store_calibration(corpus: Path, engine_name: str, case: Case) -> Path:
    entry = Entry(kind="calibration", engine={"name": engine_name}, case=case.to_json(), evidence="stored by the test")
    path, new = Corpus(corpus).store(entry)
    assert new
    return path


def test_calibration_key_ignores_the_speculation_method_but_not_the_sampling_features():
    a, b = _case("draft_model", temperature=0.5).to_json(), _case("ngram", temperature=0.5).to_json()
    assert signature("calibration", "e", a, None) != signature("calibration", "e", b, None)  # signatures keep the method
    assert calibration_key("e", a) == calibration_key("e", b)
    assert calibration_key("e", a) != calibration_key("e", _case("ngram", temperature=0.5, top_k=1).to_json())
    assert calibration_key("e", a) != calibration_key("other", a)
    both = _case("ngram", temperature=0.5, top_k=1).to_json()
    assert active_features(both) == ["temperature", "top_k"]
    assert calibration_key("e", reduced_to_features(both, ["temperature"])) == calibration_key("e", a)


def test_a_stored_calibration_bug_met_under_another_method_is_seen_again_and_not_shrunk(tmp_path):
    corpus = tmp_path / "corpus"
    stored = _store_calibration(corpus, "temperature-bug", _case("draft_model", temperature=0.5))
    camp = Campaign(CampaignConfig(engine="example_engines:TemperatureBugEngine", corpus_dir=corpus,
                                   work_dir=tmp_path / "work", budget_s=60))
    camp._profile = camp.engine.capabilities().profile  # as a search's start shape sets it
    try:
        run = camp._run([_case("ngram", temperature=0.5)], [camp.cfg.screen_alpha], seed=11)[0]
        assert run.failed  # with speculation on, the candidate a search would shrink
        assert camp._known_calibration(run, seed=12)
        assert Entry.from_json(json.loads(stored.read_text())).times_seen == 2
        assert camp.stats.calibration_known == 1 and camp.stats.confirmations == 1
        assert camp._fresh_engine is None  # a known bug is confirmed on the running speculation-off engine
        # Met again in the same run: recognised again, marked (and confirmed) once per run.
        assert camp._known_calibration(run, seed=13)
        assert Entry.from_json(json.loads(stored.read_text())).times_seen == 2
        assert camp.stats.calibration_known == 2 and camp.stats.confirmations == 1
        # More features than the stored entry: recognised when the case with the others back at
        # their defaults (the stored entry's features) fails with speculation off as well.
        more = camp._run([_case("ngram", temperature=0.5, top_p=0.99)], [camp.cfg.screen_alpha], seed=14)[0]
        assert more.failed and camp._known_calibration(more, seed=15)
        assert camp.stats.calibration_known == 3
        # top_k=1 is argmax: ignoring the temperature changes nothing, speculation off agrees with μ.
        argmax = camp._run([_case("ngram", temperature=0.5, top_k=1)], [camp.cfg.screen_alpha], seed=16)[0]
        assert not camp._known_calibration(argmax, seed=17)
        # Features the stored entry does not have: nothing is run.
        checks = camp.stats.calibration_checks
        assert not camp._known_calibration(camp._run([_case("ngram", top_k=1)], [camp.cfg.screen_alpha], seed=18)[0], seed=19)
        assert camp.stats.calibration_checks == checks and camp.stats.calibration_known == 3
    finally:
        for e in camp._engines:
            e.close()
    assert sorted(p.name for p in corpus.glob("*.json")) == [stored.name]


def test_a_stored_calibration_bug_is_recognised_when_the_reduction_to_its_features_is_ambiguous(tmp_path):
    """The candidate (temperature, top_k, logit_bias, min_tokens) reduced to the stored entry's
    features (temperature, top_k) has a top-k tie the oracle refuses (its logit_bias broke it):
    the reductions that keep one more feature are tried, the one with logit_bias is run, fails
    with speculation off, and the stored entry is seen again."""
    corpus = tmp_path / "corpus"
    stored = _store_calibration(corpus, "temperature-bug", _case("draft_model", temperature=0.5, top_k=2))
    camp = Campaign(CampaignConfig(engine="example_engines:TemperatureBugEngine", corpus_dir=corpus,
                                   work_dir=tmp_path / "work", budget_s=60))
    camp._profile = camp.engine.capabilities().profile
    events = []
    camp.on_event = lambda msg, stats: events.append(msg)
    table = np.array([[2.0, -1.0, -1.0]] * 3, dtype=np.float32)  # tokens 1 and 2 tie for second place
    case = _case("ngram", temperature=0.5, top_k=2, logit_bias={1: -0.5}, min_tokens=1).with_(target_table=table, prompt=[1])
    with pytest.raises(Exception, match="tie"):
        Case.from_json(reduced_to_features(case.to_json(), ["temperature", "top_k"])).target_law(camp._profile).enumerate()
    try:
        run = camp._run([case], [camp.cfg.screen_alpha], seed=21)[0]
        assert run.failed
        assert camp._known_calibration(run, seed=22)
        assert camp.stats.calibration_known == 1
        assert Entry.from_json(json.loads(stored.read_text())).times_seen == 2
        # A stored entry whose every reduction is refused: said in the log, not recognised.
        tied = _case("ngram", temperature=0.5, top_k=2, presence_penalty=0.5).with_(target_table=table, prompt=[1])
        other = _store_calibration(corpus, "temperature-bug", _case("draft_model", top_k=2))
        camp._add_calibration(Entry.from_json(json.loads(other.read_text())), other)
        assert camp._reduced_calibration(tied.to_json(), ("top_k",), {"top_k", "temperature", "presence_penalty"}, 23) is None
        assert any("no reduction to the features ['top_k']" in m and "AmbiguousSemantics" in m for m in events)
    finally:
        for e in camp._engines:
            e.close()


def test_a_failure_shrunk_to_a_stored_calibration_entrys_features_is_not_stored_again(tmp_path):
    """A confirmed failure that fails with speculation off too and whose features are exactly a
    stored calibration entry's (the check for known calibration bugs missed it) marks that entry
    seen again instead of storing a second entry of the bug; other features are stored."""
    corpus = tmp_path / "corpus"
    stored = _store_calibration(corpus, "temperature-bug", _case("draft_model", temperature=0.5))
    camp = Campaign(CampaignConfig(engine="example_engines:TemperatureBugEngine", corpus_dir=corpus,
                                   work_dir=tmp_path / "work", budget_s=60))
    camp._profile = camp.engine.capabilities().profile
    events = []
    camp.on_event = lambda msg, stats: events.append(msg)
    table = np.array([[1.0, 0.0], [0.0, 0.5]], dtype=np.float32)  # another model than the stored entry's
    try:
        same = camp._run([_case("ngram", temperature=0.5).with_(target_table=table)], [camp.cfg.screen_alpha], seed=31)[0]
        assert same.failed
        camp._store_failure(same, same, 1)
        assert sorted(p.name for p in corpus.glob("*.json")) == [stored.name]
        assert Entry.from_json(json.loads(stored.read_text())).times_seen == 2
        assert any(f"shrunk to the features of {stored.name}" in m for m in events)
        more = camp._run([_case("ngram", temperature=0.5, top_p=0.99).with_(target_table=table)], [camp.cfg.screen_alpha], seed=32)[0]
        assert more.failed
        camp._store_failure(more, more, 2)
        assert len(list(corpus.glob("calibration-*.json"))) == 2 and len(camp.stats.stored) == 1
    finally:
        for e in camp._engines:
            e.close()


def test_a_candidate_that_passes_with_speculation_off_is_not_taken_for_the_stored_calibration_bug(tmp_path):
    # The correct reference engine with speculation off agrees with μ: a stored calibration
    # entry with the same features (say, from an older engine version) does not hide the candidate.
    corpus = tmp_path / "corpus"
    stored = _store_calibration(corpus, "reference", _case("draft_model", temperature=0.5))
    camp = Campaign(CampaignConfig(engine="reference", corpus_dir=corpus, work_dir=tmp_path / "work", budget_s=60))
    camp._profile = camp.engine.capabilities().profile
    try:
        run = camp._run([_case("ngram", temperature=0.5)], [camp.cfg.screen_alpha], seed=11)[0]
        assert not camp._known_calibration(run, seed=12)
        assert camp.stats.calibration_checks == 1 and camp.stats.calibration_known == 0
        assert Entry.from_json(json.loads(stored.read_text())).times_seen == 1
    finally:
        for e in camp._engines:
            e.close()


class _Remote:
    """A hub method as a Ray actor handle has it (``.remote``), called in this process."""

    def __init__(self, f):
        self.remote = f


def _hub_handle(hub, *methods: str):
    """A stand-in for the hub's Ray actor handle with ``methods``; pair it with
    ``monkeypatch.setattr("specfuzz.fuzz.ray_actors._get", lambda ref: ref)``."""
    return type("Handle", (), {m: _Remote(getattr(hub, m)) for m in methods})()


def test_the_ray_hub_gives_engine_actors_the_stored_calibration_entries_and_findings_and_marks_them_seen(tmp_path, monkeypatch):
    """Engine actors read an empty scratch corpus: the driver's hub hands them its calibration
    entries and speculation findings (by name, those stored during the run too) and marks one
    seen again when an actor meets it again."""
    from specfuzz.fuzz.ray_actors import ActorCampaign
    from specfuzz.fuzz.ray_hub import CampaignHub

    corpus = tmp_path / "corpus"
    stored = _store_calibration(corpus, "temperature-bug", _case("draft_model", temperature=0.5))
    Corpus(corpus).store(Entry(kind="crash", engine={"name": "temperature-bug"}, case=_case("ngram").to_json(),
                               evidence="engine exception: boom", extra={"crash_kind": "exception"}))
    hub = CampaignHub(str(corpus), 1e-3, {})
    entries = hub.known_entries()
    assert [name for name, _ in entries] == [stored.name]
    assert calibration_key("temperature-bug", entries[0][1]["case"]) == calibration_key(
        "temperature-bug", _case("ngram", temperature=0.5).to_json())
    # A speculation finding an actor stores through the hub is handed to every actor from then on.
    name, new = hub.store(Entry(kind="finding", engine={"name": "temperature-bug"},
                                case=_case("ngram", temperature=0.5, top_k=1).to_json(), evidence="e-value 1e9").to_json())
    assert new and sorted(n for n, _ in hub.known_entries()) == sorted([stored.name, name])

    actor = ActorCampaign.__new__(ActorCampaign)  # just its entry tables: no engine, no Ray
    actor.hub = _hub_handle(hub, "known_entries")
    actor.calibration_entries, actor.finding_entries = {}, {}
    actor._finding_evidence, actor._finding_symptoms = {}, {}
    monkeypatch.setattr("specfuzz.fuzz.ray_actors._get", lambda ref: ref)
    actor._refresh_known_entries()
    assert list(actor.calibration_entries.values()) == [Path(stored.name)]
    assert actor.finding_entries == {("temperature-bug", "ngram", ("temperature", "top_k")): (Path(name), None, json.loads(
        (corpus / name).read_text())["signature"])}
    assert hub.mark_seen(stored.name)
    assert Entry.from_json(json.loads(stored.read_text())).times_seen == 2
    assert hub.mark_seen(stored.name, "eagle")  # met under another method of its engine path
    assert Entry.from_json(json.loads(stored.read_text())).extra["also_seen_under"] == ["eagle"]
    assert not hub.mark_seen("../outside.json") and not hub.mark_seen("missing.json")


def test_an_engine_actor_s_calibration_entry_with_a_stored_entry_s_features_is_that_entry_seen_again(tmp_path, monkeypatch):
    """An actor's shrunk calibration failure with the features of an entry another actor (or an
    earlier run) stored is that entry seen again: the hub stores no second entry of one bug."""
    from specfuzz.fuzz.campaign import CampaignStats
    from specfuzz.fuzz.ray_actors import ActorCampaign, HubCorpus, HubSet
    from specfuzz.fuzz.ray_hub import CampaignHub

    corpus = tmp_path / "corpus"
    hub = CampaignHub(str(corpus), 1e-3, {})
    # Stored through the hub during the run, after the actor last asked for the stored entries.
    stored, new = hub.store(Entry(kind="calibration", engine={"name": "temperature-bug"},
                                  case=_case("draft_model", temperature=0.5).to_json(), evidence="actor 1").to_json())
    assert new

    handle = _hub_handle(hub, "known_entries", "has_entry", "mark_seen", "store", "contains", "add")
    monkeypatch.setattr("specfuzz.fuzz.ray_actors._get", lambda ref: ref)
    actor = ActorCampaign.__new__(ActorCampaign)  # its store path only: no engine, no Ray
    actor.hub, actor.calibration_entries, actor.finding_entries = handle, {}, {}
    actor.corpus, actor.known, actor.stats = HubCorpus(handle, {"actor": "w1"}), HubSet(handle, "known"), CampaignStats()
    events = []
    actor.on_event = lambda message, stats: events.append(message)
    # Met under ngram and shrunk to the same features (another signature: the method differs).
    again = Entry(kind="calibration", engine={"name": "temperature-bug"}, case=_case("ngram", temperature=0.5).to_json(),
                  evidence="actor 2")
    assert again.signature != json.loads((corpus / stored).read_text())["signature"]
    actor._store_entry(again)
    assert sorted(p.name for p in corpus.glob("*.json")) == [stored]
    assert "seen again" in events[-1] and actor.stats.findings_updated == 1 and actor.stats.findings_new == 0
    assert Entry.from_json(json.loads((corpus / stored).read_text())).times_seen == 2
    # Other features: a bug of its own, stored.
    other = Entry(kind="calibration", engine={"name": "temperature-bug"},
                  case=_case("ngram", temperature=0.5, top_k=1).to_json(), evidence="actor 2")
    actor._store_entry(other)
    assert len(list(corpus.glob("*.json"))) == 2 and actor.stats.findings_new == 1
    assert not hub.has_entry("missing.json") and not hub.has_entry("../outside.json")


def test_every_family_is_logged_with_its_features_samples_and_seconds(tmp_path):
    """.specfuzz/families.jsonl: a line per family run (bench/family_rates.py reads it)."""
    import importlib.util

    camp = Campaign(CampaignConfig(engine="reference", corpus_dir=tmp_path / "corpus", work_dir=tmp_path / "work",
                                   budget_s=60, max_samples=300))
    camp._profile = camp.engine.capabilities().profile
    try:
        camp._run([_case("ngram", temperature=0.5), _case("ngram", top_k=1)], [1e-3, 1e-3], seed=1)
        camp._calibrate(_case("ngram"), seed=2, alpha=1e-3)
    finally:
        for e in camp._engines:
            e.close()
    lines = [json.loads(t) for t in (tmp_path / "corpus" / ".specfuzz" / "families.jsonl").read_text().splitlines()]
    assert [(r["role"], r["method"], r["patterns"], r["samples"]) for r in lines] == [
        ("search", "ngram", 2, 600), ("calibration", None, 1, 300)]
    assert lines[0]["features"] == ["temperature", "top_k"] and lines[1]["features"] == []
    assert lines[0]["seconds"]["generate"] > 0 and lines[0]["wall_s"] >= lines[0]["seconds"]["generate"]
    # The speculation-off engine's process was new: its first family waited for it to answer
    # (its imports), a part of that family's start; the search engine's answered before.
    assert 0 < lines[1]["ready_s"] <= lines[1]["seconds"]["start"] and lines[0]["ready_s"] == 0
    spec = importlib.util.spec_from_file_location("family_rates", REPO / "bench" / "family_rates.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.rates(lines)
    assert out["all"]["samples"] == 900 and out["method"]["off"]["samples"] == 300
    assert out["feature"]["none"]["families"] == 1 and out["feature"]["top_k"]["samples"] == 600
    assert out["starts"]["calibration"]["starts"] == 1 and out["starts"]["calibration"]["ready_logged"] == 1


@pytest.mark.slow
def test_a_new_calibration_bug_is_confirmed_and_shrunk_with_speculation_off(tmp_path, monkeypatch):
    # A candidate that fails with speculation off too is the target sampler's bug: it is
    # confirmed on fresh speculation-off engines, shrunk with speculation off and stored as a
    # calibration entry whose evidence is a fresh speculation-off run.
    spec_of_confirmations: list[bool] = []
    confirm = Campaign._confirm

    def spy(self, run, speculation, engine=None):
        spec_of_confirmations.append(speculation)
        return confirm(self, run, speculation, engine)

    monkeypatch.setattr(Campaign, "_confirm", spy)
    corpus = tmp_path / "corpus"
    camp = Campaign(CampaignConfig(engine="example_engines:TemperatureBugEngine", corpus_dir=corpus,
                                   work_dir=tmp_path / "work", budget_s=25, seed=5, methods=("ngram",)))
    camp.run()
    entries = [e for _, e in Corpus(corpus).entries()]
    assert [e.kind for e in entries] == ["calibration"], [(e.kind, e.label) for e in entries]
    assert spec_of_confirmations and not any(spec_of_confirmations), spec_of_confirmations
    assert entries[0].extra["found_on"]["confirmed_on"] == "fresh engine start, speculation off"
    assert entries[0].case["params"]["temperature"] != 1.0
    fresh = [json.loads(line) for line in (corpus / ".specfuzz" / "families.jsonl").read_text().splitlines()]
    fresh = [r for r in fresh if r["role"] == "fresh"]
    assert fresh and all(r["method"] is None for r in fresh), fresh


def test_a_calibration_bug_confirmed_with_speculation_off_is_stored_on_that_confirmation(tmp_path):
    """A candidate that fails with speculation off is confirmed, shrunk and stored with
    speculation off; its fresh confirmation is the entry's evidence, and storing it runs nothing
    more on the campaign's speculation-off engine (on the H200 that run restarted SGLang for the
    shrunk case's vocabulary, ~25 s, to repeat what the fresh confirmation had just sampled)."""
    corpus = tmp_path / "corpus"
    camp = Campaign(CampaignConfig(engine="example_engines:TemperatureBugEngine", corpus_dir=corpus,
                                   work_dir=tmp_path / "work", budget_s=60))
    camp._profile = camp.engine.capabilities().profile
    try:
        case = _case("ngram", temperature=0.5)
        run = camp._run([case], [camp.cfg.screen_alpha], seed=11, speculation=False)[0]
        assert run.failed
        conf, j = camp._confirm(run, False)
        assert conf.failed
        camp._spec_off_found = True  # as the search sets it for a candidate that failed with speculation off
        camp._store_failure(run, conf, j)
        assert camp._spec_off_engine is None  # nothing ran on it
        [(path, entry)] = list(Corpus(corpus).entries())
        assert entry.kind == "calibration" and entry.calibration is None
        assert entry.counts == dict(conf.counts) and entry.verdict == conf.judgement.verdict.to_dict()
        assert entry.extra["found_on"]["confirmed_on"] == "fresh engine start, speculation off"
    finally:
        for e in camp._engines:
            e.close()


def test_a_calibration_bug_s_greedy_shrink_ends_at_the_first_kept_reduction_with_a_stored_entry_s_features(tmp_path):
    """A calibration bug being shrunk (speculation off, on the speculation-off engine) whose
    kept reduction has exactly a stored calibration entry's features is that bug met again: the
    shrink ends there, the entry is seen again after one confirmation on the running engine (no
    fresh start), nothing is stored. On the H200 two of four greedy shrinks ran 166 s to the
    shrinking cap, then a fresh confirmation, before storing said "seen again". Hypothesis's
    smallest failure with exactly those features is not shrunk at all; with no stored entry,
    the shrink goes on past that reduction."""
    corpus = tmp_path / "corpus"
    stored = _store_calibration(corpus, "temperature-bug", _case("draft_model", temperature=0.5))
    camp = Campaign(CampaignConfig(engine="example_engines:TemperatureBugEngine", corpus_dir=corpus,
                                   work_dir=tmp_path / "work", budget_s=60))
    camp._profile = camp.engine.capabilities().profile
    table = np.array([[1.0, 0.0], [0.0, 0.5]], dtype=np.float32)  # another model than the stored entry's
    try:
        big = _case("ngram", temperature=0.5, presence_penalty=0.5).with_(target_table=table)
        run = camp._run([big], [camp.cfg.screen_alpha], seed=41, speculation=False)[0]
        assert run.failed
        camp._spec_off_found = True  # a calibration bug: shrunk with speculation off
        small, conf, j, res = camp._greedy_shrink(run, None, None, False, budget_s=120, seed=42, known_check=True)
        assert (small, conf, j) == (None, None, None) and res.stopped, res.steps
        assert res.steps[-1] == "presence_penalty 0.5 -> 0.0", res.steps
        assert camp._fresh_engine is None and camp.stats.calibration_known == 1
        assert Entry.from_json(json.loads(stored.read_text())).times_seen == 2
        assert sorted(p.name for p in corpus.glob("*.json")) == [stored.name]
        # Hypothesis's smallest failure with the stored features: not shrunk
        same = camp._run([_case("ngram", temperature=0.5).with_(target_table=table)], [camp.cfg.screen_alpha],
                         seed=43, speculation=False)[0]
        assert same.failed
        before = len([ln for ln in (corpus / ".specfuzz" / "events.jsonl").read_text().splitlines() if "greedy shrink" in ln])
        assert camp._greedy_shrink_found(([same.case], same, None, 0), False) is None
        after = len([ln for ln in (corpus / ".specfuzz" / "events.jsonl").read_text().splitlines() if "greedy shrink" in ln])
        assert after == before and camp.stats.calibration_known == 2
        # no stored entry: the shrink goes on past that reduction
        camp.calibration_entries.clear()
        small, conf, j, res = camp._greedy_shrink(run, None, None, False, budget_s=120, seed=44, known_check=True)
        assert not res.stopped and "presence_penalty 0.5 -> 0.0" in res.steps and conf is not None, res.steps
    finally:
        for e in camp._engines:
            e.close()
