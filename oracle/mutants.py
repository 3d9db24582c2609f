"""The mutants of the reference sampler: one witness case each (like :mod:`.catalogue` for N1-N7).

A mutant (:data:`MUTANTS`) breaks lossless speculation in
exactly one speculation event (:mod:`.events`): on a case where that event has probability 0
it samples μ exactly, so a campaign finds it only by drawing cases that exercise the event.
``bench/time_to_bug.py`` measures how long a fresh campaign takes to find each one; the
witness below is a small case where the event happens and the mutant's law differs from μ
by a total variation above 0.01 (tests/test_events.py checks both).
"""

from __future__ import annotations

import numpy as np

from specfuzz.case import Case
from specfuzz.oracle.params import SamplingParams
from specfuzz.oracle.speculative import SpecConfig

NEG = -np.inf

# Mutants of the reference sampler (bench/time_to_bug.py): id -> (the event it acts in, what
# it does). Each changes the law only in runs that go through its event, so a case in which
# that event has probability 0 samples exactly μ (tests/test_events.py checks this).
MUTANTS: dict[str, tuple[str, str]] = {
    "M01": ("reject@2+", "a rejection after an accepted draft resamples from p instead of the residual (p - q)+"),
    "M02": ("bonus@2+", "the bonus token after two or more accepted drafts is drawn from the last draft position's p"),
    "M03": ("tree_reject@2+", "a rejection below the tree's root draws from p, not from p without the node's children"),
    "M04": ("tree_leaf@2+", "the bonus token at a leaf two or more levels deep is the argmax of p, not a sample"),
    "M05": ("residual_single", "a residual with one token of support emits the rejected draft instead"),
    "M06": ("residual_small", "a residual of mass below RESIDUAL_SMALL_MASS is replaced by p"),
    "M07": ("block_weight", "block verification's weight is not carried: w_i = min(1, p_i/q_i), not min(1, w_(i-1) p_i/q_i)"),
    "M08": ("tree_sibling", "a sibling after a rejected first child is tested with p(child), not p(child) / (1 - mass tested)"),
    "M09": ("stop_mid_round", "an accepted stop token with drafts after it does not end the output"),
    "M10": ("max_tokens_cut", "the draft at the last allowed position is accepted untested when more drafts follow"),
    "M11": ("lag:penalties", "repetition/frequency/presence penalties see the committed output only, not the drafts before the position"),
    "M12": ("draft_truncated", "a draft outside the target's top-k/top-p/min-p support is tested against the untruncated p"),
    "M13": ("no_draft", "a round without draft tokens emits the argmax of p instead of a sample"),
    "M14": ("short_draft", "an n-gram proposal shorter than K is padded with its last token, accepted untested"),
    "M15": ("outside_draft", "a rejection under a narrower draft resamples only among the draft's token ids"),
    "M16": ("coin_repeat", "every acceptance test of a round after its first reuses the first test's uniform"),
}

# Lossless controls of the time-to-bug bench: the sampler changed in a way that keeps its law
# exactly μ (a campaign against them must store nothing).
CONTROLS: dict[str, str] = {
    "L1": "chain drafts proposed greedily (argmax q) and verified as point masses",
    "L2": "n-gram proposals taken from the earliest match of the longest suffix, not the latest",
}


def mutant_witnesses() -> dict[str, Case]:
    """Mutant id -> a small case whose law that mutant changes."""
    flat3 = np.zeros((3, 3))  # [3, 3]
    ramp = np.array([[0.0, 1.0, 2.0], [2.0, 0.0, 1.0], [1.0, 2.0, 0.0]])  # [3, 3]: p depends on the last token
    peaked = np.array([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 2.0]])  # [3, 3]
    chain = dict(spec=SpecConfig("draft_model", 3), draft_table=peaked)
    out = {
        "M01": Case(ramp, (0,), SamplingParams(max_tokens=3), **chain),
        "M02": Case(ramp, (0,), SamplingParams(max_tokens=3), spec=SpecConfig("draft_model", 2), draft_table=ramp),
        "M03": Case(ramp, (0,), SamplingParams(max_tokens=3), spec=SpecConfig("eagle_tree", 2, tree_topk=1, tree_budget=2),
                    draft_table=peaked),
        "M04": Case(flat3, (0,), SamplingParams(max_tokens=3), spec=SpecConfig("eagle_tree", 2, tree_topk=1, tree_budget=2),
                    draft_table=ramp),
        # q puts 0.9 on token 0 where p has 0.05: the residual is all on token 1 or 2 but one
        "M05": Case(np.array([[-3.0, 0.0, NEG]] * 3), (0,), SamplingParams(max_tokens=2),
                    spec=SpecConfig("draft_model", 1), draft_table=np.array([[2.0, 0.0, 0.0]] * 3)),
        # p and q almost equal: the residual mass is small
        "M06": Case(np.array([[0.0, 0.1875, 0.0]] * 3), (0,), SamplingParams(max_tokens=2),
                    spec=SpecConfig("draft_model", 1), draft_table=np.array([[0.0, 0.0, 0.0]] * 3)),
        "M07": Case(flat3, (0,), SamplingParams(max_tokens=3), spec=SpecConfig("draft_model", 2, verify="block"),
                    draft_table=ramp),
        "M08": Case(flat3, (0,), SamplingParams(max_tokens=2), spec=SpecConfig("eagle_tree", 1, tree_topk=3, tree_budget=3),
                    draft_table=ramp),
        "M09": Case(ramp, (0,), SamplingParams(max_tokens=3), eos_token_id=2, spec=SpecConfig("draft_model", 2),
                    draft_table=np.array([[0.0, 0.0, 2.0]] * 3)),
        "M10": Case(ramp, (0,), SamplingParams(max_tokens=2), spec=SpecConfig("draft_model", 3), draft_table=peaked),
        "M11": Case(peaked, (0,), SamplingParams(max_tokens=3, repetition_penalty=4.0), spec=SpecConfig("draft_model", 2),
                    draft_table=peaked),
        "M12": Case(ramp, (0,), SamplingParams(max_tokens=2, top_k=1), spec=SpecConfig("draft_model", 1), draft_table=flat3),
        "M13": Case(ramp, (0, 1, 2), SamplingParams(max_tokens=2), spec=SpecConfig("ngram", 2)),
        "M14": Case(ramp, (0, 1, 0), SamplingParams(max_tokens=3), spec=SpecConfig("ngram", 3)),
        "M15": Case(np.zeros((4, 4)), (0,), SamplingParams(max_tokens=2), spec=SpecConfig("draft_model", 1),
                    draft_table=np.array([[2.0, 0.0]] * 4)),
        "M16": Case(flat3, (0,), SamplingParams(max_tokens=3), spec=SpecConfig("draft_model", 2), draft_table=peaked),
    }
    assert set(out) == set(MUTANTS)
    return out
