"""The mutants of the reference sampler: one witness case each (like :mod:`.catalogue` for N1-N7).

A mutant (:data:`~specfuzz.oracle.speculative.MUTANTS`) breaks lossless speculation in
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
from specfuzz.oracle.speculative import MUTANTS, SpecConfig

NEG = -np.inf


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
