"""Scrubbing: nothing that identifies the machine that ran a campaign reaches a draft.

:class:`Scrubber` removes absolute paths (keeping the part from ``site-packages/`` or
``python3.x/`` on, which maintainers need), user names, host names, e-mail and IPv4
addresses from text and JSON values; identity keys of an engine dict (``host``, ``user``,
``cwd``, ...) are dropped. The identities come from the entry (its engine dict, home paths
and host mentions in its texts) and, by default, from this machine.
"""

from __future__ import annotations

import getpass
import json
import os
import platform
import re
import socket
from pathlib import Path
from typing import Any, Iterable, Mapping

from specfuzz.fuzz.corpus import Entry

# Engine-dict keys that name the machine or its user: dropped from drafts.
IDENTITY_KEYS = frozenset({
    "host", "hostname", "node", "nodename", "node_name", "user", "username", "user_name", "login", "cwd", "home",
    "pwd", "path", "ip", "address", "fqdn", "machine_id", "uid", "workdir", "work_dir", "cache_dir",
})
# User names that identify no one (scrubbing them would mangle ordinary words).
GENERIC_USERS = frozenset({"root", "user", "admin", "runner", "ubuntu", "nobody", "ec2-user", "vscode", "jovyan"})
# Identity strings shorter than this are not scrubbed as words (too likely to be ordinary text).
MIN_IDENTITY_LENGTH = 3
# Absolute paths that identify no machine (the repro script's shebang).
SAFE_PATHS = frozenset({"/usr/bin/env"})

_POSIX_PATH = re.compile(r"(?<![\w:/.~-])(?:~|/)(?:[^\s/'\"`<>()\[\]{},;:|]+/)+[^\s/'\"`<>()\[\]{},;:|]*")
_WINDOWS_PATH = re.compile(r"\b[A-Za-z]:\\(?:[^\s\\'\"`<>|]+\\)*[^\s\\'\"`<>|]*")
_HOME_USER = re.compile(r"(?:/home/|/Users/|/usr/home/|[A-Za-z]:\\Users\\)([^/\\\s'\"`]+)")
_EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)*\b")
_IPV4 = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}\b")
_HOST_MENTION = re.compile(r"\b(?:host(?:name)?|nodename)['\"]?\s*[=:]\s*['\"]?([A-Za-z0-9][\w.-]*)", re.I)
_KEEP_FROM = re.compile(r"(?:site-packages|dist-packages)/.*|python3(?:\.\d+)?/.*")


class Scrubber:
    """Removes paths, user names, host names and addresses from text and JSON values."""

    def __init__(self, identities: Iterable[str] = ()) -> None:
        self.identities = sorted({s for s in identities if self._identifying(s)}, key=len, reverse=True)
        self._word = (re.compile(r"(?<![\w-])(?:" + "|".join(re.escape(s) for s in self.identities) + r")(?![\w-])", re.I)
                      if self.identities else None)

    @staticmethod
    def _identifying(s: str) -> bool:
        s = str(s).strip()
        return len(s) >= MIN_IDENTITY_LENGTH and s.lower() not in GENERIC_USERS and not s.replace(".", "").isdigit()

    @classmethod
    def for_entry(cls, entry: Entry | None = None, *, local: bool = True) -> "Scrubber":
        """Identities from the entry (identity keys of its engine dict, users in home paths,
        host mentions in its texts) and, with ``local``, from this machine."""
        ids: set[str] = set()
        if local:
            for f in (socket.gethostname, platform.node, getpass.getuser):
                try:
                    v = f()
                except Exception:  # noqa: BLE001 - no user/host known: nothing to scrub
                    continue
                if v:
                    ids.add(v)
                    ids.add(v.split(".")[0])
            for k in ("USER", "LOGNAME", "USERNAME", "HOSTNAME"):
                if os.environ.get(k):
                    ids.add(os.environ[k])
            ids.update(_HOME_USER.findall(str(Path.home())))
        if entry is not None:
            texts = [entry.log, entry.evidence, json.dumps(entry.extra, default=str), json.dumps(entry.engine, default=str)]
            for k, v in entry.engine.items():
                if str(k).lower() in IDENTITY_KEYS and isinstance(v, str) and v:
                    if not v.startswith(("/", "~")) and not re.match(r"[A-Za-z]:\\", v):
                        ids.add(v)
                        ids.add(v.split(".")[0])
            for t in texts:
                ids.update(_HOME_USER.findall(t))
                for h in _HOST_MENTION.findall(t):
                    ids.add(h)
                    ids.add(h.split(".")[0])
        return cls(ids)

    def text(self, s: str) -> str:
        if not s:
            return s
        s = _WINDOWS_PATH.sub("[path]", s)
        s = _POSIX_PATH.sub(self._path, s)
        s = _EMAIL.sub("[user]@[host]", s)
        s = _IPV4.sub(self._ip, s)
        s = _HOST_MENTION.sub(lambda m: m.group(0)[: m.start(1) - m.start(0)] + "[host]", s)
        if self._word is not None:
            s = self._word.sub("[redacted]", s)
        return s

    @staticmethod
    def _ip(m: re.Match) -> str:
        parts = m.group(0).split(".")
        return m.group(0) if not all(0 <= int(p) <= 255 for p in parts) else "[ip]"

    @staticmethod
    def _path(m: re.Match) -> str:
        p = m.group(0)
        keep = _KEEP_FROM.search(p)
        if keep:
            return keep.group(0)
        return "[path]"

    def value(self, obj: Any) -> Any:
        """A JSON value with identity keys dropped and every string scrubbed."""
        if isinstance(obj, Mapping):
            return {k: self.value(v) for k, v in obj.items() if str(k).lower() not in IDENTITY_KEYS}
        if isinstance(obj, (list, tuple)):
            return [self.value(v) for v in obj]
        if isinstance(obj, str):
            return self.text(obj)
        return obj

    def leaks(self, s: str) -> list[str]:
        """Identity strings or absolute paths still present in ``s`` (for checks)."""
        found = [m.group(0) for m in _POSIX_PATH.finditer(s)
                 if not _KEEP_FROM.search(m.group(0)) and m.group(0) not in SAFE_PATHS]
        if self._word is not None:
            found += [m.group(0) for m in self._word.finditer(s)]
        return found


