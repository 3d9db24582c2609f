"""The SGLang adapter: mapping tests on any machine, the real engine on a CUDA GPU.


Tests marked ``gpu`` start the real engine (through ``IsolatedEngine("sglang")``, one
process per engine: SGLang's shutdown kills every child of its process) on bfloat16 table
checkpoints and judge its samples against the exact law μ under the "sglang" profile;
they are skipped unless CUDA and SGLang are importable. What is checked without SGLang:
``test_sglang_mapping.py`` (the mapping), ``test_sglang_config.py`` (configs and swap plans),
``test_isolation_nondaemon.py`` (the non-daemon isolation SGLang needs).
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from specfuzz.case import Case
from specfuzz.engines.base import Request
from specfuzz.engines.isolation import IsolatedEngine
from specfuzz.engines.sglang_engine import (
    SGLANG_DEFAULTS,
    SPEC_DEFAULTS,
)
from specfuzz.fuzz.run import engine_config, run_case
from specfuzz.oracle.params import SamplingParams as SP
from specfuzz.oracle.speculative import SpecConfig

from sglang_helpers import EOS, PROMPT, T, V


# ----------------------------------------------------------------------------- the real engine (CUDA)


def _gpu_available() -> bool:
    if importlib.util.find_spec("sglang") is None:
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not _gpu_available(), reason="needs CUDA and SGLang")

ALPHA = 1e-3
N_OFF = 3000
N_ON = 3000
N_GREEDY = 200
DTYPE = "bfloat16"

OFF_SETTINGS = {
    "temperature-1": SP(max_tokens=3),
    "temperature-0.5": SP(max_tokens=3, temperature=0.5),
    "top_k": SP(max_tokens=3, top_k=3),
    "top_p": SP(max_tokens=3, top_p=0.7),
    "top_k+top_p": SP(max_tokens=3, top_k=3, top_p=0.6),
    "min_p": SP(max_tokens=3, min_p=0.3),
    "stop_token": SP(max_tokens=4, stop_token_ids=(3,)),
    "repetition_penalty": SP(max_tokens=3, repetition_penalty=1.5),
    "frequency_penalty": SP(max_tokens=4, frequency_penalty=0.75),
    "presence_penalty": SP(max_tokens=4, presence_penalty=1.25),
    "logit_bias": SP(max_tokens=3, logit_bias={0: 1.5, 2: -2.0}),
    "ignore_eos": SP(max_tokens=3, ignore_eos=True),
}


def _case(params: SP, **kw) -> Case:
    return Case(T, PROMPT, params, eos_token_id=EOS, **kw)


@pytest.fixture(scope="module")
def off_engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("sglang-off")
    eng = IsolatedEngine("sglang", log_dir=root / "logs")
    yield eng, root
    eng.close()


def _run(eng, root, case, n, *, speculation=False, batch=1000):
    return run_case(eng, case, ckpt_root=root, alpha=ALPHA, max_samples=n, batch=batch, profile="sglang",
                    dtype=DTYPE, speculation=speculation)


@gpu
@needs_gpu
@pytest.mark.parametrize("name", list(OFF_SETTINGS))
def test_gpu_speculation_off_agrees_with_mu(off_engine, name):
    eng, root = off_engine
    run = _run(eng, root, _case(OFF_SETTINGS[name]), N_OFF)
    assert run.crash is None, run.crash
    assert run.judgement.verdict.status != "fail", run.judgement.verdict.evidence
    assert run.n == N_OFF


@gpu
@needs_gpu
def test_gpu_greedy_without_ties_is_the_argmax(off_engine):
    eng, root = off_engine
    case = _case(SP(max_tokens=3, temperature=0.0))  # the argmax path from PROMPT has no tie in T
    run = _run(eng, root, case, N_GREEDY)
    assert run.judgement.verdict.status == "pass", run.judgement.verdict.evidence
    assert len(run.counts) == 1


@gpu
@needs_gpu
def test_gpu_logprobs_reproduce_the_table(off_engine):
    eng, root = off_engine
    eng.start(engine_config(_case(SP()), root, dtype=DTYPE, speculation=False))
    report = eng.call("logits_match_table", list(range(V)) + [2, 4])
    assert report.ok, report.to_json()
    assert set(report.contexts) == set(range(V))


@gpu
@needs_gpu
def test_gpu_outputs_include_their_stop_token(off_engine):
    eng, root = off_engine
    eng.start(engine_config(_case(SP()), root, dtype=DTYPE, speculation=False))
    outs = eng.generate([Request(PROMPT, SP(max_tokens=4, stop_token_ids=(3,)))] * 300)
    for o in outs:
        assert o.finish_reason in ("stop", "length")
        if o.finish_reason == "stop":
            assert o.token_ids[-1] in (3, EOS) and all(t not in (3, EOS) for t in o.token_ids[:-1])
        else:
            assert len(o.token_ids) == 4


SPEC_CASES = [
    ("ngram-K1", SpecConfig("ngram", 1, ngram_max=2), None),
    ("ngram-K3", SpecConfig("ngram", 3, ngram_max=3), None),
    ("ngram_tree", SpecConfig("ngram_tree", 2, ngram_max=2, tree_topk=2, tree_budget=4), None),
    ("standalone-identical-K3", SpecConfig("draft_model", 3, draft_sampling="greedy"), T),
    ("standalone-narrower-K2", SpecConfig("draft_model", 2, draft_sampling="greedy"), T[:, :4]),
    ("standalone-tree", SpecConfig("eagle_tree", 2, draft_sampling="greedy", tree_topk=2, tree_budget=4), T),
    ("eagle-K2", SpecConfig("eagle", 2, draft_sampling="greedy"), T),
    ("eagle3-reduced-K2", SpecConfig("eagle3", 2, draft_sampling="greedy"), T[:, :4]),
    ("eagle3-rejection-sampling-K2", SpecConfig("eagle3", 2), T),
]


@pytest.fixture(scope="module", params=SPEC_CASES, ids=[s[0] for s in SPEC_CASES])
def spec_engine(request, tmp_path_factory):
    name, spec, draft = request.param
    root = tmp_path_factory.mktemp(f"sglang-{name}")
    eng = IsolatedEngine("sglang", log_dir=root / "logs")
    yield name, eng, root, _case(SP(max_tokens=3), spec=spec, draft_table=draft)
    eng.close()


@gpu
@needs_gpu
def test_gpu_speculation_on_greedy_agrees_with_mu(spec_engine):
    name, eng, root, case = spec_engine
    case = case.with_(params=SP(max_tokens=3, temperature=0.0))
    run = _run(eng, root, case, N_GREEDY, speculation=True, batch=200)
    assert run.crash is None, run.crash
    assert run.judgement.verdict.status != "fail", f"{name}: {run.judgement.verdict.evidence}"


@gpu
@needs_gpu
def test_gpu_speculation_on_random_sampling_agrees_with_mu(spec_engine):
    name, eng, root, case = spec_engine
    run = _run(eng, root, case, N_ON, speculation=True)
    assert run.crash is None, run.crash
    assert run.proposed > 0
    assert run.judgement.verdict.status != "fail", f"{name}: {run.judgement.verdict.evidence}"


@gpu
@needs_gpu
def test_gpu_eagle_heads_draft_exactly_from_their_tables(tmp_path):
    """Greedy target and drafts: SGLang's accepted counts equal those predicted from the
    heads' tables (EAGLE, reduced EAGLE-3, full-width permuted EAGLE-3)."""
    from specfuzz.engines.headcheck import check_heads

    report = check_heads("sglang", tmp_path, dtype=DTYPE)
    assert report["ok"], json.dumps(report, default=str)[:4000]


# ----------------------------------------------------------------------------- table swaps on the real engine (CUDA)

N_SWAPS = 200
N_PER_TABLE = 300


def _table_case(seed: int, spec, *, V=V, draft_width=None) -> Case:
    """A random table model (and draft) with values exact in bfloat16; every draw shares
    the shapes, so all of them swap into one engine."""
    rng = np.random.default_rng(seed)
    table = (rng.integers(-8, 9, (V, V)) / 4).astype(np.float32)  # [V, V]
    draft = None
    if spec is not None and spec.uses_draft_model:
        draft = (rng.integers(-8, 9, (V, draft_width or V)) / 4).astype(np.float32)  # [V, V_draft]
    return Case(table, PROMPT, SP(max_tokens=3), eos_token_id=EOS, spec=spec, draft_table=draft)


def _sample_and_judge(eng, case: Case, n: int, alpha: float, seed0: int):
    from specfuzz.oracle.judge import CaseTest

    test = CaseTest(case, alpha=alpha, profile="sglang", with_bug_laws=False)
    outs = eng.generate([Request(case.prompt, case.params, seed0 + i) for i in range(n)])
    test.update([tuple(o.token_ids) for o in outs])
    return test.judgement(n_planned=n).verdict


def _swap_and_check(eng, cfg):
    report = eng.call("swap", cfg)
    check = eng.call("check_tables")
    return report, check


@gpu
@needs_gpu
def test_gpu_200_tables_swapped_into_one_engine_each_pass_the_table_check_and_agree_with_mu(tmp_path):
    spec = SpecConfig("ngram_tree", 2, ngram_max=2, tree_topk=3, tree_topk_min=1, tree_budget=5)
    alpha = ALPHA / N_SWAPS  # no false alarm over the whole run
    eng = IsolatedEngine("sglang", log_dir=tmp_path / "logs")
    try:
        first = _table_case(0, spec)
        eng.start(engine_config(first, tmp_path, dtype=DTYPE))
        assert eng.call("check_tables").ok
        for i in range(1, N_SWAPS + 1):
            case = _table_case(i, spec)
            # The isolation layer swaps in place and runs check_tables before returning.
            eng.start(engine_config(case, tmp_path, dtype=DTYPE))
            assert eng.swaps == i and not eng.events, eng.events
            report = eng.last_swap
            assert report.parts == ("target",) and set(report.reset) == {"prefix cache", "ngram trie"}, report
            verdict = _sample_and_judge(eng, case, N_PER_TABLE, alpha, seed0=i * N_PER_TABLE)
            assert verdict.status != "fail", f"table {i}: {verdict.evidence}"
        assert eng.starts == 1
        check = eng.call("check_tables")
        assert check.ok and check.rows == V, check.detail
    finally:
        eng.close()


SWAP_METHODS = [
    ("off", None, None),
    ("ngram-default", SpecConfig("ngram_tree", **SPEC_DEFAULTS["ngram_tree"], engine_default=True), None),
    ("standalone-draft", SpecConfig("draft_model", 2, draft_sampling="greedy"), None),
    ("standalone-narrower-draft", SpecConfig("draft_model", 2, draft_sampling="greedy"), 4),
    ("eagle", SpecConfig("eagle", 2, draft_sampling="greedy"), None),
    ("eagle3-full-width", SpecConfig("eagle3", 2, draft_sampling="greedy"), None),
]


@gpu
@needs_gpu
@pytest.mark.parametrize("name,spec,width", SWAP_METHODS, ids=[m[0] for m in SWAP_METHODS])
def test_gpu_swaps_of_target_draft_and_heads_are_proven_and_agree_with_mu(tmp_path, name, spec, width):
    n_tables = 10
    eng = IsolatedEngine("sglang", log_dir=tmp_path / "logs")
    try:
        eng.start(engine_config(_table_case(0, spec, draft_width=width), tmp_path, dtype=DTYPE, speculation=spec is not None))
        assert eng.call("check_tables").ok
        for i in range(1, n_tables + 1):
            case = _table_case(i, spec, draft_width=width)
            report, check = _swap_and_check(eng, engine_config(case, tmp_path, dtype=DTYPE, speculation=spec is not None))
            want = {"target"} | ({"head"} if name.startswith("eagle") else {"draft"} if spec is not None and spec.uses_draft_model else set())
            assert set(report.parts) == want, report
            assert check.ok, check.detail
            verdict = _sample_and_judge(eng, case, N_PER_TABLE, ALPHA / n_tables, seed0=i * N_PER_TABLE)
            assert verdict.status != "fail", f"{name} table {i}: {verdict.evidence}"
    finally:
        eng.close()


@gpu
@needs_gpu
def test_gpu_swap_into_a_table_of_another_shape_is_refused_and_a_fresh_engine_serves_it(tmp_path):
    from specfuzz.engines.base import SwapUnsupported

    spec = SpecConfig("ngram", 2)
    eng = IsolatedEngine("sglang", log_dir=tmp_path / "logs")
    try:
        eng.start(engine_config(_table_case(0, spec), tmp_path, dtype=DTYPE))
        wider = _table_case(1, spec, V=V + 1)
        cfg = engine_config(wider, tmp_path, dtype=DTYPE)
        with pytest.raises(SwapUnsupported, match="running engine's shapes"):
            eng.call("swap", cfg)
        # The engine still serves its own table, untouched.
        assert eng.call("check_tables").ok
        eng.start(cfg)  # what the isolation layer does with another shape: a fresh start
        assert eng.starts == 2 and eng.swaps == 0
        assert eng.call("check_tables").ok
        verdict = _sample_and_judge(eng, wider, N_PER_TABLE, ALPHA, seed0=0)
        assert verdict.status != "fail", verdict.evidence
    finally:
        eng.close()


@gpu
@needs_gpu
@pytest.mark.parametrize("method", sorted(SPEC_DEFAULTS))
def test_gpu_engine_defaults_run_sglangs_own_defaults_and_agree_with_mu(tmp_path, method):
    spec = SpecConfig(method, **SPEC_DEFAULTS[method], engine_default=True)
    case = _table_case(0, spec)
    algo = {"ngram_tree": "NGRAM", "draft_model": "STANDALONE", "eagle": "EAGLE", "eagle3": "EAGLE3"}[method]
    eng = IsolatedEngine("sglang", log_dir=tmp_path / "logs")
    try:
        eng.start(engine_config(case, tmp_path, dtype=DTYPE))
        resolved = eng.call("resolved_speculation")
        assert {k: resolved[k] for k in SGLANG_DEFAULTS[algo]} == SGLANG_DEFAULTS[algo], resolved
        run = _run(eng, tmp_path, case, N_ON, speculation=True)
        assert run.crash is None, run.crash
        assert run.judgement.verdict.status != "fail", f"{method}: {run.judgement.verdict.evidence}"
    finally:
        eng.close()
