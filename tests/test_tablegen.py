"""specfuzz.tablegen: checkpoints reproduce their tables bit for bit in HF transformers (CPU)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from specfuzz.errors import InvalidInput  # noqa: E402
from specfuzz.tablegen import (  # noqa: E402
    DTYPES,
    MASKED_LOGIT,
    MAX_VOCAB,
    load_table,
    round_table,
    token_text,
    tokens_text,
    write_checkpoint,
    write_pair,
)

transformers.logging.set_verbosity_error()
try:  # the "Loading weights" progress bar
    transformers.utils.logging.disable_progress_bar()
except AttributeError:  # pragma: no cover - older transformers
    pass

SEED = 1234
LOGIT_SCALE = 3.0
RANDOM_SEQ_LEN = 10


def _random_table(v: int, seed: int = SEED) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((v, v)) * LOGIT_SCALE  # [V, V] float64


def _assert_reproduces(ckpt_dir, dtype: str, expected_table: np.ndarray, seqs) -> None:
    """HF's logits at every position of each sequence equal expected_table[token]."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        ckpt_dir, dtype=getattr(torch, dtype)
    )
    model.eval()
    for ids in seqs:
        ids = np.ascontiguousarray(ids)  # [T]
        with torch.no_grad():
            out = model(torch.as_tensor(ids, dtype=torch.long)[None]).logits  # [1, T, V]
        assert out.dtype == getattr(torch, dtype)
        got = out[0].to(torch.float32).numpy()  # [T, V]
        want = expected_table[ids]  # [T, V]
        assert np.array_equal(got, want), (
            f"max |diff| = {np.abs(got - want).max()} at ids={ids.tolist()}"
        )


# ---------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab_size", [2, 5, 16])
def test_hf_logits_equal_rounded_table_bit_for_bit(tmp_path, vocab_size, dtype, num_layers):
    table = _random_table(vocab_size)  # [V, V] float64: rounding always changes it
    with pytest.warns(UserWarning, match="rounded"):
        info = write_checkpoint(tmp_path / "ckpt", table, dtype=dtype, num_layers=num_layers)
    assert info.rounded
    assert np.array_equal(info.table_rounded, round_table(table, dtype))
    assert np.array_equal(load_table(info.path), info.table_rounded)

    rng = np.random.default_rng(SEED + vocab_size)
    seqs = [np.arange(vocab_size), rng.integers(0, vocab_size, RANDOM_SEQ_LEN)]
    _assert_reproduces(info.path, dtype, info.table_rounded, seqs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_extreme_and_masked_values_are_exact(tmp_path, dtype):
    big = {"float32": 3.0e38, "bfloat16": 3.0e38, "float16": 65504.0}[dtype]
    table = np.array(
        [
            [big, -big, 0.0, -np.inf],
            [2.0**-20, -(2.0**-20), -0.0, 1.0],
            [-np.inf, -np.inf, 7.0, -np.inf],
            [MASKED_LOGIT, 1e-3, -1e-3, 123.456],
        ]
    )  # [4, 4]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        info = write_checkpoint(tmp_path / "ckpt", table, dtype=dtype, hidden_size=64)
    assert info.num_masked == 4
    assert info.table_rounded[0, 3] == MASKED_LOGIT
    _assert_reproduces(info.path, dtype, info.table_rounded, [[0, 1, 2, 3, 3, 2, 1, 0]])


def test_masked_logit_has_probability_zero_in_float32_softmax():
    row = torch.tensor([0.0, MASKED_LOGIT, -100.0, MASKED_LOGIT])  # [4]
    probs = torch.softmax(row, dim=-1)
    assert probs[1].item() == 0.0 and probs[3].item() == 0.0
    for dtype in DTYPES:
        t = torch.tensor([MASKED_LOGIT], dtype=getattr(torch, dtype))
        assert t.to(torch.float32).item() == MASKED_LOGIT


def test_draft_narrower_than_target_both_reproduce(tmp_path):
    target_table = round_table(_random_table(12, seed=1), "bfloat16")  # [12, 12]
    draft_table = round_table(_random_table(5, seed=2), "bfloat16")  # [5, 5]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # already representable: no rounding warning
        target, draft = write_pair(
            tmp_path / "pair", target_table, draft_table, dtype="bfloat16",
            eos_token_id=11, draft_kwargs={"eos_token_id": 4},
        )
    assert (target.path.name, draft.path.name) == ("target", "draft")
    assert (target.vocab_size, draft.vocab_size) == (12, 5)
    assert not target.rounded and not draft.rounded
    _assert_reproduces(target.path, "bfloat16", target_table, [np.arange(12)[::-1]])
    _assert_reproduces(draft.path, "bfloat16", draft_table, [np.arange(5)])


def test_explicit_larger_hidden_size_is_exact(tmp_path):
    table = round_table(_random_table(5), "float16")  # [5, 5]
    info = write_checkpoint(tmp_path / "ckpt", table, dtype="float16", hidden_size=256)
    assert info.hidden_size == 256
    _assert_reproduces(info.path, "float16", table, [[4, 3, 2, 1, 0, 0]])


# ---------------------------------------------------------------------------- round_table


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_table_keeps_representable_values(dtype):
    table = np.array([[1.0, -2.5, 0.0], [1024.0, 0.125, -7.0], [3.0, 2.0**-8, 96.0]])
    out = round_table(table, dtype)
    assert out.dtype == np.float32
    assert np.array_equal(out, table)


def test_round_table_rounds_to_bfloat16_value_and_reports_it(tmp_path):
    table = np.array([[0.1, 1.0], [2.0, 3.0]])  # [2, 2]
    bf16_01 = torch.tensor(0.1, dtype=torch.bfloat16).float().item()
    assert bf16_01 != np.float32(0.1)
    out = round_table(table, "bfloat16")
    assert out[0, 0] == bf16_01 and out[1, 1] == 3.0
    assert round_table(table, "float32")[0, 0] == np.float32(0.1)
    with pytest.warns(UserWarning, match="rounded to bfloat16"):
        info = write_checkpoint(tmp_path / "ckpt", table, dtype="bfloat16")
    assert info.rounded and info.table_rounded[0, 0] == bf16_01


def test_round_table_maps_minus_inf_to_masked_logit():
    out = round_table(np.array([[0.0, -np.inf], [-np.inf, 1.0]]), "float16")
    assert out[0, 1] == MASKED_LOGIT and out[1, 0] == MASKED_LOGIT


def test_round_table_is_round_to_nearest_even():
    # 1 + 2**-8 is halfway between bf16 neighbours 1 and 1 + 2**-7: ties to even (1.0).
    # 1 + 3 * 2**-8 is halfway between 1 + 2**-7 and 1 + 2**-6: ties to even (1 + 2**-6).
    table = np.array([[1 + 2.0**-8, 1 + 3 * 2.0**-8], [0.0, 0.0]])
    out = round_table(table, "bfloat16")
    assert out[0, 0] == 1.0 and out[0, 1] == 1 + 2.0**-6


# ---------------------------------------------------------------------------- bad input


def _ok(v: int = 3) -> np.ndarray:
    return np.zeros((v, v))


@pytest.mark.parametrize(
    "table, kwargs, needle",
    [
        (np.zeros((3, 4)), {}, "(3, 4)"),
        (np.zeros(3), {}, "(3,)"),
        (np.zeros((2, 2, 2)), {}, "(2, 2, 2)"),
        (np.array([[0.0, np.nan], [0.0, 0.0]]), {}, "nan"),
        (np.array([[0.0, 0.0], [np.inf, 0.0]]), {}, "inf"),
        (np.zeros((1, 1)), {}, "(1, 1)"),
        (np.zeros((MAX_VOCAB + 1, MAX_VOCAB + 1)), {}, f"({MAX_VOCAB + 1}, {MAX_VOCAB + 1})"),
        (np.array([[70000.0, 0.0], [0.0, 0.0]]), {"dtype": "float16"}, "70000"),
        (np.array([[1e39, 0.0], [0.0, 0.0]]), {}, "1e+39"),
        (_ok(), {"hidden_size": 32}, "32"),
        (_ok(5), {"hidden_size": 4}, "hidden_size=4"),
        (np.zeros((20, 20)), {"hidden_size": 16}, "hidden_size=16"),
        (_ok(), {"eos_token_id": 3}, "eos_token_id=3"),
        (_ok(), {"eos_token_id": -1}, "eos_token_id=-1"),
        (_ok(), {"bos_token_id": 7}, "bos_token_id=7"),
        (_ok(), {"num_layers": 0}, "num_layers=0"),
        (_ok(), {"dtype": "float64"}, "float64"),
    ],
)
def test_bad_input_raises_invalid_input_naming_the_value(tmp_path, table, kwargs, needle):
    with pytest.raises(InvalidInput) as exc:
        write_checkpoint(tmp_path / "ckpt", table, **kwargs)
    assert needle in str(exc.value)
    assert not (tmp_path / "ckpt").exists()
    assert list(tmp_path.iterdir()) == []  # no temporary folder left behind


def test_existing_non_empty_dir_is_refused_unless_overwrite(tmp_path):
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(InvalidInput) as exc:
        write_checkpoint(out, _ok())
    assert str(out) in str(exc.value)
    assert (out / "keep.txt").exists()

    table = np.array([[1.0, 2.0], [3.0, 4.0]])
    info = write_checkpoint(out, table, overwrite=True)
    assert not (out / "keep.txt").exists()
    assert np.array_equal(load_table(info.path), table)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # temp dirs cleaned up


def test_existing_empty_dir_is_used(tmp_path):
    out = tmp_path / "ckpt"
    out.mkdir()
    write_checkpoint(out, _ok())
    assert (out / "model.safetensors").is_file()


# ---------------------------------------------------------------------------- files


def test_tokenizer_round_trips_one_token_per_character(tmp_path):
    info = write_checkpoint(tmp_path / "ckpt", _ok(5), eos_token_id=4, bos_token_id=3)
    tok = transformers.AutoTokenizer.from_pretrained(info.path)
    assert len(tok) == 5 and tok.vocab_size == 5
    text = tokens_text([0, 1, 2, 0])
    assert text == "abca"
    assert tok(text)["input_ids"] == [0, 1, 2, 0]  # nothing prepended or appended
    assert tok.decode([0, 1, 2, 0]) == "abca"
    assert (tok.eos_token, tok.eos_token_id) == (token_text(4), 4)
    assert (tok.bos_token, tok.bos_token_id) == (token_text(3), 3)
    assert tok(tokens_text([4, 3, 0]))["input_ids"] == [4, 3, 0]
    assert tok.decode([0, 4], skip_special_tokens=False) == "ae"


def test_config_files_are_neutral_llama(tmp_path):
    info = write_checkpoint(
        tmp_path / "ckpt", _ok(3), eos_token_id=2, generation_config={"max_new_tokens": 7}
    )
    config = json.loads((info.path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["model_type"] == "llama"
    assert config["vocab_size"] == 3 and config["tie_word_embeddings"] is False
    gen = json.loads((info.path / "generation_config.json").read_text())
    assert gen == {"eos_token_id": 2, "max_new_tokens": 7}
    meta = json.loads((info.path / "specfuzz_table.json").read_text())
    assert meta["schema_version"] == 1
