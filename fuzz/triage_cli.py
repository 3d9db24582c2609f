"""The ``specfuzz triage`` and ``specfuzz draft`` commands (console and JSON output).

The computing is in :mod:`specfuzz.fuzz.triage` and :mod:`specfuzz.fuzz.draft`; this
module parses options and renders.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click
from rich.console import Console

from specfuzz.cli_input import ALPHA, COUNT, DURATION, ENGINE, SEED, WRITABLE_DIR, writable_dir_problem
from rich.table import Table
from rich.text import Text

from specfuzz.fuzz.bisect_cli import env_options, make_envs

# Console width when the output is not a terminal (and COLUMNS is not set).
PIPE_WIDTH = 240
STATUS_STYLES = {"new": "bold yellow", "confirmed": "bold red", "flaky": "magenta", "fixed": "green"}


def _when(iso: str) -> str:
    return iso.replace("T", " ")[:16] if iso else "-"


def _worst(eff) -> str:
    w = eff.worst_token
    if not w:
        return "-"
    ctx = "(" + ",".join(str(t) for t in w.get("context", [])) + ")"
    return f"{ctx}→{w.get('token')}: {float(w.get('observed', 0)):.3f} vs {float(w.get('expected', 0)):.3f}"


def render_triage(report, console: Console) -> None:
    """The triage report as a rich table, one section per signature, then skipped files."""
    from specfuzz.fuzz.corpus import active_features
    from specfuzz.fuzz.triage import format_e_value

    t = Table(title=f"triage: {len(report.reports)} entries in {len(report.groups)} signature groups "
                    f"({report.root})", show_lines=False)
    nw = {"no_wrap": True}
    for col, kw in (("signature", nw), ("entry", nw), ("engine", nw), ("kind", {}), ("method", nw),
                    ("condition broken", {"overflow": "fold", "min_width": 22}), ("class", {}), ("TV", {"justify": "right"}),
                    ("worst token obs vs μ", {}), ("e-value", {"justify": "right", "no_wrap": True}), ("status", {}),
                    ("first seen", nw), ("last seen", nw), ("seen", {"justify": "right"})):
        t.add_column(col, **kw)
    if report.reran:
        t.add_column("re-run")
    if report.latest:
        t.add_column("latest release")
    for gi, g in enumerate(report.groups):
        if gi:
            t.add_section()
        for i, r in enumerate(g.reports):
            e = r.entry
            sig = (g.signature + (f"\n×{len(g.reports)} files" if len(g.reports) > 1 else "")) if i == 0 else ""
            tv = "-" if r.effect.tv is None else f"{r.effect.tv:.3f}"
            ev = format_e_value(r.log_e) if e.verdict else ("crash" if e.kind == "crash" else "-")
            row = [sig, r.rel, _engine_cell(e), e.kind, _method_cell(e.case), r.condition.label(), r.cls or "-",
                   tv, _worst(r.effect), ev, Text(e.status, style=STATUS_STYLES.get(e.status, "")),
                   _when(e.first_seen), _when(e.last_seen), str(e.times_seen)]
            if report.reran:
                rr = r.rerun or {}
                runs = ", ".join(x["outcome"] for x in rr.get("runs", []))
                row.append(f"{runs} → {rr.get('status_after', '-')}" if rr else "-")
            if report.latest:
                lt = r.latest or {}
                row.append(f"skipped: {lt['skipped'][:60]}" if "skipped" in lt else
                           f"{lt.get('version')}: {lt.get('outcome')} → {lt.get('status_after')}" if lt else "-")
            t.add_row(*row)
    console.print(t)
    # Groups that are likely one bug met under several methods (fuzz.triage.likely_same_key).
    for cluster in _clusters(report.groups, lambda g: g.related):
        head = cluster[0].reports[0].entry
        feats = ", ".join(active_features(head.case)) or "no sampling feature"
        console.print(f"likely one bug ({_engine_cell(head)}; {feats}; class {cluster[0].reports[0].cls}), under "
                      + "; ".join(f"{_method_cell(o.reports[0].entry.case)}: {o.signature}" for o in cluster),
                      highlight=False, soft_wrap=True)
    # Groups whose causes were traced to one upstream issue (extra.upstream).
    for cluster in _clusters(report.groups, lambda g: g.same_upstream):
        console.print(f"one upstream bug, {cluster[0].upstream}, under "
                      + "; ".join(f"{o.reports[0].entry.kind} {_method_cell(o.reports[0].entry.case)}: {o.signature}"
                                  for o in cluster), highlight=False, soft_wrap=True)
    for s in report.skipped:
        console.print(f"[yellow]skipped[/yellow] {s.path}: {s.reason}", highlight=False, soft_wrap=True)
    conds = [r for r in report.reports if r.condition.source == "heuristic"]
    if conds:
        console.print("[dim]conditions marked (heuristic) are guesses from the case and the counts, "
                      "not an attribution to a catalogued class[/dim]")


def _clusters(groups, peers_of):
    """Each cluster once, in the report's order: a group with peers (``peers_of(group)``:
    signatures) and those peers."""
    shown: set[str] = set()
    for g in groups:
        peers = peers_of(g)
        if not peers or g.signature in shown:
            continue
        cluster = [g] + [o for o in groups if o.signature in peers]
        shown.update(o.signature for o in cluster)
        yield cluster


def _console() -> Console:
    """The console; when output is not a terminal (a pipe, a file), wide enough for the table."""
    c = Console()
    if not c.is_terminal and "COLUMNS" not in os.environ:
        c = Console(width=PIPE_WIDTH)
    return c


def _engine_cell(e) -> str:
    v = e.engine.get("version")
    return f"{e.engine.get('name', '?')} {v}" if v else str(e.engine.get("name", "?"))


def _method_cell(case: dict) -> str:
    from specfuzz.fuzz.triage import method_label

    return method_label(case)


def _check_latest(report, samples: int, alpha: float, seed: int, work_dir: Path, env_args: tuple, log) -> None:
    """`triage --latest`: every entry re-checked on its engine package's newest installable release."""
    from specfuzz.errors import SpecfuzzError
    from specfuzz.fuzz.bisect import BisectConfig, check_latest
    from specfuzz.fuzz.triage import group_reports

    envs = make_envs(*env_args, log)
    cfg = BisectConfig(samples=samples, alpha=alpha, seed=seed, work_dir=work_dir)
    cache: dict = {}
    for r in report.reports:
        try:
            r.latest = check_latest(r.path, r.entry, envs, cfg, releases_cache=cache, log=log)
        except SpecfuzzError as exc:  # no registry: say so once per entry, change nothing
            r.latest = {"skipped": str(exc)}
        rec = r.latest
        log(f"  {r.rel}: " + (f"skipped ({rec['skipped']})" if "skipped" in rec else
                              f"{rec['package']} {rec['version']}: {rec['outcome']} → {rec['status_after']}"))
    report.groups = group_reports(report.reports)
    report.latest = True


@click.command("triage")
@click.argument("corpus_dir", default="corpus", required=False, type=click.Path(path_type=Path))
@click.option("--rerun", is_flag=True, help="Re-confirm every entry on the installed engine and update its status in place.")
@click.option("--json", "json_out", is_flag=False, flag_value="-", default=None, metavar="[FILE]",
              help="Machine-readable JSON (schema: docs/triage-schema.json) to FILE, or to standard output when FILE is omitted or '-'.")
@click.option("--junit-xml", "junit_out", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Write a JUnit XML report here: a test per entry (fixed: passed, flaky: skipped, open: failed).")
@click.option("--samples", default=2000, show_default=True, type=COUNT, help="--rerun: samples per re-run (fewer if it fails earlier).")
@click.option("--alpha", default=1e-3, show_default=True, type=ALPHA, help="--rerun: level of each re-run's test.")
@click.option("--seed", default=12345, show_default=True, type=SEED, help="--rerun: first request seed (fresh: not the campaign's).")
@click.option("--engine", default=None, type=ENGINE, help="--rerun: run every entry on this engine instead of its own.")
@click.option("--work-dir", default=".specfuzz-cache", show_default=True, type=WRITABLE_DIR)
@click.option("--latest", is_flag=True, help="Re-check every entry on the newest installable release of its engine package "
              "(its own environment, as `specfuzz bisect` makes them) and mark it fixed / still present (confirmed).")
@env_options
def triage_cmd(corpus_dir: Path, rerun: bool, json_out: str | None, junit_out: Path | None, samples: int, alpha: float,
               seed: int, engine: str | None, work_dir: Path, latest: bool, index_url, find_links, env_dir, deps,
               torch_any_build, prebuilt) -> None:
    """Group corpus entries by signature: engine, broken condition, effect size, evidence, status.

    Files in the folder that are not corpus entries (invalid JSON, another schema) are
    listed as skipped and left untouched. Exit status 0 (a report; entries that cannot
    re-run are reported as such), 2 bad input.
    """
    import time

    from specfuzz.fuzz.rerun import Rerunner, rerun_corpus
    from specfuzz.fuzz.triage import triage

    t0 = time.monotonic()
    if json_out not in (None, "-") and Path(json_out).is_dir():
        # `triage --json DIR` (the flag before the folder, as before --json took a FILE)
        corpus_dir, json_out = Path(json_out), "-"
    as_json = json_out == "-"
    err = Console(stderr=True)
    if latest and rerun:
        raise click.BadParameter("--latest re-checks on the newest release, --rerun on the installed engine: one of them",
                                 param_hint="--latest")
    if not corpus_dir.is_dir():
        raise click.BadParameter(f"{str(corpus_dir)!r}: {'not a folder' if corpus_dir.exists() else 'no such folder'}; "
                                 "a corpus folder", param_hint="CORPUS_DIR")
    if rerun or latest:
        why = writable_dir_problem(corpus_dir)
        if why is not None:
            raise click.BadParameter(f"{str(corpus_dir)!r}: {why}; --{'rerun' if rerun else 'latest'} updates entries in place",
                                     param_hint="CORPUS_DIR")
    report = triage(corpus_dir)
    if rerun and report.reports:
        with Rerunner(samples=samples, alpha=alpha, seed=seed, work_dir=work_dir, engine=engine,
                      log=lambda s: err.print(s, highlight=False)) as rr:
            rerun_corpus(report, rr)
    if latest and report.reports:
        _check_latest(report, samples, alpha, seed, work_dir, (index_url, find_links, env_dir, deps, torch_any_build, prebuilt),
                      lambda s: err.print(s, highlight=False, soft_wrap=True))
    if junit_out is not None:
        from specfuzz.fuzz.results import triage_results, write_junit

        write_junit(triage_results(report, time.monotonic() - t0), junit_out)
    text = json.dumps(report.to_json(), indent=1, ensure_ascii=False, allow_nan=False)
    if as_json:
        click.echo(text)
        return
    if json_out is not None:
        from specfuzz.fuzz.results import write_text

        write_text(Path(json_out), text + "\n")
    render_triage(report, _console())


@click.command("draft")
@click.argument("entry", type=click.Path(path_type=Path))
@click.option("--out", "out_dir", default=None, type=WRITABLE_DIR,
              help="Output folder (default: drafts/<entry file stem>/).")
@click.option("--corpus", "corpus_dir", default="corpus", show_default=True, type=click.Path(file_okay=False, path_type=Path),
              help="Where to look ENTRY up when it is a signature or file stem rather than a path.")
@click.option("--samples", default=None, type=COUNT, help="Samples the repro script draws by default (default: chosen per entry).")
@click.option("--top", default=12, show_default=True, type=COUNT, help="Rows of the expected-vs-observed table.")
@click.option("--verify", is_flag=True,
              help="Then run the new repro.py on the installed engine and record what it printed (PASS/FAIL/crash, "
                   "engine version, date) in ISSUE.md.")
@click.option("--verify-timeout", default="15m", show_default=True, type=DURATION, help="--verify: time the repro may run.")
@click.option("--format", "fmt", default="files", show_default=True, type=click.Choice(["files", "github"]),
              help="github: also print the issue ready to paste (title line, labels, the form's address, the body with "
                   "repro.py inlined) on stdout; the summary goes to stderr.")
def draft_cmd(entry: Path, out_dir: Path | None, corpus_dir: Path, samples: int | None, top: int, verify: bool,
              verify_timeout: float, fmt: str) -> None:
    """Draft an upstream issue for a corpus entry: ISSUE.md, plot.png and a standalone repro.py."""
    from specfuzz.cli_input import read_entry_file
    from specfuzz.fuzz.draft import DraftError, draft_entry, resolve_entry
    from specfuzz.fuzz.draft.verify import summary, verify_draft

    try:
        path = resolve_entry(entry, corpus_dir)
    except DraftError as exc:
        raise click.BadParameter(f"{str(entry)!r}: {str(exc).split(': ', 1)[-1]}; a corpus entry file, or a signature "
                                 "or file stem of one under --corpus", param_hint="ENTRY") from None
    entry_obj = read_entry_file(path, "ENTRY")  # a file that is not an entry: one line, exit 2
    if getattr(entry_obj, "kind", None) == "swap":
        raise click.BadParameter(
            f"{str(entry)!r}: a swap entry (stale weights after an in-place table swap: a bug in the engine's weight-update "
            "path, not in its sampler); specfuzz drafts issues for finding, calibration and crash entries only (the entry's "
            "extra.event holds the failed table check and the fresh start's)", param_hint="ENTRY")
    out = out_dir if out_dir is not None else Path("drafts") / path.stem
    if out_dir is None:
        why = writable_dir_problem(out)
        if why is not None:
            raise click.BadParameter(f"{str(out)!r}: {why}; pass --out", param_hint="--out")
    try:
        result = draft_entry(path, out, samples=samples, top=top)
    except DraftError as exc:
        raise click.UsageError(str(exc)) from None
    console = Console(stderr=fmt == "github")
    console.print(f"[bold]{result.title}[/bold]", highlight=False)
    for p in result.files:
        console.print(f"  wrote {p}", highlight=False)
    console.print(f"run the repro: [cyan]python {result.files[-1]}[/cyan]" + (f" ({result.repro_hint})" if result.repro_hint else ""),
                  highlight=False)
    if verify:
        console.print(f"verifying: running {result.files[-1]} on the installed engine ...", highlight=False)
        v = verify_draft(out, timeout_s=verify_timeout)
        console.print(f"repro.py: {summary(v)}; "
                      f"recorded in {out / 'ISSUE.md'}", highlight=False)
    if fmt == "github":
        from specfuzz.fuzz.draft.data import engine_kind
        from specfuzz.fuzz.draft.forms import form_for
        from specfuzz.fuzz.draft.github import github_text

        click.echo(github_text((out / "ISSUE.md").read_text(encoding="utf-8"), (out / "repro.py").read_text(encoding="utf-8"),
                               form_for(engine_kind(entry_obj))))


def main() -> None:  # pragma: no cover - for `python -m specfuzz.fuzz.triage_cli`
    group = click.Group(commands={"triage": triage_cmd, "draft": draft_cmd})
    group(standalone_mode=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
