"""Shrinking what a search found, on the campaign's engines.

A search's confirmed failure raises inside its Hypothesis example, and Hypothesis shrinks it:
every shrink candidate runs with fresh samples on the running engine (its tables swapped in
and checked) and must fail the screening test with the same attribution label. Hypothesis's
half of the shrinking cap (``max(SHRINK_MIN_S, SHRINK_SHARE x budget)``) over, the greedy
shrinker of ``fuzz/shrink.py`` goes on from its smallest case (smaller vocabulary, which a
search's start shape fixes; shorter prompt; fewer knobs), its reductions decided on the
running engine too (:meth:`ShrinkMixin._greedy_shrink_found`). Only the smallest case kept is
confirmed on a freshly started engine at the next α_j; if it does not confirm, the smallest
confirmed failure is kept: neither noise nor a swap can make a stored failure, and a shrink
costs two fresh starts, not one per candidate. A shrunk failure that turns out to be a stored
finding or calibration bug is marked seen again instead (:meth:`ShrinkMixin._shrunk_known`,
:meth:`ShrinkMixin._shrunk_known_calibration`).

A crash shrinks with every candidate on a fresh engine process (Hypothesis's shrink, then
:meth:`ShrinkMixin._greedy_shrink_crash`).
"""

from __future__ import annotations

import time
from pathlib import Path

from specfuzz.case import Case
from specfuzz.engines.isolation import EngineCrash, IsolatedEngine
from specfuzz.errors import AmbiguousSemantics, InvalidInput
from specfuzz.fuzz.campaign_candidates import attributed_label
from specfuzz.fuzz.corpus import calibration_key
from specfuzz.fuzz.families import crash_key
from specfuzz.fuzz.run import CaseRun, crash_entry, start_key
from specfuzz.oracle.law import OutputSpaceTooLarge

# Shrinking one failure (Hypothesis's shrink phase, then the greedy shrinker of
# fuzz/shrink.py, which also narrows the vocabulary below the search's start shape) stops
# after max(SHRINK_MIN_S, SHRINK_SHARE x budget): what it kept so far is stored, and
# `specfuzz shrink` goes on from there. Without a cap, one failure (often a variant of a
# known engine bug met with other sampling settings) could take the rest of the campaign.
SHRINK_MIN_S = 60.0
SHRINK_SHARE = 0.15


class ShrinkMixin:
    """Shrink orchestration (a part of :class:`~specfuzz.fuzz.campaign.Campaign`)."""

    def _shrink_cap_s(self) -> float:
        return max(SHRINK_MIN_S, SHRINK_SHARE * self.cfg.budget_s)

    def _found_speculation(self) -> bool:
        """Whether the failure the last search found is confirmed, shrunk and stored with
        speculation on (not a speculation-off campaign, and its candidate passed with
        speculation off: otherwise it is a calibration bug, handled with speculation off)."""
        return not self.cfg.calibration_only and not self._spec_off_found

    def _greedy_shrink_found(self, found: tuple, speculation: bool) -> tuple | None:
        """What a search found and Hypothesis shrank, through :meth:`_greedy_shrink` for the
        rest of the failure's shrinking cap. Returns (cases, run, conf, j), or None where the
        shrunk failure is a stored speculation finding met again (:meth:`_shrunk_known`) or a
        stored calibration bug met again (:meth:`_shrunk_known_calibration`)."""
        _, run, conf, j = found
        if conf is None and speculation and self._shrunk_known(run, "Hypothesis's smallest failure"):
            return None
        off = self.engine if self.cfg.calibration_only else self._spec_off_engine
        if not speculation and off is not None and self._shrunk_known_calibration(
                run, off, "Hypothesis's smallest failure"):
            return None
        spent = time.monotonic() - self._shrink_started if self._shrink_started else 0.0
        # The rest of the failure's shrinking cap, even past the campaign's budget (as
        # calibrating and storing may overrun it): a finding is stored small or not at all
        # before the campaign ends. At least 20 s: a failure found late still gets a few candidates.
        budget = max(20.0, self._shrink_cap_s() - spent)
        small, conf2, j2, res = self._greedy_shrink(run, conf, j, speculation, budget_s=budget,
                                                     seed=self.search_index * 7919 + 17, known_check=True)
        if small is None:
            return None
        if small is run:
            # nothing kept (or what was kept did not confirm): Hypothesis's smallest, confirmed
            # now if the search left it unconfirmed
            return found if conf is not None else self._confirm_smallest(found)
        self.on_event(f"greedy shrink: {'; '.join(res.steps)}", self.stats)
        return [small.case], small, conf2, j2

    def _greedy_shrink(self, run: CaseRun, conf: CaseRun, j: int, speculation: bool, *, budget_s: float, seed: int,
                       known_check: bool = False):
        """A confirmed failure shrunk further by the greedy shrinker (fuzz/shrink.py: smaller
        vocabulary, which a search's start shape fixes, shorter prompt, fewer knobs; its
        candidates only choose, they store nothing), every reduction re-run on fresh samples on
        the running engine (swapped, each swap's tables checked) and the result confirmed again
        on a freshly started engine (at the next α_j of the ledger).
        Returns (run, confirmation, j, shrink result): the shrunk ones, or the given ones when no
        reduction was kept or the reduced case did not confirm with the same attribution.
        ``known_check``: a kept speculation failure that is a stored finding (:meth:`_shrunk_known`)
        is not confirmed afresh: (None, None, None, shrink result)."""
        from specfuzz.fuzz.shrink import entry_reproducer, seen_tokens, shrink

        entry, eng = self._entry_for(run), self.engine
        if not speculation and not self.cfg.calibration_only:
            # A calibration bug met in a speculative campaign: its candidates run with
            # speculation off, on the speculation-off engine (swapped, not restarted).
            entry.kind = "calibration"
            if self._spec_off_engine is None:
                self._spec_off_engine = self._new_engine()
            eng = self._spec_off_engine
        # Kept reductions are decided on the running engine, swapped (as Hypothesis's are): only
        # the smallest is confirmed on a fresh engine, below.
        repro = entry_reproducer(entry, eng, work_dir=Path(self.cfg.work_dir),
                                 samples=self.cfg.max_samples, alpha=self.cfg.screen_alpha, seed=seed,
                                 dtype=self.cfg.dtype, settings=dict(self.cfg.engine_settings) or None,
                                 fresh_kept=False)
        t0, starts = time.monotonic(), eng.starts

        def start_ahead(case: Case) -> None:
            # the next start the shrink needs, in the background (it takes the engine's one
            # prestart: the next search's is made again after the shrink)
            cfg = self._case_config(case, speculation)
            if cfg is not None:
                eng.prestart(cfg)
        # (--no-prestart: none; the memory split then leaves no room for a prestarted engine)
        prepare = start_ahead if self._prestarts() and eng.can_prestart() else None

        def on_kept(case: Case, kept) -> bool:
            # A kept speculation failure that is a stored finding (the check the shrink's result
            # gets, below) ends the shrink at once, instead of after engine restarts for further
            # reductions. Otherwise the kept case's fresh confirmation engine starts in the
            # background: if nothing smaller is kept, the confirmation below takes it.
            if (known_check and speculation and getattr(kept, "judgement", None) is not None
                    and self._shrunk_known(kept, "a reduction the greedy shrinker kept")):
                return True
            if known_check and not speculation and self._shrunk_known_calibration(
                    kept, eng, "a reduction the greedy shrinker kept"):
                return True
            self._prestart_fresh(case, speculation)
            return False
        hot = eng.hot_starts
        res = shrink(run.case, repro, budget_s=budget_s, speculation=speculation, prepare=prepare,
                     start_key=lambda c: start_key(c, speculation=speculation), on_kept=on_kept,
                     seen=seen_tokens(run))
        if prepare is not None:
            # the next search's engines, prestarted again (the shrink's prestarts replaced them)
            if eng is self.engine:
                self._prestart_next()
            else:
                self._prestart_spec_off(search_over=True)
        # Its candidates run through the reproducer, not as families: one line in the campaign log.
        self._log_event({"event": "greedy shrink", "seconds": round(time.monotonic() - t0, 2), "starts": eng.starts - starts,
                         "prestarted": eng.hot_starts - hot, "kept": bool(res.kept), "steps": list(res.steps)[:20],
                         **({"stopped": "a stored finding met again"} if res.stopped else {})})
        if res.stopped:
            self._end_fresh_prestart("the shrink met a stored finding")
            return None, None, None, res
        if res.kept and res.last_run is not None and getattr(res.last_run, "judgement", None) is not None:
            if known_check and speculation and self._shrunk_known(res.last_run, "the greedy shrinker's smallest failure"):
                self._end_fresh_prestart("the shrink's smallest failure is a stored finding")
                return None, None, None, res
            if speculation:
                self._prestart_calibration(res.last_run.case)
            small, j2 = self._confirm(res.last_run, speculation)
            if small.failed and attributed_label(small) == attributed_label(run):
                return res.last_run, small, j2, res
        return run, conf, j, res

    def _confirm_smallest(self, found: tuple) -> tuple:
        """The smallest failure Hypothesis kept (unconfirmed), confirmed on a freshly started
        engine at the next α_j like any candidate; if it does not confirm, the smallest
        confirmed one of the search is kept."""
        self.watchdog.extend()
        fam, r, _, _ = found
        self._prestart_calibration(r.case)
        conf, j = self._confirm(r, self._found_speculation())
        if conf.failed:
            return fam, r, conf, j
        self.on_event("the smallest failure did not confirm on a fresh engine: the smallest confirmed one is kept", self.stats)
        return self._found_fallback

    def _shrunk_known(self, run: CaseRun, what: str) -> bool:
        """Whether a speculation failure, shrunk, is a stored speculation finding
        (:meth:`_known_finding`, on the running engine): checked before its fresh confirmation.
        A candidate whose reduction to a stored finding's features passed in the search can
        still shrink to that finding (e.g. a candidate with five sampling features whose
        reduction to the finding's none passed, while its shrink ends at exactly the finding's
        signature). One screening run on the running engine when it is not."""
        if not self._found_speculation():  # a speculation-off campaign, or a calibration bug
            return False
        if self._known_finding(run, self.search_index * 7919 + 43):
            self.stats.shrunk_known += 1
            self.on_event(f"{what} is a stored speculation finding met again: not confirmed afresh or stored", self.stats)
            return True
        return False

    def _shrunk_known_calibration(self, run, engine: IsolatedEngine, what: str) -> bool:
        """Whether a calibration bug being shrunk (Hypothesis's smallest failure, or a reduction
        the greedy shrinker kept: ``what``, for the log), failing with speculation off on
        ``engine`` (the speculation-off engine), has exactly the features of a stored calibration
        entry of this engine (corpus.calibration_key): that target-sampler bug met again, which
        :meth:`_store_entry` would recognise only after the rest of the shrink (up to the
        shrinking cap) and the smallest case's fresh confirmation. The entry is marked seen
        again (once per run, after a confirmation at the next α_j on ``engine``, as
        :meth:`_known_calibration` does) and the shrink ends there."""
        if getattr(run, "judgement", None) is None or not run.failed:
            return False
        key = calibration_key(str(self.engine.version().get("name")), run.case.to_json())
        path = self.calibration_entries.get(key)
        if path is None or not self._is_stored(path):
            return False
        if not self._confirmed_seen_again(key, path, run, False, engine):
            return False
        self.stats.calibration_known += 1
        self.on_event(f"{what} has the features of {path.name}: that calibration bug seen again, not confirmed "
                      "afresh or stored", self.stats)
        return True

    def _greedy_shrink_crash(self, family: list[Case], crash: EngineCrash, speculation: bool) -> tuple[list[Case], EngineCrash]:
        """A crashing family Hypothesis shrank (its request patterns mixed in each engine call,
        as it crashed; one pattern when one crashes alone), through the greedy shrinker for the
        rest of the shrinking cap (at least 20 s), every candidate on a fresh engine process. On
        a slow-starting engine Hypothesis's half of the cap holds only a few fresh starts; the
        greedy shrinker tries the largest reductions first (a pattern of the family, a vocabulary
        token, the prompt, max_tokens halved, each knob). Returns the smallest family that
        crashed the same way and its crash."""
        from specfuzz.fuzz.shrink import entry_reproducer, shrink_family

        spent = time.monotonic() - self._shrink_started if self._shrink_started else 0.0
        budget = max(20.0, self._shrink_cap_s() - spent)
        self.watchdog.extend(budget + 120.0)
        call_requests, split = self._last_call
        entry = crash_entry(self.engine, family[0], crash, self.cfg.engine, dtype=self.cfg.dtype,
                            settings=dict(self.cfg.engine_settings), family=family,
                            batch=call_requests or self.cfg.batch, call_prompt_tokens=split)
        repro = entry_reproducer(entry, self.engine, work_dir=Path(self.cfg.work_dir), samples=self.cfg.max_samples,
                                 alpha=self.cfg.screen_alpha, seed=self.search_index * 7919 + 29,
                                 dtype=self.cfg.dtype, settings=dict(self.cfg.engine_settings) or None)
        res = shrink_family(family, repro, budget_s=budget, speculation=speculation)
        got = res.last_run
        got = got.crash if isinstance(got, CaseRun) else got
        if not res.kept or not isinstance(got, EngineCrash):
            return family, crash
        self.on_event(f"greedy crash shrink: {'; '.join(res.steps)}", self.stats)
        return list(res.family), got

    def _crashing_pattern(self, family: list[Case], crash: EngineCrash, seed: int, speculation: bool):
        """The first pattern of a shrunk crashing family that crashes the same way alone
        (the first pattern of a family cannot shrink away, so the one that crashes may be
        another); None when only the mix crashes."""
        key = crash_key(crash)
        for case in family:
            try:
                runs = self._run([case], [self.cfg.screen_alpha], seed, speculation=speculation, fresh=True)
            except (AmbiguousSemantics, OutputSpaceTooLarge, InvalidInput):
                continue
            c = runs[0].crash
            if c is not None and crash_key(c) == key:
                return case, c
        return None
