"""`specfuzz triage`: grouping, conditions, effect sizes, JSON schema, bad files, re-runs."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Sequence

import jsonschema
import pytest
from click.testing import CliRunner

from specfuzz.engines.base import Completion, Request
from specfuzz.engines.reference_engine import ReferenceEngine
from specfuzz.fuzz.corpus import Entry
from specfuzz.fuzz.rerun import SECOND_RUN_SEED_OFFSET, RunOutcome, status_after_rerun
from specfuzz.fuzz.triage import CONDITIONS, compute_effect, load_corpus, profile_for, suspect_condition, triage
from specfuzz.fuzz.triage_cli import triage_cmd
from specfuzz.oracle.judge import target_law_dict
from specfuzz.oracle.speculative import BUG_CLASSES

ROOT = Path(__file__).resolve().parents[1]
REGRESSION = ROOT / "corpus" / "regression"
SCHEMA = json.loads((ROOT / "docs" / "triage-schema.json").read_text())
CORRUPTED = b'{"schema_version": 1, "kind": "finding", "engine": {"na'
FOREIGN = b'{"name": "left-pad", "version": "1.3.0", "dependencies": {}}\n'
NOT_AN_OBJECT = b"[1, 2, 3]\n"
# A rerun seed block far from the second run's (see SeedDependentEngine).
BUGGY_FROM_SEED = SECOND_RUN_SEED_OFFSET


class SeedDependentEngine(ReferenceEngine):
    """Correct for request seeds below BUGGY_FROM_SEED, N5-buggy from there on: a finding
    that passes a first re-run and fails the second one (loaded as test_triage:SeedDependentEngine)."""

    name = "seed-dependent"

    def version(self):
        return {**super().version(), "name": self.name, "engine_spec": "test_triage:SeedDependentEngine"}

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        self.inject = "N5" if any((r.seed or 0) >= BUGGY_FROM_SEED for r in requests) else None
        self._process_laws.clear()
        return super().generate(requests)


def _regression(bug: str) -> dict:
    return json.loads((REGRESSION / f"regression-{bug}.json").read_text())


def _write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    return path


def _finding_from(bug: str, *, engine: dict, status: str = "new", **changes) -> dict:
    """A finding entry with a regression entry's case and counts, recorded from another engine."""
    d = copy.deepcopy(_regression(bug))
    d.update(kind="finding", status=status, engine=engine, **changes)
    d["extra"] = {}
    return d


@pytest.fixture
def corpus(tmp_path) -> Path:
    """Regression entries N1-N7, a duplicate of N1, a flaky and a fixed finding, a
    corrupted file, a foreign JSON and a JSON list."""
    root = tmp_path / "corpus"
    (root / "regression").mkdir(parents=True)
    for p in sorted(REGRESSION.glob("regression-N*.json")):
        shutil.copy(p, root / "regression" / p.name)
    dup = _regression("N1")
    dup.update(times_seen=3, first_seen="2026-11-30T08:00:00+00:00", last_seen="2026-12-01T09:00:00+00:00")
    _write(root / "regression" / "regression-N1-again.json", dup)
    ref = {"name": "reference", "version": "0.1.0", "device": "cpu"}
    _write(root / "finding-flaky.json", _finding_from("N5", engine=ref, status="flaky"))
    _write(root / "finding-fixed.json", _finding_from("N7", engine=ref, status="fixed",
                                                       last_seen="2026-11-28T00:00:00+00:00"))
    (root / "broken.json").write_bytes(CORRUPTED)
    (root / "package.json").write_bytes(FOREIGN)
    (root / "list.json").write_bytes(NOT_AN_OBJECT)
    return root


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (root / "broken.json", root / "package.json", root / "list.json")}


def test_triage_groups_entries_by_signature_and_shows_each_status(corpus):
    report = triage(corpus)
    by_file = {r.rel: r for r in report.reports}
    assert len(report.reports) == 10
    n1 = by_file["regression/regression-N1.json"].entry.signature
    group = next(g for g in report.groups if g.signature == n1)
    assert sorted(r.rel for r in group.reports) == ["regression/regression-N1-again.json", "regression/regression-N1.json"]
    assert group.times_seen == 4 and group.last_seen == "2026-12-01T09:00:00+00:00"
    assert group.first_seen == "2026-11-29T12:23:50+00:00"
    assert by_file["finding-flaky.json"].entry.status == "flaky"
    assert by_file["finding-fixed.json"].entry.status == "fixed"
    assert len(report.groups) == 9  # N1-N7 (N1 twice) and two findings
    # fixed groups sort last, and a group's status is its most pressing entry's
    assert report.groups[-1].status == "fixed"


def test_triage_reports_corrupted_and_foreign_files_as_skipped_without_touching_them(corpus):
    before = _snapshot(corpus)
    mtimes = {n: (corpus / n).stat().st_mtime_ns for n in before}
    report = triage(corpus)
    result = CliRunner().invoke(triage_cmd, [str(corpus)])
    result_json = CliRunner().invoke(triage_cmd, [str(corpus), "--json"])
    assert result.exit_code == 0 and result_json.exit_code == 0, result.output + result_json.output
    reasons = {s.path.name: s.reason for s in report.skipped}
    assert set(reasons) == {"broken.json", "package.json", "list.json"}
    assert reasons["broken.json"].startswith("invalid JSON")
    assert "schema_version=None" in reasons["package.json"]
    assert "list" in reasons["list.json"]
    out = " ".join(result.output.split())
    for name in ("broken.json", "package.json", "list.json"):
        assert f"skipped {corpus / name}: {reasons[name][:20]}" in out
    assert _snapshot(corpus) == before
    assert {n: (corpus / n).stat().st_mtime_ns for n in before} == mtimes


def test_triage_json_validates_against_the_documented_schema(corpus):
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    result = CliRunner().invoke(triage_cmd, [str(corpus), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    jsonschema.validate(data, SCHEMA, cls=jsonschema.Draft202012Validator)
    assert data["totals"] == {"entries": 10, "groups": 9, "skipped": 3,
                              "by_status": {"new": 8, "confirmed": 0, "flaky": 1, "fixed": 1}}
    entries = {e["path"]: e for g in data["groups"] for e in g["entries"]}
    n6 = entries["regression/regression-N6.json"]
    assert n6["class"] == "N6" and n6["condition"]["number"] == 3 and n6["condition"]["source"] == "attribution"
    assert n6["evidence"]["log_e"] == "inf" and n6["effect"]["impossible_example"] == [-1]
    assert {s["path"] for s in data["skipped"]} == {"broken.json", "package.json", "list.json"}
    # the schema rejects what it should: a status outside the four
    bad = copy.deepcopy(data)
    bad["groups"][0]["entries"][0]["status"] = "wontfix"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCHEMA, cls=jsonschema.Draft202012Validator)


def test_console_table_shows_engine_condition_class_effect_evidence_and_status(corpus):
    result = CliRunner().invoke(triage_cmd, [str(corpus)], terminal_width=300)
    assert result.exit_code == 0, result.output
    out = result.output
    for text in ("reference+N1 0.1.0", "draft_model K=3 block", "4: fresh uniforms", "N6", "flaky", "fixed",
                 "1.6e3", "inf", "×2 files", "0.938"):
        assert text in out, text


def test_a_missing_corpus_folder_is_refused_on_one_line_not_reported_empty(tmp_path):
    """Like replay (issue 15): a corpus path that does not exist is a bad value, not an empty corpus."""
    from specfuzz.cli import main

    result = CliRunner().invoke(main, ["triage", str(tmp_path / "nowhere"), "--json"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"error: Invalid value for CORPUS_DIR: '{tmp_path / 'nowhere'}': no such folder; a corpus folder"]


def test_an_empty_corpus_folder_is_an_empty_report(tmp_path):
    result = CliRunner().invoke(triage_cmd, [str(tmp_path), "--json"])
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    jsonschema.validate(data, SCHEMA, cls=jsonschema.Draft202012Validator)
    assert data["totals"]["entries"] == 0


@pytest.mark.parametrize("bug", sorted(BUG_CLASSES))
def test_condition_of_a_regression_entry_is_its_classes(bug):
    e = Entry.from_json(_regression(bug))
    guess = suspect_condition(e, compute_effect(e))
    assert (guess.number, guess.source) == (BUG_CLASSES[bug][0], "attribution")
    assert guess.text == CONDITIONS[BUG_CLASSES[bug][0]]


def _unknown(bug: str, **case_changes) -> Entry:
    d = _finding_from(bug, engine={"name": "vllm", "version": "0.32.0"})
    d["attribution"] = {**d["attribution"], "label": "unknown"}
    d["case"].update(case_changes)
    return Entry.from_json(d)


def test_unknown_findings_get_a_heuristic_condition():
    stray = _unknown("N6")  # outputs hold -1: condition 3
    g = suspect_condition(stray, compute_effect(stray))
    assert (g.number, g.source) == (3, "heuristic") and "outside the target vocabulary" in g.reason
    think = _unknown("N3")  # impossible outputs in vocabulary while a thinking budget is active: condition 2
    g = suspect_condition(think, compute_effect(think))
    assert (g.number, g.source) == (2, "heuristic") and "thinking_budget" in g.reason
    narrow = _unknown("N7")  # possible outputs, narrower draft: condition 3
    g = suspect_condition(narrow, compute_effect(narrow))
    assert (g.number, g.source) == (3, "heuristic") and "narrower" in g.reason
    off = _unknown("N5", spec=None, draft_table=None)
    g = suspect_condition(off, compute_effect(off))
    assert g.number is None and "speculation off" in g.reason


def test_a_recorded_mechanism_outranks_the_heuristic():
    """A crash whose cause was traced in the engine (SGLang's tree verify with fewer draft
    tokens than steps + 1) must not be drafted with a shape-of-q guess from its draft width."""
    narrow = _unknown("N7")
    assert suspect_condition(narrow, compute_effect(narrow)).source == "heuristic"
    narrow.extra["mechanism"] = "accept_index has num_steps + 1 columns, the block num_draft_tokens"
    g = suspect_condition(narrow, compute_effect(narrow))
    assert (g.number, g.source) == (None, "recorded") and "mechanism recorded" in g.reason


def test_effect_size_is_recomputed_against_mu_of_the_stored_case():
    e = Entry.from_json(_regression("N7"))
    eff = compute_effect(e)
    assert eff.source == "recomputed" and eff.n == 10
    assert eff.tv == pytest.approx(e.verdict["tv_distance"], abs=1e-12)
    assert eff.worst_token == e.verdict["worst_token"]
    # counts equal to n·μ exactly: no effect at all
    from specfuzz.case import Case

    mu = target_law_dict(Case.from_json(e.case))
    exact = Entry.from_json({**_regression("N7"), "counts": [[list(x), int(round(p * 64))] for x, p in mu.items()]})
    assert compute_effect(exact).tv == pytest.approx(0.0, abs=1e-12)


def test_hf_entries_are_judged_under_the_hf_profile():
    d = _regression("N5")
    assert profile_for(Entry.from_json({**d, "engine": {"name": "hf-transformers"}})) == "hf"
    assert profile_for(Entry.from_json({**d, "engine": {"name": "vllm"}})) == "vllm"
    assert profile_for(Entry.from_json(d)) == "vllm"


@pytest.mark.parametrize(
    "kind, first, second, expected",
    [
        ("finding", "fail", None, "confirmed"),
        ("finding", "crash", None, "confirmed"),
        ("finding", "pass", "fail", "flaky"),
        ("finding", "pass", "pass", "fixed"),
        ("regression", "pass", "pass", "fixed"),
        ("crash", "crash", None, "confirmed"),
        ("crash", "pass", "crash", "flaky"),
        ("crash", "pass", "pass", "fixed"),
        ("finding", "error", None, None),
        ("finding", "pass", "error", None),
    ],
)
def test_status_after_rerun_follows_the_rules(kind, first, second, expected):
    e = Entry.from_json({**_regression("N5"), "kind": kind})
    s = None if second is None else RunOutcome(second, 2)
    assert status_after_rerun(e, RunOutcome(first, 1), s) == expected


def test_load_corpus_never_raises_on_odd_files(tmp_path):
    root = tmp_path / "c"
    root.mkdir()
    (root / "dir.json").mkdir()
    (root / "bytes.json").write_bytes(b"\xff\xfe\x00garbage")
    (root / "null.json").write_text("null")
    _write(root / "badkind.json", {**_regression("N1"), "kind": "mystery"})
    _write(root / "badcase.json", {**_regression("N1"), "case": {"schema_version": 1}})
    (root / ".specfuzz").mkdir()
    (root / ".specfuzz" / "state.json").write_text("{}")
    entries, skipped = load_corpus(root)
    assert [p.name for p, _ in entries] == ["badcase.json"]  # an entry; only its case is broken
    assert {s.path.name for s in skipped} >= {"dir.json", "bytes.json", "null.json", "badkind.json"}
    assert all(".specfuzz" not in str(s.path) for s in skipped)
    report = triage(root)  # an entry whose case cannot be rebuilt still shows, with stored values
    assert all(r.effect.source in ("stored", "recomputed", "none") for r in report.reports)


@pytest.mark.slow
def test_rerun_confirms_injected_regressions_and_fixes_or_flags_the_rest(tmp_path):
    root = tmp_path / "corpus"
    _write(root / "regression-N5.json", _regression("N5"))
    ref = {"name": "reference", "version": "0.1.0", "device": "cpu"}
    _write(root / "finding-uninjected.json", _finding_from("N5", engine=ref))
    seed_dep = {"name": "seed-dependent", "version": "0.1.0", "engine_spec": "test_triage:SeedDependentEngine"}
    _write(root / "finding-seed-dependent.json", _finding_from("N5", engine=seed_dep))
    (root / "broken.json").write_bytes(CORRUPTED)
    before_case = json.loads((root / "finding-uninjected.json").read_text())["case"]
    mode = (root / "finding-uninjected.json").stat().st_mode
    result = CliRunner().invoke(triage_cmd, [str(root), "--rerun", "--json", "--samples", "400",
                                             "--work-dir", str(tmp_path / "work")])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    jsonschema.validate(data, SCHEMA, cls=jsonschema.Draft202012Validator)
    assert data["rerun"] is True
    status = {p.name: json.loads(p.read_text())["status"] for p in root.glob("*-*.json")}
    assert status == {"regression-N5.json": "confirmed", "finding-uninjected.json": "fixed",
                      "finding-seed-dependent.json": "flaky"}
    stored = json.loads((root / "finding-uninjected.json").read_text())
    assert stored["case"] == before_case and stored["counts"] == _regression("N5")["counts"]
    assert (root / "finding-uninjected.json").stat().st_mode == mode
    assert not list(root.glob(".*.tmp"))  # the atomic write left no temporary file
    runs = stored["extra"]["last_rerun"]["runs"]
    assert [r["outcome"] for r in runs] == ["pass", "pass"] and runs[0]["n"] == 400
    assert (root / "broken.json").read_bytes() == CORRUPTED
    entries = {e["path"]: e for g in data["groups"] for e in g["entries"]}
    assert entries["regression-N5.json"]["rerun"]["runs"][0]["outcome"] == "fail"
    assert entries["finding-seed-dependent.json"]["rerun"]["status_after"] == "flaky"


def _triaged(root: Path, findings: dict[str, dict]) -> tuple:
    """Write the findings (name -> entry data, signature recomputed) into ``root`` and triage it:
    (report, name -> signature)."""
    for name, d in findings.items():
        d.pop("signature", None)
        _write(root / name, d)
    report = triage(root)
    return report, {r.rel: r.entry.signature for r in report.reports}


def test_findings_likely_one_bug_under_several_methods_are_related_in_json_and_console(tmp_path):
    """Findings of one engine version with the same sampling features and class, met under two
    methods (two signatures), list each other as ``related``; another feature set does not."""
    root = tmp_path / "corpus"
    eng = {"name": "sglang", "version": "0.5.17", "device": "cuda"}
    base = _finding_from("N5", engine=eng)
    assert base["case"]["spec"]["method"] == "draft_model"
    ngram = copy.deepcopy(base)
    ngram["case"]["spec"].update(method="ngram", ngram_min=1, ngram_max=2)
    ngram["case"].pop("draft_table", None)
    other = copy.deepcopy(ngram)  # unattributed, with min_p: its own signature, another key
    other["case"]["params"]["min_p"] = 0.2
    other["attribution"] = None
    tree = copy.deepcopy(ngram)  # the same features and class, under a third method, with another symptom
    tree["case"]["spec"].update(method="ngram_tree")
    tree["counts"] = [[[0] * (tree["case"]["params"]["max_tokens"] + 1), 5]]  # longer than max_tokens: past the end
    report, sig = _triaged(root, {"finding-draft.json": base, "finding-ngram.json": ngram, "finding-minp.json": other,
                                  "finding-tree.json": tree})
    assert len(set(sig.values())) == 4
    rel = {g.signature: g.related for g in report.groups}
    assert rel[sig["finding-draft.json"]] == [sig["finding-ngram.json"]]
    assert rel[sig["finding-ngram.json"]] == [sig["finding-draft.json"]]
    assert rel[sig["finding-minp.json"]] == [] and rel[sig["finding-tree.json"]] == []
    result = CliRunner().invoke(triage_cmd, [str(root), "--json"])
    data = json.loads(result.output)
    jsonschema.validate(data, SCHEMA, cls=jsonschema.Draft202012Validator)
    assert {g["signature"]: g["related"] for g in data["groups"]} == rel
    shown = {e["path"]: e["effect"]["symptom"] for g in data["groups"] for e in g["entries"]}
    assert shown["finding-tree.json"] == "past end" and shown["finding-draft.json"] == shown["finding-ngram.json"] != "past end"
    out = " ".join(CliRunner().invoke(triage_cmd, [str(root)], terminal_width=300).output.split())
    assert "likely one bug (sglang 0.5.17;" in out and sig["finding-draft.json"] in out.split("likely one bug")[1]
    assert sig["finding-minp.json"] not in out.split("likely one bug")[1]


def test_entries_traced_to_one_upstream_issue_are_one_known_bug_in_json_and_console(tmp_path):
    """Entries whose ``extra.upstream`` names the same issue list each other as ``same_upstream``
    (whatever their method or sampling features), carry the URL in ``--json`` and share one
    console line; an entry naming another issue, or none, is not in it."""
    root = tmp_path / "corpus"
    eng = {"name": "vllm", "version": "0.32.0", "device": "cpu"}
    url, other_url = "https://github.com/vllm-project/vllm/issues/55005", "https://github.com/x/y/issues/1"
    base = _finding_from("N5", engine=eng)
    ngram = copy.deepcopy(base)
    ngram["case"]["spec"].update(method="ngram", ngram_min=1, ngram_max=2)
    ngram["case"].pop("draft_table", None)
    minp = copy.deepcopy(ngram)  # other sampling features: not "likely one bug", but the same upstream issue
    minp["case"]["params"]["min_p"] = 0.2
    minp["attribution"] = None
    plain, elsewhere = copy.deepcopy(minp), copy.deepcopy(minp)
    plain["case"]["params"]["top_k"] = 2
    elsewhere["case"]["params"]["presence_penalty"] = 0.5
    base["extra"] = {"upstream": url}
    minp["extra"] = {"upstream": f" {url} "}
    elsewhere["extra"] = {"upstream": other_url}
    report, sig = _triaged(root, {"finding-draft.json": base, "finding-ngram.json": ngram, "finding-minp.json": minp,
                                  "finding-plain.json": plain, "finding-elsewhere.json": elsewhere})
    assert len(set(sig.values())) == 5
    same = {g.signature: g.same_upstream for g in report.groups}
    assert same[sig["finding-draft.json"]] == [sig["finding-minp.json"]]
    assert same[sig["finding-minp.json"]] == [sig["finding-draft.json"]]
    assert same[sig["finding-ngram.json"]] == same[sig["finding-plain.json"]] == same[sig["finding-elsewhere.json"]] == []
    result = CliRunner().invoke(triage_cmd, [str(root), "--json"])
    data = json.loads(result.output)
    jsonschema.validate(data, SCHEMA, cls=jsonschema.Draft202012Validator)
    by_sig = {g["signature"]: g for g in data["groups"]}
    assert by_sig[sig["finding-minp.json"]]["upstream"] == url and by_sig[sig["finding-plain.json"]]["upstream"] is None
    assert by_sig[sig["finding-elsewhere.json"]]["upstream"] == other_url
    assert {s: g["same_upstream"] for s, g in by_sig.items()} == same
    out = " ".join(CliRunner().invoke(triage_cmd, [str(root)], terminal_width=300).output.split())
    line = out.split(f"one upstream bug, {url}, under")[1]
    assert sig["finding-draft.json"] in line and sig["finding-minp.json"] in line
    assert sig["finding-plain.json"] not in line and "one upstream bug, " + other_url not in out
