"""The engines' semantics profiles: vLLM's, HF transformers' and SGLang's order of operations.

Each :class:`~specfuzz.oracle.profile.Profile` here composes the steps of
:mod:`specfuzz.oracle.steps` in its engine's order; :mod:`specfuzz.oracle.semantics` lists
the orders side by side and :func:`~specfuzz.oracle.semantics.get_profile` picks one by name.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from .params import SamplingParams
from .profile import PROCESSORS, History, Profile, RequestSpec
from .steps import (
    NEAR_TIE_RTOL, NEG_INF, TOP_P_ATOL, RowAmbiguity, check_rows, add_bias, apply_min_p, apply_penalties, apply_top_k,
    apply_top_p, greedy_probs, mask_allowed, mask_bad_words, mask_constraint, mask_min_tokens, random_probs, softmax,
    thinking_forced,
)

def _vllm_min_tokens_mask(spec: RequestSpec) -> np.ndarray:
    """vLLM masks EOS during min_tokens whether or not ignore_eos is set. [V] bool"""
    if spec.eos_token_id is None or spec.min_tokens_mask[spec.eos_token_id]:
        return spec.min_tokens_mask
    mask = spec.min_tokens_mask.copy()
    mask[spec.eos_token_id] = True
    return mask


class VLLMProfile(Profile):
    """vLLM V1 sampler order (see the module docstring for the exact list)."""

    name = "vllm"

    def _probs(self, spec: RequestSpec, outs: np.ndarray, views: Mapping[str, History]) -> np.ndarray:
        p = spec.params
        N, t = outs.shape
        V = spec.vocab_size
        last = outs[:, -1] if t else np.full(N, spec.prompt[-1], dtype=np.int64)  # [N]
        logits = spec.table[last]  # [N, V] (fancy indexing copies)
        if spec.dfa is not None:
            logits = mask_constraint(logits, spec.dfa, views["constraint"].dfa_state)
        if spec.allowed_mask is not None:
            logits = mask_allowed(logits, spec.allowed_mask)
        if spec.bad_words:
            logits = mask_bad_words(logits, spec.bad_words, views["bad_words"].outs)
        if p.min_tokens:
            logits = mask_min_tokens(logits, _vllm_min_tokens_mask(spec), views["min_tokens"].length, p.min_tokens)
        if spec.bias is not None:
            logits = add_bias(logits, spec.bias)
        if spec.has_penalties:
            pen = views["penalties"]
            logits = apply_penalties(logits, spec.prompt_seen, pen.counts, p.repetition_penalty, p.frequency_penalty, p.presence_penalty)
        forced = np.zeros(N, dtype=bool)  # [N]
        if p.thinking_budget is not None:
            th = views["thinking"]
            forced = thinking_forced(th.think_ended, th.length, p.thinking_budget)
        free = np.flatnonzero(~forced)  # [F] rows the sampler decides
        probs = np.zeros((N, V))  # [N, V]
        if forced.any():
            probs[forced, p.think_end_token_id] = 1.0
        if len(free):
            sub = logits if len(free) == N else logits[free]  # [F, V]
            try:
                check_rows(~np.isfinite(sub).any(axis=1), lambda r: "every token is masked (constraint / allowed_token_ids / bad_words / min_tokens)")
                # Unmodified table values compare exactly in the engine too.
                exact = spec.bias is None and not spec.has_penalties
                probs[free] = greedy_probs(sub, exact) if p.greedy else random_probs(sub, p, exact)
            except RowAmbiguity as exc:
                raise RowAmbiguity(int(free[exc.row]), exc.message) from None
        return probs


# --------------------------------------------------------------------------------------
# HF transformers
# --------------------------------------------------------------------------------------

# SamplingParams fields HF transformers' generate() has no equivalent for (value when off).
HF_UNSUPPORTED: dict[str, object] = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "thinking_budget": None,
    "think_end_token_id": None,
    "regex": None,
    "choice": None,
}


def hf_bad_words(spec: RequestSpec) -> tuple[tuple[np.ndarray, int], ...]:
    """The bad words HF's ``NoBadWordsLogitsProcessor`` keeps: it drops every one-token
    word that is one of its ``eos_token_id`` list, which the adapter fills with the stop
    set (EOS unless ``ignore_eos``, plus ``stop_token_ids``)."""
    return tuple((prefix, last) for prefix, last in spec.bad_words if len(prefix) or not spec.stop_mask[last])


def mask_bad_words_with_prompt(
    logits: np.ndarray, words: tuple[tuple[np.ndarray, int], ...], prompt: tuple[int, ...], outs: np.ndarray
) -> np.ndarray:
    """HF bad words: mask ``w[-1]`` where ``prompt + out`` (not the output alone) ends
    with ``w[:-1]``; a prefix longer than ``prompt + out`` never matches. [N, V] -> [N, V]"""
    N = outs.shape[0]
    ctx = np.concatenate([np.broadcast_to(np.asarray(prompt, dtype=np.int64), (N, len(prompt))), outs], axis=1)  # [N, P+t]
    return mask_bad_words(logits, words, ctx)


def hf_random_probs(logits: np.ndarray, params: SamplingParams, exact: bool = False) -> np.ndarray:
    """HF's sampling warpers in ``_get_logits_processor`` order: temperature, top-k,
    top-p, min-p, then the softmax of ``_sample``. [N, V] -> [N, V]

    Top-k keeps ties at the k-th value (``scores < topk(scores, k)[0][..., -1]``); top-p
    is the same rule as vLLM's (ascending sort, mask ``cumsum <= 1 - top_p``, keep the
    largest); min-p masks ``softmax(x) < min_p * max softmax(x)`` on what top-k and top-p
    left, i.e. ``exp(x - max x) < min_p`` over the kept entries.
    """
    x = logits / params.temperature if params.temperature != 1.0 else logits  # [N, V]
    if params.top_k >= 1:
        x = apply_top_k(x, params.top_k, exact=exact and params.temperature == 1.0)
    if params.top_p < 1.0:
        x = apply_top_p(x, params.top_p)
    if params.min_p > 0.0:
        x = apply_min_p(x, params.min_p)
    return softmax(x)


class HFProfile(Profile):
    """HF transformers 5.x ``generate()`` as driven by specfuzz's HF adapter.

    Order of operations (``GenerationMixin._get_logits_processor`` of transformers 5.19,
    then ``_sample``), for an output prefix ``out`` of length ``t``; the adapter passes
    ``eos_token_id = [EOS unless ignore_eos] + stop_token_ids`` ("the stop set"):

    1. ``logits = L[last]`` (the engine computes in float32; here float64).
    2. ``sequence_bias`` (``SequenceBiasLogitsProcessor``; the adapter maps
       ``logit_bias`` to one-token sequences): added.
    3. ``repetition_penalty`` (``RepetitionPenaltyLogitsProcessor``) on every token of
       ``input_ids`` = prompt ∪ out: ``l * r`` if ``l < 0`` else ``l / r``.
    4. ``bad_words_ids`` (``NoBadWordsLogitsProcessor``): for each word ``w`` mask
       ``w[-1]`` if ``prompt + out`` ends with ``w[:-1]`` (the prefix may lie in the
       prompt or straddle it); one-token words that are in the stop set are dropped by
       HF (they never mask anything).
    5. ``min_new_tokens`` (``MinNewTokensLengthLogitsProcessor``): while ``t <
       min_tokens`` mask the stop set.
    6. ``allowed_token_ids``: the adapter passes the other tokens as ``suppress_tokens``
       (``SuppressTokensLogitsProcessor``): every other token masked.
    7. Greedy (``temperature < 1e-5``; the adapter sets ``do_sample=False``): point mass
       on the argmax (``torch.argmax``: lowest index among exact ties).
    8. Sampling: temperature (only when ``!= 1``), top-k, top-p, **min-p last**, softmax.

    Steps 2-6 commute (bias and penalty keep ``-inf`` at ``-inf``), so only step 8's
    order and what the stateful steps see differ from vLLM's. Differences from the
    ``"vllm"`` profile: bad words also match across the prompt, and drop one-token stop
    words; min-p comes after top-k/top-p (vLLM: before); no frequency / presence
    penalties, grammar constraints or thinking budgets (``InvalidInput`` naming the field).

    Ambiguity rules are the vLLM profile's (same helper functions). Stale processors
    (:data:`HF_PROCESSORS`) are supported for the law of a buggy engine.
    """

    name = "hf"
    # Every processor name is accepted for ``stale`` (so bug laws of every class can be
    # computed); "thinking" and "constraint" are inert: HF has neither option.
    processors: tuple[str, ...] = PROCESSORS
    unsupported = HF_UNSUPPORTED
    engine_label = "HF transformers"

    def _probs(self, spec: RequestSpec, outs: np.ndarray, views: Mapping[str, History]) -> np.ndarray:
        p = spec.params
        N, t = outs.shape
        last = outs[:, -1] if t else np.full(N, spec.prompt[-1], dtype=np.int64)  # [N]
        logits = spec.table[last]  # [N, V] (a copy)
        if spec.bias is not None:
            logits = add_bias(logits, spec.bias)
        if p.repetition_penalty != 1.0:
            pen = views["penalties"]
            logits = apply_penalties(logits, spec.prompt_seen, pen.counts, p.repetition_penalty, 0.0, 0.0)
        words = hf_bad_words(spec)
        if words:
            logits = mask_bad_words_with_prompt(logits, words, spec.prompt, views["bad_words"].outs)
        if p.min_tokens:
            logits = mask_min_tokens(logits, spec.min_tokens_mask, views["min_tokens"].length, p.min_tokens)
        if spec.allowed_mask is not None:
            logits = mask_allowed(logits, spec.allowed_mask)
        check_rows(~np.isfinite(logits).any(axis=1), lambda r: "every token is masked (allowed_token_ids / bad_words / min_tokens)")
        exact = spec.bias is None and p.repetition_penalty == 1.0
        return greedy_probs(logits, exact) if p.greedy else hf_random_probs(logits, p, exact)


# The stateful processors HF transformers has (the others are inert under "hf").
HF_PROCESSORS: tuple[str, ...] = ("min_tokens", "penalties", "bad_words")


# --------------------------------------------------------------------------------------
# SGLang
# --------------------------------------------------------------------------------------

# SamplingParams fields SGLang's sampler has no equivalent for (value when off).
SGLANG_UNSUPPORTED: dict[str, object] = {
    "allowed_token_ids": None,
    "bad_words": (),
    "thinking_budget": None,
    "think_end_token_id": None,
    "regex": None,
    "choice": None,
}


def sglang_penalties(logits: np.ndarray, counts: np.ndarray, repetition: float, frequency: float, presence: float) -> np.ndarray:
    """SGLang's penalizers: ``l -= frequency * count_out(v)``, ``l -= presence *
    [count_out(v) > 0]`` (additive, accumulated first), then repetition ``r`` on the
    tokens of the *output* only (``l * r`` if ``l < 0`` else ``l / r``). [N, V] -> [N, V]

    ``counts`` [N, V]: occurrences in the output.
    """
    out = logits
    present = counts > 0  # [N, V]
    if frequency != 0.0:
        out = out - frequency * counts
    if presence != 0.0:
        out = out - presence * present
    if repetition != 1.0:
        out = np.where(present, np.where(out < 0, out * repetition, out / repetition), out)
    return out


def sglang_top_p_keep(x: np.ndarray, top_p: float) -> np.ndarray:
    """SGLang's top-p on the whole softmax of ``x`` [N, V]: sort descending and keep a
    token iff the probability mass *before* it in that order is ``<= top_p`` (the first
    token always). Returns the kept set [N, V] bool.

    Ambiguous (float32 or sort order could decide): a kept-or-dropped token of positive
    probability whose mass before it is within ``TOP_P_ATOL`` of ``top_p``; a cut between
    two (near-)tied probabilities (which of them survives depends on the sort).
    """
    N, V = x.shape
    ps = softmax(x)  # [N, V]
    order = np.argsort(-ps, axis=1, kind="stable")  # [N, V] descending
    psd = np.take_along_axis(ps, order, axis=1)  # [N, V]
    before = np.cumsum(psd, axis=1) - psd  # [N, V] exclusive prefix sums
    keep_sorted = before <= top_p  # [N, V] a prefix of each row (before is non-decreasing)
    keep_sorted[:, 0] = True
    close = (psd[:, 1:] > 0) & (np.abs(before[:, 1:] - top_p) <= TOP_P_ATOL)  # [N, V-1]
    check_rows(
        close.any(axis=1),
        lambda r: f"top_p={top_p!r}: the probability mass {float(before[r, 1:][close[r]][0])!r} before a token is within {TOP_P_ATOL:g} of top_p",
    )
    m = keep_sorted.sum(axis=1)  # [N] number kept, >= 1
    rows = np.flatnonzero(m < V)  # [R] rows with something dropped
    a = psd[rows, m[rows] - 1]  # [R] last kept
    b = psd[rows, m[rows]]  # [R] first dropped
    tie = np.zeros(N, dtype=bool)  # [N]
    tie[rows] = (b > 0) & (a - b <= NEAR_TIE_RTOL * a)
    check_rows(
        tie,
        lambda r: f"top_p={top_p!r}: the cut falls between (near-)tied probabilities {float(psd[r, m[r] - 1])!r} and {float(psd[r, m[r]])!r} (the kept set depends on sort order)",
    )
    keep = np.empty_like(keep_sorted)  # [N, V] in token order
    np.put_along_axis(keep, order, keep_sorted, axis=1)
    return keep


def sglang_random_probs(logits: np.ndarray, params: SamplingParams, exact: bool = False) -> np.ndarray:
    """Temperature, then top-k ∩ top-p ∩ min-p on the one softmax, then renormalise. [N, V] -> [N, V]

    ``exact``: ``logits`` are unmodified table values (no bias, no penalties).
    """
    x = logits / params.temperature  # [N, V]
    keep = np.isfinite(x)  # [N, V]
    if params.min_p > 0.0:
        keep &= np.isfinite(apply_min_p(x, params.min_p))
    if params.top_k >= 1:
        keep &= np.isfinite(apply_top_k(x, params.top_k, exact=exact and params.temperature == 1.0, ambiguous_ties=True))
    if params.top_p < 1.0:
        keep &= sglang_top_p_keep(x, params.top_p)
    return softmax(np.where(keep, x, NEG_INF))


def sglang_greedy_probs(logits: np.ndarray, exact: bool = False) -> np.ndarray:
    """Point mass on the argmax; an exact tie at the maximum is ambiguous. [N, V] -> [N, V]"""
    top = logits.max(axis=1)  # [N]
    n_top = (logits == top[:, None]).sum(axis=1)  # [N]
    check_rows(
        n_top > 1,
        lambda r: f"greedy: {int(n_top[r])} tokens tie at the maximum logit {float(top[r])!r}; SGLang's greedy is "
        "top_k=1 through a descending sort in mixed batches (which tied token comes first is unspecified), argmax only "
        "when every request of the batch is greedy",
    )
    return greedy_probs(logits, exact)


class SGLangProfile(Profile):
    """SGLang 0.5.17 with ``sampling_backend="pytorch"``, speculation off.

    For an output prefix ``out`` of length ``t``; sources are SGLang 0.5.17 files under
    ``python/sglang/srt``:

    1. ``logits = L[last]`` (float32 in the engine: ``LogitsProcessor._copy_logits_to_buffer``).
    2. Additive penalizers (``penaltylib``: frequency, presence, min_new_tokens; summed
       into one tensor by ``SamplingBatchInfo.update_penalties`` and added first by
       ``apply_logits_bias``): ``l -= frequency * count_out(v)``, ``l -= presence *
       [count_out(v) > 0]``, and while ``t < min_tokens`` ``-inf`` on ``stop_token_ids``
       and EOS -- EOS even under ``ignore_eos`` (``BatchedMinNewTokensPenalizer`` puts
       the tokenizer's EOS in the set unconditionally, like vLLM).
    3. Repetition penalty (``BatchedRepetitionPenalizer``, multiplicative, applied after
       the additive ones): on tokens of the *output* only (its penalizer cumulates output
       tokens; the prompt is never counted): ``l * r`` if ``l < 0`` else ``l / r``.
    4. ``logit_bias`` added (after the penalties, ``apply_logits_bias``).
    5. Greedy (``temperature < 1e-5`` here; SGLang turns ``temperature < 1e-6`` into
       ``top_k=1``): point mass on the argmax. An exact tie at the maximum is ambiguous:
       ``Sampler.forward`` takes ``torch.argmax`` only when the whole batch is greedy,
       otherwise ``top_k=1`` through ``probs.sort(descending=True)``.
    6. Random (``top_k_top_p_min_p_sampling_from_probs_torch``): ``p = softmax(l / T)``;
       sort descending; drop positions ``>= top_k``; drop tokens whose mass *before*
       them in the sort exceeds ``top_p`` (cumulative sums of the whole ``p``, computed
       before the top-k cut, never renormalised); drop ``p < min_p * max p``; sample
       from what is left (``torch.multinomial`` renormalises).

    Differences from the ``"vllm"`` profile: repetition penalises output tokens only
    (vLLM: prompt ∪ output); frequency/presence come before repetition and logit bias
    after all penalties (vLLM: bias, repetition, frequency, presence); top-p is decided on
    the full distribution, not on the one renormalised after min-p / top-k, and a token
    whose preceding mass equals ``top_p`` is kept; greedy ties are ambiguous (vLLM: lowest
    index); no allowed tokens, bad words, grammar constraints or thinking budgets
    (``InvalidInput`` naming the field). Top-k keeps exactly ``k`` sorted positions, so a
    tie across the k-th value is ambiguous (as in the vLLM profile).

    Not modelled (effects below what sampling can detect): in a batch where any request
    uses top-k/top-p/min-p, every request goes through the sorted path, whose float32
    cumulative sum can exceed ``top_p = 1`` before tokens of probability below ~1e-7.

    Read in the source and deliberately not modelled (an engine deviating from its
    documented semantics is a calibration finding, not a profile): under the overlap
    scheduler (SGLang's default, ``Scheduler.event_loop_overlap``) the penalizers are fed
    in ``ScheduleBatch.prepare_for_decode`` before the previous step's result is
    processed, so ``cumulate_penalty_output_tokens`` reads ``req.output_ids`` one step
    late: the first decode step counts the last *prompt* token (``origin_input_ids[-1]``)
    and every later step misses the newest output token. ``disable_overlap_schedule=True``
    takes the synchronous loop, which feeds them the right tokens.
    """

    name = "sglang"
    processors: tuple[str, ...] = PROCESSORS
    unsupported = SGLANG_UNSUPPORTED
    engine_label = "SGLang"

    def _probs(self, spec: RequestSpec, outs: np.ndarray, views: Mapping[str, History]) -> np.ndarray:
        p = spec.params
        N, t = outs.shape
        last = outs[:, -1] if t else np.full(N, spec.prompt[-1], dtype=np.int64)  # [N]
        logits = spec.table[last]  # [N, V] (a copy)
        if p.min_tokens:
            logits = mask_min_tokens(logits, _vllm_min_tokens_mask(spec), views["min_tokens"].length, p.min_tokens)
        if spec.has_penalties:
            logits = sglang_penalties(logits, views["penalties"].counts, p.repetition_penalty, p.frequency_penalty, p.presence_penalty)
        if spec.bias is not None:
            logits = add_bias(logits, spec.bias)
        check_rows(~np.isfinite(logits).any(axis=1), lambda r: "every token is masked (min_tokens)")
        exact = spec.bias is None and not spec.has_penalties
        return sglang_greedy_probs(logits, exact) if p.greedy else sglang_random_probs(logits, p, exact)
