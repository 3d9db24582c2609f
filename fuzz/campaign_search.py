"""The search over one start shape: one Hypothesis run on the campaign's running engine.

A search (:class:`Search`) runs the case families Hypothesis draws for one start shape
(``strategies.case_families``), each on the search engine with its tables swapped in, in
mixed batches until every pattern's anytime-valid test decides; ``hypothesis.target`` steers
generation toward larger evidence. A pattern that crosses the screening level is a candidate
for the campaign's candidate pipeline (``fuzz/campaign_candidates.py``); a confirmed failure
raises :class:`PatternFailed` inside the example, and Hypothesis shrinks it (only the same
bug counts while it shrinks). A crash is shrunk the same way, every candidate on a fresh
engine process.

A search ends when its time slice is over (:meth:`~specfuzz.fuzz.campaign.Campaign._slice_s`;
the engine's opening start does not count against it), when its start shape keeps crashing
the engine with a stored crash or keeps refusing swaps, when Hypothesis's shrink had its half
of the shrinking cap, or when the budget is spent.
"""

from __future__ import annotations

import math
import time
import traceback

from hypothesis import HealthCheck, Phase, example, given, reject, seed as hyp_seed, settings, target
from hypothesis.errors import Flaky, HypothesisException

from specfuzz.case import Case
from specfuzz.engines.isolation import EngineCrash
from specfuzz.errors import AmbiguousSemantics, InvalidInput
from specfuzz.fuzz.campaign_candidates import attributed_label
from specfuzz.fuzz.campaign_state import BudgetExhausted
from specfuzz.fuzz.families import crash_key, family_key, simplest_key
from specfuzz.fuzz.run import CaseRun
from specfuzz.oracle.law import OutputSpaceTooLarge

# budget is spent. Bounded so that Hypothesis's own phases (targeting) end too.
EXAMPLES_PER_SEARCH = 300

# A search whose families meet one stored crash this many times in a row ends there (its start
# shape crashes the engine whatever the requests; each crash cost an engine start).
KNOWN_CRASHES_END_SEARCH = 2
# A search whose swaps the engine refuses this many times in a row ends there: every further
# family of its start shape would restart the engine (SGLang 0.5.17 refuses swaps of a reduced
# EAGLE-3 draft vocabulary), where the next search's engine is already prestarted.
REFUSED_SWAPS_END_SEARCH = 2


class SearchSliceOver(BaseException):
    """A search's time slice is over (the campaign goes on with the next search)."""


class PatternFailed(Exception):
    """A confirmed failure: Hypothesis shrinks the example that raised it."""


class Search:
    """One Hypothesis run over one start shape of ``campaign`` (:meth:`run` returns what it
    found). ``shape_key`` keys the shape's examples in the Hypothesis database.
    ``explicit``: run only these families (Hypothesis's explicit phase: a failing one is
    handled as any candidate, then shrunk by the greedy shrinker alone), as
    ``Campaign._examine_deferred`` does."""

    def __init__(self, campaign, strategy, search_seed: int, shape_key: str = "",
                 explicit: list[list[Case]] | None = None) -> None:
        c = self.c = campaign
        self.strategy, self.search_seed, self.shape_key, self.explicit = strategy, search_seed, shape_key, explicit
        self.confirmed: list[tuple[list[Case], CaseRun, CaseRun, int]] = []
        # A confirmed failure is being shrunk (only the same bug counts), and its label.
        self.failing = False
        self.failure_label: str | None = None
        # A crash is shrunk too: Hypothesis keeps the smallest family that crashes the
        # same way (kind and message with numbers stripped), each candidate on a fresh
        # engine process. The key of the crash being shrunk, and the families that crashed so.
        self.crash_first: str | None = None
        self.crash_best: list[tuple[list[Case], EngineCrash]] = []
        self.known_in_row: list[str] = []  # the stored crashes the search's last families met, in a row
        self.refused_in_row = 0  # the search's last families whose swap the engine refused, in a row
        self.refused_any = False  # whether the engine refused a swap of this search's start shape
        self.left_to_greedy = 0  # Hypothesis shrink candidates not run: each would have restarted the engine
        self.internal_errors: list[str] = []
        self.speculation = not c.cfg.calibration_only
        self._seed = search_seed * 1_000_003
        # A search gets a time slice, so that the campaign reaches every method and many
        # shapes; shrinking a failure runs past the slice, for half of its cap (see SHRINK_SHARE).
        # The slice counts the search's sampling, not its engine's starts: a GPU engine's start
        # can take longer than a short campaign's slice, which would leave one family per
        # search. Only the search's opening start is left out (the one its first family ran on,
        # amortised over the search's families): restarts after it count, since every family
        # of a shape whose swaps the engine refuses restarts it.
        self.slice_end = time.monotonic() + c._slice_s()
        self.eng = c.engine
        self.starts_before = self.eng.seconds["start"]
        self.opening: float | None = None  # the start seconds up to the search's first family run
        self.simplest = None if explicit else simplest_key(strategy)
        c._shrink_started = 0.0
        c._spec_off_found = False
        # While this search's candidates wait for engine starts, its engine samples more of it.
        c._fill_strategy, c._fill_seed = strategy, search_seed * 1_000_003 + 500_009

    def next_seed(self) -> int:
        self._seed += 100_003
        return self._seed

    def slice_over(self) -> bool:
        left_out = self.opening if self.opening is not None else self.eng.seconds["start"] - self.starts_before
        return time.monotonic() - left_out > self.slice_end

    def shrinking(self) -> None:
        c = self.c
        if not c._shrink_started:
            c._save_state()  # the time so far was searching
            c._shrink_started = time.monotonic()
            c._shrinking = True

    def run(self) -> tuple[list[Case], CaseRun, CaseRun, int] | None:
        """The smallest failure found (family, run, confirmation, confirmation index), None if
        none. Hypothesis's smallest failure comes back unconfirmed (confirmation None): the
        greedy shrinker goes on from it, and only the smallest case that one keeps is confirmed
        on a fresh engine (``Campaign._greedy_shrink_found``); the smallest confirmed one is
        the fallback (``Campaign._found_fallback``) where neither confirms."""
        c = self.c
        run_example, internal_errors = self.run_example, self.internal_errors

        def search(cases: list[Case]) -> None:
            try:
                run_example(cases)
            except (PatternFailed, BudgetExhausted, SearchSliceOver, HypothesisException):
                raise
            except Exception:
                # An error of specfuzz's own search code, not a finding: Hypothesis takes it for a
                # second bug, and while shrinking it may report the first one instead and end the
                # shrink without a word. Logged, then raised.
                internal_errors.append(traceback.format_exc(limit=8))
                raise

        # Each shape keys its own examples in the database (a stored failure is replayed on
        # the shape it was found on). The key is a digest of the source of ``search`` above:
        # changing it orphans the examples stored by earlier campaigns.
        search._hypothesis_internal_add_digest = self.shape_key.encode()  # type: ignore[attr-defined]
        searching = given(self.strategy)(search)
        for fam in self.explicit or ():
            searching = example(fam)(searching)
        # The settings go on last: @seed under them would switch the database off.
        search = settings(
            database=c._example_database(),
            max_examples=EXAMPLES_PER_SEARCH, deadline=None, derandomize=False, print_blob=False,
            suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
            phases=(Phase.explicit,) if self.explicit else (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink),
        )(hyp_seed(self.search_seed)(searching))

        try:
            search()
        except PatternFailed:
            pass
        except (Flaky, HypothesisException):
            pass  # the replay of the minimal example did not fail again; we keep our own record
        except (BudgetExhausted, SearchSliceOver):
            pass
        if internal_errors:
            c._log_event({"event": "search code raised", "errors": len(internal_errors), "traceback": internal_errors[-1]})
            c.on_event(f"the search's own code raised {len(internal_errors)} times (not a finding; events.jsonl has the "
                       f"traceback): {internal_errors[-1].strip().splitlines()[-1]}", c.stats)
        if self.left_to_greedy:
            c.on_event(f"Hypothesis's shrink left {self.left_to_greedy} candidates that needed an engine restart "
                       "to the greedy shrinker", c.stats)
        if self.crash_best:
            self.store_crash()
        # The smallest failure Hypothesis kept is returned unconfirmed (its confirmation None):
        # the greedy shrinker goes on from it, and only the smallest case that one keeps is
        # confirmed on a fresh engine (_greedy_shrink_found): one fresh start per shrunk failure
        # instead of two. The smallest confirmed one is the fallback where neither confirms.
        c._found_fallback = next((f for f in reversed(self.confirmed) if f[2] is not None), None)
        return self.confirmed[-1] if self.confirmed else None

    def store_crash(self) -> None:
        """The smallest crashing family Hypothesis kept: its one pattern that crashes alone,
        if any, shrunk further by the greedy shrinker, stored."""
        c, speculation = self.c, self.speculation
        c.watchdog.extend()  # storing a found crash may overrun the budget a little
        fam, crash = self.crash_best[-1]
        one = c._crashing_pattern(fam, crash, self.next_seed(), speculation) if len(fam) > 1 else (fam[0], crash)
        if one is not None:
            fam, crash = [one[0]], one[1]
        if speculation:
            # The pattern that crashes alone, else the whole family (only the mix crashes),
            # mixed in each call as it crashed.
            fam, crash = c._greedy_shrink_crash(fam, crash, speculation)
        c._record_crash(fam[0], crash, fam, shrunk=True)

    # -- one example ------------------------------------------------------------------

    def run_example(self, cases: list[Case]) -> None:
        """One family Hypothesis drew: run, its crash or candidates handled."""
        self.check_going_on(cases)
        runs = self.run_family(cases)
        crash = next((r.crash for r in runs if r.crash is not None), None)
        if crash is not None:
            self.on_crash(cases, crash)
        else:
            self.known_in_row.clear()
        if self.crash_first is not None:
            return  # shrinking a crash: only the same crash counts
        self.screen(runs)

    def check_going_on(self, cases: list[Case]) -> None:
        """Raise to end the search (budget, slice, refused swaps, the shrink's half of its cap)
        or reject ``cases`` (a shrink candidate that needs a restart; the simplest family run
        already)."""
        c = self.c
        searching = not self.failing and self.crash_first is None
        if c._left() <= 0:
            raise BudgetExhausted
        if searching and self.slice_over():
            raise SearchSliceOver
        if searching and self.refused_in_row >= REFUSED_SWAPS_END_SEARCH:
            # Checked before the next family, so the last one's candidates were handled.
            c._log_event({"event": "search ended by refused swaps", "refused": self.refused_in_row})
            c.on_event(f"search ended: the engine refused {self.refused_in_row} swaps of its start shape in a row "
                       "(each family restarted it)", c.stats)
            raise SearchSliceOver
        if c._shrink_started and time.monotonic() - c._shrink_started > c._shrink_cap_s() / 2:
            # Hypothesis's shrink phase had its half of the cap (the greedy shrinker of a
            # failure gets the rest): every further call ends at once.
            raise SearchSliceOver
        if self.failing and self.refused_any and c._needs_restart(self.eng, cases, self.speculation):
            # Shrinking on a start shape whose swaps the engine refuses: each Hypothesis
            # candidate with other tables would restart the engine, one after the other.
            # Only candidates the running engine serves as it is run; the greedy shrinker
            # then reduces the tables, its starts prestarted while it tries the last one.
            if not self.left_to_greedy:
                c._log_event({"event": "shrink candidates needing a restart left to the greedy shrinker"})
            self.left_to_greedy += 1
            reject()
        if self.simplest is not None and family_key(cases) == self.simplest:
            # Every search opens with its simplest example: run it once per campaign.
            if self.simplest in c.simplest_run:
                reject()
            c.simplest_run.add(self.simplest)

    def run_family(self, cases: list[Case]) -> list[CaseRun]:
        """``cases`` run at the screening level (on a fresh engine process while a crash
        shrinks), counted; a case the oracle or the engine refuses is rejected."""
        c, eng, speculation = self.c, self.eng, self.speculation
        alphas = [c.cfg.screen_alpha] * len(cases)
        try:
            # While a crash shrinks, every candidate runs on a fresh engine process.
            refused_before, swaps_before = eng.swaps_refused, eng.swaps
            runs = c._run(cases, alphas, self.next_seed(), speculation=speculation, fresh=self.crash_first is not None)
            if self.opening is None:
                self.opening = eng.seconds["start"] - self.starts_before
            if eng.swaps_refused > refused_before:
                self.refused_in_row += 1
                self.refused_any = True
            elif eng.swaps > swaps_before:
                self.refused_in_row = 0
        except (AmbiguousSemantics, OutputSpaceTooLarge):
            c.stats.rejected += 1
            reject()
        except InvalidInput as exc:
            # The engine refused a configuration its capabilities did not rule out:
            # not a finding; note it and draw another case.
            c.stats.refused += 1
            c._log_refusal(cases, exc, speculation)
            c.on_event(f"engine refused a case: {exc}", c.stats)
            reject()
        c.stats.cases += 1
        c.stats.patterns += len(cases)
        c._count(cases, runs, speculation)
        c._save_state()
        return runs

    def on_crash(self, cases: list[Case], crash: EngineCrash) -> None:
        """A family that crashed the engine: a new crash starts shrinking (raises), the crash
        being shrunk keeps the family (raises), any other is stored as found."""
        c = self.c
        if crash.kind == "resource":
            c._record_crash(cases[0], crash, list(cases))  # not stored: the machine's share, not the engine
            reject()
        key = crash_key(crash)
        same = self.crash_first is not None and key == self.crash_first
        searching = not self.failing and self.crash_first is None
        if not same and (not searching or c._crash_known(cases[0], crash, cases)):
            # found while shrinking something else, or a known crash: stored as found
            c._record_crash(cases[0], crash, list(cases))
            if searching:
                self.known_in_row.append(key)
                if len(self.known_in_row) >= KNOWN_CRASHES_END_SEARCH and len(set(self.known_in_row)) == 1:
                    # The search's start shape kills the engine whatever the requests (its
                    # families meet one stored crash in a row, each after an engine start):
                    # on to the next search (e.g. SGLang 0.5.17's tree drafting with fewer draft
                    # tokens than steps + 1, crash-a2f0, crashes every family of its shape).
                    if c.shape is not None and c.shape.spec is not None:
                        c._retreat.add(c.shape.spec.method)
                    c._log_event({"event": "search ended by a stored crash", "crashes": len(self.known_in_row),
                                  "crash": key, "entry": str(c.crash_entries.get(key, ""))})
                    c.on_event(f"search ended: its families crashed the engine {len(self.known_in_row)} times in a row "
                               "with a stored crash", c.stats)
                    raise SearchSliceOver
            return
        if self.crash_first is None:
            self.crash_first = key
            # Kept on disk until it is shrunk and stored, as a confirmed failure is.
            c._write_pending_crash(cases[0], crash, list(cases))
            self.shrinking()
            c.on_event(f"crash ({crash.kind}); shrinking", c.stats)
        self.crash_best.append((list(cases), crash))
        # One raise site: Hypothesis tells failures apart by where they are raised.
        raise PatternFailed("crash")

    def screen(self, runs: list[CaseRun]) -> None:
        """The family's screening verdicts: evidence targeted, failing patterns through the
        candidate pipeline (while a failure shrinks: only the same bug counts, on the
        screening test); a confirmed failure raises."""
        c = self.c
        best = max((r.judgement.verdict.log_e for r in runs if r.judgement is not None), default=0.0)
        target(min(best, 50.0) if math.isfinite(best) else 50.0, label="log e-value")
        c.on_event("", c.stats)
        for r in runs:
            if not r.failed:
                continue
            c.stats.candidates += 1
            label = attributed_label(r)
            if self.failing:
                if label != self.failure_label and self.failure_label not in (None, "unknown"):
                    continue  # while shrinking, only the same bug counts (an unattributed one may become attributable)
                # While shrinking a confirmed failure, a smaller one of the same bug counts on
                # the screening test on the running engine; only the smallest is confirmed on
                # a fresh engine, when the search ends (below). A fresh start per candidate
                # would leave Hypothesis one or two candidates per shrink on a GPU engine.
                conf, j = None, 0
            else:
                got = c._candidate(r, self.speculation, self.next_seed)
                if got is None:
                    continue
                conf, j = got
                self.failing, self.failure_label = True, label
                self.shrinking()
                c.on_event(f"failure ({label}); shrinking", c.stats)
            self.confirmed.append(([r.case], r, conf, j))
            # One raise site: Hypothesis tells failures apart by where they are raised.
            raise PatternFailed(label)
