"""Re-running corpus entries on the installed engine (``specfuzz triage --rerun``, ``bisect``).

:class:`Rerunner` runs an entry's stored case again on its engine (one isolated engine per
engine spec, reused), :func:`status_after_rerun` turns one or two runs into the entry's new
status (confirmed, flaky, fixed), and :func:`update_entry_file` writes it into the entry's
file atomically, changing nothing else.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from specfuzz.fuzz.corpus import STATUSES, Entry, atomic_write_json, now_iso
from specfuzz.fuzz.triage import TriageReport, _clip, _finite_or_text, entry_dtype, entry_settings, group_reports

# Second re-run of an entry that passed its first: seeds this far from the first run's.
SECOND_RUN_SEED_OFFSET = 1_000_003


@dataclass(frozen=True)
class RunOutcome:
    """One re-run: ``outcome`` is "fail", "pass", "crash" or "error" (could not run)."""

    outcome: str
    seed: int
    n: int = 0
    log_e: float | None = None
    detail: str = ""

    def to_json(self) -> dict:
        return {"outcome": self.outcome, "seed": self.seed, "n": self.n, "log_e": _finite_or_text(self.log_e),
                "detail": self.detail}


def status_after_rerun(entry: Entry, first: RunOutcome, second: RunOutcome | None) -> str | None:
    """The new status of an entry given its re-runs (None: leave it as it is).

    * crash entries: the crash reproduces -> confirmed; it does not, but does on a second
      run with other seeds -> flaky; neither -> fixed;
    * other entries: still fails (or now crashes) -> confirmed; passes now but failed when
      found -> flaky if a second run with other seeds fails, else fixed.
    A run that could not be done ("error") changes nothing.
    """
    bad = "crash" if entry.kind == "crash" else "fail"
    broken = {bad} if entry.kind == "crash" else {"fail", "crash"}
    if first.outcome == "error":
        return None
    if first.outcome in broken:
        return "confirmed"
    if second is None or second.outcome == "error":
        return None
    return "flaky" if second.outcome in broken else "fixed"


def needs_second_run(entry: Entry, first: RunOutcome) -> bool:
    if first.outcome == "error":
        return False
    if entry.kind == "crash":
        return first.outcome != "crash"
    return first.outcome == "pass"


class Rerunner:
    """Re-runs entries on their engines (one IsolatedEngine per engine spec, reused)."""

    def __init__(self, *, samples: int, alpha: float, seed: int, work_dir: Path,
                 engine: str | None = None, log: Callable[[str], None] | None = None) -> None:
        self.samples = samples
        self.alpha = alpha
        self.seed = seed
        self.work_dir = Path(work_dir)
        self.engine = engine
        self.log = log or (lambda s: None)
        self._engines: dict[tuple, Any] = {}

    def close(self) -> None:
        for eng in self._engines.values():
            eng.close()
        self._engines.clear()

    def __enter__(self) -> "Rerunner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def engine_spec(self, entry: Entry) -> tuple[str, dict]:
        from specfuzz.cli import engine_for_entry

        if self.engine:
            return self.engine, {}
        return engine_for_entry(entry)

    def _engine(self, spec: str, kw: dict):
        from specfuzz.engines.isolation import IsolatedEngine

        key = (spec, tuple(sorted(kw.items())))
        if key not in self._engines:
            self._engines[key] = IsolatedEngine(spec, kw, log_dir=self.work_dir / "logs")
        return self._engines[key]

    def run_once(self, entry: Entry, seed: int) -> RunOutcome:
        from specfuzz.case import Case
        from specfuzz.engines.isolation import EngineCrash
        from specfuzz.errors import InvalidInput, SpecfuzzError
        from specfuzz.fuzz.run import entry_replay_calls, run_case

        try:
            spec, kw = self.engine_spec(entry)
            eng = self._engine(spec, kw)
            case = Case.from_json(entry.case)
            if entry.kind == "crash" and entry.extra.get("sequence"):
                return self._run_sequence(eng, entry, case, seed)
            profile = eng.capabilities().profile
            run = run_case(eng, case, ckpt_root=self.work_dir / "checkpoints", alpha=self.alpha,
                           max_samples=self.samples, seed=seed, profile=profile,
                           speculation=entry.kind != "calibration", dtype=entry_dtype(entry),
                           settings=entry_settings(entry) or None, **entry_replay_calls(entry))
        except EngineCrash as exc:
            return RunOutcome("crash", seed, 0, None, _clip(str(exc), 300))
        except InvalidInput as exc:  # the engine refuses the case: what it allows says why (the value can be long)
            return RunOutcome("error", seed, 0, None, _clip(f"InvalidInput: {exc.name} refused: {exc.allowed}", 300))
        except (SpecfuzzError, Exception) as exc:  # noqa: BLE001 - an entry that cannot run is reported
            return RunOutcome("error", seed, 0, None, _clip(f"{type(exc).__name__}: {exc}", 300))
        if run.crash is not None:
            return RunOutcome("crash", seed, run.n, None, _clip(str(run.crash), 300))
        j = run.judgement
        if j is None:
            return RunOutcome("error", seed, run.n, None, "no samples drawn")
        return RunOutcome("fail" if j.failed else "pass", seed, run.n, j.verdict.log_e, j.verdict.evidence)

    def _run_sequence(self, eng, entry: Entry, case, seed: int) -> RunOutcome:
        """A crash recorded as a sequence of requests (extra["sequence"]): replay it in order."""
        from specfuzz.engines.base import Request
        from specfuzz.engines.isolation import EngineCrash
        from specfuzz.fuzz.run import engine_config
        from specfuzz.oracle.params import SamplingParams

        cfg = engine_config(case, self.work_dir / "checkpoints", dtype=entry_dtype(entry),
                            settings=entry_settings(entry) or None)
        try:
            eng.start(cfg)
            for i, step in enumerate(entry.extra["sequence"]):
                params = SamplingParams.from_json(step.get("request", step))
                eng.generate([Request(case.prompt, params, seed + i)])
        except EngineCrash as exc:
            return RunOutcome("crash", seed, 0, None, _clip(str(exc), 300))
        return RunOutcome("pass", seed, len(entry.extra["sequence"]), None, "the recorded request sequence ran without a crash")

    def rerun(self, path: Path, entry: Entry) -> dict:
        """Re-confirm one entry and write its new status into its file (atomically)."""
        self.log(f"re-running {path.name} ...")
        first = self.run_once(entry, self.seed)
        second = self.run_once(entry, self.seed + SECOND_RUN_SEED_OFFSET) if needs_second_run(entry, first) else None
        new = status_after_rerun(entry, first, second)
        spec, kw = ("?", {})
        try:
            spec, kw = self.engine_spec(entry)
        except Exception:  # noqa: BLE001
            pass
        record = {
            "at": now_iso(),
            "engine": spec + (f"+{kw['inject']}" if kw.get("inject") else ""),
            "runs": [r.to_json() for r in (first, second) if r is not None],
            "status_before": entry.status,
            "status_after": new or entry.status,
        }
        if new is not None:
            update_entry_file(path, status=new, seen_failing=(first.outcome in ("fail", "crash")), rerun=record)
            entry.status = new
            if first.outcome in ("fail", "crash"):
                entry.last_seen = record["at"]
        self.log(f"  {path.name}: {record['status_before']} -> {record['status_after']} "
                 f"({', '.join(r['outcome'] for r in record['runs'])})")
        return record


def update_entry_file(path: Path, *, status: str, seen_failing: bool, rerun: dict) -> None:
    """Set an entry file's status (and last rerun record) without touching anything else.

    The file is re-read just before the write (a campaign may have updated it meanwhile)
    and replaced atomically; only ``status``, ``last_seen`` (when it failed again) and
    ``extra.last_rerun`` change.
    """
    if status not in STATUSES:
        raise ValueError(f"status={status!r}: one of {STATUSES}")
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    Entry.from_json(data)  # still an entry
    data["status"] = status
    if seen_failing:
        data["last_seen"] = rerun["at"]
    extra = dict(data.get("extra") or {})
    extra["last_rerun"] = rerun
    data["extra"] = extra
    mode = Path(path).stat().st_mode & 0o777
    atomic_write_json(Path(path), data)
    os.chmod(path, mode)  # the temporary file's 0600 would hide the entry from other users


def rerun_corpus(report: TriageReport, rerunner: Rerunner) -> TriageReport:
    """Re-run every entry of a triage report; entries and their files get their new status."""
    for r in report.reports:
        r.rerun = rerunner.rerun(r.path, r.entry)
    report.groups = group_reports(report.reports)
    report.reran = True
    return report
