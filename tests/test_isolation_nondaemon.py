"""The isolation that SGLang needs: an engine that starts processes of its own runs in a
non-daemon child, and nothing outlives a caller killed without closing it.

SGLang's ``Engine`` starts its scheduler and detokenizer with multiprocessing, which a daemonic
process may not do; :class:`~specfuzz.engines.isolation.IsolatedEngine` hosts such engines in
a non-daemon child. A stand-in engine (the reference engine plus a multiprocessing child) checks
it on any machine.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specfuzz.case import Case
from specfuzz.engines.base import EngineConfig, Request
from specfuzz.engines.isolation import EngineCrash, IsolatedEngine
from specfuzz.engines.reference_engine import ReferenceEngine
from specfuzz.fuzz.run import engine_config
from specfuzz.oracle.params import SamplingParams as SP

from sglang_helpers import EOS, PROMPT, T


# ----------------------------------------------------------------------------- isolation: non-daemon children


def _sleep_forever() -> None:  # pragma: no cover - runs in a grandchild
    while True:
        time.sleep(60)


class ChildProcessEngine(ReferenceEngine):
    """The reference engine plus a multiprocessing child, as SGLang's Engine starts its scheduler."""

    name = "child-process"

    def start(self, config: EngineConfig) -> None:
        super().start(config)
        if getattr(self, "_helper", None) is None:
            self._helper = mp.get_context("spawn").Process(target=_sleep_forever)
            self._helper.start()

    def helper_pid(self) -> int:
        return self._helper.pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _wait_dead(pids, timeout: float = 15.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.2)
    return False


def test_sglang_runs_in_a_non_daemon_child_and_others_stay_daemonic():
    assert IsolatedEngine("sglang").daemon is False
    assert IsolatedEngine("reference").daemon is True
    assert IsolatedEngine("reference", daemon=False).daemon is False


def test_an_engine_that_starts_processes_fails_in_a_daemon_child_and_runs_in_a_non_daemon_one(tmp_path):
    case = Case(T, PROMPT, SP(max_tokens=2), eos_token_id=EOS)
    cfg = engine_config(case, tmp_path)
    with IsolatedEngine("test_isolation_nondaemon:ChildProcessEngine", daemon=True, log_dir=tmp_path / "logs") as eng:
        with pytest.raises(EngineCrash, match="daemonic processes are not allowed to have children"):
            eng.start(cfg)
    eng = IsolatedEngine("test_isolation_nondaemon:ChildProcessEngine", log_dir=tmp_path / "logs", daemon=False)
    eng.start(cfg)
    helper = eng.call("helper_pid")
    assert _alive(helper)
    assert len(eng.generate([Request(PROMPT, case.params)] * 3)) == 3
    with pytest.raises(AttributeError, match="no_such_method"):
        eng.call("no_such_method")
    assert len(eng.generate([Request(PROMPT, case.params)])) == 1  # a missing method does not kill the engine
    child = eng.pid
    eng.close()
    assert _wait_dead([child, helper]), "the engine process or its helper outlived close()"


ORPHAN_SCRIPT = """
import sys, time
from specfuzz.case import Case
from specfuzz.engines.isolation import IsolatedEngine
from specfuzz.fuzz.run import engine_config
from specfuzz.oracle.params import SamplingParams
import numpy as np
case = Case(np.zeros((4, 4), np.float32), (1, 2), SamplingParams(max_tokens=2), eos_token_id=3)
eng = IsolatedEngine("test_isolation_nondaemon:ChildProcessEngine", daemon=False, log_dir=sys.argv[1])
eng.start(engine_config(case, sys.argv[1]))
print(eng.pid, eng.call("helper_pid"), flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_nothing_outlives_a_caller_that_dies_without_closing(tmp_path, sig):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", ORPHAN_SCRIPT, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        child, helper = (int(x) for x in line.split())
        assert _alive(child) and _alive(helper)
        proc.send_signal(sig)
        proc.wait(30)
        assert _wait_dead([child, helper]), "the engine process or its helper outlived the killed caller"
    finally:
        if proc.poll() is None:
            proc.kill()


