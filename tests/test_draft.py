"""`specfuzz draft`: ISSUE.md, plot.png and a standalone repro.py per corpus entry.

The repro scripts of the N1-N7 regression entries are run in a clean virtual
environment holding only numpy, safetensors and specfuzz (installed with --no-deps, so
no scipy, hypothesis, torch, ...): they must print FAIL with the injected sampler and
PASS with the correct one. The venv is created once per test session (about 25 s with
pip's cache); where it cannot be created (no package index) the scripts run with the
project's interpreter in isolated mode (``python -I``), which proves less (the project
venv has every dependency), and the fixture says so in the test report.
"""

from __future__ import annotations

import copy
import importlib.metadata
import importlib.util
import json
import math
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from ci_helpers import copy_package_source
from click.testing import CliRunner

from specfuzz.case import Case
from specfuzz.fuzz.draft import Scrubber, draft_entry, evidence_sentence, prepare, resolve_entry
from specfuzz.fuzz.corpus import Entry
from specfuzz.cli import main
from specfuzz.fuzz.triage_cli import draft_cmd
from specfuzz.oracle.judge import bug_laws, target_law_dict
from specfuzz.oracle.speculative import BUG_CLASSES

ROOT = Path(__file__).resolve().parents[1]
REGRESSION = ROOT / "corpus" / "regression"
BUGS = sorted(BUG_CLASSES)
FAKE_HOST = "gpu-node-42.corp.example.com"
FAKE_USER = "alice"
FAKE_PATH = "/home/alice/x"


def _regression(bug: str) -> dict:
    return json.loads((REGRESSION / f"regression-{bug}.json").read_text())


# ----------------------------------------------------------------------------- the clean venv


@pytest.fixture(scope="session")
def repro_python(tmp_path_factory) -> list[str]:
    """A Python that has numpy, safetensors and specfuzz (no dependencies) and nothing else."""
    base = tmp_path_factory.mktemp("repro-venv")
    venv = base / "venv"
    py = venv / "bin" / "python"
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=120)
        pins = [f"{name}=={importlib.metadata.version(name)}" for name in ("numpy", "safetensors")]
        pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run(pip + pins, check=True, capture_output=True, timeout=300)
        src = copy_package_source(base / "specfuzz-src")
        # the wheel is built by this (project) interpreter, which has setuptools and wheel
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(src),
                        "-w", str(base / "dist")], check=True, capture_output=True, timeout=300)
        subprocess.run(pip + ["--no-deps", *map(str, (base / "dist").glob("specfuzz-*.whl"))], check=True,
                       capture_output=True, timeout=300)
        probe = subprocess.run([str(py), "-I", "-c", "import specfuzz.oracle.speculative, safetensors, numpy\n"
                                "import importlib.util as u; print(u.find_spec('scipy') is None and u.find_spec('torch') is None)"],
                               capture_output=True, text=True, timeout=60)
        assert probe.stdout.strip() == "True", probe.stdout + probe.stderr
        return [str(py), "-I"]
    except (subprocess.SubprocessError, OSError, AssertionError) as exc:
        warnings.warn(f"clean venv not available ({exc}); running repro scripts with the project interpreter (python -I)")
        return [sys.executable, "-I"]


def _run(python: list[str], script: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*python, str(script), *args], capture_output=True, text=True, timeout=timeout, cwd=script.parent)


def _last_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stdout.strip().splitlines()
    return lines[-1] if lines else ""


# ----------------------------------------------------------------------------- N1-N7


@pytest.fixture(scope="module")
def drafts(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("drafts")
    return {bug: draft_entry(REGRESSION / f"regression-{bug}.json", out / bug).out_dir for bug in BUGS}


@pytest.mark.parametrize("bug", BUGS)
def test_draft_writes_an_issue_a_plot_and_a_repro(drafts, bug):
    d = drafts[bug]
    assert sorted(p.name for p in d.iterdir()) == ["ISSUE.md", "plot.png", "repro.py"]
    issue = (d / "ISSUE.md").read_text()
    cond = BUG_CLASSES[bug][0]
    for section in ("### Describe the bug", "### Reproduction", "### Environment", "<details><summary>The model",
                    "#### The model", "#### Evidence", "#### Suspected cause"):
        assert section in issue, section
    assert issue.startswith("# specfuzz reference sampler 0.1.0 (bug " + bug + " injected)")
    assert "](plot.png)" in issue
    assert f"Condition {cond} of lossless speculation" in issue
    assert f"μD ({bug})" in issue
    assert "python repro.py --correct" in issue
    png = (d / "plot.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    src = (d / "repro.py").read_text()
    compile(src, "repro.py", "exec")
    # the expected law is data: the script never asks the oracle for it
    for oracle_call in (".enumerate(", "target_law_dict", "bug_laws", "specfuzz.oracle.judge", "specfuzz.oracle.stats"):
        assert oracle_call not in src


@pytest.mark.slow
@pytest.mark.parametrize("bug", BUGS)
def test_repro_fails_with_the_injected_sampler_and_passes_with_the_correct_one(drafts, repro_python, bug):
    script = drafts[bug] / "repro.py"
    injected = _run(repro_python, script)
    assert _last_line(injected) == "FAIL" and injected.returncode == 1, injected.stdout + injected.stderr
    assert f"bug {bug} injected" in injected.stdout
    correct = _run(repro_python, script, "--correct")
    assert _last_line(correct) == "PASS" and correct.returncode == 0, correct.stdout + correct.stderr
    assert "reference sampler, correct" in correct.stdout and "e-value after 20000 samples" in correct.stdout


def test_expected_vs_observed_table_holds_counts_mu_and_mud(drafts):
    issue = (drafts["N1"] / "ISSUE.md").read_text()
    e = Entry.from_json(_regression("N1"))
    case = Case.from_json(e.case)
    mu = target_law_dict(case)
    mud = bug_laws(case, mu, classes=["N1"])["N1"]
    n = sum(e.counts.values())
    x = (1, 1, 1)
    row = f"| `{x}` | {e.counts[x]} | {e.counts[x] / n:.4f} | {mu[x]:.4f} | {mud[x]:.4f} |"
    assert row in issue
    assert mu[x] == 0.125 and mud[x] != mu[x]


def test_evidence_is_one_checkable_sentence():
    n6 = prepare(Entry.from_json(_regression("N6")), "regression-N6")
    assert evidence_sentence(n6) == "Under the exact law μ, output (-1,) has probability 0; it was observed 1 time in 5 samples."
    n1 = prepare(Entry.from_json(_regression("N1")), "regression-N1")
    s = evidence_sentence(n1)
    assert s.startswith("The anytime-valid e-value is 1.6e3 after 55 samples, i.e. a false-alarm probability below 6.1e-4")
    assert "3.3e3 times more likely under the law of N1 than under μ" in s


def _load_module(path: Path):
    spec = importlib.util.spec_from_file_location(f"repro_{path.parent.name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # the __main__ guard keeps it from running
    return mod


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_repro_rebuilds_the_checkpoints_tablegen_writes(tmp_path, dtype):
    """The checkpoint writer of repro.py = tablegen: same config, tokenizer files and tensors (bit for bit)."""
    import torch
    from safetensors.torch import load_file

    from specfuzz.engines.checkpoints import materialize

    d = _regression("N7")  # a narrower draft: padded with masked columns
    d["case"]["target_table"][1][2] = 0.1  # not representable in bf16/fp16: the draft rounds like tablegen
    d["case"]["draft_table"][0][1] = "-inf"
    d.update(kind="finding", engine={"name": "vllm", "version": "0.32.0", "device": "cpu"})
    d["extra"] = {"dtype": dtype}
    path = tmp_path / "entry.json"
    path.write_text(json.dumps(d))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        draft_entry(path, tmp_path / "draft")
        mine = _load_module(tmp_path / "draft" / "repro.py").write_checkpoints(str(tmp_path / "mine"))
        ref = materialize(Case.from_json(d["case"]), tmp_path / "tablegen", dtype)
    for a, b in ((mine["{target}"], ref.target_dir), (mine["{draft}"], ref.draft_dir)):
        for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            assert json.loads((Path(a) / name).read_text()) == json.loads((Path(b) / name).read_text()), name
        ta, tb = load_file(str(Path(a) / "model.safetensors")), load_file(str(Path(b) / "model.safetensors"))
        assert sorted(ta) == sorted(tb)
        for k in ta:
            assert ta[k].dtype == tb[k].dtype == getattr(torch, dtype) and torch.equal(ta[k], tb[k]), k


def _engine_entry(tmp_path: Path, engine: dict, bug: str = "N7", **extra) -> Path:
    d = copy.deepcopy(_regression(bug))
    d.update(kind="finding", engine=engine)
    d["extra"] = dict(extra)
    p = tmp_path / f"finding-{engine['name']}.json"
    p.write_text(json.dumps(d))
    return p


@pytest.mark.parametrize("engine, marker", [
    ({"name": "vllm", "version": "0.32.0", "torch": "2.13.0+cpu", "device": "cpu"}, "vllm.LLM(**with_checkpoints(kwargs, dirs))"),
    ({"name": "sglang", "version": "0.5.17", "torch": "2.11.0+cu130", "device": "cuda NVIDIA H200"},
     "sglang.Engine(**with_checkpoints(kwargs, dirs))"),
    ({"name": "hf-transformers", "version": "5.19.0", "torch": "2.13.0+cpu", "device": "cpu"}, "model.generate("),
    ({"name": "mlx-lm", "version": "0.32.2", "mlx": "0.32.4", "device": "cpu"}, "stream_generate(model, tokenizer"),
    ({"name": "my-engine", "version": "1.0", "engine_spec": "pkg.mod:Engine"}, "load_engine_class"),
])
def test_each_engine_gets_its_own_repro_template(tmp_path, engine, marker):
    path = _engine_entry(tmp_path, engine)
    if engine["name"] == "sglang":  # SGLang's STANDALONE drafter is greedy (the adapter refuses sampled drafts)
        d = json.loads(path.read_text())
        d["case"]["spec"]["draft_sampling"] = "greedy"
        path.write_text(json.dumps(d))
    r = draft_entry(path, tmp_path / "out")
    src = (r.out_dir / "repro.py").read_text()
    compile(src, "repro.py", "exec")
    assert marker in src and 'if __name__ == "__main__":' in src
    assert "from specfuzz" not in src or engine["name"] == "my-engine"
    issue = (r.out_dir / "ISSUE.md").read_text()
    assert "torch" not in engine or f"| torch | {engine['torch']} |" in issue  # recorded, until a verification captures it
    assert "--correct" not in issue  # only the reference sampler has an injected bug to switch off
    for other in ("vllm", "sglang", "transformers"):  # what one engine needs stays out of the others' scripts
        if other not in engine["name"]:
            assert f"import {other}" not in src, other


def test_vllm_repro_maps_settings_like_the_adapter(tmp_path):
    """The request in repro.py is vllm.SamplingParams' arguments as the vLLM adapter maps them (its own
    function, without the seed the script adds per request), the draft checkpoint the padded square table."""
    from specfuzz.engines.base import Request
    from specfuzz.engines.vllm_engine import sampling_kwargs
    from specfuzz.oracle.params import SamplingParams

    path = _engine_entry(tmp_path, {"name": "vllm", "version": "0.32.0"})
    mod = _load_module(draft_entry(path, tmp_path / "o").out_dir / "repro.py")
    case = Case.from_json(json.loads(path.read_text())["case"])
    want = sampling_kwargs(Request(case.prompt, SamplingParams.from_json(case.params.to_json()), None),
                           vocab_size=case.vocab_size, max_model_len=64, speculating=True)
    assert mod.SAMPLING == {k: v for k, v in want.items() if k != "seed"}
    assert mod.LAUNCH["speculative_config"]["num_speculative_tokens"] == 2 and mod.LAUNCH["max_model_len"] == 64
    assert len(mod.DRAFT_TABLE) == 4 and mod.DRAFT_TABLE[0][2] == -32768.0  # padded square draft
    assert "BAD_WORDS" not in vars(mod) and "STRUCTURED" not in vars(mod)  # only where the request has them


@pytest.mark.slow
def test_hf_repro_runs_transformers_and_passes_on_a_correct_configuration(tmp_path):
    """A real engine: HF assisted generation with an equal-width draft samples μ exactly."""
    d = copy.deepcopy(_regression("N2"))  # min_tokens and EOS: processors on
    d["case"]["spec"]["num_speculative_tokens"] = 2
    d.update(kind="finding", engine={"name": "hf-transformers", "version": "5.19.0"})
    d["attribution"]["label"] = "unknown"
    p = tmp_path / "finding-hf.json"
    p.write_text(json.dumps(d))
    r = draft_entry(p, tmp_path / "out")
    proc = _run([sys.executable], r.out_dir / "repro.py", "--samples", "300", timeout=300)
    assert _last_line(proc) == "PASS", proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "engine: transformers" in proc.stdout


# ----------------------------------------------------------------------------- scrubbing


def _identified_entry(tmp_path: Path, base: dict, name: str) -> Path:
    d = copy.deepcopy(base)
    d["engine"].update(hostname=FAKE_HOST, user=FAKE_USER, cwd=FAKE_PATH, device=f"cpu (probed from {FAKE_PATH}/dev)")
    d["log"] = (f"Traceback (most recent call last):\n  File \"{FAKE_PATH}/venv/lib/python3.11/site-packages/torch/nn/x.py\","
                f" line 3\nRuntimeError: boom on host {FAKE_HOST} (user {FAKE_USER}, 10.1.2.3)\n")
    d["evidence"] = d.get("evidence") or f"engine raise: RuntimeError in {FAKE_PATH}/run.py"
    d["extra"] = {**d.get("extra", {}), "note": f"ran in {FAKE_PATH} by {FAKE_USER}@{FAKE_HOST}",
                  "engine_settings": {"download_dir": f"{FAKE_PATH}/models", "seed_mode": "batch"}}
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return p


@pytest.mark.parametrize("kind", ["finding", "crash"])
def test_drafts_never_name_the_machine_that_ran_the_campaign(tmp_path, kind):
    base = _regression("N6")
    if kind == "crash":
        base = {**base, "kind": "crash", "counts": [], "verdict": None, "attribution": None,
                "evidence": f"engine raise: RuntimeError at {FAKE_PATH}/a.py", "extra": {"crash_kind": "raise"}}
    path = _identified_entry(tmp_path, base, f"{kind}-identified.json")
    r = draft_entry(path, tmp_path / "draft")
    texts = {p.name: p.read_text() for p in r.out_dir.iterdir() if p.suffix in (".md", ".py")}
    assert set(texts) == {"ISSUE.md", "repro.py"}
    for name, text in texts.items():
        for secret in (FAKE_PATH, "/home/", FAKE_USER, FAKE_HOST, "gpu-node-42", "corp.example.com", "10.1.2.3"):
            assert secret not in text, (name, secret)
    issue = texts["ISSUE.md"]
    if kind == "crash":
        assert "site-packages/torch/nn/x.py" in issue and "RuntimeError: boom on host [redacted] (user [redacted], [ip])" in issue
    assert "| device | cpu (probed from [path]) |" in issue


def test_scrubber_keeps_what_maintainers_need():
    s = Scrubber({FAKE_USER, FAKE_HOST, "root"})
    assert s.text(f"{FAKE_PATH}/lib/python3.11/site-packages/vllm/v1/sample.py:12") == "python3.11/site-packages/vllm/v1/sample.py:12"
    assert s.text("see https://github.com/vllm-project/vllm/issues/55005") == "see https://github.com/vllm-project/vllm/issues/55005"
    assert s.text("p = 1/2, (p - q)+, tokens 0/1") == "p = 1/2, (p - q)+, tokens 0/1"
    assert s.text(f"hostname={FAKE_HOST} user {FAKE_USER}") == "hostname=[host] user [redacted]"
    assert s.text("root cause: the root of it") == "root cause: the root of it"  # generic user names are words
    assert s.value({"hostname": "x", "device": f"cpu {FAKE_PATH}"}) == {"device": "cpu [path]"}


# ----------------------------------------------------------------------------- CLI


def test_draft_command_writes_to_drafts_stem_by_default_and_finds_entries_by_name(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    (corpus / "regression").mkdir(parents=True)
    shutil.copy(REGRESSION / "regression-N5.json", corpus / "regression" / "regression-N5.json")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(draft_cmd, ["corpus/regression/regression-N5.json"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "drafts" / "regression-N5").iterdir()) == ["ISSUE.md", "plot.png", "repro.py"]
    result = CliRunner().invoke(draft_cmd, ["N5", "--out", "elsewhere", "--samples", "777"])
    assert result.exit_code == 0, result.output
    assert "SAMPLES = 777" in (tmp_path / "elsewhere" / "repro.py").read_text()
    assert resolve_entry("regression-N5", corpus).name == "regression-N5.json"
    bad = CliRunner().invoke(main, ["draft", "no-such-entry"])
    assert bad.exit_code == 2 and "no such entry file" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_a_redraft_keeps_the_verification_of_an_unchanged_repro_and_drops_a_changed_ones(tmp_path):
    """Redrafting (e.g. after a bisection added the releases affected) keeps the Verification
    section only while repro.py is byte for byte the script that was run."""
    from specfuzz.fuzz.draft.verify import SECTION, Verification, record

    path = _engine_entry(tmp_path, {"name": "vllm", "version": "0.32.0"})
    out = draft_entry(path, tmp_path / "d").out_dir
    record(out / "ISSUE.md", Verification("FAIL", "engine: vllm 0.32.0", "2026-12-02T00:00:00+00:00", 12.0, 1, "FAIL", "python repro.py"),
           env="vLLM Version : 0.32.0 (from collect_env)")
    draft_entry(path, out)
    text = (out / "ISSUE.md").read_text()
    assert text.count(SECTION) == 1 and "printed `FAIL` after 12 s" in text
    assert "```text\nvLLM Version : 0.32.0 (from collect_env)\n```" in text and "Not captured yet" not in text
    (out / "repro.py").write_text((out / "repro.py").read_text() + "\n# edited\n")
    draft_entry(path, out)
    text = (out / "ISSUE.md").read_text()
    assert SECTION not in text and "from collect_env" not in text and "Not captured yet" in text


def _repro_test(monkeypatch, vocab: int, max_tokens: int, focus=None):
    """The repro template's test functions as a module, its data set for a small law."""
    import specfuzz.fuzz.draft.templates.repro_main as rm

    monkeypatch.setattr(rm, "TARGET_TABLE", [[0.0] * vocab] * vocab)
    monkeypatch.setattr(rm, "MAX_TOKENS", max_tokens)
    monkeypatch.setattr(rm, "DEPTH", None)
    monkeypatch.setattr(rm, "FOCUS", focus)
    return rm


def _tree_law(root, rest, depth):
    """mu over outputs of up to ``depth`` tokens over V=4, token 3 ends an output: the next token
    after the empty prefix follows ``root``, after any other prefix ``rest``."""
    mu = {}

    def walk(prefix, p):
        if len(prefix) == depth:
            mu[prefix] = p
            return
        for s, q in enumerate(root if not prefix else rest):
            if s == 3:
                mu[prefix + (3,)] = p * q
            else:
                walk(prefix + (s,), p * q)

    walk((), 1.0)
    return {y: p for y, p in mu.items() if p > 0}


def test_the_repro_e_value_is_a_fair_bet_under_mu_and_its_focus_finds_a_deviation_among_many_outputs(monkeypatch):
    """repro.py's e-value (the KT mixture over outputs averaged with the KT mixture over the next step
    after the finding's prefix) has mean at most 1 under mu after 1, 2 and 3 samples (enumerated: a
    test supermartingale, so looking after every batch is fine), and is infinite once an output mu
    forbids is drawn; a deviation of the first token's law spread over 121 outputs, which the test over
    all outputs misses at 3000 samples, the focus on the first step finds."""
    import itertools
    from collections import Counter

    root = [0.5, 0.3, 0.0, 0.2]
    small = _tree_law(root, [0.6, 0.3, 0.0, 0.1], depth=2)
    focus = {"context": [], "law": [[t, p] for t, p in enumerate(root) if p > 0]}
    rm = _repro_test(monkeypatch, vocab=4, max_tokens=2, focus=focus)
    outs = list(small)
    assert abs(sum(small.values()) - 1) < 1e-12
    for n in (1, 2, 3):
        mean = sum(math.prod(small[y] for y in ys) * math.exp(rm.log_e_value(Counter(ys), small))
                   for ys in itertools.product(outs, repeat=n))
        assert 0.1 < mean <= 1.0 + 1e-9, (n, mean)
    assert rm.log_e_value(Counter({(2,): 1, (0, 0): 5}), small) == math.inf  # token 2 has probability 0
    assert rm.log_e_value(Counter({(0, 0, 0): 1}), small) == math.inf  # longer than max_tokens
    rest = [0.3, 0.3, 0.2, 0.2]
    mu = _tree_law([0.3, 0.3, 0.2, 0.2], rest, depth=4)
    bad = _tree_law([0.38, 0.22, 0.2, 0.2], rest, depth=4)
    assert len(mu) == 121
    counts = Counter({y: round(3000 * p) for y, p in bad.items() if round(3000 * p)})
    rm = _repro_test(monkeypatch, vocab=4, max_tokens=4, focus={"context": [], "law": [[t, 0.3 if t < 2 else 0.2] for t in range(4)]})
    flat = rm.kt_log_e(counts, mu)
    both = rm.log_e_value(counts, mu)
    assert flat < 0 and both >= math.log(1e3)  # FAIL at alpha = 1e-3 through the focus


def test_observations_stored_with_an_entry_are_part_of_its_issue(tmp_path):
    """extra.observations (what was measured after the campaign, e.g. the same repro under
    another engine setting) appear in ISSUE.md with their dates; entries without them draft as before."""
    src = Path(__file__).resolve().parents[1] / "corpus" / "h200" / "sglang" / "finding-065f698102ca951f.json"
    d = json.loads(src.read_text())
    d["extra"]["observations"] = [{"date": "2026-12-02", "text": "With max_running_requests=48 it passes."}, {"no": "text"}]
    entry = tmp_path / "finding-065f698102ca951f.json"
    entry.write_text(json.dumps(d))
    draft_entry(entry, tmp_path / "d")
    text = (tmp_path / "d" / "ISSUE.md").read_text()
    assert "\n- With max_running_requests=48 it passes. (2026-12-02)\n" in text
    del d["extra"]["observations"]
    entry.write_text(json.dumps(d))
    draft_entry(entry, tmp_path / "e")
    assert "max_running_requests=48 it passes" not in (tmp_path / "e" / "ISSUE.md").read_text()


def test_a_repro_draws_enough_samples_to_reach_a_rare_context_again():
    """A finding whose evidence sits in a context met once in 1000 samples (the stored
    h200/sglang/finding-75b4: (0, 1), then a token after the stop token) gets a repro that
    reaches that context 10 times on average; common contexts keep 3x the finding's samples."""
    from specfuzz.fuzz.draft.repro import RARE_CONTEXT_VISITS, default_samples

    rare = prepare(Entry.from_json(json.loads((ROOT / "corpus/h200/sglang/finding-75b41651564d695e.json").read_text())), "rare")
    assert rare.entry.verdict["worst_token"]["context_count"] == 1 and rare.entry.verdict["n"] == 1000
    assert default_samples(rare) == RARE_CONTEXT_VISITS * 1000
    common = prepare(Entry.from_json(json.loads((ROOT / "corpus/h200/sglang/finding-8b9042d26fcb0d58.json").read_text())), "common")
    assert default_samples(common) == 1500  # context (0,) in half of 500 samples: 3 x 500


def test_the_methods_an_entry_was_met_again_under_are_named_in_its_issue(tmp_path):
    """extra.also_seen_under (the other methods of the engine's path the campaign met the
    finding under, Campaign._known_finding) is said in ISSUE.md; without it nothing is."""
    src = Path(__file__).resolve().parents[1] / "corpus" / "h200" / "sglang" / "finding-0cd766f4252535f9.json"
    d = json.loads(src.read_text())
    d["extra"]["also_seen_under"] = ["eagle", "eagle3"]
    entry = tmp_path / src.name
    entry.write_text(json.dumps(d))
    draft_entry(entry, tmp_path / "d")
    assert "The same failure was met under `eagle` and `eagle3` too" in (tmp_path / "d" / "ISSUE.md").read_text()
    del d["extra"]["also_seen_under"]
    entry.write_text(json.dumps(d))
    draft_entry(entry, tmp_path / "e")
    assert "failure was met under" not in (tmp_path / "e" / "ISSUE.md").read_text()


def test_github_format_prints_the_engines_title_labels_form_and_a_body_with_repro_inlined(tmp_path):
    """`specfuzz draft ENTRY --format github`: the title with the form's prefix, its labels and address,
    then the body (no heading, the plot as an attachment to add, repro.py inlined); the summary on stderr."""
    path = _engine_entry(tmp_path, {"name": "vllm", "version": "0.32.0", "device": "cpu"})
    res = CliRunner().invoke(main, ["draft", str(path), "--out", str(tmp_path / "g"), "--format", "github"])
    assert res.exit_code == 0, res.output
    out = res.stdout
    lines = out.splitlines()
    assert lines[0].startswith("Title: [Bug]: vLLM 0.32.0: draft_model speculative decoding (K=2)")
    assert lines[1] == "Labels: bug" and lines[2].startswith("Form: https://github.com/vllm-project/vllm/issues/new")
    body = out.split("\n\n", 1)[1]
    assert body.startswith("### Your current environment") and "### 🐛 Describe the bug" in body
    assert "(plot.png)" not in body and "attach plot.png here" in body
    repro = (tmp_path / "g" / "repro.py").read_text()
    assert f"<summary>repro.py ({len(repro.splitlines())} lines)</summary>" in body and repro.rstrip() in body
    assert "wrote" in res.stderr and "wrote" not in out


@pytest.mark.parametrize("engine, sections", [
    ("vllm", ["### Your current environment", "<code>python -m vllm.collect_env</code>", "### 🐛 Describe the bug"]),
    ("sglang", ["### Checklist", "### Describe the bug", "### Reproduction", "### Environment",
                "<code>python3 -m sglang.check_env</code>"]),
    ("hf-transformers", ["### System Info", "<code>transformers env</code>", "### Information", "### Tasks",
                         "### Reproduction", "### Expected behavior"]),
])
def test_each_issue_follows_its_engines_bug_report_form_with_the_maths_below_the_fold(tmp_path, engine, sections):
    path = _engine_entry(tmp_path, {"name": engine, "version": "1.0"})
    if engine == "sglang":  # SGLang's STANDALONE drafter is greedy (the adapter refuses sampled drafts)
        d = json.loads(path.read_text())
        d["case"]["spec"]["draft_sampling"] = "greedy"
        path.write_text(json.dumps(d))
    issue = (draft_entry(path, tmp_path / "d").out_dir / "ISSUE.md").read_text()
    pos = [issue.index(s) for s in sections]
    assert pos == sorted(pos), sections  # in the form's order
    top = issue.split("<details><summary>The model", 1)[0]
    assert "**With draft_model speculative decoding (K=2)" in top and "Trigger: `draft_model` speculation with K=2" in top
    assert "#### The model" in issue and issue.index("#### The model") > issue.index("<details><summary>The model")
    assert "Impact on a real model: not measured yet" in top
