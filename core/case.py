"""A test case: what a strategy draws, an engine runs, and the oracle judges.

A :class:`Case` is self-contained (tables included) and serialises to JSON with a
schema version, so a corpus entry can rebuild every checkpoint from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from specfuzz.errors import InvalidInput
from specfuzz.oracle.params import SamplingParams
from specfuzz.oracle.speculative import DraftModel, SpecConfig, SpeculativeProcess

CASE_SCHEMA_VERSION = 1


def _table(name: str, value: Any, *, square: bool) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim != 2 or (square and arr.shape[0] != arr.shape[1]) or arr.shape[0] < 1 or arr.shape[1] < 2:
        want = "a square 2-D [V, V] table with V >= 2" if square else "a 2-D [R, V_draft] table with V_draft >= 2"
        raise InvalidInput(name, getattr(arr, "shape", value), want)
    if np.isnan(arr).any() or np.isposinf(arr).any():
        raise InvalidInput(name, "NaN/+inf entries", "finite logits (or -inf for a masked token)")
    return arr.astype(np.float32)


@dataclass(frozen=True, eq=False)
class Case:
    """One request pattern on one table model, with or without speculation."""

    target_table: np.ndarray  # [V, V] float32 logits
    prompt: tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    eos_token_id: int | None = None
    spec: SpecConfig | None = None  # None: speculation off
    draft_table: np.ndarray | None = None  # [R, V_draft] float32 logits, for draft-model methods
    draft_d2t: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_table", _table("target_table", self.target_table, square=True))
        if self.draft_table is not None:
            object.__setattr__(self, "draft_table", _table("draft_table", self.draft_table, square=False))
        V = self.vocab_size
        prompt = tuple(int(t) for t in self.prompt)
        if not prompt or any(not 0 <= t < V for t in prompt):
            raise InvalidInput("prompt", self.prompt, f"a non-empty list of token ids in [0, {V})")
        object.__setattr__(self, "prompt", prompt)
        if self.eos_token_id is not None and not 0 <= self.eos_token_id < V:
            raise InvalidInput("eos_token_id", self.eos_token_id, f"None or a token id in [0, {V})")
        self.params.check_vocab(V)

    @property
    def vocab_size(self) -> int:
        return int(self.target_table.shape[0])

    @property
    def draft(self) -> DraftModel | None:
        if self.draft_table is None:
            return None
        return DraftModel(self.draft_table, self.draft_d2t)

    def with_(self, **changes: Any) -> "Case":
        kw = {k: getattr(self, k) for k in self.__dataclass_fields__}
        kw.update(changes)
        return Case(**kw)

    def target_law(self, profile: str = "vllm"):
        """The exact law μ of this case under an engine's semantics profile."""
        from specfuzz.oracle.law import TargetLaw

        return TargetLaw(self.target_table, self.prompt, self.params, eos_token_id=self.eos_token_id, profile=profile)

    def process(self, spec: SpecConfig | None = None, target=None) -> SpeculativeProcess:
        """The reference sampler's generation process for this case (``spec`` overrides)."""
        spec = spec or self.spec or SpecConfig()
        return SpeculativeProcess(
            target if target is not None else self.target_law(),
            self.prompt,
            self.params.max_tokens,
            spec,
            self.draft,
            self.params.temperature,
        )

    # -- JSON ---------------------------------------------------------------------------

    def to_json(self) -> dict:
        return {
            "schema_version": CASE_SCHEMA_VERSION,
            "target_table": _table_json(self.target_table),
            "prompt": list(self.prompt),
            "params": self.params.to_json(),
            "eos_token_id": self.eos_token_id,
            "spec": None if self.spec is None else self.spec.to_json(),
            "draft_table": None if self.draft_table is None else _table_json(self.draft_table),
            "draft_d2t": None if self.draft_d2t is None else list(self.draft_d2t),
        }

    @classmethod
    def from_json(cls, d: Mapping) -> "Case":
        version = d.get("schema_version")
        if version != CASE_SCHEMA_VERSION:
            raise InvalidInput("case schema_version", version, f"{CASE_SCHEMA_VERSION}")
        return cls(
            target_table=_table_from_json(d["target_table"]),
            prompt=tuple(d["prompt"]),
            params=SamplingParams.from_json(d.get("params", {})),
            eos_token_id=d.get("eos_token_id"),
            spec=None if d.get("spec") is None else SpecConfig.from_json(d["spec"]),
            draft_table=None if d.get("draft_table") is None else _table_from_json(d["draft_table"]),
            draft_d2t=None if d.get("draft_d2t") is None else tuple(d["draft_d2t"]),
        )


def _table_json(t: np.ndarray) -> list:
    # float32 values round-trip exactly through their shortest repr; -inf as a string.
    return [[("-inf" if v == -np.inf else float(v)) for v in row] for row in t.astype(np.float32).tolist()]


def _table_from_json(rows: list) -> np.ndarray:
    return np.array([[(-np.inf if v == "-inf" else v) for v in row] for row in rows], dtype=np.float32)
