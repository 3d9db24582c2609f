"""repro.py: one standalone script per draft, rendered from templates that are real Python files.

The script is the shared part (``templates/repro_common.py``: docstring, imports, the data
block, the inline checkpoint writer and the anytime-valid test), the checkpoints of the
case (``repro_draft.py``, or ``repro_heads.py`` when the drafter is an EAGLE head), the
engine part (``repro_<engine>.py``: reference, vllm, sglang, hf, generic; each defines
``add_engine_arguments``, ``describe`` and ``start_engine(ckpt, args) -> generate``), and
``repro_main.py`` (command line, sampling loop, crash runner). Each template is copied from
its "repro.py begins" line on; the common part's ``{{...}}`` fields are filled and its data
block (between "data begins" and "data ends") is replaced by :func:`repro_data`, the
finding's data as Python literals. The templates import, lint and run as modules of their
own (tests do all three), and ship in the wheel as package data.
"""

from __future__ import annotations

import json
import pprint
from importlib import resources
from typing import Any, Mapping

import numpy as np

from specfuzz.fuzz.draft.data import DraftData

# Level of the repro script's test.
REPRO_ALPHA = 1e-3
# Samples the reference repro draws (it stops as soon as the evidence decides).
REFERENCE_REPRO_SAMPLES = 20_000
# Engine repros: this many times the samples the finding needed, within these bounds.
ENGINE_REPRO_FACTOR = 3
ENGINE_REPRO_SAMPLES = (1000, 5000)
# A finding whose evidence sits in a rarely reached context (a prefix met in few of the
# finding's samples: h200/sglang/finding-75b4's (0, 1), once in 1000) needs enough samples
# for the repro to reach that context this many times on average, up to RARE_REPRO_SAMPLES
# (3000 samples would miss finding-75b4's context 6% of the time).
RARE_CONTEXT_VISITS = 10
RARE_REPRO_SAMPLES = 20_000


def _py(obj: Any) -> str:
    return pprint.pformat(obj, width=110, compact=True, sort_dicts=False)


def _law_rows(law: Mapping[tuple[int, ...], float]) -> list:
    return [[list(x), float(p)] for x, p in sorted(law.items(), key=lambda kv: (-kv[1], len(kv[0]), kv[0])) if p > 0]


def _rounded(table: np.ndarray, dtype: str) -> list:
    from specfuzz.tablegen.rounding import round_table

    return round_table(table, dtype).astype(np.float64).tolist()


def _tokenizer(vocab_size: int, eos: int | None) -> dict:
    from specfuzz.tablegen.tokenizer import _tokenizer_json

    return json.loads(_tokenizer_json(vocab_size, sorted({i for i in (eos,) if i is not None})))


def _round_rect(table: np.ndarray, dtype: str) -> list:
    """round_table for a [V, V_draft] table (padded square, rounded, cut), as tablegen.eagle rounds it."""
    from specfuzz.tablegen.rounding import round_table

    r, c = table.shape
    sq = np.full((r, r), -np.inf)
    sq[:, :c] = table
    return round_table(sq, dtype)[:, :c].astype(np.float64).tolist()


def head_tables(case) -> tuple[str, np.ndarray, list | None] | None:
    """(kind, the head's draft table [V, V_draft], d2t) for an EAGLE case, as materialize writes it; else None."""
    from specfuzz.engines.checkpoints import head_kind

    hk = head_kind(case)
    if hk is None:
        return None
    V = int(case.target_table.shape[0])
    draft_t = np.asarray(case.draft_table, dtype=np.float64)[:V]  # rows beyond V are never read
    d2t = None if case.draft_d2t is None else [int(t) for t in case.draft_d2t]
    if hk == "eagle":
        # EAGLE drafts over the target's vocabulary: draft columns go to their target ids.
        full = np.full((V, V), -np.inf)
        full[:, d2t if d2t is not None else list(range(draft_t.shape[1]))] = draft_t
        draft_t, d2t = full, None
    return hk, draft_t, d2t


def repro_data(data: DraftData, samples: int) -> dict:
    """The data block of repro.py (all plain JSON values)."""
    from specfuzz.engines.checkpoints import square_draft_table
    from specfuzz.tablegen.eagle import EAGLE3_TARGET_LAYERS
    from specfuzz.tablegen.vocab import token_text

    case = data.case
    V = data.vocab_size
    spec = case.spec
    # EAGLE heads for engines that load them (specfuzz's reference sampler reads a plain draft table).
    head = head_tables(case) if data.engine_kind not in ("reference", "hf-transformers", "mlx") else None
    draft_sq = square_draft_table(case) if head is None else None
    uses_draft = spec is not None and spec.uses_draft_model and (draft_sq is not None or head is not None)
    draft_eos = (case.eos_token_id if case.eos_token_id is not None and draft_sq is not None
                 and case.eos_token_id < draft_sq.shape[0] else None)
    R = None if draft_sq is None or not uses_draft else int(draft_sq.shape[0])
    if head is not None:
        draft_table = _round_rect(head[1], data.dtype)
    else:
        draft_table = _rounded(draft_sq, data.dtype) if uses_draft else None
    d: dict[str, Any] = {
        "ENGINE": data.engine_kind,
        "ENGINE_VERSION": str(data.engine.get("version", "")),
        "DTYPE": data.dtype,
        "VOCAB_SIZE": V,
        "PROMPT": list(case.prompt),
        "EOS_TOKEN_ID": case.eos_token_id,
        "SAMPLING": case.params.to_json(),
        "SPECULATION": None if spec is None else {**spec.to_json(), "inject": None},
        "INJECT_AS_FOUND": data.inject,
        "ENGINE_SETTINGS": data.settings,
        "LAUNCH": data.launch,
        "MAX_MODEL_LEN": max(64, len(case.prompt) + case.params.max_tokens + 16),
        "TARGET_TABLE": _rounded(case.target_table, data.dtype),
        "TARGET_LAYERS": EAGLE3_TARGET_LAYERS if head is not None and head[0] == "eagle3" else 1,
        "TARGET_HEAD_COLUMNS": head is not None and head[0] == "eagle",
        "DRAFT_TABLE": draft_table,
        "DRAFT_WIDTH": None if case.draft_table is None else int(case.draft_table.shape[1]),
        "DRAFT_D2T": None if case.draft_d2t is None else list(case.draft_d2t),
        "DRAFT_EOS_TOKEN_ID": draft_eos if uses_draft else None,
        "HEAD": None if head is None else {"kind": head[0], "layout": "sglang" if data.engine_kind == "sglang" else "vllm",
                                           "d2t": head[2]},
        "TOKEN_TEXTS": "".join(token_text(i) for i in range(max(V, R or 0))),
        "TOKENIZER": _tokenizer(V, case.eos_token_id),
        "DRAFT_TOKENIZER": _tokenizer(R, draft_eos) if uses_draft and R is not None else None,
        "EXPECTED": _law_rows(data.expected),
        "SUSPECTED_NAME": data.label if data.suspected is not None else None,
        "SUSPECTED": None if data.suspected is None else _law_rows(data.suspected),
        "DEPTH": data.depth,
        "SEQUENCE": [s.get("request", s) for s in data.entry.extra.get("sequence", [])] if data.is_crash else None,
        "CRASH": data.is_crash,
        "CRASH_BATCH": crash_batch(data),
        "CRASH_CAUSE": (str(data.entry.extra.get("crash_cause") or "") or None) if data.is_crash else None,
        "RUN_BATCH": run_batch(data),
        "BATCH_PATTERNS": (data.entry.extra.get("batch_patterns") or None) if data.is_crash else None,
        "DEFAULT_SAMPLES": samples,
        "ALPHA": REPRO_ALPHA,
    }
    return d


def crash_batch(data: DraftData) -> int:
    """Requests per engine call in a crash repro: the entry's recorded batch, else the campaign's
    default ``--batch`` (a crash found or shrunk by specfuzz ran in batches that large or smaller)."""
    from specfuzz.fuzz.run import entry_crash_batch

    return entry_crash_batch(data.entry)


def run_batch(data: DraftData) -> int | None:
    """Requests per engine call in a finding's repro: those of the run that failed (the entry's
    recorded ``batch_size``); None: the engine template's DEFAULT_BATCH (older entries)."""
    from specfuzz.fuzz.run import entry_run_batch

    return None if data.is_crash else entry_run_batch(data.entry)


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


# The template of each engine's part, and what the script needs besides numpy and safetensors.
ENGINE_TEMPLATES: dict[str, str] = {
    "reference": "repro_reference.py", "vllm": "repro_vllm.py", "sglang": "repro_sglang.py",
    "hf-transformers": "repro_hf.py", "mlx": "repro_mlx.py", "generic": "repro_generic.py", "llamacpp": "repro_llamacpp.py",
}
NEEDS: dict[str, str] = {
    "reference": "numpy, safetensors and specfuzz (its reference sampler is the engine)",
    "vllm": "numpy, safetensors and vLLM", "sglang": "numpy, safetensors and SGLang",
    "hf-transformers": "numpy, safetensors, torch and transformers",
    "mlx": "numpy, safetensors and mlx-lm (with mlx; on Linux its CPU build, mlx[cpu])",
    "generic": "numpy, safetensors, specfuzz and the engine",
    "llamacpp": "numpy, safetensors, gguf and a llama-server binary (llama.cpp)",
}
TEMPLATES_PACKAGE = "specfuzz.fuzz.draft.templates"
BEGIN = "# ---- repro.py begins ----\n"
DATA_BEGIN = "# ---- data begins ----\n"
DATA_END = "# ---- data ends ----\n"


def template_text(name: str) -> str:
    """A template file's text from its "repro.py begins" line on (the file ships in the package)."""
    text = resources.files(TEMPLATES_PACKAGE).joinpath(name).read_text(encoding="utf-8")
    if BEGIN not in text:
        raise ValueError(f"template {name}: no {BEGIN.strip()!r} line")
    return text.split(BEGIN, 1)[1]


def fill_data(common: str, block: str) -> str:
    """The common template with its placeholder data block replaced by ``block``."""
    head, rest = common.split(DATA_BEGIN, 1)
    _, tail = rest.split(DATA_END, 1)
    return head + block + "\n" + tail


def template_names(engine_kind: str, has_head: bool) -> list[str]:
    """The templates a script is made of, in order."""
    return ["repro_common.py", "repro_heads.py" if has_head else "repro_draft.py", ENGINE_TEMPLATES[engine_kind],
            "repro_main.py"]


def render_repro(data: DraftData, samples: int, title: str) -> str:
    import specfuzz

    d = repro_data(data, samples)
    block = "\n".join(f"{k} = {_py(v)}" for k, v in d.items())
    names = template_names(data.engine_kind, d["HEAD"] is not None)
    common = (template_text(names[0])
              .replace("{{TITLE}}", data.scrub.text(title).replace(chr(92), "/").replace('"""', "'''"))
              .replace("{{VERSION}}", specfuzz.__version__).replace("{{ENTRY}}", data.stem)
              .replace("{{NEEDS}}", NEEDS[data.engine_kind]).replace("{{ALPHA}}", f"{REPRO_ALPHA:g}"))
    parts = [fill_data(common, block)] + [template_text(n) for n in names[1:]]
    return "\n\n\n".join(p.strip("\n") for p in parts) + "\n"  # two blank lines between the parts
