"""The commands on stored corpus entries: ``replay`` (do they still fail?) and ``shrink``
(make a stored entry smaller while it still reproduces)."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import rich_click as click
from rich.table import Table

from specfuzz.cli_common import console, engine_for_entry, engine_kwargs_for, require_engine
from specfuzz.cli_input import (
    ALPHA, COUNT, DURATION, ENGINE, SEED, WRITABLE_DIR, Number, bug_choice, read_entry_file,
)


@click.command("replay")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--engine", default=None, type=ENGINE, help="Engine to replay on (default: each entry's own; regression entries: the reference with their bug).")
@click.option("--inject", default=None, type=bug_choice(), help="With --engine reference: inject this class instead.")
@click.option("--samples", default=2000, show_default=True, type=COUNT)
@click.option("--alpha", default=1e-3, show_default=True, type=ALPHA)
@click.option("--seed", default=12345, show_default=True, type=SEED, help="Fresh samples: a seed the campaign did not use.")
@click.option("--work-dir", default=".specfuzz-cache", show_default=True, type=WRITABLE_DIR)
@click.option("--check", is_flag=True, help="Exit 1 if any entry still fails (a gate for a fixed engine).")
@click.option("--junit-xml", "junit_out", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Write a JUnit XML report here: a test per entry, failed while it still fails.")
@click.option("--json", "json_out", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Write a JSON report here (schema: docs/results-schema.json).")
def replay_cmd(paths, engine, inject, samples, alpha, seed, work_dir, check, junit_out, json_out) -> None:
    """Re-run stored corpus entries (files or folders) and report which still fail.

    Exit status: 1 with --check when an entry still fails (or crashes); 3 when an
    entry's engine could not start at all (its entries are not counted as failing);
    2 bad input; else 0.

    Example: specfuzz replay corpus/h200/sglang --check --junit-xml replay.xml
    """
    from specfuzz.case import Case
    from specfuzz.engines.availability import require_engine, start_error
    from specfuzz.engines.isolation import EngineCrash, IsolatedEngine
    from specfuzz.errors import EngineUnavailable
    from specfuzz.exitcodes import finish, for_replay
    from specfuzz.cli_input import entry_problem
    from specfuzz.fuzz.corpus import Corpus, Entry
    from specfuzz.fuzz.results import ReplayRow, replay_results, write_reports
    from specfuzz.fuzz.run import entry_replay_calls, run_case

    t0 = time.monotonic()
    items: list[tuple[Path, Entry]] = []
    skipped: list[str] = []
    for p in paths:
        if p.is_dir():
            for path, e in Corpus(p).entries():
                if isinstance(e, Entry) and entry_problem(e.to_json()) is None:
                    items.append((path, e))
                else:
                    skipped.append(f"[yellow]skipped[/yellow] {path}: {e if not isinstance(e, Entry) else 'no case'}")
        elif p.exists():
            items.append((p, read_entry_file(p, "PATHS")))  # a file named on its own must be an entry
        else:
            raise click.BadParameter(f"{str(p)!r}: no such file or folder; a corpus entry file or a folder of them",
                                     param_hint="PATHS")
    if not items:
        raise click.BadParameter(f"{', '.join(map(str, paths))!r}: no corpus entries found ({len(skipped)} files skipped); "
                                 "a corpus entry file or a folder holding some", param_hint="PATHS")
    specs = {}
    for path, e in items:
        specs[path] = (engine, engine_kwargs_for(engine, inject)) if engine else engine_for_entry(e)
    for line in skipped:
        console.print(line)
    t = Table(title="replay")
    for col in ("entry", "engine", "stored", "now", "samples", "e-value", "attribution"):
        t.add_column(col)
    engines: dict[tuple, IsolatedEngine] = {}
    down: dict[tuple, str] = {}  # engines that cannot start here, with the reason
    rows: list[ReplayRow] = []
    row_keys: list[tuple] = []  # the engine key of each row
    try:
        for path, e in items:
            spec, kw = specs[path]
            key = (spec, tuple(sorted(kw.items())))
            label = spec + (f"+{kw['inject']}" if kw.get("inject") else "")
            stored = f"{e.kind}/{e.label}"
            t1 = time.monotonic()
            if key not in engines and key not in down:
                try:
                    require_engine(spec)
                    engines[key] = IsolatedEngine(spec, kw, log_dir=work_dir / "logs")
                    engines[key].capabilities()
                except EngineUnavailable as exc:
                    down[key] = str(exc)
                except EngineCrash as exc:
                    down[key] = f"engine {label!r} could not start: {exc}"
                    engines.pop(key, None)
            row_keys.append(key)
            if key in down:
                rows.append(ReplayRow(path, e, label, "unavailable", down[key]))
                t.add_row(path.name, label, stored, "engine could not start", "-", "-", "-")
                continue
            eng = engines[key]
            case = Case.from_json(e.case)
            profile = eng.capabilities().profile
            run = run_case(eng, case, ckpt_root=work_dir / "checkpoints", alpha=alpha, max_samples=samples,
                           seed=seed, profile=profile, speculation=e.kind != "calibration", **entry_replay_calls(e))
            if run.crash is not None:
                now, ev, attr = f"crash ({run.crash.kind})", "-", "-"
                detail = f"engine {run.crash.kind}: {run.crash.detail}"
            else:
                j = run.judgement
                now = "still fails" if j.failed else "passes"
                ev = f"{j.verdict.e_value:.3g}"
                attr = j.attribution.label if j.attribution else "-"
                detail = j.verdict.evidence
            rows.append(ReplayRow(path, e, label, now, detail, time.monotonic() - t1))
            t.add_row(path.name, label, stored, now, str(run.n), ev, attr)
    finally:
        for eng in engines.values():
            eng.close()
    # An engine whose every entry crashed without one successful start: can it start at all?
    for key, eng in engines.items():
        mine = [i for i, k in enumerate(row_keys) if k == key]
        if eng.starts == 0 and mine and all(rows[i].outcome.startswith("crash") for i in mine):
            reason = start_error(key[0], dict(key[1]), work_dir=work_dir)
            if reason:
                for i in mine:
                    r = rows[i]
                    rows[i] = ReplayRow(r.path, r.entry, r.engine, "unavailable",
                                        f"engine {r.engine!r} could not start: {reason}", r.seconds)
    console.print(t)
    still = sum(r.outcome not in ("passes", "unavailable") for r in rows)
    unavailable = [r for r in rows if r.outcome == "unavailable"]
    console.print(f"{still} of {len(items)} entries still fail")
    for r in unavailable:
        click.echo(f"error: {r.path.name}: {r.detail}", err=True)
    code = for_replay(still, len(unavailable), check=check)
    if junit_out or json_out:
        results = replay_results(rows, engine=engine, seconds=time.monotonic() - t0, exit_code=int(code))
        write_reports(results, json_path=json_out, junit_path=junit_out)
    finish(code)


def _raise_keyboard_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@click.command("shrink")
@click.argument("entry_path", type=click.Path(path_type=Path))
@click.option("--engine", default=None, type=ENGINE, help="Engine to shrink on (default: the entry's own).")
@click.option("--inject", default=None, type=bug_choice(), help="With --engine reference: inject this class.")
@click.option("--budget", default="10m", show_default=True, type=DURATION, help="Time budget: 90s, 10m, 2h.")
@click.option("--samples", default=2000, show_default=True, type=COUNT, help="Samples per candidate (findings and calibration entries).")
@click.option("--alpha", default=1e-3, show_default=True, type=ALPHA, help="Level of each candidate's test (findings).")
@click.option("--seed", default=54321, show_default=True, type=SEED)
@click.option("--work-dir", default=".specfuzz-cache", show_default=True, type=WRITABLE_DIR)
@click.option("--attempts", default=1, show_default=True, type=Number(1, 20, integer=True),
              help="Runs per candidate before it counts as not reproducing (for crashes that do not happen every time).")
@click.option("--dry-run", is_flag=True, help="Report the shrunk case; do not write it into the corpus.")
def shrink_cmd(entry_path, engine, inject, budget, samples, alpha, seed, work_dir, attempts, dry_run) -> None:
    """Shrink a stored entry on its engine while it still reproduces.

    Greedy: smaller vocabulary, prompt, output, K, tree and sampling settings while the
    entry still reproduces; the result is stored in the entry's folder: a crash stored unshrunk is replaced (its old case kept in the entry).
    A crash that records the request patterns of its crashing batch is shrunk with them
    mixed in each engine call, as it was found: patterns are dropped while it still crashes.

    Example: specfuzz shrink corpus/crash-1234abcd.json --budget 30m --attempts 3
    """
    from specfuzz.engines.isolation import EngineCrash, IsolatedEngine
    from specfuzz.cli_input import writable_dir_problem
    from specfuzz.fuzz.corpus import Corpus, atomic_write_json
    from specfuzz.fuzz.run import crash_entry, entry_replay_calls, finding_entry, start_key
    from specfuzz.fuzz.shrink import entry_family, entry_reproducer, seen_tokens, shrink_family
    from specfuzz.fuzz.triage import entry_dtype, entry_settings

    entry = read_entry_file(entry_path, "ENTRY")
    if entry.kind not in ("crash", "finding", "calibration", "regression"):
        raise click.BadParameter(f"{entry_path}: kind {entry.kind!r} cannot be shrunk", param_hint="ENTRY")
    if not dry_run:
        why = writable_dir_problem(entry_path.parent)
        if why is not None:
            raise click.BadParameter(f"{str(entry_path)!r}: its folder is {why}; an entry in a folder specfuzz can "
                                     "write in (or --dry-run)", param_hint="ENTRY")
    spec, kw = (engine, engine_kwargs_for(engine, inject)) if engine else engine_for_entry(entry)
    budget_s = float(budget)
    dtype, settings = entry_dtype(entry), entry_settings(entry) or None
    # A crash's whole crashing batch (extra.batch_patterns), mixed as found; otherwise the case alone.
    family = entry_family(entry)
    require_engine(spec)  # a missing engine package: exit 3, not a stored "crash"
    eng = IsolatedEngine(spec, kw, log_dir=work_dir / "logs")
    prev_term = None
    try:
        repro = entry_reproducer(entry, eng, work_dir=work_dir, samples=samples, alpha=alpha, seed=seed,
                                 dtype=dtype, settings=settings, attempts=attempts)
        mixed = f" ({len(family)} request patterns mixed in each call, as found)" if len(family) > 1 else ""
        console.print(f"checking that {entry_path.name} reproduces on {spec}{mixed} ...")
        first = repro(family)
        try:
            eng.version()  # cached now, while an engine runs: the stored entry's GPU/driver details
        except EngineCrash:
            pass  # the first run crashed the engine: crash_entry falls back to the engine's name
        # SIGTERM (a lease's timeout, a job scheduler) stops shrinking like Ctrl-C: the
        # reductions confirmed so far are stored, not lost with the process.
        try:
            prev_term = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
        except ValueError:  # not the main thread (an embedding caller): leave signals alone
            prev_term = None
        if not first:
            seen = list(dict.fromkeys(getattr(repro, "misses", [])))  # distinct, in order
            console.print(f"[yellow]{entry_path.name} does not reproduce on {spec} in {attempts} attempt(s): "
                          f"nothing to shrink (a crash that comes and goes: try --attempts 5)[/yellow]"
                          + "".join(f"\n  seen instead: {m}" for m in seen[-5:]), highlight=False, soft_wrap=True)
            sys.exit(1)
        # A finding's candidates run on one engine that swaps tables: each pass runs those it
        # serves by a swap first, then the others grouped by the start they need (a crash's
        # candidates each start a fresh process anyway).
        speculating = entry.kind != "calibration"
        grouped = None if entry.kind == "crash" else (
            lambda f: start_key(f[0], speculation=speculating, family=f[1:]))
        res = shrink_family(family, repro, budget_s=budget_s, log=lambda m: console.print(f"  {m}"),
                            speculation=speculating, start_key=grouped,
                            seen=seen_tokens(first))
        if res.last_run is None:
            res.last_run = first
        console.print(f"{res.kept} reductions kept of {res.tried} tried in {res.seconds:.0f} s"
                      + (" (interrupted: not minimal yet)" if res.interrupted else
                         " (budget exhausted: not minimal yet)" if res.budget_exhausted else " (no smaller candidate reproduces)"))
        c = res.case
        console.print(f"shrunk case: V={c.vocab_size}, prompt {list(c.prompt)}, params {c.params.to_json()}, "
                      f"spec {None if c.spec is None else c.spec.to_json()}")
        for i, other in enumerate(res.family[1:], start=2):
            console.print(f"  batch pattern {i} of {len(res.family)}: prompt {list(other.prompt)}, params {other.params.to_json()}")
        if dry_run or not res.kept:
            return
        run = res.last_run
        if entry.kind == "crash":
            crash = run if isinstance(run, EngineCrash) else run.crash
            # The patterns left (batch_patterns when more than one) and the calls they crashed in.
            calls = entry_replay_calls(entry)
            new = crash_entry(eng, c, crash, spec, dtype=dtype, settings=settings, launch=getattr(run, "launch", None),
                              family=res.family, batch=calls["batch"], call_prompt_tokens=calls["call_prompt_tokens"])
        else:
            new = finding_entry(dict(eng.version()), run, None)
            new.kind = entry.kind if entry.kind == "calibration" else new.kind
            new.attribution = new.attribution if entry.kind != "calibration" else None
        for k in ("title", "note", "mechanism", "root_cause", "workaround", "upstream", "where_seen"):
            if k in entry.extra:
                new.extra[k] = entry.extra[k]
        # A second pass on an entry `specfuzz shrink` made continues it: its record adds up.
        prev = entry.extra.get("shrunk_by") if isinstance(entry.extra.get("shrunk_by"), dict) else {}
        new.extra.update(shrunk=True, shrunk_from=entry_path.name,
                         shrunk_by={"command": "specfuzz shrink", "steps": list(prev.get("steps", [])) + res.steps,
                                    "tried": int(prev.get("tried", 0)) + res.tried,
                                    "seconds": round(float(prev.get("seconds", 0.0)) + res.seconds, 1),
                                    "passes": int(prev.get("passes", 1)) + 1 if prev else 1,
                                    "minimal": not res.budget_exhausted and not res.interrupted})
        path, is_new = Corpus(entry_path.parent).store(new)
        if path.resolve() != entry_path.resolve():
            # The smaller case has another signature (fewer features in play): the old entry
            # stays, pointing at its shrunk version.
            old = json.loads(entry_path.read_text())
            old.setdefault("extra", {})["shrunk_into"] = path.name
            atomic_write_json(entry_path, old)
        console.print(f"stored {path} ({'new entry; ' + entry_path.name + ' points at it' if is_new else 'replaced, old case kept in it'})")
    finally:
        if prev_term is not None:
            signal.signal(signal.SIGTERM, prev_term)
        eng.close()


