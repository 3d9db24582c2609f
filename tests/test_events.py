"""The speculation event model (oracle/events.py): exact, complete for the bugs it names.

* The analytic walk (chain drafts, token verification) and the enumeration of the
  instrumented rounds give the same law and the same event probabilities, and the law is μ.
* Event frequencies of Monte Carlo runs of the reference sampler match the exact probabilities.
* Every catalogued bug (N1-N7) and every mutant of the time-to-bug bench acts only through its
  event: on a case where that event has probability 0, its law is exactly μ; on its own
  witness case it has positive probability and the law differs.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from specfuzz.case import Case
from specfuzz.oracle.catalogue import catalogue
from specfuzz.oracle.drivers import ExactDriver, MonteCarloDriver
from specfuzz.oracle.mutants import mutant_witnesses
from specfuzz.oracle.events import EVENTS, case_events, event_info, event_law, expressible, multi_position
from specfuzz.oracle.params import SamplingParams
from specfuzz.oracle.mutants import CONTROLS, MUTANTS
from specfuzz.oracle.speculative import SpecConfig, SpeculativeProcess
from specfuzz.strategies import cases

SAMPLING = frozenset({"temperature", "top_k", "top_p", "min_p", "repetition_penalty", "frequency_penalty",
                      "presence_penalty", "min_tokens", "stop_token_ids", "ignore_eos", "thinking_budget",
                      "think_end_token_id", "logit_bias"})


def _process(case: Case, inject: str | None = None, record: bool = True) -> SpeculativeProcess:
    spec = dataclasses.replace(case.spec, inject=inject)
    return SpeculativeProcess(case.target_law(), case.prompt, case.params.max_tokens, spec, case.draft,
                              case.params.temperature, record_events=record)


def _close(a: dict, b: dict, tol: float = 1e-9) -> bool:
    return all(abs(a.get(k, 0.0) - b.get(k, 0.0)) <= tol for k in set(a) | set(b))


small_cases = cases(max_vocab=3, max_tokens=3, max_k=3, sampling=SAMPLING,
                    methods=("draft_model", "ngram", "eagle_tree", "ngram_tree"))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(small_cases)
def test_event_law_of_every_method_gives_mu_and_the_walk_equals_the_enumeration(case):
    proc = _process(case)
    try:
        mu = case.target_law().enumerate().as_dict()
    except Exception:
        return  # an ambiguous law: the campaign does not draw it either
    ev = event_law(proc)
    assert _close(ev.law, mu, 1e-9)
    assert all(0 < p <= 1 + 1e-12 for p in ev.probability.values())
    assert all(ev.expected[e] >= ev.probability[e] - 1e-12 for e in ev.probability)
    for name in ev.probability:
        event_info(name)  # every recorded event is in the catalogue
    if case.spec.method in ("draft_model", "ngram") and case.spec.verify == "token":
        slow = ExactDriver(proc).event_law()
        assert _close(ev.law, slow.law)
        assert _close(ev.probability, slow.probability) and _close(ev.expected, slow.expected)


def _mc_check(case: Case, n: int = 3000, seed: int = 0) -> None:
    exact = event_law(_process(case))
    driver = MonteCarloDriver(_process(case), np.random.default_rng(seed))
    hits: dict[str, int] = {}
    counts: dict[str, int] = {}
    for _ in range(n):
        driver.sample()
        for e, c in driver.last_events.items():
            hits[e] = hits.get(e, 0) + 1
            counts[e] = counts.get(e, 0) + c
    for e in set(hits) | set(exact.probability):
        p = exact.probability.get(e, 0.0)
        sd = math.sqrt(max(p * (1 - p), 1e-4) / n)
        assert abs(hits.get(e, 0) / n - p) <= 5 * sd, (e, hits.get(e, 0) / n, p)
        x = exact.expected.get(e, 0.0)
        assert abs(counts.get(e, 0) / n - x) <= 5 * math.sqrt(max(x * 3, 1e-4) / n) + 0.02, (e, counts.get(e, 0) / n, x)


def _table(V: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(-6, 6, size=(V, V)) / 4.0


MC_CASES = {
    "chain sampled, penalties": Case(_table(3, 1), (0, 1), SamplingParams(max_tokens=4, repetition_penalty=1.5), eos_token_id=2,
                                     spec=SpecConfig("draft_model", 3), draft_table=_table(3, 2)),
    "chain greedy draft, top-k": Case(_table(4, 3), (1,), SamplingParams(max_tokens=4, top_k=2), eos_token_id=None,
                                      spec=SpecConfig("draft_model", 2, draft_sampling="greedy"), draft_table=_table(4, 4)),
    "n-gram, min_tokens": Case(_table(3, 5), (0, 1, 0, 1), SamplingParams(max_tokens=4, min_tokens=2), eos_token_id=2,
                               spec=SpecConfig("ngram", 3)),
    "block verification": Case(_table(3, 6), (2,), SamplingParams(max_tokens=4), eos_token_id=None,
                               spec=SpecConfig("draft_model", 3, verify="block"), draft_table=_table(3, 7)),
    "eagle tree, narrow draft": Case(_table(4, 8), (0,), SamplingParams(max_tokens=3), eos_token_id=3,
                                     spec=SpecConfig("eagle_tree", 2, tree_topk=2, tree_budget=4), draft_table=_table(4, 9)[:, :3]),
    "n-gram tree": Case(_table(3, 10), (0, 1, 0, 2, 0), SamplingParams(max_tokens=3), eos_token_id=None,
                        spec=SpecConfig("ngram_tree", 2, tree_topk=2, tree_budget=4)),
}


@pytest.mark.parametrize("name", sorted(MC_CASES))
def test_event_probabilities_match_monte_carlo_of_the_reference_sampler(name):
    _mc_check(MC_CASES[name])


# The event through which each catalogued bug acts (its exposure).
CATALOGUE_EVENTS = {"N1": ("coin_reused",), "N2": ("lag:min_tokens",), "N3": ("lag:thinking",), "N4": ("tree_unfilled",),
                    "N5": ("outside_draft",), "N6": ("short_draft", "no_draft"), "N7": ("narrow_lag",)}


def _exposed(ev, names: tuple[str, ...]) -> float:
    """Probability mass of the events ``names`` ('reject@2+' covers positions 2 and more)."""
    total = 0.0
    for e, p in ev.probability.items():
        for n in names:
            if n.endswith("+"):
                stem, lo = n[:-1].split("@")
                if e.startswith(stem + "@") and int(e.split("@")[1]) >= int(lo):
                    total += p
            elif e == n:
                total += p
    return total


@pytest.mark.parametrize("bug", sorted(CATALOGUE_EVENTS))
def test_each_catalogue_case_exposes_its_bugs_event(bug):
    case = catalogue()[bug].case
    ev = case_events(case)
    assert _exposed(ev, CATALOGUE_EVENTS[bug]) > 0


# Each bug with the events it acts in; a lossless control (L1, L2) acts in none: its law is always μ.
BUGS = {**CATALOGUE_EVENTS, **{m: (ev,) for m, (ev, _) in MUTANTS.items()}, **{c: () for c in CONTROLS}}
mutant_cases = cases(max_vocab=3, max_tokens=3, max_k=3, sampling=SAMPLING, draft_vocab="any")


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_bug_whose_event_has_probability_zero_samples_exactly_mu(bug):
    """Where the events a bug acts in have probability 0, its law is μ (for the controls: always)."""
    checked = []

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(mutant_cases)
    def check(case):
        ev = case_events(case)
        if ev is None or _exposed(ev, BUGS[bug]) > 0 or (bug == "N5" and case.draft_d2t is not None):
            return  # N5 cuts at the draft's width, whatever ids a reduced draft maps to
        try:
            bug_law = ExactDriver(_process(case, inject=bug, record=False), max_states=20_000).law()
        except RuntimeError:
            return
        checked.append(case)
        assert _close(bug_law, ev.law, 1e-9), (bug, BUGS[bug])

    check()
    assert len(checked) >= 5


def test_every_mutant_changes_the_law_of_a_case_where_its_event_happens():
    """Each mutant's witness case (oracle/mutants.py): its event happens and its law differs from μ."""
    witnesses = mutant_witnesses()
    assert set(witnesses) == set(MUTANTS)
    for m, case in witnesses.items():
        ev = case_events(case)
        assert _exposed(ev, BUGS[m]) > 0, m
        bug_law = ExactDriver(_process(case, inject=m, record=False)).law()
        tv = 0.5 * sum(abs(bug_law.get(o, 0.0) - ev.law.get(o, 0.0)) for o in set(bug_law) | set(ev.law))
        assert tv > 0.01, (m, tv)


def test_expressible_marks_what_a_method_cannot_reach():
    chain = expressible("draft_model", 1, sampling={"top_k"})
    assert chain["reject@1"] is None and chain["bonus@1"] is None
    assert "K >= 2" in chain["stop_mid_round"] and "reject@2" not in chain
    assert "not a tree" in chain["tree_leaf@1"]
    assert "penalt" in chain["lag:penalties"]
    tree = expressible("ngram_tree", 3, sampling={"min_tokens"})
    assert tree["tree_reject@3"] is None and tree["no_draft"] is None and "chain" in tree["reject@1"]
    assert "not modelled" in expressible("suffix", 3)["reject@1"]
    assert {event_info(n).name for n in expressible("draft_model", 3)} == {e.name for e in EVENTS}


def test_multi_position_events():
    assert multi_position("reject@2") and not multi_position("reject@1")
    assert multi_position("tree_leaf@3") and not multi_position("bonus@1")
    assert multi_position("lag:penalties") and multi_position("stop_mid_round") and not multi_position("residual_single")


def test_the_docs_catalogue_of_events_is_the_one_generated_from_the_code():
    from pathlib import Path

    from specfuzz.oracle.events import main

    page = Path(__file__).resolve().parents[1] / "docs" / "events.md"
    assert main([str(page), "--check"]) == 0, "docs/events.md is stale: run python -m specfuzz.oracle.events docs/events.md"


def test_a_case_too_large_to_enumerate_has_no_event_law_rather_than_taking_minutes():
    """Block verification enumerates rounds by replay; past ``max_replays`` replays the case's
    events are not computed (None), as past ``max_states``. The default is finite."""
    from specfuzz.oracle.events import DEFAULT_MAX_REPLAYS

    case = Case(_table(6, 7), (0, 1, 2), SamplingParams(max_tokens=4), eos_token_id=None,
                spec=SpecConfig("draft_model", 4, verify="block"), draft_table=_table(6, 8))
    assert case_events(case, max_replays=200) is None
    small = dataclasses.replace(case, spec=SpecConfig("draft_model", 1, verify="block"), params=SamplingParams(max_tokens=2))
    assert case_events(small, max_replays=200) is not None
    assert 0 < DEFAULT_MAX_REPLAYS < 10**6
