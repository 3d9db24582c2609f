# Template: the checkpoints of a repro.py whose drafter is an EAGLE or EAGLE-3 head
# (specfuzz.fuzz.draft.repro renders it after repro_common instead of repro_draft). It writes
# what specfuzz.tablegen.eagle writes, inline: the target with the head's layout (EAGLE: the
# draft table in the lm_head's spare columns; EAGLE-3: 4 layers) and the head itself, in
# vLLM's layout or SGLang's (other architecture names, a zero fc.bias for EAGLE).
# The imports above the "repro.py begins" line are for linting and testing this file alone.
import json
import math
import os

import numpy as np

from specfuzz.fuzz.draft.templates.repro_common import (
    DRAFT_TABLE, DTYPE, EOS_TOKEN_ID, HEAD, MAX_POSITION_EMBEDDINGS, RMS_NORM_EPS, ROPE_THETA, TARGET_HEAD_COLUMNS,
    TARGET_LAYERS, TARGET_TABLE, TOKENIZER, hidden_size_for, save_safetensors, write_checkpoint,
)

# ---- repro.py begins ----


# ---- the EAGLE head (the construction of specfuzz.tablegen.eagle, inline) ---------------
EAGLE3_AUX_LAYER_IDS = (0, 1, 2)  # aux hidden states: inputs of layers 0-2 (vLLM), 1-3 (SGLang)
SHARP_PAIRS = 8  # rotary pairs on which the EAGLE-3 head's q = k = c
SHARP_VALUE = 64.0  # |c|: every earlier position's attention weight underflows to exactly 0
SGLANG_ARCHITECTURES = {"eagle": "LlamaForCausalLMEagle", "eagle3": "LlamaForCausalLMEagle3"}


def zeros_layer(p, h, d, inter, qkv_in):
    return {
        p + "self_attn.q_proj.weight": np.zeros((d, qkv_in), dtype=np.float32),  # [D, in]
        p + "self_attn.k_proj.weight": np.zeros((d, qkv_in), dtype=np.float32),  # [D, in]
        p + "self_attn.v_proj.weight": np.zeros((d, qkv_in), dtype=np.float32),  # [D, in]
        p + "self_attn.o_proj.weight": np.zeros((h, d), dtype=np.float32),  # [H, D]
        p + "post_attention_layernorm.weight": np.ones(h, dtype=np.float32),  # [H]
        p + "mlp.gate_proj.weight": np.zeros((inter, h), dtype=np.float32),  # [I, H]
        p + "mlp.up_proj.weight": np.zeros((inter, h), dtype=np.float32),  # [I, H]
        p + "mlp.down_proj.weight": np.zeros((h, inter), dtype=np.float32),  # [H, I]
    }


def eagle_weights(v, h, d, layout):
    """EAGLE-1: fc maps the embedding s*e_x to e_{V+x}; the shared lm_head's columns [V, 2V) hold the table."""
    s = math.isqrt(h)
    fc = np.zeros((h, 2 * h), dtype=np.float32)  # [H, 2H]: cat(embed, hidden) -> H
    fc[np.arange(v) + v, np.arange(v)] = 1.0 / s
    w = {"fc.weight": fc}
    if layout == "sglang":
        w["fc.bias"] = np.zeros(h, dtype=np.float32)  # SGLang's fc has a bias
    w.update(zeros_layer("layers.0.", h, d, max(64, h), h))  # layer 0 of a head: no input norm
    return w


def eagle3_weights(v, h, d, table, d2t):
    """EAGLE-3: attention picks exactly the current position and copies its embedding; own lm_head."""
    s = math.isqrt(h)
    vd = table.shape[1]
    p = "layers.0."
    w = zeros_layer(p, h, d, max(64, h), 2 * h)
    q = np.zeros((d, 2 * h), dtype=np.float32)  # [D, 2H]: reads cat(norm(embed), norm(hidden))
    q[:SHARP_PAIRS, :v] = SHARP_VALUE / s
    w[p + "self_attn.q_proj.weight"] = q
    w[p + "self_attn.k_proj.weight"] = q.copy()
    vw = np.zeros((d, 2 * h), dtype=np.float32)  # [D, 2H]
    vw[np.arange(v), np.arange(v)] = 1.0
    vw[np.arange(v) + v, np.arange(v) + h] = 1.0
    w[p + "self_attn.v_proj.weight"] = vw
    o = np.zeros((h, d), dtype=np.float32)  # [H, D]
    o[np.arange(v), np.arange(v)] = 1.0
    o[np.arange(v), np.arange(v) + v] = -1.0  # cancels the residual's hidden state
    w[p + "self_attn.o_proj.weight"] = o
    w[p + "input_layernorm.weight"] = np.ones(h, dtype=np.float32)
    w[p + "hidden_norm.weight"] = np.ones(h, dtype=np.float32)
    embed = np.zeros((v, h), dtype=np.float32)  # [V, H]
    embed[np.arange(v), np.arange(v)] = float(s)
    w["embed_tokens.weight"] = embed
    w["fc.weight"] = np.zeros((h, 3 * h), dtype=np.float32)  # [H, 3H]: aux hidden states unused
    w["norm.weight"] = np.full((h,), 1.0 / s, dtype=np.float32)
    lm = np.zeros((vd, h), dtype=np.float32)  # [V_draft, H]
    if vd == v:
        lm[list(d2t), :v] = table.T  # full width: rows in target order, no d2t tensor
    else:
        lm[:, :v] = table.T  # lm[j, x] = D[x, j]
        w["d2t"] = np.array([t - j for j, t in enumerate(d2t)], dtype=np.int64)  # target id = j + d2t[j]
    w["lm_head.weight"] = lm
    return w


def write_eagle_head(out_dir, target_dir, kind, table, d2t, layout):
    """The head that drafts, after target token x, from exactly ``table[x]`` ([V, V_draft], rounded)."""
    import shutil

    os.makedirs(out_dir, exist_ok=True)
    table = np.asarray(table, dtype=np.float32)  # [V, V_draft]
    v, vd = table.shape
    d2t = list(range(vd)) if d2t is None else list(d2t)
    h = hidden_size_for(2 * v if kind == "eagle" else v)
    d = max(64, 1 << (2 * v - 1).bit_length())  # v carries 2V values for EAGLE-3
    w = eagle_weights(v, h, d, layout) if kind == "eagle" else eagle3_weights(v, h, d, table, d2t)
    save_safetensors(w, os.path.join(out_dir, "model.safetensors"), DTYPE)
    config = {
        "architectures": [SGLANG_ARCHITECTURES[kind] if layout == "sglang" else "LlamaForCausalLM"],
        "model_type": "llama", "vocab_size": v, "hidden_size": h, "intermediate_size": max(64, h),
        "num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": d,
        "hidden_act": "silu", "max_position_embeddings": MAX_POSITION_EMBEDDINGS, "rms_norm_eps": RMS_NORM_EPS,
        "rope_theta": ROPE_THETA, "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False, "bos_token_id": None,
        "eos_token_id": EOS_TOKEN_ID, "torch_dtype": DTYPE, "dtype": DTYPE,
    }
    if kind == "eagle3":
        config.update({
            "draft_vocab_size": vd, "target_hidden_size": h,
            "eagle_aux_hidden_state_layer_ids": list(EAGLE3_AUX_LAYER_IDS),
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(EAGLE3_AUX_LAYER_IDS), "use_aux_hidden_state": True},
            "norm_before_residual": False,
        })
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        shutil.copyfile(os.path.join(target_dir, name), os.path.join(out_dir, name))
    return out_dir


class Checkpoints:
    def __init__(self, root):
        self.target = write_checkpoint(os.path.join(root, "target"), TARGET_TABLE, EOS_TOKEN_ID, TOKENIZER,
                                       num_layers=TARGET_LAYERS, head_table=DRAFT_TABLE if TARGET_HEAD_COLUMNS else None)
        self.draft = write_eagle_head(os.path.join(root, "head"), self.target, HEAD["kind"], DRAFT_TABLE, HEAD["d2t"],
                                      HEAD["layout"])
