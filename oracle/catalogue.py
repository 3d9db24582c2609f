"""The regression catalogue: one small case per known bug class N1-N7 (SPEC §4).

Each case runs the reference sampler with that class's switch on; the law it then
samples (μD, computed exactly by :class:`~specfuzz.oracle.speculative.ExactDriver`)
differs from the target law μ. The cases are deliberately small (V <= 4, at most four
output tokens) so that μ and μD are enumerated and a maintainer can check them by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specfuzz.case import Case
from specfuzz.oracle.params import SamplingParams
from specfuzz.oracle.speculative import BUG_CLASSES, SpecConfig


@dataclass(frozen=True)
class CatalogueEntry:
    bug: str  # N1..N7
    case: Case  # spec.inject == bug
    where_seen: str
    published_effect: str
    note: str


def _n1_block_case() -> Case:
    """The published N1 effect, exactly: P(x3 = a) is 1/2 under μ and 5/12 under N1.

    Two tokens a=0, b=1; the target is flat (1/2, 1/2) after every token. The drafter
    proposes a or b with probability 1/2 each after a, and always a after b. Block
    verification with K=3; N1 reuses the three slot uniforms η_1..η_3 every round. All
    logits (0 and -inf) are exact in every dtype, so the case is exact on an engine too.
    """
    target = np.zeros((2, 2))  # [V, V]: p(.|anything) = (1/2, 1/2)
    draft = np.array([[0.0, 0.0], [0.0, -np.inf]])  # [V, V_draft]: q(.|a) = (1/2, 1/2), q(.|b) = (1, 0)
    return Case(
        target, (0,), SamplingParams(max_tokens=3), eos_token_id=None,
        spec=SpecConfig("draft_model", 3, verify="block", inject="N1"), draft_table=draft,
    )


def catalogue() -> dict[str, CatalogueEntry]:
    entries: list[CatalogueEntry] = []
    entries.append(CatalogueEntry(
        "N1", _n1_block_case(), "vLLM V2 block verify", "P(x3=a) = 5/12 instead of 1/2",
        "V=2 flat target, K=2 block verification: μ gives P(x3=a)=1/2, N1 gives exactly 5/12.",
    ))
    eos_heavy = np.array([[0, 0, 0, 1.5]] * 3 + [[0, 0, 0, 0]], dtype=float)  # [4, 4]
    entries.append(CatalogueEntry(
        "N2",
        Case(eos_heavy, (0,), SamplingParams(max_tokens=4, min_tokens=2), eos_token_id=3,
             spec=SpecConfig("draft_model", 2, inject="N2"),
             draft_table=np.array([[0, 0, 0, 2.0]] * 3 + [[0, 0, 0, 0]], dtype=float)),
        "vLLM V1 min_tokens", "5/200 fixed, 13/184 adaptive (Qwen3)",
        "min_tokens=2 with a likely EOS: at the second draft slot EOS is still masked by the committed length.",
    ))
    think = np.array([[0, 0, -1, 0], [0, 0, -1, 0], [0, 0, 0, 0], [0, 0, 0, 0]], dtype=float)  # [4, 4]
    entries.append(CatalogueEntry(
        "N3",
        Case(think, (0,), SamplingParams(max_tokens=4, thinking_budget=1, think_end_token_id=2), eos_token_id=3,
             spec=SpecConfig("draft_model", 2, inject="N3"), draft_table=np.zeros((4, 4))),
        "vLLM V1 thinking budget", "8/200 fixed, 92/131 adaptive",
        "thinking budget 1 (end-of-thinking token 2): draft tokens past the budget are accepted unforced.",
    ))
    rare0 = np.zeros((4, 4))
    rare0[:, 0] = -3.0  # token 0 has p = 0.016 after every token
    entries.append(CatalogueEntry(
        "N4",
        Case(rare0, (1, 2, 1), SamplingParams(max_tokens=2),
             spec=SpecConfig("ngram_tree", 2, tree_topk=8, tree_budget=8, inject="N4")),
        "SGLang NGRAM", "P(token 0) = 0.538 instead of 0.049",
        "an n-gram tree with one real continuation per level; seven padded 0 children inflate token 0.",
    ))
    entries.append(CatalogueEntry(
        "N5",
        Case(np.zeros((4, 4)), (0,), SamplingParams(max_tokens=3),
             spec=SpecConfig("draft_model", 1, inject="N5"), draft_table=np.zeros((4, 2))),
        "vLLM V2 sampler", "TV 0.59, some token never emitted",
        "a draft vocabulary of 2 under a flat 4-token target: tokens 2 and 3 are never emitted.",
    ))
    entries.append(CatalogueEntry(
        "N6",
        Case(np.zeros((4, 4)), (0, 1, 2), SamplingParams(max_tokens=3),
             spec=SpecConfig("ngram", 2, inject="N6")),
        "vLLM CPU kernel", "44-52 stray per 600",
        "a prompt without repeated n-grams: every draft slot is a placeholder, accepted with p[-1].",
    ))
    entries.append(CatalogueEntry(
        "N7",
        Case(np.zeros((4, 4)), (0,), SamplingParams(max_tokens=3),
             spec=SpecConfig("draft_model", 2, inject="N7"),
             draft_table=np.array([[1, 0], [0, 1], [0, 0], [0, 0]], dtype=float)),
        "vLLM V1 sampler", "393/2000 stray ids; GPU fault",
        "a draft vocabulary of 2 under a 4-token target, K=2: slot 2 reads q from past the buffer.",
    ))
    out = {e.bug: e for e in entries}
    assert set(out) == set(BUG_CLASSES)
    return out


def n1_published_effect() -> tuple[float, float]:
    """P(x3 = a) under μ and under N1 for the N1 catalogue case (float64; 1/2 and 5/12).

    Every probability in the case is a dyadic rational or a ratio of them, so the float64
    results equal 1/2 and 5/12 within 1e-15; tests recover 5/12 as a fraction and check it
    against an independent computation in rational arithmetic.
    """
    from specfuzz.oracle.speculative import ExactDriver

    case = _n1_block_case()
    mu = case.target_law().enumerate().as_dict()
    n1 = ExactDriver(case.process()).law()
    return tuple(sum(p for o, p in law.items() if len(o) >= 3 and o[2] == 0) for law in (mu, n1))
