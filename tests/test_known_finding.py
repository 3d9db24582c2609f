"""A stored speculation finding met again under more sampling settings (Campaign._known_finding):
a candidate of the finding's method whose features include the finding's and that fails
reduced to them is that finding seen again, not a new entry to confirm afresh and shrink."""

import dataclasses
import json
from pathlib import Path

import numpy as np

from specfuzz.case import Case
from specfuzz.fuzz.campaign import Campaign, CampaignConfig
from specfuzz.fuzz.corpus import Corpus, Entry
from specfuzz.fuzz.triage import symptom

REPO = Path(__file__).resolve().parents[1]


def _case(method: str = "ngram", **params) -> Case:
    base = Case.from_json(json.loads((REPO / "corpus" / "regression" / "regression-N6.json").read_text())["case"])
    table = np.array([[1.0, 0.0, 0.5, -0.5]] * 4, dtype=np.float32)
    spec = base.spec.__class__.from_json({**base.spec.to_json(), "method": method})
    return base.with_(target_table=table, params=base.params.__class__.from_json({**base.params.to_json(), **params}),
                      spec=spec, draft_table=table.copy() if method == "draft_model" else None)


def _store_finding(corpus: Path, engine_name: str, case: Case, label: str | None = "unknown") -> Path:
    entry = Entry(kind="finding", engine={"name": engine_name}, case=case.to_json(), evidence="stored by the test",
                  attribution=None if label is None else {"label": label})
    path, new = Corpus(corpus).store(entry)
    assert new
    return path


def _campaign(tmp_path: Path, corpus: Path, **kw) -> Campaign:
    camp = Campaign(CampaignConfig(corpus_dir=corpus, work_dir=tmp_path / "work", budget_s=60, **kw))
    camp._profile = camp.engine.capabilities().profile  # as a search's start shape sets it
    return camp


def test_a_stored_finding_met_with_more_sampling_settings_is_seen_again_and_not_stored(tmp_path):
    corpus = tmp_path / "corpus"
    stored = _store_finding(corpus, "reference+N6", _case())
    camp = _campaign(tmp_path, corpus, engine_kwargs={"inject": "N6"})
    try:
        run = camp._run([_case(temperature=0.9, presence_penalty=0.5)], [camp.cfg.screen_alpha], seed=11)[0]
        assert run.failed  # the candidate a search would confirm and shrink
        assert camp._known_finding(run, seed=12)
        assert Entry.from_json(json.loads(stored.read_text())).times_seen == 2
        assert camp.stats.findings_known == 1 and camp.stats.confirmations == 1
        assert camp._fresh_engine is None  # confirmed on the running engine, as a known bug
        # met again in the same run: recognised, marked (and confirmed) once per run
        assert camp._known_finding(run, seed=13)
        assert camp.stats.findings_known == 2 and camp.stats.confirmations == 1
        assert Entry.from_json(json.loads(stored.read_text())).times_seen == 2
        assert Entry.from_json(json.loads(stored.read_text())).signature in camp.seen_again  # not marked again by its signature
        # another method, or a feature the candidate does not have: nothing is run
        checks = camp.stats.finding_checks
        other = camp._run([_case("draft_model", temperature=0.9)], [camp.cfg.screen_alpha], seed=14)[0]
        assert not camp._known_finding(other, seed=15)
        top_k = _store_finding(tmp_path / "other", "reference+N6", _case(top_k=2))
        camp.finding_entries.clear()
        camp._add_finding(Entry.from_json(json.loads(top_k.read_text())), top_k)
        assert not camp._known_finding(run, seed=16)
        assert camp.stats.finding_checks == checks and camp.stats.findings_known == 2
    finally:
        for e in camp._engines:
            e.close()


def test_the_reduced_run_starts_from_the_state_the_candidate_started_from(tmp_path):
    """An engine whose bug shows only while its cross-request state is empty (SGLang's NGRAM
    zero padding, with an empty n-gram trie): the candidate fails in the first call after its
    swap; the known-finding check resets that state before the reduced run (and before the
    confirmation on the running engine), so the candidate is the stored finding met again,
    not a new variant to confirm afresh, shrink and store (finding-d5b4 on the H100)."""
    corpus = tmp_path / "corpus"
    stored = _store_finding(corpus, "cold-state+N6", _case())
    camp = _campaign(tmp_path, corpus, engine="example_engines:ColdStateEngine", engine_kwargs={"inject": "N6"})
    try:
        run = camp._run([_case(temperature=0.9, presence_penalty=0.5)], [camp.cfg.screen_alpha], seed=61)[0]
        assert run.failed and run.n <= camp.cfg.batch  # decided in the one call with the empty state
        again = camp._run([run.case], [camp.cfg.screen_alpha], seed=62)[0]
        assert not again.failed  # on the filled state the same case passes: the check must reset it
        assert camp._known_finding(run, seed=63)
        assert camp.stats.state_resets == 2  # before the reduced run and before its confirmation
        assert camp.stats.findings_known == 1 and camp.stats.confirmations == 1 and camp._fresh_engine is None
        assert Entry.from_json(json.loads(stored.read_text())).times_seen == 2
    finally:
        for e in camp._engines:
            e.close()


def test_a_candidate_whose_reduction_to_a_stored_finding_passes_goes_on_as_a_new_one(tmp_path):
    """The temperature bug (the engine samples at temperature 1 whatever the request says)
    with speculation on: a candidate at temperature 0.5 fails, while the stored finding's
    features (none) put it back at temperature 1, where this engine is right: not that
    finding. An attribution other than the stored one's is not tried at all."""
    corpus = tmp_path / "corpus"
    stored = _store_finding(corpus, "temperature-bug", _case())
    camp = _campaign(tmp_path, corpus, engine="example_engines:TemperatureBugEngine")
    try:
        run = camp._run([_case(temperature=0.5)], [camp.cfg.screen_alpha], seed=21)[0]
        assert run.failed
        assert not camp._known_finding(run, seed=22)
        assert camp.stats.finding_checks == 1 and camp.stats.findings_known == 0 and camp.stats.confirmations == 0
        assert Entry.from_json(json.loads(stored.read_text())).times_seen == 1
        n6 = _store_finding(tmp_path / "other", "temperature-bug", _case(), label="N6")
        camp.finding_entries.clear()
        camp._add_finding(Entry.from_json(json.loads(n6.read_text())), n6)
        j = run.judgement
        n3 = dataclasses.replace(run, judgement=dataclasses.replace(j, attribution=dataclasses.replace(j.attribution, label="N3")))
        assert not camp._known_finding(n3, seed=23) and camp.stats.finding_checks == 1
    finally:
        for e in camp._engines:
            e.close()


def test_hypothesis_smallest_failure_is_confirmed_once_with_what_the_greedy_shrinker_kept(tmp_path, monkeypatch):
    """The smallest failure Hypothesis kept reaches the greedy shrinker unconfirmed (the
    search returns it with no confirmation), and only the case the greedy shrinker keeps is
    confirmed on a fresh engine: one fresh start, not one for each shrinker's result."""
    fresh: list[tuple[dict, bool]] = []
    confirm = Campaign._confirm

    def spy(self, run, speculation, engine=None):
        conf, j = confirm(self, run, speculation, engine)
        if engine is None:
            fresh.append((run.case.to_json(), conf.failed))
        return conf, j

    monkeypatch.setattr(Campaign, "_confirm", spy)
    camp = _campaign(tmp_path, tmp_path / "corpus", engine_kwargs={"inject": "N6"})
    try:
        big = _case(temperature=0.9, presence_penalty=0.5)  # V=4, 3 tokens, a 3-token prompt
        run = camp._run([big], [camp.cfg.screen_alpha], seed=31)[0]
        assert run.failed
        first, j = camp._confirm(run, True)  # the candidate's own confirmation, before shrinking
        assert first.failed and len(fresh) == 1
        camp._found_fallback = ([big], run, first, j)
        camp._shrink_started = 0.0
        fam, small, conf, j2 = camp._greedy_shrink_found(([big], run, None, 0), True)
        assert len(fresh) == 2 and conf is not None and conf.failed and j2 == 2  # one more fresh confirmation
        assert fresh[-1][0] == small.case.to_json() != big.to_json()  # of the smaller case the shrinker kept
        assert len(small.case.target_table) < 4 or len(small.case.prompt) < 3 or small.case.params.max_tokens < 3
    finally:
        for e in camp._engines:
            e.close()


def test_a_failure_that_shrinks_to_a_stored_finding_is_not_confirmed_afresh_or_stored(tmp_path, monkeypatch):
    """Hypothesis's smallest failure (unconfirmed) that is a stored speculation finding met
    again: recognised on the running engine before the greedy shrinker and the fresh
    confirmation (on the H200 a shrink that ended at a stored finding's signature cost ~200 s
    of SGLang), the stored entry seen again, nothing new stored."""
    fresh: list = []
    confirm = Campaign._confirm

    def spy(self, run, speculation, engine=None):
        conf, j = confirm(self, run, speculation, engine)
        if engine is None:
            fresh.append(run.case.to_json())
        return conf, j

    monkeypatch.setattr(Campaign, "_confirm", spy)
    corpus = tmp_path / "corpus"
    stored = _store_finding(corpus, "reference+N6", _case())
    camp = _campaign(tmp_path, corpus, engine_kwargs={"inject": "N6"})
    try:
        big = _case(temperature=0.9, presence_penalty=0.5)
        run = camp._run([big], [camp.cfg.screen_alpha], seed=41)[0]
        assert run.failed
        camp._shrink_started = 0.0
        assert camp._greedy_shrink_found(([big], run, None, 0), True) is None
        assert fresh == [] and camp._fresh_engine is None  # no fresh engine started for it
        assert camp.stats.shrunk_known == 1 and camp.stats.findings_known == 1
        assert Entry.from_json(json.loads(stored.read_text())).times_seen == 2
        assert sorted(p.name for p in corpus.glob("*.json")) == [stored.name]
        events = (corpus / ".specfuzz" / "events.jsonl")
        assert not events.exists() or "greedy shrink" not in events.read_text()  # the greedy shrinker never ran
        # with no stored finding it is met on, it goes on to the greedy shrinker and one fresh confirmation
        camp.finding_entries.clear()
        camp._found_fallback = None
        fam, small, conf, _ = camp._greedy_shrink_found(([big], run, None, 0), True)
        assert conf is not None and conf.failed and len(fresh) == 1 and camp.stats.shrunk_known == 1
        assert any(json.loads(x)["event"] == "greedy shrink" for x in events.read_text().splitlines())
    finally:
        for e in camp._engines:
            e.close()


def test_a_greedy_shrink_ends_at_the_first_kept_reduction_that_is_a_stored_finding(tmp_path):
    """A kept reduction that is a stored speculation finding met again ends the greedy shrink
    there: no further reductions (on SGLang, restarts for each smaller vocabulary), no fresh
    confirmation, the stored entry seen again. On the H200 five of six greedy shrinks ran on
    for 64-127 s before their smallest case was recognised as a stored finding."""
    corpus = tmp_path / "corpus"
    stored = _store_finding(corpus, "reference+N6", _case())
    camp = _campaign(tmp_path, corpus, engine_kwargs={"inject": "N6"})
    try:
        big = _case(temperature=0.9, presence_penalty=0.5)
        run = camp._run([big], [camp.cfg.screen_alpha], seed=51)[0]
        assert run.failed
        got = camp._greedy_shrink(run, None, None, True, budget_s=120, seed=52, known_check=True)
        small, conf, j, res = got
        assert (small, conf, j) == (None, None, None) and res.stopped and res.kept == 1, res.steps
        assert camp.stats.shrunk_known == 1 and camp.stats.findings_known == 1
        assert camp._fresh_engine is None  # no fresh confirmation, none started ahead
        assert Entry.from_json(json.loads(stored.read_text())).times_seen == 2
        ev = [json.loads(x) for x in (corpus / ".specfuzz" / "events.jsonl").read_text().splitlines()]
        assert [e.get("stopped") for e in ev if e["event"] == "greedy shrink"] == ["a stored finding met again"]
        # with no stored finding, the same shrink goes on past that reduction
        camp.finding_entries.clear()
        small, conf, j, res = camp._greedy_shrink(run, None, None, True, budget_s=120, seed=53, known_check=True)
        assert not res.stopped and res.kept >= 2 and conf is not None and conf.failed, res.steps
    finally:
        for e in camp._engines:
            e.close()


def _past_end_case(method: str, **params) -> Case:
    return _case(method, **params).with_(eos_token_id=3)


def test_a_stored_finding_is_met_again_under_another_method_of_its_engine_path_with_the_same_symptom(tmp_path):
    """An engine whose methods run through one implementation (Capabilities.spec_paths, as
    SGLang's STANDALONE, EAGLE and EAGLE3) and that continues past a stop token under every
    one: the finding stored under draft_model is met again by an ngram candidate with more
    sampling settings (the same symptom, "past end"), marked seen again with ngram recorded,
    not confirmed afresh, shrunk or stored. On an H100 (2026-12-06) SGLang's bug of that
    kind was stored again under EAGLE and EAGLE3, each after a fresh start and a shrink."""
    corpus = tmp_path / "corpus"
    camp = _campaign(tmp_path, corpus, engine="example_engines:PastEndEngine")
    try:
        found = camp._run([_past_end_case("draft_model")], [camp.cfg.screen_alpha], seed=71)[0]
        assert found.failed and symptom(found.case.to_json(), found.counts, camp._profile) == "past end"
        path, new = Corpus(corpus).store(Entry(kind="finding", engine={"name": "past-end"}, case=found.case.to_json(),
                                               counts=dict(found.counts), evidence="stored by the test"))
        assert new
        camp._add_finding(Entry.from_json(json.loads(path.read_text())), path)
        said: list[str] = []
        camp.on_event = lambda msg, stats: said.append(msg)
        run = camp._run([_past_end_case("ngram", temperature=0.9, presence_penalty=0.5)], [camp.cfg.screen_alpha], seed=72)[0]
        assert run.failed
        assert camp._known_finding(run, seed=73)
        stored = Entry.from_json(json.loads(path.read_text()))
        assert stored.times_seen == 2 and stored.extra["also_seen_under"] == ["ngram"]
        assert camp.stats.findings_known == 1 and camp.stats.confirmations == 1 and camp._fresh_engine is None
        assert any("seen again under ngram (stored under draft_model" in m and "symptom: past end" in m for m in said)
        # met again under ngram in the same run: recognised without another confirmation
        assert camp._known_finding(run, seed=74) and camp.stats.confirmations == 1
        assert sorted(p.name for p in corpus.glob("*.json")) == [path.name]
    finally:
        for e in camp._engines:
            e.close()


def test_another_method_is_not_the_stored_finding_with_another_symptom_or_engine_path(tmp_path):
    """A stored finding of another method whose counts show another symptom (an impossible
    output that is not past the end), or whose method runs through another implementation
    (no spec_paths), is not the candidate's bug: the candidate goes on as a new one."""
    corpus = tmp_path / "corpus"
    camp = _campaign(tmp_path, corpus, engine="example_engines:PastEndEngine")
    try:
        other = Entry(kind="finding", engine={"name": "past-end"}, case=_past_end_case("draft_model").to_json(),
                      counts={(7,): 10}, evidence="stored by the test: a token id outside the vocabulary")
        path, _ = Corpus(corpus).store(other)
        camp._add_finding(Entry.from_json(json.loads(path.read_text())), path)
        run = camp._run([_past_end_case("ngram", temperature=0.9)], [camp.cfg.screen_alpha], seed=81)[0]
        assert run.failed
        assert not camp._known_finding(run, seed=82)
        assert camp.stats.finding_checks == 1 and camp.stats.findings_known == 0 and camp.stats.confirmations == 0
        assert Entry.from_json(json.loads(path.read_text())).times_seen == 1
    finally:
        for e in camp._engines:
            e.close()
    split = _campaign(tmp_path / "split", tmp_path / "corpus2", engine="example_engines:PastEndEngine",
                      engine_kwargs={"shared": False})
    try:
        found = split._run([_past_end_case("draft_model")], [split.cfg.screen_alpha], seed=83)[0]
        path, _ = Corpus(tmp_path / "corpus2").store(Entry(kind="finding", engine={"name": "past-end"},
                                                           case=found.case.to_json(), counts=dict(found.counts)))
        split._add_finding(Entry.from_json(json.loads(path.read_text())), path)
        run = split._run([_past_end_case("ngram", temperature=0.9)], [split.cfg.screen_alpha], seed=84)[0]
        assert run.failed and not split._known_finding(run, seed=85) and split.stats.finding_checks == 0
    finally:
        for e in split._engines:
            e.close()


def _store_run(camp: Campaign, corpus: Path, run, name: str) -> Path:
    path, new = Corpus(corpus).store(Entry(kind="finding", engine={"name": name}, case=run.case.to_json(),
                                           counts=dict(run.counts), evidence="stored by the test"))
    assert new
    camp._add_finding(Entry.from_json(json.loads(path.read_text())), path)
    return path


def test_a_stored_finding_of_the_verify_sampler_s_features_is_met_again_under_every_method_it_verifies(tmp_path):
    """Methods that draft and emit through implementations of their own but verify with one
    sampler (Capabilities.verify_samplers: SGLang's eagle_sample verifies NGRAM as well as
    STANDALONE, EAGLE and EAGLE-3, and applies no min_p): a finding stored under draft_model whose
    features are all the sampler's (min_p) is met again by an ngram candidate with more settings;
    one with a feature the sampler does not apply (a stop token: emitting is each worker's) is not
    checked across methods. On an H100, 2026-12-06, NGRAM's min_p failure was stored again beside
    the other methods' (finding-4074)."""
    corpus = tmp_path / "corpus"
    camp = _campaign(tmp_path, corpus, engine="example_engines:MinPIgnoredEngine")
    try:
        found = camp._run([_case("draft_model", min_p=0.5)], [camp.cfg.screen_alpha], seed=91)[0]
        assert found.failed and symptom(found.case.to_json(), found.counts, camp._profile) == "impossible output"
        path = _store_run(camp, corpus, found, "min-p-ignored")
        said: list[str] = []
        camp.on_event = lambda msg, stats: said.append(msg)
        run = camp._run([_case("ngram", min_p=0.5, temperature=0.9)], [camp.cfg.screen_alpha], seed=92)[0]
        assert run.failed and camp._known_finding(run, seed=93)
        stored = Entry.from_json(json.loads(path.read_text()))
        assert stored.times_seen == 2 and stored.extra["also_seen_under"] == ["ngram"]
        assert any("seen again under ngram (stored under draft_model; one engine path, verify sampler one sampler" in m
                   for m in said), said
        # a stop token too: not every feature is the sampler's, so no check across methods
        stop = _case("draft_model", min_p=0.5, stop_token_ids=(2,))
        _store_run(camp, corpus, camp._run([stop], [camp.cfg.screen_alpha], seed=94)[0], "min-p-ignored")
        camp.finding_entries = {k: v for k, v in camp.finding_entries.items() if "stop_token_ids" in k[2]}
        checks = camp.stats.finding_checks
        cand = camp._run([_case("ngram", min_p=0.5, temperature=0.9, stop_token_ids=(2,))], [camp.cfg.screen_alpha], seed=95)[0]
        assert cand.failed and not camp._known_finding(cand, seed=96) and camp.stats.finding_checks == checks
    finally:
        for e in camp._engines:
            e.close()
    # an engine whose sampler does not apply min_p (another verification path for it): no check
    other = _campaign(tmp_path / "o", tmp_path / "corpus2", engine="example_engines:MinPIgnoredEngine",
                      engine_kwargs={"sampler_features": ["temperature"]})
    try:
        found = other._run([_case("draft_model", min_p=0.5)], [other.cfg.screen_alpha], seed=97)[0]
        _store_run(other, tmp_path / "corpus2", found, "min-p-ignored")
        run = other._run([_case("ngram", min_p=0.5, temperature=0.9)], [other.cfg.screen_alpha], seed=98)[0]
        assert run.failed and not other._known_finding(run, seed=99) and other.stats.finding_checks == 0
    finally:
        for e in other._engines:
            e.close()
