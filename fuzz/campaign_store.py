"""The campaign's side of the corpus: what is known, and storing what was found.

At its start a campaign indexes the corpus (:meth:`StoreMixin._read_known_entries`): the
signatures stored, the crashes (a crash met again marks its entry seen again), the
calibration entries (target-sampler bugs, by engine and sampling features) and the
speculation findings (by engine, method and sampling features) that the candidate pipeline
recognises. What a search confirms and shrinks is stored here, calibrated first (the same
engine with speculation off must agree with μ, or the entry is a calibration bug); a failure
whose signature is stored already marks that entry seen again.

A confirmed failure or a new crash is kept on disk as this worker's *pending record*
(``.specfuzz/pending-w<N>.json``) from its confirmation until it is stored shrunk: a campaign
killed meanwhile (a timeout, a lost machine) stores it unshrunk when it resumes
(:meth:`StoreMixin._store_pending`).
"""

from __future__ import annotations

import json
from pathlib import Path

from specfuzz.case import Case
from specfuzz.engines.isolation import EngineCrash
from specfuzz.errors import InvalidInput
from specfuzz.fuzz.corpus import Entry, active_features, atomic_write_json, calibration_key, mark_seen_again
from specfuzz.fuzz.families import crash_key, entry_crash_key
from specfuzz.fuzz.run import CaseRun, crash_entry, finding_entry
from specfuzz.fuzz.triage import profile_for


class StoreMixin:
    """The known corpus entries and storing findings, crashes and pending records (a part of
    :class:`~specfuzz.fuzz.campaign.Campaign`)."""

    def _read_known_entries(self) -> None:
        """Index the corpus's entries (the module docstring)."""
        entries = [(path, e) for path, e in self.corpus.entries() if isinstance(e, Entry)]
        self.known: set[str] = {e.signature for _, e in entries}
        # Crashes already stored shrunk: not shrunk again. One stored unshrunk (found while
        # shrinking something else, or by a version without crash shrinking) is shrunk
        # when a search meets it again.
        self.known_crashes: set[str] = {
            entry_crash_key(e) for _, e in entries if e.kind == "crash" and e.extra.get("shrunk") is True
        }
        # The stored entry of each crash (kind and message, numbers aside; a shrunk one
        # preferred): the same crash met again, under other sampling settings, marks that
        # entry seen again instead of storing one more entry of the same bug.
        # The stored calibration entry of each target-sampler bug (corpus.calibration_key: engine
        # and sampling features, any speculation method): a speculative candidate that fails
        # with speculation off too and shares a key is that entry seen again (_known_calibration).
        self.calibration_entries: dict[tuple[str, tuple[str, ...]], Path] = {}  # (engine name, features) -> entry
        # The stored speculation findings of each (engine name, method, sampling features): a
        # speculative candidate of that method whose features include a finding's and that
        # fails reduced to them is that finding met again (_known_finding).
        self.finding_entries: dict[tuple[str, str, tuple[str, ...]], tuple[Path, str | None, str]] = {}
        # Each stored finding's case, counts and profile (by signature), for its symptom
        # (triage.symptom), computed when a candidate of another method of its engine path needs it.
        self._finding_evidence: dict[str, tuple[dict, dict, str]] = {}
        self._finding_symptoms: dict[str, str | None] = {}
        for path, e in entries:
            self._add_calibration(e, path)
            self._add_finding(e, path)
        self.crash_entries: dict[str, Path] = {}
        for path, e in sorted(entries, key=lambda pe: pe[1].extra.get("shrunk") is True):
            if e.kind == "crash":
                self.crash_entries[entry_crash_key(e)] = path

    def _add_calibration(self, entry: Entry, path: Path) -> None:
        if entry.kind == "calibration":
            self.calibration_entries.setdefault(calibration_key(str(entry.engine.get("name")), entry.case), path)

    def _add_finding(self, entry: Entry, path: Path) -> None:
        method = (entry.case.get("spec") or {}).get("method")
        if entry.kind == "finding" and method:
            key = (str(entry.engine.get("name")), str(method), tuple(active_features(entry.case)))
            self.finding_entries.setdefault(key, (path, entry.label, entry.signature))
            self._finding_evidence.setdefault(entry.signature, (entry.case, dict(entry.counts), profile_for(entry)))

    def _mark_seen(self, path: Path, also_under: str | None = None) -> bool:
        """Mark the stored entry at ``path`` seen again (``also_under``: the speculation method it
        was met under, when not its own; a Ray engine actor asks the driver)."""
        return mark_seen_again(path, also_under)

    def _entry_for(self, run: CaseRun, calibration: CaseRun | None = None) -> Entry:
        entry = finding_entry(self.engine.version(), run, calibration)
        if self.cfg.calibration_only:
            entry.kind = "calibration"
        return entry

    def _update_known(self, run: CaseRun) -> None:
        """A failure with a stored signature: mark the stored entry seen again."""
        path, new = self.corpus.store(self._entry_for(run))
        self.stats.findings_new += int(new)
        self.stats.findings_updated += int(not new)

    def _store_failure(self, run: CaseRun, conf: CaseRun, j: int) -> None:
        version = self.engine.version()
        if self.cfg.calibration_only:
            entry = finding_entry(version, run, None)
            entry.kind = "calibration"
        elif self._spec_off_found:
            # Confirmed with speculation off on a fresh engine (and shrunk with speculation off):
            # a calibration bug, whose evidence is that confirmation. No speculation-off run on
            # the campaign's speculation-off engine as well: it would only repeat the
            # confirmation, and restart that engine for a shrunk case's vocabulary.
            entry = finding_entry(version, conf, None)
            entry.kind = "calibration"
        else:
            calib = self._calibrate(run.case, seed=self.search_index * 7919 + 1, alpha=conf.judgement.verdict.alpha)
            if calib.failed:
                entry = finding_entry(version, calib, None)  # speculation off fails too
                entry.kind = "calibration"
            else:
                entry = finding_entry(version, run, calib)
        entry.extra.update(self._found_extra(conf, j))
        self._store_entry(entry)

    def _found_extra(self, conf: CaseRun, j: int) -> dict:
        """What an entry records of the confirmation that let it be stored and of where the
        search met it."""
        last = self.engine.last_swap
        return {
            "confirmation": None if conf.judgement is None else conf.judgement.verdict.to_dict(),
            "confirmation_index": j,  # the campaign's j-th confirmation, at α_j
            # Where the search met it: a swapped engine (and engine state a swap kept, which
            # changes what gets drafted); the confirmation ran on a freshly started engine.
            "found_on": {"engine_swaps": self.engine.swaps,
                         "confirmed_on": "fresh engine start" + (", speculation off" if self._spec_off_found else ""),
                         "kept_across_swap": list(getattr(last, "kept", ()) or ()) if last is not None else []},
            "campaign": {"seed": self.cfg.seed, "search": self.search_index},
        }

    def _is_stored(self, path: Path) -> bool:
        """Whether the corpus entry at ``path`` (a path of ``calibration_entries``) is stored."""
        return path.exists()

    def _store_entry(self, entry: Entry, how: str = "") -> None:
        """Store a confirmed failure's entry (``how``: said after it in the log)."""
        if entry.kind == "calibration":
            # The features of a stored calibration entry of this engine: that target-sampler bug
            # (corpus.calibration_key), met where the check for known calibration bugs did not
            # recognise it (it runs at the screening level, once). The stored entry is seen
            # again; no second entry of one bug.
            known = self.calibration_entries.get(calibration_key(str(entry.engine.get("name")), entry.case))
            if known is not None and self._is_stored(known) and known != self.corpus.path_for(entry):
                if self._mark_seen(known):
                    self.stats.findings_updated += 1
                self.known.add(entry.signature)
                shrunk = "" if entry.extra.get("shrunk") is False else "shrunk to "
                self.on_event(f"calibration bug seen again ({shrunk}the features of {known.name}): not stored again", self.stats)
                return
        path, new = self.corpus.store(entry)
        self.known.add(entry.signature)
        self.stats.findings_new += int(new)
        self.stats.findings_updated += int(not new)
        self._add_calibration(entry, path)
        self._add_finding(entry, path)
        if new:
            self.stats.stored.append(path.name)
        self.on_event(f"stored {entry.kind} {path.name} ({entry.label}){how}", self.stats)

    def _crash_entry(self, case: Case, crash: EngineCrash, family: list[Case]) -> Entry:
        """The entry of a crash that ``family`` met in the last engine call (its batch and
        prompt-token split recorded)."""
        call_requests, split = self._last_call
        return crash_entry(self.engine, case, crash, self.cfg.engine, dtype=self.cfg.dtype,
                           settings=dict(self.cfg.engine_settings), family=family,
                           batch=call_requests or self.cfg.batch, call_prompt_tokens=split)

    def _record_crash(self, case: Case, crash: EngineCrash, family: list[Case] | None = None, shrunk: bool = False) -> None:
        if crash.kind == "resource":
            # The engine refused to start for lack of GPU memory, each time it was tried
            # (IsolatedEngine.start): other engines on the GPU held it. Not a finding.
            self.stats.resource_refusals += 1
            self._log_event({"event": "engine start refused for lack of GPU memory (not stored)",
                             "detail": crash.detail[:300], "case": case.to_json()})
            self.on_event(f"engine start refused for lack of GPU memory, not a finding: {crash.detail[:120]}", self.stats)
            return
        self.stats.crashes += 1
        known = self.crash_entries.get(crash_key(crash))
        if not shrunk and known is not None and known.exists():
            # A crash already stored (found with other settings): that entry is seen again.
            if mark_seen_again(known):
                self.stats.findings_updated += 1
                self.on_event(f"crash ({crash.kind}) seen again: {crash.detail[:100]} -> {known.name}", self.stats)
                return
        entry = self._crash_entry(case, crash, family or [case])
        entry.extra["shrunk"] = shrunk
        path, new = self.corpus.store(entry)
        if shrunk or crash_key(crash) not in self.crash_entries:
            self.crash_entries[crash_key(crash)] = path
        self.known.add(entry.signature)
        if shrunk:
            self.known_crashes.add(crash_key(crash))
        if new:
            self.stats.stored.append(path.name)
        self.on_event(f"crash ({crash.kind}): {crash.detail} -> {path.name}", self.stats)

    def _crash_known(self, case: Case, crash: EngineCrash, family: list[Case]) -> bool:
        """A crash already in the corpus (same kind and message, numbers aside): not shrunk again."""
        if crash_key(crash) in self.known_crashes:
            return True
        entry = crash_entry(self.engine, case, crash, self.cfg.engine, dtype=self.cfg.dtype, family=family)
        return entry.signature in self.known

    def _store_stale_weights(self, case: Case, ev: dict) -> None:
        try:
            version = dict(self.engine.version())
        except EngineCrash:
            version = {"name": self.cfg.engine}
        entry = Entry(kind="swap", engine=version, case=case.to_json(),
                      evidence=f"table check failed after an in-place swap ({str(ev.get('detail'))[:200]}) and passed after a fresh start",
                      extra={"event": ev, "dtype": self.cfg.dtype, "engine_settings": dict(self.cfg.engine_settings)})
        path, new = self.corpus.store(entry)
        if new:
            self.stats.stored.append(path.name)

    def _pending_path(self) -> Path:
        """This worker's record of a failure confirmed, or a crash met, and not yet stored (one
        at a time)."""
        return self.state_dir / f"pending-w{self.cfg.worker}.json"

    def _write_pending(self, conf: CaseRun, j: int, calib: CaseRun | None) -> None:
        """The entry a confirmed failure would make unshrunk, written before shrinking starts:
        shrinking takes minutes on a GPU engine, and a campaign killed meanwhile (a timeout, a
        lost machine) would otherwise lose it. ``calib``: the speculation-off run of the same case on the
        running engine (the screening-level check a speculative candidate passed)."""
        entry = finding_entry(self.engine.version(), conf, calib)
        if self.cfg.calibration_only or self._spec_off_found:
            entry.kind = "calibration"
        entry.extra.update(self._found_extra(conf, j))
        entry.extra.update({
            "shrunk": False,
            "note": ("Stored from the pending record of a campaign that ended (killed, or its machine lost) after it "
                     "confirmed this failure on a fresh engine and before it shrank and stored it: not shrunk"
                     + ("" if entry.kind == "calibration" else
                        "; speculation off was checked on the same case at the screening level only (its calibration)")
                     + "."),
        })
        self._keep_pending(entry, "the confirmed failure")

    def _keep_pending(self, entry: Entry, what: str) -> None:
        """``entry`` written as this worker's pending record (atomically: a kill leaves the old
        record or the new one)."""
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self._pending_path(), entry.to_json())
        except OSError as exc:
            self.on_event(f"could not keep {what} on disk ({exc}): it is stored once shrunk", self.stats)

    def _write_pending_crash(self, case: Case, crash: EngineCrash, family: list[Case]) -> None:
        """A new crash's entry as found (its family, mixed in each call as it crashed), written
        before its shrink starts: every shrink candidate starts a fresh engine process, minutes
        on a GPU engine, and a campaign killed meanwhile would otherwise lose the crash, itself a
        finding. The resumed campaign stores it unshrunk (:meth:`_store_pending`)."""
        try:
            entry = self._crash_entry(case, crash, family)
        except (EngineCrash, InvalidInput) as exc:
            self.on_event(f"could not keep the crash on disk ({exc}): it is stored once shrunk", self.stats)
            return
        entry.extra.update({
            "shrunk": False,
            "note": ("Stored from the pending record of a campaign that ended (killed, or its machine lost) while it "
                     "shrank this crash: not shrunk."),
        })
        self._keep_pending(entry, "the crash")

    def _store_pending(self) -> None:
        """A failure this worker confirmed (_write_pending), or a crash it met
        (_write_pending_crash), in an earlier run that ended before storing it: stored now,
        unshrunk, unless its signature is stored already. Worker 0
        also takes those of workers this run does not have (an earlier run had more)."""
        paths = [self._pending_path()]
        if self.cfg.worker == 0:
            for p in sorted(self.state_dir.glob("pending-w*.json")):
                w = p.stem.removeprefix("pending-w")
                if w.isdigit() and int(w) >= max(1, self.cfg.workers):
                    paths.append(p)
        for path in paths:
            if path.exists():
                self._store_pending_file(path)

    def _store_pending_file(self, path: Path) -> None:
        try:
            entry = Entry.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self.on_event(f"a pending confirmed failure or crash could not be read ({path.name}: {exc}); it is left in place", self.stats)
            return
        if entry.signature not in self.known:
            if entry.kind == "crash":
                self._store_entry(entry, ", met by an earlier run that ended while shrinking it")
                key = entry_crash_key(entry)
                stored = self.corpus.path_for(entry)
                self.crash_entries.setdefault(key, stored)  # met again: seen again, or shrunk then
            else:
                self._store_entry(entry, ", confirmed by an earlier run that ended before shrinking it")
        path.unlink(missing_ok=True)
