"""``specfuzz doctor``: which engines can run here, which versions, on what device.

For each built-in engine (or those named with ``--engine``): whether its packages are
importable, and, when they are, the engine's own ``version()`` record, asked in a child
process (a broken install cannot take doctor down): its version and device. ``--start``
also starts each importable engine once on the smallest table model (V = 2, speculation
off) and draws a few samples. The install itself is checked too: the schemas and
templates the CLI needs are present in the package.

Exit status: 0; 3 when an engine named with ``--engine`` cannot run here (or, with
``--start``, does not start), or this install lacks files the CLI needs; 2 bad input.
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import click

# Engines probed when none is named.
DEFAULT_ENGINES = ("reference", "hf", "vllm", "sglang", "llamacpp", "mlx")
# Files the installed package must carry (package, resource), besides the repro templates.
PACKAGE_FILES = (("specfuzz.schemas", "results-schema.json"), ("specfuzz.schemas", "triage-schema.json"))


def install_problems() -> list[str]:
    """Package data the CLI needs that is missing from this install."""
    from importlib.resources import files

    missing = []
    try:
        if not any(p.name.endswith(".py") and p.name != "__init__.py" for p in files("specfuzz.fuzz.draft.templates").iterdir()):
            missing.append("specfuzz.fuzz.draft.templates/*.py")
    except (ModuleNotFoundError, FileNotFoundError):
        missing.append("specfuzz.fuzz.draft.templates/*.py")
    for package, name in PACKAGE_FILES:
        try:
            ok = (files(package) / name).is_file()
        except (ModuleNotFoundError, FileNotFoundError):
            ok = False
        if not ok:
            missing.append(f"{package}/{name}")
    return missing


@click.command("doctor")
@click.option("--engine", "engines", multiple=True, help="Only these engines (repeatable; also package.module:Class).")
@click.option("--start", "start", is_flag=True, help="Also start each importable engine once on a tiny model (slow: an engine start each).")
@click.option("--work-dir", default=".specfuzz-cache", show_default=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def doctor_cmd(engines: tuple[str, ...], start: bool, work_dir: Path, as_json: bool) -> None:
    """Which engines are importable here, their versions and devices; is specfuzz installed whole?"""
    from rich.console import Console
    from rich.table import Table

    import specfuzz
    from specfuzz.engines.availability import probe, start_error
    from specfuzz.exitcodes import ExitCode, finish

    rows = []
    for name in engines or DEFAULT_ENGINES:
        p = probe(name)
        row = p.to_json()
        if start and p.importable:
            err = start_error(name, work_dir=work_dir)
            row["starts"] = err is None
            if err:
                row["detail"] = err
        rows.append(row)
    problems = install_problems()
    info = {"specfuzz": specfuzz.__version__, "python": platform.python_version(), "executable": sys.executable,
            "platform": f"{platform.system()} {platform.machine()}", "package": str(Path(specfuzz.__file__).parent),
            "install_problems": problems, "engines": rows}
    if as_json:
        click.echo(json.dumps(info, indent=1))
    else:
        console = Console()
        console.print(f"specfuzz {info['specfuzz']} ({info['package']}), Python {info['python']} on {info['platform']}",
                      highlight=False)
        console.print("install: " + ("complete" if not problems else "[red]missing " + ", ".join(problems) + "[/red]"),
                      highlight=False)
        t = Table(title="engines")
        for col in ("engine", "importable", "version", "device") + (("starts",) if start else ()) + ("detail",):
            t.add_column(col, overflow="fold")
        for r in rows:
            cells = [r["engine"], "yes" if r["importable"] else "no", r["version"] or "-", r["device"] or "-"]
            if start:
                cells.append("-" if "starts" not in r else ("yes" if r["starts"] else "no"))
            t.add_row(*cells, r["detail"])
        console.print(t)
    if problems:
        click.echo(f"error: this specfuzz install lacks {', '.join(problems)}: reinstall it", err=True)
        finish(ExitCode.ENGINE_UNAVAILABLE)
    if engines and any(not r["importable"] or r.get("starts") is False for r in rows):
        finish(ExitCode.ENGINE_UNAVAILABLE)
    finish(ExitCode.OK)
