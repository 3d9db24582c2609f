"""How SGLang's own processes start: its way (``spawn``) or from a warm fork server.

``sglang.Engine`` starts its scheduler and detokenizer as new processes: it forces
multiprocessing's ``spawn`` (``_set_envs_and_config``) and creates them with ``mp.Process``.
A spawned process imports Python, torch and SGLang's scheduler again, on every engine start.
With ``settings={"child_start": "forkserver"}`` the adapter starts them instead from a fork
server (:mod:`multiprocessing.forkserver`) that has imported SGLang's scheduler and
detokenizer modules already: a spare engine process (``IsolatedEngine(spare=True)``) starts
that server in its ``preload``, while no one waits for it, so the engine's start forks
processes that have those imports done.

What stays as SGLang runs it: the processes' code, their arguments (pickled as ``spawn``
pickles them), and their environment: a forked process would inherit the fork server's
environment of when it started, so each one is given the environment of the moment SGLang
creates it (after ``_set_envs_and_config`` and the adapter's ``settings["env"]``) before
SGLang's function runs. CUDA is initialised in the new processes only, as with ``spawn``
(the fork server imports modules, it never touches a device; :func:`warm` checks that).
A ``repro.py`` drafted from a finding starts SGLang its own way (``spawn``): a finding is
confirmed by what a maintainer runs.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import os
from collections.abc import Iterator

CHILD_STARTS = ("spawn", "forkserver")
# What SGLang's processes import first (run_scheduler_process, run_detokenizer_process).
FORKSERVER_MODULES = ("sglang.srt.managers.scheduler", "sglang.srt.managers.detokenizer_manager")


def _run_with_environ(env: dict, target, args: tuple, kwargs: dict):  # pragma: no cover - runs in SGLang's processes
    os.environ.clear()
    os.environ.update(env)
    return target(*args, **kwargs)


class EnvironForkServerProcess(multiprocessing.context.ForkServerProcess):
    """A process forked by the fork server that runs ``target`` with the environment of the
    moment it was created (not the fork server's)."""

    def __init__(self, group=None, target=None, name=None, args=(), kwargs=None, *, daemon=None) -> None:
        super().__init__(group=group, target=_run_with_environ, name=name,
                         args=(dict(os.environ), target, tuple(args), dict(kwargs or {})), daemon=daemon)


def warm() -> None:
    """Start this process's fork server with SGLang's process modules imported (idempotent)."""
    multiprocessing.set_forkserver_preload(list(FORKSERVER_MODULES))
    multiprocessing.forkserver.ensure_running()


@contextlib.contextmanager
def sglang_children(child_start: str) -> Iterator[None]:
    """Within the block, the processes ``sglang.Engine`` creates start by ``child_start``
    (``spawn``: SGLang's own way, nothing changed; ``forkserver``: from this process's fork
    server, started here when :func:`warm` has not)."""
    if child_start == "spawn":
        yield
        return
    warm()
    saved = multiprocessing.Process
    multiprocessing.Process = EnvironForkServerProcess  # what SGLang's ``mp.Process(...)`` resolves
    try:
        yield
    finally:
        multiprocessing.Process = saved
