"""Campaign pieces that GPU leases depend on, checked on CPU with the reference engine.

* searches rotate the method order (a slow engine's first, simplest examples must not
  all use one method: an 8-minute vLLM campaign on the H200 drew 14 families, none EAGLE);
* totals per method add up over resumed runs;
* crash entries record the dtype, engine settings and every pattern of the batch;
* calibration entries (speculation off failed) are drafted as speculation-off issues
  under the engine's own profile.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import Phase, given, settings

from specfuzz.case import Case
from specfuzz.engines.isolation import EngineCrash
from specfuzz.fuzz.campaign import Campaign, CampaignConfig
from specfuzz.fuzz.corpus import Entry
from specfuzz.fuzz.draft import prepare, render_issue
from specfuzz.fuzz.run import crash_entry
from specfuzz.fuzz.triage import profile_for
from specfuzz.oracle.params import SamplingParams as SP
from specfuzz.oracle.speculative import SpecConfig

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("index, first", [(1, "draft_model"), (2, "ngram"), (3, "eagle_tree"), (5, "draft_model")])
def test_each_search_starts_with_the_next_method(tmp_path, index, first):
    """Each search is one engine start shape; the method turns with the search index, so
    that a slow engine reaches every method (an 8-minute vLLM campaign on the H200 once
    drew 14 families, none EAGLE), and every family of the search has that shape."""
    cfg = CampaignConfig(engine="reference", budget_s=5, corpus_dir=tmp_path / "c",
                         methods=("draft_model", "ngram", "eagle_tree", "ngram_tree"), work_dir=tmp_path / "wd")
    camp = Campaign(cfg)
    seen: list = []
    try:
        shape = camp._shape(index)
        assert shape.spec.method == first

        @settings(database=None, max_examples=20, phases=[Phase.generate])
        @given(camp._strategy(shape))
        def families(fam):
            seen.append({(c.spec, c.vocab_size, c.eos_token_id, None if c.draft_table is None else c.draft_table.shape[1])
                         for c in fam})

        families()
    finally:
        camp.engine.close()
    assert set().union(*seen) == {(shape.spec, shape.vocab_size, shape.eos_token_id, shape.draft_width)}


def test_the_simplest_family_runs_once_per_campaign_not_once_per_search(tmp_path):
    """Hypothesis opens every search with its simplest example; a slow engine's search sees
    one or two examples, so re-running it each time would make most engine starts the
    same minimal family (the H200 vLLM campaign: 22 engine starts, every one K=1). It runs
    once per campaign (kept across resumed runs); later searches go straight to random ones."""
    from specfuzz.fuzz.campaign import family_key, simplest_key

    cfg = CampaignConfig(engine="reference", budget_s=60, corpus_dir=tmp_path / "c", methods=("draft_model", "ngram"),
                         work_dir=tmp_path / "wd", max_samples=50)
    camp = Campaign(cfg)
    ran: list[str] = []
    real_run = camp._run

    def spy(cases, *a, **kw):
        ran.append(family_key(cases))
        return real_run(cases, *a, **kw)

    camp._run = spy
    try:
        strategy = camp._strategy(camp._shape(1))
        key = simplest_key(strategy)
        for i in range(3):
            camp._search(strategy, 1000 + i)
        assert ran.count(key) == 1 and len(ran) > 3
        camp._save_state()
    finally:
        camp.engine.close()
    resumed = Campaign(cfg)
    try:
        assert key in resumed.simplest_run  # persisted with the campaign state
    finally:
        resumed.engine.close()


def test_vocabularies_are_drawn_above_each_methods_floor():
    """vLLM's Model Runner V2 starts on no vocabulary below 5 (corpus/h200/vllm/
    crash-c35473a506b6e6fb): its EAGLE cases are drawn with V >= 5, the other methods
    still from V = 2, instead of drawing configs the adapter must refuse."""
    from hypothesis.errors import InvalidArgument

    from specfuzz.strategies import cases

    seen: dict[str, set[int]] = {}

    @settings(database=None, max_examples=300, deadline=None)
    @given(cases(max_vocab=6, max_tokens=2, methods=("eagle", "eagle3", "ngram"), draft_vocab="narrower",
                 min_vocab={"eagle": 5, "eagle3": 5}))
    def draw(c):
        seen.setdefault(c.spec.method, set()).add(c.vocab_size)

    draw()
    assert min(seen["eagle"] | seen["eagle3"]) == 5 and seen["ngram"] & {2, 3, 4}
    with pytest.raises(InvalidArgument, match="max_vocab=4"):
        @settings(database=None, max_examples=1)
        @given(cases(max_vocab=4, methods=("eagle",), min_vocab={"eagle": 5}))
        def nothing_fits(c):
            pass

        nothing_fits()


def test_a_campaign_drops_methods_whose_floor_is_above_max_vocab(tmp_path):
    from dataclasses import replace

    from specfuzz.errors import InvalidInput

    def campaign(methods, max_vocab):
        camp = Campaign(CampaignConfig(engine="reference", budget_s=5, corpus_dir=tmp_path / "c", methods=methods,
                                       work_dir=tmp_path / "wd", max_vocab=max_vocab))
        caps = replace(camp.engine.capabilities(), min_vocab={"eagle_tree": 5})
        camp.engine.capabilities = lambda: caps  # the floor vLLM's V2 reports on CUDA
        return camp

    camp = campaign(("eagle_tree", "ngram"), 4)
    try:
        assert camp._methods() == ("ngram",)
    finally:
        camp.engine.close()
    camp = campaign(("eagle_tree",), 4)
    try:
        with pytest.raises(InvalidInput, match="max_vocab.*>= 5"):
            camp._methods()
    finally:
        camp.engine.close()


def test_totals_per_method_add_up_over_resumed_runs(tmp_path):
    kw = dict(engine="reference", corpus_dir=tmp_path / "c", work_dir=tmp_path / "wd", max_samples=200)
    a = Campaign(CampaignConfig(budget_s=4, **kw))
    a.run()
    first = json.loads((tmp_path / "c" / ".specfuzz" / "state.json").read_text())["totals"]
    b = Campaign(CampaignConfig(budget_s=4, **kw))
    b.run()
    second = json.loads((tmp_path / "c" / ".specfuzz" / "state.json").read_text())["totals"]
    assert second["runs"] == first["runs"] + 1 == 2
    assert second["seconds"] > first["seconds"] > 0
    fam = lambda t: sum(m["families"] for m in t["methods"].values())  # noqa: E731
    assert fam(second) > fam(first) > 0
    for m in second["methods"].values():  # variants count families: one K and one verify mode each
        ks = sum(n for k, n in m["variants"].items() if k.startswith("K="))
        assert ks == sum(n for k, n in m["variants"].items() if k.startswith("verify=")) == m["families"]
    assert sum(m["samples"] for m in second["methods"].values()) >= 200 * fam(second)


def test_family_variants_name_k_verification_draft_width_and_tree_shape():
    from specfuzz.fuzz.campaign import family_variants

    T = np.zeros((4, 4), np.float32)
    narrow = Case(T, (0,), SP(), spec=SpecConfig("eagle3", 2, draft_sampling="greedy"), draft_table=T[:, :3])
    assert family_variants(narrow) == ("K=2", "verify=token", "draft=reduced", "draft_sampling=greedy")
    tree = Case(T, (0,), SP(), spec=SpecConfig("ngram_tree", 3, tree_topk=2, tree_budget=5))
    assert family_variants(tree) == ("K=3", "verify=token", "tree=2x5")
    assert family_variants(Case(T, (0,), SP())) == ()


def test_crash_entries_record_dtype_settings_and_the_batch(tmp_path):
    T = np.zeros((3, 3), np.float32)
    cases = [Case(T, (0,), SP(max_tokens=2)), Case(T, (1, 2), SP(max_tokens=3, temperature=0.5))]

    class Eng:
        def version(self):
            return {"name": "x"}

    e = crash_entry(Eng(), cases[0], EngineCrash("signal", "killed"), "x", dtype="bfloat16",
                    settings={"enforce_eager": False}, family=cases)
    assert e.extra["dtype"] == "bfloat16" and e.extra["engine_settings"] == {"enforce_eager": False}
    assert [p["prompt"] for p in e.extra["batch_patterns"]] == [[0], [1, 2]]


def test_an_unshrunk_crash_is_shrunk_again_and_replaced_keeping_the_old_case(tmp_path):
    """A crash stored before crash shrinking existed (or found while shrinking something
    else) is not 'known': the next search that meets it shrinks it, and the shrunk entry
    replaces it under the same signature, keeping the old case."""
    from specfuzz.fuzz.corpus import Corpus

    T = np.zeros((3, 3), np.float32)
    big = Case(T, (0, 1, 2), SP(max_tokens=3, temperature=0.5), spec=SpecConfig("ngram", 2))
    small = Case(T, (0,), SP(max_tokens=2, temperature=0.5), spec=SpecConfig("ngram", 1))

    class Eng:
        def version(self):
            return {"name": "reference"}

    crash = EngineCrash("signal", "killed at step 17")
    corpus = Corpus(tmp_path / "c")
    old = crash_entry(Eng(), big, crash, "reference")
    old.extra["shrunk"] = False
    path, new = corpus.store(old)
    assert new
    cfg = CampaignConfig(engine="reference", budget_s=5, corpus_dir=tmp_path / "c", methods=("ngram",), work_dir=tmp_path / "wd")
    camp = Campaign(cfg)
    assert camp.known_crashes == set()  # not shrunk yet: a search shrinks it when it meets it
    shrunk = crash_entry(Eng(), small, EngineCrash("signal", "killed at step 3"), "reference")
    shrunk.extra["shrunk"] = True
    assert shrunk.signature == old.signature
    path2, new2 = corpus.store(shrunk)
    assert path2 == path and not new2
    d = json.loads(path.read_text())
    assert d["case"]["prompt"] == [0] and d["times_seen"] == 2 and d["extra"]["shrunk"] is True
    assert d["extra"]["unshrunk"]["case"]["prompt"] == [0, 1, 2]
    assert len(Campaign(cfg).known_crashes) == 1  # shrunk now: not shrunk again
    again = crash_entry(Eng(), big, crash, "reference")
    corpus.store(again)  # an unshrunk sighting does not replace the shrunk entry
    d = json.loads(path.read_text())
    assert d["case"]["prompt"] == [0] and d["times_seen"] == 3


def test_calibration_entries_are_drafted_with_speculation_off_under_the_engines_profile():
    path = REPO / "corpus" / "h200" / "sglang" / "calibration-f86d3e8d69c2be28.json"
    entry = Entry.from_json(json.loads(path.read_text()))
    assert entry.kind == "calibration" and entry.case["spec"] is not None  # the family's speculation settings
    assert profile_for(entry) == "sglang"
    data = prepare(entry, path.stem)
    assert data.case.spec is None and data.profile == "sglang"
    text = render_issue(data, plot_what=None, repro_samples=1000, top=5)
    assert "**With speculation off, SGLang 0.5.17's outputs do not follow" in text and "Trigger: speculation off;" in text
    assert f"Drafted by specfuzz from `{path.stem}` (calibration" in text


@pytest.mark.slow
def test_a_crash_is_shrunk_to_its_minimal_family(tmp_path):
    """The engine dies on any batch with a top-k request of 2+ tokens: the stored crash is
    one pattern, V=2, top_k set and max_tokens 2 (each candidate on a fresh process)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    # The search that stored the shrunk crash is the last (max_findings): the budget only sets the
    # shrinking cap, max(60 s, 15% of it), here 90 s; with 150 s (a 60-s cap) a slow run of the
    # 2-core machine (2026-12-05) stored the crash with max_tokens 4, its shrink cut at the cap.
    cfg = CampaignConfig(engine="example_engines:TopKCrashEngine", budget_s=600, corpus_dir=tmp_path / "c",
                         methods=("ngram",), work_dir=tmp_path / "wd", max_samples=100, max_patterns=3,
                         max_findings=1)
    Campaign(cfg).run()
    crashes = [json.loads(p.read_text()) for p in (tmp_path / "c").glob("crash-*.json")]
    assert crashes, "no crash stored"
    shrunk = [c for c in crashes if c["extra"].get("shrunk")]
    assert len(shrunk) == 1
    case = Case.from_json(shrunk[0]["case"])
    assert case.params.top_k >= 1 and case.params.max_tokens == 2
    assert case.vocab_size == 2 and len(case.prompt) == 1
    assert "batch_patterns" not in shrunk[0]["extra"]  # one pattern is enough
    assert "signal" in shrunk[0]["evidence"]


def test_start_shapes_use_fixed_widths_above_each_floor_and_engine_defaults_as_stated():
    from specfuzz.strategies import VOCAB_WIDTHS, start_shapes

    seen = []

    @settings(database=None, max_examples=200, deadline=None)
    @given(start_shapes(max_vocab=12, methods=("eagle3", "ngram"), min_vocab={"eagle3": 5}, draft_vocab="narrower",
                        spec_defaults={"ngram": {"ngram_min": 5, "ngram_max": 5}, "eagle3": {"draft_sampling": "greedy"}},
                        engine_default=True))
    def draw(shape):
        seen.append(shape)

    draw()
    assert {s.vocab_size for s in seen} <= set(VOCAB_WIDTHS) and all(s.spec.engine_default for s in seen)
    assert all(s.vocab_size >= 5 for s in seen if s.spec.method == "eagle3")
    assert all((s.spec.ngram_min, s.spec.ngram_max) == (5, 5) for s in seen if s.spec.method == "ngram")
    assert all(s.spec.draft_sampling == "greedy" and s.draft_width <= s.vocab_size for s in seen if s.spec.method == "eagle3")


def test_every_method_runs_first_at_the_engine_defaults_then_regularly(tmp_path):
    """Each method's first search is its engine-default variant (where the engine states one),
    and every DEFAULT_EVERY-th round of searches after; the others draw the knobs."""
    from dataclasses import replace

    from specfuzz.fuzz.campaign import DEFAULT_EVERY

    camp = Campaign(CampaignConfig(engine="reference", budget_s=5, corpus_dir=tmp_path / "c", methods=("draft_model", "ngram"),
                                   work_dir=tmp_path / "wd"))
    caps = replace(camp.engine.capabilities(), spec_defaults={"ngram": {"ngram_min": 3, "ngram_max": 3}})
    camp.engine.capabilities = lambda: caps
    try:
        shapes = [camp._shape(i) for i in range(1, 2 * DEFAULT_EVERY + 3)]
    finally:
        camp.engine.close()
    ngram = [s for s in shapes if s.spec.method == "ngram"]
    assert ngram[0].spec.engine_default and (ngram[0].spec.ngram_min, ngram[0].spec.ngram_max) == (3, 3)
    assert any(s.spec.engine_default for s in ngram[1:]) and not all(s.spec.engine_default for s in ngram)
    assert not any(s.spec.engine_default for s in shapes if s.spec.method == "draft_model")  # no stated default


def test_workers_start_the_method_rotation_at_different_methods(tmp_path):
    """Worker w of N in a --workers campaign starts at method w*n/N (its first search of every
    method still at the engine defaults), so parallel workers do not all start, and search
    at its defaults, the same method at once, and a short campaign reaches every method."""
    from dataclasses import replace

    methods = ("draft_model", "ngram", "eagle_tree", "ngram_tree")
    firsts = []
    for w in range(2):
        camp = Campaign(CampaignConfig(engine="reference", budget_s=5, corpus_dir=tmp_path / "c", methods=methods,
                                       work_dir=tmp_path / f"wd{w}", worker=w, workers=2))
        caps = replace(camp.engine.capabilities(), spec_defaults={"ngram": {"ngram_min": 3, "ngram_max": 3}})
        camp.engine.capabilities = lambda caps=caps: caps
        try:
            shapes = [camp._shape(i) for i in range(1, 5)]
        finally:
            camp.engine.close()
        assert sorted(s.spec.method for s in shapes) == sorted(methods)  # every method in the first round
        assert all(s.spec.engine_default for s in shapes if s.spec.method == "ngram")
        firsts.append(shapes[0].spec.method)
    assert firsts == ["draft_model", "eagle_tree"]  # spread: the two workers' first halves cover every method


def test_short_and_long_prompts_both_appear_within_a_shape():
    from specfuzz.strategies import StartShape, shape_cases

    lengths = []

    @settings(database=None, max_examples=150, deadline=None)
    @given(shape_cases(StartShape(4, None, SpecConfig(method="ngram", num_speculative_tokens=2))))
    def draw(case):
        lengths.append(len(case.prompt))

    draw()
    assert min(lengths) <= 2 and max(lengths) >= 20


def _sglang_death(error: str) -> EngineCrash:
    """A crash as the SGLang adapter sees it: the scheduler raised in its own process, the
    engine process was killed, and only the engine's log says what broke."""
    log = ("[2026-12-05 18:36:54] Scheduler hit an exception: Traceback (most recent call last):\n"
           '  File "/tmp/site/sglang/srt/managers/scheduler.py", line 4947, in run_scheduler_process\n'
           f"{error}\n\n[2026-12-05 18:36:54] SIGQUIT received. signum=None, frame=None. It usually means one child failed.\n")
    return EngineCrash("signal", "engine process killed by SIGKILL during generate", log)


def test_an_engine_death_is_told_apart_by_the_exception_its_log_names(tmp_path):
    """Every SGLang crash reaches the caller as "engine process killed by SIGKILL during
    generate": keyed by that alone, any new SGLang crash was taken for the stored
    crash-a2f0 met again and never stored. The crash key and a new entry's signature hold the
    exception the engine's log names; a stored entry without it keeps its signature and is
    still met again on the same exception (numbers aside)."""
    from specfuzz.fuzz.campaign import crash_key, entry_crash_key
    from specfuzz.fuzz.corpus import Corpus

    src = REPO / "corpus" / "h200" / "sglang" / "crash-a2f0ecd4a445eb51.json"
    stored = Entry.from_json(json.loads(src.read_text()))
    assert stored.signature == json.loads(src.read_text())["signature"] and "crash_cause" not in stored.extra
    same = _sglang_death("RuntimeError: The expanded size of the tensor (2) must match the existing size (4) at "
                         "non-singleton dimension 1.  Target sizes: [22, 2].  Tensor sizes: [22, 4]")
    other = _sglang_death("RuntimeError: CUDA error: an illegal memory access was encountered")
    assert crash_key(same) == entry_crash_key(stored) != crash_key(other)
    bare = EngineCrash("signal", "engine process killed by SIGKILL during generate", "no exception here\n")
    assert crash_key(bare) == "signal:engine process killed by SIGKILL during generate"
    # A crash whose evidence names its exception keeps its key: the log adds nothing.
    named = EngineCrash("exception", "generate raised RuntimeError: index 5 is out of bounds", other.log_tail)
    assert crash_key(named) == "exception:generate raised RuntimeError: index # is out of bounds"

    corpus = Corpus(tmp_path / "c")
    corpus.store(stored)
    cfg = CampaignConfig(engine="reference", budget_s=5, corpus_dir=tmp_path / "c", methods=("ngram",), work_dir=tmp_path / "wd")
    camp = Campaign(cfg)
    try:
        case = Case.from_json(stored.case)
        camp._record_crash(case, same)  # the stored crash met again: seen again, nothing new
        assert camp.stats.stored == [] and json.loads((tmp_path / "c" / src.name).read_text())["times_seen"] == stored.times_seen + 1
        camp._record_crash(case, other)  # another SGLang crash under the same method: a new entry
        assert len(camp.stats.stored) == 1
        new = Entry.from_json(json.loads((tmp_path / "c" / camp.stats.stored[0]).read_text()))
        assert new.extra["crash_cause"] == "RuntimeError: CUDA error: an illegal memory access was encountered"
        assert new.signature != stored.signature
    finally:
        camp.engine.close()


def test_a_search_whose_shape_meets_a_stored_crash_twice_in_a_row_ends(tmp_path):
    """A start shape that kills the engine whatever the requests cost an engine start per
    family until the search's slice ran out (SGLang on an H100: three families of one search,
    213 of a worker's 1038 s, each meeting the stored crash-a2f0): after the second stored
    crash in a row the search ends, and the campaign goes on with the next shape."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from specfuzz.fuzz.corpus import Corpus

    T = np.zeros((2, 2), np.float32)
    stored = crash_entry(type("Eng", (), {"version": lambda self: {"name": "shape-crash"}})(),
                         Case(T, (0,), SP(max_tokens=2), spec=SpecConfig("ngram", 2)),
                         EngineCrash("signal", "engine process killed by SIGSEGV during generate"), "shape-crash")
    stored.extra["shrunk"] = True
    Corpus(tmp_path / "c").store(stored)
    cfg = CampaignConfig(engine="example_engines:ShapeCrashEngine", budget_s=35, corpus_dir=tmp_path / "c",
                         methods=("ngram",), work_dir=tmp_path / "wd", max_samples=100, max_patterns=2, seed=3)
    Campaign(cfg).run()
    events = [json.loads(line) for line in (tmp_path / "c" / ".specfuzz" / "events.jsonl").read_text().splitlines()]
    ended = [e for e in events if e["event"] == "search ended by a stored crash"]
    assert ended and all(e["crashes"] == 2 and e["entry"].endswith(f"crash-{stored.signature}.json") for e in ended)
    fams = [json.loads(line) for line in (tmp_path / "c" / ".specfuzz" / "families.jsonl").read_text().splitlines()]
    by_search: dict = {}
    for f in fams:
        by_search.setdefault(f["search"], []).append(f["crash"])
    assert all(crashed.count(True) <= 2 for crashed in by_search.values())
    assert any(s > ended[0]["search"] and not any(crashed) for s, crashed in by_search.items())  # and went on
    assert sorted(p.name for p in (tmp_path / "c").glob("crash-*.json")) == [f"crash-{stored.signature}.json"]


def test_an_engine_start_refused_for_lack_of_gpu_memory_is_tried_again_and_never_stored(tmp_path, monkeypatch):
    """With several engines of a campaign on one GPU, SGLang's start can fail while another
    engine allocates memory (H100, 2026-12-05: "Loaded weights leave no GPU memory for the KV
    cache", stored as a crash of the shrunk case). Such a start is tried again after a wait;
    refused every time, the family is dropped as the machine's failure, not stored."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from specfuzz.engines import isolation
    from specfuzz.engines.base import EngineConfig, Request
    from specfuzz.tablegen import write_checkpoint

    monkeypatch.setattr(isolation, "START_RETRY_WAIT_S", 0.01)
    spec = "example_engines:MemoryRefusalEngine"
    ckpt = tmp_path / "t"
    write_checkpoint(ckpt, np.zeros((3, 3), np.float32))
    eng = isolation.IsolatedEngine(spec, {"count_file": str(tmp_path / "n1"), "refusals": 2}, log_dir=tmp_path / "logs")
    try:
        eng.start(EngineConfig(target_dir=ckpt, max_model_len=64))  # refused twice, then started
        assert eng.start_retries == 2 and (tmp_path / "n1").read_text() == "2"
        assert [e["attempt"] for e in eng.events if e["event"].startswith("engine start refused")] == [1, 2]
        assert eng.generate([Request((0,), SP(max_tokens=2), seed=1)])[0].token_ids
    finally:
        eng.close()
    # refused at every try (1 + START_RETRIES): one family dropped, nothing stored, the campaign goes on
    cfg = CampaignConfig(engine=spec, engine_kwargs={"count_file": str(tmp_path / "n2"), "refusals": 1 + isolation.START_RETRIES},
                         budget_s=12, corpus_dir=tmp_path / "c", methods=("ngram",), work_dir=tmp_path / "wd",
                         max_samples=100, max_patterns=2, seed=4)
    camp = Campaign(cfg)
    camp.run()
    assert camp.stats.resource_refusals == 1 and camp.stats.crashes == 0 and camp.stats.cases > 1
    assert list((tmp_path / "c").glob("*.json")) == []
    events = [json.loads(line) for line in (tmp_path / "c" / ".specfuzz" / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events].count("engine start refused for lack of GPU memory (not stored)") == 1


def test_a_crash_stored_in_the_old_raise_format_is_met_again_by_the_same_crash_today():
    """crash-2a70 (HF universal assisted generation, greedy, logit bias) was stored before crashes
    named the engine call ("engine raise: RuntimeError: ..."); a steered HF campaign met the same
    crash ("engine exception: generate raised RuntimeError: ...", other sizes) and stored it again
    as new. Both now have one key."""
    from specfuzz.fuzz.campaign import crash_key, entry_crash_key

    stored = Entry.from_json(json.loads((REPO / "corpus" / "crash-2a7090bd1d3456fa.json").read_text()))
    assert stored.extra["crash_kind"] == "raise" and stored.evidence.startswith("engine raise: RuntimeError")
    today = EngineCrash("exception", "generate raised RuntimeError: The size of tensor a (2) must match the size of "
                        "tensor b (3) at non-singleton dimension 1")
    assert entry_crash_key(stored) == crash_key(today)
    other_call = EngineCrash("exception", "start raised RuntimeError: The size of tensor a (2) must match the size of "
                             "tensor b (3) at non-singleton dimension 1")
    assert entry_crash_key(stored) != crash_key(other_call)
