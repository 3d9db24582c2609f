"""`specfuzz impact`: a finding's trigger carried to the embedded SmolLM2-135M-Instruct, what cannot be
carried named with why, bad input refused (one line, exit 2, nothing written), and (slow) a real run
through HF transformers recorded in the entry and its drafted ISSUE.md."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from specfuzz.cli import main
from specfuzz.fuzz.corpus import Entry
from specfuzz.fuzz.impact import detectable_tv, plan_impact

ROOT = Path(__file__).resolve().parents[1]


def _entry(rel: str) -> Entry:
    return Entry.from_json(json.loads((ROOT / "corpus" / rel).read_text()))


def test_the_method_k_window_and_sampling_are_carried_and_table_token_ids_are_not():
    p = plan_impact(_entry("finding-30aac88575b2123f.json"))  # vLLM ngram, allowed tokens, presence, stop id
    assert p.measurable and p.engine == "vllm" and p.spec.method == "ngram" and p.spec.num_speculative_tokens == 1
    assert any(c.startswith("ngram K=1, n-gram window") for c in p.carried)
    names = " ".join(p.not_carried)
    assert "presence_penalty 0.5" in p.carried and p.penalties == (1.0, 0.5, 0.0)  # vLLM's penalty history is modelled
    assert "allowed_token_ids=" in names and "stop_token_ids=" in names and "no counterpart in SmolLM2" in names
    assert plan_impact(_entry("finding-f018724b48c4b56c.json")).top_k == 0  # the table's -1 (off) is compare's 0
    cal = plan_impact(_entry("h200/vllm/calibration-b9634bdd455b4365.json"))  # speculation off, top_p 0.9
    assert cal.spec is None and cal.top_p == 0.9 and cal.not_carried == () and cal.dtype == "float32"
    ng = plan_impact(_entry("h200/sglang/finding-065f698102ca951f.json"))
    assert ng.engine == "sglang" and ng.spec.method == "ngram_tree" and ng.spec.num_speculative_tokens == 11
    assert ng.dtype == "bfloat16" and ng.not_carried == ()
    mp = plan_impact(_entry("h200/sglang/finding-9ebba2095c6eb06f.json"))  # min_p with top-p on SGLang: its own order
    assert mp.min_p == 0.0 and any(s.startswith("min_p=0.2 (with top-k/top-p sglang orders") for s in mp.not_carried)
    mlx = plan_impact(_entry("finding-246fe4b35ffa8138.json"))  # mlx-lm draft model, frequency penalty 0.5
    assert mlx.measurable and mlx.engine == "mlx" and mlx.penalties == (1.0, 0.0, 0.5) and "frequency_penalty 0.5" in mlx.carried
    hot = _entry("finding-fda069a862e799da.json")  # mlx-lm cuts top-p before its temperature: equal laws only at 1
    hot.case["params"]["temperature"] = 0.7
    assert "before its temperature (0.7)" in plan_impact(hot).reason
    sgl = _entry("h200/sglang/finding-065f698102ca951f.json")
    sgl.case["params"]["repetition_penalty"] = 1.3
    assert "repetition_penalty=1.3 (compare's reference law does not model sglang's penalties)" in plan_impact(sgl).not_carried


def test_a_trigger_that_cannot_run_on_the_real_model_says_why():
    eagle = plan_impact(_entry("finding-65c93892bfe7c0a3.json"))
    assert not eagle.measurable and "eagle3 head" in eagle.reason and "none for SmolLM2-135M" in eagle.reason
    uag = plan_impact(_entry("finding-ac3c18c304aaa23b.json"))  # HF universal assisted generation, wider draft
    assert not uag.measurable and "vocabulary (7 tokens) differs from the target's (5)" in uag.reason


def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path):
    corpus = tmp_path / "corpus"
    shutil.copytree(ROOT / "corpus", corpus, ignore=shutil.ignore_patterns("drafts"))
    before = {p: p.read_bytes() for p in corpus.rglob("*.json")}
    for arg, needle in ((corpus / "crash-b71d74e97beb1c0e.json", "a crash entry"),
                        (corpus / "h200" / "sglang" / "finding-065f698102ca951f.json", "engine 'sglang' is not installed here"),
                        (corpus / "regression" / "regression-N1.json", "a regression entry"),
                        (ROOT / "README.md", "not JSON"), (tmp_path / "nope.json", "no such entry file")):
        res = CliRunner().invoke(main, ["impact", str(arg), "--corpus", str(corpus)])
        assert res.exit_code == 2, (arg, res.output)
        err = res.stderr.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], (arg, res.stderr)
    assert {p: p.read_bytes() for p in corpus.rglob("*.json")} == before


def test_a_not_measurable_entry_gets_its_reason_recorded_in_the_entry_and_its_issue(tmp_path):
    from specfuzz.fuzz.draft import draft_entry

    (tmp_path / "corpus").mkdir()
    p = tmp_path / "corpus" / "finding-65c93892bfe7c0a3.json"
    shutil.copy(ROOT / "corpus" / p.name, p)
    draft_entry(p, tmp_path / "corpus" / "drafts" / p.stem)
    res = CliRunner().invoke(main, ["impact", str(p)])
    assert res.exit_code == 0, res.output
    rec = json.loads(p.read_text())["extra"]["impact"]
    assert rec["carried"] is False and "eagle3 head" in rec["reason"] and rec["schema_version"] == 1
    issue = (tmp_path / "corpus" / "drafts" / p.stem / "ISSUE.md").read_text()
    assert "- Impact on a real model: not measurable on a real model: the finding's drafter is an eagle3 head" in issue


def test_the_power_of_a_run_that_saw_nothing_shrinks_with_the_tokens_tested():
    few, many = detectable_tv(100, 1e-3, 0.0, 10), detectable_tv(10_000, 1e-3, 0.0, 10)
    assert 0 < many < few <= 1.0
    assert detectable_tv(10_000, 1e-3, 0.01, 10) == pytest.approx(many + 0.05)  # the tolerance adds to it
    assert detectable_tv(0, 1e-3, 0.0, 10) == 1.0


@pytest.mark.slow
def test_impact_runs_the_finding_settings_on_smollm2_through_hf_and_records_the_verdict(tmp_path):
    """A real run (HF transformers prompt lookup, K=2, temperature 1): compare's sampled test and greedy
    comparison on SmolLM2, the verdict, e-value and tokens tested in the entry and in its ISSUE.md."""
    from specfuzz.fuzz.draft import draft_entry

    d = json.loads((ROOT / "corpus" / "regression" / "regression-N1.json").read_text())
    d.update(kind="finding", engine={"name": "hf-transformers", "version": "5.19.0"})
    d["case"]["spec"] = {**d["case"]["spec"], "method": "ngram", "num_speculative_tokens": 2, "ngram_min": 1, "ngram_max": 2,
                        "verify": "token", "inject": None}
    d["case"]["draft_table"] = None
    d["extra"] = {}
    (tmp_path / "corpus").mkdir()
    p = tmp_path / "corpus" / "finding-hfngram.json"
    p.write_text(json.dumps(d))
    draft_entry(p, tmp_path / "corpus" / "drafts" / p.stem)
    res = CliRunner().invoke(main, ["impact", str(p), "--prompts", "1", "--samples", "3", "--max-tokens", "8",
                                    "--threads", "2"])
    assert res.exit_code == 0, res.output
    rec = json.loads(p.read_text())["extra"]["impact"]
    assert rec["carried"] is True and rec["engine"] == "hf-transformers" and rec["tokens"] > 0
    assert rec["verdict"] == "pass", rec  # HF's prompt lookup is lossless
    assert "power:" in rec["power"] and math.isfinite(float(rec["log_e"])) and "prompts identical" in rec["greedy"]
    issue = (tmp_path / "corpus" / "drafts" / p.stem / "ISSUE.md").read_text()
    assert f"no departure seen (e-value {rec['e_value']} after {rec['tokens']} tokens" in issue
