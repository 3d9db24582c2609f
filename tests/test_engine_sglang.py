"""The SGLang adapter: mapping tests on any machine, the real engine on a CUDA GPU.

SGLang needs CUDA, so most of this file checks what can be checked without it, against
SGLang 0.5.17's own source where it is at hand (``SGLANG_SITE``, default
``/tmp/sglang-gpu-bundle/site``: the unpacked wheel; read with ``ast``, never imported,
its compiled dependencies are for the GPU machine's Python): every key the adapter sends
to ``sglang.Engine`` is a ``ServerArgs`` field and every sampling key a ``SamplingParams``
field of that version; the speculation mapping for every method and knob; the sampling
mapping and what it refuses; output normalisation; config validation; the non-daemon
isolation SGLang needs (a child that starts processes, and the guarantee that nothing
outlives a killed caller).

Tests marked ``gpu`` start the real engine (through ``IsolatedEngine("sglang")``, one
process per engine: SGLang's shutdown kills every child of its process) on bfloat16 table
checkpoints and judge its samples against the exact law μ under the "sglang" profile;
they are skipped unless CUDA and SGLang are importable.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from specfuzz.case import Case
from specfuzz.engines.base import EngineConfig, Request
from specfuzz.engines.checkpoints import materialize
from specfuzz.engines.isolation import EngineCrash, IsolatedEngine
from specfuzz.engines.reference_engine import ReferenceEngine
from specfuzz.engines.sglang_engine import (
    DEFAULT_SETTINGS,
    SETTINGS_ENV,
    SGLANG_DEFAULTS,
    SPEC_DEFAULTS,
    SGLangEngine,
    completion_from_output,
    row_prompts,
    sampling_params_dict,
    speculative_kwargs,
    unknown_server_args,
)
from specfuzz.errors import InvalidInput
from specfuzz.fuzz.run import engine_config, run_case
from specfuzz.oracle.params import SamplingParams as SP
from specfuzz.oracle.speculative import SpecConfig

SGLANG_SITE = Path(os.environ.get("SGLANG_SITE", "/tmp/sglang-gpu-bundle/site"))
V, EOS = 6, 5
PROMPT = (1, 2, 1, 2)
_rng = np.random.default_rng(2025)
T = (_rng.integers(-8, 9, (V, V)) / 4).astype(np.float32)  # [V, V] multiples of 1/4: exact in bfloat16


def _class_fields(path: Path, cls: str) -> frozenset[str]:
    """Annotated field names of a class in a source file (parsed, not imported)."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return frozenset(n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name))
    raise AssertionError(f"{cls} not found in {path}")


@pytest.fixture(scope="module")
def server_args_fields() -> frozenset[str]:
    path = SGLANG_SITE / "sglang/srt/server_args.py"
    if not path.is_file():
        pytest.skip(f"SGLang source not found at {SGLANG_SITE} (set SGLANG_SITE)")
    return _class_fields(path, "ServerArgs")


@pytest.fixture(scope="module")
def sampling_fields() -> frozenset[str]:
    path = SGLANG_SITE / "sglang/srt/sampling/sampling_params.py"
    if not path.is_file():
        pytest.skip(f"SGLang source not found at {SGLANG_SITE} (set SGLANG_SITE)")
    return _class_fields(path, "SamplingParams")


# ----------------------------------------------------------------------------- speculation mapping


def test_ngram_chain_maps_to_ngram_with_breadth_one_and_k_plus_one_draft_tokens():
    kw = speculative_kwargs(SpecConfig("ngram", 3, ngram_min=1, ngram_max=2))
    assert kw == {
        "speculative_algorithm": "NGRAM",
        "speculative_num_draft_tokens": 4,  # the root (last verified token) counts as one
        "speculative_ngram_min_bfs_breadth": 1,
        "speculative_ngram_max_bfs_breadth": 1,
        "speculative_ngram_max_trie_depth": 5,  # ngram_max + K
        "speculative_num_steps": 4,
    }


def test_ngram_tree_maps_topk_to_bfs_breadth_and_budget_to_draft_tokens():
    kw = speculative_kwargs(SpecConfig("ngram_tree", 2, ngram_min=1, ngram_max=3, tree_topk=3, tree_budget=5))
    assert kw["speculative_algorithm"] == "NGRAM"
    assert kw["speculative_num_draft_tokens"] == 6
    assert kw["speculative_ngram_min_bfs_breadth"] == kw["speculative_ngram_max_bfs_breadth"] == 3
    assert kw["speculative_ngram_max_trie_depth"] == 5
    assert kw["speculative_num_steps"] == 2  # 6 // 3, as SGLang's _handle_ngram derives it
    small = speculative_kwargs(SpecConfig("ngram_tree", 1, tree_topk=3, tree_budget=1))
    assert small["speculative_num_steps"] == 1  # 2 // 3 = 0 would leave SGLang without a step


def test_draft_model_chain_maps_to_standalone_topk_one(tmp_path):
    kw = speculative_kwargs(SpecConfig("draft_model", 3, draft_sampling="greedy"), draft_dir=tmp_path, target_vocab=6, draft_vocab=6)
    assert kw == {
        "speculative_algorithm": "STANDALONE",
        "speculative_draft_model_path": str(tmp_path),
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4,
    }


@pytest.mark.parametrize(
    "K,topk,budget,steps,want_topk,nodes",
    [
        (2, 2, 4, 2, 2, 4),  # fits: 2 + 1 * 4 = 6 candidates
        (1, 2, 5, 1, 2, 2),  # one step: only topk candidates exist
        (3, 1, 2, 2, 1, 2),  # topk 1: a chain of min(K, budget)
        (3, 1, 6, 3, 1, 3),
        (3, 3, 6, 3, 3, 6),
    ],
)
def test_eagle_tree_maps_to_standalone_tree_within_sglangs_candidate_count(tmp_path, K, topk, budget, steps, want_topk, nodes):
    spec = SpecConfig("eagle_tree", K, draft_sampling="greedy", tree_topk=topk, tree_budget=budget)
    kw = speculative_kwargs(spec, draft_dir=tmp_path, target_vocab=6, draft_vocab=6)
    assert kw["speculative_algorithm"] == "STANDALONE"
    assert (kw["speculative_num_steps"], kw["speculative_eagle_topk"], kw["speculative_num_draft_tokens"]) == (steps, want_topk, nodes + 1)


@pytest.mark.parametrize(
    "spec,needle",
    [
        (SpecConfig("eagle", 1), "draft_dir"),
        (SpecConfig("suffix", 1), "speculation.method='suffix'"),
        (SpecConfig("draft_model", 2, verify="block"), "speculation.verify='block'"),
        (SpecConfig("ngram", 2, inject="N4"), "speculation.inject='N4'"),
        (SpecConfig("draft_model", 2), "speculation.draft_sampling='sampled'"),
        (SpecConfig("eagle_tree", 2), "speculation.draft_sampling='sampled'"),
        (SpecConfig("draft_model", 2, draft_sampling="greedy", draft_temperature=0.5), "draft_temperature=0.5"),
        (SpecConfig("ngram", 2, ngram_min=2, ngram_max=3), "speculation.ngram_min=2"),
    ],
)
def test_speculation_sglang_cannot_run_as_specified_is_refused_naming_the_knob(tmp_path, spec, needle):
    with pytest.raises(InvalidInput) as info:
        speculative_kwargs(spec, draft_dir=None if needle == "draft_dir" else tmp_path, target_vocab=6, draft_vocab=6)
    assert needle in str(info.value), str(info.value)


def test_sampled_drafts_from_a_reduced_eagle3_vocabulary_are_refused_with_sglangs_reason(tmp_path):
    with pytest.raises(InvalidInput, match="share one vocab") as info:
        speculative_kwargs(SpecConfig("eagle3", 2), draft_dir=tmp_path, target_vocab=6, draft_vocab=4)
    assert "draft_sampling='sampled'" in str(info.value)
    kw = speculative_kwargs(SpecConfig("eagle3", 2, draft_sampling="greedy"), draft_dir=tmp_path, target_vocab=6, draft_vocab=4)
    assert kw["speculative_use_rejection_sampling"] is False


def test_heads_switched_off_are_refused_naming_the_switch(monkeypatch, tmp_path):
    import specfuzz.engines.sglang_engine as sg
    import specfuzz.engines.sglang_mapping as sm

    monkeypatch.setattr(sm, "HEADS_ENABLED", False)
    with pytest.raises(InvalidInput, match="HEADS_ENABLED"):
        speculative_kwargs(SpecConfig("eagle3", 2), draft_dir=tmp_path, target_vocab=6, draft_vocab=6)
    assert "eagle" not in sg.SGLangEngine().capabilities().methods


def test_standalone_tree_topk_beyond_the_vocabulary_is_refused(tmp_path):
    spec = SpecConfig("eagle_tree", 2, draft_sampling="greedy", tree_topk=3, tree_budget=4)
    with pytest.raises(InvalidInput, match="speculation.tree_topk=3"):
        speculative_kwargs(spec, draft_dir=tmp_path, target_vocab=2, draft_vocab=2)


def test_standalone_needs_a_draft_dir_and_the_targets_vocab_size(tmp_path):
    spec = SpecConfig("draft_model", 1, draft_sampling="greedy")
    with pytest.raises(InvalidInput, match="draft_dir=None"):
        speculative_kwargs(spec, draft_dir=None, target_vocab=6, draft_vocab=6)
    with pytest.raises(InvalidInput, match="draft vocab_size=8.*vocab_size=6"):
        speculative_kwargs(spec, draft_dir=tmp_path, target_vocab=6, draft_vocab=8)


def test_speculation_off_maps_to_nothing():
    assert speculative_kwargs(None) == {}


def test_every_mapped_key_and_default_is_a_server_args_field_of_sglang(server_args_fields, tmp_path):
    specs = [
        SpecConfig("ngram", 2), SpecConfig("ngram_tree", 2, tree_topk=2, tree_budget=3),
        SpecConfig("draft_model", 2, draft_sampling="greedy"), SpecConfig("eagle_tree", 2, draft_sampling="greedy"),
    ]
    keys = set(DEFAULT_SETTINGS) | {"model_path", "dtype", "context_length", "random_seed"}
    for spec in specs:
        keys |= set(speculative_kwargs(spec, draft_dir=tmp_path, target_vocab=6, draft_vocab=6))
    assert unknown_server_args(sorted(keys), server_args_fields) == []
    # Settings a user is told about in the module docstring exist too.
    for k in ("enable_deterministic_inference", "disable_overlap_schedule", "speculative_ngram_capacity",
              "speculative_ngram_match_type", "max_running_requests"):
        assert k in server_args_fields


@pytest.mark.parametrize("method,algo", [("eagle", "EAGLE"), ("eagle3", "EAGLE3")])
def test_eagle_heads_map_onto_server_args_fields(tmp_path, server_args_fields, method, algo):
    kw = speculative_kwargs(SpecConfig(method, 3), draft_dir=tmp_path, target_vocab=6, draft_vocab=6)
    assert kw == {
        "speculative_algorithm": algo, "speculative_draft_model_path": str(tmp_path), "speculative_num_steps": 3,
        "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4, "speculative_use_rejection_sampling": True,
    }
    greedy = speculative_kwargs(SpecConfig(method, 1, draft_sampling="greedy"), draft_dir=tmp_path)
    assert greedy["speculative_use_rejection_sampling"] is False
    assert unknown_server_args(sorted(kw), server_args_fields) == []


def test_unknown_server_args_names_keys_this_sglang_lacks(server_args_fields):
    assert unknown_server_args(["attention_backend", "no_such_knob", "speculative_ngram_min_match_window_size"], server_args_fields) == [
        "no_such_knob", "speculative_ngram_min_match_window_size",
    ]


# ----------------------------------------------------------------------------- engine defaults and knobs


def _const(node: ast.AST):
    """The value of a constant expression of numbers/strings (e.g. ``10 * 1000 * 1000``)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return _const(node.left) * _const(node.right)
    if isinstance(node, ast.Tuple):
        return tuple(_const(e) for e in node.elts)
    raise ValueError(ast.dump(node))


def _sglang_source(rel: str) -> ast.Module:
    path = SGLANG_SITE / rel
    if not path.is_file():
        pytest.skip(f"SGLang source not found at {SGLANG_SITE} (set SGLANG_SITE)")
    return ast.parse(path.read_text())


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)


def test_sglang_defaults_are_what_sglang_0_5_17_sets_when_only_the_method_is_given():
    tree = _sglang_source("sglang/srt/server_args.py")
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    field_defaults = {n.target.id: _const(n.value) for n in cls.body
                      if isinstance(n, ast.AnnAssign) and n.target.id.startswith("speculative_ngram") and n.value is not None}
    ngram = SGLANG_DEFAULTS["NGRAM"]
    for k in ("speculative_ngram_min_bfs_breadth", "speculative_ngram_max_bfs_breadth", "speculative_ngram_max_trie_depth",
              "speculative_ngram_match_type", "speculative_ngram_capacity"):
        assert field_defaults[k] == ngram[k], k
    hook = _sglang_source("sglang/srt/arg_groups/speculative_hook.py")
    # _handle_ngram: num_draft_tokens = 12 when unset; topk = max breadth; steps = tokens // topk.
    sets = {ast.unparse(n.targets[0]): n.value for n in ast.walk(_function(hook, "_handle_ngram")) if isinstance(n, ast.Assign)}
    assert _const(sets["server_args.speculative_num_draft_tokens"]) == ngram["speculative_num_draft_tokens"]
    assert ast.unparse(sets["server_args.speculative_eagle_topk"]) == "server_args.speculative_ngram_max_bfs_breadth"
    assert ngram["speculative_eagle_topk"] == ngram["speculative_ngram_max_bfs_breadth"]
    assert ngram["speculative_num_steps"] == ngram["speculative_num_draft_tokens"] // ngram["speculative_eagle_topk"]
    # _auto_choose_speculative_params: STANDALONE first, then the target architecture (tablegen: LlamaForCausalLM).
    returns = [(ast.unparse(n.test), _const(n.body[0].value)) for n in ast.walk(_function(hook, "_auto_choose_speculative_params"))
               if isinstance(n, ast.If) and isinstance(n.body[0], ast.Return)]
    by_test = dict(returns)
    assert by_test["server_args.speculative_algorithm == 'STANDALONE'"] == tuple(SGLANG_DEFAULTS["STANDALONE"].values())
    assert by_test["model_arch in ['LlamaForCausalLM']"] == tuple(SGLANG_DEFAULTS["EAGLE"].values())
    assert SGLANG_DEFAULTS["EAGLE3"] == SGLANG_DEFAULTS["EAGLE"]


def test_ngram_default_fields_map_explicitly_onto_exactly_sglangs_resolved_ngram_defaults():
    kw = speculative_kwargs(SpecConfig("ngram_tree", **SPEC_DEFAULTS["ngram_tree"]))
    assert kw == {"speculative_algorithm": "NGRAM", **{k: SGLANG_DEFAULTS["NGRAM"][k] for k in kw if k != "speculative_algorithm"}}
    assert set(kw) - {"speculative_algorithm"} == set(SGLANG_DEFAULTS["NGRAM"]) - {
        "speculative_eagle_topk", "speculative_ngram_match_type", "speculative_ngram_capacity"}


def test_standalone_default_fields_map_explicitly_onto_sglangs_default_chain(tmp_path):
    kw = speculative_kwargs(SpecConfig("draft_model", **SPEC_DEFAULTS["draft_model"]), draft_dir=tmp_path, target_vocab=6, draft_vocab=6)
    assert {k: kw[k] for k in SGLANG_DEFAULTS["STANDALONE"]} == SGLANG_DEFAULTS["STANDALONE"]


@pytest.mark.parametrize("method", sorted(SPEC_DEFAULTS))
def test_engine_defaults_send_only_the_method_and_the_draft(tmp_path, method):
    spec = SpecConfig(method, **SPEC_DEFAULTS[method], engine_default=True)
    kw = speculative_kwargs(spec, draft_dir=tmp_path, target_vocab=6, draft_vocab=6)
    algo = {"ngram_tree": "NGRAM", "draft_model": "STANDALONE", "eagle": "EAGLE", "eagle3": "EAGLE3"}[method]
    want = {"speculative_algorithm": algo}
    if spec.uses_draft_model:
        want["speculative_draft_model_path"] = str(tmp_path)
    assert kw == want


@pytest.mark.parametrize(
    "spec,needle",
    [
        (SpecConfig("ngram_tree", 2, tree_topk=2, tree_budget=4, engine_default=True), "speculation.num_speculative_tokens=2"),
        (SpecConfig("draft_model", 3, draft_sampling="sampled", engine_default=True), "speculation.draft_sampling='sampled'"),
        (SpecConfig("ngram", 11, engine_default=True), "False for method 'ngram'"),
        (SpecConfig("eagle_tree", 3, draft_sampling="greedy", engine_default=True), "False for method 'eagle_tree'"),
    ],
)
def test_engine_default_configs_that_misstate_sglangs_defaults_are_refused(tmp_path, spec, needle):
    with pytest.raises(InvalidInput) as info:
        speculative_kwargs(spec, draft_dir=tmp_path, target_vocab=6, draft_vocab=6)
    assert needle in str(info.value), str(info.value)


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_eagle_default_tree_needs_a_draft_vocabulary_of_at_least_its_top_k(tmp_path, method):
    spec = SpecConfig(method, **SPEC_DEFAULTS[method], engine_default=True)
    with pytest.raises(InvalidInput, match="top 4 draft tokens"):
        speculative_kwargs(spec, draft_dir=tmp_path, target_vocab=6 if method == "eagle3" else 3, draft_vocab=3)


def test_ngram_tree_maps_min_and_max_bfs_breadth_separately():
    kw = speculative_kwargs(SpecConfig("ngram_tree", 4, ngram_max=3, tree_topk=6, tree_topk_min=2, tree_budget=9))
    assert kw["speculative_ngram_max_bfs_breadth"] == 6 and kw["speculative_ngram_min_bfs_breadth"] == 2
    assert kw["speculative_num_draft_tokens"] == 10 and kw["speculative_ngram_max_trie_depth"] == 7
    assert kw["speculative_num_steps"] == 1  # 10 // 6


def test_tree_topk_min_is_validated_and_left_out_of_json_when_unset():
    with pytest.raises(InvalidInput, match="tree_topk_min=3"):
        SpecConfig("ngram_tree", 2, tree_topk=2, tree_topk_min=3)
    assert "tree_topk_min" not in SpecConfig("ngram_tree", 2).to_json()
    spec = SpecConfig("ngram_tree", 2, tree_topk=3, tree_topk_min=1)
    assert SpecConfig.from_json(spec.to_json()) == spec


def test_spec_knobs_reach_sglangs_default_sizes_and_every_default_is_drawable():
    caps = SGLangEngine().capabilities()
    assert caps.spec_defaults == SPEC_DEFAULTS
    for method, fields in SPEC_DEFAULTS.items():
        for k, v in fields.items():
            allowed = caps.spec_knobs.get(f"{method}.{k}", caps.spec_knobs.get(k))
            assert allowed is None or v in allowed, (method, k, v, allowed)
    assert max(caps.spec_knobs["ngram_tree.tree_topk"]) == SGLANG_DEFAULTS["NGRAM"]["speculative_ngram_max_bfs_breadth"]
    assert max(caps.spec_knobs["ngram_tree.tree_budget"]) + 1 == SGLANG_DEFAULTS["NGRAM"]["speculative_num_draft_tokens"]
    assert max(caps.spec_knobs["eagle_tree.tree_topk"]) == SGLANG_DEFAULTS["EAGLE"]["speculative_eagle_topk"]
    assert caps.swap == frozenset({"target", "draft", "head"})
    assert SGLangEngine(swap=["target"]).capabilities().swap == frozenset({"target"})
    with pytest.raises(InvalidInput, match="settings\\['swap'\\]"):
        SGLangEngine(swap="target").capabilities()


def test_spec_paths_name_the_worker_each_method_runs_through_in_sglangs_source():
    """Capabilities.spec_paths (the known-finding check across methods): every method named,
    STANDALONE, EAGLE and EAGLE3 on one worker, NGRAM on its own, as SGLang's source has it
    (StandaloneWorkerV2 subclasses EAGLEWorkerV2; create_worker returns these classes)."""
    from specfuzz.engines.sglang_mapping import ALGORITHMS, SPEC_PATHS

    caps = SGLangEngine().capabilities()
    assert set(caps.spec_paths) == set(caps.methods)
    assert {caps.path_of(m) for m in ("draft_model", "eagle_tree", "eagle", "eagle3")} == {"EAGLEWorkerV2"}
    assert caps.path_of("ngram") == caps.path_of("ngram_tree") != caps.path_of("eagle")
    spec_dir = SGLANG_SITE / "sglang/srt/speculative"
    if not spec_dir.is_dir():
        pytest.skip(f"SGLang source not found at {SGLANG_SITE} (set SGLANG_SITE)")
    bases = {}
    for f in ("eagle_worker_v2.py", "standalone_worker_v2.py", "ngram_worker.py"):
        for node in ast.parse((spec_dir / f).read_text()).body:
            if isinstance(node, ast.ClassDef):
                bases[node.name] = [b.id for b in node.bases if isinstance(b, ast.Name)]
    assert "EAGLEWorkerV2" in bases["StandaloneWorkerV2"] and "NGRAMWorker" in bases
    create = (spec_dir / "spec_info.py").read_text()
    assert all(f"return {w}" in create for w in ("EAGLEWorkerV2", "StandaloneWorkerV2", "NGRAMWorker"))
    assert {ALGORITHMS[m] for m, w in SPEC_PATHS.items() if w == "EAGLEWorkerV2"} == {"STANDALONE", "EAGLE", "EAGLE3"}


def test_verify_samplers_name_the_function_every_worker_verifies_with_in_sglangs_source():
    """Capabilities.verify_samplers: every method's drafts verified by one function, eagle_sample,
    called by EAGLEWorkerV2's common code and by NGRAMWorker; the features named are the sampling
    parameters it applies to the target's logits (min_p, which it would have to apply, aside):
    a stored finding with those features alone is checked across every method."""
    from specfuzz.engines.sglang_mapping import VERIFY_SAMPLER, VERIFY_SAMPLER_FEATURES

    caps = SGLangEngine().capabilities()
    assert set(caps.verify_samplers) == set(caps.methods) and set(caps.verify_samplers.values()) == {VERIFY_SAMPLER}
    assert caps.shared_code("ngram", "eagle", ("min_p",)) == "verify sampler eagle_sample"
    assert caps.shared_code("ngram", "eagle", ("min_p", "stop_token_ids")) is None  # emitting is the worker's
    assert caps.shared_code("ngram", "eagle", ()) is None  # drafting is the worker's
    assert caps.shared_code("eagle3", "draft_model", ("stop_token_ids",)) == "EAGLEWorkerV2"
    spec_dir = SGLANG_SITE / "sglang/srt/speculative"
    if not spec_dir.is_dir():
        pytest.skip(f"SGLang source not found at {SGLANG_SITE} (set SGLANG_SITE)")
    for f in ("eagle_worker_common.py", "ngram_worker.py"):
        assert f"= {VERIFY_SAMPLER}(" in (spec_dir / f).read_text(), f
    tree = ast.parse((spec_dir / "eagle_utils.py").read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == VERIFY_SAMPLER)
    body = ast.get_source_segment((spec_dir / "eagle_utils.py").read_text(), fn)
    applied = {"logit_bias": "sampling_info.logit_bias", "penalties": "acc_additive_penalties",
               "repetition_penalty": "acc_scaling_penalties", "temperature": "sampling_info.temperatures",
               "top_k": "need_top_k_sampling", "top_p": "need_top_p_sampling"}
    assert all(v in body for v in applied.values()), [k for k, v in applied.items() if v not in body]
    assert VERIFY_SAMPLER_FEATURES - {"min_p", "frequency_penalty", "presence_penalty"} <= set(applied)


def test_row_prompts_visit_every_row_once_within_the_context_length():
    for vocab, ctx in [(6, 64), (100, 32), (7, 2), (1, 64)]:
        prompts = row_prompts(vocab, ctx)
        assert sorted(t for p in prompts for t in p) == list(range(vocab))
        assert all(1 <= len(p) <= ctx - 1 for p in prompts)


# ----------------------------------------------------------------------------- sampling mapping


def _sp(params: SP, seed=None, **kw) -> dict:
    opts = {"vocab_size": V, "max_model_len": 64, **kw}
    return sampling_params_dict(Request(PROMPT, params, seed), **opts)


def test_sampling_params_map_every_supported_field():
    d = _sp(SP(temperature=0.7, top_k=3, top_p=0.9, min_p=0.1, repetition_penalty=1.5, frequency_penalty=0.5,
               presence_penalty=-0.5, max_tokens=5, stop_token_ids=(3, 1), logit_bias={2: -1.0, 0: 2.5}), seed=11)
    assert d == {
        "max_new_tokens": 5, "temperature": 0.7, "top_k": 3, "top_p": 0.9, "min_p": 0.1, "repetition_penalty": 1.5,
        "frequency_penalty": 0.5, "presence_penalty": -0.5, "min_new_tokens": 0, "ignore_eos": False,
        "stop_token_ids": [1, 3], "logit_bias": {"2": -1.0, "0": 2.5}, "sampling_seed": 11,
    }


def test_sampling_keys_are_sglang_sampling_params_fields(sampling_fields):
    d = _sp(SP(stop_token_ids=(1,), logit_bias={1: 1.0}), seed=3)
    assert set(d) <= sampling_fields


def test_greedy_is_temperature_zero_and_top_k_off_is_minus_one():
    d = _sp(SP(temperature=5e-6))  # below our greedy epsilon, above SGLang's (1e-6)
    assert d["temperature"] == 0.0 and d["top_k"] == -1
    assert _sp(SP(top_k=0))["top_k"] == -1


def test_min_tokens_needs_the_tokenizer():
    with pytest.raises(InvalidInput, match="skip_tokenizer_init"):
        _sp(SP(min_tokens=2))
    assert _sp(SP(min_tokens=2), tokenizer=True)["min_new_tokens"] == 2


@pytest.mark.parametrize(
    "params,kw,needle",
    [
        (SP(allowed_token_ids=(0, 1)), {}, "allowed_token_ids"),
        (SP(bad_words=((1,),)), {}, "bad_words"),
        (SP(thinking_budget=1, think_end_token_id=2), {}, "thinking_budget"),
        (SP(regex="a+"), {}, "regex"),
        (SP(choice=("ab",)), {}, "choice"),
        (SP(min_p=0.2), {"deterministic": True}, "min_p"),
        (SP(ignore_eos=True, stop_token_ids=(3,)), {}, "ignore_eos"),
        (SP(repetition_penalty=2.5), {}, "repetition_penalty"),
        (SP(max_tokens=61), {}, "max_tokens=61"),
        (SP(stop_token_ids=(7,)), {}, "stop_token_ids entry=7"),
    ],
)
def test_requests_sglang_would_refuse_or_run_differently_are_refused(params, kw, needle):
    with pytest.raises(InvalidInput) as info:
        _sp(params, **kw)
    assert needle in str(info.value), str(info.value)


def test_bad_prompts_and_seeds_are_refused():
    with pytest.raises(InvalidInput, match="prompt"):
        sampling_params_dict(Request((1, 9), SP()), vocab_size=V, max_model_len=64)
    with pytest.raises(InvalidInput, match="seed=-1"):
        _sp(SP(), seed=-1)


# ----------------------------------------------------------------------------- outputs


def test_outputs_keep_their_stop_token_and_finish_reasons_are_mapped():
    stop = completion_from_output({"output_ids": [1, 5], "meta_info": {"finish_reason": {"type": "stop", "matched": 5}}}, speculation=False)
    assert stop.token_ids == (1, 5) and stop.finish_reason == "stop" and stop.num_draft_tokens is None
    # A stop token left out by some SGLang version is put back (the oracle's convention).
    assert completion_from_output({"output_ids": [1], "meta_info": {"finish_reason": {"type": "stop", "matched": 5}}},
                                  speculation=False).token_ids == (1, 5)
    length = completion_from_output({"output_ids": [1, 2, 3], "meta_info": {"finish_reason": {"type": "length", "length": 3}}},
                                    speculation=False)
    assert length.finish_reason == "length" and length.token_ids == (1, 2, 3)


def test_acceptance_statistics_come_from_meta_info_when_speculating():
    meta = {"finish_reason": {"type": "length", "length": 3}, "spec_verify_ct": 2, "spec_num_proposed_drafts": 6,
            "spec_num_correct_drafts": 2}
    c = completion_from_output({"output_ids": [1, 2, 3], "meta_info": meta}, speculation=True)
    assert (c.num_draft_tokens, c.num_accepted_tokens) == (6, 2)
    # No verify step (e.g. one output token): zero, not missing.
    c = completion_from_output({"output_ids": [1], "meta_info": {"finish_reason": {"type": "length"}}}, speculation=True)
    assert (c.num_draft_tokens, c.num_accepted_tokens) == (0, 0)


def test_aborted_requests_raise_instead_of_counting_as_samples():
    with pytest.raises(RuntimeError, match="aborted"):
        completion_from_output({"output_ids": [], "meta_info": {"finish_reason": {"type": "abort", "message": "oom"}}}, speculation=False)


# ----------------------------------------------------------------------------- config validation (no SGLang needed)


def _config(tmp_path, spec=None, draft_table=None, dtype="bfloat16", **settings) -> EngineConfig:
    case = Case(T, PROMPT, SP(max_tokens=3), eos_token_id=EOS, spec=spec, draft_table=draft_table)
    ck = materialize(case, tmp_path, dtype=dtype)
    return EngineConfig(target_dir=ck.target_dir, draft_dir=ck.draft_dir, speculation=spec, dtype=dtype,
                        max_model_len=48, settings=settings)


def test_check_config_builds_engine_kwargs_from_defaults_config_and_settings(tmp_path):
    spec = SpecConfig("ngram", 2)
    kw = SGLangEngine(mem_fraction_static=0.2).check_config(_config(tmp_path, spec, speculative_ngram_capacity=1000, shutdown_timeout_s=3))
    assert kw["attention_backend"] == "triton" and kw["sampling_backend"] == "pytorch" and kw["skip_tokenizer_init"] is True
    assert kw["disable_cuda_graph"] is True and kw["max_total_tokens"] == 65536 and kw["max_running_requests"] == 512
    assert kw["mem_fraction_static"] == 0.2  # constructor default over the adapter default
    assert kw["context_length"] == 48 and kw["dtype"] == "bfloat16" and Path(kw["model_path"]).parent == tmp_path
    assert kw["speculative_algorithm"] == "NGRAM" and kw["speculative_ngram_capacity"] == 1000
    assert "shutdown_timeout_s" not in kw


def test_engine_default_variants_keep_sglangs_own_max_running_requests(tmp_path):
    """An engine-default variant runs as a user's does: no max_running_requests (SGLang sets 48
    under speculation); drawn variants run 512 at once, and a user's setting is kept for both."""
    default = SpecConfig("ngram_tree", **SPEC_DEFAULTS["ngram_tree"], engine_default=True)
    assert "max_running_requests" not in SGLangEngine().check_config(_config(tmp_path, default))
    assert SGLangEngine().check_config(_config(tmp_path, SpecConfig("ngram", 2)))["max_running_requests"] == 512
    assert SGLangEngine(max_running_requests=64).check_config(_config(tmp_path, default))["max_running_requests"] == 64
    assert SGLangEngine().check_config(_config(tmp_path, default, max_running_requests=96))["max_running_requests"] == 96


def test_site_settings_come_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(SETTINGS_ENV, json.dumps({"disable_cuda_graph": False, "skip_tokenizer_init": False}))
    eng = SGLangEngine()
    assert eng.check_config(_config(tmp_path))["disable_cuda_graph"] is False
    assert "min_tokens" in eng.capabilities().sampling  # a tokenizer: min_new_tokens works
    monkeypatch.setenv(SETTINGS_ENV, "[1, 2]")
    with pytest.raises(InvalidInput, match=SETTINGS_ENV):
        SGLangEngine()


@pytest.mark.parametrize(
    "kw,needle",
    [
        ({"dtype": "float32"}, "dtype='float32'"),
        ({"spec": None, "speculative_algorithm": "NGRAM"}, "settings['speculative_algorithm']"),
        ({"spec": SpecConfig("ngram", 2), "speculative_num_draft_tokens": 8}, "settings['speculative_num_draft_tokens']"),
        ({"shutdown_timeout_s": 0}, "shutdown_timeout_s"),
        ({"env": ["A=1"]}, "settings['env']"),
    ],
)
def test_bad_configs_are_refused_before_anything_starts(tmp_path, kw, needle):
    kw = dict(kw)
    spec = kw.pop("spec", None)
    dtype = kw.pop("dtype", "bfloat16")
    cfg = _config(tmp_path, spec, dtype=dtype if dtype != "float32" else "bfloat16", **kw)
    if dtype == "float32":
        cfg = EngineConfig(target_dir=cfg.target_dir, dtype="float32")
    eng = SGLangEngine()
    with pytest.raises(InvalidInput) as info:
        eng.start(cfg)
    assert needle in str(info.value), str(info.value)
    assert not eng.started


def test_wider_draft_is_refused_before_start(tmp_path):
    spec = SpecConfig("draft_model", 2, draft_sampling="greedy")
    wide = np.zeros((V + 2, V + 2), np.float32)  # a wider draft is written square at its own width
    cfg = _config(tmp_path, spec, draft_table=wide)
    with pytest.raises(InvalidInput, match=f"draft vocab_size={V + 2}"):
        SGLangEngine().start(cfg)


def test_narrower_draft_is_written_at_the_targets_width_and_accepted(tmp_path):
    spec = SpecConfig("draft_model", 2, draft_sampling="greedy")
    narrow = T[:, :4]  # [V, 4]: padded with masked columns to [V, V]
    kw = SGLangEngine().check_config(_config(tmp_path, spec, draft_table=narrow))
    assert kw["speculative_algorithm"] == "STANDALONE" and Path(kw["speculative_draft_model_path"]).is_dir()


def test_missing_target_checkpoint_is_refused(tmp_path):
    with pytest.raises(InvalidInput, match="target_dir="):
        SGLangEngine().start(EngineConfig(target_dir=tmp_path / "absent", dtype="bfloat16"))


def test_capabilities_follow_the_settings():
    caps = SGLangEngine().capabilities()
    assert set(caps.methods) == {"ngram", "ngram_tree", "draft_model", "eagle_tree", "eagle", "eagle3"}
    assert caps.profile == "sglang" and caps.dtypes == ("bfloat16", "float16") and caps.draft_vocab == "narrower"
    assert caps.restart_in_process is False
    assert caps.spec_knobs["draft_sampling"] == ("greedy",) and caps.spec_knobs["verify"] == ("token",)
    assert caps.spec_knobs["eagle3.draft_sampling"] == ("greedy", "sampled")  # rejection sampling for heads
    assert caps.spec_knobs["ngram_min"] == (1,)
    assert {"temperature", "top_k", "top_p", "min_p", "logit_bias", "repetition_penalty", "stop_token_ids"} <= caps.sampling
    assert not caps.sampling & {"min_tokens", "allowed_token_ids", "bad_words", "regex", "choice", "thinking_budget"}
    assert caps.sampling_with_speculation == caps.sampling
    det = SGLangEngine(enable_deterministic_inference=True).capabilities()
    assert "min_p" not in det.sampling


def test_generate_before_start_is_an_error():
    with pytest.raises(RuntimeError, match="start"):
        SGLangEngine().generate([Request(PROMPT, SP())])
    with pytest.raises(RuntimeError, match="start"):
        SGLangEngine().check_tables()
    with pytest.raises(RuntimeError, match="start"):
        SGLangEngine().swap(EngineConfig(target_dir=Path("/nonexistent"), dtype="bfloat16"))


# ----------------------------------------------------------------------------- site settings, engine defaults


def test_speculative_site_settings_apply_to_speculative_runs_only(tmp_path, monkeypatch):
    monkeypatch.setenv(SETTINGS_ENV, json.dumps({"speculative_ngram_capacity": 1000, "speculative_attention_mode": "decode",
                                                 "disable_cuda_graph": True}))
    eng = SGLangEngine()
    off = _config(tmp_path)
    on = _config(tmp_path, SpecConfig("ngram", 2))
    kw_off, kw_on = eng.check_config(off), eng.check_config(on)
    assert not [k for k in kw_off if k.startswith("speculative_")]  # the calibration run does not see them
    assert kw_on["speculative_ngram_capacity"] == 1000 and kw_on["speculative_attention_mode"] == "decode"
    assert "speculative_ngram_capacity" not in eng.settings_for(off) and eng.settings_for(on)["speculative_ngram_capacity"] == 1000
    # Per-run settings too (`specfuzz check --engine-setting` reaches the calibration run as well).
    per_run = _config(tmp_path, None, speculative_ngram_match_type="PROB")
    assert "speculative_ngram_match_type" not in eng.check_config(per_run)


def test_speculation_knobs_the_adapter_maps_are_refused_in_site_settings_even_with_speculation_off(tmp_path, monkeypatch):
    monkeypatch.setenv(SETTINGS_ENV, json.dumps({"speculative_ngram_min_bfs_breadth": 2}))
    for spec in (None, SpecConfig("ngram", 2)):
        with pytest.raises(InvalidInput, match="settings\\['speculative_ngram_min_bfs_breadth'\\]"):
            SGLangEngine().check_config(_config(tmp_path, spec))


@pytest.mark.parametrize("method", sorted(SPEC_DEFAULTS))
def test_engine_default_configs_start_sglang_with_no_pinned_knobs(tmp_path, method):
    spec = SpecConfig(method, **SPEC_DEFAULTS[method], engine_default=True)
    draft = T if spec.uses_draft_model else None
    case = Case(T, PROMPT, SP(max_tokens=3), eos_token_id=EOS, spec=spec, draft_table=draft)
    cfg = engine_config(case, tmp_path, dtype="bfloat16")
    kw = SGLangEngine().check_config(cfg)
    pinned = {k for k in kw if k.startswith("speculative_")} - {"speculative_algorithm", "speculative_draft_model_path"}
    assert not pinned
    # SGLang picks its EAGLE default by the target's architecture: every table target is a Llama.
    assert json.loads((cfg.target_dir / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]


# ----------------------------------------------------------------------------- swap plans (real checkpoints)


def _family(tmp_path, seed: int, spec=None, *, V=V, eos=EOS, dtype="bfloat16", draft="random", d2t=None) -> EngineConfig:
    """The engine config of one random table model (and draft), as the campaign writes it."""
    rng = np.random.default_rng(seed)
    table = (rng.integers(-8, 9, (V, V)) / 4).astype(np.float32)  # [V, V] exact in bfloat16
    dt = None
    if spec is not None and spec.uses_draft_model:
        dt = (rng.integers(-8, 9, (V, V)) / 4).astype(np.float32) if isinstance(draft, str) else draft
    case = Case(table, PROMPT[:2], SP(max_tokens=3), eos_token_id=eos, spec=spec, draft_table=dt, draft_d2t=d2t)
    return engine_config(case, tmp_path, dtype=dtype, speculation=spec is not None)


def test_swap_plan_loads_a_new_target_table_of_the_same_shape(tmp_path):
    from specfuzz.engines.sglang_swap import plan_swap

    spec = SpecConfig("ngram", 2)
    a, b = _family(tmp_path, 1, spec), _family(tmp_path, 2, spec)
    plan = plan_swap(a, b, {"target"}, algorithm="NGRAM")
    assert plan.parts == ("target",) and plan.target_weights == b.target_dir / "model.safetensors"
    assert plan.draft_dir is None and plan.head_weights is None
    assert plan_swap(a, a, {"target"}, algorithm="NGRAM").target_weights is None  # nothing to load


@pytest.mark.parametrize(
    "change,needle",
    [
        ({"V": V + 1}, "config.json"),  # another vocabulary: config.json (vocab_size) differs
        ({"eos": 0}, "config.json"),  # another EOS
        ({"dtype": "float16"}, "EngineConfig.dtype"),
    ],
)
def test_swap_into_a_table_of_another_shape_is_refused_naming_the_difference(tmp_path, change, needle):
    from specfuzz.engines.base import SwapUnsupported
    from specfuzz.engines.sglang_swap import plan_swap

    spec = SpecConfig("ngram", 2)
    with pytest.raises(SwapUnsupported, match="running engine's shapes") as info:
        plan_swap(_family(tmp_path, 1, spec), _family(tmp_path, 2, spec, **change), {"target"}, algorithm="NGRAM")
    assert needle in str(info.value)


def test_standalone_draft_swap_loads_the_draft_into_both_runners_first(tmp_path):
    from specfuzz.engines.base import SwapUnsupported
    from specfuzz.engines.sglang_swap import plan_swap

    spec = SpecConfig("draft_model", 2, draft_sampling="greedy")
    a, b = _family(tmp_path, 1, spec), _family(tmp_path, 2, spec)
    plan = plan_swap(a, b, {"target", "draft"}, algorithm="STANDALONE")
    assert plan.parts == ("target", "draft") and plan.draft_dir == b.draft_dir
    assert plan.target_weights == b.target_dir / "model.safetensors"  # loaded last: the draft load wrote the target runner
    with pytest.raises(SwapUnsupported, match="does not swap the draft"):
        plan_swap(a, b, {"target"}, algorithm="STANDALONE")
    # Same target, new draft: the target is reloaded all the same.
    same_target = _family(tmp_path, 1, spec, draft=np.zeros((V, V), np.float32))
    only_draft = plan_swap(a, same_target, {"target", "draft"}, algorithm="STANDALONE")
    assert only_draft.parts == ("draft",) and only_draft.target_weights == a.target_dir / "model.safetensors"


def test_eagle_head_swap_reuses_the_running_heads_identical_weights(tmp_path):
    from specfuzz.engines.sglang_swap import plan_swap

    spec = SpecConfig("eagle", 2, draft_sampling="greedy")
    a, b = _family(tmp_path, 1, spec), _family(tmp_path, 2, spec)
    assert a.draft_dir != b.draft_dir
    plan = plan_swap(a, b, {"target", "head"}, algorithm="EAGLE")
    # The head's table rides in the target's lm_head; the head itself loads nothing.
    assert plan.parts == ("target", "head") and plan.head_weights is None and plan.draft_dir is None


def test_full_width_eagle3_head_swap_loads_only_its_lm_head_and_a_reduced_one_is_refused(tmp_path):
    from specfuzz.engines.base import SwapUnsupported
    from specfuzz.engines.sglang_swap import plan_swap

    spec = SpecConfig("eagle3", 2, draft_sampling="greedy")
    a, b = _family(tmp_path, 1, spec), _family(tmp_path, 2, spec)
    plan = plan_swap(a, b, {"target", "head"}, algorithm="EAGLE3")
    assert plan.parts == ("target", "head") and plan.head_weights is not None
    assert plan.head_weights.parent.name.endswith("-sglang")  # the SGLang-layout twin SGLang loaded
    rng = np.random.default_rng(3)
    narrow = [(rng.integers(-8, 9, (V, 4)) / 4).astype(np.float32) for _ in range(2)]
    c = _family(tmp_path, 1, spec, draft=narrow[0], d2t=(0, 2, 3, 5))
    d = _family(tmp_path, 2, spec, draft=narrow[1], d2t=(0, 2, 3, 5))
    with pytest.raises(SwapUnsupported, match="reduced EAGLE-3 draft vocabulary"):
        plan_swap(c, d, {"target", "head"}, algorithm="EAGLE3")


def test_draft_checksums_must_stay_as_proven_and_shared_tensors_must_follow_the_target():
    from specfuzz.engines.sglang_swap import copy_problems, draft_problems

    proven = {"fc.weight": "a", "model.embed_tokens.weight": "e"}
    now = {"lm_head.weight": "L", "model.embed_tokens.weight": "E", "draft.fc.weight": "a", "draft.model.embed_tokens.weight": "E"}
    assert draft_problems(now, proven, "EAGLE3") == []  # the shared embedding follows the target's
    assert draft_problems({**now, "draft.fc.weight": "b"}, proven, "EAGLE3") == ["fc.weight: b != proven a"]
    assert "not shared any more" in draft_problems({**now, "draft.model.embed_tokens.weight": "e"}, proven, "EAGLE3")[0]
    assert "missing" in draft_problems({"lm_head.weight": "L"}, proven, "STANDALONE")[0]
    assert copy_problems({"x": "1", "draft.x": "1"}) == []
    assert copy_problems({"x": "1", "draft.x": "2"}) == ["x: draft 2 != target 1"]
    assert copy_problems({"x": "1"}) == ["SGLang reported no draft-runner checksums"]


# ----------------------------------------------------------------------------- isolation: non-daemon children


def _sleep_forever() -> None:  # pragma: no cover - runs in a grandchild
    while True:
        time.sleep(60)


class ChildProcessEngine(ReferenceEngine):
    """The reference engine plus a multiprocessing child, as SGLang's Engine starts its scheduler."""

    name = "child-process"

    def start(self, config: EngineConfig) -> None:
        super().start(config)
        if getattr(self, "_helper", None) is None:
            self._helper = mp.get_context("spawn").Process(target=_sleep_forever)
            self._helper.start()

    def helper_pid(self) -> int:
        return self._helper.pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _wait_dead(pids, timeout: float = 15.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.2)
    return False


def test_sglang_runs_in_a_non_daemon_child_and_others_stay_daemonic():
    assert IsolatedEngine("sglang").daemon is False
    assert IsolatedEngine("reference").daemon is True
    assert IsolatedEngine("reference", daemon=False).daemon is False


def test_an_engine_that_starts_processes_fails_in_a_daemon_child_and_runs_in_a_non_daemon_one(tmp_path):
    case = Case(T, PROMPT, SP(max_tokens=2), eos_token_id=EOS)
    cfg = engine_config(case, tmp_path)
    with IsolatedEngine("test_engine_sglang:ChildProcessEngine", daemon=True, log_dir=tmp_path / "logs") as eng:
        with pytest.raises(EngineCrash, match="daemonic processes are not allowed to have children"):
            eng.start(cfg)
    eng = IsolatedEngine("test_engine_sglang:ChildProcessEngine", log_dir=tmp_path / "logs", daemon=False)
    eng.start(cfg)
    helper = eng.call("helper_pid")
    assert _alive(helper)
    assert len(eng.generate([Request(PROMPT, case.params)] * 3)) == 3
    with pytest.raises(AttributeError, match="no_such_method"):
        eng.call("no_such_method")
    assert len(eng.generate([Request(PROMPT, case.params)])) == 1  # a missing method does not kill the engine
    child = eng.pid
    eng.close()
    assert _wait_dead([child, helper]), "the engine process or its helper outlived close()"


ORPHAN_SCRIPT = """
import sys, time
from specfuzz.case import Case
from specfuzz.engines.isolation import IsolatedEngine
from specfuzz.fuzz.run import engine_config
from specfuzz.oracle.params import SamplingParams
import numpy as np
case = Case(np.zeros((4, 4), np.float32), (1, 2), SamplingParams(max_tokens=2), eos_token_id=3)
eng = IsolatedEngine("test_engine_sglang:ChildProcessEngine", daemon=False, log_dir=sys.argv[1])
eng.start(engine_config(case, sys.argv[1]))
print(eng.pid, eng.call("helper_pid"), flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_nothing_outlives_a_caller_that_dies_without_closing(tmp_path, sig):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", ORPHAN_SCRIPT, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        child, helper = (int(x) for x in line.split())
        assert _alive(child) and _alive(helper)
        proc.send_signal(sig)
        proc.wait(30)
        assert _wait_dead([child, helper]), "the engine process or its helper outlived the killed caller"
    finally:
        if proc.poll() is None:
            proc.kill()


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


@pytest.mark.parametrize("engine_default", [False, True])
def test_every_case_the_campaign_draws_for_sglang_passes_the_adapters_own_checks(tmp_path, engine_default):
    """The start shapes and case families a campaign draws from SGLang's capabilities (as
    Campaign._shape and _strategy draw them) are ones the adapter's pure mapping takes: a case
    it refuses costs a Hypothesis example, and a refused start shape a whole search (on the
    H200, 2026-12-04: an EAGLE tree of top-4 on V=3, 357 cases refused; ignore_eos with
    stop_token_ids, 94 requests)."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    from specfuzz.fuzz.run import max_model_len
    from specfuzz.strategies import case_families, start_shapes

    caps = SGLangEngine().capabilities()
    methods = tuple(m for m in caps.methods if not engine_default or m in caps.spec_defaults)
    seen: set = set()

    @st.composite
    def families(draw):
        method = draw(st.sampled_from(methods))
        shape = draw(start_shapes(methods=(method,), draft_vocab=caps.draft_vocab, spec_knobs=dict(caps.spec_knobs),
                                  spec_defaults=dict(caps.spec_defaults), engine_default=engine_default,
                                  max_vocab=6, max_k=5, min_vocab=dict(caps.min_vocab)))
        fam = draw(case_families(max_patterns=6, shape=shape, max_tokens=4, sampling=caps.honoured(True),
                                 min_tokens_speculating=2, exclusive=caps.sampling_exclusive))
        return shape, fam

    @settings(max_examples=400, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(families())
    def check(drawn):
        shape, fam = drawn
        spec, V = shape.spec, shape.vocab_size
        dv = shape.draft_width if spec.method in ("eagle", "eagle3") else (V if spec.uses_draft_model else None)
        speculative_kwargs(spec, draft_dir=tmp_path if spec.uses_draft_model else None, target_vocab=V, draft_vocab=dv)
        limit = max_model_len(max(len(c.prompt) + c.params.max_tokens for c in fam))
        for c in fam:
            sampling_params_dict(Request(c.prompt, c.params, seed=1), vocab_size=V, max_model_len=limit)
        seen.add(spec.method)

    check()
    assert set(methods) <= seen  # every method was drawn (and taken)
