"""What one campaign run met, read from its corpus, and what that means for CI.

A campaign stores new entries and marks known ones seen again (``times_seen``,
``last_seen``). Comparing a :func:`snapshot` of the corpus taken before the run with the
corpus after it gives every entry the run *met*: new ones, and known ones met again. This
reads only the corpus (its public files), so it holds for parallel workers sharing one
corpus and whatever the campaign's internals do.

CI decisions made from that:

- ``specfuzz fuzz`` exits 1 when a met entry is new (the corpus is the baseline). A crash
  stored under a new signature (other sampling features in play) whose crash is already
  stored, the same kind and message, numbers aside, is the same bug: the campaign does not
  shrink it again, and it is not new here either (``Met.same_as``);
- the pytest plugin and :func:`specfuzz.testing.fuzz_engine` fail on every met entry
  whose signature is not marked *expected* (known open bugs marked by signature xfail);
- when no engine start succeeded and the engine crashed, :func:`engine_error` asks the
  engine to start once on the smallest model: if it cannot, the run is "engine could not
  start" (exit 3), not a finding.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from specfuzz.fuzz.corpus import Corpus, Entry

# Status of an entry that no longer reproduces: not "open", so never expected by default.
FIXED = "fixed"


@dataclass(frozen=True)
class Seen:
    """An entry's bookkeeping at snapshot time."""

    times_seen: int
    last_seen: str
    crash: str | None = None  # crash_identity


def crash_identity(entry: Entry) -> str | None:
    """What makes two crash entries the same bug: the engine and the campaign's crash key
    (crash kind and message, numbers aside, and the exception the engine's log names where the
    process died without naming one: :func:`specfuzz.fuzz.families.entry_crash_key`, the rule
    the campaign shrinks crashes by); None for other kinds."""
    from specfuzz.fuzz.families import entry_crash_key

    if entry.kind != "crash":
        return None
    return f"{entry.engine.get('name')}:{entry_crash_key(entry)}"


@dataclass(frozen=True)
class Met:
    """A corpus entry a run stored (``new``) or met again. ``same_as``: for a crash stored
    under a new signature, the file name of an entry stored before the run with the same
    crash (:func:`crash_identity`)."""

    path: Path
    entry: Entry
    new: bool
    same_as: str | None = None

    @property
    def is_new_bug(self) -> bool:
        """A new entry that is not a known crash met under other settings."""
        return self.new and self.same_as is None

    @property
    def signature(self) -> str:
        return self.entry.signature

    @property
    def kind(self) -> str:
        return self.entry.kind

    @property
    def method(self) -> str:
        spec = self.entry.case.get("spec") or {}
        return str(spec.get("method") or "off")

    @property
    def title(self) -> str:
        """One line: the entry's title when it has one, else kind, attribution and evidence."""
        title = self.entry.extra.get("title")
        if title:
            return str(title)
        label = self.entry.label
        return f"{self.kind}{'' if label in (None, 'unknown') else ' ' + label} ({self.method}): {self.entry.evidence}"[:300]


def snapshot(corpus_dir: Path | str) -> dict[str, Seen]:
    """Every readable entry of a corpus (file path relative to it) with its bookkeeping."""
    root = Path(corpus_dir)
    out = {}
    for path, e in Corpus(root).entries():
        if isinstance(e, Entry):
            out[str(path.relative_to(root))] = Seen(e.times_seen, e.last_seen, crash_identity(e))
    return out


def met_since(corpus_dir: Path | str, before: Mapping[str, Seen]) -> list[Met]:
    """Entries new since ``before`` or marked seen again since, in file order."""
    root = Path(corpus_dir)
    crashes = {s.crash: name for name, s in before.items() if s.crash}
    out = []
    for path, e in Corpus(root).entries():
        if not isinstance(e, Entry):
            continue
        old = before.get(str(path.relative_to(root)))
        if old is None:
            out.append(Met(path, e, True, crashes.get(crash_identity(e))))
        elif (e.times_seen, e.last_seen) != (old.times_seen, old.last_seen):
            out.append(Met(path, e, False))
    return out


def open_signatures(corpus_dir: Path | str) -> set[str]:
    """Signatures of the open entries of a corpus (every status but "fixed")."""
    return {e.signature for _, e in Corpus(Path(corpus_dir)).entries() if isinstance(e, Entry) and e.status != FIXED}


def expected_crashes(signatures: set[str], *corpus_dirs: Path | str) -> set[str]:
    """Crash identities of the expected crash entries found in these corpus folders: a
    crash met under other settings (a new signature) is the same expected bug."""
    out = set()
    for d in corpus_dirs:
        for _, e in Corpus(Path(d)).entries():
            if isinstance(e, Entry) and e.signature in signatures and crash_identity(e):
                out.add(crash_identity(e))
    return out


def is_expected(met: Met, signatures: set[str], crashes: set[str]) -> bool:
    """Marked expected: by its signature, or (a crash) by the crash of an expected entry."""
    return met.signature in signatures or (crash_identity(met.entry) or "") in crashes


def read_signatures(items: Iterable[str]) -> set[str]:
    """Signatures from option values: a signature, an entry file name or stem
    (``finding-<signature>.json``), or an entry file's path."""
    out = set()
    for item in items:
        item = str(item).strip()
        if not item:
            continue
        p = Path(item)
        if p.suffix == ".json" and p.is_file():
            try:
                out.add(Entry.from_json(json.loads(p.read_text())).signature)
                continue
            except (ValueError, KeyError, TypeError, json.JSONDecodeError):
                pass
        stem = p.stem if p.suffix == ".json" else item
        out.add(stem.split("-", 1)[1] if "-" in stem else stem)
    return out


def draft_text(met: Met, drafts_dir: Path | str | None = None) -> str:
    """The drafted upstream issue (``ISSUE.md``) of a met entry, its evidence if drafting
    fails. The draft (ISSUE.md, plot.png, repro.py) is kept in ``drafts_dir/<entry stem>/``
    when given, else written to a temporary folder and removed."""
    from specfuzz.fuzz.draft import draft_entry

    with tempfile.TemporaryDirectory(prefix="specfuzz-draft-") as tmp:
        out = Path(drafts_dir if drafts_dir is not None else tmp) / met.path.stem
        try:
            draft_entry(met.path, out)
            text = (out / "ISSUE.md").read_text(encoding="utf-8")
        except Exception as exc:  # noqa: BLE001 - a report must not die on a draft
            return f"# {met.title}\n\n{met.entry.evidence}\n\n(drafting failed: {type(exc).__name__}: {exc})\n"
        if drafts_dir is not None:
            text += f"\n---\nDrafted into {out} (ISSUE.md, plot.png, repro.py).\n"
        return text


def engine_error(stats, engine: str, engine_kwargs: Mapping, *, work_dir: Path, dtype: str,
                 settings: Mapping | None) -> str | None:
    """After a run in which no engine start succeeded and the engine crashed: a sentence
    saying why the engine cannot start at all, or None when it does start (the crashes
    were findings)."""
    if stats.engine_starts > 0 or stats.samples > 0 or stats.crashes == 0:
        return None
    from specfuzz.engines.availability import start_error

    reason = start_error(engine, engine_kwargs, work_dir=work_dir, dtype=dtype, settings=settings)
    return None if reason is None else f"engine {engine!r} could not start: {reason}"
