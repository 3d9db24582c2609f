"""The interface of a semantics profile: a request's constants, a prefix's processor state,
and :class:`Profile`, which turns them into next-token distributions (the order of
operations of each engine: :mod:`specfuzz.oracle.profiles`; the whole story:
:mod:`specfuzz.oracle.semantics`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from specfuzz.errors import AmbiguousSemantics, InvalidInput

from .constraint import TokenDFA, compile_constraint
from .params import SamplingParams
from .steps import RowAmbiguity

# Names of the stateful processors whose view of the output can lag (``stale``).
PROCESSORS: tuple[str, ...] = ("min_tokens", "thinking", "penalties", "bad_words", "constraint")


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
