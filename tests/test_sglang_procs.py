"""SGLang's processes started from a warm fork server (engines/sglang_procs.py): the code, the
arguments and the environment of the moment they are created stay as with ``spawn``."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from specfuzz.engines import sglang_procs
from specfuzz.engines.sglang_engine import child_start_setting
from specfuzz.errors import InvalidInput


def _report(path: str, name: str, marker: str) -> None:
    with open(path, "w") as f:
        f.write(f"{os.environ.get(name)}|{os.getppid()}|{marker}")


def test_forkserver_children_run_with_the_environment_of_their_creation(tmp_path, monkeypatch):
    out = tmp_path / "child.txt"
    sglang_procs.warm()  # the fork server starts now, before the variable exists
    monkeypatch.setenv("SPECFUZZ_PROBE_VAR", "set-after-the-server-started")
    with sglang_procs.sglang_children("forkserver"):
        p = multiprocessing.Process(target=_report, args=(str(out), "SPECFUZZ_PROBE_VAR", "ran"))
        assert isinstance(p, sglang_procs.EnvironForkServerProcess)
        p.start()
        p.join(60)
    assert p.exitcode == 0
    value, ppid, marker = out.read_text().split("|")
    assert (value, marker) == ("set-after-the-server-started", "ran")
    assert int(ppid) != os.getpid()  # forked by the server, not spawned by this process
    assert multiprocessing.Process is multiprocessing.context.Process  # restored after the block


def test_spawn_leaves_multiprocessing_alone():
    with sglang_procs.sglang_children("spawn"):
        assert multiprocessing.Process is multiprocessing.context.Process


def test_child_start_setting_is_checked():
    assert child_start_setting({}) == "spawn"
    assert child_start_setting({"child_start": "forkserver"}) == "forkserver"
    with pytest.raises(InvalidInput, match="child_start"):
        child_start_setting({"child_start": "fork"})
