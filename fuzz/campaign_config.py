"""What a campaign is asked to do (:class:`CampaignConfig`) and what it counts as it runs
(:class:`CampaignStats`, this run's counters; the totals over every run of a campaign state
are kept by ``fuzz/campaign_state.py``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from specfuzz.fuzz.run import DEFAULT_BATCH
from specfuzz.oracle.budget import SCREEN_ALPHA


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
