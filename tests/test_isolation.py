"""Engines in child processes: crashes, kills and hangs become crash findings; the caller goes on."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import replace

import pytest

from specfuzz.engines.isolation import EngineCrash, IsolatedEngine, resolve_engine
from specfuzz.errors import InvalidInput
from specfuzz.fuzz.campaign import CampaignConfig
from specfuzz.fuzz.corpus import Corpus, Entry
from specfuzz.fuzz.run import DEFAULT_BATCH, crash_entry, engine_config, entry_crash_batch, run_case
from specfuzz.oracle.catalogue import catalogue
from specfuzz.oracle.speculative import SpecConfig

ALPHA = 1e-3


def _clean(bug: str):
    case = catalogue()[bug].case
    return case.with_(spec=replace(case.spec, inject=None))


def test_third_party_engine_runs_by_module_and_class_name_and_its_unknown_bug_is_found(tmp_path):
    case = _clean("N5").with_(spec=SpecConfig("draft_model", 2), draft_table=[[2.0, 0, 0, 0]] * 4)
    with IsolatedEngine("example_engines:UncataloguedBugEngine") as eng:
        run = run_case(eng, case, ckpt_root=tmp_path, alpha=ALPHA, max_samples=20000, batch=500)
        assert eng.version()["name"] == "uncatalogued-bug"
    assert run.crash is None
    assert run.judgement.verdict.status == "fail", run.judgement.verdict.evidence
    assert run.judgement.attribution.label == "unknown"


def test_reference_engine_with_injection_is_caught_and_attributed_through_a_child_process(tmp_path):
    with IsolatedEngine("reference", {"inject": "N6"}) as eng:
        run = run_case(eng, _clean("N6"), ckpt_root=tmp_path, alpha=ALPHA, max_samples=5000, batch=100)
    assert run.judgement.verdict.status == "fail"
    assert run.judgement.attribution.label == "N6"


def test_engine_that_raises_becomes_a_crash_finding_and_the_next_case_runs(tmp_path):
    corpus = Corpus(tmp_path / "corpus")
    eng = IsolatedEngine("example_engines:FaultyEngine", {"mode": "raise", "once_file": str(tmp_path / "failed-once")})
    case = _clean("N1")
    run = run_case(eng, case, ckpt_root=tmp_path, alpha=ALPHA, max_samples=200, batch=100)
    assert run.crash is not None and run.crash.kind == "exception"
    assert "illegal memory access" in run.crash.detail
    assert "faulty engine: failing" in run.crash.log_tail
    path, is_new = corpus.store(crash_entry(eng, case, run.crash, "faulty", batch=100))
    stored = json.loads(path.read_text())
    assert is_new and stored["kind"] == "crash" and "illegal memory access" in stored["evidence"]
    # Replays, bisection and repro.py send the batch it crashed in (some crashes need all of it);
    # an entry from before batches were recorded gets the campaign's default batch.
    assert stored["extra"]["batch_size"] == 100 and entry_crash_batch(Entry.from_json(stored)) == 100
    del stored["extra"]["batch_size"]
    assert entry_crash_batch(Entry.from_json(stored)) == DEFAULT_BATCH == CampaignConfig().batch
    # The caller goes on: the next case restarts a fresh engine process.
    run2 = run_case(eng, case, ckpt_root=tmp_path, alpha=ALPHA, max_samples=300, batch=100)
    assert run2.crash is None and run2.n == 300
    assert eng.crashes == 1 and eng.starts == 2
    eng.close()


def test_engine_segfault_is_a_crash_finding(tmp_path):
    with IsolatedEngine("example_engines:FaultyEngine", {"mode": "segfault"}) as eng:
        run = run_case(eng, _clean("N1"), ckpt_root=tmp_path, alpha=ALPHA, max_samples=100, batch=100)
    assert run.crash is not None and run.crash.kind == "signal"
    assert "SIGSEGV" in run.crash.detail


def test_engine_killed_with_sigkill_mid_run_is_a_crash_and_the_caller_goes_on(tmp_path):
    eng = IsolatedEngine("example_engines:SlowEngine")
    case = _clean("N1")
    result = {}

    def work():
        result["run"] = run_case(eng, case, ckpt_root=tmp_path, alpha=ALPHA, max_samples=100, batch=100)

    th = threading.Thread(target=work)
    th.start()
    deadline = time.time() + 60
    while eng._config is None and time.time() < deadline:  # wait until started and generating
        time.sleep(0.1)
    time.sleep(0.5)
    os.kill(eng.pid, signal.SIGKILL)
    th.join(60)
    crash = result["run"].crash
    assert crash is not None and crash.kind == "signal" and "SIGKILL" in crash.detail
    eng.close()
    with IsolatedEngine("reference") as eng2:
        run = run_case(eng2, case, ckpt_root=tmp_path, alpha=ALPHA, max_samples=300, batch=100)
    assert run.crash is None and run.n == 300


def test_hanging_engine_times_out_as_a_crash(tmp_path):
    with IsolatedEngine("example_engines:FaultyEngine", {"mode": "hang"}, call_timeout_s=3) as eng:
        t0 = time.time()
        run = run_case(eng, _clean("N1"), ckpt_root=tmp_path, alpha=ALPHA, max_samples=100, batch=100)
    assert run.crash is not None and run.crash.kind == "timeout"
    assert time.time() - t0 < 60


def test_bad_engine_names_and_configs_are_clear_errors(tmp_path):
    with pytest.raises(InvalidInput, match="engine='nope'"):
        resolve_engine("nope")
    with pytest.raises(InvalidInput, match="no_such_module"):
        IsolatedEngine("no_such_module:Engine").version()
    case = _clean("N5").with_(spec=SpecConfig("eagle", 1))
    with IsolatedEngine("reference") as eng:
        with pytest.raises(InvalidInput, match="'eagle'"):
            eng.start(engine_config(case, tmp_path))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_spare_process_takes_the_next_restart_warm_and_ends_with_the_engine(tmp_path):
    """IsolatedEngine(spare=True) keeps one more engine process started and preloaded: an engine
    that restarts in a new process for a new config (and after a crash) takes it, a new spare
    warms up behind it, and close() ends both."""
    case = _clean("N1")
    eng = IsolatedEngine("example_engines:ProcessRestartEngine", spare=True, log_dir=tmp_path / "logs")
    assert eng.capabilities().restart_in_process is False
    eng.start(engine_config(case, tmp_path / "a"))
    first = eng.call("warm")
    assert first[1] is False  # the first process was spawned cold
    time.sleep(3)  # the spare spawned with the first process has preloaded by now
    other = case.with_(spec=replace(case.spec, num_speculative_tokens=case.spec.num_speculative_tokens + 1))
    eng.start(engine_config(other, tmp_path / "b"))  # a new config: a restart in a new process
    second = eng.call("warm")
    assert second[0] != first[0] and second[1] is True and eng.warm_starts == 1 and eng.starts == 2
    assert not _alive(first[0])
    spare_pid = eng._spare[0].pid
    assert _alive(spare_pid)
    run = run_case(eng, other, ckpt_root=tmp_path / "b", alpha=ALPHA, max_samples=200, batch=100)
    assert run.crash is None and run.n == 200
    eng.close()
    time.sleep(0.5)
    assert eng._spare is None and not _alive(spare_pid) and not _alive(second[0])


def test_a_fresh_start_takes_the_preloaded_spare(tmp_path):
    """A fresh start (confirmations) of an engine that restarts in a new process runs in the
    spare process preloaded before it, also when the family's launch record (its adapter's
    launch_args, asked before the start) is what first reached a process. Measured on the
    H200 (vLLM 0.25, 2026-12-03): that query took the spare, the fresh start then killed it
    as if an engine had run in it and started in the spare spawned a moment before, still
    importing vLLM: fresh confirmation starts of 22-30 s against 5 s for restarts."""
    case = _clean("N1")
    eng = IsolatedEngine("example_engines:ProcessRestartEngine", spare=True, log_dir=tmp_path / "logs")
    assert eng.capabilities().restart_in_process is False  # the process that answered this holds no engine
    eng.close(keep_spare=True, discard=True)
    for i in range(2):
        time.sleep(1.5)  # the spare has preloaded by now
        spare_pid = eng._spare[0].pid
        spawned = eng._spawned
        run_case(eng, case, ckpt_root=tmp_path / f"c{i}", alpha=ALPHA, max_samples=100, batch=100, fresh=True)
        pid, preloaded = eng.call("warm")
        assert (pid, preloaded) == (spare_pid, True), f"round {i}: ran in {pid}, the spare was {spare_pid}"
        assert eng._spawned == spawned + 1  # only the spare behind it
        eng.close(keep_spare=True, discard=True)
    assert eng.starts == 2
    eng.close()


def test_without_a_spare_every_restart_is_cold(tmp_path):
    case = _clean("N1")
    with IsolatedEngine("example_engines:ProcessRestartEngine", log_dir=tmp_path / "logs") as eng:
        eng.start(engine_config(case, tmp_path / "a"))
        other = case.with_(spec=replace(case.spec, num_speculative_tokens=case.spec.num_speculative_tokens + 1))
        eng.start(engine_config(other, tmp_path / "b"))
        assert eng.call("warm")[1] is False and eng.warm_starts == 0 and eng._spare is None


def test_the_wait_for_a_new_engine_process_counts_as_start_time(tmp_path):
    """A new process's imports delay whatever command comes first (capabilities, a launch
    record): that wait is engine-start time, not time of the command, and it is counted once."""
    case = _clean("N1")
    with IsolatedEngine("example_engines:SlowInitEngine", log_dir=tmp_path / "logs") as eng:
        eng.capabilities()
        assert eng.seconds["start"] >= 1.4 and eng.starts == 0
        waited = eng.seconds["start"]
        eng.version()
        assert eng.seconds["start"] == waited  # answered at once: nothing more
        eng.close()
        eng.start(engine_config(case, tmp_path / "a"))  # a new process: its wait is inside start()
        assert waited + 1.4 <= eng.seconds["start"] < 2 * waited + 30
        assert eng.starts == 1


def test_the_oracle_refuses_a_case_before_the_engine_starts_and_builds_the_tests_beside_the_engine(tmp_path, monkeypatch):
    # μ is computed before the engine does anything (a case the oracle cannot take costs no
    # start); the catalogued bug laws are built in a thread while the engine starts and
    # samples, and the verdict is the same as ever (N6 injected: caught and attributed).
    import numpy as np

    from specfuzz.errors import AmbiguousSemantics
    from specfuzz.oracle.params import SamplingParams

    tie = _clean("N1").with_(target_table=np.zeros((2, 2), dtype=np.float32), spec=None, draft_table=None,
                             params=SamplingParams(temperature=1.0, top_k=1, max_tokens=1))
    with IsolatedEngine("reference", {"inject": "N6"}) as eng:
        with pytest.raises(AmbiguousSemantics):
            run_case(eng, tie, ckpt_root=tmp_path, alpha=ALPHA, max_samples=100, batch=100, speculation=False)
        assert eng.starts == 0
        threads = []
        real = threading.Thread.start

        def spy(self):
            threads.append(self.name)
            return real(self)

        monkeypatch.setattr(threading.Thread, "start", spy)
        run = run_case(eng, _clean("N6"), ckpt_root=tmp_path, alpha=ALPHA, max_samples=5000, batch=100)
        monkeypatch.undo()
    assert any(n.startswith("specfuzz-oracle") for n in threads), threads
    assert run.judgement.verdict.status == "fail" and run.judgement.attribution.label == "N6"
