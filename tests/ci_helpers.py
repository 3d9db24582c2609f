"""Shared by the CI-integration tests: run the real CLI, validate its reports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JUNIT_XSD = ROOT / "tests" / "data" / "junit-10.xsd"  # Jenkins xUnit's JUnit schema, as pytest validates with


def copy_package_source(dest: Path) -> Path:
    """pyproject.toml, README.md and every folder pyproject maps into the package, copied to
    ``dest`` (pip builds a wheel there, never in the working tree); a new subpackage comes along."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, dest / name)
    dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()
    for d in sorted(set(dirs)):
        shutil.copytree(ROOT / d, dest / d, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def run_cli(args: list[str], cwd: Path, *, timeout: float = 300, python: str = sys.executable,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m specfuzz ARGS`` as a user runs it (tests/ on PYTHONPATH for example engines)."""
    e = {**os.environ, "PYTHONPATH": str(ROOT / "tests"), "COLUMNS": "200", **(env or {})}
    return subprocess.run([python, "-m", "specfuzz", *args], cwd=cwd, env=e, capture_output=True, text=True,
                          timeout=timeout)


def valid_junit(path: Path):
    """The parsed JUnit XML file, after validating it against the JUnit XSD."""
    from lxml import etree

    schema = etree.XMLSchema(etree.parse(str(JUNIT_XSD)))
    doc = etree.parse(str(path))
    assert schema.validate(doc), f"{path} is not valid JUnit XML: {schema.error_log}"
    return doc


def valid_json(path: Path, schema_name: str = "results-schema.json") -> dict:
    """The parsed JSON report, after validating it against its schema in docs/."""
    import jsonschema

    data = json.loads(Path(path).read_text())
    schema = json.loads((ROOT / "docs" / schema_name).read_text())
    jsonschema.validate(data, schema)
    return data


def junit_cases(doc) -> dict[str, object]:
    """JUnit test cases by name."""
    return {tc.get("name"): tc for tc in doc.iter("testcase")}
