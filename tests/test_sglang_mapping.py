"""The SGLang adapter's mapping, checked on any machine: what a SpecConfig and a Request become
in SGLang, and what is refused.

Against SGLang 0.5.17's own source where it is at hand (``SGLANG_SITE``, see
``sglang_helpers.py``): every key the adapter sends to ``sglang.Engine`` is a ``ServerArgs``
field and every sampling key a ``SamplingParams`` field of that version; the engine defaults
are what SGLang sets when only the method is given; the speculation mapping for every method
and knob; the sampling mapping and what it refuses; output normalisation; and every case a
campaign draws for SGLang passes the adapter's own checks.
"""

from __future__ import annotations

import ast

import pytest

from specfuzz.engines.base import Request
from specfuzz.engines.sglang_engine import (
    DEFAULT_SETTINGS,
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
from specfuzz.oracle.params import SamplingParams as SP
from specfuzz.oracle.speculative import SpecConfig

from sglang_helpers import PROMPT, SGLANG_SITE, V, sampling_fields, server_args_fields  # noqa: F401 - sampling_fields, server_args_fields: fixtures


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
