"""specfuzz in a hand-written test: run a campaign slice on an engine, get a report.

.. code-block:: python

    from specfuzz.testing import fuzz_engine

    def test_ngram_speculation_is_lossless():
        report = fuzz_engine("vllm", budget="2m", methods=["ngram"],
                             expected=["721b7b8587fd119d"])  # a known open bug, by signature
        assert report.ok, report.failure_text()

:func:`fuzz_engine` runs one campaign (the same one ``specfuzz fuzz`` runs) and reads
from the corpus which entries it met (:mod:`specfuzz.fuzz.outcome`). A met entry whose
signature is not *expected* makes the report not ``ok``; its drafted upstream issue
(``ISSUE.md``, the text ``specfuzz draft`` writes) is the failure text. The pytest plugin
(:mod:`specfuzz.pytest_plugin`) is built on this function.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from specfuzz.errors import EngineUnavailable, InvalidInput

__all__ = ["Finding", "FuzzReport", "fuzz_engine", "parse_budget"]


@dataclass(frozen=True)
class Finding:
    """A corpus entry the campaign met: a finding, crash or calibration failure."""

    signature: str
    kind: str  # finding, crash, calibration
    method: str  # speculation method, or "off"
    title: str  # one line
    evidence: str
    path: Path  # the corpus entry
    new: bool  # stored by this run (False: already in the corpus, met again)
    expected: bool  # marked expected (its signature, or a crash: the crash of an expected entry)
    issue: str = ""  # the drafted ISSUE.md (for unexpected findings, when drafting was on)


@dataclass(frozen=True)
class FuzzReport:
    engine: str
    methods: tuple[str, ...] | None  # None: every method the engine supports; (): speculation off
    corpus: Path
    budget_s: float
    seconds: float
    stats: Any  # the campaign's CampaignStats (cases, patterns, samples, engine_starts, ...)
    findings: tuple[Finding, ...]
    engine_error: str | None = None  # the engine could not start at all

    @property
    def unexpected(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if not f.expected)

    @property
    def expected_met(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.expected)

    @property
    def ran(self) -> bool:
        """At least one case family ran (a slice too short for the engine's start runs none)."""
        return self.stats is not None and self.stats.cases > 0

    @property
    def ok(self) -> bool:
        """The engine ran cases and nothing it did is unexpected (a slice that ran nothing
        proves nothing, so it is not ok either)."""
        return self.engine_error is None and self.ran and not self.unexpected

    def summary(self) -> str:
        what = "calibration (speculation off)" if self.methods == () else \
            ("every method" if self.methods is None else ", ".join(self.methods))
        head = f"specfuzz on {self.engine} [{what}], {self.seconds:.0f} s of {self.budget_s:.0f} s"
        if self.engine_error:
            return f"{head}: {self.engine_error}"
        s = self.stats
        lines = [f"{head}: {s.cases} families, {s.patterns} request patterns, {s.samples:,} samples, "
                 f"{s.engine_starts} engine starts; {len(self.unexpected)} unexpected, {len(self.expected_met)} expected"]
        for f in self.findings:
            mark = "expected" if f.expected else ("new" if f.new else "known, not marked expected")
            lines.append(f"  {f.path.name} [{mark}] {f.title}"[:240])
        return "\n".join(lines)

    def failure_text(self) -> str:
        """What a failing test shows: why the engine did not start, or every unexpected
        finding's drafted issue (its evidence when drafting was off)."""
        if self.engine_error:
            return f"specfuzz: {self.engine_error}"
        if not self.unexpected and not self.ran:
            return (f"specfuzz: no case ran on {self.engine} in {self.seconds:.0f} s (budget {self.budget_s:.0f} s): "
                    f"the engine did not finish one case family in time; raise the budget")
        if not self.unexpected:
            return ""
        parts = [f"specfuzz: {len(self.unexpected)} unexpected entr{'y' if len(self.unexpected) == 1 else 'ies'} "
                 f"on {self.engine} (mark a known one expected by its signature):"]
        for f in self.unexpected:
            parts.append(f"\n===== {f.path.name} (signature {f.signature}, {'new' if f.new else 'known'} {f.kind}, "
                         f"{f.method}) =====\n")
            parts.append(f.issue or f"{f.title}\n\n{f.evidence}")
        return "\n".join(parts)


def parse_budget(budget: float | int | str) -> float:
    """Seconds from a number or a duration such as '90s', '10m', '2h', '1h30m' (the CLI's rules)."""
    import click

    from specfuzz.cli import parse_budget as parse_cli_budget

    if isinstance(budget, (int, float)) and not isinstance(budget, bool):
        seconds = float(budget)
    else:
        try:
            seconds = parse_cli_budget(str(budget))
        except click.BadParameter:
            raise InvalidInput("budget", budget, "a duration like 90s, 10m, 2h, 1h30m, or seconds") from None
    if not seconds > 0:
        raise InvalidInput("budget", budget, "a positive duration")
    return seconds


def _methods(methods: str | Sequence[str] | None) -> tuple[str, ...] | None:
    if methods is None:
        return None
    if isinstance(methods, str):
        methods = (methods,)
    methods = tuple(methods)
    if "none" in methods:
        if len(methods) > 1:
            raise InvalidInput("methods", methods, "'none' alone (speculation off), or speculation methods")
        return ()
    return methods


def fuzz_engine(
    engine: str | None = None,
    *,
    budget: float | str = 60.0,
    methods: str | Sequence[str] | None = None,
    corpus: Path | str | None = None,
    expected: Iterable[str] = (),
    expected_from: Iterable[Path | str] = (),
    inject: str | None = None,
    seed: int = 0,
    samples: int = 1000,
    alpha: float = 1e-3,
    max_vocab: int = 5,
    max_tokens: int = 4,
    dtype: str = "float32",
    patterns: int = 3,
    batch: int = 600,
    engine_settings: Mapping[str, Any] | None = None,
    work_dir: Path | str | None = None,
    draft: bool = True,
    max_findings: int | None = None,
) -> FuzzReport:
    """Run a campaign slice of ``budget`` on ``engine`` and report what it met.

    ``engine``: a built-in name or ``package.module:Class``; None: the reference sampler with
    ``inject``, else the best engine installed here (as ``specfuzz fuzz`` without ``--engine``).

    ``methods``: speculation methods to fuzz (None: all the engine supports; ``"none"``:
    a calibration campaign with speculation off). ``corpus``: the campaign's corpus
    folder (resumed if it holds a campaign; default: a new temporary folder).
    ``expected``: signatures (or entry file names/paths) of known open bugs: met again,
    they do not make the report fail; ``expected_from``: corpus folders whose open entries
    are all expected. A crash met under other settings than an expected crash entry (a new
    signature, the same crash kind and message) is expected too. ``inject``: a catalogued bug for the reference
    engine (N1..N7). ``draft``: draft each unexpected finding (``ISSUE.md``, ``plot.png``, ``repro.py`` under
    ``<work_dir>/drafts/<entry>/``; its ISSUE.md is the failure text). ``max_findings``: end the
    slice after the search in which the campaign stored its N-th new entry (finding, crash,
    stale weights), that entry shrunk and stored (``specfuzz fuzz --max-findings``; None: run
    to the budget).
    Bad arguments raise :class:`specfuzz.errors.InvalidInput`; an engine that cannot
    start gives a report with ``engine_error`` set (``ok`` is False).
    """
    from specfuzz.engines.availability import require_engine
    from specfuzz.engines.isolation import EngineCrash
    from specfuzz.fuzz import outcome
    from specfuzz.fuzz.campaign import Campaign, CampaignConfig

    budget_s = parse_budget(budget)
    meth = _methods(methods)
    if engine is None:
        from specfuzz.engines.availability import best_engine

        engine = "reference" if inject is not None else best_engine().engine
    if inject is not None and engine != "reference":
        raise InvalidInput("inject", inject, "only with engine 'reference'")
    corpus_dir = Path(corpus) if corpus is not None else Path(tempfile.mkdtemp(prefix="specfuzz-corpus-"))
    work = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="specfuzz-work-"))
    want = outcome.read_signatures(expected)
    expected_from = [Path(d) for d in expected_from]
    for d in expected_from:
        if not d.is_dir():
            raise InvalidInput("expected_from", str(d), "an existing corpus folder")
        want |= outcome.open_signatures(d)
    crashes = outcome.expected_crashes(want, corpus_dir, *expected_from)
    kwargs = {"inject": inject} if inject else {}
    t0 = time.monotonic()
    try:
        require_engine(engine)
    except EngineUnavailable as exc:
        return FuzzReport(engine, meth, corpus_dir, budget_s, time.monotonic() - t0, None, (), str(exc))
    cfg = CampaignConfig(engine=engine, engine_kwargs=kwargs, budget_s=budget_s, corpus_dir=corpus_dir, seed=seed,
                         methods=meth, alpha=alpha, max_samples=samples, batch=batch, max_vocab=max_vocab,
                         max_tokens=max_tokens, max_patterns=patterns, dtype=dtype, work_dir=work,
                         engine_settings=dict(engine_settings or {}), max_findings=max_findings)
    before = outcome.snapshot(corpus_dir)
    campaign = Campaign(cfg)
    error = None
    try:
        stats = campaign.run()
    except EngineCrash as exc:  # before any case ran: its capabilities or version
        stats, error = campaign.stats, f"engine {engine!r} could not start: {exc}"
    met = outcome.met_since(corpus_dir, before)
    error = error or outcome.engine_error(stats, engine, kwargs, work_dir=work, dtype=dtype,
                                          settings=cfg.engine_settings)
    findings = []
    for m in met:
        is_expected = outcome.is_expected(m, want, crashes)
        findings.append(Finding(m.signature, m.kind, m.method, m.title, m.entry.evidence, m.path, m.new, is_expected,
                                outcome.draft_text(m, work / "drafts") if draft and not is_expected else ""))
    return FuzzReport(engine, meth, corpus_dir, budget_s, time.monotonic() - t0, stats, tuple(findings), error)
