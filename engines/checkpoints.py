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


def head_kind(case: Case) -> str | None:
    """"eagle"/"eagle3" when the case's drafter is an EAGLE head, else None."""
    spec = case.spec
    return spec.method if spec is not None and spec.method in ("eagle", "eagle3") and case.draft_table is not None else None


def materialize(case: Case, root: Path, dtype: str = "float32", **write_kw) -> CaseCheckpoints:
    """Write (or reuse) the case's target and draft checkpoints under ``root``.

    For ``eagle``/``eagle3`` cases the draft folder is an EAGLE head
    (:mod:`specfuzz.tablegen.eagle`) and the target is written the way that head needs
    (EAGLE: the draft table in the lm_head's spare columns; EAGLE-3: two layers), so the
    target folder differs from the plain one but has exactly the same logits.
    """
    from specfuzz.tablegen import write_checkpoint

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)

    def one(kind: str, table: np.ndarray, eos: int | None, extra: dict | None = None, tag: str = "") -> Path:
        kw = {**write_kw, **(extra or {})}
        meta = {k: v for k, v in kw.items() if k != "head_table"}
        h = kw.get("head_table")
        digest = _digest(table, eos=eos, dtype=dtype, head=None if h is None else _digest(np.asarray(h)), **meta)
        d = root / f"{kind}{tag}-{dtype}-{digest}"
        if not (d / "config.json").exists():
            write_checkpoint(d, table, dtype=dtype, eos_token_id=eos, overwrite=True, **kw)
        return d

    hk = head_kind(case)
    if hk is not None:
        from specfuzz.tablegen.eagle import eagle_target_kwargs, write_eagle_head

        V = int(case.target_table.shape[0])
        draft_t = np.asarray(case.draft_table)[:V]  # rows beyond V are never read
        d2t = None if case.draft_d2t is None else tuple(int(t) for t in case.draft_d2t)
        if hk == "eagle":
            # EAGLE drafts over the target's vocabulary: draft columns go to their target ids.
            full = np.full((V, V), -np.inf, dtype=np.float64)
            full[:, list(d2t) if d2t is not None else list(range(draft_t.shape[1]))] = draft_t
            draft_t, d2t = full, None
        target = one("target", case.target_table, case.eos_token_id, eagle_target_kwargs(hk, draft_t), tag=f"-{hk}")
        head = root / f"{hk}-head-{dtype}-{_digest(draft_t, target=target.name, d2t=d2t)}"
        if not (head / "config.json").exists():
            write_eagle_head(head, kind=hk, target_dir=target, draft_table=draft_t, d2t=d2t, overwrite=True)
        return CaseCheckpoints(target, head)

    target = one("target", case.target_table, case.eos_token_id)
    draft_t = square_draft_table(case)
    draft = None
    if draft_t is not None:
        eos = case.eos_token_id if case.eos_token_id is not None and case.eos_token_id < draft_t.shape[0] else None
        draft = one("draft", draft_t, eos)
    return CaseCheckpoints(target, draft)
