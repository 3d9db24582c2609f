"""What a campaign keeps between runs and writes as it goes.

Everything lives under ``<corpus>/.specfuzz/``:

* the campaign state (``state.json``; ``state-w<N>.json`` for worker N of a ``--workers``
  campaign): the searches run so far, the simplest families already run, failing filling
  families not yet examined, and the totals over every run of this state (:func:`open_totals`:
  seconds; per speculation method the families, patterns and samples; per engine its starts,
  swaps and where the wall time went). A damaged state is never replaced silently
  (:func:`load_state`, :class:`DamagedState`): starting afresh would reset the α already spent;
* the campaign log (``events.jsonl``: swap events, refusals, ends of searches) and the family
  log (``families.jsonl``: one line per family run, with where its time went).

:class:`StateMixin` is the campaign's side of it (saving, time accounting, logging);
:class:`Watchdog` ends a campaign at its budget even inside Hypothesis or a slow engine call.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Callable

from specfuzz.case import Case
from specfuzz.engines.isolation import IsolatedEngine
from specfuzz.errors import InvalidInput
from specfuzz.fuzz.corpus import atomic_write_json
from specfuzz.fuzz.coverage import Coverage
from specfuzz.fuzz.families import family_fields, family_variants
from specfuzz.fuzz.run import CaseRun
from specfuzz.oracle.budget import AlphaSpender

# a schema-1 state is migrated, its spender kept as "legacy_spender".
STATE_SCHEMA_VERSION = 2
# Examples per Hypothesis search; the campaign runs searches with new seeds until its
# the campaign even inside Hypothesis's internals or a slow engine call.
WATCHDOG_GRACE_S = 10.0
# The most failing filling families a state keeps for after the search's own failure (a search
# meets few: the rest are screened again then; see fuzz/campaign_engines.py).
MAX_DEFERRED = 8
# IsolatedEngine counters added up over a campaign's engines into totals["engine"].
ENGINE_COUNTERS = ("starts", "warm_starts", "hot_starts", "prestarts", "swaps", "swap_fallbacks")


class BudgetExhausted(BaseException):
    """Raised inside a Hypothesis example when the time budget is spent (not a test failure)."""


class DamagedState(InvalidInput):
    """The campaign state file exists but cannot be used; nothing is written over it."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(
            "campaign state", str(path),
            f"a readable state file: this one {why}. It is left as it is (starting afresh would reset the α already "
            "spent); run again with --reset-state to keep it aside under a new name and start a fresh state, or put "
            "back a copy of the corpus's .specfuzz/ folder",
        )


def state_problem(d: object) -> str | None:
    """Why a parsed state document cannot be resumed (None if it can)."""
    if not isinstance(d, dict):
        return f"holds a JSON {type(d).__name__}, not an object"
    version = d.get("schema_version")
    if version not in (1, STATE_SCHEMA_VERSION):
        return f"has schema_version={version!r}, not 1 or {STATE_SCHEMA_VERSION} (another specfuzz version?)"
    spender = d.get("spender") if version == 1 else d.get("legacy_spender")
    if version == 1 or spender is not None:
        try:
            AlphaSpender.from_json(spender)
        except (InvalidInput, KeyError, TypeError, ValueError) as exc:
            return f"has no valid α spender ({type(exc).__name__}: {exc})"
    searches = d.get("searches", 0)
    if isinstance(searches, bool) or not isinstance(searches, int) or searches < 0:
        return f"has searches={searches!r}, not an integer >= 0"
    totals = d.get("totals") or {}
    if not isinstance(totals, dict) or not isinstance(totals.get("methods", {}), dict) \
            or not all(isinstance(v, dict) for v in totals.get("methods", {}).values()):
        return "has malformed totals"
    for k in ("seconds", "runs"):
        if k in totals and (isinstance(totals[k], bool) or not isinstance(totals[k], (int, float))):
            return f"has totals.{k}={totals[k]!r}, not a number"
    eng = totals.get("engine", {})
    if not isinstance(eng, dict) or not all(isinstance(eng.get(k, {}), dict) for k in ("seconds", "shapes", "shrink_seconds")):
        return "has malformed engine totals"
    for k, v in [*eng.items(), *eng.get("seconds", {}).items(), *eng.get("shrink_seconds", {}).items()]:
        if k not in ("seconds", "shapes", "shrink_seconds") and (isinstance(v, bool) or not isinstance(v, (int, float))):
            return f"has engine totals {k}={v!r}, not a number"
    simplest = d.get("simplest_run") or []
    if not isinstance(simplest, list) or not all(isinstance(x, str) for x in simplest):
        return "has a malformed simplest_run list"
    deferred = d.get("deferred") or []
    if not isinstance(deferred, list) or not all(isinstance(f, list) and all(isinstance(c, dict) for c in f) for f in deferred):
        return "has a malformed deferred list (families of case objects)"
    return None


def load_deferred(state: dict | None) -> list[list[Case]]:
    """The failing filling families a state kept (Campaign._fill_wait); one that no longer
    reads as a case family (another specfuzz version) is dropped."""
    out: list[list[Case]] = []
    for fam in (state or {}).get("deferred") or []:
        try:
            out.append([Case.from_json(c) for c in fam])
        except (InvalidInput, KeyError, TypeError, ValueError):
            continue
    return out[:MAX_DEFERRED]


def set_aside(path: Path, why: str) -> Path:
    """Rename ``path`` to ``<name>.<why>-<UTC time>`` beside it (never over another file); the new path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}.{why}-{stamp}")
    i = 1
    while target.exists():
        i += 1
        target = path.with_name(f"{path.name}.{why}-{stamp}-{i}")
    path.rename(target)
    return target


def load_state(path: Path, reset: bool, notes: list[str]) -> dict | None:
    """The campaign state stored at ``path``, validated; None when there is none (a new campaign).

    A damaged state (unreadable, not JSON, another schema, fields of the wrong type) is
    never replaced silently: starting afresh would reset the α already spent, and with
    it the campaign-wide false-alarm guarantee. It raises :class:`DamagedState`, which
    says how to continue; with ``reset`` (``--reset-state``) the old file (damaged or not) is
    kept beside it under a new name, a line saying so is added to ``notes``, and the campaign
    starts a fresh state.
    """
    if not path.exists() and not path.is_symlink():
        return None
    why = None
    d = None
    try:
        d = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        why = f"cannot be read ({exc.strerror or type(exc).__name__})"
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        why = f"is not JSON ({getattr(exc, 'msg', None) or type(exc).__name__})"
    if why is None:
        why = state_problem(d)
    if reset:
        kept = set_aside(path, "damaged" if why else "old")
        notes.append(f"--reset-state: kept the {'damaged ' if why else ''}campaign state as {kept}; "
                     "starting a fresh state (the α ledger, alpha.json, goes on unless it is damaged)")
        return None
    if why is not None:
        raise DamagedState(path, why)
    if d["schema_version"] == 1:  # migrate: the spender moves to the ledger (kept as legacy_spender)
        d = dict(d, schema_version=STATE_SCHEMA_VERSION)
        d["legacy_spender"] = d.pop("spender")
    return d


def open_totals(state: dict | None) -> dict:
    """The totals of a campaign state (every field present), with this run counted.

    Totals add up over every run of the state (a campaign resumed on another machine, lease
    after lease, adds to them): seconds, and per speculation method the families, patterns and
    samples tried; per engine (every process of the campaign's engine: the searching engine, the
    speculation-off engine, fresh confirmation engines) the starts, swaps, and where the wall
    time went (seconds: start, swap, sample, shrink, other; and what the "shrink" seconds were
    spent on, the same four kinds as outside a shrink)."""
    totals: dict = dict(state.get("totals") or {}) if state else {}
    totals.setdefault("seconds", 0.0)
    totals.setdefault("runs", 0)
    totals.setdefault("methods", {})
    eng = totals.setdefault("engine", {})
    for k in (*ENGINE_COUNTERS, "stale_weights", "families", "samples", "searches", "filled_families"):
        eng.setdefault(k, 0)
    eng.setdefault("seconds", {})
    for k in ("start", "swap", "sample", "shrink", "other"):
        eng["seconds"].setdefault(k, 0.0)
    eng.setdefault("shrink_seconds", {})
    for k in ("start", "swap", "sample", "other"):
        eng["shrink_seconds"].setdefault(k, 0.0)
    eng.setdefault("shapes", {})
    totals["runs"] += 1
    return totals


def merge_worker_totals(corpus_dir: Path, workers: int, first: dict) -> dict:
    """The totals of ``workers`` campaign processes sharing a corpus, added up (worker 0's
    are ``first``; the others' are read from their state files)."""
    out = json.loads(json.dumps(first))
    out["workers"] = 1
    for w in range(1, workers):
        try:
            d = json.loads((Path(corpus_dir) / ".specfuzz" / f"state-w{w}.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue
        t = d.get("totals") or {}
        out["workers"] += 1
        out["seconds"] = out.get("seconds", 0.0) + t.get("seconds", 0.0)
        for m, row in (t.get("methods") or {}).items():
            dst = out.setdefault("methods", {}).setdefault(m, {"families": 0, "patterns": 0, "samples": 0})
            for k in ("families", "patterns", "samples"):
                dst[k] = dst.get(k, 0) + row.get(k, 0)
            for v, n in (row.get("variants") or {}).items():
                dst.setdefault("variants", {})[v] = dst.get("variants", {}).get(v, 0) + n
        Coverage.merge(out.setdefault("coverage", {}), t.get("coverage") or {})
        e, src = out.setdefault("engine", {}), t.get("engine") or {}
        for k, v in src.items():
            if isinstance(v, (int, float)):
                e[k] = e.get(k, 0) + v
            elif isinstance(v, dict):
                dst = e.setdefault(k, {})
                for kk, vv in v.items():
                    dst[kk] = dst.get(kk, 0) + vv
    return out


class Watchdog:
    """Ends a campaign at its budget: the budget is enforced inside examples, and this
    SIGALRM, WATCHDOG_GRACE_S after the deadline, raises :class:`BudgetExhausted` even inside
    Hypothesis's internals or a slow engine call. Armed only in the main thread (signals are
    delivered there); ``left``: the seconds left of the budget."""

    def __init__(self, left: Callable[[], float]) -> None:
        self.left = left
        self.armed = False
        self._old_handler = None

    def arm(self) -> bool:
        """Set the alarm at the deadline plus WATCHDOG_GRACE_S; False where it cannot be set."""
        if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
            return False

        def fire(signum, frame):  # noqa: ARG001
            raise BudgetExhausted

        self._old_handler = signal.signal(signal.SIGALRM, fire)
        self.armed = True
        self.reset()
        return True

    def reset(self) -> None:
        """The alarm back at the deadline plus WATCHDOG_GRACE_S."""
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, max(0.1, self.left() + WATCHDOG_GRACE_S))

    def extend(self, grace_s: float = 120.0) -> None:
        """Give room past the budget for storing what a search found (a calibration run, a
        crash's single-pattern check, a shrink)."""
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, max(self.left(), 0) + grace_s)

    def disarm(self) -> None:
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._old_handler)
            self.armed = False


class StateMixin:
    """The campaign's state file, totals and logs (a part of :class:`~specfuzz.fuzz.campaign.Campaign`)."""

    def _load_state(self) -> dict | None:
        """The stored campaign state (:func:`load_state`; its notes in ``state_notes``)."""
        self.state_notes: list[str] = []
        return load_state(self.state_path, self.cfg.reset_state, self.state_notes)

    def _save_state(self) -> None:
        now = time.monotonic()
        wall = now - self._t_saved
        # Unrounded: a swapped family takes milliseconds, and rounding every addition would
        # drop them all.
        self.totals["seconds"] = self.totals["seconds"] + wall
        self._t_saved = now
        self._account(wall)
        atomic_write_json(self.state_path, {
            "schema_version": STATE_SCHEMA_VERSION,
            **({"legacy_spender": self.legacy_spender} if self.legacy_spender else {}),
            **({"ray": self.ray_history} if self.ray_history else {}),
            "searches": self.search_index,
            "totals": self.totals,
            "simplest_run": sorted(self.simplest_run),
            **({"deferred": [[c.to_json() for c in fam] for fam in self._deferred]} if self._deferred else {}),
        })

    def _account(self, wall: float) -> None:
        """Add ``wall`` seconds (since the last call) to the per-engine time totals: all of it
        to "shrink" while a failure or crash is being shrunk, confirmed and stored (and its
        parts, split as below, to "shrink_seconds"); otherwise the engines' start/swap/generate
        seconds to start/swap/sample and the rest to "other" (oracle, Hypothesis, checkpoints)."""
        eng = self.totals["engine"]
        sec = eng["seconds"]
        now = {k: sum(e.seconds[k if k != "sample" else "generate"] for e in self._engines) for k in ("start", "swap", "sample")}
        delta = {k: max(0.0, now[k] - self._acct[k]) for k in now}
        self._acct = now
        fill = {k: self._fill[k] - self._acct_fill[k] for k in self._fill}
        self._acct_fill = dict(self._fill)
        if self._shrinking:
            # Families sampled while a shrink's engines started (_fill_wait) are the search's
            # sampling, not the shrink's: their seconds go to swap, sample and other.
            for k in ("swap", "sample"):
                sec[k] = sec[k] + fill[k]
                delta[k] = max(0.0, delta[k] - fill[k])
            sec["other"] = sec["other"] + max(0.0, fill["wall"] - fill["swap"] - fill["sample"])
            wall = max(0.0, wall - fill["wall"])
            sec["shrink"] = sec["shrink"] + wall
            sec = eng["shrink_seconds"]
        for k, d in delta.items():
            sec[k] = sec[k] + d
        sec["other"] = sec["other"] + max(0.0, wall - sum(delta.values()))
        for k in ENGINE_COUNTERS:
            eng[k] = self._base[k] + sum(getattr(e, k, 0) for e in self._engines)

    def _count(self, cases: list[Case], runs: list[CaseRun], speculation: bool) -> None:
        method = cases[0].spec.method if speculation and cases[0].spec is not None else "off"
        m = self.totals["methods"].setdefault(method, {"families": 0, "patterns": 0, "samples": 0})
        m["families"] += 1
        m["patterns"] += len(cases)
        m["samples"] += sum(r.n for r in runs)
        # Which variants of the method were run (families each), so that a note can say
        # e.g. how many EAGLE-3 families had a reduced draft vocabulary or block verification.
        variants = m.setdefault("variants", {})
        for v in family_variants(cases[0]) if method != "off" else ():
            variants[v] = variants.get(v, 0) + 1
        eng = self.totals["engine"]
        eng["families"] += 1
        eng["samples"] += sum(r.n for r in runs)
        if method != "off":
            self.coverage.profile = self._profile
            self.coverage.record(cases, [r.n for r in runs], background=True)

    def _log_event(self, event: dict) -> dict:
        """One line in the campaign log (``.specfuzz/events.jsonl``), with the time, search and
        start shape; returns the line's record."""
        ev = dict(event)
        ev["time"] = time.time()
        ev["search"] = self.search_index
        if self.shape is not None:
            ev["shape"] = self.shape.describe()
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            with open(self.events_path, "a") as f:
                f.write(json.dumps(ev, default=str) + "\n")
        except OSError:
            pass
        return ev

    def _log_refusal(self, cases: list[Case], exc: InvalidInput, speculation: bool) -> None:
        """A case the engine refused (a configuration its capabilities did not rule out), in the
        campaign log with what was refused and the family it was refused in: a refused case
        costs a Hypothesis example, and the ``--quiet`` display does not say what it was."""
        self._log_event({"event": "case refused", "name": exc.name, "value": repr(exc.value)[:200],
                         "allowed": str(exc.allowed)[:300], **family_fields(cases, speculation)})

    def _log_family(self, cases: list[Case], runs: list[CaseRun], eng: IsolatedEngine, secs: dict, wall: float,
                    speculation: bool, fresh: bool) -> None:
        """One line per family run in ``.specfuzz/families.jsonl``: what it ran (method, V, the
        sampling features in play, patterns, samples) and where its time went (start, swap,
        generate, the rest), so that a slow engine's slow features can be told apart."""
        spec = cases[0].spec if speculation else None
        fields = family_fields(cases, speculation)
        rec = {
            "time": round(time.time(), 3), "worker": self.cfg.worker, "search": self.search_index, "role": "fresh" if fresh else (
                "calibration" if eng is self._spec_off_engine else "filler" if self._filling
                else "shrink" if self._shrinking else "search"),
            "method": fields["method"], "engine_default": bool(spec is not None and spec.engine_default),
            "V": fields["V"], "patterns": fields["patterns"], "samples": sum(r.n for r in runs), "features": fields["features"],
            "prompt_tokens": max(len(c.prompt) for c in cases), "max_tokens": max(c.params.max_tokens for c in cases),
            "failed": sum(r.failed for r in runs), "crash": any(r.crash is not None for r in runs),
            "seconds": {k: round(eng.seconds[k] - secs.get(k, 0.0), 4) for k in ("start", "swap", "generate")},
            # Of the start: waiting for the engine process to answer (its imports; a spare
            # process taken before its preload finished), against the engine's own start.
            "ready_s": round(getattr(eng, "ready_wait_s", 0.0) - secs.get("ready", 0.0), 4),
            # Of its wall: lent to families filling the start's wait (role "filler", logged first)
            "lent_s": round(getattr(eng, "lent_s", 0.0) - secs.get("lent", 0.0), 4),
            "wall_s": round(wall, 4),
        }
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            with open(self.state_dir / "families.jsonl", "a") as f:
                f.write(json.dumps(rec) + "\n")
        except OSError:
            pass
