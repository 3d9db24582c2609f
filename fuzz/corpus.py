"""The corpus: one JSON file per finding, written atomically, deduplicated by signature.

An entry holds everything needed to reproduce and judge a finding: the case (tables
included), the engine and its environment, the observed counts, the verdict with its
evidence, the attribution, the calibration (speculation off) result, first/last seen and
status. Files are written to a temporary name in the same folder, fsynced, then renamed,
so a crash or SIGKILL at any moment leaves either the old entry or the new one, never a
torn file. Unknown or corrupt files are reported and skipped, never deleted.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

ENTRY_SCHEMA_VERSION = 1
ENTRY_KINDS = ("finding", "crash", "calibration", "regression", "swap")
STATUSES = ("new", "confirmed", "flaky", "fixed")


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def atomic_write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write JSON so that ``path`` always holds a complete document."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=False, allow_nan=False, default=_json_default)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _json_default(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def counts_to_json(counts: Mapping[tuple[int, ...], int]) -> list[list]:
    return [[list(k), int(v)] for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def counts_from_json(rows: list) -> dict[tuple[int, ...], int]:
    return {tuple(k): int(v) for k, v in rows}


def active_features(case_json: Mapping) -> list[str]:
    """Names of the sampling features a case switches on (non-default parameters)."""
    from specfuzz.oracle.params import SamplingParams

    default = SamplingParams().to_json()
    params = case_json.get("params", {})
    return sorted(k for k, v in params.items() if k != "max_tokens" and default.get(k) != v)


def _draft_relation(case_json: Mapping) -> str | None:
    draft = case_json.get("draft_table")
    if not draft:
        return None
    v, vd = len(case_json.get("target_table", [])), len(draft[0])
    return "narrower" if vd < v else ("wider" if vd > v else "equal")


# An exception line of a log: type, then its message.
EXC_LINE = re.compile(r"([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Failure))\s*:\s*(.*)")
# Exceptions that only say another process failed: the root cause is an earlier line.
GENERIC_ERRORS = ("EngineDeadError", "Engine core initialization failed", "EngineCore encountered")
# Crash kinds whose detail is only how the engine process ended (killed by a signal, exited,
# no answer): what broke is in the engine's log, if anywhere.
_DEATH_KINDS = ("signal", "exit", "timeout")


def numbers_out(text: str) -> str:
    """``text`` on one line with every (signed) number replaced by ``#``."""
    return re.sub(r"-?[0-9]+", "#", " ".join(str(text).split()))


def crash_cause(kind: object, evidence: str, log: str | None) -> str:
    """The engine's own exception behind a crash whose evidence does not name one: the last
    specific exception line of the engine's log tail, numbers stripped ("" when the evidence
    names its exception, or the log holds none). SGLang's scheduler dies in a child process
    and the engine process is then killed, so every SGLang crash reaches the caller as
    "engine process killed by SIGKILL during generate" whatever broke; vLLM's engine core
    dies the same way behind an ``EngineDeadError``."""
    if kind not in _DEATH_KINDS and not any(g in str(evidence) for g in GENERIC_ERRORS):
        return ""
    return numbers_out(last_exception(log))[:160]


def last_exception(log: str | None) -> str:
    """The last specific exception line of an engine log (type and message, as written; ""
    when there is none): lines that only say another process failed are passed over."""
    found = [m.group(0) for line in str(log or "").splitlines() for m in [EXC_LINE.search(line)]
             if m and not any(g in m.group(0) for g in GENERIC_ERRORS)]
    return found[-1] if found else ""


def signature(kind: str, engine_name: str, case_json: Mapping, label: str | None, crash_kind: str | None = None,
              crash_cause: str | None = None) -> str:
    """The fingerprint of a bug: re-finding the same bug maps to the same entry.

    Engine, kind, speculation method and verification mode, and the attributed class;
    for unattributed findings also the sampling features in play and the draft's width
    relation to the target (different unknown bugs rarely share all of these); for
    crashes the kind of crash and, where the engine process died and its log names the
    exception (``extra.crash_cause``; an entry stored without it keeps its signature),
    that exception.
    """
    spec = case_json.get("spec") or {}
    feats: list = [kind, engine_name, spec.get("method"), spec.get("verify"), label, crash_kind]
    if crash_cause:
        feats.append(crash_cause)
    if kind == "swap":
        # Stale weights after an in-place swap: one entry per engine and speculation method
        # (the request that happened to follow the swap says nothing about the bug).
        feats = [kind, engine_name, spec.get("method")]
    elif kind == "calibration" or label in (None, "unknown"):
        feats += [active_features(case_json), _draft_relation(case_json)]
    h = hashlib.sha256(json.dumps(feats, sort_keys=True).encode())
    return h.hexdigest()[:16]


def reduced_to_features(case_json: Mapping, features: list[str] | tuple[str, ...]) -> dict:
    """``case_json`` with every sampling parameter outside ``features`` (max_tokens aside) back
    at its default: the case a stored bug with those features would be met on."""
    from specfuzz.oracle.params import SamplingParams

    default = SamplingParams().to_json()
    params = dict(case_json.get("params", {}))
    for k in active_features(case_json):
        if k not in features:
            params[k] = default[k]
    return {**case_json, "params": params}


def calibration_key(engine_name: str, case_json: Mapping) -> tuple[str, tuple[str, ...]]:
    """A target-sampler bug regardless of the speculation around it.

    A calibration failure (the engine with speculation off disagrees with μ) depends on the
    engine and the sampling features in play, not on the speculation method, verification
    mode or draft that the failing case happened to carry: one bug met under ngram and
    under draft_model has two signatures (:func:`signature` keeps the method) but one key.
    Campaigns use it to recognise a stored calibration bug met again under another method
    (``Campaign._known_calibration``); stored entries keep their signatures and file names.
    The key is (engine name, features), so a campaign can also find the stored entries whose
    features are some of a case's.
    """
    return engine_name, tuple(active_features(case_json))


def mark_seen_again(path: Path, also_under: str | None = None) -> bool:
    """Mark the stored entry at ``path`` seen again (last_seen, times_seen; a "fixed" one
    comes back as "new"); ``also_under``: the speculation method it was met under, when not
    its own (kept in ``extra.also_seen_under``, sorted). False, and nothing written, when it
    cannot be read."""
    try:
        old = Entry.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return False
    old.seen_again(now_iso())
    if also_under:
        old.extra["also_seen_under"] = sorted(set(old.extra.get("also_seen_under") or ()) | {also_under})
    atomic_write_json(path, old.to_json())
    return True


@dataclass
class Entry:
    kind: str  # one of ENTRY_KINDS
    engine: dict  # name, version, torch, device, ...
    case: dict  # Case.to_json()
    counts: dict[tuple[int, ...], int] = field(default_factory=dict)
    verdict: dict | None = None
    attribution: dict | None = None
    calibration: dict | None = None  # the same engine with speculation off
    evidence: str = ""
    log: str = ""  # crash log tail, for crash entries
    status: str = "new"
    first_seen: str = field(default_factory=now_iso)
    last_seen: str = field(default_factory=now_iso)
    times_seen: int = 1
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Accept the JSON text forms of verdicts and attributions as well as dicts.
        for name in ("verdict", "attribution", "calibration"):
            value = getattr(self, name)
            if isinstance(value, str):
                setattr(self, name, json.loads(value))
        if self.kind not in ENTRY_KINDS:
            raise ValueError(f"kind={self.kind!r}: one of {ENTRY_KINDS}")
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r}: one of {STATUSES}")

    def seen_again(self, when: str) -> None:
        """Met again at ``when``: last_seen, times_seen; a "fixed" entry comes back as "new"."""
        self.last_seen = when
        self.times_seen += 1
        if self.status == "fixed":
            self.status = "new"  # it came back

    @property
    def label(self) -> str | None:
        return None if self.attribution is None else self.attribution.get("label")

    @property
    def signature(self) -> str:
        return signature(self.kind, str(self.engine.get("name")), self.case, self.label, self.extra.get("crash_kind"),
                         self.extra.get("crash_cause"))

    def to_json(self) -> dict:
        return {
            "schema_version": ENTRY_SCHEMA_VERSION,
            "signature": self.signature,
            "kind": self.kind,
            "status": self.status,
            "engine": self.engine,
            "case": self.case,
            "counts": counts_to_json(self.counts),
            "verdict": self.verdict,
            "attribution": self.attribution,
            "calibration": self.calibration,
            "evidence": self.evidence,
            "log": self.log,
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
            "times_seen": self.times_seen,
            "extra": self.extra,
        }

    @classmethod
    def from_json(cls, d: Mapping) -> "Entry":
        if d.get("schema_version") != ENTRY_SCHEMA_VERSION:
            raise ValueError(f"schema_version={d.get('schema_version')!r}: expected {ENTRY_SCHEMA_VERSION}")
        if d.get("kind") not in ENTRY_KINDS:
            raise ValueError(f"kind={d.get('kind')!r}: one of {ENTRY_KINDS}")
        return cls(
            kind=d["kind"], engine=dict(d["engine"]), case=dict(d["case"]), counts=counts_from_json(d.get("counts", [])),
            verdict=d.get("verdict"), attribution=d.get("attribution"), calibration=d.get("calibration"),
            evidence=d.get("evidence", ""), log=d.get("log", ""), status=d.get("status", "new"),
            first_seen=d.get("first_seen", now_iso()), last_seen=d.get("last_seen", now_iso()),
            times_seen=int(d.get("times_seen", 1)), extra=dict(d.get("extra", {})),
        )


def entry_file_name(entry: Entry) -> str:
    """The file name an entry is stored under in a corpus folder."""
    return f"{entry.kind}-{entry.signature}.json"


class Corpus:
    """A folder of entries, ``<kind>-<signature>.json``."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def path_for(self, entry: Entry) -> Path:
        return self.root / entry_file_name(entry)

    def store(self, entry: Entry) -> tuple[Path, bool]:
        """Write a new entry, or, if its signature is stored, mark the stored one seen again.

        The stored entry keeps its (already shrunk) case and evidence; only last_seen,
        times_seen and a "fixed" status change. Exception: an entry stored unshrunk is
        replaced by the same entry shrunk, and any entry by one ``specfuzz shrink`` made
        (its old case kept under ``extra["unshrunk"]``).
        Returns (path, is_new).
        """
        path = self.path_for(entry)
        if path.exists():
            try:
                old = Entry.from_json(json.loads(path.read_text()))
            except (ValueError, KeyError, TypeError, json.JSONDecodeError):
                old = None  # unreadable: keep it untouched, store the new one beside it
                path = path.with_name(f"{path.stem}-{entry.last_seen.replace(':', '')}.json")
            if old is not None and old.kind == entry.kind and entry.extra.get("shrunk") is True \
                    and (old.extra.get("shrunk") is not True or "shrunk_by" in entry.extra):
                # An entry stored unshrunk, now shrunk (or shrunk further by `specfuzz
                # shrink`): the shrunk case replaces it (the old case is kept in extra, so
                # nothing stored is lost).
                entry.first_seen = old.first_seen
                entry.times_seen = old.times_seen + 1
                entry.status = "new" if old.status == "fixed" else old.status
                entry.extra["unshrunk"] = {"case": old.case, "evidence": old.evidence, "extra": old.extra}
                atomic_write_json(path, entry.to_json())
                return path, False
            if old is not None:
                old.seen_again(entry.last_seen)
                atomic_write_json(path, old.to_json())
                return path, False
        atomic_write_json(path, entry.to_json())
        return path, True

    def entries(self) -> Iterator[tuple[Path, Entry | Exception]]:
        """Every ``*.json`` file with its entry, or the error that made it unreadable.

        Hidden files and folders (the campaign's ``.specfuzz/`` state, temporary files of
        an interrupted write) are not entries and are skipped.
        """
        if not self.root.exists():
            return
        for path in sorted(self.root.rglob("*.json")):
            if any(part.startswith(".") for part in path.relative_to(self.root).parts):
                continue  # campaign state (.specfuzz/) and temporary files
            try:
                yield path, Entry.from_json(json.loads(path.read_text()))
            except (ValueError, KeyError, TypeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
                yield path, exc
