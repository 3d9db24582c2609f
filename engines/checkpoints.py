"""Checkpoints for a case, written once per distinct table and reused by engines.

Folders are named by a hash of what is written, so cases sharing a target (and draft)
table share checkpoint folders, and an engine started on them can be reused.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specfuzz.case import Case


@dataclass(frozen=True)
class CaseCheckpoints:
    target_dir: Path
    draft_dir: Path | None


def _digest(table: np.ndarray, **meta) -> str:
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(table, dtype=np.float32).tobytes())
    h.update(repr(table.shape).encode())
    h.update(json.dumps(meta, sort_keys=True).encode())
    return h.hexdigest()[:16]


def square_draft_table(case: Case) -> np.ndarray | None:
    """The draft table as a square checkpoint table [R, R] (R = rows), or None.

    A checkpoint's vocabulary is its lm_head width; a draft narrower than its row count
    (a reduced draft vocabulary reading target tokens) is padded with masked columns
    so that it can be written as a standalone Llama checkpoint.
    """
    if case.draft_table is None:
        return None
    t = case.draft_table
    rows, cols = t.shape
    if rows == cols:
        return t
    out = np.full((rows, rows), -np.inf, dtype=np.float32)
    out[:, :cols] = t
    return out


def materialize(case: Case, root: Path, dtype: str = "float32", **write_kw) -> CaseCheckpoints:
    """Write (or reuse) the case's target and draft checkpoints under ``root``."""
    from specfuzz.tablegen import write_checkpoint

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)

    def one(kind: str, table: np.ndarray, eos: int | None) -> Path:
        d = root / f"{kind}-{dtype}-{_digest(table, eos=eos, dtype=dtype, **write_kw)}"
        if not (d / "config.json").exists():
            write_checkpoint(d, table, dtype=dtype, eos_token_id=eos, overwrite=True, **write_kw)
        return d

    target = one("target", case.target_table, case.eos_token_id)
    draft_t = square_draft_table(case)
    draft = None
    if draft_t is not None:
        eos = case.eos_token_id if case.eos_token_id is not None and case.eos_token_id < draft_t.shape[0] else None
        draft = one("draft", draft_t, eos)
    return CaseCheckpoints(target, draft)
