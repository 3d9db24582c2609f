"""The exact target law μ of a lookup-table model under an engine's sampling semantics.

:class:`TargetLaw` is the per-request context: a float table ``L[V, V]`` (next-token
logits after any context are ``L[last token]``), a prompt, :class:`SamplingParams`, the EOS
id and a semantics profile (:mod:`.semantics`, default ``"vllm"``). It gives

* :meth:`TargetLaw.conditional` / :meth:`TargetLaw.conditional_batch`: the exact
  next-token law ``P(x_t | x_<t)`` after an output prefix, optionally with stale
  processors (a processor that sees ``out[:t-ℓ]``, SPEC §3 condition 2);
* :meth:`TargetLaw.enumerate`: the whole law μ over complete outputs (token tuples
  including the stop token that ended them), by a level-by-level vectorised expansion of
  the prefixes of positive probability, as an :class:`OutputLaw`.

Numerical error. Probabilities are computed in float64 from the table's values. Let
``u = 2**-53``, ``A`` a bound on the magnitude of every processed, temperature-scaled
finite logit, ``A = (max|L| + max|bias| + |frequency| * max_tokens + |presence|) *
max(r, 1/r) / temperature`` (``r`` the repetition penalty). Each processed logit goes
through at most 8 roundings, so it is off by at most ``8uA``; a softmax entry
``exp(x_i - max x) / Σ`` is then off by at most ``u (32A + 2V + 5)`` absolutely (using
``|d| e^{-|d|} <= 1/e`` and a denominator ``>= 1``), and a product of at most
``max_tokens`` such factors, each in ``[0, 1]``, by at most the sum of their errors plus
one rounding per product. Hence :attr:`OutputLaw.error_bound`
``= max_tokens * u * (32A + 2V + 6)`` (greedy and forced steps are exact). Which tokens
are kept is decided exactly: every comparison float error could flip is reported as
:class:`~specfuzz.errors.AmbiguousSemantics` (its margins, 1e-6, dwarf the float64
error). Masses below the float64 range (``< 1e-308``) underflow to 0 and drop out of
the support.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Mapping, Sequence

import numpy as np

from specfuzz.errors import InvalidInput, SpecfuzzError

from .params import SamplingParams
from .semantics import PROCESSORS, History, Profile, RequestSpec, get_profile

# Scalar conditionals memoised per (prefix, stale) by each TargetLaw.
CONDITIONAL_CACHE_SIZE = 1 << 16
# Unit roundoff of float64.
FLOAT64_UNIT_ROUNDOFF = 2.0**-53
DEFAULT_MAX_OUTCOMES = 200_000


class OutputSpaceTooLarge(SpecfuzzError):
    """The support of μ has more outcomes than the enumeration may hold."""


# --------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------


def _validate_table(table: object) -> np.ndarray:
    """The table as float64 [V, V]; InvalidInput naming the first bad value."""
    if not isinstance(table, np.ndarray):
        raise InvalidInput("table", type(table).__name__, "a numpy array [V, V] of floats")
    if table.dtype.kind not in "fiu" or table.dtype == np.bool_:
        raise InvalidInput("table.dtype", str(table.dtype), "a real floating (or integer) dtype")
    if table.ndim != 2 or table.shape[0] != table.shape[1] or table.shape[0] < 2:
        raise InvalidInput("table.shape", tuple(table.shape), "a square 2-D shape (V, V) with V >= 2")
    t64 = table.astype(np.float64)  # [V, V] exact for float16/32/64
    bad = np.isnan(t64) | (t64 == np.inf)  # [V, V]
    if bad.any():
        i, j = (int(x) for x in np.argwhere(bad)[0])
        raise InvalidInput(f"table[{i}, {j}]", float(t64[i, j]), "a finite logit or -inf")
    t64.setflags(write=False)
    return t64


def _token_id(name: str, tok: object, V: int) -> int:
    if isinstance(tok, (bool, np.bool_)) or not isinstance(tok, (int, np.integer)):
        raise InvalidInput(name, tok, f"an integer token id in [0, {V})")
    if not 0 <= int(tok) < V:
        raise InvalidInput(name, int(tok), f"a token id in [0, {V})")
    return int(tok)


def _validate_prompt(prompt: object, V: int) -> tuple[int, ...]:
    if isinstance(prompt, (str, bytes)) or not isinstance(prompt, (Sequence, np.ndarray)):
        raise InvalidInput("prompt", prompt, "a non-empty sequence of token ids")
    if len(prompt) == 0:
        raise InvalidInput("prompt", tuple(prompt), "a non-empty sequence of token ids")
    return tuple(_token_id("prompt token", t, V) for t in prompt)


# --------------------------------------------------------------------------------------
# The exact law over complete outputs
# --------------------------------------------------------------------------------------


class OutputLaw:
    """μ over complete outputs: ``outputs[i]`` has probability ``probs[i]``.

    Outputs are ordered by length, then lexicographically. Every probability is within
    :attr:`error_bound` of the exact one; ``probs`` sums to 1 within rounding.
    """

    def __init__(
        self,
        outputs: list[tuple[int, ...]],
        probs: np.ndarray,
        *,
        vocab_size: int,
        max_tokens: int,
        stop_mask: np.ndarray,
        error_bound: float,
    ) -> None:
        self.outputs = outputs
        self.probs = np.asarray(probs, dtype=np.float64)  # [M]
        self.probs.setflags(write=False)
        self.vocab_size = int(vocab_size)
        self.max_tokens = int(max_tokens)
        self._stop = np.asarray(stop_mask, dtype=bool)  # [V]
        self.error_bound = float(error_bound)
        self._index: dict[tuple[int, ...], int] | None = None
        self._prefix_mass: dict[tuple[int, ...], float] | None = None

    def __len__(self) -> int:
        return len(self.outputs)

    def __repr__(self) -> str:
        return f"OutputLaw(support={len(self.outputs)}, V={self.vocab_size}, max_tokens={self.max_tokens}, error_bound={self.error_bound:.2g})"

    @property
    def total(self) -> float:
        return float(self.probs.sum())

    def _idx(self) -> dict[tuple[int, ...], int]:
        if self._index is None:
            self._index = {o: i for i, o in enumerate(self.outputs)}
        return self._index

    def prob(self, out: Sequence[int]) -> float:
        """μ(out); 0 for anything outside the support."""
        i = self._idx().get(tuple(int(v) for v in out))
        return 0.0 if i is None else float(self.probs[i])

    def as_dict(self) -> dict[tuple[int, ...], float]:
        return {o: float(p) for o, p in zip(self.outputs, self.probs)}

    def padded(self) -> np.ndarray:
        """Outputs as [M, max_tokens] int64, -1 after each output's end."""
        arr = np.full((len(self.outputs), self.max_tokens), -1, dtype=np.int64)  # [M, T]
        for i, o in enumerate(self.outputs):
            arr[i, : len(o)] = o
        return arr

    def marginal(self, position: int) -> np.ndarray:
        """Law of the token at ``position`` (0-based) [V + 1]; the last entry is the
        probability that the output ended before ``position``."""
        if isinstance(position, bool) or not isinstance(position, (int, np.integer)) or position < 0:
            raise InvalidInput("position", position, "an integer >= 0")
        V = self.vocab_size
        res = np.zeros(V + 1)  # [V+1]
        if position >= self.max_tokens:
            res[V] = self.total
            return res
        col = self.padded()[:, position]  # [M]
        col = np.where(col < 0, V, col)  # [M], V = "ended"
        np.add.at(res, col, self.probs)
        return res

    def _masses(self) -> dict[tuple[int, ...], float]:
        if self._prefix_mass is None:
            mass: dict[tuple[int, ...], float] = {}
            for o, p in zip(self.outputs, self.probs.tolist()):
                for k in range(len(o) + 1):
                    key = o[:k]
                    mass[key] = mass.get(key, 0.0) + p
            self._prefix_mass = mass
        return self._prefix_mass

    def conditional(self, prefix: Sequence[int]) -> np.ndarray:
        """P(next token | prefix) [V] from the enumerated masses (prefix must have
        positive probability and not be a complete output)."""
        prefix = tuple(int(v) for v in prefix)
        masses = self._masses()
        total = masses.get(prefix, 0.0) - self.prob(prefix)
        if total <= 0.0:
            raise InvalidInput("prefix", prefix, "a non-terminal output prefix with positive probability under μ")
        res = np.array([masses.get(prefix + (v,), 0.0) for v in range(self.vocab_size)])  # [V]
        return res / total

    def is_terminal(self, out: Sequence[int]) -> bool:
        """``out`` ends with a stop token or has ``max_tokens`` tokens."""
        return len(out) >= self.max_tokens or (len(out) > 0 and bool(self._stop[int(out[-1])]))


# --------------------------------------------------------------------------------------
# The per-request law
# --------------------------------------------------------------------------------------


class TargetLaw:
    """The exact target law of one request to a table model.

    Satisfies the statistics protocol: ``vocab_size``, ``conditional(prefix) -> [V]``,
    ``is_terminal(output) -> bool``.
    """

    def __init__(
        self,
        table: np.ndarray,
        prompt: Sequence[int],
        params: SamplingParams,
        *,
        eos_token_id: int | None,
        profile: "str | Profile" = "vllm",
    ) -> None:
        self.table = _validate_table(table)  # [V, V] float64
        V = int(self.table.shape[0])
        self.vocab_size = V
        self.prompt = _validate_prompt(prompt, V)
        if not isinstance(params, SamplingParams):
            raise InvalidInput("params", type(params).__name__, "a SamplingParams")
        params.check_vocab(V)
        self.params = params
        self.eos_token_id = None if eos_token_id is None else _token_id("eos_token_id", eos_token_id, V)
        self.profile = get_profile(profile)
        self.spec = RequestSpec.build(self.table, self.prompt, params, self.eos_token_id)
        self._cache: OrderedDict[tuple, np.ndarray] = OrderedDict()

    def __repr__(self) -> str:
        return f"TargetLaw(V={self.vocab_size}, prompt={self.prompt}, eos={self.eos_token_id}, profile={self.profile.name!r}, params={self.params})"

    def untruncated(self) -> "TargetLaw":
        """This request's law without top-k, top-p and min-p (``self`` when none is set)."""
        p = self.params
        if p.top_k in (-1, 0) and p.top_p == 1.0 and p.min_p == 0.0:
            return self
        plain = dataclasses.replace(p, top_k=-1, top_p=1.0, min_p=0.0)
        return TargetLaw(self.table, self.prompt, plain, eos_token_id=self.eos_token_id, profile=self.profile)

    # -- stopping ----------------------------------------------------------------------

    @property
    def stop_mask(self) -> np.ndarray:
        """[V] bool: tokens that end the output."""
        return self.spec.stop_mask

    def is_stop_token(self, v: int) -> bool:
        return 0 <= int(v) < self.vocab_size and bool(self.spec.stop_mask[int(v)])

    def is_terminal(self, out: Sequence[int]) -> bool:
        """``out`` ends with a stop token or has ``max_tokens`` tokens."""
        return len(out) >= self.params.max_tokens or (len(out) > 0 and self.is_stop_token(out[-1]))

    # -- error bound ---------------------------------------------------------------------

    @property
    def step_error_bound(self) -> float:
        """Absolute error bound on one conditional probability (module docstring)."""
        p = self.params
        if p.greedy:
            return 0.0
        finite = self.table[np.isfinite(self.table)]
        lmax = float(np.abs(finite).max()) if finite.size else 0.0
        bmax = max((abs(float(b)) for b in dict(p.logit_bias).values()), default=0.0)
        r = p.repetition_penalty
        A = (lmax + bmax + abs(p.frequency_penalty) * p.max_tokens + abs(p.presence_penalty)) * max(r, 1.0 / r) / p.temperature
        return FLOAT64_UNIT_ROUNDOFF * (32.0 * A + 2.0 * self.vocab_size + 5.0)

    @property
    def error_bound(self) -> float:
        """Absolute error bound on the probability of any complete output."""
        return self.params.max_tokens * (self.step_error_bound + FLOAT64_UNIT_ROUNDOFF)

    # -- conditionals ----------------------------------------------------------------------

    def _lags(self, stale: Mapping[str, int], t: int) -> tuple[tuple[str, int], ...]:
        """Validated, canonical (name, lag) pairs with lag > 0."""
        if not stale:
            return ()
        items = []
        for name, lag in dict(stale).items():
            if name not in self.profile.processors:
                raise InvalidInput("stale processor", name, f"one of {list(self.profile.processors)}")
            if isinstance(lag, (bool, np.bool_)) or not isinstance(lag, (int, np.integer)) or not 0 <= int(lag) <= t:
                raise InvalidInput(f"stale[{name!r}]", lag, f"an integer lag in [0, {t}] (the prefix length)")
            if lag:
                items.append((name, int(lag)))
        return tuple(sorted(items))

    def _views(self, outs: np.ndarray, lags: tuple[tuple[str, int], ...], full: History | None = None) -> dict[str, History]:
        t = outs.shape[1]
        full = full if full is not None else History.from_outs(self.spec, outs)
        views = {name: full for name in PROCESSORS}
        by_lag: dict[int, History] = {}
        for name, lag in lags:
            if lag not in by_lag:
                by_lag[lag] = History.from_outs(self.spec, outs[:, : t - lag])
            views[name] = by_lag[lag]
        return views

    def conditional_batch(self, outs: np.ndarray, stale: Mapping[str, int] = {}) -> np.ndarray:
        """Next-token laws [N, V] after each row of ``outs`` [N, t] (one common length t)."""
        arr = np.asarray(outs)  # [N, t]
        if arr.ndim != 2:
            raise InvalidInput("outs.shape", tuple(arr.shape), "a 2-D [N, t] array of token ids")
        if arr.size and (arr.dtype.kind not in "iu"):
            raise InvalidInput("outs.dtype", str(arr.dtype), "an integer dtype")
        arr = arr.astype(np.int64, copy=False)  # [N, t]
        if arr.size and (arr.min() < 0 or arr.max() >= self.vocab_size):
            bad = arr[(arr < 0) | (arr >= self.vocab_size)][0]
            raise InvalidInput("output token", int(bad), f"a token id in [0, {self.vocab_size})")
        lags = self._lags(stale, arr.shape[1])
        if arr.shape[0] == 0:
            return np.zeros((0, self.vocab_size))  # [0, V]
        return self.profile.next_token_probs(self.spec, arr, self._views(arr, lags))

    def conditional(self, out: Sequence[int], stale: Mapping[str, int] = {}) -> np.ndarray:
        """Next-token law [V] after the output prefix ``out`` (memoised, read-only)."""
        key_out = tuple(_token_id("output token", v, self.vocab_size) for v in out)
        lags = self._lags(stale, len(key_out))
        key = (key_out, lags)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        arr = np.asarray(key_out, dtype=np.int64).reshape(1, len(key_out))  # [1, t]
        row = self.profile.next_token_probs(self.spec, arr, self._views(arr, lags))[0]  # [V]
        row.setflags(write=False)
        self._cache[key] = row
        if len(self._cache) > CONDITIONAL_CACHE_SIZE:
            self._cache.popitem(last=False)
        return row

    # -- enumeration -----------------------------------------------------------------------

    def enumerate(self, max_outcomes: int = DEFAULT_MAX_OUTCOMES) -> OutputLaw:
        """μ exactly, expanding all prefixes of one length at once.

        Raises :class:`OutputSpaceTooLarge` as soon as the support is known to exceed
        ``max_outcomes`` (completed outputs plus live prefixes, each of which completes to
        at least one output), and AmbiguousSemantics if a prefix of positive probability
        has an ambiguous next-token law.
        """
        if isinstance(max_outcomes, bool) or not isinstance(max_outcomes, (int, np.integer)) or max_outcomes < 1:
            raise InvalidInput("max_outcomes", max_outcomes, "an integer >= 1")
        spec, T, V = self.spec, self.params.max_tokens, self.vocab_size
        hist = History.from_outs(spec, np.zeros((1, 0), dtype=np.int64))  # one empty prefix
        mass = np.ones(1)  # [N] probability of each live prefix
        done_outs: list[np.ndarray] = []  # each [K, t+1]
        done_probs: list[np.ndarray] = []  # each [K]
        n_done = 0
        for t in range(T):
            probs = self.profile.next_token_probs(spec, hist.outs, {name: hist for name in PROCESSORS})  # [N, V]
            child = mass[:, None] * probs  # [N, V]
            parent, token = np.nonzero(child > 0.0)  # [K], [K] in (parent, token) order
            cmass = child[parent, token]  # [K]
            terminal = spec.stop_mask[token] if t + 1 < T else np.ones(len(token), dtype=bool)  # [K]
            n_term = int(terminal.sum())
            n_live = len(token) - n_term
            if n_done + n_term + n_live > max_outcomes:
                raise OutputSpaceTooLarge(
                    f"the support of μ has more than max_outcomes={max_outcomes} outputs "
                    f"({n_done + n_term} complete and {n_live} live prefixes after {t + 1} tokens; V={V}, max_tokens={T})"
                )
            if n_term:
                tp = parent[terminal]
                done_outs.append(np.concatenate([hist.outs[tp], token[terminal][:, None]], axis=1))
                done_probs.append(cmass[terminal])
                n_done += n_term
            if not n_live:
                break
            live = ~terminal
            hist = hist.extend(spec, parent[live], token[live])
            mass = cmass[live]
        outputs: list[tuple[int, ...]] = []
        for arr in done_outs:
            outputs.extend(map(tuple, arr.tolist()))
        probs_all = np.concatenate(done_probs) if done_probs else np.zeros(0)  # [M]
        return OutputLaw(
            outputs, probs_all, vocab_size=V, max_tokens=T, stop_mask=spec.stop_mask, error_bound=self.error_bound
        )
