# Template: the start of every repro.py that `specfuzz draft` writes (specfuzz.fuzz.draft.repro
# renders the parts in order: this one, the engine's, repro_main). Below the "repro.py begins" line:
# the {{...}} fields are filled in, the data block is replaced by the finding's data (same names),
# and a "# [if NAME]" ... "# [end NAME]" section is kept only where the finding needs it. As it
# stands this file is a module that imports and lints; its data are placeholders (a 2-token table).
# ---- repro.py begins ----
#!/usr/bin/env python3
"""{{TITLE}}

Drafted by specfuzz {{VERSION}} from its finding {{ENTRY}}; needs {{NEEDS}}.
It writes a Llama whose next-token logits after token i are exactly row i of TARGET_TABLE, runs
the engine as the finding ran it and {{WHAT}}
"""
import argparse
# [if needs_json]
import json
# [end needs_json]
import math
# [if needs_os]
import os
# [end needs_os]
import sys
import tempfile
# [if not crash]
from collections import Counter
# [end crash]

# [if checkpoints]
import torch
from safetensors.torch import save_file
# [end checkpoints]

# ---- data begins ----
ENGINE_VERSION = "0.0.0"  # the engine release the finding was made on
DTYPE = "float32"
TARGET_TABLE = [[0.0, 0.0], [0.0, 0.0]]  # [V, V] logits, rounded to DTYPE; -32768 = masked
DRAFT_TABLE = None  # [R, R] the draft model's table, or None
HEAD = None  # an EAGLE head as specfuzz.tablegen writes it: sparse tensors [shape, fill, [[*index, value]]]
TARGET_FILES = {}  # config.json, tokenizer files, ... of the target checkpoint
DRAFT_FILES = None
PROMPT = [0]
EOS_TOKEN_ID = None
MAX_TOKENS = 1
SAMPLING = {"temperature": 1.0, "max_tokens": 1}  # the engine's own sampling arguments
LAUNCH = {}  # the engine's start arguments ("{target}", "{draft}": the checkpoint folders)
LAUNCH_ENV = {}  # environment variables set for the engine
INHERITED_ENV = {}  # environment variables the finding's process had (kept where set here)
BATCH = 200  # requests per engine call, as in the failing run
SAMPLES = 1000  # samples at most (the test stops once the evidence is decisive)
ALPHA = 0.001
EXPECTED = [[[0], 0.5], [[1], 0.5]]  # [[output, probability], ...]: mu
DEPTH = None  # EXPECTED is the law of the first DEPTH tokens (None: of whole outputs)
FOCUS = None  # {"context": prefix, "law": [[next token or None (end), probability], ...]}: mu after it
CALLS = None  # a crash: the engine calls that crashed it [{"requests": [[prompt, sampling], ...], "batch": n}]
CRASH_CAUSE = None  # a crash: the exception the engine's log named when found (numbers as #)
# ---- data ends ----


# [if checkpoints]
def llama_tensors(table, config, head_columns=None):
    """A Llama whose logits after token i are exactly table[i]: embedding s*e_i (s = sqrt(H), a
    power of two), attention and MLP outputs zero, final norm 1/s (the hidden state is exactly
    e_i), lm_head = table^T (an EAGLE head's table in columns [V, 2V) where it shares lm_head)."""
    v, h, d, m = len(table), config["hidden_size"], config["head_dim"], config["intermediate_size"]
    s = math.isqrt(h)
    rows = table + (head_columns or [])
    t = {"model.embed_tokens.weight": [[v, h], 0.0, [[i, i, s] for i in range(v)]], "model.norm.weight": [[h], 1 / s, []],
         "lm_head.weight": [[v, h], 0.0, [[j, i, x] for i, row in enumerate(rows) for j, x in enumerate(row)]]}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        t |= {p + n: [[h], 1.0, []] for n in ("input_layernorm.weight", "post_attention_layernorm.weight")}
        t |= {p + f"self_attn.{n}_proj.weight": [[h, d] if n == "o" else [d, h], 0.0, []] for n in "qkvo"}
        t |= {p + f"mlp.{n}_proj.weight": [[h, m] if n == "down" else [m, h], 0.0, []] for n in ("gate", "up", "down")}
    return t


def write_checkpoint(folder, files, tensors):
    """config.json and tokenizer files, and model.safetensors from [shape, fill, [[*index, value]]] specs."""
    os.makedirs(folder)
    for name, obj in files.items():
        with open(os.path.join(folder, name), "w") as f:
            json.dump(obj, f, indent=1)
    weights = {}
    for name, (shape, fill, entries) in tensors.items():
        w = torch.full(shape, fill, dtype=torch.int64 if name == "d2t" else torch.float32)
        for *index, value in entries:
            w[tuple(index)] = value
        weights[name] = w if name == "d2t" else w.to(getattr(torch, DTYPE))  # exact: values fit DTYPE
    save_file(weights, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    return folder


def write_checkpoints(root):
    """{"{target}": folder, "{draft}": folder}: the names LAUNCH gives the checkpoint folders."""
    # [if not head]
    dirs = {"{target}": write_checkpoint(f"{root}/target", TARGET_FILES, llama_tensors(TARGET_TABLE, TARGET_FILES["config.json"]))}
    # [end head]
    # [if draft_table]
    dirs["{draft}"] = write_checkpoint(f"{root}/draft", DRAFT_FILES, llama_tensors(DRAFT_TABLE, DRAFT_FILES["config.json"]))
    # [end draft_table]
    # [if head]
    target = llama_tensors(TARGET_TABLE, TARGET_FILES["config.json"], HEAD["target_columns"])
    return {"{target}": write_checkpoint(f"{root}/target", TARGET_FILES, target),
            "{draft}": write_checkpoint(f"{root}/head", HEAD["files"], HEAD["tensors"])}
    # [end head]
    # [if not head]
    return dirs
    # [end head]


def with_checkpoints(value, dirs):
    """LAUNCH's values with "{target}" and "{draft}" replaced by the checkpoint folders."""
    if isinstance(value, dict):
        return {k: with_checkpoints(v, dirs) for k, v in value.items()}
    return dirs.get(value, value) if isinstance(value, str) else value
# [end checkpoints]


# [if launch]
def launch(args):
    """Set the engine's environment; (LAUNCH as found or as --no-speculation / --engine-arg change it, "started ...")."""
    os.environ.update({**{k: v for k, v in INHERITED_ENV.items() if k not in os.environ}, **LAUNCH_ENV})
    kw = {k: v for k, v in LAUNCH.items() if not (args.no_speculation and k.startswith(("speculative_", "per_request_spec")))}
    kw.update(args.engine_arg)
    changes = (["no speculation"] if args.no_speculation else []) + [f"{k}={json.dumps(v)}" for k, v in args.engine_arg]
    return kw, "started " + (f"with changes: {', '.join(changes)}" if changes else "as found")


def engine_arg(text):
    """--engine-arg KEY=VALUE: VALUE read as JSON, else as a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE (e.g. max_num_seqs=1024)")
    try:
        return key.strip(), json.loads(raw)
    except ValueError:
        return key.strip(), raw
# [end launch]
