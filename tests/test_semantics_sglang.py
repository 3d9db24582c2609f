"""The "sglang" semantics profile equals SGLang's non-speculative sampler, step by step.

Independent check: :func:`sglang_next_token_law` below re-derives the next-token law with
plain Python loops from SGLang 0.5.17's own code path (``python/sglang/srt``):
``SamplingBatchInfo.apply_logits_bias`` (additive penalizers, then the repetition
penalizer, then ``logit_bias``; ``penaltylib/*.py``), then ``Sampler.forward`` with
``sampling_backend="pytorch"`` (``logits.div_(temperatures)``, ``softmax``, and
``top_k_top_p_min_p_sampling_from_probs_torch``: one descending sort, positions ``>=
top_k`` zeroed, ``cumsum - p > top_p`` zeroed, ``p < min_p * p_max`` zeroed, multinomial
over what is left). It shares no code with :mod:`specfuzz.oracle.semantics`. The profile's
conditional must agree to 1e-9 on random rows (cases the profile calls ambiguous are
skipped; at least 80% must be checked), and on hand-picked rows where SGLang and the
"vllm" profile differ, one per documented difference, so that removing a difference from
the profile fails a test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from specfuzz.errors import AmbiguousSemantics, InvalidInput
from specfuzz.oracle.law import TargetLaw
from specfuzz.oracle.params import SamplingParams
from specfuzz.oracle.semantics import PROFILES, SGLangProfile, get_profile

ATOL = 1e-9
N_RANDOM_CASES = 400
MIN_CHECKED_FRACTION = 0.8
SGLANG_GREEDY_EPS = 1e-6  # sampling_params._SAMPLING_EPS: below it SGLang sets top_k=1


def sglang_next_token_law(row, prompt, out, params: SamplingParams, eos: int | None) -> np.ndarray:
    """SGLang's next-token law [V] after ``prompt + out`` for the table row ``row`` [V].

    Written from SGLang's source, in SGLang's order, one token at a time.
    """
    V = len(row)
    logits = [float(v) for v in row]
    counts = {t: out.count(t) for t in set(out)}
    # BatchedMinNewTokensPenalizer: stop_token_ids | {tokenizer.eos_token_id}, whatever ignore_eos says.
    if len(out) < params.min_tokens:
        for t in set(params.stop_token_ids) | ({eos} if eos is not None else set()):
            logits[t] = -math.inf
    # BatchedFrequencyPenalizer / BatchedPresencePenalizer (additive, output tokens).
    for t, c in counts.items():
        logits[t] -= params.frequency_penalty * c
        logits[t] -= params.presence_penalty
    # BatchedRepetitionPenalizer (scaling, output tokens; apply_scaling_penalties).
    if params.repetition_penalty != 1.0:
        r = params.repetition_penalty
        for t in counts:
            logits[t] = logits[t] * r if logits[t] < 0 else logits[t] / r
    # logit_bias is added last (SamplingBatchInfo.apply_logits_bias).
    for t, b in dict(params.logit_bias).items():
        logits[t] += b
    law = np.zeros(V)
    if params.temperature < SGLANG_GREEDY_EPS or params.greedy:
        best = max(range(V), key=lambda i: (logits[i], -i))
        law[best] = 1.0
        return law
    T = params.temperature
    top_k = params.top_k if params.top_k >= 1 else V
    x = [v / T for v in logits]
    m = max(x)
    w = [math.exp(v - m) if v > -math.inf else 0.0 for v in x]
    s = sum(w)
    p = [v / s for v in w]
    order = sorted(range(V), key=lambda i: -p[i])
    p_max = p[order[0]]
    kept = []
    before = 0.0
    for rank, i in enumerate(order):
        ok = rank < top_k and before <= params.top_p
        if params.min_p > 0 and p[i] < params.min_p * p_max:
            ok = False
        if ok and p[i] > 0:
            kept.append(i)
        before += p[i]
    total = sum(p[i] for i in kept)
    for i in kept:
        law[i] = p[i] / total
    return law


def random_case(rng: np.random.Generator):
    V = int(rng.integers(3, 9))
    table = (rng.standard_normal((V, V)) * rng.choice([0.5, 2.0, 4.0])).astype(np.float32)  # [V, V]
    if rng.random() < 0.3:
        table[rng.random((V, V)) < 0.2] = -np.inf
        table[np.arange(V), rng.integers(0, V, V)] = rng.standard_normal(V).astype(np.float32)  # one finite per row
    eos = int(rng.integers(0, V)) if rng.random() < 0.8 else None
    prompt = tuple(int(x) for x in rng.integers(0, V, int(rng.integers(1, 5))))
    out = tuple(int(x) for x in rng.integers(0, V, int(rng.integers(0, 4))))
    kw: dict = {"max_tokens": 6}
    kw["temperature"] = 0.0 if rng.random() < 0.15 else float(rng.choice([1.0, 0.5, 0.7, 1.5, 2.0]))
    if rng.random() < 0.4:
        kw["top_k"] = int(rng.integers(1, V + 1))
    if rng.random() < 0.4:
        kw["top_p"] = float(rng.choice([0.3, 0.5, 0.75, 0.9, 0.95]))
    if rng.random() < 0.4:
        kw["min_p"] = float(rng.choice([0.05, 0.1, 0.2, 0.5]))
    if rng.random() < 0.4:
        kw["repetition_penalty"] = float(rng.choice([0.5, 0.8, 1.3, 2.0]))
    if rng.random() < 0.4:
        kw["frequency_penalty"] = float(rng.choice([-1.0, 0.5, 1.5]))
    if rng.random() < 0.4:
        kw["presence_penalty"] = float(rng.choice([-0.5, 0.75, 2.0]))
    if rng.random() < 0.3:
        kw["logit_bias"] = {int(rng.integers(0, V)): float(rng.choice([-3.0, -1.0, 1.5, 4.0])) for _ in range(2)}
    if rng.random() < 0.3:
        kw["stop_token_ids"] = tuple(sorted({int(x) for x in rng.integers(0, V, 2)}))
    if rng.random() < 0.4:
        kw["min_tokens"] = int(rng.integers(1, 5))
    if rng.random() < 0.2:
        kw["ignore_eos"] = True
    return table, eos, prompt, out, SamplingParams(**kw)


def test_sglang_profile_is_registered():
    assert PROFILES["sglang"] is SGLangProfile
    assert get_profile("sglang").name == "sglang"


def test_sglang_profile_equals_sglang_sampler_on_random_rows():
    rng = np.random.default_rng(20261130)
    checked = skipped = 0
    for i in range(N_RANDOM_CASES):
        table, eos, prompt, out, params = random_case(rng)
        law = TargetLaw(table, prompt, params, eos_token_id=eos, profile="sglang")
        try:
            mine = law.conditional(out)  # [V]
        except AmbiguousSemantics:
            skipped += 1
            continue
        row = table[(prompt + out)[-1]].astype(np.float64)  # [V]
        theirs = sglang_next_token_law(row, prompt, out, params, eos)
        assert np.abs(mine - theirs).max() <= ATOL, (
            f"case {i}: params={params} eos={eos} prompt={prompt} out={out}\nrow={row}\nprofile={mine}\nSGLang ={theirs}"
        )
        checked += 1
    assert checked >= MIN_CHECKED_FRACTION * N_RANDOM_CASES, (checked, skipped)


def _row_case(row, prompt, out, **kw):
    V = len(row)
    table = np.tile(np.asarray(row, dtype=np.float32), (V, 1))  # every row the same: L[last] = row
    return table, tuple(prompt), tuple(out), SamplingParams(max_tokens=6, **kw)


# One example per documented difference from the "vllm" profile: the sglang law must
# match SGLang's and differ from vLLM's (by more than 1e-3), so dropping a difference
# from SGLangProfile breaks its test.
DIFFERS_FROM_VLLM = {
    # Token 0 is in the prompt, not in the output: vLLM penalises it, SGLang does not.
    "repetition_on_output_only": (_row_case([1.0, 0.5, 0.0, -1.0], (0,), (), repetition_penalty=2.0), None),
    # l = 1, one earlier occurrence, frequency 2: SGLang (1 - 2) * 1.5 = -1.5; vLLM 1 / 1.5 - 2 = -1.33.
    "frequency_before_repetition": (_row_case([1.0, 0.0, 0.0, 0.0], (3,), (0,), repetition_penalty=1.5, frequency_penalty=2.0), None),
    # l = 2, bias +2, repetition 2: SGLang 2 / 2 + 2 = 3; vLLM (2 + 2) / 2 = 2.
    "bias_after_penalties": (_row_case([2.0, 1.0, 0.0, 0.0], (3,), (0,), repetition_penalty=2.0, logit_bias={0: 2.0}), None),
    # p = (.5, .25, .12, .08, .05), top_k=2, top_p=0.6: SGLang decides top-p on p (mass
    # before token 1 is .5 <= .6: keep {0, 1}); vLLM on the top-2 renormalised
    # (2/3, 1/3): keeps {0}.
    "top_p_on_full_distribution": (_row_case(np.log([0.5, 0.25, 0.12, 0.08, 0.05]), (1,), (), top_k=2, top_p=0.6), None),
    # p = (.5, .3, .2), min_p=0.45, top_p=0.6: SGLang keeps {0, 1} (top-p: the mass
    # before token 1 is .5; min-p: .3 >= .225); vLLM: min-p keeps {0, 1}, then top-p on
    # the renormalised (.625, .375) keeps {0}.
    "top_p_not_renormalised_after_min_p": (_row_case(np.log([0.5, 0.3, 0.2]), (2,), (), top_p=0.6, min_p=0.45), None),
}


@pytest.mark.parametrize("name", sorted(DIFFERS_FROM_VLLM))
def test_sglang_profile_differs_from_vllm_where_sglang_does_and_matches_sglang(name):
    (table, prompt, out, params), eos = DIFFERS_FROM_VLLM[name]
    sg = TargetLaw(table, prompt, params, eos_token_id=eos, profile="sglang").conditional(out)
    vl = TargetLaw(table, prompt, params, eos_token_id=eos, profile="vllm").conditional(out)
    theirs = sglang_next_token_law(table[0].astype(np.float64), prompt, out, params, eos)
    assert np.abs(sg - theirs).max() <= ATOL, (sg, theirs)
    assert np.abs(sg - vl).max() > 1e-3, "the example must separate the two profiles"


def test_sglang_top_p_keeps_a_token_whose_preceding_mass_equals_top_p():
    """Exactly representable p = (.5, .25, .25), top_p = .5: the mass before token 1 is .5,
    so SGLang keeps it (``cumsum - p > top_p`` drops); token 2's tie with token 1 straddles
    the cut, so the profile must call that ambiguous rather than guess."""
    table, prompt, out, params = _row_case(np.log([0.5, 0.25, 0.25]), (0,), (), top_p=0.5)
    with pytest.raises(AmbiguousSemantics, match="top_p"):
        TargetLaw(table, prompt, params, eos_token_id=None, profile="sglang").conditional(out)
    # Without the tie: (.5, .3, .2) -> the mass before token 1 is .5 <= .5: kept.
    table, prompt, out, params = _row_case(np.log([0.5, 0.3, 0.2]), (0,), (), top_p=0.5 + 1e-3)
    law = TargetLaw(table, prompt, params, eos_token_id=None, profile="sglang").conditional(out)
    assert law[1] > 0 and law[2] == 0


def test_sglang_greedy_tie_at_the_maximum_is_ambiguous_but_vllm_takes_the_lowest_index():
    table, prompt, out, params = _row_case([1.0, 2.0, 2.0, 0.0], (0,), (), temperature=0.0)
    with pytest.raises(AmbiguousSemantics, match="greedy"):
        TargetLaw(table, prompt, params, eos_token_id=None, profile="sglang").conditional(out)
    assert TargetLaw(table, prompt, params, eos_token_id=None, profile="vllm").conditional(out)[1] == 1.0
    table, prompt, out, params = _row_case([1.0, 2.0, 1.5, 0.0], (0,), (), temperature=0.0)
    assert TargetLaw(table, prompt, params, eos_token_id=None, profile="sglang").conditional(out)[1] == 1.0


def test_sglang_min_tokens_masks_eos_even_under_ignore_eos():
    table, prompt, out, params = _row_case([0.0, 0.0, 0.0, 0.0], (0,), (), min_tokens=2, ignore_eos=True)
    law = TargetLaw(table, prompt, params, eos_token_id=3, profile="sglang")
    assert law.conditional(())[3] == 0.0
    assert law.conditional((1, 1))[3] == pytest.approx(0.25)


@pytest.mark.parametrize(
    "field,value",
    [("allowed_token_ids", (0, 1)), ("bad_words", ((1,),)), ("regex", "a+"), ("choice", ("ab",))],
)
def test_sglang_profile_rejects_options_sglang_does_not_have(field, value):
    law = TargetLaw(np.zeros((4, 4), np.float32), (0,), SamplingParams(**{field: value}), eos_token_id=3, profile="sglang")
    with pytest.raises(InvalidInput, match=field):
        law.conditional(())


def test_sglang_profile_rejects_thinking_budget():
    law = TargetLaw(np.zeros((4, 4), np.float32), (0,), SamplingParams(thinking_budget=1, think_end_token_id=2),
                    eos_token_id=3, profile="sglang")
    with pytest.raises(InvalidInput, match="thinking_budget"):
        law.enumerate()


def test_sglang_profile_laws_sum_to_one_and_enumerate():
    rng = np.random.default_rng(11)
    done = 0
    for _ in range(60):
        table, eos, prompt, _, params = random_case(rng)
        params = SamplingParams.from_json({**params.to_json(), "max_tokens": 3, "min_tokens": min(params.min_tokens, 3)})
        try:
            mu = TargetLaw(table, prompt, params, eos_token_id=eos, profile="sglang").enumerate()
        except AmbiguousSemantics:
            continue
        assert abs(mu.total - 1.0) < 1e-9
        done += 1
    assert done >= 30


def test_sglang_profile_stale_views_lag_min_tokens_and_penalties():
    """Stale processors (SPEC §3 condition 2): a lagging min_tokens view unmasks EOS later
    than the true count would; a lagging penalty view forgets the uncommitted tokens."""
    table = np.zeros((3, 3), np.float32)
    law = TargetLaw(table, (0,), SamplingParams(min_tokens=2, max_tokens=4), eos_token_id=2, profile="sglang")
    assert law.conditional((1, 1))[2] > 0.0
    assert law.conditional((1, 1), stale={"min_tokens": 1})[2] == 0.0
    pen = TargetLaw(table, (0,), SamplingParams(frequency_penalty=1.0, max_tokens=4), eos_token_id=2, profile="sglang")
    fresh = pen.conditional((1, 1))
    stale = pen.conditional((1, 1), stale={"penalties": 1})
    assert fresh[1] < stale[1] < 1 / 3
