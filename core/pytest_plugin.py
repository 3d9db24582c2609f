"""The pytest plugin: fuzz an engine's speculative decoding as part of a test run.

Installed with specfuzz (entry point ``pytest11``), inactive unless ``--specfuzz-engine``
is given::

    pytest -m specfuzz --specfuzz-engine vllm --specfuzz-budget 5m \\
        [--specfuzz-method ngram ...] [--specfuzz-corpus DIR] \\
        [--specfuzz-expect SIGNATURE ...] [--specfuzz-expect-from corpus/] \\
        [--specfuzz-max-findings N] [--junit-xml report.xml]

It adds one test item per speculation method the engine supports (or per
``--specfuzz-method``; ``none`` is speculation off), plus ``calibration`` (speculation
off), named ``specfuzz[<engine>]::<method>`` and marked ``specfuzz``. Each item runs a
campaign slice (:func:`specfuzz.testing.fuzz_engine`) on the shared corpus; the budget
is shared: each item gets what is left divided by the items still to run. An item

- fails when the slice met an entry that is not marked expected: the failure text is
  the drafted upstream issue (``ISSUE.md``) of each such entry;
- xfails when every entry it met is marked expected (known, still open bugs, marked by
  signature with ``--specfuzz-expect``, the ini option ``specfuzz_expect``, or every open
  entry of a corpus folder with ``--specfuzz-expect-from``); with ``--runxfail`` nothing
  is expected;
- fails when the engine could not start at all, or when its slice ended before one case
  family ran (a budget too small for the engine's start: a pass would prove nothing);
- passes otherwise.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest

CALIBRATION = "calibration"
MARKER = "specfuzz"
# Shortest slice an item gets when the shared budget is nearly spent (seconds).
MIN_SLICE_S = 5.0


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("specfuzz", "specfuzz: is the engine's speculative decoding lossless?")
    g.addoption("--specfuzz-engine", default=None, metavar="ENGINE",
                help="Fuzz this engine (reference, vllm, hf, sglang, mlx, or package.module:Class); the plugin is inactive without it.")
    g.addoption("--specfuzz-budget", default="60s", metavar="DURATION",
                help="Total time for all specfuzz items (90s, 5m, 1h); each item gets what is left over the items left. Default 60s.")
    g.addoption("--specfuzz-method", action="append", default=[], metavar="METHOD",
                help="Only these methods (repeatable); 'none' = the calibration item. Default: calibration and every method the engine supports.")
    g.addoption("--specfuzz-corpus", default=None, metavar="DIR",
                help="Campaign corpus (resumed if it holds one). Default: specfuzz-corpus in pytest's cache folder.")
    g.addoption("--specfuzz-expect", action="append", default=[], metavar="SIGNATURE",
                help="A known open bug (signature, or entry file name/path): met again, the item xfails instead of failing (repeatable).")
    g.addoption("--specfuzz-expect-from", action="append", default=[], metavar="DIR",
                help="Mark every open (not fixed) entry of this corpus folder expected (repeatable).")
    g.addoption("--specfuzz-inject", default=None, metavar="N",
                help="Reference engine only: inject a catalogued bug (N1..N7).")
    g.addoption("--specfuzz-seed", default=0, type=int, help="Campaign seed (default 0).")
    g.addoption("--specfuzz-setting", action="append", default=[], metavar="KEY=VALUE",
                help="An engine knob (as specfuzz fuzz --engine-setting), repeatable.")
    g.addoption("--specfuzz-samples", default=1000, type=int, help="Samples per request pattern (default 1000).")
    g.addoption("--specfuzz-max-vocab", default=5, type=int, help="Largest vocabulary drawn (default 5).")
    g.addoption("--specfuzz-max-findings", default=None, type=int, metavar="N",
                help="End an item's slice after the search in which it stored its N-th new entry (fail fast); "
                     "its unused time goes to the items left. Default: each item runs its share of the budget.")
    g.addoption("--specfuzz-work-dir", default=None, metavar="DIR",
                help="Checkpoints, engine logs and drafts. Default: specfuzz-work in pytest's cache folder.")
    parser.addini("specfuzz_expect", type="linelist", default=[],
                  help="Signatures of known open bugs: met again, specfuzz items xfail instead of failing.")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}: a specfuzz campaign slice (added by --specfuzz-engine)")
    if config.getoption("specfuzz_engine"):
        import click

        from specfuzz.errors import SpecfuzzError

        try:
            config.stash[_PLAN] = _Plan(config)
        except SpecfuzzError as exc:  # a bad option value: one line, pytest's usage error
            raise pytest.UsageError(f"specfuzz: {exc}") from None
        except click.BadParameter as exc:  # --specfuzz-setting not KEY=VALUE
            raise pytest.UsageError(f"specfuzz: {exc.format_message()}") from None


class SpecfuzzFailure(Exception):
    """An item's failure; its text is what pytest shows (no traceback)."""


class _Plan:
    """Everything the items of one session share: options, budget, corpus, reports."""

    def __init__(self, config: pytest.Config) -> None:
        from specfuzz.cli import parse_settings
        from specfuzz.errors import InvalidInput
        from specfuzz.fuzz.outcome import read_signatures
        from specfuzz.testing import parse_budget

        opt = config.getoption
        self.engine: str = opt("specfuzz_engine")
        self.budget_s = parse_budget(opt("specfuzz_budget"))
        self.methods: list[str] = list(opt("specfuzz_method"))
        self.inject: str | None = opt("specfuzz_inject")
        self.seed: int = opt("specfuzz_seed")
        self.samples: int = opt("specfuzz_samples")
        self.max_vocab: int = opt("specfuzz_max_vocab")
        self.max_findings: int | None = opt("specfuzz_max_findings")
        if self.max_findings is not None and self.max_findings < 1:
            raise InvalidInput("--specfuzz-max-findings", self.max_findings, "a positive integer")
        self.settings = parse_settings(tuple(opt("specfuzz_setting")))
        self.expected = read_signatures(list(opt("specfuzz_expect")) + list(config.getini("specfuzz_expect")))
        self.expected_from = [Path(d) for d in opt("specfuzz_expect_from")]
        for d in self.expected_from:
            if not d.is_dir():
                raise InvalidInput("--specfuzz-expect-from", str(d), "an existing corpus folder")
        self.corpus = Path(opt("specfuzz_corpus") or self._cache_dir(config, "corpus"))
        self.work_dir = Path(opt("specfuzz_work_dir") or self._cache_dir(config, "work"))
        self.spent = 0.0
        self.done: set[str] = set()
        self.reports: dict[str, object] = {}

    @staticmethod
    def _cache_dir(config: pytest.Config, name: str) -> str:
        cache = getattr(config, "cache", None)
        if cache is not None:
            return str(cache.mkdir(f"specfuzz-{name}"))
        return tempfile.mkdtemp(prefix=f"specfuzz-{name}-")

    def item_methods(self) -> tuple[list[str], str | None]:
        """The items' methods (CALIBRATION for speculation off), and why the engine gave
        none (it cannot start, or answered with an error)."""
        if self.methods:
            return [CALIBRATION if m == "none" else m for m in self.methods], None
        from specfuzz.engines.availability import require_engine
        from specfuzz.engines.isolation import IsolatedEngine

        try:
            require_engine(self.engine)
            eng = IsolatedEngine(self.engine, {"inject": self.inject} if self.inject else {})
            try:
                caps = eng.capabilities()
            finally:
                eng.close()
        except Exception as exc:  # noqa: BLE001 - reported by the item, not as a collection error
            return [], f"{type(exc).__name__}: {exc}"
        return [CALIBRATION, *caps.methods], None

    def slice_for(self, item: "SpecfuzzItem") -> float:
        """What is left of the budget over the selected specfuzz items not run yet."""
        left = [i for i in item.session.items if isinstance(i, SpecfuzzItem) and i.nodeid not in self.done]
        return max(MIN_SLICE_S, (self.budget_s - self.spent) / max(1, len(left)))


_PLAN = pytest.StashKey[_Plan]()


class SpecfuzzCollector(pytest.Collector):
    """``specfuzz[<engine>]``: the session's specfuzz items."""

    def collect(self):
        plan = self.config.stash[_PLAN]
        methods, error = plan.item_methods()
        if error is not None:
            return [SpecfuzzItem.from_parent(self, name="engine", method=None, error=error)]
        return [SpecfuzzItem.from_parent(self, name=m, method=m) for m in methods]


class SpecfuzzItem(pytest.Item):
    """One campaign slice: a speculation method, or ``calibration`` (speculation off)."""

    def __init__(self, *, method: str | None, error: str | None = None, **kw) -> None:
        super().__init__(**kw)
        self.method = method
        self.error = error
        self.add_marker(MARKER)

    def runtest(self) -> None:
        from specfuzz.testing import fuzz_engine

        plan = self.config.stash[_PLAN]
        if self.error is not None:
            plan.done.add(self.nodeid)
            raise SpecfuzzFailure(f"specfuzz: engine {plan.engine} gave no speculation methods: {self.error}")
        slice_s = plan.slice_for(self)
        t0 = time.monotonic()
        try:
            report = fuzz_engine(
                plan.engine, budget=slice_s, methods="none" if self.method == CALIBRATION else [self.method],
                corpus=plan.corpus, expected=() if self.config.getoption("runxfail") else plan.expected,
                expected_from=() if self.config.getoption("runxfail") else plan.expected_from,
                inject=plan.inject, seed=plan.seed, samples=plan.samples, max_vocab=plan.max_vocab,
                engine_settings=plan.settings, work_dir=plan.work_dir, max_findings=plan.max_findings)
        finally:
            plan.spent += time.monotonic() - t0
            plan.done.add(self.nodeid)
        plan.reports[self.nodeid] = report
        # A report section, not user_properties: pytest writes those as per-testcase
        # <properties>, which the JUnit schema CI servers validate against does not allow.
        self.add_report_section("call", "specfuzz", report.summary())
        if not report.ok:
            raise SpecfuzzFailure(report.failure_text())
        if report.expected_met:
            pytest.xfail("expected (known open bugs met again): "
                         + "; ".join(f"{f.path.name}: {f.title}"[:160] for f in report.expected_met))

    def repr_failure(self, excinfo, style=None):
        from specfuzz.errors import SpecfuzzError

        if isinstance(excinfo.value, SpecfuzzFailure):
            return str(excinfo.value)
        if isinstance(excinfo.value, SpecfuzzError):  # bad input: one line
            return f"specfuzz: {excinfo.value}"
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        plan = self.config.stash[_PLAN]
        what = "speculation off" if self.method == CALIBRATION else self.method
        return self.path, None, f"specfuzz[{plan.engine}] {what}"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    """Add the specfuzz items (before -k / -m select among all items)."""
    if _PLAN not in config.stash:
        return
    plan = config.stash[_PLAN]
    name = f"specfuzz[{plan.engine}]"
    collector = SpecfuzzCollector.from_parent(session, name=name, nodeid=name)
    items.extend(collector.collect())


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    if _PLAN not in config.stash or not config.stash[_PLAN].reports:
        return
    terminalreporter.section("specfuzz")
    for nodeid, report in config.stash[_PLAN].reports.items():
        terminalreporter.write_line(f"{nodeid}: {report.summary()}")
