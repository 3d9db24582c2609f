"""Llama checkpoints whose next-token logits are exactly a given table ``L[prev, next]``.

Construction (hidden size H a power of 4, s = sqrt(H) = 2**k, V <= H):

- ``embed_tokens[i] = s * e_i``                                   # [V, H]
- every layer: q/k/v/o_proj and gate/up/down_proj all zero, both layer norms ones.
- final norm weight ``1/s`` everywhere                            # [H]
- ``lm_head[next, i] = L[i, next]`` for i < V, 0 for V <= i < H   # [V, H]
- ``rms_norm_eps = RMS_NORM_EPS = 2**-60``, ``tie_word_embeddings = false``.

Why every step on the logit path is exact, in float32, bfloat16 and float16 alike
(HF's LlamaRMSNorm: ``w * (x.float() * rsqrt(mean(x.float()**2) + eps)).to(dtype)``):

1. Embedding: s in {4, 8, 16, ...} is a power of two, exact in every dtype.
2. Each layer adds ``o_proj(...)`` and ``down_proj(...)`` to the residual. Their weights
   are zero and their inputs finite (the attention/MLP inputs are RMSNorms of s*e_i,
   q=k=v=0 gives a uniform softmax over zero values, silu(0)*0 = 0), so each adds
   exactly (+/-)0 and the residual stays s*e_i bit for bit, after any number of layers
   and at every position.
3. Final RMSNorm: mean(x**2) = s**2 / H = 1.0 exactly (a sum of one power of two and
   zeros, divided by a power of two). 1.0 + 2**-60 rounds to 1.0 in float32 (and in
   float64), so rsqrt(1.0) = 1.0 whatever the rsqrt implementation, x * 1.0 = s*e_i,
   the cast to the model dtype is exact, and (1/s) * s = 1.0: the normalised vector
   is exactly e_i.
4. lm_head: logits[next] = sum_j lm_head[next, j] * e_i[j] = L[i, next] * 1.0 plus
   products with 0.0, which are exactly 0 because every entry is finite. Any summation
   order or accumulator precision gives L[i, next] exactly, and the result is already
   representable in the dtype, so the final rounding is the identity.

So a correct engine returns exactly ``round_table(L, dtype)[last token]``; this is
checked bit for bit against HF transformers on CPU in all three dtypes
(tests/test_tablegen.py). -inf entries cannot be stored (inf * 0.0 = NaN in step 4);
they become MASKED_LOGIT (see rounding.py).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specfuzz.errors import InvalidInput
from specfuzz.tablegen.rounding import (
    DTYPES,
    MASKED_LOGIT,
    check_shape,
    round_table,
    rounding_changed,
)
from specfuzz.tablegen.tokenizer import write_tokenizer_files

SCHEMA_VERSION = 1
# specfuzz's own record of how the checkpoint was made (engines ignore it).
META_FILE = "specfuzz_table.json"
WEIGHTS_FILE = "model.safetensors"

# Vanishes against the final norm's mean square of exactly 1.0 in float32 and float64.
RMS_NORM_EPS = 2.0**-60
MIN_HIDDEN_SIZE = 16
# Attention shape: one head of a size every attention backend supports. q/k/v/o are zero,
# so none of this reaches the logits.
DEFAULT_HEAD_DIM = 64
NUM_HEADS = 1
MIN_INTERMEDIATE_SIZE = 64
ROPE_THETA = 10000.0


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    vocab_size: int
    dtype: str
    hidden_size: int
    num_layers: int
    eos_token_id: int | None
    bos_token_id: int | None
    # The float32 table the checkpoint reproduces exactly.
    table_rounded: np.ndarray = field(compare=False, repr=False)  # [V, V]
    # Whether rounding to ``dtype`` changed any finite value of the given table.
    rounded: bool = False
    # How many -inf entries became MASKED_LOGIT.
    num_masked: int = 0


def _is_power_of_4(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0 and (n.bit_length() - 1) % 2 == 0


def default_hidden_size(vocab_size: int) -> int:
    """The smallest power of 4 that is >= vocab_size and >= MIN_HIDDEN_SIZE."""
    h = MIN_HIDDEN_SIZE
    while h < vocab_size:
        h *= 4
    return h


def _check_int(name: str, value: Any, lo: int, hi: int | None, allowed: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidInput(name, value, allowed)
    if value < lo or (hi is not None and value >= hi):
        raise InvalidInput(name, value, allowed)
    return int(value)


def _prepare_out_dir(out_dir: Path, overwrite: bool) -> None:
    if out_dir.exists():
        if not out_dir.is_dir():
            raise InvalidInput("out_dir", str(out_dir), "a directory path (this is a file)")
        if any(out_dir.iterdir()) and not overwrite:
            raise InvalidInput(
                "out_dir", str(out_dir),
                "a missing or empty directory (pass overwrite=True to replace it)",
            )


def _weights(
    table_rounded: np.ndarray, hidden_size: int, num_layers: int, head_dim: int,
    intermediate_size: int, dtype: str, head_rounded: np.ndarray | None = None,
) -> dict[str, Any]:
    import torch

    v = table_rounded.shape[0]
    h = hidden_size
    scale = math.isqrt(h)  # s = sqrt(H), a power of two
    tdt = getattr(torch, dtype)

    embed = torch.zeros(v, h, dtype=tdt)  # [V, H]
    embed[torch.arange(v), torch.arange(v)] = float(scale)
    lm_head = torch.zeros(v, h, dtype=tdt)  # [V, H]
    lm_head[:, :v] = torch.from_numpy(table_rounded.T.copy()).to(tdt)  # [next, prev]
    if head_rounded is not None:
        # An EAGLE head's draft table in the spare columns [V, 2V): hidden state e_{V+i}
        # reads row i (specfuzz.tablegen.eagle). The target's own hidden states are zero
        # there, so its logits are unchanged (finite entries times 0.0 are exactly 0).
        lm_head[:, v:2 * v] = torch.from_numpy(head_rounded.T.copy()).to(tdt)  # [next, prev]

    w: dict[str, Any] = {
        "model.embed_tokens.weight": embed,
        "model.norm.weight": torch.full((h,), 1.0 / scale, dtype=tdt),  # [H]
        "lm_head.weight": lm_head,
    }
    qo = NUM_HEADS * head_dim
    for layer in range(num_layers):
        p = f"model.layers.{layer}."
        w[p + "input_layernorm.weight"] = torch.ones(h, dtype=tdt)  # [H]
        w[p + "post_attention_layernorm.weight"] = torch.ones(h, dtype=tdt)  # [H]
        w[p + "self_attn.q_proj.weight"] = torch.zeros(qo, h, dtype=tdt)  # [heads*D, H]
        w[p + "self_attn.k_proj.weight"] = torch.zeros(qo, h, dtype=tdt)  # [kv_heads*D, H]
        w[p + "self_attn.v_proj.weight"] = torch.zeros(qo, h, dtype=tdt)  # [kv_heads*D, H]
        w[p + "self_attn.o_proj.weight"] = torch.zeros(h, qo, dtype=tdt)  # [H, heads*D]
        w[p + "mlp.gate_proj.weight"] = torch.zeros(intermediate_size, h, dtype=tdt)  # [I, H]
        w[p + "mlp.up_proj.weight"] = torch.zeros(intermediate_size, h, dtype=tdt)  # [I, H]
        w[p + "mlp.down_proj.weight"] = torch.zeros(h, intermediate_size, dtype=tdt)  # [H, I]
    return w


def _model_config(
    *, vocab_size: int, hidden_size: int, intermediate_size: int, num_layers: int,
    head_dim: int, max_position_embeddings: int, dtype: str,
    eos_token_id: int | None, bos_token_id: int | None,
) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_HEADS,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": RMS_NORM_EPS,
        # Both spellings: transformers 4.x reads rope_theta, 5.x rope_parameters.
        "rope_theta": ROPE_THETA,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "pad_token_id": None,
        "torch_dtype": dtype,
        "dtype": dtype,
    }


def write_checkpoint(
    out_dir: str | os.PathLike[str],
    table: np.ndarray,
    *,
    dtype: str = "float32",
    num_layers: int = 1,
    hidden_size: int | None = None,
    eos_token_id: int | None = None,
    bos_token_id: int | None = None,
    max_position_embeddings: int = 256,
    generation_config: dict[str, Any] | None = None,
    head_dim: int = DEFAULT_HEAD_DIM,
    head_table: np.ndarray | None = None,
    overwrite: bool = False,
) -> CheckpointInfo:
    """Write a Llama checkpoint whose logits after token i are round_table(table)[i].

    ``table`` is [V, V] with ``table[prev, next]``. Writes atomically (a temporary folder
    next to ``out_dir``, then a rename); refuses a non-empty ``out_dir`` unless
    ``overwrite``. Warns when rounding to ``dtype`` changed the table.

    ``head_table`` ([V, V], optional): a second table stored in the lm_head columns
    [V, 2V) (needs hidden_size >= 2V; the default hidden size then grows). The target's
    logits do not change; an EAGLE head that shares this lm_head
    (:func:`specfuzz.tablegen.eagle.write_eagle_head`) drafts from it.
    """
    if dtype not in DTYPES:
        raise InvalidInput("dtype", dtype, f"one of {list(DTYPES)}")
    v = check_shape(np.asarray(table))
    table_rounded = round_table(table, dtype)  # [V, V]
    num_layers = _check_int("num_layers", num_layers, 1, None, "an integer >= 1")
    head_rounded = None
    if head_table is not None:
        if np.shape(head_table) != (v, v):
            raise InvalidInput("head_table.shape", tuple(np.shape(head_table)), f"None or the table's shape ({v}, {v})")
        head_rounded = round_table(head_table, dtype)
    width = 2 * v if head_table is not None else v
    if hidden_size is None:
        hidden_size = default_hidden_size(width)
    hidden_size = _check_int("hidden_size", hidden_size, width, None, f"a power of 4 >= {width}")
    if not _is_power_of_4(hidden_size):
        raise InvalidInput("hidden_size", hidden_size, f"a power of 4 >= {width}")
    for name, tid in (("eos_token_id", eos_token_id), ("bos_token_id", bos_token_id)):
        if tid is not None:
            _check_int(name, tid, 0, v, f"None or an integer in [0, V={v})")
    max_position_embeddings = _check_int(
        "max_position_embeddings", max_position_embeddings, 1, None, "an integer >= 1"
    )
    head_dim = _check_int("head_dim", head_dim, 2, None, "an even integer >= 2")
    if head_dim % 2:
        raise InvalidInput("head_dim", head_dim, "an even integer >= 2")
    if generation_config is not None and not isinstance(generation_config, dict):
        raise InvalidInput("generation_config", generation_config, "None or a dict")

    out = Path(out_dir)
    _prepare_out_dir(out, overwrite)

    changed = rounding_changed(table, table_rounded)
    num_masked = int(np.isneginf(np.asarray(table, dtype=np.float64)).sum())
    if changed:
        warnings.warn(
            f"table rounded to {dtype}: the checkpoint reproduces round_table(table, "
            f"{dtype!r}) (CheckpointInfo.table_rounded), not the given values",
            stacklevel=2,
        )

    intermediate_size = max(MIN_INTERMEDIATE_SIZE, hidden_size)
    config = _model_config(
        vocab_size=v, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_layers=num_layers, head_dim=head_dim,
        max_position_embeddings=max_position_embeddings, dtype=dtype,
        eos_token_id=eos_token_id, bos_token_id=bos_token_id,
    )
    gen: dict[str, Any] = {}
    if bos_token_id is not None:
        gen["bos_token_id"] = bos_token_id
    if eos_token_id is not None:
        gen["eos_token_id"] = eos_token_id
    gen.update(generation_config or {})
    meta = {
        "schema_version": SCHEMA_VERSION,
        "vocab_size": v,
        "dtype": dtype,
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "masked_logit": MASKED_LOGIT,
        "rounded": changed,
        "num_masked": num_masked,
        "head_table": head_table is not None,
    }

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        from safetensors.torch import save_file

        save_file(
            _weights(table_rounded, hidden_size, num_layers, head_dim, intermediate_size, dtype, head_rounded),
            str(tmp / WEIGHTS_FILE),
            metadata={"format": "pt"},
        )
        _write_json(tmp / "config.json", config)
        _write_json(tmp / "generation_config.json", gen)
        _write_json(tmp / META_FILE, meta)
        write_tokenizer_files(
            tmp, v, eos_token_id=eos_token_id, bos_token_id=bos_token_id,
            model_max_length=max_position_embeddings,
        )
        os.chmod(tmp, 0o755)
        _move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    return CheckpointInfo(
        path=out, vocab_size=v, dtype=dtype, hidden_size=hidden_size,
        num_layers=num_layers, eos_token_id=eos_token_id, bos_token_id=bos_token_id,
        table_rounded=table_rounded, rounded=changed, num_masked=num_masked,
    )


def _move_into_place(tmp: Path, out: Path) -> None:
    if not out.exists():
        os.rename(tmp, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
    os.rename(out, old / "x")
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def write_pair(
    out_dir: str | os.PathLike[str],
    target_table: np.ndarray,
    draft_table: np.ndarray,
    *,
    draft_kwargs: dict[str, Any] | None = None,
    **kw: Any,
) -> tuple[CheckpointInfo, CheckpointInfo]:
    """Write ``out_dir/target`` and ``out_dir/draft``.

    ``kw`` goes to both :func:`write_checkpoint` calls; ``draft_kwargs`` overrides it for
    the draft (e.g. an eos id valid only in the draft's vocabulary).
    """
    out = Path(out_dir)
    target = write_checkpoint(out / "target", target_table, **kw)
    draft = write_checkpoint(out / "draft", draft_table, **{**kw, **(draft_kwargs or {})})
    return target, draft


def load_table(ckpt_dir: str | os.PathLike[str]) -> np.ndarray:
    """The [V, V] float32 table stored in a checkpoint's lm_head (``table[prev, next]``)."""
    from safetensors.torch import load_file

    import torch

    path = Path(ckpt_dir) / WEIGHTS_FILE
    if not path.is_file():
        raise InvalidInput("ckpt_dir", str(ckpt_dir), f"a folder containing {WEIGHTS_FILE}")
    lm_head = load_file(str(path))["lm_head.weight"].to(torch.float32).numpy()  # [V, H]
    v = lm_head.shape[0]
    return np.ascontiguousarray(lm_head[:, :v].T, dtype=np.float32)  # [V, V]


def _write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
