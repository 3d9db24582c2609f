"""The child side of an isolated engine: the process that hosts the engine and answers commands.

:func:`_child_main` runs in the child process that :class:`~specfuzz.engines.isolation.
IsolatedEngine` spawns: it leads its own process group (a thread kills the group when the
parent dies), sends its stdout/stderr to the engine's log file, builds the engine, and then
answers one command at a time from the pipe (``("ok", result)``, or an error reply the parent
turns into :class:`~specfuzz.errors.InvalidInput`, ``SwapUnsupported`` or an ``EngineCrash``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Mapping

from specfuzz.engines.base import SwapUnsupported
from specfuzz.errors import InvalidInput

# How often the child checks that its parent is still alive (seconds).
PARENT_POLL_S = 1.0
# SPECFUZZ_PROFILE_DIR=<folder>: every engine child profiles itself (cProfile: what the
# adapter and an in-process engine do per command) into <folder>/engine-<pid>.prof, written
# at most every PROFILE_DUMP_S seconds and when it closes (bench/bench_reuse.py --profile).
PROFILE_ENV = "SPECFUZZ_PROFILE_DIR"
PROFILE_DUMP_S = 20.0


class _ChildProfile:  # pragma: no cover - runs in the child
    def __init__(self) -> None:
        folder = os.environ.get(PROFILE_ENV)
        self.prof = None
        if folder:
            import cProfile

            Path(folder).mkdir(parents=True, exist_ok=True)
            self.path = os.path.join(folder, f"engine-{os.getpid()}.prof")
            self.prof = cProfile.Profile()
            self.prof.enable()
            self.dumped = time.monotonic()

    def dump(self, force: bool = False) -> None:
        if self.prof is None or (not force and time.monotonic() - self.dumped < PROFILE_DUMP_S):
            return
        self.prof.dump_stats(self.path)  # (disables the profiler)
        self.dumped = time.monotonic()
        if not force:
            self.prof.enable()


def _kill_group_when_orphaned(parent_pid: int) -> None:  # pragma: no cover - runs in the child
    """Kill this process group (the child and every process it started) once the parent is gone."""
    while True:
        time.sleep(PARENT_POLL_S)
        if os.getppid() != parent_pid:
            os.killpg(0, signal.SIGKILL)


def _child_main(conn, engine_spec: str, kwargs: Mapping[str, Any], log_path: str, preload: bool = False) -> None:  # pragma: no cover - runs in the child
    from specfuzz.engines.isolation import load_engine_class

    os.setsid()
    threading.Thread(target=_kill_group_when_orphaned, args=(os.getppid(),), daemon=True, name="specfuzz-orphan-watch").start()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    try:
        engine = load_engine_class(engine_spec)(**kwargs)
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        conn.send(_error_reply(exc))
        return
    if preload:
        # A spare process (IsolatedEngine(spare=True)): import what the engine's start needs
        # now, while no one waits for it. A failure here only means a slower start later.
        fn = getattr(engine, "preload", None)
        if callable(fn):
            try:
                fn()
            except Exception:  # noqa: BLE001
                traceback.print_exc()
    profile = _ChildProfile()
    while True:
        profile.dump()
        try:
            cmd, args = conn.recv()
        except EOFError:
            close = getattr(engine, "close", None)
            if close:
                close()
            profile.dump(force=True)
            return
        try:
            if cmd == "ping":  # IsolatedEngine._await_ready: the process is up (imports, preload done)
                conn.send(("ok", None))
                continue
            if cmd == "close":
                close = getattr(engine, "close", None)
                if close:
                    close()
                profile.dump(force=True)
                conn.send(("ok", None))
                return
            method = getattr(engine, cmd, None)
            if not callable(method):
                conn.send(("missing", cmd))
                continue
            result = method(*args)
            if cmd in ("version",):
                result = dict(result)
            if cmd == "generate":
                result = list(result)
            conn.send(("ok", result))
        except BaseException as exc:  # noqa: BLE001
            conn.send(_error_reply(exc))

def _error_reply(exc: BaseException) -> tuple:
    """The reply that carries an exception of the engine back to the parent."""
    if isinstance(exc, InvalidInput):
        return ("invalid", exc.name, repr(exc.value), exc.allowed)
    if isinstance(exc, SwapUnsupported):
        return ("unsupported", str(exc))
    return ("error", type(exc).__name__, str(exc), traceback.format_exc())
