"""`specfuzz shrink`: greedy shrinking of a stored entry on its engine.

The pure parts (token dropping with id remapping, candidates, the greedy loop) are
checked with plain predicates; the command end to end with real engines in child
processes: an engine that segfaults on top-k requests (the crash is shrunk to its
minimal condition) and the reference sampler with an injected bug (a finding is shrunk
and stays attributed).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from specfuzz.case import Case
from specfuzz.cli import main
from specfuzz.engines.isolation import EngineCrash
from specfuzz.fuzz.corpus import Corpus
from specfuzz.fuzz.run import crash_entry
from specfuzz.fuzz.shrink import candidates, drop_token, shrink
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
    final = [json.loads(p.read_text()) for p in (tmp_path / "c").glob("crash-*.json") if p not in (old_path, mid_path)]
    assert len(final) == 1, r.output
    by = final[0]["extra"]["shrunk_by"]
    n = len(mid["steps"])
    assert by["passes"] == 2 and by["minimal"] is True and by["steps"][:n] == mid["steps"] and len(by["steps"]) > n
    assert final[0]["extra"]["shrunk_from"] == mid_path.name
    for p in (tmp_path / "c").glob("crash-*.json"):
        if p not in (old_path,):
            p.unlink()
    json.loads(old_path.read_text())  # the original entry is untouched by the passes (still readable)
    r = CliRunner().invoke(main, ["shrink", str(old_path), "--engine", "example_engines:TopKCrashEngine",
                                  "--budget", "5m", "--work-dir", str(tmp_path / "wd")])
    assert r.exit_code == 0, r.output
    files = sorted((tmp_path / "c").glob("crash-*.json"))
    new = [json.loads(p.read_text()) for p in files if p != old_path]
    assert len(new) == 1, r.output
    d = new[0]
    case = Case.from_json(d["case"])
    assert case.vocab_size == 2 and len(case.prompt) == 1 and case.params.max_tokens == 2 and case.params.top_k >= 1
    assert d["extra"]["shrunk"] is True and d["extra"]["shrunk_from"] == old_path.name and d["extra"]["title"] == "top-k crash"
    assert "signal" in d["evidence"]
    assert json.loads(old_path.read_text())["extra"]["shrunk_into"] == files[[p != old_path for p in files].index(True)].name


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
    r = CliRunner().invoke(main, args + ["--attempts", "2"])
    assert r.exit_code == 0 and "reductions kept" in r.output, r.output
