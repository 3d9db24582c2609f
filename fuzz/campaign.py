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

Each example is run on the engine in mixed batches until every pattern's anytime-valid
test decides; ``hypothesis.target`` steers generation toward larger evidence. Every test
screens at a fixed loose level (``screen_alpha``, not spent from α); a pattern that
crosses it is a candidate, run again with fresh samples (seeds of its own), on a freshly
started engine (no swap), at the level of the campaign's next confirmation (α_j, spent
from the α ledger that every worker and resumed run shares: ``fuzz/ledger.py``,
``oracle/budget.py``). Only a confirmed failure counts: then the example raises, and
Hypothesis shrinks it. Every shrink candidate is again run with fresh samples on the running
engine (its tables swapped in and checked) and must fail the screening test with the same
attribution label; the smallest one Hypothesis keeps is then confirmed on a fresh engine at
the next α_j, and if it does not confirm, the smallest confirmed failure is kept: neither
noise nor a swap can make a stored failure, and a shrink costs two fresh starts, not one per
candidate (25-60 s each on the H200, which left Hypothesis one or two candidates). The
greedy shrinker that follows confirms its result the same way. The smallest confirmed failure is calibrated (the same
engine with speculation off must agree with μ) and stored. Crashes shrink with every
candidate on a fresh engine process. Failures whose signature is already in the corpus
update it (once per run, after a confirmation) and do not stop the search. The
Hypothesis database, the α ledger and the campaign state (totals per method and per engine: starts, swaps, families, samples, and where the
wall time went) live under ``<corpus>/.specfuzz/``, with an append-only log of swap
events (``events.jsonl``), so a killed campaign resumes where it was, on this machine or
another.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import signal
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from hypothesis import HealthCheck, Phase, example, given, reject, seed as hyp_seed, settings, target
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import Flaky, HypothesisException

from specfuzz.case import Case
from specfuzz.engines.base import EngineConfig
from specfuzz.engines.isolation import EngineCrash, IsolatedEngine
from specfuzz.errors import AmbiguousSemantics, InvalidInput
from specfuzz.fuzz.coverage import Coverage, reachable
from specfuzz.fuzz.corpus import (
    Corpus, Entry, active_features, atomic_write_json, calibration_key, crash_cause, mark_seen_again, reduced_to_features,
)
from specfuzz.fuzz.ledger import AlphaLedger, confirmation_seed
from specfuzz.fuzz.exampledb import FailuresOnly
from specfuzz.fuzz.run import DEFAULT_BATCH, CaseRun, crash_entry, engine_config, finding_entry, run_family, start_key
from specfuzz.fuzz.triage import profile_for, symptom
from specfuzz.oracle.law import OutputSpaceTooLarge
from specfuzz.oracle.budget import SCREEN_ALPHA, AlphaSpender
from specfuzz.strategies import StartShape, case_families, start_shapes

# 2: the per-family α spender left the state for the shared ledger (fuzz/ledger.py);
# a schema-1 state is migrated, its spender kept as "legacy_spender".
STATE_SCHEMA_VERSION = 2
# Examples per Hypothesis search; the campaign runs searches with new seeds until its
# budget is spent. Bounded so that Hypothesis's own phases (targeting) end too.
EXAMPLES_PER_SEARCH = 300
# Shrinking one failure (Hypothesis's shrink phase, then the greedy shrinker of
# fuzz/shrink.py, which also narrows the vocabulary below the search's start shape) stops
# after max(SHRINK_MIN_S, SHRINK_SHARE x budget): what it kept so far is stored, and
# `specfuzz shrink` goes on from there. Without a cap, one failure (often a variant of a
# known engine bug met with other sampling settings) took the rest of the campaign.
SHRINK_MIN_S = 60.0
SHRINK_SHARE = 0.15
# Shortest time slice of one search (see Campaign._slice_s).
SEARCH_SLICE_MIN_S = 20.0
# A search runs at least this many times the engine's (typical) start time, so that an
# engine start is amortised over many swapped table models.
SLICE_START_FACTOR = 8.0
# Start time assumed before the first start was measured (seconds).
FIRST_START_GUESS_S = 30.0
# After each method's first search (at its engine defaults), every DEFAULT_EVERY-th search
# runs a method at the engine's defaults.
DEFAULT_EVERY = 4
# The budget is enforced inside examples; a SIGALRM this long after the deadline stops
# the campaign even inside Hypothesis's internals or a slow engine call.
WATCHDOG_GRACE_S = 10.0
# Reductions of a candidate tried against one stored calibration entry whose own features the
# oracle refuses (Campaign._reduced_calibration).
MAX_CALIBRATION_REDUCTIONS = 16
# A confirmation samples up to this many times --samples: as many as the candidate's own run
# suggests its level needs (confirmation_samples), since a fresh start costs far more than
# samples (SGLang on the H200: ~30 s against ~900 samples/s).
CONFIRM_MAX_FACTOR = 8
# Margin on that estimate (the evidence of a run of n samples grows about linearly in n).
CONFIRM_MARGIN = 1.5
# CampaignConfig.spare_engines=None turns spare engine processes on from this many CPUs.
SPARE_MIN_CPUS = 8
# IsolatedEngine counters added up over a campaign's engines into totals["engine"].
# Filling start waits (CampaignConfig.fill_waits): draws per wait until one family runs on the
# running search engine by a swap; the least budget left for one; the most failing families
# kept for after the search's own failure (a search meets few: the rest are screened again then).
FILL_DRAWS = 3
FILL_MIN_LEFT_S = 5.0
MAX_DEFERRED = 8
ENGINE_COUNTERS = ("starts", "warm_starts", "hot_starts", "prestarts", "swaps", "swap_fallbacks")


def family_key(cases: list[Case]) -> str:
    """A digest of a case family (tables, prompts, params, speculation)."""
    blob = json.dumps([c.to_json() for c in cases], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def family_variants(case: Case) -> tuple[str, ...]:
    """The speculation variant of a family, as counters: engine default, K, verification,
    draft sampling, draft width relative to the target, tree shape, long prompt."""
    spec = case.spec
    if spec is None:
        return ()
    out = ["engine default"] if spec.engine_default else []
    out += [f"K={spec.num_speculative_tokens}", f"verify={spec.verify}"]
    if len(case.prompt) > 8:
        out.append("long prompt")
    if case.draft_table is not None:
        V, Vd = case.vocab_size, int(case.draft_table.shape[1])
        out.append("draft=" + ("reduced" if Vd < V else "wider" if Vd > V else "full"))
        out.append(f"draft_sampling={spec.draft_sampling}")
    if spec.method.endswith("_tree"):
        out.append(f"tree={spec.tree_topk}x{spec.tree_budget}")
    return tuple(out)


def draw_example(strategy, seed: int, simplest: bool = False):
    """One value of ``strategy`` for ``seed``: Hypothesis's first (simplest) example when
    ``simplest``, else a random one."""
    seen: list = []

    @hyp_seed(seed)
    @settings(database=None, max_examples=1 if simplest else 4, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def pick(value) -> None:
        seen.append(value)

    pick()
    return seen[-1]


def _family_fields(cases: list[Case], speculation: bool) -> dict:
    """What the campaign log and the family log record of a family: its speculation method
    (None with speculation off), vocabulary, request patterns and the sampling features in play."""
    spec = cases[0].spec if speculation else None
    return {"method": None if spec is None else spec.method, "V": cases[0].vocab_size, "patterns": len(cases),
            "features": sorted({f for c in cases for f in active_features(c.to_json())})}


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


def simplest_key(strategy) -> str | None:
    """The key of the example Hypothesis tries first in a search (its all-simplest choices,
    whatever the seed); not ``find``'s result, which prefers fewer choices (another method)."""
    fam = simplest_family(strategy)
    return None if fam is None else family_key(fam)


def simplest_family(strategy):
    """The example Hypothesis tries first in a search of ``strategy`` (None: none)."""
    seen: list = []

    @settings(database=None, max_examples=1, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def first(fam) -> None:
        seen.append(fam)

    try:
        first()
    except Exception:  # noqa: BLE001 - no simplest example to skip is harmless
        return None
    return seen[0] if seen else None


def crash_key(crash: EngineCrash) -> str:
    """What makes two crashes "the same" (while shrinking, and a stored crash met again): kind
    and message, numbers stripped, and where the engine process died without naming why, the
    exception its log names (:func:`~specfuzz.fuzz.corpus.crash_cause`)."""
    return _crash_key_of(crash.kind, f"engine {crash.kind}: {crash.detail}", crash.log_tail)


def entry_crash_key(entry: Entry) -> str:
    """:func:`crash_key` of a stored crash entry (its evidence and log tail)."""
    return _crash_key_of(entry.extra.get("crash_kind"), entry.evidence, entry.log)


def _crash_key_of(kind: object, evidence: str, log: str | None = None) -> str:
    detail = evidence.split(": ", 1)[1] if evidence.startswith("engine ") and ": " in evidence else evidence
    key = f"{kind}:{re.sub(r'-?[0-9]+', '#', detail)[:160]}"
    cause = crash_cause(kind, evidence, log)
    return f"{key} <- {cause}" if cause else key


# A search whose families meet one stored crash this many times in a row ends there (its start
# shape crashes the engine whatever the requests; each crash cost an engine start).
KNOWN_CRASHES_END_SEARCH = 2
# A search whose swaps the engine refuses this many times in a row ends there: every further
# family of its start shape would restart the engine (SGLang 0.5.17 on the H200, 2026-12-06:
# a search with a reduced EAGLE-3 draft vocabulary ran 5 families on 5 starts, 180 s of a
# 907-s worker, where the next search's engine was already prestarted).
REFUSED_SWAPS_END_SEARCH = 2


class SearchSliceOver(BaseException):
    """A search's time slice is over (the campaign goes on with the next search)."""


class BudgetExhausted(BaseException):
    """Raised inside a Hypothesis example when the time budget is spent (not a test failure)."""


class PatternFailed(Exception):
    """A confirmed failure: Hypothesis shrinks the example that raised it."""


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


def _load_deferred(state: dict | None) -> list[list[Case]]:
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


@dataclass
class CampaignConfig:
    engine: str = "reference"
    engine_kwargs: dict = field(default_factory=dict)
    budget_s: float = 60.0
    corpus_dir: Path = Path("corpus")
    seed: int = 0
    methods: tuple[str, ...] | None = None  # None: every method the engine supports; () = speculation off
    alpha: float = 1e-3  # campaign-wide false-alarm budget (spent per confirmation)
    screen_alpha: float = SCREEN_ALPHA  # fixed level of every family's screening test (not spent)
    max_samples: int = 1000
    batch: int = DEFAULT_BATCH
    max_vocab: int = 5
    max_tokens: int = 4
    max_k: int = 3
    max_patterns: int = 3
    dtype: str = "float32"
    work_dir: Path = Path(".specfuzz-cache")
    worker: int = 0  # index among parallel workers sharing the corpus (each keeps its own state)
    workers: int = 1  # how many there are (their method rotations start spread over the methods)
    engine_settings: dict = field(default_factory=dict)  # EngineConfig.settings: backend knobs
    swap: bool = True  # load new tables into a running engine where it can (False: a start per table model)
    # A warmed-up spare process for each engine that restarts in a new process (None: with
    # SPARE_MIN_CPUS or more CPUs; on fewer, its imports would compete with the engine).
    spare_engines: bool | None = None
    # Start the next search's engine in the background while this search samples
    # (IsolatedEngine.prestart; None: wherever spare engines are on).
    prestart: bool | None = None
    # While a fresh confirmation engine or the speculation-off engine starts (tens of seconds
    # on a GPU), sample more families of the running search on its engine, by swaps
    # (Campaign._fill_wait; None: wherever prestarts are on).
    fill_waits: bool | None = None
    reset_state: bool = False  # start a fresh state; the old file is kept aside (Campaign._load_state)
    # Stop after the search in which this many new corpus entries (findings, crashes, stale
    # weights) were stored by this process (None: run to the budget). ``--max-findings 1`` is a
    # CI job's fail-fast: its shrunk, stored finding is the same as without it.
    max_findings: int | None = None
    # Steer each search toward the speculation events the campaign has covered least
    # (fuzz/coverage.py); False: every shape and family drawn uniformly, each method's first
    # search at its simplest shape.
    steer: bool = True

    @property
    def calibration_only(self) -> bool:
        return self.methods == ()


@dataclass
class CampaignStats:
    cases: int = 0
    patterns: int = 0
    samples: int = 0
    findings_new: int = 0
    findings_updated: int = 0
    crashes: int = 0
    engine_starts: int = 0
    swaps: int = 0
    swap_fallbacks: int = 0
    rejected: int = 0
    refused: int = 0  # cases the engine refused as bad configuration
    searches: int = 0
    candidates: int = 0  # patterns whose test crossed the screening level
    confirmations: int = 0  # confirmation runs (each spent its α_j)
    confirmed: int = 0
    calibration_checks: int = 0  # candidates run with speculation off (a stored calibration bug shares their features)
    calibration_known: int = 0  # ... that failed there too: a stored calibration bug met again, not shrunk
    finding_checks: int = 0  # candidates run reduced to a stored speculation finding's features (same method)
    findings_known: int = 0  # ... that failed so reduced: a stored speculation finding met again, not shrunk
    shrunk_known: int = 0  # shrunk failures that were a stored speculation finding (not confirmed afresh, not stored)
    resource_refusals: int = 0  # engine starts refused for lack of GPU memory after every retry (not stored)
    state_resets: int = 0  # engine state (prefix cache, n-gram trie) reset before a candidate ran again on it
    rescreened_out: int = 0  # candidates that passed when screened again alone on the running engine (no fresh start)
    unconfirmed_s: float = 0.0  # time in confirmations that did not confirm (false candidates)
    budget: object = None  # the α ledger's ConfirmationBudget, as last read
    stored: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)


class Campaign:
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
        # Totals over every run of this campaign state (a campaign resumed on another
        # machine, lease after lease, adds to them): seconds, and per speculation method
        # the families, patterns and samples tried.
        self.totals: dict = dict(state.get("totals") or {}) if state else {}
        self.totals.setdefault("seconds", 0.0)
        self.totals.setdefault("runs", 0)
        self.totals.setdefault("methods", {})
        # Per engine (this campaign's engine, every process of it: the searching engine, the
        # speculation-off engine, fresh confirmation engines): starts, swaps, and where the
        # wall time went (seconds: start, swap, sample, shrink, other).
        eng = self.totals.setdefault("engine", {})
        for k in (*ENGINE_COUNTERS, "stale_weights", "families", "samples", "searches", "filled_families"):
            eng.setdefault(k, 0)
        eng.setdefault("seconds", {})
        for k in ("start", "swap", "sample", "shrink", "other"):
            eng["seconds"].setdefault(k, 0.0)
        # What the "shrink" seconds were spent on (the same four kinds as outside a shrink).
        eng.setdefault("shrink_seconds", {})
        for k in ("start", "swap", "sample", "other"):
            eng["shrink_seconds"].setdefault(k, 0.0)
        eng.setdefault("shapes", {})
        # Speculation events exercised (fuzz/coverage.py): per method, each event's largest
        # probability in any pattern and its expected occurrences over the samples drawn.
        self.coverage = Coverage(self.totals.setdefault("coverage", {}))
        self._steer = None  # the current search's Steer
        self.totals["runs"] += 1
        self._base = {k: eng[k] for k in ENGINE_COUNTERS}  # from earlier runs
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
        self._deferred: list[list[Case]] = _load_deferred(state)
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
        self.known: set[str] = {e.signature for _, e in self.corpus.entries() if isinstance(e, Entry)}
        # Crashes already stored shrunk: not shrunk again. One stored unshrunk (found while
        # shrinking something else, or by a version without crash shrinking) is shrunk
        # when a search meets it again.
        self.known_crashes: set[str] = {
            entry_crash_key(e)
            for _, e in self.corpus.entries() if isinstance(e, Entry) and e.kind == "crash" and e.extra.get("shrunk") is True
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
        for path, e in self.corpus.entries():
            if isinstance(e, Entry):
                self._add_calibration(e, path)
                self._add_finding(e, path)
        self.crash_entries: dict[str, Path] = {}
        for path, e in sorted(self.corpus.entries(), key=lambda pe: isinstance(pe[1], Entry) and pe[1].extra.get("shrunk") is True):
            if isinstance(e, Entry) and e.kind == "crash":
                self.crash_entries[entry_crash_key(e)] = path

    # -- state ---------------------------------------------------------------------

    def _load_state(self) -> dict | None:
        """The stored campaign state, validated; None when there is none (a new campaign).

        A damaged state (unreadable, not JSON, another schema, fields of the wrong type) is
        never replaced silently: starting afresh would reset the α already spent, and with
        it the campaign-wide false-alarm guarantee. It raises :class:`DamagedState`, which
        says how to continue; with ``reset_state`` the old file (damaged or not) is kept
        beside it under a new name and the campaign starts a fresh state.
        """
        self.state_notes: list[str] = []
        path = self.state_path
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
        if self.cfg.reset_state:
            kept = set_aside(path, "damaged" if why else "old")
            self.state_notes.append(f"--reset-state: kept the {'damaged ' if why else ''}campaign state as {kept}; "
                                    "starting a fresh state (the α ledger, alpha.json, goes on unless it is damaged)")
            return None
        if why is not None:
            raise DamagedState(path, why)
        if d["schema_version"] == 1:  # migrate: the spender moves to the ledger (kept as legacy_spender)
            d = dict(d, schema_version=STATE_SCHEMA_VERSION)
            d["legacy_spender"] = d.pop("spender")
        return d

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

    def _new_engine(self) -> IsolatedEngine:
        e = IsolatedEngine(self.cfg.engine, self.cfg.engine_kwargs, log_dir=Path(self.cfg.work_dir) / "logs",
                           swap=self.cfg.swap, spare=self._spares())
        self._engines.append(e)
        # (the fresh confirmation and speculation-off engines: their starts are filled)
        e.while_waiting = lambda: self._fill_wait(e)
        return e

    def _fills(self) -> bool:
        """Whether start waits are filled (CampaignConfig.fill_waits)."""
        return self._prestarts() if self.cfg.fill_waits is None else bool(self.cfg.fill_waits)

    def _fill_wait(self, waiting: IsolatedEngine) -> None:
        """Called about once a second while ``waiting`` (a fresh confirmation engine, the
        speculation-off engine) starts: one more family of the running search, on the search's
        engine, by a swap (never a start: a draw that needs one is passed over), screened as any.
        On the H200 (SGLang, 3 workers, 2026-12-04) 13-15 fresh confirmation starts of ~33 s
        and 8-11 speculation-off starts of ~30 s per run were each waited out with the search
        engine idle: a quarter of every worker's time. A filling family that fails its
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

    def _spares(self) -> bool:
        """Whether this campaign's engines keep a warmed-up spare process (CampaignConfig.spare_engines)."""
        if self.cfg.spare_engines is not None:
            return bool(self.cfg.spare_engines)
        caps = self.engine.capabilities()
        return not getattr(caps, "restart_in_process", True) and (os.cpu_count() or 1) >= SPARE_MIN_CPUS

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
        campaign log with what was refused and the family it was refused in: on the H200
        (SGLang, 2026-12-04) one worker's searches had 177 cases refused, which cost Hypothesis
        examples, and the ``--quiet`` log did not say what they were."""
        self._log_event({"event": "case refused", "name": exc.name, "value": repr(exc.value)[:200],
                         "allowed": str(exc.allowed)[:300], **_family_fields(cases, speculation)})

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
            self.coverage.record(cases, [r.n for r in runs])

    def _left(self) -> float:
        return self.deadline - time.monotonic()

    # -- running one family ----------------------------------------------------------

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

    def _prestarts(self) -> bool:
        """Whether the next search's engine starts in the background (CampaignConfig.prestart)."""
        return self._spares() if self.cfg.prestart is None else bool(self.cfg.prestart)

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
                # on it, and a start per search for it was 295 of 2,027 worker-s of a SGLang
                # campaign on the H200 (2026-12-04: 13 starts of ~22 s).
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
        running search's first family, used to end the running search's own before its first
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

    def _prestart_calibration(self, case: Case) -> None:
        """Before a shrunk speculation failure's fresh confirmation: prestart the
        speculation-off engine on its case, which :meth:`_store_failure` then checks with
        speculation off, so that the two starts overlap. A shrink that drops a vocabulary token
        moves the case to another start: on the H200 (SGLang, 2026-12-04) each new entry then
        waited for a fresh start (~22 s) and after it a speculation-off start (~24 s)."""
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
        turns out a calibration bug (confirmed with speculation off), it ends unused. On the
        H200 (SGLang, 2026-12-04) each candidate waited for those checks (a speculation-off
        start of ~25 s among them) and then for its fresh start (21-41 s) one after the other."""
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

    def _log_family(self, cases: list[Case], runs: list[CaseRun], eng: IsolatedEngine, secs: dict, wall: float,
                    speculation: bool, fresh: bool) -> None:
        """One line per family run in ``.specfuzz/families.jsonl``: what it ran (method, V, the
        sampling features in play, patterns, samples) and where its time went (start, swap,
        generate, the rest), so that a slow engine's slow features can be told apart."""
        spec = cases[0].spec if speculation else None
        fields = _family_fields(cases, speculation)
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

    def _calibrate(self, case: Case, seed: int, alpha: float) -> CaseRun:
        """The same engine, speculation off, on the failing pattern (at the level of the
        confirmation that let it be stored: it only decides the entry's kind)."""
        if self._spec_off_engine is None:
            self._spec_off_engine = self._new_engine()
        return self._run([case], [alpha], seed, speculation=False, engine=self._spec_off_engine)[0]

    def _mark_seen(self, path: Path, also_under: str | None = None) -> bool:
        """Mark the stored entry at ``path`` seen again (``also_under``: the speculation method it
        was met under, when not its own; a Ray engine actor asks the driver)."""
        return mark_seen_again(path, also_under)

    def _add_calibration(self, entry: Entry, path: Path) -> None:
        if entry.kind == "calibration":
            self.calibration_entries.setdefault(calibration_key(str(entry.engine.get("name")), entry.case), path)

    def _add_finding(self, entry: Entry, path: Path) -> None:
        method = (entry.case.get("spec") or {}).get("method")
        if entry.kind == "finding" and method:
            key = (str(entry.engine.get("name")), str(method), tuple(active_features(entry.case)))
            self.finding_entries.setdefault(key, (path, entry.label, entry.signature))
            self._finding_evidence.setdefault(entry.signature, (entry.case, dict(entry.counts), profile_for(entry)))

    def _known_finding(self, run: CaseRun, seed: int) -> bool:
        """Whether a speculative candidate is a stored speculation finding met again under more
        sampling settings, or under another method of the same engine path.

        A stored finding of this engine whose method is the candidate's, or another method the
        engine runs through the same implementation (``Capabilities.spec_paths``) or, for a
        finding whose sampling features are all ones the verifier's sampler applies, verifies
        with the same sampler (``Capabilities.verify_samplers``, ``shared_code``), whose
        sampling features are the candidate's, or some of them (and whose attribution does not
        differ from the candidate's where both are attributed): the candidate reduced to those
        features (the others back at their defaults: the case the stored bug is met on, with
        this table, prompt and speculation config) runs on the running engine at the screening
        level. If it fails (under another method, with the stored finding's symptom too:
        ``triage.symptom``, past the end, another impossible output, or frequencies only), the
        candidate is that finding met again: the entry is marked seen again (once per run and
        method, after a confirmation at the next α_j on the same engine, as any known bug; the
        other method is recorded in its ``extra.also_seen_under``) and the candidate is not
        confirmed afresh, shrunk or stored as a variant. (On the H200, 2026-12-03, SGLang's
        STANDALONE bug with min_p and a frequency penalty was stored, then confirmed again with
        a presence penalty too, its shrink cut short by the run's end. On an H100, 2026-12-06,
        SGLang's STANDALONE "continues past the EOS" bug was stored again under EAGLE and
        EAGLE3, which run through the same worker, each after a fresh confirmation and a
        shrink.) The candidate's own method's findings are tried first. The stored bug masks a
        second one only while the stored one is not fixed: a variant whose reduction passes, or
        shows another symptom, goes on as any candidate.

        The running engine's state that outlives a request (the prefix cache, SGLang's n-gram
        trie) is reset before the reduced run, as the swap before the candidate's own run reset
        it: SGLang's NGRAM zero padding shows only while the trie holds no continuation, so on
        the candidate's filled trie the reduced case passed and the candidate was stored again
        as a new variant (finding-d5b4, met with min_p on the H100, 2026-12-05, most likely
        finding-065f)."""
        case_json = run.case.to_json()
        method = (case_json.get("spec") or {}).get("method")
        if not method or not self.finding_entries:
            return False
        name = str(self.engine.version().get("name"))
        caps = self.engine.capabilities()
        feats = set(active_features(case_json))
        label = attributed_label(run)
        matches = sorted(((k[1] == method, len(k[2]), k, shared) for k in self.finding_entries
                          if k[0] == name and set(k[2]) <= feats
                          and (shared := caps.shared_code(method, k[1], k[2])) is not None), reverse=True)
        for same, _, key, shared in matches:
            path, stored_label, stored_sig = self.finding_entries[key]
            if label not in (None, "unknown") and stored_label not in (None, "unknown") and label != stored_label:
                continue
            try:
                case = Case.from_json(reduced_to_features(case_json, key[2]))
                self._reset_state(self.engine)
                reduced = self._run([case], [self.cfg.screen_alpha], seed, speculation=True)[0]
            except (InvalidInput, AmbiguousSemantics, OutputSpaceTooLarge, ValueError, TypeError):
                continue
            self.stats.finding_checks += 1
            if reduced.crash is not None or not reduced.failed:
                continue
            shown = None
            if not same:
                try:
                    shown = symptom(reduced.case.to_json(), reduced.counts, self._profile or caps.profile)
                except (InvalidInput, AmbiguousSemantics, OutputSpaceTooLarge, ValueError, TypeError):
                    continue
                if shown != self._stored_symptom(stored_sig):
                    continue
            seen_key = stored_sig if same else f"{stored_sig} under {method}"
            first = seen_key not in self.seen_again  # marked once per run, by whichever check meets it first
            if not self._confirmed_seen_again(seen_key, path, reduced, True, self.engine, None if same else method):
                continue
            if first:
                how = "" if same else f" under {method} (stored under {key[1]}; one engine path, {shared}; symptom: {shown})"
                self.on_event(f"speculation finding seen again{how} (the candidate fails reduced to its features): {path.name}",
                              self.stats)
            self.stats.findings_known += 1
            return True
        return False

    def _stored_symptom(self, signature: str) -> str | None:
        """The symptom (triage.symptom) of the stored finding ``signature``'s counts, once per run."""
        if signature not in self._finding_symptoms:
            evidence = self._finding_evidence.get(signature)
            try:
                self._finding_symptoms[signature] = None if evidence is None else symptom(*evidence)
            except (InvalidInput, AmbiguousSemantics, OutputSpaceTooLarge, ValueError, TypeError, KeyError):
                self._finding_symptoms[signature] = None
        return self._finding_symptoms[signature]

    def _confirmed_seen_again(self, key, path: Path, run: CaseRun, speculation: bool, engine: IsolatedEngine,
                              also_under: str | None = None) -> bool:
        """A stored entry (``path``; ``key`` in :attr:`seen_again`) met again by ``run``: marked
        seen again once per run, after a confirmation of ``run`` at the next α_j on the running
        ``engine`` (a known bug is not started afresh); ``also_under``: the speculation method
        it was met under, when not its own (recorded with the entry). False when that
        confirmation passes; True when it fails or the entry was marked earlier in this run."""
        if key in self.seen_again:
            return True
        if not self._confirm(run, speculation, engine=engine)[0].failed:
            return False
        self.seen_again.add(key)
        if self._mark_seen(path, also_under):
            self.stats.findings_updated += 1
        return True

    def _known_calibration(self, run: CaseRun, seed: int) -> bool:
        """Whether a speculative candidate is a stored calibration bug met again.

        A stored calibration entry of this engine (corpus.calibration_key: any speculation
        method) whose sampling features are the case's, or some of them: the case is run with
        speculation off on the speculation-off engine (its tables swapped in and checked) at
        the screening level, and, where the entry has fewer features, so is the case with the
        others back at their defaults (the case the stored bug is met on). If both fail, the
        candidate is the target sampler's bug, not speculation's: the entry is marked seen
        again (once per run, after a confirmation with speculation off at the next α_j, on the
        same engine: a known bug is not started afresh) and the candidate is not confirmed,
        shrunk or stored again. Otherwise it goes on as any candidate."""
        name = str(self.engine.version().get("name"))
        case_json = run.case.to_json()
        feats = set(active_features(case_json))
        # The stored entries this case could be met on: same features first, then the largest subsets.
        matches = sorted(((len(key[1]), key) for key in self.calibration_entries
                          if key[0] == name and set(key[1]) <= feats), reverse=True)
        if not matches:
            return False
        self.stats.calibration_checks += 1
        calib = self._calibrate(run.case, seed=seed, alpha=self.cfg.screen_alpha)
        if not calib.failed:
            return False
        for n, key in matches:
            if n == len(feats):
                reduced = calib
            else:
                reduced = self._reduced_calibration(case_json, key[1], feats, seed + 1)
                if reduced is None or not reduced.failed:
                    continue
            path = self.calibration_entries[key]
            first = key not in self.seen_again
            if not self._confirmed_seen_again(key, path, reduced, False, self._spec_off_engine):
                continue
            if first:
                self.on_event(f"calibration bug seen again (speculation off fails too): {path.name}", self.stats)
            self.stats.calibration_known += 1
            return True
        return False

    def _reduced_calibration(self, case_json: dict, features: tuple[str, ...], feats: set[str], seed: int) -> CaseRun | None:
        """The candidate reduced to a stored calibration entry's ``features`` (the others back at
        their defaults), run with speculation off at the screening level. Where the oracle refuses
        that case (e.g. a top-p boundary tie once a penalty that broke it is gone: ambiguous
        semantics; or an output space too large once ignore_eos is off), the reductions that keep
        one more of the candidate's features, then two, ... (at most MAX_CALIBRATION_REDUCTIONS),
        are tried in turn and the first one the oracle takes is run. (On the H200, 2026-12-03, a
        top-p bug met with ignore_eos, min_tokens and a repetition penalty was not recognised as
        the stored top-p entry, with no reduced run in the family log, and was shrunk and stored
        again.) None: no reduction could be run."""
        extra = sorted(feats - set(features))
        why = ""
        tries = itertools.chain.from_iterable(itertools.combinations(extra, k) for k in range(len(extra)))
        for more in itertools.islice(tries, MAX_CALIBRATION_REDUCTIONS):
            try:
                case = Case.from_json(reduced_to_features(case_json, tuple(features) + more))
                return self._calibrate(case, seed=seed, alpha=self.cfg.screen_alpha)
            except (InvalidInput, AmbiguousSemantics, OutputSpaceTooLarge, ValueError, TypeError) as exc:
                why = why or f"{type(exc).__name__}: {str(exc)[:120]}"
        self.on_event(f"no reduction to the features {list(features)} of a stored calibration entry could be run ({why})", self.stats)
        return None

    def _confirm(self, run: CaseRun, speculation: bool, engine: IsolatedEngine | None = None) -> tuple[CaseRun, int]:
        """A candidate run again on fresh samples (its own seed window), on a freshly
        started engine, at the next confirmation's α_j (spent and written to the ledger
        first); returns the run and j. ``engine``: on that running engine instead (a known
        bug met again: its tables swapped in and checked, its state reset, no fresh start)."""
        j, a = self.ledger.spend()
        t0 = time.monotonic()
        if engine is not None:
            self._reset_state(engine)  # () where no engine runs there yet
        conf = self._run([run.case], [a], confirmation_seed(j), speculation=speculation, fresh=engine is None,
                         engine=engine, max_samples=confirmation_samples(run, a, self.cfg.max_samples))[0]
        self.stats.confirmations += 1
        self.stats.confirmed += int(conf.failed)
        self.stats.unconfirmed_s += 0.0 if conf.failed else time.monotonic() - t0  # engine start included
        self.stats.budget = self.ledger.read()
        return conf, j

    def _reset_state(self, engine: IsolatedEngine) -> tuple[str, ...]:
        """Reset ``engine``'s state that outlives a request before a candidate runs on it again
        (:meth:`IsolatedEngine.reset_state`); counted in ``stats.state_resets``."""
        reset = engine.reset_state()
        self.stats.state_resets += int(bool(reset))
        return reset

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

    # -- the search --------------------------------------------------------------------

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
        drawn (the first search of a method draws its simplest shape)."""
        caps = self.engine.capabilities()
        self._profile = caps.profile
        if not self.engine.spare_enabled:
            # Known once the engine answered: whether its restarts take a spare process.
            self.engine.spare_enabled = self._spares()
            self.engine._ensure_spare()
            if self.engine.spare_enabled:
                # The confirmation engine (and the speculation-off one) get a warmed-up process
                # now, so that their first start does not wait for the engine's imports too.
                self._fresh_engine = self._fresh_engine or self._new_engine()
                if not self.cfg.calibration_only:
                    self._spec_off_engine = self._spec_off_engine or self._new_engine()
                for e in (self._fresh_engine, self._spec_off_engine):
                    if e is not None:
                        e._ensure_spare()
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
        self._steer = self.steer_for(method)
        if not self.cfg.steer:
            self._steer = None
        strategy = start_shapes(
            methods=(method,), draft_vocab=caps.draft_vocab, spec_knobs=dict(getattr(caps, "spec_knobs", {}) or {}),
            spec_defaults=defaults, engine_default=default, inject=self.cfg.engine_kwargs.get("inject"),
            steer=self._steer, **common,
        )
        return draw_example(strategy, seed, simplest=i < n and self._steer is None)

    def reach(self, method: str) -> dict[str, str | None]:
        """The speculation events ``method`` can reach on this engine (fuzz/coverage.py)."""
        caps = self.engine.capabilities()
        default_k = (dict(getattr(caps, "spec_defaults", {}) or {}).get(method) or {}).get("num_speculative_tokens")
        return reachable(method, caps, self.cfg.max_k, default_k)

    def steer_for(self, method: str):
        """The Steer of the next search of ``method``: toward its thinly covered events."""
        reach = self.reach(method)
        self.coverage.set_reach(method, reach)
        return self.coverage.steer(method, reach, self.cfg.max_k)

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
        for that; before, each worker's slices were as short as one worker's, and on the H200
        (SGLang, 3 workers, 960 s, 6 methods) an 80-s slice after a ~30-s start left a search's
        start 28% of its wall. The search's engine starts do not count against it (:meth:`_search`)."""
        e = self.engine
        start_s = e.seconds["start"] / e.starts if e.starts else FIRST_START_GUESS_S
        workers = max(1, self.cfg.workers)
        cap = max(SEARCH_SLICE_MIN_S, self.cfg.budget_s * workers / (2 * max(1, len(self._methods()))))
        return min(cap, max(SEARCH_SLICE_MIN_S, SLICE_START_FACTOR * start_s))

    def _shrink_cap_s(self) -> float:
        return max(SHRINK_MIN_S, SHRINK_SHARE * self.cfg.budget_s)

    def _found_speculation(self) -> bool:
        """Whether the failure the last search found is confirmed, shrunk and stored with
        speculation on (not a speculation-off campaign, and its candidate passed with
        speculation off: otherwise it is a calibration bug, handled with speculation off)."""
        return not self.cfg.calibration_only and not self._spec_off_found

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
            # gets, below) ends the shrink: on the H200 (SGLang, 2026-12-04) five of six greedy
            # shrinks ended at a stored entry after 64-127 s, most of it engine restarts for
            # further reductions. Otherwise the kept case's fresh confirmation engine starts in
            # the background: if nothing smaller is kept, the confirmation below takes it.
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
        self._extend_watchdog(budget + 120.0)
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

    def _shrunk_known(self, run: CaseRun, what: str) -> bool:
        """Whether a speculation failure, shrunk, is a stored speculation finding
        (:meth:`_known_finding`, on the running engine): checked before its fresh confirmation.
        A candidate whose reduction to a stored finding's features passed in the search can
        shrink to that finding: on the H200 (SGLang, 2026-12-04) an ngram candidate with five
        sampling features passed reduced to finding-8b90's none, and its shrink (146 s of the
        greedy shrinker, then a fresh confirmation and a speculation-off start, ~50 s) ended at
        exactly 8b90's signature. One screening run on the running engine when it is not."""
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
        :meth:`_store_entry` recognises only after the rest of the shrink and the smallest case's
        fresh confirmation. On the H200 (SGLang, 2026-12-06) two of four greedy shrinks were such
        calibration bugs: 166 s each, to the shrinking cap, then a fresh confirmation (38-60 s),
        then "seen again, not stored". The entry is marked seen again (once per run, after a
        confirmation at the next α_j on ``engine``, as :meth:`_known_calibration` does) and the
        shrink ends there."""
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

    def _search(self, strategy, search_seed: int, shape_key: str = "",
                explicit: list[list[Case]] | None = None) -> tuple[list[Case], CaseRun, CaseRun, int] | None:
        """One Hypothesis run over one start shape; returns the smallest confirmed failure
        (family, run, confirmation, confirmation index). ``shape_key`` keys the shape's
        examples in the Hypothesis database. ``explicit``: run only these families (Hypothesis's
        explicit phase: a failing one is handled as any candidate, then shrunk by the greedy
        shrinker alone), as :meth:`_examine_deferred` does."""
        confirmed: list[tuple[list[Case], CaseRun, CaseRun, int]] = []
        label_of_first: list[str | None] = []
        # A crash is shrunk too: Hypothesis keeps the smallest family that crashes the
        # same way (kind and message with numbers stripped), each candidate on a fresh
        # engine process.
        crash_first: list[str] = []
        crash_best: list[tuple[list[Case], EngineCrash]] = []
        known_in_row: list[str] = []  # the stored crashes the search's last families met, in a row
        refused_in_row = [0]  # the search's last families whose swap the engine refused, in a row
        refused_any = [False]  # whether the engine refused a swap of this search's start shape
        left_to_greedy = [0]  # Hypothesis shrink candidates not run: each would have restarted the engine
        speculation = not self.cfg.calibration_only
        counter = [search_seed * 1_000_003]

        def next_seed() -> int:
            counter[0] += 100_003
            return counter[0]

        # A search gets a time slice, so that the campaign reaches every method and many
        # shapes; shrinking a failure runs past the slice, for half of its cap (see SHRINK_SHARE).
        # The slice counts the search's sampling, not its engine's starts: a start that takes
        # longer than the slice (SGLang's 25-60 s against a 41-s slice in a 330-s campaign of
        # four methods) left one family per search on the H200. Only the search's opening start
        # is left out (the one its first family ran on, amortised over the search's families):
        # restarts after it count, since every family of a shape whose swaps the engine refuses
        # restarts it (SGLang with a reduced EAGLE-3 draft vocabulary, 2026-12-03 on the H200:
        # one search of 11 families restarted the engine 11 times, 394 s of a 1213-s run).
        slice_end = time.monotonic() + self._slice_s()
        eng = self.engine
        starts_before = eng.seconds["start"]
        opening: list[float] = []  # the start seconds up to the search's first family run

        def slice_over() -> bool:
            left_out = opening[0] if opening else eng.seconds["start"] - starts_before
            return time.monotonic() - left_out > slice_end
        simplest = None if explicit else simplest_key(strategy)
        self._shrink_started = 0.0
        self._spec_off_found = False
        # While this search's candidates wait for engine starts, its engine samples more of it.
        self._fill_strategy, self._fill_seed = strategy, search_seed * 1_000_003 + 500_009

        def shrinking() -> None:
            if not self._shrink_started:
                self._save_state()  # the time so far was searching
                self._shrink_started = time.monotonic()
                self._shrinking = True

        internal_errors: list[str] = []

        def search(cases: list[Case]) -> None:
            try:
                run_example(cases)
            except (PatternFailed, BudgetExhausted, SearchSliceOver, HypothesisException):
                raise
            except Exception:
                # An error of specfuzz's own search code, not a finding: Hypothesis takes it for a
                # second bug, and while shrinking it may report the first one instead and end the
                # shrink without a word (a TypeError did so, 2026-12-06). Logged, then raised as before.
                internal_errors.append(traceback.format_exc(limit=8))
                raise

        # Each shape keys its own examples in the database (a stored failure is replayed on
        # the shape it was found on).
        search._hypothesis_internal_add_digest = shape_key.encode()  # type: ignore[attr-defined]
        searching = given(strategy)(search)
        for fam in explicit or ():
            searching = example(fam)(searching)
        # The settings go on last: @seed under them would switch the database off.
        search = settings(
            database=self._example_database(),
            max_examples=EXAMPLES_PER_SEARCH, deadline=None, derandomize=False, print_blob=False,
            suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
            phases=(Phase.explicit,) if explicit else (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink),
        )(hyp_seed(search_seed)(searching))

        def run_example(cases: list[Case]) -> None:
            if self._left() <= 0:
                raise BudgetExhausted
            if not label_of_first and not crash_first and slice_over():
                raise SearchSliceOver
            if not label_of_first and not crash_first and refused_in_row[0] >= REFUSED_SWAPS_END_SEARCH:
                # Checked before the next family, so the last one's candidates were handled.
                self._log_event({"event": "search ended by refused swaps", "refused": refused_in_row[0]})
                self.on_event(f"search ended: the engine refused {refused_in_row[0]} swaps of its start shape in a row "
                              "(each family restarted it)", self.stats)
                raise SearchSliceOver
            if self._shrink_started and time.monotonic() - self._shrink_started > self._shrink_cap_s() / 2:
                # Hypothesis's shrink phase had its half of the cap (the greedy shrinker of a
                # failure gets the rest): every further call ends at once.
                raise SearchSliceOver
            if label_of_first and refused_any[0] and self._needs_restart(eng, cases, speculation):
                # Shrinking on a start shape whose swaps the engine refuses: each Hypothesis
                # candidate with other tables would restart the engine, one after the other
                # (SGLang, reduced EAGLE-3 draft vocabulary, H100 2026-12-06: 4 starts, 140 s).
                # Only candidates the running engine serves as it is run; the greedy shrinker
                # then reduces the tables, its starts prestarted while it tries the last one.
                if not left_to_greedy[0]:
                    self._log_event({"event": "shrink candidates needing a restart left to the greedy shrinker"})
                left_to_greedy[0] += 1
                reject()
            if simplest is not None and family_key(cases) == simplest:
                # Every search opens with its simplest example: run it once per campaign.
                if simplest in self.simplest_run:
                    reject()
                self.simplest_run.add(simplest)
            alphas = [self.cfg.screen_alpha] * len(cases)
            try:
                # While a crash shrinks, every candidate runs on a fresh engine process.
                refused_before, swaps_before = eng.swaps_refused, eng.swaps
                runs = self._run(cases, alphas, next_seed(), speculation=speculation, fresh=bool(crash_first))
                if not opening:
                    opening.append(eng.seconds["start"] - starts_before)
                if eng.swaps_refused > refused_before:
                    refused_in_row[0] += 1
                    refused_any[0] = True
                elif eng.swaps > swaps_before:
                    refused_in_row[0] = 0
            except (AmbiguousSemantics, OutputSpaceTooLarge):
                self.stats.rejected += 1
                reject()
            except InvalidInput as exc:
                # The engine refused a configuration its capabilities did not rule out:
                # not a finding; note it and draw another case.
                self.stats.refused += 1
                self._log_refusal(cases, exc, speculation)
                self.on_event(f"engine refused a case: {exc}", self.stats)
                reject()
            self.stats.cases += 1
            self.stats.patterns += len(cases)
            self._count(cases, runs, speculation)
            self._save_state()
            crash = next((r.crash for r in runs if r.crash is not None), None)
            if crash is not None and crash.kind == "resource":
                self._record_crash(cases[0], crash, list(cases))  # not stored: the machine's share, not the engine
                reject()
            if crash is not None:
                key = crash_key(crash)
                same = bool(crash_first) and key == crash_first[0]
                if not same and (label_of_first or crash_first or self._crash_known(cases[0], crash, cases)):
                    # found while shrinking something else, or a known crash: stored as found
                    self._record_crash(cases[0], crash, list(cases))
                    if not label_of_first and not crash_first:
                        known_in_row.append(key)
                        if len(known_in_row) >= KNOWN_CRASHES_END_SEARCH and len(set(known_in_row)) == 1:
                            # The search's start shape kills the engine whatever the requests (its
                            # families meet one stored crash in a row, each after an engine start):
                            # on to the next search. SGLang 0.5.17 on an H100, 2026-12-05: tree
                            # drafting with fewer draft tokens than steps + 1 (crash-a2f0) crashed
                            # three families of one search in a row, 213 of a worker's 1038 s.
                            self._log_event({"event": "search ended by a stored crash", "crashes": len(known_in_row),
                                             "crash": key, "entry": str(self.crash_entries.get(key, ""))})
                            self.on_event(f"search ended: its families crashed the engine {len(known_in_row)} times in a row "
                                          "with a stored crash", self.stats)
                            raise SearchSliceOver
                else:
                    if not crash_first:
                        crash_first.append(key)
                        # Kept on disk until it is shrunk and stored, as a confirmed failure is.
                        self._write_pending_crash(cases[0], crash, list(cases))
                        shrinking()
                        self.on_event(f"crash ({crash.kind}); shrinking", self.stats)
                    crash_best.append((list(cases), crash))
                    # One raise site: Hypothesis tells failures apart by where they are raised.
                    raise PatternFailed("crash")
            if crash is None:
                known_in_row.clear()
            if crash_first:
                return  # shrinking a crash: only the same crash counts
            best = max((r.judgement.verdict.log_e for r in runs if r.judgement is not None), default=0.0)
            target(min(best, 50.0) if math.isfinite(best) else 50.0, label="log e-value")
            self.on_event("", self.stats)
            for r in runs:
                if not r.failed:
                    continue
                self.stats.candidates += 1
                label = r.judgement.attribution.label if r.judgement.attribution else None
                if label_of_first and label != label_of_first[0] and label_of_first[0] not in (None, "unknown"):
                    continue  # while shrinking, only the same bug counts (an unattributed one may become attributable)
                if not label_of_first and speculation and self._known_calibration(r, next_seed()):
                    continue  # a stored calibration bug, met under another speculation setting
                if not label_of_first and (sig := self._entry_for(r).signature) in self.known:
                    # A known bug: confirmed once per run, then marked seen again.
                    if sig not in self.seen_again and self._confirm(r, speculation, engine=self.engine)[0].failed:
                        self.seen_again.add(sig)
                        self._update_known(r)
                    continue
                if not label_of_first and speculation and self._known_finding(r, next_seed()):
                    continue  # a stored speculation finding, met under more sampling settings
                if label_of_first:
                    # While shrinking a confirmed failure, a smaller one of the same bug counts on
                    # the screening test on the running engine; only the smallest is confirmed on
                    # a fresh engine, when the search ends (below). A fresh start per candidate
                    # (25-60 s on the H200) left Hypothesis one or two candidates per shrink.
                    conf, j = None, 0
                else:
                    cand, spec, pre = r, speculation, None
                    # Its fresh confirmation's engine starts now, in the background, while the
                    # checks below run on the running engines (speculation off, screened again):
                    # with speculation off where most candidates confirmed so far were calibration
                    # bugs (SGLang on the H200: 6 of 14 fresh prestarts went unused for that).
                    ahead = speculation and not self._calibration_likely()
                    self._prestart_fresh(r.case, ahead)
                    if speculation:
                        # Speculation off first, on the running speculation-off engine (its tables
                        # swapped in and checked): where the target's own sampler fails too, the
                        # bug is not speculation's, and it is confirmed on a fresh engine with
                        # speculation off (the entry it makes is a calibration entry: its
                        # evidence is then a fresh speculation-off run) and shrunk with
                        # speculation off (no candidates that only change speculation knobs, which
                        # such a run ignores; candidates swap into the speculation-off engine).
                        pre = self._calibrate(r.case, seed=next_seed(), alpha=self.cfg.screen_alpha)
                        if pre.crash is not None:
                            self.on_event(f"the speculation-off engine crashed on a candidate ({pre.crash.kind}: "
                                          f"{pre.crash.detail[:120]}); it goes on with speculation on", self.stats)
                        if pre.failed:
                            cand, spec = pre, False
                        if spec != ahead:
                            self._prestart_fresh(r.case, spec)  # the other kind after all
                    if spec == speculation:
                        # Screened again alone, on the running engine (fresh samples, the screening
                        # level), before a fresh engine starts for it: the confirmation runs it alone
                        # too, and a fresh start costs 21-60 s on the H200. A candidate that failed
                        # only among the family's other patterns (vLLM's top-p kernel runs on batches
                        # of 8+ rows) or by chance passes here. (The speculation-off run above is
                        # this second look for a calibration bug.)
                        again = self._run([r.case], [self.cfg.screen_alpha], next_seed(), speculation=spec)[0]
                        if again.crash is not None:
                            self._end_fresh_prestart("the candidate crashed the engine when screened again")
                            self._record_crash(r.case, again.crash, [r.case])  # a finding of its own
                            continue
                        if not again.failed:
                            self.stats.rescreened_out += 1
                            self._end_fresh_prestart("the candidate passed when screened again")
                            continue
                    conf, j = self._confirm(cand, spec)
                    if not conf.failed:
                        continue
                    self._spec_off_found = not spec and speculation
                    self._confirmed_kinds[int(self._spec_off_found)] += 1
                    # Kept on disk until the failure is shrunk and stored: a campaign killed (or
                    # its machine lost) meanwhile stores it unshrunk when it resumes.
                    self._write_pending(conf, j, pre if spec else None)
                    label_of_first.append(label)
                    shrinking()
                    self.on_event(f"failure ({label}); shrinking", self.stats)
                confirmed.append(([r.case], r, conf, j))
                # One raise site: Hypothesis tells failures apart by where they are raised.
                raise PatternFailed(label)

        try:
            search()
        except PatternFailed:
            pass
        except (Flaky, HypothesisException):
            pass  # the replay of the minimal example did not fail again; we keep our own record
        except (BudgetExhausted, SearchSliceOver):
            pass
        if internal_errors:
            self._log_event({"event": "search code raised", "errors": len(internal_errors), "traceback": internal_errors[-1]})
            self.on_event(f"the search's own code raised {len(internal_errors)} times (not a finding; events.jsonl has the "
                          f"traceback): {internal_errors[-1].strip().splitlines()[-1]}", self.stats)
        if left_to_greedy[0]:
            self.on_event(f"Hypothesis's shrink left {left_to_greedy[0]} candidates that needed an engine restart "
                          "to the greedy shrinker", self.stats)
        if crash_best:
            self._extend_watchdog()  # storing a found crash may overrun the budget a little
            fam, crash = crash_best[-1]
            one = self._crashing_pattern(fam, crash, next_seed(), speculation) if len(fam) > 1 else (fam[0], crash)
            if one is not None:
                fam, crash = [one[0]], one[1]
            if speculation:
                # The pattern that crashes alone, else the whole family (only the mix crashes),
                # mixed in each call as it crashed.
                fam, crash = self._greedy_shrink_crash(fam, crash, speculation)
            self._record_crash(fam[0], crash, fam, shrunk=True)
        # The smallest failure Hypothesis kept is returned unconfirmed (its confirmation None):
        # the greedy shrinker goes on from it, and only the smallest case that one keeps is
        # confirmed on a fresh engine (_greedy_shrink_found): one fresh start per shrunk failure
        # instead of two (~30 s each for SGLang on the H200). The smallest confirmed one is the
        # fallback where neither confirms.
        self._found_fallback = next((c for c in reversed(confirmed) if c[2] is not None), None)
        return confirmed[-1] if confirmed else None

    def _handle_found(self, found: tuple | None, armed: bool) -> None:
        """What a search found: shrunk (greedy shrinker), confirmed and stored; then the
        search's shrinking state ends."""
        if found is not None:
            if armed:  # shrinking, calibrating and storing may overrun the budget a little
                signal.setitimer(signal.ITIMER_REAL, max(self._left(), 0) + self._shrink_cap_s() + 120)
            found = self._greedy_shrink_found(found, self._found_speculation())
            if found is not None:
                _, run, conf, j = found
                self._store_failure(run, conf, j)
            if armed:
                signal.setitimer(signal.ITIMER_REAL, max(0.1, self._left() + WATCHDOG_GRACE_S))
        self._pending_path().unlink(missing_ok=True)
        self._save_state()
        self._shrinking = False

    def _examine_deferred(self, strategy, armed: bool) -> None:
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
            self._handle_found(found, armed)

    def _confirm_smallest(self, found: tuple) -> tuple:
        """The smallest failure Hypothesis kept (unconfirmed), confirmed on a freshly started
        engine at the next α_j like any candidate; if it does not confirm, the smallest
        confirmed one of the search is kept."""
        self._extend_watchdog()
        fam, r, _, _ = found
        self._prestart_calibration(r.case)
        conf, j = self._confirm(r, self._found_speculation())
        if conf.failed:
            return fam, r, conf, j
        self.on_event("the smallest failure did not confirm on a fresh engine: the smallest confirmed one is kept", self.stats)
        return self._found_fallback

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

    def _crash_known(self, case: Case, crash: EngineCrash, family: list[Case]) -> bool:
        """A crash already in the corpus (same kind and message, numbers aside): not shrunk again."""
        if crash_key(crash) in self.known_crashes:
            return True
        entry = crash_entry(self.engine, case, crash, self.cfg.engine, dtype=self.cfg.dtype, family=family)
        return entry.signature in self.known

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
            # the campaign's speculation-off engine as well: it only repeated the confirmation,
            # and on the H200 (SGLang, 2026-12-04) it restarted that engine (~25 s) for a
            # shrunk case's vocabulary after the fresh confirmation had just sampled it.
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

    def _pending_path(self) -> Path:
        """This worker's record of a failure confirmed, or a crash met, and not yet stored (one
        at a time)."""
        return self.state_dir / f"pending-w{self.cfg.worker}.json"

    def _write_pending(self, conf: CaseRun, j: int, calib: CaseRun | None) -> None:
        """The entry a confirmed failure would make unshrunk, written before shrinking starts:
        shrinking takes minutes on a GPU engine, and a campaign killed meanwhile (a timeout, a
        lost machine: 2026-12-03 on the H200, a confirmed SGLang failure went with its machine)
        would otherwise lose it. ``calib``: the speculation-off run of the same case on the
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

    def _arm_watchdog(self) -> bool:
        if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
            return False

        def fire(signum, frame):  # noqa: ARG001
            raise BudgetExhausted

        self._old_handler = signal.signal(signal.SIGALRM, fire)
        signal.setitimer(signal.ITIMER_REAL, max(0.1, self._left() + WATCHDOG_GRACE_S))
        return True

    def _extend_watchdog(self, grace_s: float = 120.0) -> None:
        """Give the watchdog room for storing what a search found (a calibration run, a
        crash's single-pattern check) past the budget."""
        if getattr(self, "_armed", False):
            signal.setitimer(signal.ITIMER_REAL, max(self._left(), 0) + grace_s)

    def _disarm_watchdog(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self._old_handler)

    def run(self) -> CampaignStats:
        armed = self._armed = self._arm_watchdog()
        try:
            self._store_pending()
            while self._left() > 0:
                self.search_index += 1
                self.stats.searches += 1
                self._save_state()
                self.shape = self._shape(self.search_index)
                self._prestart_due = True
                shape_key = hashlib.sha256(repr(self.shape).encode()).hexdigest()[:16]
                eng = self.totals["engine"]
                eng["searches"] += 1
                eng["shapes"][self.shape.variant] = eng["shapes"].get(self.shape.variant, 0) + 1
                self.on_event(f"search {self.search_index}: {self.shape.describe()}", self.stats)
                strategy = self._strategy(self.shape)
                found = self._search(strategy, self.cfg.seed * 100_000 + self.search_index, shape_key)
                self._handle_found(found, armed)
                self._examine_deferred(strategy, armed)
                if self.cfg.max_findings and len(self.stats.stored) >= self.cfg.max_findings:
                    self.on_event(f"stopping: {len(self.stats.stored)} new corpus entries stored "
                                  f"(--max-findings {self.cfg.max_findings})", self.stats)
                    break
                self._prestart_spec_off(search_over=True)
        except BudgetExhausted:
            pass
        finally:
            if armed:
                self._disarm_watchdog()
            for e in self._engines:
                e.close()
            self._drain_events()
            self._save_state()
        return self.stats


def confirmation_samples(run: CaseRun, alpha: float, samples: int) -> int:
    """Most samples of a confirmation at level ``alpha`` of a candidate whose screening run is
    ``run``, where every family samples ``samples`` at most: the samples at which the run's
    evidence, growing at the rate it showed, would reach 1/alpha (with CONFIRM_MARGIN), between
    ``samples`` and CONFIRM_MAX_FACTOR x ``samples``. A candidate screened at 1e-3 with 1000
    samples and confirmed at an α_j of 1e-9 needs about three times the evidence: with only
    ``samples`` its confirmation often did not reach its level, a fresh engine start spent for
    nothing (SGLang on the H200: ~30 s each). The test is anytime-valid and stops at its level,
    so a decisive failure (an output μ forbids) still stops at once; sizing the confirmation
    from an earlier, independent run does not change its false-alarm level."""
    j = run.judgement
    log_e = None if j is None else j.verdict.log_e
    if log_e is None or not math.isfinite(log_e) or log_e <= 0 or run.n <= 0 or not 0 < alpha < 1:
        return samples
    need = math.ceil(CONFIRM_MARGIN * run.n * math.log(1 / alpha) / log_e)
    return int(min(CONFIRM_MAX_FACTOR * samples, max(samples, need)))


def attributed_label(run: CaseRun) -> str | None:
    """The attributed class of a judged run (None: not judged or not attributed)."""
    j = run.judgement
    return None if j is None or j.attribution is None else j.attribution.label
