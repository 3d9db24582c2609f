"""The ``specfuzz`` command line."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import click
import numpy as np
from rich.console import Console
from rich.table import Table

from specfuzz.errors import SpecfuzzError

console = Console()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="specfuzz")
def main() -> None:
    """Prove or refute that an engine's speculative decoding samples exactly from the target law."""


@main.command("law")
@click.argument("case_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--top", default=20, show_default=True, help="Show the most likely outputs only.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole law as JSON.")
def law_cmd(case_file: Path, top: int, as_json: bool) -> None:
    """Print the exact target law μ of a case (a case JSON file, or a corpus entry holding one)."""
    from specfuzz.case import Case

    data = json.loads(case_file.read_text())
    case = Case.from_json(data.get("case", data))
    law = case.target_law().enumerate()
    if as_json:
        click.echo(json.dumps({"outputs": [list(o) for o in law.outputs], "probs": law.probs.tolist(), "error_bound": law.error_bound}))
        return
    order = np.argsort(-law.probs)[:top]
    t = Table(title=f"μ: {len(law.outputs)} outputs, every probability exact to {law.error_bound:.1e}")
    t.add_column("output")
    t.add_column("probability", justify="right")
    for i in order:
        t.add_row(" ".join(map(str, law.outputs[i])), f"{law.probs[i]:.6f}")
    console.print(t)


@main.command("catalogue")
@click.option("--bug", "bugs", multiple=True, help="Only these classes (N1..N7); default all.")
@click.option("--alpha", default=1e-3, show_default=True, help="Level of each case's test.")
@click.option("--max-samples", default=20_000, show_default=True)
@click.option("--seed", default=0, show_default=True)
def catalogue_cmd(bugs: tuple[str, ...], alpha: float, max_samples: int, seed: int) -> None:
    """Run the regression catalogue N1-N7 on the reference sampler: detect and attribute each."""
    from specfuzz.oracle.catalogue import catalogue
    from specfuzz.oracle.judge import CaseTest
    from specfuzz.oracle.speculative import BUG_CLASSES, MonteCarloDriver

    entries = catalogue()
    unknown = [b for b in bugs if b not in entries]
    if unknown:
        raise click.BadParameter(f"{unknown[0]!r}: one of {', '.join(sorted(entries))}", param_hint="--bug")
    t = Table(title=f"Regression catalogue on the reference sampler (α = {alpha:g} per case)")
    for col in ("class", "where seen", "samples", "optimal", "verdict", "attributed", "condition"):
        t.add_column(col)
    ok = True
    for bug in bugs or sorted(entries):
        e = entries[bug]
        ct = CaseTest(e.case, alpha=alpha)
        driver = MonteCarloDriver(e.case.process(target=ct.law), np.random.default_rng(seed))
        while ct.n < max_samples and ct.test.log_e < math.log(1 / alpha):
            ct.update(driver.sample_many(5))
        j = ct.judgement()
        label = j.attribution.label if j.attribution else "-"
        ok &= j.failed and label == bug
        opt = j.optimal_samples.get(bug, float("nan"))
        t.add_row(bug, e.where_seen, str(ct.n), f"{opt:.1f}", j.verdict.status, label, str(BUG_CLASSES[bug][0]))
    console.print(t)
    sys.exit(0 if ok else 1)


def run() -> None:
    try:
        main(standalone_mode=True)
    except SpecfuzzError as exc:
        console.print(f"[red]error:[/red] {exc}")
        sys.exit(2)


if __name__ == "__main__":
    run()
