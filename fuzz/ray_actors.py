"""Engine actors of a Ray campaign: each runs searches on its own engine, stores nothing itself.

An :class:`EngineActor` (a Ray actor with ``num_gpus`` = ``--gpus-per-engine``, or CPUs
only for a CPU engine) holds one :class:`ActorCampaign`: the campaign of
``fuzz/campaign.py`` whose engine, Hypothesis search, oracle, shrinking and calibration
run here, in the actor, with their own work folder (checkpoints and engine logs) on the
actor's node. What a campaign would write goes to the driver instead:

* corpus entries (found, seen again, crashes, stale-weight swaps): ``hub.store``;
* whether a signature or crash is known, and the simplest families already run: asked of
  the hub when needed, so a bug another host stored a moment ago is not shrunk twice;
* every test's and confirmation's α: taken from the hub's α budget;
* totals, counters, swap events and messages: reported to the hub after every family;
* the Hypothesis database: :class:`~specfuzz.fuzz.exampledb.RayExampleDatabase`;
* each family's patterns, before it runs (``hub.begin_family``), so that the driver can
  retry it elsewhere if this actor dies.

The driver hands out searches by index (``search(index, left_s)``); each search index has
its own seed (campaign seed x 100,000 + index, as without Ray), so the searches of
different actors differ, and the start shape follows the index as it does without Ray.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import tempfile
import time
import traceback
from pathlib import Path

from specfuzz.case import Case
from specfuzz.fuzz.campaign import (
    BudgetExhausted, Campaign, CampaignConfig, CampaignStats, PatternFailed, SearchSliceOver, attributed_label,
)
from specfuzz.fuzz.corpus import Entry, entry_file_name

# Engine seeds of a retried family's runs: RETRY_SEED x (search index + 1) and up (screening
# seeds are search seed x 1,000,003 plus offsets, so these do not repeat a search's).
RETRY_SEED = 7_000_003
# CampaignStats fields an actor reports (numbers; the driver adds them up).
REPORTED_STATS = tuple(f.name for f in dataclasses.fields(CampaignStats)
                       if f.type in ("int", "float", int, float) and f.name != "started")


def _get(ref):
    import ray

    return ray.get(ref)


class HubCorpus:
    """The corpus as an actor sees it: stores go to the driver's hub."""

    def __init__(self, hub, found_by: dict) -> None:
        self.hub = hub
        self.found_by = found_by
        self.root = Path("<driver>")

    def store(self, entry: Entry) -> tuple[Path, bool]:
        entry.extra.setdefault("found_by", json.loads(json.dumps(self.found_by)))
        name, new = _get(self.hub.store.remote(entry.to_json()))
        return Path(name), new

    def path_for(self, entry: Entry) -> Path:
        """The entry's name in the driver's corpus (the names ``known_entries`` hands out)."""
        return Path(entry_file_name(entry))

    def entries(self):
        return iter(())


class HubSet:
    """A set kept by the hub (known signatures, shrunk crash keys, simplest families run)."""

    def __init__(self, hub, which: str) -> None:
        self.hub, self.which = hub, which

    def __contains__(self, item: object) -> bool:
        return bool(_get(self.hub.contains.remote(self.which, item)))

    def add(self, item: str) -> None:
        self.hub.add.remote(self.which, item)

    def __iter__(self):
        return iter(_get(self.hub.members.remote(self.which)))


class HubSpender:
    """The campaign's α sequence, taken from the hub: ``peek`` takes the next level (and
    holds it until ``next``), so a level is never given to two tests on two actors."""

    def __init__(self, hub) -> None:
        self.hub = hub
        self._held: float | None = None

    def peek(self) -> float:
        if self._held is None:
            self._held = float(_get(self.hub.take_alpha.remote()))
        return self._held

    def next(self) -> float:
        a = self.peek()
        self._held = None
        return a


class HubLedger:
    """The campaign's confirmation ledger (fuzz/ledger.py), kept by the hub."""

    def __init__(self, hub) -> None:
        self.hub = hub

    def spend(self) -> tuple[int, float]:
        return tuple(_get(self.hub.spend.remote()))  # type: ignore[return-value]

    def read(self):
        return _get(self.hub.budget.remote())


class ActorCampaign(Campaign):
    """A campaign whose stores, α, shared sets, state and database live on the driver."""

    def __init__(self, config: CampaignConfig, hub, store, key: str, info: dict) -> None:
        # The parent's files (state, events, an empty corpus) go to a scratch folder of
        # this actor; everything that is kept goes to the hub.
        super().__init__(config)
        self.hub, self.key = hub, key
        self.corpus = HubCorpus(hub, {"actor": key, "host": info.get("host")})
        self.known = HubSet(hub, "known")
        self.known_crashes = HubSet(hub, "known_crashes")
        self.simplest_run = HubSet(hub, "simplest")
        if hasattr(self, "ledger"):  # two-stage α budget: confirmations spend from the driver's ledger
            self.ledger = HubLedger(hub)
            self.seen_again = HubSet(hub, "seen_again")
        else:  # per-family α: every level taken from the driver's sequence
            self.spender = HubSpender(hub)
        self.on_event = self._message
        self._messages: list[str] = []
        self._events_at = 0
        self._db = None
        self._store_handle = store
        self._profile = None
        # The driver's stored calibration entries and speculation findings (the parent read an
        # empty scratch corpus), asked again before each check, since other actors store too.
        self.calibration_entries = {}
        self.finding_entries = {}
        self._finding_evidence, self._finding_symptoms = {}, {}
        self._refresh_known_entries()

    def _mark_seen(self, path: Path, also_under: str | None = None) -> bool:
        return bool(_get(self.hub.mark_seen.remote(str(path), also_under)))

    def _refresh_known_entries(self) -> None:
        """The driver's calibration entries and speculation findings, by their names in its
        corpus (``_mark_seen`` passes the name back)."""
        for name, ej in _get(self.hub.known_entries.remote()):
            entry = Entry.from_json(ej)
            self._add_calibration(entry, Path(name))
            self._add_finding(entry, Path(name))

    def _is_stored(self, path: Path) -> bool:
        return bool(_get(self.hub.has_entry.remote(str(path))))

    def _store_entry(self, entry: Entry, how: str = "") -> None:
        # A calibration entry shrunk to a stored one's features (another actor's, stored since
        # this actor last asked, included) is that entry seen again, not a second entry.
        if entry.kind == "calibration":
            self._refresh_known_entries()
        super()._store_entry(entry, how)

    def _known_calibration(self, run, seed: int) -> bool:
        self._refresh_known_entries()
        return super()._known_calibration(run, seed)

    def _known_finding(self, run, seed: int) -> bool:
        self._refresh_known_entries()
        return super()._known_finding(run, seed)

    def _example_database(self):
        if self._db is None:
            from specfuzz.fuzz.exampledb import FailuresOnly, RayExampleDatabase

            self._db = FailuresOnly(RayExampleDatabase(self._store_handle))
        return self._db

    def _message(self, message: str, stats) -> None:  # noqa: ARG002
        if message:
            self._messages.append(message)

    def _save_state(self) -> None:
        now = time.monotonic()
        wall = now - self._t_saved
        self.totals["seconds"] = round(self.totals["seconds"] + wall, 1)
        self._t_saved = now
        self._account(wall)
        self.hub.report.remote(self.key, self.totals, self.stats_dict(), self._new_events(), self._messages)
        self._messages = []

    def stats_dict(self) -> dict:
        return {k: getattr(self.stats, k) for k in REPORTED_STATS}

    def _new_events(self) -> list[str]:
        try:
            with open(self.events_path) as f:
                f.seek(self._events_at)
                text = f.read()
                self._events_at = f.tell()
        except OSError:
            return []
        return [line for line in text.splitlines() if line.strip()]

    def _fills(self) -> bool:
        """No start waits filled in an engine actor (Campaign._fill_wait): the hub keeps one
        family in flight per actor (begin_family/end_family: what a dead actor was running),
        and a family filling a start would replace the one whose start it fills."""
        return False

    def _run(self, cases, alphas, seed, speculation=True, engine=None, fresh=False, max_samples=None):
        role = "calibration" if engine is not None and engine is self._spec_off_engine else ("fresh" if fresh else "search")
        _get(self.hub.begin_family.remote(self.key, {
            "cases": [c.to_json() for c in cases], "speculation": speculation, "role": role,
            "search": self.search_index, "engine": self._version_or_name(),
        }))
        try:
            return super()._run(cases, alphas, seed, speculation=speculation, engine=engine, fresh=fresh,
                                max_samples=max_samples)
        finally:
            self.hub.end_family.remote(self.key)

    def _version_or_name(self) -> dict:
        try:
            return dict(self.engine.version())
        except Exception:  # noqa: BLE001 - a crashing engine still has a name
            return {"name": self.cfg.engine}

    def search(self, index: int, left_s: float) -> dict:
        """One search (the body of Campaign.run's loop for search ``index``)."""
        t0 = time.monotonic()
        self.deadline = t0 + left_s
        self.search_index = index
        self.stats.searches += 1
        self.shape = self._shape(index)
        shape_key = self._count_search()
        families = self.stats.cases
        found = None
        try:
            found = self._search(self._strategy(self.shape), self.cfg.seed * 100_000 + index, shape_key)
            if found is not None:
                found = self._greedy_shrink_found(found, self._found_speculation())
                if found is not None:  # None: shrunk to a stored speculation finding (Campaign._shrunk_known)
                    self._store_failure(*found[1:])  # (run, confirmation[, confirmation index])
        except BudgetExhausted:
            pass
        finally:
            self._save_state()
            self._shrinking = False
        return {"index": index, "shape": self.shape.describe(), "families": self.stats.cases - families,
                "found": None if found is None else (found[1].judgement.attribution.label if found[1].judgement.attribution else "unknown"),
                "seconds": round(time.monotonic() - t0, 2)}

    def retry(self, record: dict, left_s: float) -> dict:
        """A family whose actor died, run again here on a fresh engine. A crash is stored
        (unshrunk, as a crash met while shrinking something else is: a search that meets it
        again shrinks it); a failure is confirmed, shrunk greedily (fuzz/shrink.py, every
        reduction re-run on fresh samples, the result confirmed again on a fresh engine)
        and stored; a pass is counted like any family."""
        self.deadline = time.monotonic() + left_s
        self.search_index = int(record.get("search") or 0)
        self._spec_off_found = False  # confirmed as it ran (speculation as recorded)
        cases = [Case.from_json(c) for c in record["cases"]]
        speculation = bool(record.get("speculation", True))
        if self._profile is None:
            self._profile = self.engine.capabilities().profile
        seed = RETRY_SEED * (self.search_index + 1)
        runs = self._run(cases, [self.cfg.screen_alpha] * len(cases), seed, speculation=speculation, fresh=True)
        self.stats.cases += 1
        self.stats.patterns += len(cases)
        self._count(cases, runs, speculation)
        self.corpus.found_by["retry_of"] = record.get("actor")
        out = {"retried": True, "crash": None, "failed": False}
        try:
            crash = next((r.crash for r in runs if r.crash is not None), None)
            if crash is not None:
                self._record_crash(cases[0], crash, cases)
                out["crash"] = crash.kind
                return out
            for r in runs:
                if not r.failed:
                    continue
                if self._entry_for(r).signature in self.known:
                    continue  # a known bug: the searches mark it seen again
                conf, j = self._confirm(r, speculation)
                if not conf.failed:
                    continue
                self._shrinking = True
                self.on_event(f"failure ({attributed_label(r)}) in a retried family; shrinking", self.stats)
                run, conf, j, res = self._greedy_shrink(r, conf, j, speculation, budget_s=max(0.0, self._left()),
                                                        seed=seed + 2)
                self.corpus.found_by["shrunk_by"] = {"greedy": res.steps, "tried": res.tried,
                                                     "minimal": not res.budget_exhausted}
                if res.kept and run is r:
                    self.corpus.found_by["shrunk_by"]["kept"] = "unshrunk: the shrunk case did not confirm"
                self._store_failure(run, conf, j)
                out["failed"] = True
                break
            return out
        finally:
            self.corpus.found_by.pop("retry_of", None)
            self._save_state()
            self._shrinking = False



class EngineActor:
    """One engine and its searches (run as a Ray actor; see the module docstring)."""

    def __init__(self, config: dict, hub, store, rank: int, incarnation: int, run_id: str) -> None:
        import ray

        self.key = f"a{rank}.{incarnation}"
        ctx = ray.get_runtime_context()
        self.info = {"rank": rank, "incarnation": incarnation, "host": socket.gethostname(), "pid": os.getpid(),
                     "node": ctx.get_node_id(), "gpus": [str(g) for g in ray.get_gpu_ids()],
                     "specfuzz": _specfuzz_version()}
        self.broken: str | None = None
        try:
            work = _work_dir(Path(config["work_dir"]), run_id, self.key)
            cfg = CampaignConfig(**dict(config, corpus_dir=work / "scratch", work_dir=work, worker=0))
            self.campaign = ActorCampaign(cfg, hub, store, self.key, self.info)
            _preflight(self.campaign)
        except Exception as exc:  # noqa: BLE001 - reported by every call, so the driver stops the campaign
            self.broken = f"engine actor {self.key} on {self.info['host']} cannot run a campaign: " \
                          f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}"
        ray.get(hub.register.remote(self.key, self.info))

    def describe(self) -> dict:
        return dict(self.info, key=self.key)

    def search(self, index: int, left_s: float) -> dict:
        if self.broken:
            raise RuntimeError(self.broken)
        return dict(self.campaign.search(index, left_s), actor=self.key)

    def retry(self, record: dict, left_s: float) -> dict:
        if self.broken:
            raise RuntimeError(self.broken)
        return dict(self.campaign.retry(record, left_s), actor=self.key)

    def close(self) -> None:
        for e in getattr(getattr(self, "campaign", None), "_engines", ()):
            e.close()


def _preflight(campaign: ActorCampaign) -> None:
    """What every search needs on this node, tried once: the engine answers (its
    capabilities) and a table model's checkpoints can be written (tablegen's imports)."""
    import numpy as np

    from specfuzz.engines.checkpoints import materialize

    campaign.engine.capabilities()
    materialize(Case(target_table=np.zeros((2, 2), dtype=np.float32), prompt=(0,)),
                Path(campaign.cfg.work_dir) / "checkpoints", campaign.cfg.dtype)


def _specfuzz_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("specfuzz")
    except PackageNotFoundError:
        return "unknown"


def _work_dir(base: Path, run_id: str, key: str) -> Path:
    """This actor's own work folder: under the campaign's --work-dir where this node can
    write it, else under the node's temporary folder."""
    for root in (base, Path(tempfile.gettempdir()) / "specfuzz-ray"):
        d = root / "ray" / run_id / key
        try:
            d.mkdir(parents=True, exist_ok=True)
            return d
        except OSError:
            continue
    raise OSError(f"no writable work folder for engine actor {key}")


__all__ = ["EngineActor", "ActorCampaign", "HubCorpus", "HubSet", "HubSpender", "PatternFailed", "SearchSliceOver"]
