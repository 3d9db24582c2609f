"""Table models as GGUF files (llama.cpp's format), float32 throughout.

The construction is :mod:`specfuzz.tablegen.checkpoint`'s (one-hot embeddings scaled by
s = sqrt(H), zero attention and MLP outputs, a final norm of 1/s, the table in the output
matrix), written with the ``gguf`` package under llama.cpp's ``llama`` architecture names
(``token_embd``, ``blk.N.attn_q`` ..., ``output_norm``, ``output``), every tensor F32. llama.cpp
computes the same steps in float32 (its RMSNorm accumulates in double), so the logits after
token i are exactly row i of the table.

Vocabulary: a SentencePiece-style (``llama``) token list with token i's one-character text
(:func:`specfuzz.tablegen.vocab.token_text`) plus one extra token ``<pad>`` at id V: llama.cpp's
SPM loader defaults BOS to id 1 and EOS to id 2 and cannot be told "none", so BOS and UNK
always name the pad token, and so does EOS when the table has none. The pad token's output row
is :data:`~specfuzz.tablegen.rounding.MASKED_LOGIT` everywhere, so its probability is exactly 0
(float32 softmax underflow) and it is never sampled. No BOS is added to prompts.

:func:`write_gguf` writes a table; :func:`gguf_from_checkpoint` converts a tablegen checkpoint
folder (its config and its lm_head table) into the GGUF that reproduces the same logits.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np

from specfuzz.errors import InvalidInput
from specfuzz.tablegen.checkpoint import (
    DEFAULT_HEAD_DIM, MIN_INTERMEDIATE_SIZE, NUM_HEADS, RMS_NORM_EPS, ROPE_THETA, _is_power_of_4, default_hidden_size,
    load_table,
)
from specfuzz.tablegen.rounding import MASKED_LOGIT, check_shape, round_table
from specfuzz.tablegen.vocab import token_text

ARCH = "llama"
PAD_TEXT = "<pad>"
# gguf's token types (gguf.TokenType): NORMAL = 1, CONTROL = 3.
TOKEN_NORMAL = 1
TOKEN_CONTROL = 3
# A marker key: which table construction this file holds (read back by read_gguf_info).
MARKER_KEY = "specfuzz.table_model"
MARKER_VERSION = 1


def gguf_vocab_size(vocab_size: int) -> int:
    """Tokens in the GGUF of a V-token table: V plus the pad token."""
    return vocab_size + 1


def write_gguf(out_path: str | os.PathLike[str], table: np.ndarray, *, eos_token_id: int | None = None,
               num_layers: int = 1, hidden_size: int | None = None, head_dim: int = DEFAULT_HEAD_DIM,
               context_length: int = 256) -> Path:
    """Write a GGUF whose logits after token i are ``round_table(table, "float32")[i]``
    (plus the pad token's MASKED_LOGIT). Written to a temporary name, then renamed."""
    import gguf

    V = check_shape(np.asarray(table))
    T = round_table(table, "float32")  # [V, V]
    if hidden_size is None:
        hidden_size = default_hidden_size(V + 1)
    H = int(hidden_size)
    if not _is_power_of_4(H) or H < V + 1:
        raise InvalidInput("hidden_size", hidden_size, f"a power of 4 >= {V + 1} (the vocabulary and its pad token)")
    if eos_token_id is not None and not (isinstance(eos_token_id, int) and 0 <= eos_token_id < V):
        raise InvalidInput("eos_token_id", eos_token_id, f"None or a token id in [0, {V})")
    if not (isinstance(num_layers, int) and num_layers >= 1):
        raise InvalidInput("num_layers", num_layers, "an integer >= 1")
    Vg = gguf_vocab_size(V)
    pad = V
    s = math.isqrt(H)
    inter = max(MIN_INTERMEDIATE_SIZE, H)
    qo = NUM_HEADS * head_dim

    embed = np.zeros((Vg, H), dtype=np.float32)  # [V+1, H]
    embed[np.arange(Vg), np.arange(Vg)] = float(s)
    output = np.zeros((Vg, H), dtype=np.float32)  # [V+1 next, H]
    output[:V, :V] = T.T  # output[next, prev] = T[prev, next]
    output[pad, :] = MASKED_LOGIT  # the pad token: never sampled from any row

    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp, ARCH)
        w.add_name("specfuzz table model")
        w.add_uint32(MARKER_KEY, MARKER_VERSION)
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        w.add_context_length(int(context_length))
        w.add_embedding_length(H)
        w.add_block_count(num_layers)
        w.add_feed_forward_length(inter)
        w.add_head_count(NUM_HEADS)
        w.add_head_count_kv(NUM_HEADS)
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_rope_dimension_count(head_dim)
        w.add_rope_freq_base(ROPE_THETA)
        w.add_layer_norm_rms_eps(RMS_NORM_EPS)
        w.add_vocab_size(Vg)
        w.add_tokenizer_model("llama")
        w.add_token_list([token_text(i) for i in range(V)] + [PAD_TEXT])
        w.add_token_scores([0.0] * Vg)
        types = [TOKEN_NORMAL] * Vg
        types[pad] = TOKEN_CONTROL
        if eos_token_id is not None:
            types[eos_token_id] = TOKEN_CONTROL
        w.add_token_types(types)
        w.add_bos_token_id(pad)
        w.add_unk_token_id(pad)
        w.add_eos_token_id(pad if eos_token_id is None else int(eos_token_id))
        w.add_add_bos_token(False)
        w.add_add_eos_token(False)
        w.add_tensor("token_embd.weight", embed)
        for layer in range(num_layers):
            p = f"blk.{layer}."
            w.add_tensor(p + "attn_norm.weight", np.ones(H, dtype=np.float32))
            w.add_tensor(p + "ffn_norm.weight", np.ones(H, dtype=np.float32))
            w.add_tensor(p + "attn_q.weight", np.zeros((qo, H), dtype=np.float32))
            w.add_tensor(p + "attn_k.weight", np.zeros((qo, H), dtype=np.float32))
            w.add_tensor(p + "attn_v.weight", np.zeros((qo, H), dtype=np.float32))
            w.add_tensor(p + "attn_output.weight", np.zeros((H, qo), dtype=np.float32))
            w.add_tensor(p + "ffn_gate.weight", np.zeros((inter, H), dtype=np.float32))
            w.add_tensor(p + "ffn_up.weight", np.zeros((inter, H), dtype=np.float32))
            w.add_tensor(p + "ffn_down.weight", np.zeros((H, inter), dtype=np.float32))
        w.add_tensor("output_norm.weight", np.full(H, 1.0 / s, dtype=np.float32))
        w.add_tensor("output.weight", output)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def gguf_from_checkpoint(ckpt_dir: str | os.PathLike[str], out_path: str | os.PathLike[str]) -> Path:
    """The GGUF of a tablegen checkpoint folder: same table (its lm_head, as float32), EOS and
    layer count. Kept when ``out_path`` already exists (its name must say what it holds)."""
    out = Path(out_path)
    if out.is_file():
        return out
    d = Path(ckpt_dir)
    try:
        cfg = json.loads((d / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidInput("checkpoint", str(d), f"a tablegen checkpoint folder with a readable config.json ({exc})") from None
    table = checkpoint_table(d)  # [V, V] float32
    eos = cfg.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return write_gguf(out, table, eos_token_id=None if eos is None else int(eos),
                      num_layers=int(cfg.get("num_hidden_layers", 1)),
                      context_length=int(cfg.get("max_position_embeddings", 256)))


def checkpoint_table(d: Path) -> np.ndarray:
    """A float32 checkpoint's table, read with numpy (no torch import); other dtypes via load_table."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        w = load_file(str(d / "model.safetensors"))["lm_head.weight"]  # [V, H]
    except (SafetensorError, TypeError, KeyError, OSError):
        return load_table(d)
    if w.dtype != np.float32:
        return load_table(d)
    V = w.shape[0]
    return np.ascontiguousarray(w[:, :V].T)


def read_gguf_info(path: str | os.PathLike[str]) -> dict:
    """What a GGUF file says about itself: ``{"table_model": bool, "vocab_size": int | None,
    "architecture": str | None}`` (a table model's vocabulary without its pad token); InvalidInput
    when it is not a readable GGUF file."""
    import gguf

    p = Path(path)
    if not p.is_file():
        raise InvalidInput("gguf", str(p), "an existing GGUF file")
    try:
        r = gguf.GGUFReader(str(p))
    except Exception as exc:  # noqa: BLE001 - any parse failure means "not a GGUF"
        raise InvalidInput("gguf", str(p), f"a GGUF file ({type(exc).__name__}: {exc})") from None

    def scalar(key: str):
        f = r.fields.get(key)
        if f is None:
            return None
        v = f.parts[f.data[0]]
        if f.types and f.types[0] == gguf.GGUFValueType.STRING:
            return bytes(v).decode("utf-8", "replace")
        return v.tolist()[0] if hasattr(v, "tolist") else v

    tokens = r.fields.get("tokenizer.ggml.tokens")
    table = scalar(MARKER_KEY) == MARKER_VERSION
    n = None if tokens is None else len(tokens.data)
    return {"table_model": table, "architecture": scalar("general.architecture"),
            "vocab_size": None if n is None else n - 1 if table else n}


def read_gguf_table(path: str | os.PathLike[str]) -> np.ndarray:
    """The [V, V] float32 table a table-model GGUF holds (its output matrix, pad token dropped)."""
    import gguf

    info = read_gguf_info(path)
    if not info["table_model"]:
        raise InvalidInput("gguf", str(path), "a table-model GGUF written by specfuzz.tablegen")
    r = gguf.GGUFReader(str(path))
    out = next(t for t in r.tensors if t.name == "output.weight")
    V = int(info["vocab_size"])
    w = np.asarray(out.data, dtype=np.float32).reshape(V + 1, -1)  # [V+1 next, H]
    return np.ascontiguousarray(w[:V, :V].T)  # [prev, next]
