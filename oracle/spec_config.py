"""Speculation settings: the methods, the catalogued bug classes, :class:`SpecConfig` and
:class:`DraftModel` (what the reference sampler and every engine adapter are configured with).

Re-exported by :mod:`specfuzz.oracle.speculative`, where the round that uses them lives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from specfuzz.errors import InvalidInput

# A draft slot that the proposer could not fill (vLLM's PLACEHOLDER_TOKEN_ID).
PLACEHOLDER_TOKEN_ID = -1
# The token id that SGLang's NGRAM tree pads unfilled branches with (N4).
TREE_PAD_TOKEN_ID = 0

# Methods the reference sampler runs.
METHODS = ("draft_model", "ngram", "eagle_tree", "ngram_tree", "eagle", "eagle3")
# Chain drafts from a table drafter. "eagle"/"eagle3" are EAGLE heads written by tablegen
# (specfuzz.tablegen.eagle): their draft distribution after token x is exactly the draft
# table's row x, as for "draft_model", so the reference runs them as the same chain.
CHAIN_DRAFT_METHODS = ("draft_model", "eagle", "eagle3")
# Chain methods (block verification applies to these).
CHAIN_METHODS = CHAIN_DRAFT_METHODS + ("ngram",)
# Every method an engine adapter may be asked for (the reference runs METHODS only).
ENGINE_METHODS = METHODS + ("suffix", "mtp")
VERIFY_MODES = ("token", "block")
DRAFT_SAMPLING = ("sampled", "greedy")

# Catalogued bug classes (SPEC §4): id -> (broken condition, mechanism as modelled here).
BUG_CLASSES: dict[str, tuple[int, str]] = {
    "N1": (4, "the acceptance uniform of each draft slot is drawn once per request and reused every round"),
    "N2": (2, "min_tokens masks stop tokens by the committed length, ignoring the draft tokens before the position"),
    "N3": (2, "the thinking budget counts committed tokens only, ignoring the draft tokens before the position"),
    "N4": (3, "unfilled tree branches are padded with token 0 and verified as real (duplicate) children"),
    "N5": (3, "target probabilities are cut to the draft vocabulary width and renormalised"),
    "N6": (3, "placeholder (-1) draft slots are verified with the wrapped-around probability p[-1] and emitted"),
    "N7": (3, "the narrow draft probabilities q [K, V_draft] are read with the target's row stride V_target"),
}


# ----------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class DraftModel:
    """A table drafter: ``table[ctx_token, draft_token]`` logits.

    Rows are indexed by *target* token ids (the drafter reads the target's context, as an
    EAGLE-3 head with a reduced vocabulary does), columns by draft ids; ``d2t`` maps draft
    ids to target ids (identity by default). Narrower drafts have fewer columns than the
    target vocabulary; wider drafts propose ids the target cannot produce.
    """

    table: np.ndarray  # [R, V_draft] float, R >= max(V_target, V_draft)
    d2t: tuple[int, ...] | None = None  # [V_draft] target id of each draft id

    @property
    def vocab_size(self) -> int:
        return int(self.table.shape[1])

    def target_ids(self) -> np.ndarray:  # [V_draft]
        if self.d2t is None:
            return np.arange(self.vocab_size)
        return np.asarray(self.d2t, dtype=np.int64)


@dataclass(frozen=True)
class SpecConfig:
    """How the reference engine speculates. Defaults shrink toward the simplest case."""

    method: str = "draft_model"
    num_speculative_tokens: int = 1  # K: chain length, or tree depth for tree methods
    verify: str = "token"  # chain drafts only: "token" or "block"
    draft_sampling: str = "sampled"  # draft_model / eagle_tree: sample q, or propose argmax q
    draft_temperature: float | None = None  # None: the request's temperature (1.0 if greedy)
    ngram_min: int = 1
    ngram_max: int = 3
    tree_topk: int = 2  # children per node
    tree_budget: int = 4  # draft nodes per tree (excluding the root)
    inject: str | None = None  # one of BUG_CLASSES or MUTANTS
    # The engine's own default configuration of this method: the adapter sends only the
    # knobs the engine requires (method, draft model, and K where the engine has no
    # default), and the fields above hold what the engine documents it then uses
    # (Capabilities.spec_defaults), as far as SpecConfig can say it.
    engine_default: bool = False
    # Trees whose breadth falls with depth (SGLang's NGRAM: from tree_topk children per
    # node after a short match down to tree_topk_min after the deepest one); None: every
    # node has up to tree_topk children. The reference sampler models only the latter:
    # μ does not depend on it (the verdict stays exact), only bug-law attribution does.
    tree_topk_min: int | None = None

    def __post_init__(self) -> None:
        if self.method not in ENGINE_METHODS:
            raise InvalidInput("method", self.method, f"one of {ENGINE_METHODS}")
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 16:
            raise InvalidInput("num_speculative_tokens", k, "an integer in [1, 16]")
        if self.verify not in VERIFY_MODES:
            raise InvalidInput("verify", self.verify, f"one of {VERIFY_MODES}")
        if self.verify == "block" and self.method not in CHAIN_METHODS:
            raise InvalidInput("verify", self.verify, "'token' for tree methods (block verification needs a chain draft)")
        if self.draft_sampling not in DRAFT_SAMPLING:
            raise InvalidInput("draft_sampling", self.draft_sampling, f"one of {DRAFT_SAMPLING}")
        if self.draft_temperature is not None and not (self.draft_temperature > 0 and np.isfinite(self.draft_temperature)):
            raise InvalidInput("draft_temperature", self.draft_temperature, "None or a finite number > 0")
        if not 1 <= self.ngram_min <= self.ngram_max <= 16:
            raise InvalidInput("ngram_min/ngram_max", (self.ngram_min, self.ngram_max), "1 <= ngram_min <= ngram_max <= 16")
        if not 1 <= self.tree_topk <= 16:
            raise InvalidInput("tree_topk", self.tree_topk, "an integer in [1, 16]")
        if not 1 <= self.tree_budget <= 64:
            raise InvalidInput("tree_budget", self.tree_budget, "an integer in [1, 64]")
        m = self.tree_topk_min
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= self.tree_topk):
            raise InvalidInput("tree_topk_min", m, f"None or an integer in [1, tree_topk={self.tree_topk}]")
        from specfuzz.oracle.mutants import CONTROLS, MUTANTS

        if self.inject is not None and self.inject not in {**BUG_CLASSES, **MUTANTS, **CONTROLS}:
            raise InvalidInput("inject", self.inject,
                               f"None or one of {sorted(BUG_CLASSES)}, a mutant {sorted(MUTANTS)} or a control {sorted(CONTROLS)}")

    @property
    def uses_draft_model(self) -> bool:
        return self.method in ("draft_model", "eagle_tree", "eagle", "eagle3")

    @property
    def is_tree(self) -> bool:
        return self.method in ("eagle_tree", "ngram_tree")

    def to_json(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        if not self.engine_default:
            del out["engine_default"]  # absent = False: cases stored before the field stay byte-equal
        if self.tree_topk_min is None:
            del out["tree_topk_min"]  # absent = None, likewise
        return out

    @classmethod
    def from_json(cls, d: Mapping) -> "SpecConfig":
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise InvalidInput("speculation setting", sorted(unknown)[0], f"one of {sorted(cls.__dataclass_fields__)}")
        return cls(**d)
