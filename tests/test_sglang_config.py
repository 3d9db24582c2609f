"""The SGLang adapter's configs, checked without SGLang: engine settings and config validation
(before anything starts), capabilities, and the plans of table swaps on real checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from specfuzz.case import Case
from specfuzz.engines.base import EngineConfig, Request
from specfuzz.engines.checkpoints import materialize
from specfuzz.engines.sglang_engine import (
    SETTINGS_ENV,
    SPEC_DEFAULTS,
    SGLangEngine,
)
from specfuzz.errors import InvalidInput
from specfuzz.fuzz.run import engine_config
from specfuzz.oracle.params import SamplingParams as SP
from specfuzz.oracle.speculative import SpecConfig

from sglang_helpers import EOS, PROMPT, T, V


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


