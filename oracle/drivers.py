"""Drivers of the reference speculative sampler (:class:`~specfuzz.oracle.speculative.SpeculativeProcess`).

A round asks for randomness through :class:`~specfuzz.oracle.speculative.Draw` and
:class:`~specfuzz.oracle.speculative.Coin` requests only; a driver answers them:

* :class:`MonteCarloDriver` with a numpy RNG: the reference engine's samples;
* :class:`ExactDriver` by enumerating every branch with its exact probability: the law of
  the whole generation process (:meth:`ExactDriver.law`), and, for a process that records
  events, the exact probability of every speculation event (:meth:`ExactDriver.event_law`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from specfuzz.oracle.speculative import ROUND_SLOT, Coin, Draw, RoundGen, RoundResult, SpeculativeProcess


class _Branch(Exception):
    """Raised inside a replay when the round asks for a choice past the script."""


def _run_round(gen: RoundGen, answer: Callable[[object], object]) -> None:
    try:
        req = next(gen)
        while True:
            req = gen.send(answer(req))
    except StopIteration:
        return


@dataclass
class SampleStats:
    rounds: int = 0
    proposed: int = 0
    accepted: int = 0


@dataclass
class EventLaw:
    """The exact law of a speculative process and of its speculation events.

    ``law``: output -> probability; ``probability[e]``: P(event ``e`` happens at least once
    while one output is generated); ``expected[e]``: its expected number of occurrences per
    output. Events of probability 0 are absent.
    """

    law: dict[tuple[int, ...], float]
    probability: dict[str, float] = field(default_factory=dict)
    expected: dict[str, float] = field(default_factory=dict)


class MonteCarloDriver:
    """Runs a :class:`SpeculativeProcess` with real randomness: the reference engine."""

    def __init__(self, process: SpeculativeProcess, rng: np.random.Generator) -> None:
        self.process = process
        self.rng = rng
        self.stats = SampleStats()
        self.last_events: Counter[str] = Counter()  # events of the last sample (record_events)

    def sample(self) -> tuple[int, ...]:
        rng = self.rng
        slots: dict[int, float] = {}

        def answer(req: object) -> object:
            if isinstance(req, Draw):
                c = np.cumsum(req.probs)
                return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(c) - 1))
            assert isinstance(req, Coin)
            if req.slot is None:
                u = rng.random()
            else:
                if req.slot not in slots:
                    slots[req.slot] = rng.random()
                u = slots[req.slot]
            return u < req.threshold

        committed: tuple[int, ...] = ()
        coined: frozenset[int] = frozenset()
        self.last_events = Counter()
        while True:
            res = RoundResult()
            _run_round(self.process.round(committed, res, coined), answer)
            slots.pop(ROUND_SLOT, None)
            self.stats.rounds += 1
            self.stats.proposed += res.proposed
            self.stats.accepted += res.accepted
            self.last_events.update(res.events)
            coined = coined | frozenset(res.coined)
            committed = committed + tuple(res.emitted)
            if res.done:
                return committed

    def sample_many(self, n: int) -> list[tuple[int, ...]]:
        return [self.sample() for _ in range(n)]


class ExactDriver:
    """Computes the exact law of a :class:`SpeculativeProcess` over complete outputs.

    States between rounds are (committed output, per-slot uniform intervals, and, for a
    process that records events, the slots tested by a coin so far); a round is enumerated
    by replaying it along every branch of its random requests.
    """

    def __init__(self, process: SpeculativeProcess, max_states: int = 2_000_000, max_replays: int | None = None) -> None:
        self.process = process
        self.max_states = max_states
        # Replays of rounds over the whole law (None: no limit): a caller that has a cheaper way
        # to sample (the reference engine simulates) gives up early on a large process.
        self.max_replays = max_replays
        self._replays = 0

    def _round_outcomes(self, committed, intervals, coined: frozenset[int] = frozenset()):
        """[(prob, emitted tuple, done, new intervals, events, new coined)] for one round from a state."""
        results = []
        stack: list[list[object]] = [[]]
        replays = 0
        while stack:
            script = stack.pop()
            replays += 1
            self._replays += 1
            if replays > self.max_states or (self.max_replays is not None and self._replays > self.max_replays):
                raise RuntimeError("speculative process too large to enumerate exactly")
            ivs = dict(intervals)
            prob = 1.0
            pos = 0
            branch: list | None = None

            def answer(req: object) -> object:
                nonlocal pos, prob, branch
                if pos < len(script):
                    a = script[pos]
                    pos += 1
                    if isinstance(req, Draw):
                        prob *= float(req.probs[a])
                    else:
                        t = req.threshold
                        if req.slot is None:
                            prob *= t if a else 1.0 - t
                        else:
                            lo, hi = ivs.get(req.slot, (0.0, 1.0))
                            cut = min(max(t, lo), hi)
                            width = hi - lo
                            if a:
                                prob *= (cut - lo) / width
                                ivs[req.slot] = (lo, cut)
                            else:
                                prob *= (hi - cut) / width
                                ivs[req.slot] = (cut, hi)
                    return a
                # Past the script: list this request's options with positive probability.
                if isinstance(req, Draw):
                    branch = [int(i) for i in np.flatnonzero(req.probs > 0)]
                else:
                    t = req.threshold
                    if req.slot is None:
                        branch = [a for a, pa in ((True, t), (False, 1.0 - t)) if pa > 0]
                    else:
                        lo, hi = ivs.get(req.slot, (0.0, 1.0))
                        cut = min(max(t, lo), hi)
                        branch = [a for a, pa in ((True, cut - lo), (False, hi - cut)) if pa > 0]
                raise _Branch

            res = RoundResult()
            gen = self.process.round(committed, res, coined)
            try:
                _run_round(gen, answer)
            except _Branch:
                for a in reversed(branch):
                    stack.append(script + [a])
                continue
            if prob > 0:
                ivs.pop(ROUND_SLOT, None)
                new_coined = coined | frozenset(res.coined) if self.process.record_events else coined
                results.append((prob, tuple(res.emitted), res.done, tuple(sorted(ivs.items())), tuple(res.events), new_coined))
        return results

    def law(self) -> dict[tuple[int, ...], float]:
        return self.event_law().law

    def event_law(self) -> EventLaw:
        """The law, and (for a process with ``record_events``) every event's exact probability
        of happening at least once per output and its expected count per output."""
        return propagate(lambda committed, extra: self._outcomes(committed, *extra), ((), frozenset()), self.max_states)

    def _outcomes(self, committed, ivs, coined):
        for prob, emitted, done, new_ivs, events, new_coined in self._round_outcomes(committed, ivs, coined):
            yield prob, emitted, done, events, (new_ivs, new_coined)


def propagate(outcomes: Callable, start_extra, max_states: int) -> EventLaw:
    """The law and event law of a round-by-round process.

    ``outcomes(committed, extra)`` lists one round's outcomes from a state as
    ``(prob, emitted, done, events, next extra)``; states are (committed output, extra).
    Each state carries, besides its mass, the mass of its paths that have already seen each
    event: an outcome with event ``e`` moves all of the state's mass into "seen e"."""
    # state -> [mass, {event: mass of the state's paths that saw it}]
    frontier: dict[tuple, list] = {((), start_extra): [1.0, {}]}
    final: dict[tuple[int, ...], float] = {}
    seen_final: dict[str, float] = {}
    expected: dict[str, float] = {}
    tallies: dict[tuple, tuple[frozenset, tuple]] = {}  # events tuple -> (its set, its counts)
    while frontier:
        nxt: dict[tuple, list] = {}
        for (committed, extra), (mass, seen) in frontier.items():
            for prob, emitted, done, events, new_extra in outcomes(committed, extra):
                m = mass * prob
                if events:
                    tally = tallies.get(events)
                    if tally is None:
                        tally = tallies[events] = (frozenset(events), tuple(Counter(events).items()))
                    here, counts = tally
                    for e, c in counts:
                        expected[e] = expected.get(e, 0.0) + m * c
                    new_seen = {e: s * prob for e, s in seen.items() if e not in here}
                    for e in here:
                        new_seen[e] = m
                else:
                    new_seen = {e: s * prob for e, s in seen.items()}
                out = committed + emitted
                if done:
                    final[out] = final.get(out, 0.0) + m
                    for e, s in new_seen.items():
                        seen_final[e] = seen_final.get(e, 0.0) + s
                else:
                    key = (out, new_extra)
                    slot = nxt.get(key)
                    if slot is None:
                        nxt[key] = [m, new_seen]
                    else:
                        slot[0] += m
                        for e, s in new_seen.items():
                            slot[1][e] = slot[1].get(e, 0.0) + s
        if len(nxt) > max_states:
            raise RuntimeError("speculative process has too many states to enumerate exactly")
        frontier = nxt
    return EventLaw(final, {e: p for e, p in seen_final.items() if p > 0}, {e: x for e, x in expected.items() if x > 0})
