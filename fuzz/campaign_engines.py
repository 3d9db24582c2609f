"""The campaign's engines: running a family on them, spare processes, prestarts, filled waits.

A campaign runs one engine per role, each an :class:`~specfuzz.engines.isolation.IsolatedEngine`
(a process of its own, restarted or swapped as the family needs):

* the *search engine* (``engine``): every family a search draws, its tables swapped in;
* the *speculation-off engine* (``_spec_off_engine``): a candidate checked with speculation
  off (a bug of the target's sampler, not of speculation), and stored findings' calibration;
* the *fresh engine* (``_fresh_engine``): confirmations, each on a newly started process that
  no other table model ran in.

Starts are what a campaign waits for most, so they are hidden where possible: a *spare*
process per engine (its imports done ahead) takes a restart where the engine restarts in a
new process; the next search's engines are *prestarted* in the background while this search
samples (:meth:`EnginePoolMixin._prestart_next`), and a candidate's fresh confirmation engine
while the candidate is checked (:meth:`EnginePoolMixin._prestart_fresh`); and while a fresh
or speculation-off engine starts, the search engine *fills the wait* with more families of
the running search, by swaps (:meth:`EnginePoolMixin._fill_wait`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Sequence

from hypothesis.errors import HypothesisException

from specfuzz.case import Case
from specfuzz.engines.base import EngineConfig
from specfuzz.engines.isolation import EngineCrash, IsolatedEngine
from specfuzz.errors import AmbiguousSemantics, InvalidInput
from specfuzz.fuzz.campaign_state import MAX_DEFERRED
from specfuzz.fuzz.families import draw_example, simplest_family
from specfuzz.fuzz.run import CaseRun, engine_config, run_family
from specfuzz.oracle.law import OutputSpaceTooLarge

# CampaignConfig.spare_engines=None turns spare engine processes on from this many CPUs.
SPARE_MIN_CPUS = 8
# Filling start waits (CampaignConfig.fill_waits): draws per wait until one family runs on the
# running search engine by a swap; the least budget left for one.
FILL_DRAWS = 3
FILL_MIN_LEFT_S = 5.0


class EnginePoolMixin:
    """The campaign's engines and their starts (a part of :class:`~specfuzz.fuzz.campaign.Campaign`)."""

    def _run(self, cases: list[Case], alphas: list[float], seed: int, speculation: bool = True,
             engine: IsolatedEngine | None = None, fresh: bool = False, max_samples: int | None = None) -> list[CaseRun]:
        """Run a family. ``fresh``: on a newly started engine process of its own (closed
        afterwards), never a swapped one: what confirmations of a failure use. ``max_samples``:
        per pattern (default: the campaign's --samples)."""
        if fresh:
            # One engine for fresh starts, kept between them where the engine restarts
            # in-process (cheap); closed after use where a fresh start is a new process
            # (GPU engines: no idle engine holds device memory).
            if self._fresh_engine is None:
                self._fresh_engine = self._new_engine()
            eng = self._fresh_engine
        else:
            eng = engine or self.engine
        before, swaps, falls = eng.starts, eng.swaps, eng.swap_fallbacks
        secs = dict(eng.seconds, ready=getattr(eng, "ready_wait_s", 0.0), lent=getattr(eng, "lent_s", 0.0))
        t0 = time.monotonic()
        split = getattr(self.engine.capabilities(), "seeded_call_prompt_tokens", None)
        try:
            runs = run_family(
                eng, cases, ckpt_root=Path(self.cfg.work_dir) / "checkpoints", alphas=alphas,
                max_samples=max_samples or self.cfg.max_samples, batch=self.cfg.batch, seed=seed, speculation=speculation,
                profile=self._profile, dtype=self.cfg.dtype, settings=dict(self.cfg.engine_settings), fresh=fresh,
                call_prompt_tokens=split,
            )
        finally:
            if fresh and not getattr(self.engine.capabilities(), "restart_in_process", True):
                eng.close(keep_spare=True, discard=True)
        self.stats.engine_starts += eng.starts - before
        self.stats.swaps += eng.swaps - swaps
        self.stats.swap_fallbacks += eng.swap_fallbacks - falls
        self.stats.samples += sum(r.n for r in runs)
        # The calls of the last run: a crash entry records the batch it crashed in.
        self._last_call = (max((r.call_requests for r in runs), default=0), split)
        self._log_family(cases, runs, eng, secs, time.monotonic() - t0, speculation, fresh)
        self._drain_events(cases[0])
        if self._filling:
            pass  # a family filling another engine's start: that start's caller prestarts as usual
        elif self._prestart_due and eng is self.engine and not fresh:
            self._prestart_next()
        elif eng is self._spec_off_engine and self._spec_off_next is not None:
            self._prestart_spec_off()
        return runs

    def _new_engine(self) -> IsolatedEngine:
        e = IsolatedEngine(self.cfg.engine, self.cfg.engine_kwargs, log_dir=Path(self.cfg.work_dir) / "logs",
                           swap=self.cfg.swap, spare=self._spares())
        self._engines.append(e)
        # (the fresh confirmation and speculation-off engines: their starts are filled)
        e.while_waiting = lambda: self._fill_wait(e)
        return e

    def _spares(self) -> bool:
        """Whether this campaign's engines keep a warmed-up spare process (CampaignConfig.spare_engines)."""
        if self.cfg.spare_engines is not None:
            return bool(self.cfg.spare_engines)
        caps = self.engine.capabilities()
        return not getattr(caps, "restart_in_process", True) and (os.cpu_count() or 1) >= SPARE_MIN_CPUS

    def _prestarts(self) -> bool:
        """Whether the next search's engine starts in the background (CampaignConfig.prestart)."""
        return self._spares() if self.cfg.prestart is None else bool(self.cfg.prestart)

    def _fills(self) -> bool:
        """Whether start waits are filled (CampaignConfig.fill_waits)."""
        return self._prestarts() if self.cfg.fill_waits is None else bool(self.cfg.fill_waits)

    def _warm_spares(self) -> None:
        """Once the search engine answered (its capabilities known): whether its restarts take
        a spare process, and if so one for it and for the confirmation and speculation-off
        engines, so that their first start does not wait for the engine's imports too."""
        if not self.engine.spare_enabled:
            self.engine.spare_enabled = self._spares()
            self.engine._ensure_spare()
            if self.engine.spare_enabled:
                self._fresh_engine = self._fresh_engine or self._new_engine()
                if not self.cfg.calibration_only:
                    self._spec_off_engine = self._spec_off_engine or self._new_engine()
                for e in (self._fresh_engine, self._spec_off_engine):
                    if e is not None:
                        e._ensure_spare()

    def _case_config(self, case: Case, speculation: bool, family: Sequence[Case] = ()) -> EngineConfig | None:
        """The engine config that serves ``case`` (with the rest of its ``family``, as run_family
        runs them) in this campaign, its tables written; None where the case cannot run (the
        start it would need is not made)."""
        try:
            return engine_config(case, Path(self.cfg.work_dir) / "checkpoints", dtype=self.cfg.dtype,
                                 speculation=speculation, settings=dict(self.cfg.engine_settings), family=family)
        except (InvalidInput, AmbiguousSemantics, OutputSpaceTooLarge):
            return None

    def _needs_restart(self, eng: IsolatedEngine, family: list[Case], speculation: bool) -> bool:
        """Whether ``family`` needs ``eng`` to load another config than it runs (other tables or
        context length: a swap, or a start where the engine refuses swaps); False where the
        family cannot run (its run says why)."""
        cfg = self._case_config(family[0], speculation, family)
        return cfg is not None and cfg != eng.running_config

    def _prestart_next(self) -> None:
        """Once a search's engine runs: start the next search's engine in the background
        (IsolatedEngine.prestart), on the simplest family of its start shape (the shape is
        known ahead: :meth:`_shape`), so that the next search's start is mostly waited for
        already. Its tables are swapped for the search's own and checked at that start."""
        self._prestart_due = False
        if not self._prestarts():
            return
        index = self.search_index + 1
        try:
            shape = self._shape(index)
            fam = simplest_family(self._strategy(shape))
            if not fam:
                return
            cfg = engine_config(fam[0], Path(self.cfg.work_dir) / "checkpoints", dtype=self.cfg.dtype,
                                speculation=shape.spec is not None, settings=dict(self.cfg.engine_settings))
            if self.engine.prestart(cfg):
                self.on_event(f"prestarting the engine of search {index}: {shape.describe()}", self.stats)
            if shape.spec is not None and self._spec_off_engine is not None and self._spec_off_engine.starts > 0:
                # The speculation-off engine of that shape too, once candidates have needed one:
                # a search's first candidate checks speculation off (and known calibration bugs)
                # on it, which would otherwise wait for its start once per search.
                self._spec_off_next = (index, engine_config(
                    fam[0], Path(self.cfg.work_dir) / "checkpoints", dtype=self.cfg.dtype,
                    speculation=False, settings=dict(self.cfg.engine_settings)))
                self._prestart_spec_off()
        except (InvalidInput, AmbiguousSemantics, OutputSpaceTooLarge, EngineCrash) as exc:
            self.on_event(f"no prestart for search {index}: {exc}", self.stats)

    def _prestart_spec_off(self, search_over: bool = False) -> None:
        """Prestart the next search's speculation-off engine (:meth:`_prestart_next`), unless
        the one prestarted for the running search waits untaken: it is kept until the search
        used its speculation-off engine (called again after each run on it) or ended
        (``search_over``). An engine holds one prestart, so the next search's, made at the
        running search's first family, would end the running search's own before its first
        candidate could take it."""
        eng, pending = self._spec_off_engine, self._spec_off_next
        if eng is None or pending is None or pending[0] <= self.search_index:
            return
        if not search_over and self._spec_off_hot_search == self.search_index and eng.prestarted_key() is not None:
            return
        if eng.prestart(pending[1]):
            if self._spec_off_hot_search != pending[0]:
                self.on_event(f"prestarting the speculation-off engine of search {pending[0]}", self.stats)
            self._spec_off_hot_search = pending[0]

    def _prestart_calibration(self, case: Case) -> None:
        """Before a shrunk speculation failure's fresh confirmation: prestart the
        speculation-off engine on its case, which :meth:`_store_failure` then checks with
        speculation off, so that the two starts overlap (a shrink that drops a vocabulary token
        moves the case to another start, which both engines need)."""
        eng = self._spec_off_engine
        if eng is None or not self._found_speculation() or not self._prestarts():
            return
        cfg = self._case_config(case, speculation=False)
        if cfg is not None and eng.prestart(cfg):
            self._spec_off_hot_search = self.search_index

    def _prestart_fresh(self, case: Case, speculation: bool) -> None:
        """A candidate's fresh confirmation engine, started in the background on exactly its
        case (``IsolatedEngine.prestart(fresh=True)``: no warm-up, no swap, a process no engine
        ran in) while the candidate is checked with speculation off and screened again on the
        running engines; the confirmation takes it, or, where the candidate passes again or
        turns out a calibration bug (confirmed with speculation off), it ends unused. The
        checks and the fresh start then overlap instead of following one another."""
        if not self._prestarts():
            return
        if self._fresh_engine is None:
            self._fresh_engine = self._new_engine()
        eng = self._fresh_engine
        if not eng.can_prestart():
            return
        cfg = self._case_config(case, speculation)
        if cfg is not None:
            eng.prestart(cfg, fresh=True)

    def _calibration_likely(self) -> bool:
        """Whether more of this run's confirmed candidates were calibration bugs (speculation off
        fails too) than speculation failures: the next candidate's fresh confirmation is then
        started ahead with speculation off."""
        spec, calib = self._confirmed_kinds
        return calib > spec

    def _end_fresh_prestart(self, why: str) -> None:
        if self._fresh_engine is not None:
            self._fresh_engine.end_prestart(why)

    def _fill_wait(self, waiting: IsolatedEngine) -> None:
        """Called about once a second while ``waiting`` (a fresh confirmation engine, the
        speculation-off engine) starts: one more family of the running search, on the search's
        engine, by a swap (never a start: a draw that needs one is passed over), screened as any,
        so that the search engine does not idle through starts of tens of seconds on a GPU.
        A filling family that fails its
        screening is kept (MAX_DEFERRED) and examined as a candidate once the search's own
        failure is shrunk and stored (:meth:`_examine_deferred`); one that crashes the engine is
        recorded as found, as a crash met while another failure shrinks is."""
        if (self._filling or waiting is self.engine or self._fill_strategy is None or not self._fills()
                or self._left() <= FILL_MIN_LEFT_S):
            return
        eng = self.engine
        running = eng.running_config
        if running is None:
            return
        spec = not self.cfg.calibration_only
        self._filling = True
        t0, sw0, g0 = time.monotonic(), eng.seconds["swap"], eng.seconds["generate"]
        try:
            for _ in range(FILL_DRAWS):
                self._fill_count += 1
                seed = self._fill_seed + 7919 * self._fill_count
                try:
                    fam = draw_example(self._fill_strategy, seed)
                except (HypothesisException, IndexError):
                    continue  # (a strategy whose draws this seed all rejected: the wait goes unfilled)
                cfg = self._case_config(fam[0], spec, fam)
                if cfg is None or (cfg != running and not eng.can_swap(cfg)):
                    continue
                try:
                    runs = self._run(fam, [self.cfg.screen_alpha] * len(fam), seed, speculation=spec, engine=eng)
                except (AmbiguousSemantics, OutputSpaceTooLarge):
                    self.stats.rejected += 1
                    continue
                except InvalidInput as exc:
                    self.stats.refused += 1
                    self._log_refusal(fam, exc, spec)
                    continue
                self.stats.cases += 1
                self.stats.patterns += len(fam)
                self._count(fam, runs, spec)
                self.totals["engine"]["filled_families"] += 1
                crash = next((r.crash for r in runs if r.crash is not None), None)
                if crash is not None:
                    self._record_crash(fam[0], crash, list(fam))
                elif any(r.failed for r in runs) and len(self._deferred) < MAX_DEFERRED:
                    self._deferred.append(list(fam))
                    self.on_event("a family sampled while an engine started failed its screening: "
                                  "examined once this search's failure is handled", self.stats)
                return
        finally:
            self._filling = False
            f = self._fill
            f["wall"] += time.monotonic() - t0
            f["swap"] += eng.seconds["swap"] - sw0
            f["sample"] += eng.seconds["generate"] - g0

    def _drain_events(self, case: Case | None = None) -> None:
        """Swap events of every engine to the campaign log (events.jsonl) and the display; a
        table check that failed after a swap and passed after a fresh start (stale weights
        in the engine's update path) is stored as a ``swap`` entry."""
        for e in self._engines:
            while e.events:
                ev = self._log_event(e.events.pop(0))
                name = str(ev.get("event"))
                if name.startswith("prestarted engine"):
                    what = ev.get("detail") or ", ".join(f"{k} {ev[k]}" for k in ("seconds", "requests") if k in ev)
                    self.on_event(f"{name}: {str(what)[:120]}", self.stats)
                elif name != "state kept across swap":
                    self.on_event(f"swap: {name}: {str(ev.get('detail', ''))[:120]}", self.stats)
                if ev.get("stale_weights") and case is not None:
                    self.totals["engine"]["stale_weights"] += 1
                    self._store_stale_weights(case, ev)
