"""The campaign: Hypothesis-driven search, statistical shrinking, corpus, resume.

The campaign is organised by engine start. Each *search* picks a start shape
(:class:`~specfuzz.strategies.StartShape`: vocabulary, EOS, speculation settings, the
draft's width), starts the engine once on it, and lets Hypothesis draw a stream of case
families of that shape (table models, prompts, request patterns): a running engine takes
each new table model by swapping its tables in place (``IsolatedEngine.start``: the
engine's own logits for every row of the new table are checked before any sample), and
engines that cannot swap start again. Shapes rotate over the speculation methods; every
method's engine-default configuration (the knobs a user leaves unset) is a named variant
drawn first and every ``DEFAULT_EVERY``-th search after. A search has a time slice long
enough to amortise its start (a few times the engine's start time).

:class:`Campaign` is the outline; each role lives in a module of its own:

* ``fuzz/campaign_search.py``: one search, a Hypothesis run over one start shape;
* ``fuzz/campaign_candidates.py``: a pattern that crossed its screening level, through the
  known-bug checks to a confirmation on a fresh engine at the next α_j of the shared ledger;
* ``fuzz/campaign_shrink.py``: shrinking a confirmed failure or a crash (Hypothesis, then
  the greedy shrinker of ``fuzz/shrink.py``) and confirming the smallest case;
* ``fuzz/campaign_store.py``: the corpus's known entries, storing what was found, the
  pending record that survives a killed campaign;
* ``fuzz/campaign_engines.py``: the search, speculation-off and fresh engines, running a
  family on them, spare processes, prestarts, filling start waits;
* ``fuzz/campaign_state.py``: the campaign state, totals, logs and the budget's watchdog;
* ``fuzz/campaign_config.py``, ``fuzz/families.py``: the configuration and counters; keys of
  families and crashes.

Failures whose signature is already in the corpus update it (once per run, after a
confirmation) and do not stop the search. The Hypothesis database, the α ledger and the
campaign state live under ``<corpus>/.specfuzz/``, with an append-only campaign log
(``events.jsonl``), so a killed campaign resumes where it was, on this machine or another.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Callable

from hypothesis.database import DirectoryBasedExampleDatabase

from specfuzz.case import Case
from specfuzz.engines.base import EngineConfig
from specfuzz.engines.isolation import IsolatedEngine
from specfuzz.errors import InvalidInput
from specfuzz.fuzz.campaign_candidates import (
    CONFIRM_MARGIN, CONFIRM_MAX_FACTOR, MAX_CALIBRATION_REDUCTIONS, CandidatesMixin, attributed_label,
    confirmation_samples,
)
from specfuzz.fuzz.campaign_config import CampaignConfig, CampaignStats
from specfuzz.fuzz.campaign_engines import FILL_DRAWS, FILL_MIN_LEFT_S, SPARE_MIN_CPUS, EnginePoolMixin
from specfuzz.fuzz.campaign_search import (
    EXAMPLES_PER_SEARCH, KNOWN_CRASHES_END_SEARCH, REFUSED_SWAPS_END_SEARCH, PatternFailed, Search, SearchSliceOver,
)
from specfuzz.fuzz.campaign_shrink import SHRINK_MIN_S, SHRINK_SHARE, ShrinkMixin
from specfuzz.fuzz.campaign_state import (
    ENGINE_COUNTERS, MAX_DEFERRED, STATE_SCHEMA_VERSION, WATCHDOG_GRACE_S, BudgetExhausted, DamagedState, StateMixin,
    Watchdog, load_deferred, load_state, merge_worker_totals, open_totals, set_aside, state_problem,
)
from specfuzz.fuzz.campaign_store import StoreMixin
from specfuzz.fuzz.corpus import Corpus
from specfuzz.fuzz.coverage import Coverage, reachable
from specfuzz.fuzz.exampledb import FailuresOnly
from specfuzz.fuzz.run import CaseRun
from specfuzz.fuzz.families import (
    _crash_key_of, crash_key, draw_example, entry_crash_key, family_fields, family_key, family_variants, simplest_family,
    simplest_key,
)
from specfuzz.fuzz.ledger import AlphaLedger
from specfuzz.strategies import StartShape, case_families, start_shapes

# Shortest time slice of one search (see Campaign._slice_s).
SEARCH_SLICE_MIN_S = 10.0
# A search runs at least this many times the engine's (typical) start time, so that an
# engine start is amortised over many swapped table models.
SLICE_START_FACTOR = 8.0
# Start time assumed before the first start was measured (seconds).
FIRST_START_GUESS_S = 30.0
# After each method's first search (at its engine defaults), every DEFAULT_EVERY-th search
# runs a method at the engine's defaults.
DEFAULT_EVERY = 4
# Every STEER_EXPLORE_EVERY-th search of each method (its 3rd, 6th, ...) runs unsteered:
# steering favours K >= 2, and bugs that live at K = 1 or in shapes no thin event asks for
# keep a share of the searches.
STEER_EXPLORE_EVERY = 3
# At the end of a campaign, the longest wait for the events of families still being computed:
# COVERAGE_DRAIN_SHARE of the budget, at most COVERAGE_DRAIN_S (the rest count as uncomputed).
COVERAGE_DRAIN_S = 30.0
COVERAGE_DRAIN_SHARE = 0.05


class Campaign(StateMixin, EnginePoolMixin, CandidatesMixin, ShrinkMixin, StoreMixin):
    """A campaign on one engine (see the module docstring); :meth:`run` runs it to its budget."""

    def __init__(self, config: CampaignConfig, on_event: Callable[[str, CampaignStats], None] | None = None) -> None:
        self.cfg = config
        mf = config.max_findings
        if mf is not None and (isinstance(mf, bool) or not isinstance(mf, int) or mf < 1):
            raise InvalidInput("max_findings", mf, "a positive integer (None: run to the budget)")
        self.corpus = Corpus(config.corpus_dir)
        self.state_dir = Path(config.corpus_dir) / ".specfuzz"
        self.state_path = self.state_dir / (f"state-w{config.worker}.json" if config.worker else "state.json")
        self.stats = CampaignStats()
        self.on_event = on_event or (lambda msg, stats: None)
        self.engine = IsolatedEngine(config.engine, config.engine_kwargs, log_dir=Path(config.work_dir) / "logs",
                                     swap=config.swap)
        self._spec_off_engine: IsolatedEngine | None = None
        self._fresh_engine: IsolatedEngine | None = None
        self.deadline = time.monotonic() + config.budget_s
        self.watchdog = Watchdog(self._left)
        state = self._load_state()
        # The per-family spender of a schema-1 state, kept as written (the ledger counts
        # what it spent; see fuzz/ledger.py).
        self.legacy_spender = state.get("legacy_spender") if state else None
        # The history of Ray runs on this corpus (fuzz/ray_hub.py writes it; the summary's
        # one-actor baseline comes from it): kept as read when a campaign without Ray saves.
        self.ray_history = state.get("ray") if state and isinstance(state.get("ray"), dict) else None
        self.ledger = AlphaLedger(self.state_dir, config.alpha, reset=config.reset_state, notes=self.state_notes)
        self.stats.budget = self.ledger.read()
        # Known signatures confirmed again in this run: marked seen once per run, so that
        # an engine that keeps showing a known bug does not spend α on it family by family.
        self.seen_again: set[str] = set()
        self.search_index = state.get("searches", 0) if state else 0
        # Totals over every run of this campaign state (campaign_state.open_totals).
        self.totals = open_totals(state)
        # Speculation events exercised (fuzz/coverage.py): per method, each event's largest
        # probability in any pattern and its expected occurrences over the samples drawn.
        self.coverage = Coverage(self.totals.setdefault("coverage", {}))
        self._steer = None  # the current search's Steer
        # Methods whose last search ended by a stored crash (its start shape kills the engine):
        # their next search retreats to the method's simplest shape, unsteered, since steering
        # knows nothing of crashes and would draw the multi-position shapes that crashed again.
        self._retreat: set[str] = set()
        self._base = {k: self.totals["engine"][k] for k in ENGINE_COUNTERS}  # from earlier runs
        self.events_path = self.state_dir / "events.jsonl"
        self._engines: list[IsolatedEngine] = [self.engine]
        self._acct = {"start": 0.0, "swap": 0.0, "sample": 0.0}  # engine seconds already added to totals
        self._shrinking = False  # a failure or crash is being shrunk, confirmed or stored
        self._shrink_started = 0.0  # when the current search's failure began shrinking (monotonic; 0: not)
        # The current search's failure fails with speculation off too (a bug of the target's
        # sampler): it is confirmed and shrunk with speculation off (_search, _found_speculation).
        self._spec_off_found = False
        # Candidates of this run confirmed on a fresh engine, by kind: [speculation failures,
        # calibration bugs] (_calibration_likely: which fresh confirmation to start ahead).
        self._confirmed_kinds = [0, 0]
        self._last_call: tuple[int, int | None] = (0, None)  # the last run's largest call and split (_run)
        # Filling start waits (_fill_wait): the running search's strategy and seed, whether a
        # filling family runs now, the seconds the filling families took (wall, and of it the
        # running engine's swaps and sampling: _account counts them as such even while a
        # failure shrinks), and failing filling families kept for after the search's own
        # failure (in the state: a campaign killed meanwhile screens them when it resumes).
        self._fill_strategy = None
        self._fill_seed = 0
        self._fill_count = 0
        self._filling = False
        self._fill = {"wall": 0.0, "swap": 0.0, "sample": 0.0}
        self._acct_fill = dict(self._fill)
        self._deferred: list[list[Case]] = load_deferred(state)
        self._prestart_due = False  # the next search's engine is to be prestarted (_prestart_next)
        # The speculation-off engine's prestarts (_prestart_spec_off): the next search's config
        # (its search index and config) and the search the prestarted one is for.
        self._spec_off_next: tuple[int, EngineConfig] | None = None
        self._spec_off_hot_search: int | None = None
        self.shape: StartShape | None = None
        # Keys of the simplest families (one per method order) already run: Hypothesis
        # starts every search with its simplest example, and a slow engine's search sees
        # only one or two examples, so without this most engine starts would re-run it.
        self.simplest_run: set[str] = set(state.get("simplest_run") or []) if state else set()
        self._t_saved = time.monotonic()
        self._read_known_entries()

    def run(self) -> CampaignStats:
        """The campaign: pending records of an earlier run stored, then one search after
        another until the budget is spent (or ``max_findings`` new entries are stored), each
        search's failure shrunk, confirmed and stored, then the families that failed while its
        engines started examined. However it ends, the engines close and the state is saved."""
        self.watchdog.arm()
        try:
            self._store_pending()
            while self._left() > 0:
                shape_key = self._next_search()
                strategy = self._strategy(self.shape)
                found = self._search(strategy, self.cfg.seed * 100_000 + self.search_index, shape_key)
                self._handle_found(found)
                self._examine_deferred(strategy)
                if self._enough_findings():
                    break
                self._prestart_spec_off(search_over=True)
        except BudgetExhausted:
            pass
        finally:
            self.watchdog.disarm()
            for e in self._engines:
                e.close()
            self._drain_events()
            self.coverage.drain(wait=True, timeout_s=min(COVERAGE_DRAIN_S, COVERAGE_DRAIN_SHARE * self.cfg.budget_s))
            self._save_state()
        return self.stats

    def _left(self) -> float:
        return self.deadline - time.monotonic()

    def _next_search(self) -> str:
        """Begin the next search: counted, its start shape drawn (its engine's next start is
        prestarted once it runs: :meth:`_prestart_next`); returns the shape's database key."""
        self.search_index += 1
        self.stats.searches += 1
        self._save_state()
        self.shape = self._shape(self.search_index)
        self._prestart_due = True
        return self._count_search()

    def _count_search(self) -> str:
        """The search of ``self.shape`` counted in the totals and announced; returns the key of
        its examples in the Hypothesis database."""
        shape_key = hashlib.sha256(repr(self.shape).encode()).hexdigest()[:16]
        eng = self.totals["engine"]
        eng["searches"] += 1
        eng["shapes"][self.shape.variant] = eng["shapes"].get(self.shape.variant, 0) + 1
        self.on_event(f"search {self.search_index}: {self.shape.describe()}", self.stats)
        return shape_key

    def _search(self, strategy, search_seed: int, shape_key: str = "",
                explicit: list[list[Case]] | None = None) -> tuple[list[Case], CaseRun, CaseRun, int] | None:
        """One search (:class:`~specfuzz.fuzz.campaign_search.Search`): the smallest failure it
        found (family, run, confirmation, confirmation index), None if none."""
        return Search(self, strategy, search_seed, shape_key, explicit).run()

    def _handle_found(self, found: tuple | None) -> None:
        """What a search found: shrunk (greedy shrinker), confirmed and stored; then the
        search's shrinking state ends."""
        if found is not None:
            # shrinking, calibrating and storing may overrun the budget a little
            self.watchdog.extend(self._shrink_cap_s() + 120)
            found = self._greedy_shrink_found(found, self._found_speculation())
            if found is not None:
                _, run, conf, j = found
                self._store_failure(run, conf, j)
            self.watchdog.reset()
        self._pending_path().unlink(missing_ok=True)
        self._save_state()
        self._shrinking = False

    def _examine_deferred(self, strategy) -> None:
        """The filling families that failed their screening (:meth:`_fill_wait`), each run as a
        search of its own explicit example on this search's shape: a candidate like any (known
        bugs recognised, screened again, confirmed on a fresh engine, shrunk and stored). A
        family's failure may have been the search's own bug met again: then it is seen again
        or passes. Those left when the budget ends stay in the state for the next run."""
        while self._deferred and self._left() > 0:
            fam = self._deferred.pop(0)
            self._save_state()
            self.on_event(f"examining a family that failed while an engine started ({len(self._deferred)} more)", self.stats)
            found = self._search(strategy, self.cfg.seed * 100_000 + self.search_index * 101 + len(self._deferred),
                                 explicit=[fam])
            self._handle_found(found)

    def _enough_findings(self) -> bool:
        """Whether this process stored ``max_findings`` new corpus entries (said if so)."""
        if self.cfg.max_findings and len(self.stats.stored) >= self.cfg.max_findings:
            self.on_event(f"stopping: {len(self.stats.stored)} new corpus entries stored "
                          f"(--max-findings {self.cfg.max_findings})", self.stats)
            return True
        return False

    # -- the plan of searches: which start shape, for how long ------------------------

    def _methods(self) -> tuple[str, ...]:
        caps = self.engine.capabilities()
        if self.cfg.calibration_only:
            return ()
        methods = tuple(m for m in caps.methods if self.cfg.methods is None or m in self.cfg.methods)
        if not methods:
            raise InvalidInput("method", self.cfg.methods, f"methods this engine supports: {caps.methods} (or 'none')")
        floors = dict(getattr(caps, "min_vocab", {}) or {})
        fit = tuple(m for m in methods if floors.get(m, 2) <= self.cfg.max_vocab)
        if not fit:
            need = min(floors.get(m, 2) for m in methods)
            raise InvalidInput("max_vocab", self.cfg.max_vocab,
                               f">= {need} for methods {methods} on this engine (its smallest vocabulary per method: {floors})")
        return fit

    def _shape(self, index: int) -> StartShape:
        """The start shape of the ``index``-th search (1-based): the method turns with the
        index (worker ``w`` of ``N`` in a ``--workers`` campaign starts at method w*n/N of n); each method's first search and every DEFAULT_EVERY-th search after run it at
        the engine's defaults (where the engine states them); V, EOS, K and the knobs are
        drawn, steered toward thinly covered speculation events, except every
        STEER_EXPLORE_EVERY-th search of a method, which draws uniformly (the search
        after one ended by a stored crash draws the method's simplest shape, unsteered)."""
        caps = self.engine.capabilities()
        self._profile = caps.profile
        self._warm_spares()
        methods = self._methods()
        n = max(1, len(methods))
        i = index - 1
        seed = self.cfg.seed * 100_000 + index
        common = dict(max_vocab=self.cfg.max_vocab, max_k=self.cfg.max_k,
                      min_vocab=dict(getattr(caps, "min_vocab", {}) or {}))
        if not methods:
            return draw_example(start_shapes(speculation=False, **common), seed, simplest=i == 0)
        # Workers turn the methods from starting points spread evenly over them (worker w of N
        # at method w*n/N), so that parallel workers start, and search at its defaults, different
        # methods rather than all the same one, and a short campaign reaches all of them.
        offset = (self.cfg.worker * n) // max(1, self.cfg.workers, self.cfg.worker + 1)
        method = methods[(i + offset) % n]
        defaults = dict(getattr(caps, "spec_defaults", {}) or {})
        default = method in defaults and (i < n or (i // n) % DEFAULT_EVERY == 0)
        # Steered toward the method's thinly covered events (fuzz/coverage.py), unless --no-steer.
        self.coverage.drain()
        reach = self.reach(method)
        self.coverage.set_reach(method, reach)
        retreat = method in self._retreat
        self._retreat.discard(method)
        explore = (i // n) % STEER_EXPLORE_EVERY == STEER_EXPLORE_EVERY - 1
        self._steer = (self.coverage.steer(method, reach, self.cfg.max_k)
                       if self.cfg.steer and not retreat and not explore else None)
        strategy = start_shapes(
            methods=(method,), draft_vocab=caps.draft_vocab, spec_knobs=dict(getattr(caps, "spec_knobs", {}) or {}),
            spec_defaults=defaults, engine_default=default, inject=self.cfg.engine_kwargs.get("inject"),
            steer=self._steer, **common,
        )
        return draw_example(strategy, seed, simplest=(i < n and self._steer is None) or retreat)

    def reach(self, method: str) -> dict[str, str | None]:
        """The speculation events ``method`` can reach on this engine (fuzz/coverage.py)."""
        caps = self.engine.capabilities()
        default_k = (dict(getattr(caps, "spec_defaults", {}) or {}).get(method) or {}).get("num_speculative_tokens")
        return reachable(method, caps, self.cfg.max_k, default_k)

    def _strategy(self, shape: StartShape):
        """Case families of one start shape (every family served by one engine start)."""
        caps = self.engine.capabilities()
        self._profile = caps.profile
        speculation = shape.spec is not None
        return case_families(
            max_patterns=self.cfg.max_patterns, shape=shape, max_tokens=self.cfg.max_tokens,
            sampling=caps.honoured(speculation),
            min_tokens_speculating=1 if getattr(caps, "speculates_first_token", True) else 2,
            exclusive=tuple(getattr(caps, "sampling_exclusive", ()) or ()),
            steer=self._steer if speculation else None,
        )

    def _example_database(self):
        """The Hypothesis example database of every search: the failing examples (not the
        targeting phase's Pareto front) under ``.specfuzz/hypothesis``; a Ray campaign's
        engine actors share one through the driver (fuzz/exampledb.py)."""
        return FailuresOnly(DirectoryBasedExampleDatabase(str(self.state_dir / "hypothesis")))

    def _slice_s(self) -> float:
        """A search's time slice: SLICE_START_FACTOR x the engine's mean start time (at least
        SEARCH_SLICE_MIN_S), at most budget x workers / (2 x methods) when that is longer than
        the minimum: the campaign searches every method about twice. Its W workers start at
        methods spread over the n (:meth:`_shape`), so each needs only 2n/W searches of its own
        for that, and its slices are W times longer than one worker's would be, which keeps an
        engine start a small part of a search's wall. The search's engine starts do not count
        against it (:meth:`_search`)."""
        e = self.engine
        start_s = e.seconds["start"] / e.starts if e.starts else FIRST_START_GUESS_S
        workers = max(1, self.cfg.workers)
        cap = max(SEARCH_SLICE_MIN_S, self.cfg.budget_s * workers / (2 * max(1, len(self._methods()))))
        return min(cap, max(SEARCH_SLICE_MIN_S, SLICE_START_FACTOR * start_s))


# The names this module had before its roles moved to the modules above: importable from here.
__all__ = [
    "Campaign", "CampaignConfig", "CampaignStats", "Search", "Watchdog",
    "BudgetExhausted", "PatternFailed", "SearchSliceOver", "DamagedState",
    "attributed_label", "confirmation_samples", "crash_key", "draw_example", "entry_crash_key", "_crash_key_of",
    "family_fields", "family_key", "family_variants", "simplest_family", "simplest_key",
    "load_deferred", "load_state", "merge_worker_totals", "open_totals", "set_aside", "state_problem",
    "COVERAGE_DRAIN_S", "COVERAGE_DRAIN_SHARE", "CONFIRM_MARGIN", "CONFIRM_MAX_FACTOR", "DEFAULT_EVERY", "STEER_EXPLORE_EVERY", "ENGINE_COUNTERS", "EXAMPLES_PER_SEARCH", "FILL_DRAWS",
    "FILL_MIN_LEFT_S", "FIRST_START_GUESS_S", "KNOWN_CRASHES_END_SEARCH", "MAX_CALIBRATION_REDUCTIONS", "MAX_DEFERRED",
    "REFUSED_SWAPS_END_SEARCH", "SEARCH_SLICE_MIN_S", "SHRINK_MIN_S", "SHRINK_SHARE", "SLICE_START_FACTOR",
    "SPARE_MIN_CPUS", "STATE_SCHEMA_VERSION", "WATCHDOG_GRACE_S",
]
