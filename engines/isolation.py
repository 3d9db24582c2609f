"""Engines run in a child process, with timeouts; a crash is a finding, not the end.

:class:`IsolatedEngine` hosts any :class:`~specfuzz.engines.base.Engine` in a child
process started with ``spawn``. The child's stdout/stderr (file descriptors 1 and 2, so
C++/CUDA messages too) go to a log file. When the child dies (a segfault, a GPU fault,
SIGKILL, out-of-memory), hangs past its timeout, or the engine raises, the parent gets
an :class:`EngineCrash` carrying the log tail; the next call starts a fresh child.
Bad configuration (:class:`~specfuzz.errors.InvalidInput` from ``start``) is re-raised
as such: it is the user's error, not the engine's.

The child is a *daemon* process unless the engine starts processes of its own that
must not be daemonic: SGLang's ``Engine`` starts its scheduler and detokenizer with
multiprocessing, which a daemonic process may not do ("daemonic processes are not
allowed to have children"). Those engines (:data:`NON_DAEMON_ENGINES`, or
``IsolatedEngine(..., daemon=False)``) run in a non-daemon child. Either way nothing
outlives the caller: the child leads its own process group, which is killed on close,
crash, timeout and at the caller's exit (an ``atexit`` hook: multiprocessing would
otherwise *join* a non-daemon child at exit), and a thread in the child kills that
group when the caller dies without closing it (SIGKILL, SIGTERM).
"""

from __future__ import annotations

import atexit
import copy
import importlib
import multiprocessing as mp
import multiprocessing.util  # noqa: F401  (its atexit hook must be registered before ours)
import os
import re
import signal
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from specfuzz.engines.base import (
    Capabilities, Completion, EngineConfig, Request, SwapReport, SwapUnsupported, TableCheck, swap_key, swap_parts,
    table_parts,
)
from specfuzz.engines.isolation_child import PROFILE_ENV, _child_main
from specfuzz.errors import InvalidInput, SpecfuzzError

# Re-exported: the child's entry point and its profiling switch (bench/bench_reuse.py).
__all__ = ["BUILTIN_ENGINES", "EngineCrash", "IsolatedEngine", "PROFILE_ENV", "_child_main", "load_engine_class",
           "resolve_engine"]

BUILTIN_ENGINES = {
    "reference": "specfuzz.engines.reference_engine:ReferenceEngine",
    "vllm": "specfuzz.engines.vllm_engine:VLLMEngine",
    "hf": "specfuzz.engines.hf_engine:HFEngine",
    "sglang": "specfuzz.engines.sglang_engine:SGLangEngine",
    "llamacpp": "specfuzz.engines.llamacpp_engine:LlamaCppEngine",
    "mlx": "specfuzz.engines.mlx_engine:MLXEngine",
}
# Engines (resolved ``module:Class``) that start multiprocessing children of their own and
# so need a non-daemon child process (see the module docstring).
NON_DAEMON_ENGINES = frozenset({"specfuzz.engines.sglang_engine:SGLangEngine"})
LOG_TAIL_BYTES = 8000
# The waits an engine lends to its ``while_waiting`` hook: its starts (a new process's imports
# included) and a prestarted engine's warm-up, never a generate call or a swap.
FILLED_WAITS = frozenset({"ping", "start", "warm_up"})
# An engine start refused for lack of GPU memory (the words of its log): SGLang 0.5.17's
# KV-cache sizing charges memory that other processes allocate while it loads to its own
# --mem-fraction-static, so with several engines of a campaign on one GPU (--workers,
# prestarted and confirmation engines) a start can fail while another engine allocates its
# cache. The start is tried again after a wait; refused every time, it is an EngineCrash of
# kind "resource": a failure
# of the machine's share, which campaigns never store as a finding.
MEMORY_REFUSAL = re.compile(
    r"Loaded weights leave no GPU memory for the KV cache|Not enough memory\. Please try to increase --mem-fraction-static"
    r"|CUDA out of memory|torch\.OutOfMemoryError|No available memory for the cache blocks"
    r"|Free memory on device .* is less than desired GPU memory utilization")
START_RETRIES = 2
START_RETRY_WAIT_S = 15.0  # times the attempt number


class EngineCrash(SpecfuzzError):
    """The engine process died, hung, or raised. ``kind``: exit, signal, timeout, exception;
    resource: it refused to start for lack of GPU memory, again and again (MEMORY_REFUSAL)."""

    def __init__(self, kind: str, detail: str, log_tail: str = "") -> None:
        self.kind = kind
        self.detail = detail
        self.log_tail = log_tail
        super().__init__(f"engine {kind}: {detail}")


def resolve_engine(spec: str) -> str:
    """A builtin engine name or ``package.module:Class`` -> ``module:Class``."""
    target = BUILTIN_ENGINES.get(spec, spec)
    if ":" not in target or not all(target.split(":", 1)):
        raise InvalidInput("engine", spec, f"one of {sorted(BUILTIN_ENGINES)} or 'package.module:Class'")
    return target


def load_engine_class(spec: str) -> type:
    module_name, cls_name = resolve_engine(spec).split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidInput("engine", spec, f"an importable module ({exc})") from None
    cls = getattr(module, cls_name, None)
    if cls is None:
        raise InvalidInput("engine", spec, f"a class {cls_name!r} in module {module_name!r}")
    missing = [m for m in ("capabilities", "version", "start", "generate") if not callable(getattr(cls, m, None))]
    if missing:
        raise InvalidInput("engine", spec, f"a class implementing the Engine interface (missing: {', '.join(missing)})")
    return cls


# Live children of this process's IsolatedEngines, killed at exit (see the module docstring).
_LIVE: "weakref.WeakSet[IsolatedEngine]" = weakref.WeakSet()
# Adapters' launch_args per (engine, its settings, config): IsolatedEngine.launch_args.
_LAUNCH_ARGS: dict[tuple, Any] = {}
LAUNCH_ARGS_KEPT = 4096


@atexit.register
def _kill_live_children() -> None:
    for eng in list(_LIVE):
        try:
            eng._kill()
            eng.close_spare()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


def _end_process(proc, conn) -> None:
    """Kill a child engine process and its process group (the child leads its own group: its
    helpers, e.g. vLLM's engine-core processes, go down with it), and close its connection."""
    try:
        if proc.is_alive():
            proc.kill()
            proc.join(10)
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError, ValueError):
        pass
    if conn is not None:
        try:
            conn.close()
        except OSError:
            pass


class IsolatedEngine:
    """An engine in a child process. Same methods as an Engine, plus restart bookkeeping."""

    def __init__(
        self,
        engine_spec: str,
        kwargs: Mapping[str, Any] | None = None,
        *,
        start_timeout_s: float = 600.0,
        call_timeout_s: float = 600.0,
        log_dir: Path | None = None,
        daemon: bool | None = None,
        swap: bool = True,
        spare: bool = False,
    ) -> None:
        """``daemon``: run the engine in a daemon child (None: yes, unless the engine is
        one of :data:`NON_DAEMON_ENGINES`). ``swap``: load new tables into a running engine
        in place where it can (Capabilities.swap), instead of starting it again. ``spare``:
        keep one more engine process started and warmed up (its engine's ``preload``:
        the imports a start needs) in the background, which the next start in a new process
        takes instead of spawning one (for engines that restart in a new process:
        ``Capabilities.restart_in_process`` False). ``close()`` ends the spare too,
        ``close(keep_spare=True)`` keeps it for the next start."""
        self.engine_spec = resolve_engine(engine_spec)
        self.daemon = (self.engine_spec not in NON_DAEMON_ENGINES) if daemon is None else bool(daemon)
        self.kwargs = dict(kwargs or {})
        self.start_timeout_s = start_timeout_s
        self.call_timeout_s = call_timeout_s
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="specfuzz-engine-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._proc: mp.Process | None = None
        self._conn = None
        self._config: EngineConfig | None = None
        self._version: dict | None = None
        self._caps: Capabilities | None = None
        self.starts = 0
        self.crashes = 0
        self.start_retries = 0  # starts tried again after a refusal for lack of GPU memory (MEMORY_REFUSAL)
        self.log_path: Path | None = None
        # Table swaps (Capabilities.swap): ``swap=False`` starts the engine afresh for every
        # new config, as before swaps existed (benchmarks compare both).
        self.swap_enabled = swap
        self.swaps = 0
        self.swap_fallbacks = 0
        self.swaps_refused = 0  # of the fallbacks, swaps the engine refused (SwapUnsupported): a restart each
        # Wall time per activity (seconds): engine starts (process spawn included), swaps
        # (loading and the table check), and generate calls.
        self.seconds = {"start": 0.0, "swap": 0.0, "generate": 0.0}
        # What happened at swaps that a campaign log should show: fallbacks to a fresh start
        # (a failed table check or a refused swap), engine state kept across a swap, and
        # stale weights (the check failed after the swap and passed after a fresh start).
        self.events: list[dict] = []
        self.last_swap: SwapReport | None = None
        self.spare_enabled = bool(spare)
        self._spare: tuple[Any, Any, Path] | None = None  # (process, connection, log path)
        self._spawned = 0
        self._unready = False  # a new process that has not answered yet (see _await_ready)
        self._starting = False  # inside start()
        self.warm_starts = 0  # starts that took the spare process
        # Of seconds["start"]: waiting for a new process to answer (its imports, or the rest of
        # a spare's preload when the spare was taken before it was ready).
        self.ready_wait_s = 0.0
        # A prestarted engine (prestart()): a process sent ``start`` on a predicted config in
        # the background; a later start() of a config with its swap_key takes it.
        self._hot: dict | None = None
        self.prestarts = 0  # engines prestarted
        self.hot_starts = 0  # starts served by a prestarted engine
        # While this engine's start is waited for (its process's imports, the engine's own
        # start, a prestarted engine's remaining start and warm-up): ``while_waiting`` is called
        # about once a second, and may run work elsewhere (a campaign samples its running
        # search engine: fill_wait). Its seconds are lent out: counted in ``lent_s``, not in
        # ``seconds["start"]``, so that the engines' seconds still add up to at most the wall.
        self.while_waiting: Callable[[], None] | None = None
        self.lent_s = 0.0
        self._lending = False

    # -- process management ------------------------------------------------------------

    def _new_process(self, preload: bool) -> tuple[Any, Any, Path]:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self._spawned += 1
        log_path = self.log_dir / f"engine-{os.getpid()}-{id(self) % 100000}-{self._spawned}-{int(time.time())}.log"
        log_path.touch()
        proc = ctx.Process(target=_child_main, args=(child, self.engine_spec, self.kwargs, str(log_path), preload), daemon=self.daemon)
        proc.start()
        child.close()
        return proc, parent, log_path

    def _spawn(self) -> None:
        spare, self._spare = self._spare, None
        if spare is not None and spare[0].is_alive():
            proc, parent, self.log_path = spare
            self.warm_starts += 1
        else:
            if spare is not None:
                _end_process(spare[0], spare[1])
            proc, parent, self.log_path = self._new_process(preload=False)
        self._proc, self._conn = proc, parent
        self._config = None
        self._unready = True
        _LIVE.add(self)
        self._ensure_spare()

    def _await_ready(self, timeout: float) -> None:
        """Wait until a new engine process answers (its imports; a spare's preload): part of
        an engine start, counted in ``seconds["start"]`` whatever the first command is."""
        self._unready = False
        t0, lent = time.monotonic(), self.lent_s
        try:
            self._call("ping", timeout=timeout)
        finally:
            waited = time.monotonic() - t0 - (self.lent_s - lent)
            self.ready_wait_s += waited
            if not self._starting:  # within start(), start() counts it
                self.seconds["start"] += waited

    def _ensure_spare(self) -> None:
        if self.spare_enabled and (self._spare is None or not self._spare[0].is_alive()):
            if self._spare is not None:
                _end_process(self._spare[0], self._spare[1])
            self._spare = self._new_process(preload=True)
            _LIVE.add(self)

    def close_spare(self) -> None:
        """End the spare process and the prestarted engine, if any."""
        spare, self._spare = self._spare, None
        if spare is not None:
            _end_process(spare[0], spare[1])
        self._end_hot()

    def _end_hot(self, why: str | None = None) -> None:
        hot, self._hot = self._hot, None
        if hot is not None:
            _end_process(hot["proc"], hot["conn"])
            if why:
                self.events.append({"event": "prestarted engine unused", "detail": why, "to": str(hot["config"].target_dir)})

    def _kill(self) -> None:
        if self._proc is not None:
            _end_process(self._proc, self._conn)
        elif self._conn is not None:
            self._conn.close()
        self._proc, self._conn, self._config = None, None, None
        if self._spare is None and self._hot is None:
            _LIVE.discard(self)

    def log_tail(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - LOG_TAIL_BYTES))
            return f.read().decode("utf-8", "replace")

    def _call(self, cmd: str, *args: Any, timeout: float) -> Any:
        if self._proc is None:
            self._spawn()
        if self._unready and cmd != "ping":  # a start counts the wait in its own seconds (see _await_ready)
            self._await_ready(timeout)
        self._unready = False
        assert self._conn is not None and self._proc is not None
        try:
            self._conn.send((cmd, args))
        except (BrokenPipeError, OSError):
            return self._crashed("exit", f"engine process gone before {cmd}")
        return self._receive(cmd, timeout)

    def _receive(self, cmd: str, timeout: float) -> Any:
        """The engine process's reply to ``cmd`` (sent already), within ``timeout`` seconds."""
        assert self._conn is not None and self._proc is not None
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                # (past the deadline, one last look: lent work may have outlasted the answer)
                ready = self._conn.poll(min(max(remaining, 0.0), 1.0))
            except (EOFError, OSError):
                ready = False
            if ready:
                try:
                    reply = self._conn.recv()
                except (EOFError, OSError):
                    return self._crashed(*self._death(cmd))
                break
            if remaining <= 0:
                return self._crashed("timeout", f"{cmd} did not answer within {timeout:.0f} s")
            if not self._proc.is_alive():
                return self._crashed(*self._death(cmd))
            if cmd in FILLED_WAITS:
                self._lend_wait()
        status = reply[0]
        if status == "ok":
            return reply[1]
        if status == "missing":
            raise AttributeError(f"engine {self.engine_spec} has no method {reply[1]!r}")
        if status == "invalid":
            _, name, value_repr, allowed = reply
            raise InvalidInput(name, _Repr(value_repr), allowed)
        if status == "unsupported":
            raise SwapUnsupported(reply[1])
        _, exc_type, message, tb = reply
        self._kill()
        self.crashes += 1
        raise EngineCrash("exception", f"{cmd} raised {exc_type}: {message}", (self.log_tail() + "\n" + tb)[-LOG_TAIL_BYTES:])

    def _lend_wait(self) -> None:
        """One call of ``while_waiting`` (not nested: a hook whose work waits for a start of its
        own is not called again meanwhile); its seconds go to ``lent_s``."""
        hook = self.while_waiting
        if hook is None or self._lending:
            return
        self._lending = True
        t0 = time.monotonic()
        try:
            hook()
        finally:
            self._lending = False
            self.lent_s += time.monotonic() - t0

    def _death(self, cmd: str) -> tuple[str, str]:
        assert self._proc is not None
        self._proc.join(5)
        code = self._proc.exitcode
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = str(-code)
            return "signal", f"engine process killed by {name} during {cmd}"
        return "exit", f"engine process exited with code {code} during {cmd}"

    def _crashed(self, kind: str, detail: str):
        tail = self.log_tail()
        self._kill()
        self.crashes += 1
        raise EngineCrash(kind, detail, tail)

    # -- the Engine interface ----------------------------------------------------------

    def start(self, config: EngineConfig, *, fresh: bool = False) -> None:
        """Start (or reuse) an engine on ``config``.

        The same config reuses the running engine. A config that differs only in its
        tables (equal :func:`~specfuzz.engines.base.swap_key`) is swapped in place when the
        engine can swap every part that changed; the engine's own logits for every row of
        the new target table are then checked (``check_tables``) before the call returns,
        and a refused swap or a failed check falls back to a fresh start (recorded in
        :attr:`events`). Anything else starts the engine afresh. ``fresh=True`` always
        starts the engine afresh, never reusing or swapping (confirmations of a failure
        do): in its live process where the engine restarts in-process
        (``Capabilities.restart_in_process``), else in a new process.
        """
        self._starting = True
        try:
            for attempt in range(1, START_RETRIES + 2):
                try:
                    self._start(config, fresh)
                    return
                except EngineCrash as exc:
                    from specfuzz.fuzz.corpus import last_exception

                    why = MEMORY_REFUSAL.search(last_exception(exc.log_tail))  # what the start died of
                    if why is None or exc.kind == "resource":
                        raise
                    if attempt > START_RETRIES:
                        raise EngineCrash("resource", f"{exc.detail}: the engine refused to start for lack of GPU memory "
                                          f"{attempt} times ({why.group(0)})", exc.log_tail) from None
                    wait = START_RETRY_WAIT_S * attempt
                    self.start_retries += 1
                    self.events.append({"event": "engine start refused for lack of GPU memory; started again",
                                        "detail": why.group(0), "attempt": attempt, "wait_s": wait})
                    time.sleep(wait)
        finally:
            self._starting = False

    def _start(self, config: EngineConfig, fresh: bool) -> None:
        # A fresh start needs a process no engine has run in: one that has only answered
        # queries (its adapter's launch_args for the launch record, capabilities) is one,
        # and usually the preloaded spare; ending it would start in the spare spawned a
        # moment ago, still importing, which makes the start several times longer.
        if (fresh and self._proc is not None and self._config is not None
                and not getattr(self.capabilities(), "restart_in_process", True)):
            self.close(keep_spare=True, discard=True)
        if self._proc is not None and self._config == config and not fresh:
            return
        if not fresh and self._proc is not None and self._config is not None and self._swap(config):
            return
        if not fresh and self._take_hot(config):
            return
        if fresh and self._hot is not None and self._hot.get("fresh"):
            # A fresh start prestarted on exactly this config (prestart(fresh=True)) serves it;
            # one prestarted for another config ends here (it holds device memory).
            if self._take_hot(config, fresh=True):
                return
            self._end_hot("a fresh start of another config")
        # A live engine process is asked to start again on the new config (engines
        # release their previous model in start()), unless the engine says it cannot
        # restart in-process; a dead one is respawned by _call.
        if self._proc is not None and self._config is not None and not getattr(self.capabilities(), "restart_in_process", True):
            self.close(keep_spare=True, discard=True)
        t0, lent = time.monotonic(), self.lent_s
        try:
            self._call("start", config, timeout=self.start_timeout_s)
            if not fresh:
                self._warm_up(config)
        finally:
            self.seconds["start"] += time.monotonic() - t0 - (self.lent_s - lent)
        self._config = config
        self.starts += 1

    def _warm_up(self, config: EngineConfig) -> None:
        """After an ordinary (not fresh) start, the engine's ``warm_up`` if it has one (the
        sampler paths SGLang compiles on first use), so that compiling counts as starting, not
        as a family's sampling (on a cold GPU, compiling takes over a minute where sampling a
        family takes seconds). A prestarted engine runs it in the background (:meth:`prestart`); a fresh start (a
        confirmation's) runs none. A warm-up that fails is not a finding (a case that meets the
        fault meets it in its own run): logged, and the engine started again without one."""
        crashes = self.crashes
        try:
            warm = self._call("warm_up", timeout=self.start_timeout_s)
        except AttributeError:
            return  # the engine has no warm_up
        except (EngineCrash, InvalidInput, SwapUnsupported) as exc:
            self.crashes = crashes
            self._kill()
            self.events.append({"event": "engine warm-up failed; started again without one", "detail": str(exc)[:500],
                                "to": str(config.target_dir), "log_tail": str(getattr(exc, "log_tail", "") or "")[-2000:]})
            self._call("start", config, timeout=self.start_timeout_s)
            return
        if isinstance(warm, Mapping):
            self.events.append({"event": "engine warmed up", **{str(k): v for k, v in warm.items()}})

    def prestart(self, config: EngineConfig, *, fresh: bool = False) -> bool:
        """Start an engine on ``config`` in the background, in the spare process (or a new
        one), while this engine goes on serving its own config: a later :meth:`start` of any
        config with the same swap_key takes it, swaps its tables in and checks them, so that
        its wait is what is left of the start. For engines that restart in a new process
        (GPU engines, whose starts take tens of seconds) with spare processes and swaps on;
        returns whether an engine is (now or already) prestarting for that key. Such a
        prestarted engine never serves a ``fresh`` start (confirmations); one left unused
        ends with the next prestart or :meth:`close`. A prestart that fails only means a
        normal start later.

        ``fresh=True``: a fresh start begun early, for a confirmation whose case is known
        before it runs: started on exactly ``config`` (no warm-up, no swap), it serves only
        ``start(config, fresh=True)`` of that same config, so the confirmation still runs on
        an engine started on its own tables in a process no engine ran in before."""
        if not self.can_prestart():
            return False
        caps = self.capabilities()
        if fresh:
            key = None
            if self._hot is not None:
                if self._hot.get("fresh") and self._hot["config"] == config and self._hot["proc"].is_alive():
                    return True
                self._end_hot("a fresh start was prestarted")
        else:
            if not set(table_parts(config)) <= set(getattr(caps, "swap", ()) or ()):
                return False  # its tables could not be swapped into it
            key = swap_key(config)
            if self._hot is not None:
                if self._hot["key"] == key and self._hot["proc"].is_alive():
                    return True
                self._end_hot("another start shape was prestarted")
            if self._proc is not None and self._config is not None and swap_key(self._config) == key:
                return False  # the running engine serves it by a swap
        spare, self._spare = self._spare, None
        if spare is None or not spare[0].is_alive():
            if spare is not None:
                _end_process(spare[0], spare[1])
            spare = self._new_process(preload=True)
        proc, conn, log_path = spare
        try:
            conn.send(("start", (config,)))
            if not fresh:
                # Then the engine's warm_up, if it has one (say, the sampler paths SGLang compiles
                # on first use): still in the background, so no family's sampling waits for it.
                # (A fresh start runs none: a confirmation's engine has sampled nothing before.)
                conn.send(("warm_up", ()))
        except (BrokenPipeError, OSError):
            _end_process(proc, conn)
            return False
        self._hot = {"proc": proc, "conn": conn, "log": log_path, "config": config, "key": key, "sent": time.monotonic(),
                     "fresh": fresh}
        self.prestarts += 1
        _LIVE.add(self)
        self._ensure_spare()
        return True

    def can_prestart(self) -> bool:
        """Whether :meth:`prestart` can start an engine in the background here (spare processes
        and swaps on, an engine that restarts in a new process)."""
        return bool(self.spare_enabled and self.swap_enabled
                    and not getattr(self.capabilities(), "restart_in_process", True))

    def prestarted_key(self) -> str | None:
        """The swap_key of the engine prestarting (or prestarted) in the background and not
        yet taken by a start; None when there is none (or it is a fresh start's)."""
        hot = self._hot
        return None if hot is None or not hot["proc"].is_alive() else hot["key"]

    def launch_args(self, config: EngineConfig) -> Any:
        """The adapter's ``launch_args`` for ``config`` (what its start would apply: environment
        and keyword arguments), computed in an engine process and kept per engine, settings and
        config: asking again would take the spare process (or wait for a new one's imports, tens
        of seconds for a GPU engine) only to answer a query. AttributeError:
        the adapter has none."""
        key = (self.engine_spec, repr(sorted(self.kwargs.items())), repr(config))
        got = _LAUNCH_ARGS.get(key, _LAUNCH_ARGS)
        if got is _LAUNCH_ARGS:
            try:
                got = self._call("launch_args", config, timeout=self.start_timeout_s)
            except AttributeError:
                got = None
            if len(_LAUNCH_ARGS) >= LAUNCH_ARGS_KEPT:
                _LAUNCH_ARGS.clear()
            _LAUNCH_ARGS[key] = got
        if got is None:
            raise AttributeError(f"engine {self.engine_spec} has no method 'launch_args'")
        return copy.deepcopy(got)

    def prestarted_fresh(self) -> EngineConfig | None:
        """The config of a fresh start prestarted (``prestart(fresh=True)``) and not yet taken."""
        hot = self._hot
        return hot["config"] if hot is not None and hot.get("fresh") and hot["proc"].is_alive() else None

    def end_prestart(self, why: str) -> None:
        """End the prestarted engine, if any, unused (logged as such in :attr:`events`)."""
        self._end_hot(why)

    def _take_hot(self, config: EngineConfig, fresh: bool = False) -> bool:
        """Serve ``start(config)`` with the prestarted engine when it has ``config``'s swap_key:
        wait for what is left of its start (counted as start time), then swap ``config``'s
        tables in and check them (a failed check starts afresh, as after any swap). False:
        no prestarted engine for this key, or its start failed (then an ordinary start).
        ``fresh``: a fresh start, served only by a fresh prestart of exactly ``config``."""
        hot = self._hot
        if hot is None or bool(hot.get("fresh")) != fresh:
            return False
        if (hot["config"] != config) if fresh else (hot["key"] != swap_key(config)):
            return False
        self._hot = None
        if self._proc is not None:
            self.close(keep_spare=True, discard=True)
        self._proc, self._conn, self.log_path = hot["proc"], hot["conn"], hot["log"]
        self._config = None
        self._unready = False
        _LIVE.add(self)
        t0, lent = time.monotonic(), self.lent_s
        crashes = self.crashes
        step = "start"
        try:
            self._receive("start", max(1.0, self.start_timeout_s - (t0 - hot["sent"])))
            step = "warm-up"
            try:
                warm = None if fresh else self._receive("warm_up", max(1.0, self.start_timeout_s - (time.monotonic() - hot["sent"])))
            except AttributeError:
                warm = None  # the engine has no warm_up
            if isinstance(warm, Mapping):
                self.events.append({"event": "prestarted engine warmed up", **{str(k): v for k, v in warm.items()}})
        except (EngineCrash, InvalidInput, SwapUnsupported) as exc:
            # Not a finding: the ordinary start that follows meets the same fault if there is one
            # (a warm-up runs sampling settings that the campaign's own cases draw too).
            self.crashes = crashes
            self._kill()
            # The engine's log tail goes with it (an engine that kills itself leaves its
            # traceback there).
            self.events.append({"event": "prestarted engine failed", "detail": f"{step}: {str(exc)[:500]}", "to": str(hot["config"].target_dir),
                                "log_tail": str(getattr(exc, "log_tail", "") or "")[-2000:]})
            return False
        finally:
            self.seconds["start"] += time.monotonic() - t0 - (self.lent_s - lent)
        self._config = hot["config"]
        self.starts += 1
        self.hot_starts += 1
        return config == self._config or self._swap(config)

    def can_swap(self, config: EngineConfig) -> bool:
        """Whether the running engine could take ``config`` by a swap (not tried)."""
        if not self.swap_enabled or self._proc is None or self._config is None:
            return False
        parts = set(swap_parts(self._config, config))
        able = set(getattr(self.capabilities(), "swap", ()) or ())
        return bool(parts) and parts <= able and swap_key(self._config) == swap_key(config)

    def _swap(self, config: EngineConfig) -> bool:
        """Swap ``config``'s tables into the running engine and prove them; False: start fresh."""
        if not self.can_swap(config):
            return False
        old = self._config
        t0 = time.monotonic()
        try:
            try:
                report = self._call("swap", config, timeout=self.call_timeout_s)
                self._config = config
                check = self._call("check_tables", timeout=self.call_timeout_s)
            except (SwapUnsupported, AttributeError) as exc:
                # AttributeError: an engine that claims Capabilities.swap without swap() or
                # check_tables(); an unproven swap is never sampled.
                self._config = old
                self.swaps_refused += 1
                self._fallback("swap refused", str(exc), old, config)
                return False
        finally:
            self.seconds["swap"] += time.monotonic() - t0
        if not getattr(check, "ok", False):
            # No sample is taken on an unproven swap: start fresh, and see whether a fresh
            # engine reproduces the table (then the engine's update path left stale weights).
            self._config = old
            self._fallback("table check failed after swap", getattr(check, "detail", repr(check)), old, config, check=check)
            self.start(config, fresh=True)
            try:
                again = self._call("check_tables", timeout=self.call_timeout_s)
            except AttributeError:
                again = None
            if again is not None and getattr(again, "ok", False):
                self.events[-1]["stale_weights"] = True
                self.events[-1]["fresh_check"] = _check_json(again)
            return True
        self.swaps += 1
        self.last_swap = report
        if getattr(report, "kept", ()):
            self.events.append({"event": "state kept across swap", "kept": list(report.kept)})
        return True

    def _fallback(self, what: str, detail: str, old: EngineConfig, new: EngineConfig, check: TableCheck | None = None) -> None:
        self.swap_fallbacks += 1
        ev = {"event": what, "detail": str(detail)[:500], "from": str(old.target_dir), "to": str(new.target_dir),
              "parts": list(swap_parts(old, new))}
        if check is not None:
            ev["check"] = _check_json(check)
        self.events.append(ev)
        self.close(keep_spare=True)

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        if self._proc is None or self._config is None:
            raise RuntimeError("generate() before start()")
        t0 = time.monotonic()
        try:
            return self._call("generate", list(requests), timeout=self.call_timeout_s)
        finally:
            self.seconds["generate"] += time.monotonic() - t0

    def reset_state(self) -> tuple[str, ...]:
        """Reset the running engine's state that outlives a request (its ``reset_state``: the
        prefix cache, SGLang's n-gram trie), tables unchanged; what was reset. () where no
        engine runs or it has no such step. Its seconds count as swap time."""
        if self._proc is None or self._config is None:
            return ()
        t0 = time.monotonic()
        try:
            return tuple(self._call("reset_state", timeout=self.call_timeout_s) or ())
        except AttributeError:
            return ()
        finally:
            self.seconds["swap"] += time.monotonic() - t0

    def version(self) -> dict:
        if self._version is None:
            self._version = dict(self._call("version", timeout=self.start_timeout_s))
        return self._version

    def capabilities(self) -> Capabilities:
        if self._caps is None:
            self._caps = self._call("capabilities", timeout=self.start_timeout_s)
        return self._caps

    def call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        """Call another method of the started engine by name (e.g. ``logits_match_table``).

        Raises AttributeError (engine left running) when the engine has no such method.
        """
        if self._proc is None or self._config is None:
            raise RuntimeError(f"{method}() before start()")
        return self._call(method, *args, timeout=self.call_timeout_s if timeout is None else timeout)

    @property
    def running_config(self) -> EngineConfig | None:
        """The config of the engine running now (None: none is)."""
        return self._config if self._proc is not None else None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def close(self, keep_spare: bool = False, discard: bool = False) -> None:
        """End the engine process (and the spare one, unless ``keep_spare``). ``discard``: a
        process of an engine that restarts in a new process, ended to make way for another
        (a new start, a fresh confirmation done): killed with its process group at once
        instead of asked to shut down (a GPU engine's shutdown takes seconds to tens of
        seconds, and the device frees its memory when the processes die), unless engine
        processes are being profiled (their profiles are written at shutdown)."""
        if not keep_spare:
            self.close_spare()
        if self._proc is None:
            return
        if discard and not os.environ.get(PROFILE_ENV):
            self._kill()
            return
        try:
            if self._proc.is_alive():
                self._conn.send(("close", ()))
                if self._conn.poll(30):
                    self._conn.recv()
        except (BrokenPipeError, EOFError, OSError):
            pass
        self._kill()

    def __enter__(self) -> "IsolatedEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_json(check: object) -> dict:
    to_json = getattr(check, "to_json", None)
    return to_json() if callable(to_json) else {"ok": bool(getattr(check, "ok", False)), "repr": repr(check)[:300]}


class _Repr:
    """Carries a value's repr across the process boundary for error messages."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text
