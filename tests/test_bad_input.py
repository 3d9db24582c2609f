"""Bad input gets an InvalidInput naming the bad value and what is allowed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specfuzz.case import Case
from specfuzz.errors import InvalidInput
from specfuzz.oracle.law import TargetLaw
from specfuzz.oracle.params import SamplingParams
from specfuzz.oracle.speculative import SpecConfig


@pytest.mark.parametrize(
    "kwargs, needle, allowed",
    [
        ({"top_p": 0.0}, "top_p=0.0", "(0, 1]"),
        ({"top_p": 1.5}, "top_p=1.5", "(0, 1]"),
        ({"top_p": float("nan")}, "top_p=nan", "finite"),
        ({"temperature": -1.0}, "temperature=-1.0", ">= 0"),
        ({"top_k": -3}, "top_k=-3", "-1 or 0"),
        ({"min_p": 2.0}, "min_p=2.0", "[0, 1]"),
        ({"thinking_budget": -1, "think_end_token_id": 1}, "thinking_budget=-1", ">= 0"),
        ({"thinking_budget": 2}, "think_end_token_id=None", "thinking_budget is set"),
        ({"max_tokens": 0}, "max_tokens=0", ">= 1"),
        ({"min_tokens": 5, "max_tokens": 3}, "min_tokens=5", "max_tokens=3"),
        ({"repetition_penalty": 0.0}, "repetition_penalty=0.0", "> 0"),
        ({"frequency_penalty": 3.0}, "frequency_penalty=3.0", "[-2, 2]"),
        ({"logit_bias": {1: 1e9}}, "logit_bias[1]=1000000000.0", "[-100, 100]"),
        ({"allowed_token_ids": ()}, "allowed_token_ids=()", "non-empty"),
        ({"regex": "a(b"}, "regex='a(b'", "valid regular expression"),
        ({"regex": "a", "choice": ("a",)}, "choice=('a',)", "one constraint"),
    ],
)
def test_bad_sampling_parameter_names_value_and_allowed_range(kwargs, needle, allowed):
    with pytest.raises(InvalidInput) as exc:
        SamplingParams(**kwargs)
    assert needle in str(exc.value) and allowed in str(exc.value)


def test_token_ids_outside_the_vocabulary_are_rejected():
    with pytest.raises(InvalidInput, match=r"stop_token_ids entry=7: a token id in \[0, 4\)"):
        TargetLaw(np.zeros((4, 4)), [0], SamplingParams(stop_token_ids=(7,)), eos_token_id=None)


@pytest.mark.parametrize(
    "table, needle",
    [
        (np.zeros((3, 4)), "(3, 4)"),
        (np.zeros(4), "(4,)"),
        (np.array([[0.0, np.nan], [0.0, 0.0]]), "NaN"),
        (np.array([[0.0, np.inf], [0.0, 0.0]]), "inf"),
    ],
)
def test_bad_target_table_is_rejected(table, needle):
    with pytest.raises(InvalidInput) as exc:
        Case(table, (0,))
    assert needle in str(exc.value)
    with pytest.raises(InvalidInput):
        TargetLaw(table, [0], SamplingParams(), eos_token_id=None)


def test_bad_case_fields_are_rejected():
    with pytest.raises(InvalidInput, match=r"prompt=\(\)"):
        Case(np.zeros((2, 2)), ())
    with pytest.raises(InvalidInput, match="prompt=.*5"):
        Case(np.zeros((2, 2)), (5,))
    with pytest.raises(InvalidInput, match="eos_token_id=2"):
        Case(np.zeros((2, 2)), (0,), eos_token_id=2)


def test_case_json_round_trip_is_exact_and_versioned():
    rng = np.random.default_rng(0)
    t = rng.normal(size=(5, 5)).astype(np.float32)
    t[1, 2] = -np.inf
    case = Case(t, (0, 1), SamplingParams(top_k=3, logit_bias={2: 0.5}, stop_token_ids=(4,)), eos_token_id=3,
                spec=SpecConfig("draft_model", 2, verify="block"), draft_table=rng.normal(size=(5, 3)))
    d = json.loads(json.dumps(case.to_json()))
    back = Case.from_json(d)
    assert np.array_equal(back.target_table, case.target_table)
    assert np.array_equal(back.draft_table, case.draft_table)
    assert back.params == case.params and back.spec == case.spec and back.prompt == case.prompt
    d["schema_version"] = 99
    with pytest.raises(InvalidInput, match="schema_version=99"):
        Case.from_json(d)
