"""An isolated engine whose child process runs in another Python environment.

:class:`ExternalEngine` is an :class:`~specfuzz.engines.isolation.IsolatedEngine` whose
child is started with another interpreter (a release environment made by
:mod:`specfuzz.fuzz.release_envs`: one engine release, its own torch). Everything else —
timeouts, crash detection, log tails, killing the child's process group — is the
isolation layer's, unchanged: only how the child starts differs.

The child runs :mod:`specfuzz.engines.external_child` as a script with ``-I`` (no
``PYTHONPATH``, no user site: nothing of the caller's environment leaks in). That script
makes ``specfuzz`` importable from the caller's own source folders (so the release
environment needs no copy of specfuzz, and never a stale one), then serves the same
request loop as a multiprocessing child, over one end of a socket pair inherited as a
file descriptor. The two interpreters must be the same Python version (pickles cross);
release environments are made from the caller's base interpreter for that reason.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import socket
import subprocess
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Mapping

from specfuzz.engines import isolation
from specfuzz.engines.isolation import IsolatedEngine

CHILD_SCRIPT = Path(__file__).with_name("external_child.py")
# specfuzz's subpackages: the child finds each where the caller's import system does.
SUBPACKAGES = ("oracle", "tablegen", "strategies", "fuzz", "engines")
# Caller variables that must not reach the child (they point at the caller's environment).
_DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP", "PYTHONSAFEPATH")


def package_paths() -> list[str]:
    """Folders that make up the caller's ``specfuzz`` package: its own ``__path__``, then
    the parent folder of each subpackage (a source checkout maps ``specfuzz`` to ``core/``
    and ``specfuzz.oracle`` to ``oracle/``; an installed wheel has them all in one)."""
    import specfuzz

    paths = [str(Path(p).resolve()) for p in specfuzz.__path__]
    for sub in SUBPACKAGES:
        spec = importlib.util.find_spec(f"specfuzz.{sub}")
        if spec is None or not spec.submodule_search_locations:
            continue
        parent = str(Path(list(spec.submodule_search_locations)[0]).resolve().parent)
        if parent not in paths:
            paths.append(parent)
    return paths


class _PopenProcess:
    """The subset of ``multiprocessing.Process`` the isolation layer uses, for a Popen."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self._p = popen

    @property
    def pid(self) -> int:
        return self._p.pid

    @property
    def exitcode(self) -> int | None:
        return self._p.poll()

    def is_alive(self) -> bool:
        return self._p.poll() is None

    def kill(self) -> None:
        if self._p.poll() is None:
            self._p.kill()

    def join(self, timeout: float | None = None) -> None:
        try:
            self._p.wait(timeout)
        except subprocess.TimeoutExpired:
            pass


class ExternalEngine(IsolatedEngine):
    """An engine in a child process of another Python interpreter (``python``).

    ``env``: extra environment variables for the child (on top of the caller's, less
    :data:`_DROPPED_ENV`); ``site_dirs``: folders searched before the interpreter's own
    site-packages (a release unpacked from a bundle, on a machine without an index).
    """

    def __init__(self, engine_spec: str, kwargs: Mapping[str, Any] | None = None, *, python: Path | str,
                 env: Mapping[str, str] | None = None, site_dirs: tuple[str, ...] = (), **kw: Any) -> None:
        super().__init__(engine_spec, kwargs, **kw)
        self.python = str(python)
        self.extra_env = dict(env or {})
        self.site_dirs = tuple(str(d) for d in site_dirs)
        self.spare_enabled = False  # a spare would be a multiprocessing child of this interpreter, not ``python``

    def _ensure_spare(self) -> None:
        """No spare process: this engine's processes run another interpreter (see _spawn)."""

    def _spawn(self) -> None:
        parent_sock, child_sock = socket.socketpair()
        self.log_path = self.log_dir / f"engine-{os.getpid()}-{self.starts + self.crashes}-{int(time.time())}.log"
        self.log_path.touch()
        env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
        env.update(self.extra_env)
        env["SPECFUZZ_PACKAGE_PATHS"] = json.dumps(package_paths())
        env["SPECFUZZ_SITE_DIRS"] = json.dumps(list(self.site_dirs))
        if self.site_dirs:
            # The child itself runs isolated (-I) and puts these first on its sys.path; processes
            # the engine starts with a plain interpreter (vLLM 0.22-0.24 inspect the model class in
            # a `python -m vllm.model_executor.models.registry` subprocess) find them here.
            env["PYTHONPATH"] = os.pathsep.join(self.site_dirs)
        fd = child_sock.fileno()
        with open(self.log_path, "ab") as log:
            popen = subprocess.Popen([self.python, "-I", str(CHILD_SCRIPT), str(fd)], pass_fds=(fd,), env=env,
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=log, close_fds=True)
        child_sock.close()
        conn = Connection(parent_sock.detach())
        # The same first message a multiprocessing child gets as its arguments.
        conn.send_bytes(pickle.dumps((self.engine_spec, self.kwargs, str(self.log_path))))
        self._proc, self._conn = _PopenProcess(popen), conn
        self._config = None
        isolation._LIVE.add(self)
