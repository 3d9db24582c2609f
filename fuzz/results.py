"""Machine-readable results of ``specfuzz fuzz`` and ``replay``: JSON and JUnit XML.

The commands build one :class:`RunResults` (a list of :class:`CaseResult`, one per JUnit
test case) and hand it to the writers here; the console output is separate. JSON
follows ``docs/results-schema.json`` (shipped in the package as
``specfuzz.schemas/results-schema.json``); JUnit XML follows the JUnit schema Jenkins'
xUnit plugin and pytest use (``junit-10.xsd``), which GitLab, GitHub reporters and
Azure Pipelines read too.

Test cases per command:

- ``fuzz``: one per corpus entry the campaign met (new: ``failed``, with the drafted
  ``ISSUE.md`` as the failure text; known and met again: ``skipped``, type
  ``specfuzz.known``), plus ``campaign``: ``passed``, or ``error`` when the engine
  could not start.
- ``replay``: one per replayed entry: ``passed`` when it no longer fails, ``failed``
  when it still fails or crashes.
- ``triage`` (JUnit only; its JSON is ``docs/triage-schema.json``): one per entry:
  ``passed`` when fixed, ``skipped`` when flaky, ``failed`` when open.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

RESULTS_SCHEMA_VERSION = 1
RESULTS_SCHEMA = "results-schema.json"
STATUSES = ("passed", "failed", "error", "skipped")
# JUnit element per non-passing status, and the type attribute it carries.
_JUNIT_ELEMENT = {"failed": "failure", "error": "error", "skipped": "skipped"}
# Characters XML 1.0 cannot hold (engine logs carry terminal control codes).
_NOT_XML = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


@dataclass(frozen=True)
class CaseResult:
    """One test case: a corpus entry met or replayed, or the campaign itself."""

    name: str
    classname: str
    status: str  # one of STATUSES
    seconds: float = 0.0
    message: str = ""  # one line
    text: str = ""  # the long form: the drafted ISSUE.md of a finding, a crash's log tail
    type: str = ""  # e.g. specfuzz.finding, specfuzz.known, specfuzz.engine_unavailable
    entry: str | None = None  # the corpus entry's path
    signature: str | None = None
    kind: str | None = None  # finding, crash, calibration, regression
    new: bool | None = None
    properties: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r}: one of {STATUSES}")

    def to_json(self) -> dict:
        return {"name": self.name, "classname": self.classname, "status": self.status,
                "seconds": round(float(self.seconds), 3), "message": self.message, "text": self.text,
                "type": self.type, "entry": self.entry, "signature": self.signature, "kind": self.kind,
                "new": self.new, "properties": {str(k): str(v) for k, v in self.properties.items()}}


@dataclass(frozen=True)
class RunResults:
    command: str  # fuzz, replay, triage
    exit_code: int
    summary: str  # one line
    seconds: float
    cases: tuple[CaseResult, ...]
    engine: Mapping[str, Any] = field(default_factory=dict)  # name, version, device, ... (fuzz, replay)
    corpus: str | None = None
    stats: Mapping[str, Any] = field(default_factory=dict)
    coverage: Mapping[str, Any] | None = None  # fuzz: speculation events exercised (fuzz/coverage.py)
    started: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat())

    def count(self, status: str) -> int:
        return sum(c.status == status for c in self.cases)

    def to_json(self) -> dict:
        import specfuzz

        return {
            "schema_version": RESULTS_SCHEMA_VERSION,
            "command": self.command,
            "specfuzz_version": specfuzz.__version__,
            "started": self.started,
            "seconds": round(float(self.seconds), 3),
            "exit_code": int(self.exit_code),
            "summary": self.summary,
            "engine": {str(k): v for k, v in self.engine.items()},
            "corpus": self.corpus,
            "stats": dict(self.stats),
            "counts": {s: self.count(s) for s in STATUSES},
            "results": [c.to_json() for c in self.cases],
            **({"coverage": dict(self.coverage)} if self.coverage is not None else {}),
        }


def write_json(results: RunResults, path: Path | str) -> None:
    write_text(path, json.dumps(results.to_json(), indent=1, ensure_ascii=False, allow_nan=False) + "\n")


def _xml_text(s: str) -> str:
    return _NOT_XML.sub("\ufffd", str(s))


def _time(seconds: float) -> str:
    return f"{max(0.0, float(seconds)):.3f}"  # the schema's SUREFIRE_TIME: digits, at most 3 decimals


def junit_tree(results: RunResults, suite_name: str | None = None) -> ET.ElementTree:
    """The results as a JUnit ``<testsuites>`` document with one ``<testsuite>``."""
    name = suite_name or " ".join(["specfuzz", results.command] + ([str(results.engine["name"])] if results.engine.get("name") else []))
    counts = {"tests": str(len(results.cases)), "failures": str(results.count("failed")),
              "errors": str(results.count("error"))}
    root = ET.Element("testsuites", {"name": "specfuzz", **counts, "time": _time(results.seconds)})
    suite = ET.SubElement(root, "testsuite", {"name": _xml_text(name), **counts, "skipped": str(results.count("skipped")),
                                              "time": _time(results.seconds), "timestamp": results.started})
    props = ET.SubElement(suite, "properties")
    for k, v in [("command", results.command), ("exit_code", str(results.exit_code)),
                 ("corpus", results.corpus or "")] + [(f"engine.{k}", str(v)) for k, v in results.engine.items()] \
            + [(f"stats.{k}", json.dumps(v) if isinstance(v, (dict, list)) else str(v)) for k, v in results.stats.items()]:
        ET.SubElement(props, "property", {"name": _xml_text(k), "value": _xml_text(v)})
    for c in results.cases:
        tc = ET.SubElement(suite, "testcase", {"name": _xml_text(c.name), "classname": _xml_text(c.classname),
                                               "time": _time(c.seconds)})
        if c.status != "passed":
            el = ET.SubElement(tc, _JUNIT_ELEMENT[c.status], {"message": _xml_text(c.message),
                                                              "type": _xml_text(c.type or f"specfuzz.{c.status}")})
            el.text = _xml_text(c.text or c.message)
        # junit-10.xsd has no per-testcase properties: the entry's identity goes to its system-out.
        facts = {**({"entry": c.entry} if c.entry else {}), **({"signature": c.signature} if c.signature else {}),
                 **({"kind": c.kind} if c.kind else {}), **({"new": str(c.new).lower()} if c.new is not None else {}),
                 **c.properties}
        if facts:
            so = ET.SubElement(tc, "system-out")
            so.text = _xml_text("\n".join(f"{k}: {v}" for k, v in facts.items()))
    out = ET.SubElement(suite, "system-out")
    out.text = _xml_text(results.summary)
    return ET.ElementTree(root)


def junit_xml(results: RunResults, suite_name: str | None = None) -> str:
    tree = junit_tree(results, suite_name)
    ET.indent(tree, space=" ")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(tree.getroot(), encoding="unicode") + "\n"


def write_junit(results: RunResults, path: Path | str, suite_name: str | None = None) -> None:
    write_text(path, junit_xml(results, suite_name))


def write_reports(results: RunResults, *, json_path: Path | str | None, junit_path: Path | str | None) -> None:
    """Write whichever of the two reports were asked for."""
    if json_path:
        write_json(results, json_path)
    if junit_path:
        write_junit(results, junit_path)


def write_text(path: Path | str, text: str) -> None:
    """Write a report whole or not at all (a temporary file renamed over it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def schema_path(name: str = RESULTS_SCHEMA) -> Path:
    """A JSON schema shipped with specfuzz (``docs/`` in the source tree)."""
    from importlib.resources import files

    return Path(str(files("specfuzz.schemas") / name))


def load_schema(name: str = RESULTS_SCHEMA) -> dict:
    return json.loads(schema_path(name).read_text(encoding="utf-8"))


def entry_case(classname: str, path: Path, entry, status: str, *, message: str, text: str = "", type: str = "",
               new: bool | None = None, seconds: float = 0.0, properties: Mapping[str, str] | None = None) -> CaseResult:
    """A test case for one corpus entry (its file stem is the name)."""
    return CaseResult(name=Path(path).stem, classname=classname, status=status, seconds=seconds, message=message,
                      text=text, type=type, entry=str(path), signature=entry.signature, kind=entry.kind, new=new,
                      properties=dict(properties or {}))


def stats_json(stats, fields: Sequence[str] = ("cases", "patterns", "samples", "findings_new", "findings_updated",
                                               "crashes", "engine_starts", "swaps", "swap_fallbacks", "searches",
                                               "rejected", "refused", "calibration_checks", "calibration_known",
                                               "finding_checks", "findings_known", "shrunk_known", "state_resets", "resource_refusals")) -> dict:
    """The numeric counters of a campaign's stats (the ones that exist)."""
    return {f: int(getattr(stats, f)) for f in fields if isinstance(getattr(stats, f, None), (int, float))}


# ----------------------------------------------------------------------------- builders


def _kind_type(kind: str) -> str:
    return f"specfuzz.{kind}"


def fuzz_results(*, engine: str, engine_info: Mapping[str, Any], corpus: Path | str, stats, met: Sequence,
                 seconds: float, exit_code: int, engine_error: str | None = None, draft: bool = True,
                 drafts_dir: Path | str | None = None, coverage: Mapping | None = None) -> RunResults:
    """A campaign run's results: one case per met entry, plus ``campaign``.

    ``met``: :class:`specfuzz.fuzz.outcome.Met` items. New bugs fail with their drafted
    ISSUE.md (``draft=True``; the drafts are kept in ``drafts_dir`` when given) as the
    text; known entries met again, and known crashes stored under a new signature, are
    skipped (known). ``coverage``: the campaign state's coverage data (fuzz/coverage.py),
    reported per method and event."""
    from specfuzz.fuzz.outcome import draft_text

    classname = f"specfuzz.fuzz.{engine}"
    cases = []
    for m in met:
        if m.is_new_bug:
            cases.append(entry_case(classname, m.path, m.entry, "failed", message=m.title, new=True,
                                    text=draft_text(m, drafts_dir) if draft else m.entry.evidence, type=_kind_type(m.kind),
                                    properties={"method": m.method}))
        elif m.new:  # a known crash under other settings: stored under its own signature, the same bug
            cases.append(entry_case(classname, m.path, m.entry, "skipped", new=True, type="specfuzz.known",
                                    message=f"known crash (as {m.same_as}) met under other settings: {m.title}"[:300],
                                    text=m.entry.evidence, properties={"method": m.method, "same_as": m.same_as}))
        else:
            cases.append(entry_case(classname, m.path, m.entry, "skipped", new=False, type="specfuzz.known",
                                    message=f"known {m.kind} met again (seen {m.entry.times_seen} times): {m.title}"[:300],
                                    text=m.entry.evidence, properties={"method": m.method}))
    new = sum(m.is_new_bug for m in met)
    if engine_error:
        summary = engine_error
        cases.append(CaseResult("campaign", classname, "error", seconds, message=summary[:300], text=engine_error,
                                type="specfuzz.engine_unavailable"))
    else:
        summary = (f"{stats.cases} families, {stats.patterns} request patterns, {stats.samples} samples, "
                   f"{stats.engine_starts} engine starts in {seconds:.0f} s: {new} new entries, {len(met) - new} known met again")
        cases.append(CaseResult("campaign", classname, "passed", seconds, message=summary))
    report = None
    if coverage and coverage.get("methods"):
        from specfuzz.fuzz.coverage import Coverage

        report = Coverage(json.loads(json.dumps(coverage))).report()
    return RunResults("fuzz", exit_code, summary, seconds, tuple(cases), engine=dict(engine_info) or {"name": engine},
                      corpus=str(corpus), stats=stats_json(stats), coverage=report)


@dataclass(frozen=True)
class ReplayRow:
    """One replayed entry: ``outcome`` is passes, still fails, crash, or unavailable."""

    path: Path
    entry: Any
    engine: str
    outcome: str
    detail: str = ""
    seconds: float = 0.0


def replay_results(rows: Sequence[ReplayRow], *, engine: str | None, seconds: float, exit_code: int) -> RunResults:
    cases = []
    for r in rows:
        classname = f"specfuzz.replay.{r.engine}"
        stored = f"{r.entry.kind}/{r.entry.label}"
        if r.outcome == "passes":
            cases.append(entry_case(classname, r.path, r.entry, "passed", seconds=r.seconds,
                                    message=f"no longer fails ({stored}): {r.detail}"))
        elif r.outcome == "unavailable":
            cases.append(entry_case(classname, r.path, r.entry, "error", seconds=r.seconds, type="specfuzz.engine_unavailable",
                                    message=r.detail[:300], text=r.detail))
        else:
            cases.append(entry_case(classname, r.path, r.entry, "failed", seconds=r.seconds, type="specfuzz.still_fails",
                                    message=f"{r.outcome} ({stored}): {r.detail}"[:300],
                                    text=f"{r.detail}\n\nstored evidence: {r.entry.evidence}"))
    still = sum(r.outcome not in ("passes", "unavailable") for r in rows)
    unavailable = sum(r.outcome == "unavailable" for r in rows)
    summary = f"{still} of {len(rows)} entries still fail" + (f", {unavailable} not run (engine could not start)" if unavailable else "")
    return RunResults("replay", exit_code, summary, seconds, tuple(cases), engine={"name": engine} if engine else {},
                      stats={"entries": len(rows), "still_failing": still, "unavailable": unavailable})


def triage_results(report, seconds: float = 0.0) -> RunResults:
    """JUnit view of a triage report: fixed entries pass, flaky ones are skipped, open ones fail."""
    cases = []
    for g in report.groups:
        for r in g.reports:
            e = r.entry
            engine = str(e.engine.get("name", "?"))
            classname = f"specfuzz.triage.{engine}"
            line = f"{e.kind}/{e.label or '-'} ({r.condition.label()}): {e.evidence}"[:300]
            path = Path(report.root) / r.rel
            if e.status == "fixed":
                cases.append(entry_case(classname, path, e, "passed", message=line))
            elif e.status == "flaky":
                cases.append(entry_case(classname, path, e, "skipped", message=line, type="specfuzz.flaky"))
            else:
                cases.append(entry_case(classname, path, e, "failed", message=line, type=f"specfuzz.{e.status}",
                                        text=f"{e.extra.get('title') or line}\n\nevidence: {e.evidence}\nfirst seen {e.first_seen}, "
                                             f"last seen {e.last_seen}, seen {e.times_seen} times"))
    summary = f"{len(report.reports)} entries in {len(report.groups)} signature groups, {len(report.skipped)} files skipped"
    return RunResults("triage", 0, summary, seconds, tuple(cases), corpus=str(report.root))
