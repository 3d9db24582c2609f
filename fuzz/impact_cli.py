"""The ``specfuzz impact`` command (registered by :mod:`specfuzz.cli`); the computing is in
:mod:`specfuzz.fuzz.impact`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from specfuzz.cli_input import COUNT


@click.command("impact")
@click.argument("entry", type=click.Path(path_type=Path))
@click.option("--corpus", "corpus_dir", default="corpus", show_default=True, type=click.Path(file_okay=False, path_type=Path),
              help="Where to look ENTRY up when it is a signature or file stem rather than a path.")
@click.option("--prompts", default=8, show_default=True, type=COUNT, help="Built-in prompts (spread over lengths and kinds).")
@click.option("--samples", default=8, show_default=True, type=COUNT, help="Sampled outputs per prompt.")
@click.option("--max-tokens", default=32, show_default=True, type=COUNT, help="Tokens per output.")
@click.option("--alpha", default=1e-3, show_default=True, type=float, help="Level of the sampled test.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--threads", default=1, show_default=True, type=COUNT, help="torch threads (HF engine and the reference).")
@click.option("--cache-dir", default=None, type=click.Path(path_type=Path), help="Where the converted model is kept.")
@click.option("--one-call", is_flag=True,
              help="Send all sampled requests in one engine call (GPU engines: a finding that needs many running requests).")
@click.option("--dry-run", is_flag=True, help="Print what is carried to the real model and what is not; run and write nothing.")
@click.option("--no-redraft", is_flag=True, help="Record in the entry only; leave its drafted ISSUE.md as it is.")
def impact_cmd(entry: Path, corpus_dir: Path, prompts: int, samples: int, max_tokens: int, alpha: float, seed: int,
               threads: int, cache_dir: Path | None, one_call: bool, dry_run: bool, no_redraft: bool) -> None:
    """Run a finding's engine, method, K and sampling settings on the embedded SmolLM2-135M-Instruct with
    `compare`'s exact sampled test and greedy comparison; record the verdict in the entry (extra.impact)
    and in its drafted ISSUE.md. A trigger that cannot be carried to a real model is recorded with why."""
    from specfuzz.cli_input import read_entry_file
    from specfuzz.errors import SpecfuzzError
    from specfuzz.fuzz.draft import DraftError, resolve_entry
    from specfuzz.fuzz.impact import (
        ImpactOptions, draft_dir_of, impact_record, plan_impact, record_in_entry, require_engine, run_impact,
    )

    try:
        path = resolve_entry(entry, corpus_dir)
    except DraftError as exc:
        raise click.BadParameter(f"{str(entry)!r}: {str(exc).split(': ', 1)[-1]}; a corpus entry file, or a signature "
                                 "or file stem of one under --corpus", param_hint="ENTRY") from None
    if not (0.0 < alpha < 1.0):
        raise click.BadParameter(f"{alpha!r}: a number in (0, 1)", param_hint="--alpha")
    ent = read_entry_file(path, "ENTRY")
    try:
        plan = plan_impact(ent)
        if plan.measurable and not dry_run:
            require_engine(plan)
    except SpecfuzzError as exc:
        raise click.BadParameter(f"{str(path)!r}: {exc}", param_hint="ENTRY") from None
    cmd = f"specfuzz impact {path.stem} --prompts {prompts} --samples {samples} --max-tokens {max_tokens}" + \
        (" --one-call" if one_call else "")
    click.echo(f"{path.stem}: carried: {plan.summary() or '-'}", err=True)
    if plan.not_carried:
        click.echo(f"  not carried: {'; '.join(plan.not_carried)}", err=True)
    if not plan.measurable:
        click.echo(f"  not measurable on a real model: {plan.reason}", err=True)
    if dry_run:
        return
    comp = None
    if plan.measurable:
        opts = ImpactOptions(prompts=prompts, samples=samples, max_tokens=max_tokens, alpha=alpha, seed=seed,
                             threads=threads, cache_dir=cache_dir, one_call=one_call)
        try:
            comp = run_impact(plan, opts, log=lambda s: click.echo(f"impact: {s}", err=True))
        except SpecfuzzError as exc:
            click.echo(f"error: {' '.join(str(exc).split())}", err=True)
            sys.exit(2)
    rec = impact_record(plan, comp, command=cmd)
    record_in_entry(path, rec)
    d = draft_dir_of(path)
    if d is not None and not no_redraft:
        try:
            from specfuzz.fuzz.draft import draft_entry

            draft_entry(path, d)
            click.echo(f"  {d / 'ISSUE.md'}: impact line updated", err=True)
        except (ImportError, DraftError) as exc:  # no matplotlib here (e.g. the GPU machine): redraft at home
            click.echo(f"  not redrafted here ({exc}); run `specfuzz draft {path} --out {d}`", err=True)
    click.echo(json.dumps(rec, indent=1, ensure_ascii=False))
