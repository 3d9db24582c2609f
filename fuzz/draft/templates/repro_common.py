# Template: the part of every repro.py that `specfuzz draft` writes which does not depend on
# the engine (specfuzz.fuzz.draft.repro renders it). Everything below the "repro.py begins"
# line is copied into the script: the {{...}} fields of the docstring are filled in, and the
# block between "data begins" and "data ends" is replaced by the finding's data (same names,
# real values). As it stands this file is a module that imports and lints like any other;
# the values in its data block are placeholders for a 2-token table.
# ---- repro.py begins ----
#!/usr/bin/env python3
"""{{TITLE}}

Standalone reproduction, drafted by specfuzz {{VERSION}} from corpus entry {{ENTRY}}.
Needs only {{NEEDS}}.

1. Rebuilds the lookup-table Llama checkpoint(s) in a temporary folder (config.json,
   model.safetensors, tokenizer files): the next-token logits after token i are exactly
   row i of TARGET_TABLE (one-hot embeddings, zero attention/MLP outputs, lm_head = table).
2. Runs the engine with the finding's settings, one request (own seed) per sample.
3. Tests the outputs against EXPECTED, the exact law mu of the request (computed by
   specfuzz's oracle when this script was drafted), with an anytime-valid e-value:
   E_KT = KT(counts) / mu(counts), a Krichevsky-Trofimov Dirichlet(1/2) mixture over the
   outputs mu allows plus one lumped cell for everything mu forbids (so any forbidden
   output makes E infinite), and E_tree, the same bet made token by token: at each prefix
   of the outputs a KT mixture over the next tokens (and the end) mu allows there bets
   against mu's conditional (a prefix with one allowed next step bets nothing); E_tree is
   the mean of the product over all prefixes and of a mixture over single prefixes
   (weight (1/2)^(d+1) / V^d at length d), which has the power where one prefix deviates
   among many outputs. E = (E_KT + E_tree) / 2; with a suspected bug law muD,
   E = (E + muD/mu) / 2.
   Under mu, P(E ever reaches 1/alpha) <= alpha = {{ALPHA}}: looking after every batch is fine.
The last line printed is FAIL (E >= 1/alpha) or PASS. Run as found by default; for engines
started from a recorded launch, --engine-arg KEY=VALUE and --no-speculation start the engine
otherwise (the engine line then says what was changed) to narrow the cause down.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from collections import Counter

import numpy as np

# ---- the finding, as data ------------------------------------------------------------
# ---- data begins ----
ENGINE = "generic"  # template key: reference, vllm, sglang, hf-transformers, generic
ENGINE_VERSION = ""
DTYPE = "float32"
VOCAB_SIZE = 2
PROMPT = [0]
EOS_TOKEN_ID = None
SAMPLING = {"temperature": 1.0, "max_tokens": 1}  # specfuzz SamplingParams.to_json()
SPECULATION = None  # specfuzz SpecConfig.to_json(), or None (speculation off)
INJECT_AS_FOUND = None
ENGINE_SETTINGS = {}
LAUNCH = None  # what specfuzz's adapter applied to the engine: {"env", "inherited_env", "kwargs", ...}
MAX_MODEL_LEN = 64
TARGET_TABLE = [[0.0, 0.0], [0.0, 0.0]]  # [V, V], rounded to DTYPE
TARGET_LAYERS = 1
TARGET_HEAD_COLUMNS = False  # the draft table also in the target's lm_head columns [V, 2V) (EAGLE)
DRAFT_TABLE = None  # [R, R] draft checkpoint table, or [V, V_draft] for an EAGLE head
DRAFT_WIDTH = None
DRAFT_D2T = None
DRAFT_EOS_TOKEN_ID = None
HEAD = None  # {"kind": "eagle" | "eagle3", "layout": "vllm" | "sglang", "d2t": [...]} for an EAGLE head
TOKEN_TEXTS = "ab"
TOKENIZER = {}
DRAFT_TOKENIZER = None
EXPECTED = [[[0], 0.5], [[1], 0.5]]  # [[output, probability], ...] of mu
SUSPECTED_NAME = None
SUSPECTED = None
DEPTH = None
SEQUENCE = None
CRASH = False
CRASH_BATCH = 600  # requests per engine call when a crash repro runs its request (the campaign's batch)
CRASH_CAUSE = None  # a crash whose engine process died without naming why: the exception its log named when found (numbers as #)
RUN_BATCH = None  # requests per engine call of the failing run (None: the engine part's DEFAULT_BATCH)
BATCH_PATTERNS = None  # a crash in a mixed batch: the other request patterns [{"prompt", "params"}, ...] of that batch
DEFAULT_SAMPLES = 1000
ALPHA = 0.001
# ---- data ends ----

# ---- the engine's launch, as found or changed on the command line -----------------------
# Launch keyword arguments that turn speculation on, or that the engine refuses without it
# (vLLM: speculative_config, per_request_spec_decode_metrics; SGLang: speculative_*).
SPECULATION_KEYS = ("speculative_", "per_request_spec_decode_metrics")


def engine_arg(text):
    """One --engine-arg: KEY=VALUE -> (KEY, VALUE read as JSON, else the string)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE (e.g. max_num_seqs=1024)")
    try:
        return key, json.loads(raw)
    except ValueError:
        return key, raw


def add_launch_arguments(ap):
    """--engine-arg and --no-speculation, for engines started from LAUNCH["kwargs"]."""
    ap.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE", type=engine_arg,
                    help="start the engine with this launch keyword argument set (VALUE read as JSON, else as a "
                         "string; repeatable), e.g. --engine-arg max_num_seqs=1024; the run is then not the finding "
                         "as found, and the engine line says so")
    ap.add_argument("--no-speculation", action="store_true",
                    help="start the engine without its speculative settings (keys " + ", ".join(SPECULATION_KEYS)
                         + "): the same requests against the same law mu, speculation off")


def launch_kwargs(args):
    """LAUNCH["kwargs"] with the command line's changes (--no-speculation, then each --engine-arg)."""
    kw = dict(LAUNCH["kwargs"])
    if getattr(args, "no_speculation", False):
        kw = {k: v for k, v in kw.items() if not k.startswith(SPECULATION_KEYS)}
    for key, value in getattr(args, "engine_arg", None) or ():
        kw[key] = value
    return kw


def launch_changes(args):
    """What the command line changed in the launch, for the engine line ("" when run as found)."""
    parts = ["no speculation"] if getattr(args, "no_speculation", False) else []
    parts += [f"{k}={json.dumps(v)}" for k, v in getattr(args, "engine_arg", None) or ()]
    return "; CHANGED for this run: " + ", ".join(parts) if parts else ""


def launch_line(args, shown):
    """The engine line's account of the start: as found or with the command line's changes, the
    launch record's source, what of the launch is ``shown``, then the changes."""
    changes = launch_changes(args)
    return (f"{'started with changes' if changes else 'started as found'} "
            f"({LAUNCH.get('source', 'recorded')} launch): {shown}{changes}")


# ---- checkpoints (the construction of specfuzz.tablegen, inline) ---------------------
RMS_NORM_EPS = 2.0 ** -60  # vanishes against the final norm's mean square of exactly 1.0
MASKED_LOGIT = -32768.0  # a masked (-inf) logit; exact in every dtype, probability 0
HEAD_DIM = 64
ROPE_THETA = 10000.0
MAX_POSITION_EMBEDDINGS = 256


def hidden_size_for(v):
    """The smallest power of 4 >= max(V, 16): sqrt(H) is a power of two, so every step is exact."""
    h = 16
    while h < v:
        h *= 4
    return h


def save_safetensors(tensors, path, dtype):
    """model.safetensors; bfloat16 (which numpy lacks) is written by hand (exact: values fit).
    Integer tensors (an EAGLE-3 head's d2t) keep their int64 type."""
    if dtype != "bfloat16":
        from safetensors.numpy import save_file

        float_type = np.float16 if dtype == "float16" else np.float32
        save_file({k: v if v.dtype.kind == "i" else v.astype(float_type) for k, v in tensors.items()},
                  path, metadata={"format": "pt"})
        return
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        if tensors[name].dtype.kind == "i":
            raw = np.ascontiguousarray(tensors[name], dtype="<i8").tobytes()
            header[name] = {"dtype": "I64", "shape": list(tensors[name].shape), "data_offsets": [off, off + len(raw)]}
            blobs.append(raw)
            off += len(raw)
            continue
        a = np.ascontiguousarray(tensors[name], dtype=np.float32)
        bits = a.view(np.uint32)
        assert not (bits & 0xFFFF).any(), f"{name}: a value is not representable in bfloat16"
        raw = (bits >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def read_table(ckpt_dir):
    """The [V, V] float32 table held by a checkpoint's lm_head (table[prev, next])."""
    path = os.path.join(ckpt_dir, "model.safetensors")
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    info = json.loads(raw[8:8 + n])["lm_head.weight"]
    lo, hi = info["data_offsets"]
    buf = raw[8 + n + lo:8 + n + hi]
    if info["dtype"] == "BF16":
        a = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        a = np.frombuffer(buf, dtype={"F32": "<f4", "F16": "<f2"}[info["dtype"]]).astype(np.float32)
    lm_head = a.reshape(info["shape"])  # [V, H]
    v = lm_head.shape[0]
    return np.ascontiguousarray(lm_head[:, :v].T)  # [V, V]


def write_checkpoint(out_dir, table, eos_token_id, tokenizer, num_layers=1, head_table=None):
    """A Llama whose logits after token i are exactly table[i] (see the docstring). ``head_table``
    ([V, V]): an EAGLE head's draft table in the lm_head's spare columns [V, 2V), which the
    target's own hidden states never read."""
    os.makedirs(out_dir, exist_ok=True)
    table = np.asarray(table, dtype=np.float32)  # [V, V], already rounded to DTYPE
    v = table.shape[0]
    h = hidden_size_for(v if head_table is None else 2 * v)
    s = math.isqrt(h)
    inter = max(64, h)
    embed = np.zeros((v, h), dtype=np.float32)  # [V, H]
    embed[np.arange(v), np.arange(v)] = float(s)
    lm_head = np.zeros((v, h), dtype=np.float32)  # [V, H]: lm_head[next, prev] = table[prev, next]
    lm_head[:, :v] = table.T
    if head_table is not None:
        lm_head[:, v:2 * v] = np.asarray(head_table, dtype=np.float32).T
    w = {"model.embed_tokens.weight": embed, "model.norm.weight": np.full((h,), 1.0 / s, dtype=np.float32),
         "lm_head.weight": lm_head}
    for layer in range(num_layers):
        p = f"model.layers.{layer}."
        w[p + "input_layernorm.weight"] = np.ones(h, dtype=np.float32)
        w[p + "post_attention_layernorm.weight"] = np.ones(h, dtype=np.float32)
        for name in ("q_proj", "k_proj", "v_proj"):
            w[p + f"self_attn.{name}.weight"] = np.zeros((HEAD_DIM, h), dtype=np.float32)
        w[p + "self_attn.o_proj.weight"] = np.zeros((h, HEAD_DIM), dtype=np.float32)
        w[p + "mlp.gate_proj.weight"] = np.zeros((inter, h), dtype=np.float32)
        w[p + "mlp.up_proj.weight"] = np.zeros((inter, h), dtype=np.float32)
        w[p + "mlp.down_proj.weight"] = np.zeros((h, inter), dtype=np.float32)
    save_safetensors(w, os.path.join(out_dir, "model.safetensors"), DTYPE)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": v, "hidden_size": h,
        "intermediate_size": inter, "num_hidden_layers": num_layers, "num_attention_heads": 1, "num_key_value_heads": 1,
        "head_dim": HEAD_DIM, "hidden_act": "silu", "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rms_norm_eps": RMS_NORM_EPS, "rope_theta": ROPE_THETA,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA}, "attention_bias": False,
        "attention_dropout": 0.0, "mlp_bias": False, "tie_word_embeddings": False, "initializer_range": 0.02,
        "use_cache": True, "bos_token_id": None, "eos_token_id": eos_token_id, "pad_token_id": None,
        "torch_dtype": DTYPE, "dtype": DTYPE,
    }
    special = {} if eos_token_id is None else {"eos_token": TOKEN_TEXTS[eos_token_id]}
    files = {
        "config.json": config,
        "generation_config.json": {} if eos_token_id is None else {"eos_token_id": eos_token_id},
        "tokenizer.json": tokenizer,
        "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast",
                                  "model_max_length": MAX_POSITION_EMBEDDINGS, "clean_up_tokenization_spaces": False,
                                  "add_bos_token": False, "add_eos_token": False, **special},
        "special_tokens_map.json": special,
    }
    for name, obj in files.items():
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)
            f.write("\n")
    return out_dir


# ---- the test ------------------------------------------------------------------------
def law_of(rows):
    return {tuple(x): p for x, p in rows} if rows is not None else None


def project(x):
    return x if DEPTH is None else x[:DEPTH]


def forbidden(x, mu):
    """mu gives probability 0 to output x (a stray id, too long, or absent from mu)."""
    if any(not 0 <= t < VOCAB_SIZE for t in x) or len(x) > SAMPLING["max_tokens"]:
        return True
    return mu.get(project(x), 0.0) <= 0.0


def log_e_value(counts, mu, mud):
    """log E of the anytime-valid test (see the docstring); +inf for a forbidden output."""
    n = sum(counts.values())
    if n == 0:
        return 0.0
    if any(forbidden(x, mu) for x in counts):
        return math.inf
    proj = Counter()
    for x, c in counts.items():
        proj[project(x)] += c
    k = sum(1 for p in mu.values() if p > 0)
    a_total = 0.5 * k + 0.5  # 1/2 per allowed output, 1/2 for the lumped forbidden cell
    log_kt = math.lgamma(a_total) - math.lgamma(a_total + n)
    log_kt += sum(math.lgamma(c + 0.5) - math.lgamma(0.5) for c in proj.values())
    log_mu = sum(c * math.log(mu[y]) for y, c in proj.items())
    log_e = _log_mean(log_kt - log_mu, tree_log_e(proj, mu))
    if mud is not None:
        log_lr = 0.0
        for y, c in proj.items():
            q = mud.get(y, 0.0)
            log_lr = -math.inf if q <= 0.0 else log_lr + c * (math.log(q) - math.log(mu[y]))
            if log_lr == -math.inf:
                break
        if log_lr == -math.inf:
            log_e = log_e - math.log(2.0)
        else:
            m = max(log_e, log_lr)
            log_e = m + math.log(math.exp(log_e - m) + math.exp(log_lr - m)) - math.log(2.0)
    return log_e


def _log_mean(a, b):
    m = max(a, b)
    return m + math.log(math.exp(a - m) + math.exp(b - m)) - math.log(2.0)


def tree_log_e(proj, mu):
    """log E_tree (see the docstring) of the projected counts ``proj`` (every output allowed by mu)."""
    mass, end = Counter(), {}  # mu's mass through each prefix; of the outputs ending there
    for y, p in mu.items():
        if p <= 0.0:
            continue
        for t in range(len(y) + 1):
            mass[y[:t]] += p
        if DEPTH is None or len(y) < DEPTH:
            end[y] = p
    seen = {}  # prefix -> Counter of what came next (a token, or None: the output ended)
    for y, c in proj.items():
        last = len(y) if DEPTH is None or len(y) < DEPTH else len(y) - 1
        for t in range(last + 1):
            seen.setdefault(y[:t], Counter())[y[t] if t < len(y) else None] += c
    dense, sparse, w_seen = 0.0, [], 0.0
    for ctx, cnt in seen.items():
        allowed = {s: mass[ctx + (s,)] for s in range(VOCAB_SIZE) if mass.get(ctx + (s,), 0.0) > 0.0}
        if end.get(ctx, 0.0) > 0.0:
            allowed[None] = end[ctx]
        # KT over the next steps mu allows (an output mu forbids has already made E infinite): a
        # prefix with one allowed next step bets nothing.
        n = sum(cnt.values())
        a_total = 0.5 * len(allowed)
        log_kt = math.lgamma(a_total) - math.lgamma(a_total + n) + sum(math.lgamma(c + 0.5) - math.lgamma(0.5) for c in cnt.values())
        log_ctx = log_kt - sum(c * math.log(allowed[s] / mass[ctx]) for s, c in cnt.items())
        dense += log_ctx
        # prior weight of a prefix of length d: (1/2)^(d+1) / V^d (at most 1 over all prefixes)
        log_w = (len(ctx) + 1) * math.log(0.5) - len(ctx) * math.log(VOCAB_SIZE)
        sparse.append(log_w + log_ctx)
        w_seen += math.exp(log_w)
    sparse.append(math.log(max(1.0 - w_seen, 1e-300)))  # the prefixes never reached bet nothing
    m = max(sparse)
    log_sparse = m + math.log(sum(math.exp(v - m) for v in sparse))
    return _log_mean(dense, log_sparse)


def fmt_e(log_e):
    if log_e == math.inf:
        return "inf"
    if log_e / math.log(10) < 3:
        return f"{math.exp(log_e):.3g}"
    l10 = log_e / math.log(10)
    return f"{10 ** (l10 - math.floor(l10)):.2g}e{int(math.floor(l10))}"


def report(counts, mu, mud, log_e, top, alpha):
    n = sum(counts.values())
    proj = Counter()
    for x, c in counts.items():
        proj[project(x)] += c
    keys = set(proj) | {y for y, p in mu.items() if p > 0}
    rows = sorted(keys, key=lambda y: (-abs(proj.get(y, 0) / n - mu.get(y, 0.0)), y))[:top]
    what = "output" if DEPTH is None else f"first {DEPTH} tokens"
    head = f"{what:<24} {'count':>7} {'observed':>9} {'expected':>9}" + (f" {'mu_D ' + SUSPECTED_NAME:>9}" if mud else "")
    print(head)
    for y in rows:
        line = f"{str(y):<24} {proj.get(y, 0):>7} {proj.get(y, 0) / n:>9.4f} {mu.get(y, 0.0):>9.4f}"
        if mud:
            line += f" {mud.get(y, 0.0):>9.4f}"
        if mu.get(y, 0.0) == 0.0 and proj.get(y, 0):
            line += "   <- impossible under mu"
        print(line)
    bad = sum(c for x, c in counts.items() if forbidden(x, mu))
    if bad:
        example = max((x for x in counts if forbidden(x, mu)), key=lambda x: counts[x])
        print(f"outputs impossible under mu: {bad} of {n} samples, e.g. {example}")
    print(f"anytime-valid e-value after {n} samples: {fmt_e(log_e)} (FAIL threshold 1/alpha = {1 / alpha:g})")
