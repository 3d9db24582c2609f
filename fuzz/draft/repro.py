"""repro.py: one standalone script per draft, rendered from templates that are real Python files.

A script is the common part (``templates/repro_common.py``: docstring, imports, the data block,
the checkpoint writer, the engine's launch), the engine part (``repro_<engine>.py``: reference,
vllm, sglang, hf, generic; each defines ``start_engine(dirs, args) -> generate``) and the end
(``repro_main.py``: the test, the sampling loop, the crash runner). Each template is copied from
its "repro.py begins" line on; ``{{...}}`` fields are filled in, the data block is replaced by
:func:`repro_data` (the finding's data as Python literals) and a ``# [if NAME]`` ... ``# [end NAME]``
section is kept only when the finding needs NAME (:func:`features`): what one engine or one kind of
finding needs stays out of the other scripts. The data are what the campaign ran: the checkpoints'
files as :func:`specfuzz.engines.checkpoints.materialize` writes them (an EAGLE head as sparse
tensors), the engine's start as its adapter recorded it, and the request in the engine's own
sampling arguments, as the adapter maps it (:mod:`specfuzz.fuzz.draft.native`).
"""

from __future__ import annotations

import json
import pprint
import re
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from specfuzz.fuzz.draft.data import DraftData, conditional_at
from specfuzz.fuzz.draft.native import sampling_for

# Level of the repro script's test.
REPRO_ALPHA = 1e-3
# Samples the reference repro draws (it stops as soon as the evidence decides).
REFERENCE_REPRO_SAMPLES = 20_000
# Engine repros: this many times the samples the finding needed, within these bounds.
ENGINE_REPRO_FACTOR = 3
ENGINE_REPRO_SAMPLES = (1000, 5000)
# A finding whose evidence sits in a rarely reached context (a prefix met in few of the finding's
# samples: h200/sglang/finding-75b4's (0, 1), once in 1000) needs enough samples for the repro to
# reach that context this many times on average, up to RARE_REPRO_SAMPLES.
RARE_CONTEXT_VISITS = 10
RARE_REPRO_SAMPLES = 20_000
# SGLang's crash diagnostics, off as the adapter runs SGLang unless the user's environment sets them:
# py-spy dumps and a wait of up to 60 s for CUDA core dumps held a failing crash repro for minutes.
SGLANG_DIAGNOSTICS_OFF = {"SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0", "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0"}
# Requests per engine call of entries that do not record their failing run's batch.
DEFAULT_BATCH = {"reference": 250, "vllm": 200, "sglang": 200, "hf-transformers": 100, "generic": 200, "llamacpp": 200, "mlx": 100}
# The template of each engine's part, and what the script needs.
ENGINE_TEMPLATES: dict[str, str] = {
    "reference": "repro_reference.py", "vllm": "repro_vllm.py", "sglang": "repro_sglang.py",
    "hf-transformers": "repro_hf.py", "generic": "repro_generic.py", "llamacpp": "repro_llamacpp.py", "mlx": "repro_mlx.py",
}
NEEDS: dict[str, str] = {
    "reference": "numpy and specfuzz (its reference sampler is the engine)",
    "vllm": "vLLM (with its torch and safetensors)", "sglang": "SGLang (with its torch and safetensors)",
    "hf-transformers": "torch, safetensors and transformers", "generic": "torch, safetensors, specfuzz and the engine",
    "llamacpp": "numpy, gguf and a llama-server binary (llama.cpp)",
    "mlx": "mlx-lm (with mlx; on Linux mlx[cpu]) and torch and safetensors to write the checkpoints",
}
# The end of the docstring: what the script checks (a distribution finding, a crash).
WHAT = {False: "tests the outputs against EXPECTED, the exact law mu\nof the request: FAIL (the outputs do not follow mu) or PASS.",
        True: "makes the engine calls that crashed it: FAIL (the engine\nraised, or its process died) or PASS."}
TEMPLATES_PACKAGE = "specfuzz.fuzz.draft.templates"
BEGIN = "# ---- repro.py begins ----\n"
DATA_BEGIN = "# ---- data begins ----\n"
DATA_END = "# ---- data ends ----\n"
SECTION = re.compile(r"^[ \t]*# \[(if|end) (not )?([a-z_]+)\][ \t]*\n", re.M)
# Line budgets of a repro.py outside its data block (non-blank lines), checked by the tests for
# every stored draft: a distribution finding fits one screen; a crash repro also runs the engine in
# a child process and replays the crashing calls.
CODE_LINES_BUDGET = {"distribution": 150, "crash": 250}
# What each name of the data block holds (its comment in the script).
DATA_NOTES = {
    "ENGINE_VERSION": "the engine release the finding was made on",
    "DTYPE": "the model dtype",
    "TARGET_TABLE": "[V, V] logits after token i = row i (rounded to DTYPE; -32768 = masked)",
    "DRAFT_TABLE": "the draft model's [R, R] table",
    "HEAD": "the EAGLE head specfuzz wrote: tensors as [shape, fill, [[*index, value], ...]], its JSON files",
    "TARGET_FILES": "the target checkpoint's JSON files",
    "DRAFT_FILES": "the draft checkpoint's JSON files",
    "PROMPT": "prompt token ids",
    "EOS_TOKEN_ID": "the checkpoints' EOS",
    "MAX_TOKENS": "the request's max_tokens",
    "SAMPLING": "the engine's sampling arguments for the request, as specfuzz's adapter set them",
    "BAD_WORDS": "bad words as token-id sequences",
    "STRUCTURED": "StructuredOutputsParams arguments",
    "ASSISTANT": "the assistant model's generation config and universal assisted generation settings",
    "THREADS": "torch threads, as the adapter ran",
    "ATTENTION": "attn_implementation, as the adapter ran",
    "LAUNCH": "the engine's start arguments as specfuzz's adapter passed them",
    "LAUNCH_ENV": "environment variables the adapter set",
    "INHERITED_ENV": "environment variables the finding's process had (set unless set here)",
    "INHERITED_ENV sglang": "the finding's environment, SGLang's crash diagnostics off (set unless set here)",
    "SPECULATION": "specfuzz's SpecConfig",
    "INJECT_AS_FOUND": "the catalogued bug injected when found",
    "DRAFT_D2T": "draft-to-target id map",
    "ENGINE_SETTINGS": "the adapter's settings",
    "MAX_MODEL_LEN": "the engine's context length",
    "BATCH": "requests per engine call, as in the failing run",
    "SAMPLES": "samples at most (the test stops once the evidence is decisive)",
    "ALPHA": "the test's level",
    "EXPECTED": "the exact law mu: [[output, probability], ...]",
    "DEPTH": "EXPECTED is the law of the first DEPTH tokens (None: of whole outputs)",
    "FOCUS": "mu's next step after the prefix where the finding deviated most (None: end)",
    "CALLS": "the engine calls that crashed it: request patterns [prompt, sampling], sent in turn",
    "CRASH_CAUSE": "the exception the engine's log named when found (numbers as #)",
    "TARGET_GGUF": "the target's GGUF as specfuzz.tablegen wrote it: key-value pairs, tensors as [shape, fill, entries]",
    "DRAFT_GGUF": "the draft model's GGUF, likewise",
    "SERVER_ARGS": "llama-server's options as specfuzz's adapter passed them",
    "SLOTS": "llama-server -np: requests served at once",
    "DRAFT_TOKENS": "num_draft_tokens (None: mlx-lm's default)",
    "PREFILL_STEP_SIZE": "stream_generate's prefill_step_size (None: mlx-lm's default)",
    "ENGINE_SEED": "the adapter's seed of mlx's global random state at start",
}


def _py(obj: Any) -> str:
    return pprint.pformat(obj, width=110, compact=True, sort_dicts=False)


def _law_rows(law) -> list:
    return [[list(x), float(p)] for x, p in sorted(law.items(), key=lambda kv: (-kv[1], len(kv[0]), kv[0])) if p > 0]


def features(data: DraftData, d: dict) -> set[str]:
    """The template sections a finding's script keeps."""
    k = data.engine_kind
    f = {"crash"} if data.is_crash else set()
    if k in ("vllm", "sglang", "hf-transformers", "generic", "mlx"):
        f.add("checkpoints")
    if k in ("vllm", "sglang"):
        f.add("launch")
    if k in ("reference", "generic", "llamacpp", "mlx"):
        f.add("own_arguments")
    if "checkpoints" in f or "crash" in f or k == "llamacpp":
        f.add("needs_os")
    if "checkpoints" in f or "launch" in f or k == "llamacpp":
        f.add("needs_json")
    if k == "sglang":
        f.add("hard_exit")
    f |= {name for name, key in (("draft_table", "DRAFT_TABLE"), ("head", "HEAD")) if d.get(key) is not None}
    f |= {name for name in ("bad_words", "structured") if d.get(name.upper()) is not None}
    if d.get("ASSISTANT") is not None:
        f.add("assistant")
        if d["ASSISTANT"]["universal"]:
            f.add("universal")
    return f


def keep_sections(text: str, keep: set[str]) -> str:
    """``text`` without the sections whose condition fails, and without the marker lines."""
    out, pos, stack = [], 0, []
    for m in SECTION.finditer(text):
        if all(stack):
            out.append(text[pos:m.start()])
        pos = m.end()
        kind, neg, name = m.group(1), bool(m.group(2)), m.group(3)
        if kind == "if":
            stack.append((name in keep) != neg)
        else:
            stack.pop()
    if all(stack):
        out.append(text[pos:])
    return "".join(out)


def _json_files(folder: Path) -> dict:
    from specfuzz.tablegen.checkpoint import META_FILE

    return {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("*.json")) if p.name != META_FILE}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file as float64 (int64 kept), bfloat16 included."""
    raw = Path(path).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    out = {}
    for name, info in json.loads(raw[8:8 + n]).items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        buf = raw[8 + n + lo:8 + n + hi]
        if info["dtype"] == "BF16":
            a = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(buf, dtype={"F32": "<f4", "F16": "<f2", "I64": "<i8"}[info["dtype"]])
        out[name] = a.reshape(info["shape"]).astype(np.int64 if info["dtype"] == "I64" else np.float64)
    return out


def sparse(t: np.ndarray) -> list:
    """[shape, fill, [[*index, value], ...]]: the tensor as its most common value and the rest."""
    vals, counts = np.unique(t, return_counts=True)
    fill = vals[np.argmax(counts)].item()
    idx = np.argwhere(t != fill)
    return [list(t.shape), fill, [[*map(int, i), t[tuple(i)].item()] for i in idx]]


def checkpoint_data(data: DraftData) -> dict:
    """TARGET_TABLE, DRAFT_TABLE, HEAD and the JSON files: the checkpoints the campaign wrote for the case."""
    from specfuzz.engines.checkpoints import head_kind, materialize

    case = data.case
    V = data.vocab_size
    with tempfile.TemporaryDirectory() as tmp:
        ck = materialize(case, Path(tmp), data.dtype)
        lm = read_safetensors(ck.target_dir / "model.safetensors")["lm_head.weight"]  # [V, H]
        d: dict[str, Any] = {"TARGET_TABLE": lm[:, :V].T.tolist(), "DRAFT_TABLE": None, "HEAD": None,
                             "TARGET_FILES": _json_files(ck.target_dir), "DRAFT_FILES": None}
        if ck.draft_dir is None:
            return d
        draft_w = read_safetensors(ck.draft_dir / "model.safetensors")
        if head_kind(case) is None:
            r = draft_w["lm_head.weight"].shape[0]
            d.update(DRAFT_TABLE=draft_w["lm_head.weight"][:, :r].T.tolist(), DRAFT_FILES=_json_files(ck.draft_dir))
            return d
        head = ck.draft_dir
        if data.engine_kind == "sglang":
            from specfuzz.tablegen.eagle import sglang_head

            head = sglang_head(ck.draft_dir, Path(tmp) / "sglang-head")
        cols = lm[:, V:2 * V].T.tolist() if lm.shape[1] >= 2 * V and np.any(lm[:, V:2 * V]) else None
        d["HEAD"] = {"tensors": {k: sparse(v) for k, v in read_safetensors(head / "model.safetensors").items()},
                     "files": _json_files(head), "target_columns": cols}
        return d


def gguf_spec(path: Path) -> dict:
    """A GGUF file as data: its key-value pairs ([type, value, element type]) and sparse tensors."""
    import gguf

    r = gguf.GGUFReader(str(path))
    kv = {}
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        types = [t.name for t in f.types]
        kv[key] = [types[0], f.contents(), types[1] if len(types) > 1 else None]
    arch = r.fields["general.architecture"].contents()
    return {"arch": arch, "kv": kv, "tensors": {t.name: sparse(np.asarray(t.data, dtype=np.float64)) for t in r.tensors}}


def gguf_data(data: DraftData) -> dict:
    """TARGET_GGUF and DRAFT_GGUF: the GGUF files the llamacpp adapter loads for the case (tablegen's)."""
    from specfuzz.engines.checkpoints import materialize
    from specfuzz.tablegen.gguf_model import gguf_from_checkpoint

    case = data.case
    with tempfile.TemporaryDirectory() as tmp:
        ck = materialize(case, Path(tmp), "float32")
        d = {"TARGET_TABLE": read_safetensors(ck.target_dir / "model.safetensors")["lm_head.weight"][:, :data.vocab_size].T.tolist(),
             "TARGET_GGUF": gguf_spec(gguf_from_checkpoint(ck.target_dir, Path(tmp) / "target.gguf")), "DRAFT_GGUF": None}
        if ck.draft_dir is not None and case.spec is not None and case.spec.method == "draft_model":
            d["DRAFT_GGUF"] = gguf_spec(gguf_from_checkpoint(ck.draft_dir, Path(tmp) / "draft.gguf"))
        return d


def focus(data: DraftData) -> dict | None:
    """The prefix where the finding's samples deviated most from mu, with mu's next-step law there."""
    wt = data.effect.worst_token or {}
    ctx = wt.get("context")
    if ctx is None or (data.depth is not None and len(ctx) >= data.depth):
        return None
    cells = conditional_at(data.expected, tuple(ctx), data.vocab_size)  # [V + 2]: tokens, <oov>, <end>
    law = [[t, float(cells[t])] for t in range(data.vocab_size) if cells[t] > 0]
    law += [[None, float(cells[-1])]] if cells[-1] > 0 else []
    return {"context": [int(t) for t in ctx], "law": law} if len(law) >= 2 else None


def crash_calls(data: DraftData) -> list[dict]:
    """A crash's engine calls: the recorded sequence (one request each), or one call of the crashing
    batch's size, cycling through its request patterns (this request first)."""
    from specfuzz.fuzz.run import entry_crash_batch
    from specfuzz.oracle.params import SamplingParams

    case = data.case
    seq = data.entry.extra.get("sequence") or []
    if seq:
        return [{"requests": [[list(case.prompt), sampling_for(data, SamplingParams.from_json(s.get("request", s)))[0]]],
                 "batch": 1} for s in seq]
    pats = [(list(case.prompt), case.params)]
    for p in data.entry.extra.get("batch_patterns") or []:
        pat = (list(p["prompt"]), SamplingParams.from_json(p["params"]))
        if pat not in pats:
            pats.append(pat)
    return [{"requests": [[pr, sampling_for(data, sp, prompt=pr)[0]] for pr, sp in pats], "batch": entry_crash_batch(data.entry)}]


def repro_data(data: DraftData, samples: int) -> dict:
    """The data block of repro.py (plain Python values), in the order the script lists them."""
    from specfuzz.fuzz.run import entry_run_batch

    case, k = data.case, data.engine_kind
    sampling, extra = sampling_for(data, case.params)
    d: dict[str, Any] = {"ENGINE_VERSION": str(data.engine.get("version", "")), "DTYPE": data.dtype}
    if k == "llamacpp":
        d.update(gguf_data(data))
    elif k == "reference":
        from specfuzz.engines.checkpoints import square_draft_table
        from specfuzz.tablegen.rounding import round_table

        sq = square_draft_table(case)
        d["TARGET_TABLE"] = round_table(case.target_table, data.dtype).astype(np.float64).tolist()
        d["DRAFT_TABLE"] = None if sq is None else round_table(sq, data.dtype)[:, :case.draft_table.shape[1]].astype(np.float64).tolist()
    else:
        d.update(checkpoint_data(data))
    d.update(PROMPT=list(case.prompt), EOS_TOKEN_ID=case.eos_token_id, MAX_TOKENS=case.params.max_tokens,
             SAMPLING=sampling, **extra)
    if k != "reference":
        d = {n: v for n, v in d.items() if v is not None or n not in ("DRAFT_TABLE", "DRAFT_FILES", "HEAD", "DRAFT_GGUF")}
    if data.launch:
        inherited = dict(data.launch.get("inherited_env") or {})
        if k == "sglang":  # as the adapter runs SGLang: its crash diagnostics (py-spy dumps, a 60 s wait for core dumps) off
            inherited = {**SGLANG_DIAGNOSTICS_OFF, **inherited}
        d.update(LAUNCH=data.launch["kwargs"], LAUNCH_ENV=data.launch["env"], INHERITED_ENV=inherited)
    if data.is_crash:
        d.update(CALLS=crash_calls(data), CRASH_CAUSE=(str(data.entry.extra.get("crash_cause") or "") or None))
    else:
        d.update(BATCH=entry_run_batch(data.entry) or DEFAULT_BATCH[k], SAMPLES=samples, ALPHA=REPRO_ALPHA,
                 EXPECTED=_law_rows(data.expected), DEPTH=data.depth, FOCUS=focus(data))
    return data.scrub.value(d)


def default_samples(data: DraftData) -> int:
    if data.engine_kind == "reference":
        return REFERENCE_REPRO_SAMPLES
    lo, hi = ENGINE_REPRO_SAMPLES
    n = int(min(hi, max(lo, ENGINE_REPRO_FACTOR * data.n)))
    worst = (data.entry.verdict or {}).get("worst_token") or {}
    seen, total = worst.get("context_count"), (data.entry.verdict or {}).get("n") or data.n
    if isinstance(seen, int) and 0 < seen < total:
        need = -(-RARE_CONTEXT_VISITS * int(total) // seen)  # ceil
        n = max(n, min(RARE_REPRO_SAMPLES, need))
    return n


def template_text(name: str) -> str:
    """A template file's text from its "repro.py begins" line on (the file ships in the package)."""
    text = resources.files(TEMPLATES_PACKAGE).joinpath(name).read_text(encoding="utf-8")
    if BEGIN not in text:
        raise ValueError(f"template {name}: no {BEGIN.strip()!r} line")
    return text.split(BEGIN, 1)[1]


def data_block(d: dict, engine_kind: str = "") -> str:
    lines = []
    for name, value in d.items():
        text, note = f"{name} = {_py(value)}", DATA_NOTES.get(f"{name} {engine_kind}", DATA_NOTES.get(name, ""))
        if note and "\n" not in text and len(text) + len(note) < 110:
            lines.append(f"{text}  # {note}")
        else:
            lines += ([f"# {name}: {note}"] if note else []) + [text]
    return "\n".join(lines) + "\n"


def fill_data(common: str, block: str) -> str:
    """The common template with its placeholder data block replaced by ``block``."""
    head, rest = common.split(DATA_BEGIN, 1)
    _, tail = rest.split(DATA_END, 1)
    return head + DATA_BEGIN + block + DATA_END + tail


def template_names(engine_kind: str) -> list[str]:
    """The templates a script is made of, in order."""
    return ["repro_common.py", ENGINE_TEMPLATES[engine_kind], "repro_main.py"]


def render_repro(data: DraftData, samples: int, title: str) -> str:
    import specfuzz

    d = repro_data(data, samples)
    keep = features(data, d)
    names = template_names(data.engine_kind)
    common = (template_text(names[0])
              .replace("{{TITLE}}", data.scrub.text(title).replace(chr(92), "/").replace('"""', "'''"))
              .replace("{{VERSION}}", specfuzz.__version__).replace("{{ENTRY}}", data.stem)
              .replace("{{NEEDS}}", NEEDS[data.engine_kind]).replace("{{WHAT}}", WHAT[data.is_crash]))
    parts = [fill_data(common, data_block(d, data.engine_kind))] + [template_text(n) for n in names[1:]]
    text = "\n\n".join(keep_sections(p, keep).strip("\n") for p in parts) + "\n"
    return re.sub(r"\n{4,}", "\n\n\n", text)


def code_lines(repro: str) -> int:
    """Non-blank lines of a repro.py outside its data block (what the line budgets count)."""
    head, _, rest = repro.partition(DATA_BEGIN)
    _, _, tail = rest.partition(DATA_END)
    return sum(1 for ln in (head + tail).splitlines() if ln.strip())
