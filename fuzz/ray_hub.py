"""The driver side of a Ray campaign: the only writer of everything a campaign stores.

:class:`CampaignHub` runs as a Ray actor pinned to the driver's node (``num_cpus=0``),
created by the driver (``fuzz/ray_driver.py``). It owns, for the corpus folder on that
node:

* the corpus: every entry an engine actor finds is sent here as JSON and stored with
  :meth:`~specfuzz.fuzz.corpus.Corpus.store` (atomic writes, deduplicated by signature);
  the known signatures and shrunk crash keys every actor checks before it shrinks are
  answered from here, so two hosts never both store a bug as new;
* the α budget: every level a test or confirmation uses is taken here, one at a time, so
  no two actors ever test at the same level;
* the campaign state (``state.json``: search index, totals over every run, the simplest
  families already run) in the same format a campaign without Ray writes, so a corpus
  moves freely between the two; and the swap event log (``events.jsonl``);
* the families in flight: an actor announces each family before it runs it, so when the
  actor or its node dies the driver knows which family to retry elsewhere or to record
  as a crash.

Per actor it keeps the totals the actor last reported (cumulative since the actor
started) and its host, from which the driver's summary shows per-actor and per-host
totals. Everything here is small: entries and families as JSON (a table model of V
tokens is V² numbers), totals as a few hundred numbers.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

from specfuzz.fuzz.corpus import Corpus, Entry, atomic_write_json

# How often (seconds) the state file is rewritten while actors report.
STATE_SAVE_EVERY_S = 2.0
# Messages kept for the driver's display.
MESSAGES_KEPT = 200


def add_totals(dst: dict, src: dict) -> dict:
    """Add campaign totals ``src`` into ``dst`` (seconds, methods with their variants,
    engine counters and time shares); ``runs`` and ``workers`` are left to the caller."""
    dst["seconds"] = round(dst.get("seconds", 0.0) + src.get("seconds", 0.0), 1)
    for m, row in (src.get("methods") or {}).items():
        d = dst.setdefault("methods", {}).setdefault(m, {"families": 0, "patterns": 0, "samples": 0})
        for k in ("families", "patterns", "samples"):
            d[k] = d.get(k, 0) + row.get(k, 0)
        for v, n in (row.get("variants") or {}).items():
            d.setdefault("variants", {})[v] = d.get("variants", {}).get(v, 0) + n
    e = dst.setdefault("engine", {})
    for k, v in (src.get("engine") or {}).items():
        if isinstance(v, (int, float)):
            e[k] = round(e.get(k, 0) + v, 2)
        elif isinstance(v, dict):
            d = e.setdefault(k, {})
            for kk, vv in v.items():
                d[kk] = round(d.get(kk, 0) + vv, 2)
    return dst


def crash_signature_key(entry: Entry) -> str | None:
    """The shrink key of a stored shrunk crash (what Campaign.known_crashes holds)."""
    from specfuzz.fuzz.families import entry_crash_key

    if entry.kind != "crash" or entry.extra.get("shrunk") is not True:
        return None
    return entry_crash_key(entry)


class CampaignHub:
    """Corpus, α budget, campaign state and families in flight of one Ray campaign (a Ray actor)."""

    def __init__(self, corpus_dir: str, alpha: float, run_info: dict) -> None:
        from specfuzz.fuzz import campaign as cmod

        self.corpus = Corpus(corpus_dir)
        self.state_dir = Path(corpus_dir) / ".specfuzz"
        self.state_path = self.state_dir / "state.json"
        self.events_path = self.state_dir / "events.jsonl"
        self.schema = cmod.STATE_SCHEMA_VERSION
        state = self._load_state()
        ray_state = state.get("ray") or {}
        if ray_state.get("current"):
            # The last run's driver was killed: its record so far joins the history.
            state["ray"] = {"runs": list(ray_state.get("runs") or []) + [dict(ray_state["current"], interrupted=True)]}
        self.state = state  # kept whole: fields this hub does not own are written back as read
        self.searches = int(state.get("searches", 0))
        self.base_totals = json.loads(json.dumps(state.get("totals") or {}))
        self.simplest = set(state.get("simplest_run") or [])
        self.seen_again: set[str] = set()  # known signatures confirmed again in this run
        self.known = set()
        self.known_crashes = set()
        for _, e in self.corpus.entries():
            if isinstance(e, Entry):
                self.known.add(e.signature)
                key = crash_signature_key(e)
                if key is not None:
                    self.known_crashes.add(key)
        self._open_alpha(alpha, state)
        self.run_info = dict(run_info, host=socket.gethostname(), started=time.time())
        self.actors: dict[str, dict] = {}
        self.inflight: dict[str, dict] = {}
        self.stored: list[str] = []
        self.messages: list[tuple[float, str]] = []
        self.crash_records = 0
        self._saved = 0.0

    # -- state ------------------------------------------------------------------------

    def _load_state(self) -> dict:
        """The campaign state as a campaign without Ray reads it (its schema checks and
        migrations: ``campaign_state.load_state``), or {} for none."""
        from specfuzz.fuzz.campaign_state import load_state

        # The driver checked (or set aside, --reset-state) the state before this hub started.
        return dict(load_state(self.state_path, False, []) or {})

    def _open_alpha(self, alpha: float, state: dict) -> None:
        """The campaign's α: the shared confirmation ledger where this specfuzz has one
        (two-stage budget, fuzz/ledger.py), else the per-family spender kept in the state."""
        try:
            from specfuzz.fuzz.ledger import AlphaLedger
        except ImportError:
            from specfuzz.oracle.stats import AlphaSpender

            self.ledger = None
            self.spender = AlphaSpender.from_json(state["spender"]) if state.get("spender") else AlphaSpender(alpha)
        else:
            self.ledger, self.spender = AlphaLedger(self.state_dir, alpha), None

    def _alpha_state(self) -> dict:
        return {} if self.spender is None else {"spender": json.loads(self.spender.to_json())}

    def totals(self, shown: bool = True) -> dict:
        """Campaign totals: every earlier run's plus every actor's of this run. ``shown``:
        with this run's engine actors as ``workers`` (for the summary's rates; not stored,
        so that a later run without Ray reads the totals as its own)."""
        out = json.loads(json.dumps(self.base_totals))
        out.setdefault("seconds", 0.0)
        out.setdefault("methods", {})
        out.pop("workers", None)
        for a in self.actors.values():
            add_totals(out, a.get("totals") or {})
        out["runs"] = int(self.base_totals.get("runs", 0)) + 1
        if shown:
            out["workers"] = max(1, int(self.run_info.get("engines", 1)))
        return out

    def save(self, ray_run: dict | None = None) -> None:
        """Write the campaign state (atomically); ``ray_run``: this run's record for the
        state's history of Ray runs (the summary's one-actor baseline comes from it)."""
        d = dict(self.state)
        d.update({"schema_version": self.schema, "searches": self.searches, "totals": self.totals(shown=False),
                  "simplest_run": sorted(self.simplest)})
        d.update(self._alpha_state())
        runs = list((d.get("ray") or {}).get("runs") or [])
        if ray_run is not None:
            runs.append(ray_run)
            d["ray"] = {"runs": runs}
            self.state = d
        else:
            # The run so far (a driver killed now leaves it for the next run to show).
            d["ray"] = {"runs": runs, "current": dict(self.run_info, actors={
                k: {"host": a.get("host"), "node": a.get("node"), "families": (a.get("stats") or {}).get("cases", 0),
                    "dead": a.get("dead")} for k, a in self.actors.items()})}
        atomic_write_json(self.state_path, d)
        self._saved = time.monotonic()

    # -- corpus -----------------------------------------------------------------------

    def store(self, entry_json: dict) -> tuple[str, bool]:
        """Store an entry an actor found; returns (file name, whether it is new)."""
        entry = Entry.from_json(entry_json)
        path, new = self.corpus.store(entry)
        self.known.add(entry.signature)
        key = crash_signature_key(entry)
        if key is not None:
            self.known_crashes.add(key)
        if new:
            self.stored.append(path.name)
        return path.name, new

    def known_entries(self) -> list[tuple[str, dict]]:
        """(file name relative to the corpus, entry JSON) of every stored calibration entry and
        speculation finding, those stored by the actors during this run included: an engine
        actor recognises a calibration bug met under another method
        (Campaign._known_calibration) and a speculation finding met again under more sampling
        settings (Campaign._known_finding) by them."""
        out = []
        for path, e in self.corpus.entries():
            if isinstance(e, Entry) and (e.kind == "calibration"
                                         or (e.kind == "finding" and (e.case.get("spec") or {}).get("method"))):
                out.append((str(path.relative_to(self.corpus.root)), e.to_json()))
        return out

    def _entry_path(self, name: str) -> Path | None:
        """The path of the entry ``name`` (relative to the corpus); None for a name outside it."""
        path = (self.corpus.root / name).resolve()
        return path if self.corpus.root.resolve() in path.parents else None

    def has_entry(self, name: str) -> bool:
        """Whether the entry ``name`` (relative to the corpus) is stored."""
        path = self._entry_path(name)
        return path is not None and path.is_file()

    def mark_seen(self, name: str, also_under: str | None = None) -> bool:
        """Mark the stored entry ``name`` (relative to the corpus) seen again (``also_under``:
        the method it was met under, when not its own)."""
        from specfuzz.fuzz.corpus import mark_seen_again

        path = self._entry_path(name)
        return path is not None and mark_seen_again(path, also_under)

    def contains(self, which: str, item: str) -> bool:
        return item in self._set(which)

    def add(self, which: str, item: str) -> None:
        self._set(which).add(item)

    def members(self, which: str) -> list[str]:
        return sorted(self._set(which))

    def _set(self, which: str) -> set:
        return {"known": self.known, "known_crashes": self.known_crashes, "simplest": self.simplest,
                "seen_again": self.seen_again}[which]

    # -- α ----------------------------------------------------------------------------

    def take_alpha(self) -> float:
        """The next level of the per-family α sequence, taken (no other actor gets it)."""
        a = self.spender.next()
        if time.monotonic() - self._saved > STATE_SAVE_EVERY_S:
            self.save()
        return a

    def spend(self) -> tuple[int, float]:
        """The campaign's next confirmation (j, α_j), written to the ledger before it
        returns: no two actors ever confirm at the same j."""
        return self.ledger.spend()

    def budget(self):
        """The confirmation budget now (None for a per-family spender)."""
        return None if self.ledger is None else self.ledger.read()

    # -- searches and actors ----------------------------------------------------------

    def begin_search(self, index: int) -> None:
        self.searches = max(self.searches, int(index))

    def first_search(self) -> int:
        """The search index this run continues from (earlier runs' searches)."""
        return self.searches

    def register(self, key: str, info: dict) -> None:
        self.actors[key] = dict(info, key=key, registered=time.time(), totals={}, stats={})

    def report(self, key: str, totals: dict, stats: dict, events: list[str], messages: list[str]) -> None:
        """An actor's cumulative totals and counters, new swap events and messages."""
        a = self.actors.setdefault(key, {"key": key, "registered": time.time()})
        a["totals"], a["stats"], a["last"] = totals, stats, time.time()
        if events:
            try:
                self.state_dir.mkdir(parents=True, exist_ok=True)
                with open(self.events_path, "a") as f:
                    for line in events:
                        f.write(line.rstrip("\n") + "\n")
            except OSError:
                pass
        now = time.time()
        for m in messages:
            self.messages.append((now, f"[{key}] {m}"))
        del self.messages[:-MESSAGES_KEPT]
        if time.monotonic() - self._saved > STATE_SAVE_EVERY_S:
            self.save()

    def note(self, message: str) -> None:
        self.messages.append((time.time(), message))
        del self.messages[:-MESSAGES_KEPT]

    def begin_family(self, key: str, record: dict) -> None:
        self.inflight[key] = dict(record, actor=key, host=self.actors.get(key, {}).get("host"))

    def end_family(self, key: str) -> None:
        self.inflight.pop(key, None)

    def actor_died(self, key: str, reason: str) -> dict | None:
        """Mark an actor dead; returns the family it was running, if any."""
        a = self.actors.setdefault(key, {"key": key})
        a["dead"] = reason[:300]
        a["died"] = time.time()
        self.note(f"actor {key} on {a.get('host')} died: {reason[:160]}")
        return self.inflight.pop(key, None)

    def record_lost_family(self, record: dict, reasons: list[str]) -> tuple[str, bool]:
        """A family during which two engine actors died: stored as a crash entry (kind
        ``actor``) with every pattern of it, unshrunk."""
        cases = record["cases"]
        entry = Entry(
            kind="crash", engine=dict(record.get("engine") or {"name": self.run_info.get("engine")}), case=cases[0],
            evidence=f"engine actor died: {reasons[-1][:300]}",
            log="\n".join(reasons)[-8000:],
            extra={"crash_kind": "actor", "shrunk": False, "dtype": self.run_info.get("dtype"),
                   "batch_patterns": [{"prompt": c["prompt"], "params": c["params"]} for c in cases] if len(cases) > 1 else None,
                   "ray": {"actors": [record.get("actor"), record.get("retried_by")], "hosts": record.get("hosts"),
                           "speculation": record.get("speculation"), "role": record.get("role")}},
        )
        if entry.extra["batch_patterns"] is None:
            del entry.extra["batch_patterns"]
        self.crash_records += 1
        return self.store(entry.to_json())

    def snapshot(self, since: float = 0.0) -> dict:
        """What the driver shows: per-actor rows, messages after ``since``, stored names."""
        return {
            "actors": {k: {kk: vv for kk, vv in a.items()} for k, a in self.actors.items()},
            "messages": [(t, m) for t, m in self.messages if t > since],
            "stored": list(self.stored),
            "searches": self.searches,
            "totals": self.totals(),
            "crash_records": self.crash_records,
            "history": list((self.state.get("ray") or {}).get("runs") or []),
            "budget": self.budget(),
        }

    def finish(self, ray_run: dict) -> dict:
        """Write the final state with this run's record; returns the final snapshot."""
        self.save(ray_run=ray_run)
        return self.snapshot()
