"""Token constraints (``regex`` / ``choice``) as a deterministic automaton over token ids.

A table model's ordinary token ``v`` is the one character ``token_text(v)``
(:mod:`specfuzz.tablegen.vocab`), so a constraint on the output *text* is a constraint on
token sequences. This module compiles it once per request into a :class:`TokenDFA`:
integer states ``0..S-1``, a transition table ``next_state[S, V]`` whose entry is ``-1``
when the token is disallowed in that state, and ``accepting[S]``. The sampling law then
masks, for a whole batch of prefixes at once, ``next_state[state] < 0``.

Semantics (what a grammar bitmask such as vLLM's xgrammar backend applies):

* A text token is allowed iff the text extended by its character can still be completed
  into a full match by *some* string (character-level liveness, not restricted to the
  characters the vocabulary can produce: a grammar engine does not know which characters
  the model can emit). Consequently a state can allow no token at all (e.g. ``a[xz]``
  over a vocabulary without ``x``/``z``); the law reports that as all-masked.
* EOS (``eos_token_id``, the only token without a text role) is allowed iff the current
  text fully matches; it moves to the absorbing state ``done`` where only EOS is allowed
  again (relevant with ``ignore_eos``). An accepting state with no live extension
  therefore allows EOS only.
* Tokens beyond the alphabet (``id >= MAX_VOCAB``) have no text and are never allowed.
* A token forced past the mask (the thinking budget's end-of-thinking token) that the
  constraint disallows moves to the absorbing ``dead`` state, where nothing is allowed.
* ``choice`` is the alternation of its literal strings (compiled as a trie, no escaping).

Regexes are compiled with ``interegular`` (full-match semantics, Python ``re`` syntax
without anchors, look-arounds or back-references); an unsupported construct raises
:class:`~specfuzz.errors.InvalidInput`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Hashable

import numpy as np

from specfuzz.errors import InvalidInput
from specfuzz.tablegen.vocab import MAX_VOCAB, token_text

# Entry of ``next_state`` for a token the constraint disallows.
DISALLOWED = -1
# Bound on the number of automaton states reachable through vocabulary tokens.
MAX_DFA_STATES = 100_000


@dataclass(frozen=True, eq=False)
class TokenDFA:
    """A token-level automaton. ``states`` arguments are ``int64`` arrays of state ids."""

    next_state: np.ndarray  # [S, V] int64, DISALLOWED where the token is masked
    accepting: np.ndarray  # [S] bool: the text so far is a full match (or EOS was emitted)
    initial: int
    done: int  # after EOS: only EOS allowed
    dead: int  # after a forced disallowed token: nothing allowed

    @property
    def num_states(self) -> int:
        return int(self.next_state.shape[0])

    @property
    def vocab_size(self) -> int:
        return int(self.next_state.shape[1])

    def allowed(self, states: np.ndarray) -> np.ndarray:
        """Allowed-token mask for each state. ``states`` [N] -> [N, V] bool."""
        return self.next_state[states] >= 0

    def advance(self, states: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """State after appending ``tokens`` [N] to prefixes in ``states`` [N] -> [N].

        A disallowed token (only possible when forced) leads to :attr:`dead`.
        """
        nxt = self.next_state[states, tokens]  # [N]
        return np.where(nxt >= 0, nxt, self.dead)

    def run(self, outs: np.ndarray) -> np.ndarray:
        """State after each row of ``outs`` [N, t] (from :attr:`initial`) -> [N]."""
        states = np.full(outs.shape[0], self.initial, dtype=np.int64)  # [N]
        for j in range(outs.shape[1]):
            states = self.advance(states, outs[:, j])
        return states


def compile_constraint(
    regex: str | None, choice: tuple[str, ...] | None, vocab_size: int, eos_token_id: int | None
) -> TokenDFA | None:
    """The automaton of a request's constraint, or ``None`` when it has none."""
    if regex is not None:
        return regex_dfa(regex, vocab_size, eos_token_id)
    if choice is not None:
        return choice_dfa(tuple(choice), vocab_size, eos_token_id)
    return None


@lru_cache(maxsize=256)
def regex_dfa(pattern: str, vocab_size: int, eos_token_id: int | None) -> TokenDFA:
    """Compile ``pattern`` (full-match semantics) to a :class:`TokenDFA` (cached)."""
    import interegular
    from interegular.fsm import anything_else

    try:
        fsm = interegular.parse_pattern(pattern).to_fsm()
    except Exception as exc:  # interegular raises several unrelated types for unsupported syntax
        raise InvalidInput(
            "regex", pattern, f"a regex interegular can compile (no anchors, look-arounds, back-references): {type(exc).__name__}: {exc}"
        ) from None
    transitions: dict = {s: dict(fsm.map.get(s, {})) for s in fsm.states}
    # Character-level liveness: states from which some final state is reachable by any
    # symbol, ``anything_else`` included.
    reverse: dict = {s: set() for s in fsm.states}
    for s, row in transitions.items():
        for dest in row.values():
            reverse.setdefault(dest, set()).add(s)
    live = set(fsm.finals)
    queue = deque(live)
    while queue:
        s = queue.popleft()
        for src in reverse.get(s, ()):
            if src not in live:
                live.add(src)
                queue.append(src)
    other = fsm.alphabet[anything_else]

    def step(state: Hashable, ch: str) -> Hashable | None:
        sym = fsm.alphabet[ch] if ch in fsm.alphabet else other
        dest = transitions[state].get(sym)
        return dest if dest is not None and dest in live else None

    return _build(fsm.initial if fsm.initial in live else None, step, lambda s: s in fsm.finals, vocab_size, eos_token_id)


@lru_cache(maxsize=256)
def choice_dfa(choices: tuple[str, ...], vocab_size: int, eos_token_id: int | None) -> TokenDFA:
    """The automaton of "the output text is one of ``choices``" (a trie; cached)."""
    prefixes = {c[:i] for c in choices for i in range(len(c) + 1)}
    full = set(choices)

    def step(state: Hashable, ch: str) -> Hashable | None:
        nxt = str(state) + ch
        return nxt if nxt in prefixes else None

    return _build("", step, lambda s: s in full, vocab_size, eos_token_id)


def _build(
    initial: Hashable | None,
    step: Callable[[Hashable, str], Hashable | None],
    is_final: Callable[[Hashable], bool],
    vocab_size: int,
    eos_token_id: int | None,
) -> TokenDFA:
    """Explore the states reachable through vocabulary tokens and tabulate them.

    ``step(state, ch)`` is the live successor of a character-level state or ``None``;
    ``initial`` is ``None`` when the language is empty (every token is then masked).
    """
    texts = [token_text(v) if v < MAX_VOCAB and v != eos_token_id else None for v in range(vocab_size)]
    index: dict[Hashable, int] = {}
    rows: list[list[int]] = []
    finals: list[bool] = []
    order: list[Hashable] = []

    def intern(state: Hashable) -> int:
        if state not in index:
            if len(index) >= MAX_DFA_STATES:
                raise InvalidInput("regex", "<constraint>", f"a constraint with at most {MAX_DFA_STATES} reachable automaton states")
            index[state] = len(order)
            order.append(state)
        return index[state]

    if initial is not None:
        intern(initial)
    i = 0
    while i < len(order):
        state = order[i]
        row = [DISALLOWED] * vocab_size
        for v, ch in enumerate(texts):
            if ch is not None:
                dest = step(state, ch)
                if dest is not None:
                    row[v] = intern(dest)
        rows.append(row)
        finals.append(bool(is_final(state)))
        i += 1
    n = len(order)
    done, dead = n, n + 1
    next_state = np.full((n + 2, vocab_size), DISALLOWED, dtype=np.int64)  # [S, V]
    if n:
        next_state[:n] = np.asarray(rows, dtype=np.int64)
    accepting = np.zeros(n + 2, dtype=bool)  # [S]
    accepting[:n] = finals
    accepting[done] = True
    if eos_token_id is not None and 0 <= eos_token_id < vocab_size:
        next_state[:n, eos_token_id] = np.where(accepting[:n], done, DISALLOWED)
        next_state[done, eos_token_id] = done
    # An empty language: start in ``dead`` so that nothing is allowed.
    init = 0 if n else dead
    next_state.setflags(write=False)
    accepting.setflags(write=False)
    return TokenDFA(next_state=next_state, accepting=accepting, initial=init, done=done, dead=dead)
