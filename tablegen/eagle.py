"""EAGLE and EAGLE-3 draft heads for table targets, with exactly known draft tables.

A head written here drafts, after token x, from exactly ``round(draft_table)[x]``: the
same bigram drafter the reference sampler runs for ``draft_model`` (``SpecConfig``
methods ``"eagle"`` and ``"eagle3"`` are chains with ``draft_model`` semantics). The
layouts follow vLLM's ``EagleLlamaForCausalLM`` and ``Eagle3LlamaForCausalLM`` (vLLM
0.25/0.32, ``model_executor/models/llama_eagle*.py``): the checkpoint's config says
``LlamaForCausalLM`` and vLLM's ``EAGLEConfig`` renames the architecture for the method.

Notation: target vocabulary V, hidden size H = s**2 (s a power of two), target hidden
state after token i is ``s * e_i`` at every layer (:mod:`specfuzz.tablegen.checkpoint`).

EAGLE (EAGLE-1) — ``kind="eagle"``
    The head shares the target's embedding and lm_head (it stores neither). Its
    ``fc`` maps ``cat(embed(x), hidden)`` to ``e_{V+x}`` (``fc[V+i, i] = 1/s``: reads
    the embedding only); its decoder layer has zero attention/MLP weights (layer 0 has
    no input norm in EAGLE), so the head's output is ``e_{V+x}`` exactly, and vLLM
    applies the shared lm_head with no final norm: logits = lm_head column V+x. The
    target is written with ``head_table=draft_table`` (those columns), which does not
    change the target's logits. The draft vocabulary is the target's (masked columns
    for a narrower draft).

EAGLE-3 — ``kind="eagle3"``
    Own lm_head ``[V_draft, H]`` and ``d2t`` (vLLM: target id = draft id + d2t[draft
    id]), so a reduced draft vocabulary with any id map. A full-width draft is written
    in target id order without d2t (vLLM 0.32 has no d2t parameter when
    draft_vocab_size equals the target's and refuses one in the checkpoint). EAGLE-3 feeds the token
    embedding only into attention (``qkv_proj`` reads ``cat(norm(embed), norm(hidden))``)
    and the hidden state into the residual. The head makes attention pick exactly the
    current position: q and k are the same constant vector c (|c| = 64 on the first
    ``SHARP_PAIRS`` rotary pairs), so the score of a position d steps back is
    ``sum_p c^2 cos(theta_p d) / sqrt(D)``, at least ``MIN_SCORE_GAP`` below the current
    position's for every distance up to max_position_embeddings (checked when written):
    every other weight underflows to exactly 0 in float32 and the current one is
    exp(0) = 1. v copies the embedding (``s e_x``) and the normed hidden state, and
    o_proj writes ``s e_x - norm(hidden)``: adding the residual (the hidden state, which
    is ``s e_y`` or 0) leaves exactly ``s e_x``, whether the residual is taken before or
    after ``hidden_norm``. ``fc`` (the three target layers' aux hidden states) is zero,
    MLP zero, final norm 1/s, so logits = lm_head applied to e_x = the draft row of x.
    The target is written with 4 layers so that the aux layer ids (0, 1, 2) exist in
    vLLM's convention (input of layer i) and in SGLang's (input of layer i + 1).

SGLang (``models/llama_eagle.py``, ``llama_eagle3.py``) loads the same weights under
other architecture names and gives EAGLE's ``fc`` a bias: :func:`sglang_head` writes
that variant next to the head (same tables, same arithmetic).

Both heads therefore draft from the current token only, whatever the hidden states the
engine feeds them (target's aux states, or the head's own output in later steps).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specfuzz.errors import InvalidInput
from specfuzz.tablegen.checkpoint import (
    META_FILE,
    MIN_INTERMEDIATE_SIZE,
    RMS_NORM_EPS,
    ROPE_THETA,
    WEIGHTS_FILE,
    _move_into_place,
    _prepare_out_dir,
    _write_json,
)
from specfuzz.tablegen.rounding import DTYPES, MASKED_LOGIT, round_table

KINDS = ("eagle", "eagle3")
# Layers of a target that an EAGLE-3 head reads aux hidden states from.
# vLLM captures the input of layer i for aux id i (id L = the last layer's output), SGLang
# the input of layer i + 1 (models/llama.py set_eagle3_layers_to_capture): with 4 layers
# both engines find all three aux states of ids (0, 1, 2) (SGLang's layers 1, 2, 3).
EAGLE3_TARGET_LAYERS = 4
EAGLE3_AUX_LAYER_IDS = (0, 1, 2)
# Sharp attention: number of rotary pairs carrying q = k = c, and |c|.
SHARP_PAIRS = 8
SHARP_VALUE = 64.0
# Minimum score gap (natural-log units) between the current position and any other:
# exp(-104) already underflows to 0 in float32.
MIN_SCORE_GAP = 200.0
HEAD_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class HeadInfo:
    path: Path
    kind: str
    vocab_size: int  # target vocabulary
    draft_vocab_size: int
    d2t: tuple[int, ...]  # target id of each draft id
    dtype: str
    hidden_size: int
    head_dim: int
    table_rounded: np.ndarray  # [V, V_draft] the draft table the head reproduces


def _target_meta(target_dir: Path) -> tuple[dict, dict]:
    cfg_path = target_dir / "config.json"
    if not cfg_path.is_file():
        raise InvalidInput("target_dir", str(target_dir), "a tablegen target checkpoint folder (config.json missing)")
    cfg = json.loads(cfg_path.read_text())
    meta_path = target_dir / META_FILE
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    return cfg, meta


def sharp_score_gap(head_dim: int, max_positions: int, rope_theta: float = ROPE_THETA) -> float:
    """Smallest score gap (current position minus any earlier one, up to ``max_positions``
    back) of the EAGLE-3 head's attention, for neox-style rotary embeddings."""
    theta = rope_theta ** (-2.0 * np.arange(SHARP_PAIRS) / head_dim)  # [P]
    d = np.arange(1, max(2, max_positions))  # [N]
    gaps = (SHARP_VALUE**2 * (1.0 - np.cos(np.outer(d, theta)))).sum(axis=1) / math.sqrt(head_dim)  # [N]
    return float(gaps.min())


def _round_rect(table: np.ndarray, dtype: str) -> np.ndarray:
    """round_table for a [R, C] table with C <= R (padded square with -inf, then cut)."""
    r, c = table.shape
    sq = np.full((r, r), -np.inf)
    sq[:, :c] = table
    return round_table(sq, dtype)[:, :c]


def eagle_target_kwargs(kind: str, draft_table: np.ndarray | None = None) -> dict[str, Any]:
    """The extra :func:`write_checkpoint` arguments the target of a ``kind`` head needs."""
    if kind == "eagle":
        if draft_table is None:
            raise InvalidInput("draft_table", None, "the [V, V] draft table (EAGLE shares the target's lm_head)")
        return {"head_table": np.asarray(draft_table)}
    if kind == "eagle3":
        return {"num_layers": EAGLE3_TARGET_LAYERS}
    raise InvalidInput("kind", kind, f"one of {KINDS}")


def write_eagle_head(
    out_dir: str | os.PathLike[str],
    *,
    kind: str,
    target_dir: str | os.PathLike[str],
    draft_table: np.ndarray,
    d2t: tuple[int, ...] | list[int] | None = None,
    overwrite: bool = False,
) -> HeadInfo:
    """Write an EAGLE (``kind="eagle"``) or EAGLE-3 (``"eagle3"``) head for a table target.

    ``draft_table`` is [V, V_draft] (``table[prev_target_token, draft_id]``); ``d2t`` the
    target id of each draft id (default: the first V_draft target ids). EAGLE needs
    V_draft = V, d2t None, and a target written with ``eagle_target_kwargs("eagle",
    draft_table)``; EAGLE-3 a target written with ``eagle_target_kwargs("eagle3")``.
    The dtype is the target's. Writes atomically, as write_checkpoint does.
    """
    if kind not in KINDS:
        raise InvalidInput("kind", kind, f"one of {KINDS}")
    tdir = Path(target_dir)
    cfg, meta = _target_meta(tdir)
    V = int(cfg["vocab_size"])
    H = int(cfg["hidden_size"])
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32")
    if dtype not in DTYPES:
        raise InvalidInput("target dtype", dtype, f"one of {list(DTYPES)}")
    s = math.isqrt(H)
    if s * s != H:
        raise InvalidInput("target hidden_size", H, "a power of 4 (a tablegen target)")
    table = np.asarray(draft_table, dtype=np.float64)
    if table.ndim != 2 or table.shape[0] != V or not 1 <= table.shape[1] <= V:
        raise InvalidInput("draft_table.shape", tuple(table.shape), f"[V={V}, V_draft] with 1 <= V_draft <= {V}")
    Vd = int(table.shape[1])
    if d2t is None:
        ids = tuple(range(Vd))
    else:
        ids = tuple(int(t) for t in d2t)
        if len(ids) != Vd or len(set(ids)) != Vd or min(ids) < 0 or max(ids) >= V:
            raise InvalidInput("d2t", d2t, f"{Vd} distinct target ids in [0, {V})")
    if kind == "eagle":
        if Vd != V or ids != tuple(range(V)):
            raise InvalidInput("draft_table.shape", tuple(table.shape), f"[{V}, {V}] with the identity d2t for EAGLE (it shares the target's vocabulary; mask columns instead)")
        if not meta.get("head_table"):
            raise InvalidInput("target_dir", str(tdir), "a target written with eagle_target_kwargs('eagle', draft_table) (its lm_head must carry the head's table)")
        if H < 2 * V:
            raise InvalidInput("target hidden_size", H, f">= 2V = {2 * V}")
    else:
        n_layers = int(cfg.get("num_hidden_layers", 1))
        if n_layers < max(EAGLE3_AUX_LAYER_IDS) + 2:
            raise InvalidInput(
                "target num_hidden_layers", n_layers,
                f">= {max(EAGLE3_AUX_LAYER_IDS) + 2} (written with eagle_target_kwargs('eagle3'): SGLang reads aux id i "
                "from the input of layer i + 1)",
            )
    rounded = _round_rect(table, dtype)  # [V, Vd]
    if kind == "eagle":
        # The head drafts from the target's lm_head: it must hold exactly this table.
        stored = _stored_head_table(tdir, V)
        if not np.array_equal(stored, rounded):
            raise InvalidInput("draft_table", "differs from the table in the target's lm_head", "the table the target was written with (head_table)")
    max_pos = int(cfg.get("max_position_embeddings", 256))
    head_dim = max(64, 1 << (2 * V - 1).bit_length())  # v carries 2V values for EAGLE-3
    if kind == "eagle3":
        gap = sharp_score_gap(head_dim, max_pos)
        if gap < MIN_SCORE_GAP:  # pragma: no cover - holds for every head_dim/max_pos we write
            raise InvalidInput("max_position_embeddings", max_pos, f"a length for which the head's attention stays one-hot (gap {gap:.1f} < {MIN_SCORE_GAP})")

    out = Path(out_dir)
    _prepare_out_dir(out, overwrite)
    weights = _eagle_weights(V, H, head_dim, dtype) if kind == "eagle" else _eagle3_weights(V, H, head_dim, dtype, rounded, ids)
    inter = max(MIN_INTERMEDIATE_SIZE, H)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": V,
        "hidden_size": H,
        "intermediate_size": inter,
        "num_hidden_layers": 1,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_pos,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_theta": ROPE_THETA,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": cfg.get("bos_token_id"),
        "eos_token_id": cfg.get("eos_token_id"),
        "torch_dtype": dtype,
        "dtype": dtype,
    }
    if kind == "eagle3":
        config.update({
            "draft_vocab_size": Vd,
            "target_hidden_size": H,
            "eagle_aux_hidden_state_layer_ids": list(EAGLE3_AUX_LAYER_IDS),
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(EAGLE3_AUX_LAYER_IDS), "use_aux_hidden_state": True},
            "norm_before_residual": False,
        })
    head_meta = {
        "schema_version": HEAD_SCHEMA_VERSION, "kind": kind, "vocab_size": V, "draft_vocab_size": Vd,
        "d2t": list(ids), "dtype": dtype, "hidden_size": H, "head_dim": head_dim,
        "masked_logit": MASKED_LOGIT, "target": tdir.name,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        from safetensors.torch import save_file

        save_file(weights, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        _write_json(tmp / "config.json", config)
        _write_json(tmp / META_FILE, head_meta)
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
            if (tdir / name).is_file():
                shutil.copyfile(tdir / name, tmp / name)
        os.chmod(tmp, 0o755)
        _move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return HeadInfo(out, kind, V, Vd, ids, dtype, H, head_dim, rounded)


def _stored_head_table(target_dir: Path, V: int) -> np.ndarray:
    from safetensors.torch import load_file

    import torch

    lm = load_file(str(target_dir / WEIGHTS_FILE))["lm_head.weight"].to(torch.float32).numpy()  # [V, H]
    return np.ascontiguousarray(lm[:, V:2 * V].T, dtype=np.float32)  # [V, V]


def _zeros_layer(p: str, H: int, D: int, inter: int, tdt, qkv_in: int) -> dict[str, Any]:
    import torch

    return {
        p + "self_attn.q_proj.weight": torch.zeros(D, qkv_in, dtype=tdt),  # [D, in]
        p + "self_attn.k_proj.weight": torch.zeros(D, qkv_in, dtype=tdt),  # [D, in]
        p + "self_attn.v_proj.weight": torch.zeros(D, qkv_in, dtype=tdt),  # [D, in]
        p + "self_attn.o_proj.weight": torch.zeros(H, D, dtype=tdt),  # [H, D]
        p + "post_attention_layernorm.weight": torch.ones(H, dtype=tdt),  # [H]
        p + "mlp.gate_proj.weight": torch.zeros(inter, H, dtype=tdt),  # [I, H]
        p + "mlp.up_proj.weight": torch.zeros(inter, H, dtype=tdt),  # [I, H]
        p + "mlp.down_proj.weight": torch.zeros(H, inter, dtype=tdt),  # [H, I]
    }


def _eagle_weights(V: int, H: int, D: int, dtype: str) -> dict[str, Any]:
    """EAGLE-1 (vLLM names without the ``model.`` prefix, as EAGLE checkpoints have them)."""
    import torch

    tdt = getattr(torch, dtype)
    s = math.isqrt(H)
    fc = torch.zeros(H, 2 * H, dtype=tdt)  # [H, 2H]: cat(embed, hidden) -> H
    fc[torch.arange(V) + V, torch.arange(V)] = 1.0 / s  # embed s*e_x -> e_{V+x}
    w = {"fc.weight": fc}
    # Layer 0 of an EAGLE head has no input norm (vLLM replaces it by Identity).
    w.update(_zeros_layer("layers.0.", H, D, max(MIN_INTERMEDIATE_SIZE, H), tdt, H))
    return w


def _eagle3_weights(V: int, H: int, D: int, dtype: str, rounded: np.ndarray, d2t: tuple[int, ...]) -> dict[str, Any]:
    import torch

    tdt = getattr(torch, dtype)
    s = math.isqrt(H)
    Vd = rounded.shape[1]
    p = "layers.0."
    w = _zeros_layer(p, H, D, max(MIN_INTERMEDIATE_SIZE, H), tdt, 2 * H)
    q = torch.zeros(D, 2 * H, dtype=tdt)  # [D, 2H]: reads cat(norm(embed), norm(hidden))
    q[:SHARP_PAIRS, :V] = SHARP_VALUE / s  # norm(embed) = s*e_x -> q = c on the first pairs
    w[p + "self_attn.q_proj.weight"] = q
    w[p + "self_attn.k_proj.weight"] = q.clone()
    v = torch.zeros(D, 2 * H, dtype=tdt)  # [D, 2H]
    v[torch.arange(V), torch.arange(V)] = 1.0  # v[i] = s*[x == i]
    v[torch.arange(V) + V, torch.arange(V) + H] = 1.0  # v[V+i] = norm(hidden)[i]
    w[p + "self_attn.v_proj.weight"] = v
    o = torch.zeros(H, D, dtype=tdt)  # [H, D]
    o[torch.arange(V), torch.arange(V)] = 1.0
    o[torch.arange(V), torch.arange(V) + V] = -1.0  # cancel the residual's hidden state
    w[p + "self_attn.o_proj.weight"] = o
    w[p + "input_layernorm.weight"] = torch.ones(H, dtype=tdt)
    w[p + "hidden_norm.weight"] = torch.ones(H, dtype=tdt)
    embed = torch.zeros(V, H, dtype=tdt)  # [V, H], equal to the target's (vLLM then shares it)
    embed[torch.arange(V), torch.arange(V)] = float(s)
    w["embed_tokens.weight"] = embed
    w["fc.weight"] = torch.zeros(H, 3 * H, dtype=tdt)  # [H, 3H]: aux hidden states unused
    w["norm.weight"] = torch.full((H,), 1.0 / s, dtype=tdt)
    lm = torch.zeros(Vd, H, dtype=tdt)  # [V_draft, H]
    if Vd == V:
        # A full-width draft: vLLM 0.32 has no d2t parameter then (refuses one in the
        # checkpoint), so the rows go in target order: lm[d2t[j], x] = D[x, j].
        lm[list(d2t), :V] = torch.from_numpy(np.ascontiguousarray(rounded.T)).to(tdt)
    else:
        lm[:, :V] = torch.from_numpy(np.ascontiguousarray(rounded.T)).to(tdt)  # lm[j, x] = D[x, j]
        # vLLM's d2t convention: target id = draft id + d2t[draft id].
        w["d2t"] = torch.tensor([t - j for j, t in enumerate(d2t)], dtype=torch.int64)  # [V_draft]
    w["lm_head.weight"] = lm
    return w


def load_head_table(head_dir: str | os.PathLike[str]) -> tuple[np.ndarray, tuple[int, ...]]:
    """(draft table [V, V_draft] float32, d2t) an EAGLE-3 head written here drafts from."""
    from safetensors.torch import load_file

    import torch

    d = Path(head_dir)
    w = load_file(str(d / WEIGHTS_FILE))
    if "lm_head.weight" not in w:
        raise InvalidInput("head_dir", str(d), "an EAGLE-3 head (EAGLE heads share the target's lm_head: see load_table)")
    cfg = json.loads((d / "config.json").read_text())
    V = int(cfg["vocab_size"])
    lm = w["lm_head.weight"].to(torch.float32).numpy()  # [V_draft, H]
    if "d2t" not in w:  # full width, rows in target order
        return np.ascontiguousarray(lm[:, :V].T), tuple(range(lm.shape[0]))
    off = w["d2t"].numpy().tolist()
    return np.ascontiguousarray(lm[:, :V].T), tuple(j + o for j, o in enumerate(off))


# ----------------------------------------------------------------------------- SGLang layout

# SGLang picks a draft model's class from its config's architectures (no renaming by method).
SGLANG_ARCHITECTURES = {"eagle": "LlamaForCausalLMEagle", "eagle3": "LlamaForCausalLMEagle3"}


def sglang_head(head_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None = None) -> Path:
    """The head at ``head_dir`` in SGLang 0.5's layout, written once next to it (``<name>-sglang``).

    SGLang's ``LlamaForCausalLMEagle`` has ``fc = nn.Linear(2H, H)`` *with* a bias, which a
    checkpoint without ``fc.bias`` leaves at its random initialisation: the variant adds a
    zero bias. ``LlamaForCausalLMEagle3`` reads the same names as vLLM's (``d2t`` is the same
    offset map, ``hot_token_id = d2t + arange``). Both need their architecture name in
    config.json. Weights, tables and head metadata are otherwise the head's own.
    """
    src = Path(head_dir)
    meta_path = src / META_FILE
    if not meta_path.is_file() or not (src / "config.json").is_file():
        raise InvalidInput("head_dir", str(src), "an EAGLE head folder written by write_eagle_head")
    meta = json.loads(meta_path.read_text())
    kind = meta.get("kind")
    if kind not in KINDS:
        raise InvalidInput("head kind", kind, f"one of {KINDS}")
    out = Path(out_dir) if out_dir is not None else src.with_name(src.name + "-sglang")
    if (out / "config.json").is_file():
        return out
    from safetensors.torch import load_file, save_file

    import torch

    weights = load_file(str(src / WEIGHTS_FILE))
    if kind == "eagle":
        fc = weights["fc.weight"]
        weights["fc.bias"] = torch.zeros(fc.shape[0], dtype=fc.dtype)  # [H]
    config = json.loads((src / "config.json").read_text())
    config["architectures"] = [SGLANG_ARCHITECTURES[kind]]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        save_file(weights, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        _write_json(tmp / "config.json", config)
        _write_json(tmp / META_FILE, {**meta, "layout": "sglang", "source": src.name})
        for f in src.iterdir():
            if f.is_file() and f.name not in (WEIGHTS_FILE, "config.json", META_FILE):
                shutil.copyfile(f, tmp / f.name)
        os.chmod(tmp, 0o755)
        try:
            _move_into_place(tmp, out)
        except OSError:
            if not (out / "config.json").is_file():  # another process wrote it meanwhile: fine
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


# ----------------------------------------------------------------------------- what an engine drafts


def greedy_acceptance(target_table: np.ndarray, draft_table: np.ndarray, d2t: tuple[int, ...] | None,
                      prompt_last: int, max_tokens: int, K: int) -> tuple[int, int]:
    """(drafted, accepted) of one greedy request with greedy target and a head that drafts
    argmax of its table's row of the current token, in chains of ``K``, when the engine
    samples the first token in prefill (vLLM, SGLang). The tables must have unique row
    maxima (no ties), so both the output and the acceptance are deterministic.

    An engine's accepted count equal to this for every prompt shows the head drafts from
    exactly that row; a head reading any other context gives other counts.
    """
    T = np.asarray(target_table)
    Dt = np.asarray(draft_table)
    ids = np.arange(Dt.shape[1]) if d2t is None else np.asarray(d2t)
    tmap = {x: int(np.argmax(T[x])) for x in range(T.shape[0])}
    dmap = {x: int(ids[np.argmax(Dt[x])]) for x in range(T.shape[0])}
    out = [tmap[prompt_last]]
    drafted = accepted = 0
    while len(out) < max_tokens:
        x = out[-1]
        d = []
        for _ in range(K):
            x = dmap[x]
            d.append(x)
        drafted += K
        x, n = out[-1], 0
        for tok in d:
            if tmap[x] != tok:
                break
            n, x = n + 1, tok
        accepted += n
        out += d[:n] + [tmap[x]]
    return drafted, accepted
