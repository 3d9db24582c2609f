"""Speculation events: which parts of a speculative decoder a case exercises, exactly.

A bug in a speculative decoder lives in some *event* of the generation process: a rejection
after two accepted drafts, a bonus token after a full round, a stop token accepted in the
middle of a round, a penalty that should see the drafts before its position, a residual
(p - q)+ with one token of support. A case in which an event has probability 1e-6 cannot
expose a bug that lives there, however many samples it draws; so for every case the oracle
computes, exactly and under lossless speculation, each event's probability of happening at
least once while one output is generated, and its expected number of occurrences.

The events are recorded by the reference sampler's rounds
(:class:`~specfuzz.oracle.speculative.SpeculativeProcess` with ``record_events=True``) and
their law is computed by :func:`event_law`: by an analytic walk over accepted prefixes for
chain drafts with token verification (the common case, where enumerating every sampled
draft would be slow), by enumerating the round (:class:`~specfuzz.oracle.drivers.ExactDriver`)
for block verification and trees. Both give the output law too, which equals μ (tests check
both against μ, against each other and against Monte Carlo of the reference sampler).

:data:`EVENTS` is the catalogue; names with ``@i`` carry a position (``reject@2``: the draft
at position 2 rejected). :func:`expressible` says which events a method can reach on an
engine at all, so that coverage marks the others "not expressible", not "uncovered".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np

from specfuzz.errors import AmbiguousSemantics
from specfuzz.oracle.drivers import EventLaw, ExactDriver, propagate
from specfuzz.oracle.speculative import (
    CHAIN_DRAFT_METHODS, CHAIN_METHODS, METHODS, RoundResult, SpeculativeProcess, _normalise,
)

# States (distinct committed prefixes per round) beyond which a case's events are not computed.
DEFAULT_MAX_STATES = 20_000
# Round replays a case's event law may take when its rounds are enumerated (block verification,
# trees, n-gram trees: :class:`~specfuzz.oracle.drivers.ExactDriver`); past it the case's events
# are not computed (about 3 s of one core; a block-verified K=4 draft over 6 tokens can take
# minutes).
DEFAULT_MAX_REPLAYS = 20_000


@dataclass(frozen=True)
class Event:
    """One kind of speculation event. ``name`` ends in ``@i`` for a positional family."""

    name: str
    kind: str
    doc: str


# The catalogue, by kind; docs/events.md lists it (generated from here).
EVENTS: tuple[Event, ...] = (
    Event("reject@i", "position", "chain: the draft at position i is rejected after i-1 accepted ones "
          "(block verification: the longest accepted prefix has i-1 drafts)"),
    Event("bonus@k", "position", "chain: all k drafts of a round are accepted and a bonus token is drawn from p at position k+1"),
    Event("tree_reject@d", "tree", "tree: no child of a node at depth d-1 is accepted; the token is drawn from p without those children"),
    Event("tree_leaf@d", "tree", "tree: a leaf d levels deep is reached; the bonus token is drawn from p there"),
    Event("tree_sibling", "tree", "tree: a node with two or more children does not accept its first child"),
    Event("tree_unfilled", "tree", "tree: a visited node has fewer children than the tree's top-k (or the tree is empty)"),
    Event("residual_single", "residual", "a rejection's residual (p - q)+ has one token of support"),
    Event("residual_small", "residual", "a rejection's residual (p - q)+ has total mass below 0.05"),
    Event("block_weight", "block", "block verification: a draft before the last has p/q < 1, so the weight w carried to the "
          "later positions' tests and residuals is below 1"),
    Event("stop_mid_round", "stop", "a stop token is accepted as a draft with more drafts after it, before max_tokens"),
    Event("max_tokens_cut", "stop", "a draft is verified at the output's last allowed position with more drafts after it"),
    Event("lag:min_tokens", "processor", "at a position after uncommitted drafts, min_tokens' mask differs from the committed output's"),
    Event("lag:thinking", "processor", "at a position after uncommitted drafts, the thinking budget's forcing differs from the committed output's"),
    Event("lag:penalties", "processor", "at a position after uncommitted drafts, the penalties differ from the committed output's"),
    Event("lag:bad_words", "processor", "at a position after uncommitted drafts, the bad-words mask differs from the committed output's"),
    Event("lag:constraint", "processor", "at a position after uncommitted drafts, the grammar mask differs from the committed output's"),
    Event("rejected_in_history", "processor", "a draft is rejected under a penalty and another token is emitted; the output goes on"),
    Event("draft_truncated", "truncation", "a draft is tested that top-k/top-p/min-p removed from p (p(d) = 0 < p_untruncated(d))"),
    Event("no_draft", "proposal", "a round has no draft token (n-gram without a match, empty tree)"),
    Event("short_draft", "proposal", "an n-gram proposal is shorter than K"),
    Event("outside_draft", "vocab", "p has mass on target tokens a narrower draft vocabulary cannot propose"),
    Event("narrow_lag", "vocab", "a draft after the first position is tested under a narrower draft vocabulary"),
    Event("coin_reused", "uniform", "an acceptance test at a draft slot that an earlier round of the output also tested"),
    Event("coin_repeat", "uniform", "a round makes two or more probabilistic acceptance tests"),
)
EVENT_KINDS: tuple[str, ...] = tuple(dict.fromkeys(e.kind for e in EVENTS))
_BY_NAME = {e.name: e for e in EVENTS}
_POSITIONAL = re.compile(r"^(reject|bonus|tree_reject|tree_leaf)@(\d+)$")
# Events that need two or more draft positions in one round.
_MULTI = frozenset({"stop_mid_round", "max_tokens_cut", "narrow_lag", "coin_repeat", "block_weight"})


def event_info(name: str) -> Event:
    """The catalogue entry of an event name (``reject@3`` -> ``reject@i``)."""
    m = _POSITIONAL.match(name)
    key = {"reject": "reject@i", "bonus": "bonus@k", "tree_reject": "tree_reject@d", "tree_leaf": "tree_leaf@d"}[m.group(1)] if m else name
    if key not in _BY_NAME:
        raise KeyError(name)
    return _BY_NAME[key]


def position(name: str) -> int | None:
    m = _POSITIONAL.match(name)
    return int(m.group(2)) if m else None


def multi_position(name: str) -> bool:
    """Whether the event needs a round that covers two or more positions (a rejection or
    bonus after an accepted draft, a tree two levels deep, a processor that lags a draft)."""
    pos = position(name)
    if pos is not None:
        return pos >= 2
    return name in _MULTI or name.startswith("lag:")


# -- which events an engine's method can reach -----------------------------------------

# Sampling features (SamplingParams fields) each processor event needs.
_PROCESSOR_FEATURES: Mapping[str, tuple[str, ...]] = {
    "lag:min_tokens": ("min_tokens",),
    "lag:thinking": ("thinking_budget",),
    "lag:penalties": ("repetition_penalty", "frequency_penalty", "presence_penalty"),
    "lag:bad_words": ("bad_words",),
    "lag:constraint": ("regex", "choice"),
    "rejected_in_history": ("repetition_penalty", "frequency_penalty", "presence_penalty"),
    "draft_truncated": ("top_k", "top_p", "min_p"),
}


def expressible(method: str, k_max: int, *, verify: Iterable[str] = ("token",), sampling: Iterable[str] = (),
                narrower_draft: bool = False, stop_tokens: bool = True) -> dict[str, str | None]:
    """For each catalogue event (positional ones expanded to 1..k_max), ``None`` when
    ``method`` can reach it on the engine, else why not.

    ``k_max``: the largest K (chain length, tree depth) the engine lets the campaign draw;
    ``verify``: the verification modes it offers; ``sampling``: the sampling features it
    honours with speculation on; ``narrower_draft``: whether a draft vocabulary narrower
    than the target's can be drawn; ``stop_tokens``: EOS or stop_token_ids can be drawn."""
    sampling = set(sampling)
    chain = method in CHAIN_METHODS
    tree = method in ("eagle_tree", "ngram_tree")
    drafted = method in CHAIN_DRAFT_METHODS or method == "eagle_tree"
    ngram = method in ("ngram", "ngram_tree")
    out: dict[str, str | None] = {}
    for e in EVENTS:
        why: str | None = None
        if method not in METHODS:
            why = f"{method} is not modelled by the reference sampler"
        elif e.name in ("reject@i", "bonus@k", "block_weight", "coin_reused", "coin_repeat", "short_draft") and not chain:
            why = f"{method} is not a chain method"
        elif e.kind == "tree" and not tree:
            why = f"{method} is not a tree method"
        elif e.name == "block_weight" and "block" not in verify:
            why = "the engine offers no block verification for this method"
        elif e.name in ("stop_mid_round", "max_tokens_cut", "coin_repeat", "narrow_lag", "short_draft") and k_max < 2:
            why = f"needs K >= 2; the engine allows K <= {k_max} for {method}"
        elif e.name == "stop_mid_round" and not stop_tokens:
            why = "no stop token can be drawn"
        elif e.name in _PROCESSOR_FEATURES and not sampling & set(_PROCESSOR_FEATURES[e.name]):
            why = f"the engine does not honour {'/'.join(_PROCESSOR_FEATURES[e.name])} with speculation"
        elif e.name == "no_draft" and not ngram:
            why = f"{method} always drafts"
        elif e.kind == "vocab" and not (drafted and narrower_draft):
            why = "needs a draft vocabulary narrower than the target's"
        if e.name.endswith(("@i", "@k", "@d")):
            stem = e.name.split("@")[0]
            for i in range(1, max(1, k_max) + 1):
                out[f"{stem}@{i}"] = why
        else:
            out[e.name] = why
    return out


# -- the exact event law of a case ------------------------------------------------------


def event_law(process: SpeculativeProcess, max_states: int = DEFAULT_MAX_STATES, max_replays: int | None = None) -> EventLaw:
    """The exact law of a process and, when it records events (``record_events=True``), its
    event law: by the analytic walk for a lossless chain with token verification, else by
    enumerating its rounds (at most ``max_replays`` round replays in all, when given).

    Raises RuntimeError when the process has more than ``max_states`` states per step, or
    needs more replays."""
    spec = process.spec
    if spec.method in CHAIN_METHODS and spec.verify == "token" and spec.inject is None:
        return propagate(lambda committed, coined: _chain_outcomes(process, committed, coined), frozenset(), max_states)
    return ExactDriver(process, max_states=max_states, max_replays=max_replays).event_law()


def case_events(case, profile: str = "vllm", max_states: int = DEFAULT_MAX_STATES,
                max_replays: int | None = DEFAULT_MAX_REPLAYS) -> EventLaw | None:
    """The event law of a :class:`~specfuzz.case.Case` under lossless speculation with an
    engine's semantics profile; None when the case does not speculate, its method is not
    modelled, its law is ambiguous or its process is too large to enumerate (more than
    ``max_states`` states per step, or ``max_replays`` round replays)."""
    import dataclasses

    spec = case.spec
    if spec is None or spec.method not in METHODS:
        return None
    if spec.inject is not None:
        spec = dataclasses.replace(spec, inject=None)
    try:
        law = case.target_law(profile)
        proc = SpeculativeProcess(law, case.prompt, case.params.max_tokens, spec, case.draft, case.params.temperature,
                                  record_events=True)
        return event_law(proc, max_states, max_replays)
    except (RuntimeError, AmbiguousSemantics):
        return None


def _chain_outcomes(proc: SpeculativeProcess, committed: tuple[int, ...], coined: frozenset[int]):
    """One round of a lossless chain with token verification, analytically: accepted drafts
    are the emitted tokens, so the round's state after i acceptances is its emitted prefix;
    a draft d is accepted with mass min(p(d), q(d)) and rejected with (q(d) - p(d))+. Yields
    (prob, emitted, done, events, coined after the round), with the same events, counted the
    same way, as :meth:`SpeculativeProcess._token_verify` records."""
    spec = proc.spec
    K = spec.num_speculative_tokens
    W, V, T = proc._W, proc.V, proc.max_tokens

    def done(out: tuple[int, ...]) -> bool:
        t = out[-1]
        return t < 0 or t >= V or len(out) >= T or proc.target.is_terminal(out)

    def at(out: tuple[int, ...], lag: int, p: np.ndarray, verifying: bool) -> tuple[str, ...]:
        scratch = RoundResult()
        proc._at_position(scratch, out, lag, p, verifying)
        return tuple(scratch.events)

    pre: tuple[str, ...] = ()
    if spec.method in CHAIN_DRAFT_METHODS:
        n, drafts = K, None
    else:
        drafts = proc.ngram_proposal(proc.prompt + committed)
        n = len(drafts)
        pre = ("no_draft",) if n == 0 else ("short_draft",) if n < K else ()
    # (prob, emitted, events, slots tested by a coin this round)
    partial: list[tuple[float, tuple[int, ...], tuple[str, ...], tuple[int, ...]]] = [(1.0, (), pre, ())]
    for i in range(n):
        nxt = []
        for pr, e, ev, coins in partial:
            out = committed + e
            p = proc.p_at(out, i)  # [W]
            pos_ev = at(out, i, p, True) + (("max_tokens_cut",) if len(out) + 1 >= T and i < n - 1 else ())
            if drafts is not None or spec.draft_sampling == "greedy":
                if drafts is not None:
                    d = drafts[i]
                else:
                    qd = proc.q_at((proc.prompt + out)[-1], ())  # [V_draft]
                    d = int(proc._d2t[int(np.argmax(qd))])
                one = np.zeros(W)
                one[d] = 1.0
                cands = [(d, 1.0, one)]
            else:
                qd = proc.q_at((proc.prompt + out)[-1], ())  # [V_draft]
                qrow = proc._to_target_width(qd)  # [W]
                cands = [(int(proc._d2t[j]), float(qd[j]), qrow) for j in np.flatnonzero(qd > 0)]
            for d, wd, qv in cands:
                pd, qdd = float(p[d]), float(qv[d])
                ev_d = pos_ev + (("draft_truncated",) if qdd > 0 and proc._truncated(out, d, p) else ())
                acc = 0.0 if qdd == 0 else min(1.0, pd / qdd)
                c_ev: tuple[str, ...] = ()
                coins_d = coins
                if 0 < acc < 1.0:
                    c_ev = (("coin_reused",) if i in coined else ()) + (("coin_repeat",) if coins else ())
                    coins_d = coins + (i,)
                if wd * acc > 0:
                    e2 = e + (d,)
                    evs = ev + ev_d + c_ev
                    if i < n - 1 and proc._is_stop(d) and len(out) + 1 < T:
                        evs += ("stop_mid_round",)
                    if done(committed + e2):
                        yield pr * wd * acc, e2, True, evs, coined | frozenset(coins_d)
                    else:
                        nxt.append((pr * wd * acc, e2, evs, coins_d))
                r = wd * (1.0 - acc)
                if r > 0:
                    raw = np.maximum(p - qv, 0.0)  # [W]
                    scratch = RoundResult()
                    proc._residual_events(scratch, raw)
                    resid = _normalise(raw)
                    if resid is None:
                        resid = p
                    evs = ev + ev_d + c_ev + (f"reject@{i + 1}",) + tuple(scratch.events)
                    for t in np.flatnonzero(resid > 0):
                        t = int(t)
                        e2 = e + (t,)
                        fin = done(committed + e2)
                        extra = ("rejected_in_history",) if proc._penalised and t != d and not fin else ()
                        yield pr * r * float(resid[t]), e2, fin, evs + extra, coined | frozenset(coins_d)
        partial = nxt
    for pr, e, ev, coins in partial:
        out = committed + e
        p = proc.p_at(out, n)  # [W]
        evs = ev + at(out, n, p, False) + ((f"bonus@{n}",) if n else ())
        for t in np.flatnonzero(p > 0):
            t = int(t)
            e2 = e + (t,)
            yield pr * float(p[t]), e2, done(committed + e2), evs, coined | frozenset(coins)


# -- the docs' catalogue -----------------------------------------------------------------

BEGIN = "<!-- events:begin (python -m specfuzz.oracle.events docs/events.md) -->"
END = "<!-- events:end -->"


def markdown() -> str:
    """The catalogue of events, and the bench's mutants and controls, as Markdown tables."""
    from specfuzz.oracle.mutants import CONTROLS, MUTANTS

    acting: dict[str, list[str]] = {}
    for m, (ev, _) in MUTANTS.items():
        base = ev.rstrip("+")
        acting.setdefault(event_info(base if "@" not in base else base.split("@")[0] + "@2").name, []).append(m)
    catalogue = {"coin_reused": "N1", "lag:min_tokens": "N2", "lag:thinking": "N3", "tree_unfilled": "N4",
                 "outside_draft": "N5", "short_draft": "N6", "narrow_lag": "N7"}
    lines = ["| event | kind | what happens | multi-position | bugs that act there |", "|---|---|---|---|---|"]
    for e in EVENTS:
        multi = "from position 2" if e.name.endswith(("@i", "@k", "@d")) else ("yes" if multi_position(e.name) else "no")
        bugs = ", ".join(([catalogue[e.name]] if e.name in catalogue else []) + acting.get(e.name, []))
        lines.append(f"| `{e.name}` | {e.kind} | {e.doc} | {multi} | {bugs or '—'} |")
    lines += ["", "| mutant | acts in | what it does |", "|---|---|---|"]
    lines += [f"| {m} | `{ev}` | {what} |" for m, (ev, what) in MUTANTS.items()]
    lines += ["", "| control | what it changes (the law stays μ) |", "|---|---|"]
    lines += [f"| {c} | {what} |" for c, what in CONTROLS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Rewrite the tables between BEGIN and END in a Markdown file (``--check``: exit 1 if stale)."""
    import argparse
    from pathlib import Path

    ap = argparse.ArgumentParser(prog="python -m specfuzz.oracle.events", description=main.__doc__)
    ap.add_argument("path")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    path = Path(a.path)
    text = path.read_text()
    if BEGIN not in text or END not in text:
        print(f"{path}: no {BEGIN!r} ... {END!r} markers", file=__import__("sys").stderr)
        return 2
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{markdown()}\n{END}{tail}"
    if a.check:
        return 0 if new == text else 1
    path.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
