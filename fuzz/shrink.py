"""Shrink a stored corpus entry on its engine: ``specfuzz shrink ENTRY``.

A campaign shrinks what it finds with Hypothesis, but an entry can reach the corpus
unshrunk or half-shrunk: a crash met while shrinking something else, one stored by an
older specfuzz, a Hypothesis shrink that gave up on a slow engine (each candidate is an
engine start). Hypothesis cannot resume from a stored case, so this is a greedy
delta-debugging pass over the case itself: try a smaller candidate, keep it when the
entry still reproduces, start over from it, until no candidate reproduces or the budget
ends. Candidates, largest reductions first: drop vocabulary tokens (tables, prompt and
every token id remapped; every token a failing run never emitted at once, then one token
at a time), shorten the prompt, fewer output tokens, smaller K / tree /
n-gram window, each non-default sampling setting back to its default, no EOS, all-zero
tables.

A crash entry that records the batch it crashed in (``extra.batch_patterns``: every request
pattern of that engine call) is shrunk as a family, its patterns mixed in each engine call as
they were found (:func:`shrink_family`): first drop one pattern, then the reductions above,
those of shared things (vocabulary, K / tree / n-gram window, EOS, tables) applied to every
pattern at once, those of one pattern's request (prompt, max_tokens, sampling settings) to one
pattern at a time. A family of one pattern is shrunk exactly as a single case.

"Reproduces": for a crash, the same crash (kind and message, numbers aside) on a fresh
engine process; for a finding or a calibration entry, a failing verdict (attributed to
the same class, unless the entry's was unknown) within ``samples`` at level ``alpha``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from specfuzz.case import Case
from specfuzz.errors import AmbiguousSemantics, InvalidInput, SpecfuzzError
from specfuzz.fuzz.families import crash_key, entry_crash_key, family_key
from specfuzz.oracle.params import SamplingParams

# Sampling fields that hold target token ids (remapped when a token is dropped).
_TOKEN_FIELDS = ("stop_token_ids", "allowed_token_ids", "think_end_token_id")


def _key(case: Case) -> str:
    return family_key([case])


def _ok(make: Callable[[], Case]) -> Case | None:
    try:
        return make()
    except (InvalidInput, ValueError, TypeError, KeyError):
        return None


def drop_token(case: Case, v: int) -> Case | None:
    """``case`` without vocabulary token ``v`` (ids above it move down by one), or None
    when ``v`` is referenced (prompt, EOS, a stop/allowed/bias/bad-word id, a draft id map
    entry that is its only column) or the vocabulary would fall below 2 tokens."""
    V = case.vocab_size
    if V <= 2 or v in case.prompt or case.eos_token_id == v:
        return None
    p = case.params
    if p.regex is not None or p.choice is not None:
        return None  # token texts would change under the constraint
    refs = set(p.stop_token_ids) | set(p.allowed_token_ids or ()) | set(dict(p.logit_bias)) | {t for w in p.bad_words for t in w}
    if p.think_end_token_id is not None:
        refs.add(p.think_end_token_id)
    if v in refs:
        return None

    def m(t: int) -> int:
        return t - 1 if t > v else t

    keep = [i for i in range(V) if i != v]
    target = np.asarray(case.target_table)[np.ix_(keep, keep)]
    draft, d2t = case.draft_table, case.draft_d2t
    if draft is not None:
        draft = np.asarray(draft)
        rows = [i for i in range(draft.shape[0]) if i != v]
        if d2t is None:
            cols = [j for j in range(draft.shape[1]) if j != v]
        else:
            cols = [j for j, t in enumerate(d2t) if t != v]
            d2t = tuple(m(int(d2t[j])) for j in cols)
        if not cols:
            return None
        draft = draft[np.ix_(rows, cols)]
    d = p.to_json()
    d["stop_token_ids"] = [m(t) for t in p.stop_token_ids]
    d["allowed_token_ids"] = None if p.allowed_token_ids is None else [m(t) for t in p.allowed_token_ids]
    d["logit_bias"] = {str(m(int(k))): b for k, b in dict(p.logit_bias).items()}
    d["bad_words"] = [[m(t) for t in w] for w in p.bad_words]
    if p.think_end_token_id is not None:
        d["think_end_token_id"] = m(p.think_end_token_id)
    return _ok(lambda: Case(target, tuple(m(t) for t in case.prompt), SamplingParams.from_json(d),
                            eos_token_id=None if case.eos_token_id is None else m(case.eos_token_id),
                            spec=case.spec, draft_table=draft, draft_d2t=d2t))


def drop_tokens(case: Case, vs) -> Case | None:
    """``case`` without every vocabulary token in ``vs`` (:func:`drop_token` for each, the
    largest first so that the others keep their ids), or None when any cannot be dropped."""
    for v in sorted(set(vs), reverse=True):
        got = drop_token(case, v)
        if got is None:
            return None
        case = got
    return case


def seen_tokens(run) -> frozenset[int] | None:
    """The token ids a failing run emitted (every output it counted), or None for a run with
    no verdict (a crash: what it emitted before crashing says nothing about the crash)."""
    if getattr(run, "judgement", None) is None or not getattr(run, "counts", None):
        return None
    return frozenset(t for out in run.counts for t in out)


def _still_seen(before: frozenset[int] | None, now: frozenset[int] | None, same_ids: bool) -> frozenset[int] | None:
    """The tokens every failing run of the shrink emitted, after a kept reduction whose run
    emitted ``now``: ``now`` where ids moved (a vocabulary drop renumbers them) or nothing was
    known before, else what both emitted. Zeroed tables let a run emit every token, which
    would otherwise end the joint drop of the ones the failure never needed (and leave one
    engine start per dropped token)."""
    if now is None or before is None or not same_ids:
        return now
    return before & now


def _vocab_drops(case: Case, seen: frozenset[int] | None = None) -> list[Case | None]:
    """Smaller vocabularies: with ``seen`` (the tokens the failing run emitted), first every
    droppable token it never emitted, at once (2 tokens kept at least: the largest ids go);
    then one token at a time, the never-emitted ones first, the last first.
    A smaller vocabulary needs an engine start (fuzz/run.py start_key), while candidates of
    one size share one (a swap each), so dropping the never-emitted tokens together saves a
    start per token; a token the failure's samples never show is seldom what it needs.
    Every droppable token at once, whether emitted or not, would cost more restarts than it
    saves (bench/shrink_restarts.py): a failed try is a start, retried after each kept
    reduction."""
    V = case.vocab_size
    singles = {v: drop_token(case, v) for v in reversed(range(V))}
    droppable = [v for v, c in singles.items() if c is not None]
    unseen = [] if seen is None else [v for v in droppable if v not in seen]
    out: list[Case | None] = [drop_tokens(case, unseen[:V - 2])] if len(unseen[:V - 2]) >= 2 else []
    return out + [singles[v] for v in unseen] + [singles[v] for v in droppable if v not in unseen]


def _prompt_cuts(case: Case) -> list[Case | None]:
    pr = case.prompt
    if len(pr) <= 1:
        return []
    return [_ok(lambda s=short: case.with_(prompt=tuple(s))) for short in (pr[-1:], pr[len(pr) // 2:], pr[1:])]


def _output_cuts(case: Case) -> list[Case | None]:
    p = case.params
    return [_ok(lambda mt=mt: case.with_(params=replace(p, max_tokens=mt)))
            for mt in sorted({1, p.max_tokens // 2, p.max_tokens - 1}) if 1 <= mt < p.max_tokens]


def _spec_cuts(case: Case, speculation: bool) -> list[Case | None]:
    s = case.spec if speculation else None
    if s is None:
        return []
    out: list[Case | None] = []
    for k in sorted({1, s.num_speculative_tokens - 1}):
        if 1 <= k < s.num_speculative_tokens:
            out.append(_ok(lambda k=k: case.with_(spec=replace(s, num_speculative_tokens=k))))
    if s.method.endswith("_tree"):
        for b in sorted({1, s.tree_budget - 1}):
            if 1 <= b < s.tree_budget:
                out.append(_ok(lambda b=b: case.with_(spec=replace(s, tree_budget=b))))
        if s.tree_topk > 1:
            out.append(_ok(lambda: case.with_(spec=replace(s, tree_topk=s.tree_topk - 1))))
    if s.ngram_max > s.ngram_min:
        out.append(_ok(lambda: case.with_(spec=replace(s, ngram_max=s.ngram_min))))
    return out


def _param_resets(case: Case) -> list[Case | None]:
    p, default = case.params, SamplingParams()
    return [_ok(lambda name=name: case.with_(params=replace(p, **{name: getattr(default, name)})))
            for name in SamplingParams.__dataclass_fields__
            if name != "max_tokens" and getattr(p, name) != getattr(default, name)]


def _model_cuts(case: Case, speculation: bool) -> list[Case | None]:
    """No EOS, all-zero target table, all-zero draft table."""
    out: list[Case | None] = []
    if case.eos_token_id is not None:
        out.append(_ok(lambda: case.with_(eos_token_id=None)))
    T = np.asarray(case.target_table)  # [V, V]
    if np.any(T != 0):
        out.append(_ok(lambda: case.with_(target_table=np.zeros_like(T))))
    if speculation and case.draft_table is not None and np.any(np.asarray(case.draft_table) != 0):
        out.append(_ok(lambda: case.with_(draft_table=np.zeros_like(np.asarray(case.draft_table)))))
    return out


def candidates(case: Case, speculation: bool = True, seen: frozenset[int] | None = None) -> list[Case]:
    """Smaller variants of ``case``, largest reductions first (invalid ones left out).
    ``speculation=False`` (a calibration entry, run with speculation off): no candidates
    that only change the speculation settings or the draft, which such a run ignores.
    ``seen``: the tokens the case's failing run emitted (:func:`seen_tokens`; see :func:`_vocab_drops`)."""
    out = (_vocab_drops(case, seen) + _prompt_cuts(case) + _output_cuts(case) + _spec_cuts(case, speculation)
           + _param_resets(case) + _model_cuts(case, speculation))
    keys: set[str] = {_key(case)}
    uniq = []
    for c in out:
        if c is not None and (k := _key(c)) not in keys:
            keys.add(k)
            uniq.append(c)
    return uniq


# A family: request patterns (prompt and sampling settings) on one model, sharing its tables,
# EOS, speculation settings and draft, mixed in each engine call.
Family = tuple[Case, ...]


def _shared(family: Family, first: Case | None) -> Family | None:
    """``family`` with the shared things (tables, EOS, speculation, draft) of ``first``, a
    reduction of its first pattern; None when any pattern is invalid with them."""
    if first is None:
        return None
    out = [first]
    for c in family[1:]:
        c2 = _ok(lambda c=c: c.with_(target_table=first.target_table, eos_token_id=first.eos_token_id, spec=first.spec,
                                     draft_table=first.draft_table, draft_d2t=first.draft_d2t))
        if c2 is None:
            return None
        out.append(c2)
    return tuple(out)


def _one_pattern(family: Family, i: int, case: Case | None) -> Family | None:
    return None if case is None else family[:i] + (case,) + family[i + 1:]


def family_candidates(family: Sequence[Case], speculation: bool = True,
                      seen: frozenset[int] | None = None) -> list[Family]:
    """Smaller variants of a family of request patterns, largest reductions first: one
    pattern dropped (the last first), then :func:`candidates`' reductions, those of shared
    things applied to every pattern at once (a vocabulary token only when no pattern
    references it, every pattern's ids remapped; K, tree, n-gram window; EOS; tables),
    those of one request (prompt, max_tokens, a sampling setting back to its default) to one
    pattern at a time. A family of one: exactly :func:`candidates` (``seen`` is used for
    a family of one only: it holds one pattern's outputs)."""
    fam = tuple(family)
    if len(fam) == 1:
        return [(c,) for c in candidates(fam[0], speculation, seen)]
    n, first = len(fam), fam[0]
    out: list[Family | None] = [fam[:i] + fam[i + 1:] for i in reversed(range(n))]
    for v in reversed(range(first.vocab_size)):
        each = [drop_token(c, v) for c in fam]
        out.append(None if any(c is None for c in each) else tuple(each))
    for cuts in (_prompt_cuts, _output_cuts):
        out += [_one_pattern(fam, i, c) for i in range(n) for c in cuts(fam[i])]
    out += [_shared(fam, c) for c in _spec_cuts(first, speculation)]
    out += [_one_pattern(fam, i, c) for i in range(n) for c in _param_resets(fam[i])]
    out += [_shared(fam, c) for c in _model_cuts(first, speculation)]
    seen: set[str] = {family_key(list(fam))}
    uniq = []
    for f in out:
        if f is not None and (k := family_key(list(f))) not in seen:
            seen.add(k)
            uniq.append(f)
    return uniq


@dataclass
class ShrinkResult:
    case: Case  # the first pattern of ``family``
    steps: list[str] = field(default_factory=list)  # what each accepted reduction was
    tried: int = 0
    kept: int = 0
    seconds: float = 0.0
    last_run: object = None  # the CaseRun (or EngineCrash) of the final case
    budget_exhausted: bool = False
    interrupted: bool = False  # stopped by Ctrl-C / SIGTERM: what was kept so far is the result
    family: Family = ()  # every request pattern left (:func:`shrink_family`); (case,) for one case
    stopped: bool = False  # ended by ``on_kept`` after a kept reduction (see :func:`shrink_family`)


def _describe(old: Case, new: Case) -> str:
    if new.vocab_size < old.vocab_size:
        return f"V {old.vocab_size} -> {new.vocab_size}"
    if new.prompt != old.prompt:
        return f"prompt {list(old.prompt)} -> {list(new.prompt)}"
    if new.spec != old.spec:
        a, b = old.spec.to_json(), new.spec.to_json()
        return ", ".join(f"{k} {a[k]} -> {b[k]}" for k in a if a[k] != b.get(k))
    if new.params != old.params:
        a, b = old.params.to_json(), new.params.to_json()
        return ", ".join(f"{k} {a[k]} -> {b[k]}" for k in a if a[k] != b.get(k))
    if new.eos_token_id != old.eos_token_id:
        return f"eos {old.eos_token_id} -> {new.eos_token_id}"
    return "tables zeroed"


def _describe_family(old: Family, new: Family) -> str:
    """A step of :func:`shrink_family` in words: "dropped batch pattern 2 of 3", "V 5 -> 4",
    "pattern 2: top_k 3 -> -1"; a family of one as :func:`_describe`."""
    if len(old) == 1 and len(new) == 1:
        return _describe(old[0], new[0])
    if len(new) < len(old):
        i = next((i for i in range(len(new)) if _key(new[i]) != _key(old[i])), len(new))
        return f"dropped batch pattern {i + 1} of {len(old)}"
    if new[0].vocab_size < old[0].vocab_size:
        return _describe(old[0], new[0])
    for i, (a, b) in enumerate(zip(old, new)):
        if (a.prompt, a.params) != (b.prompt, b.params):
            return f"pattern {i + 1}: {_describe(a, b)}"
    return _describe(old[0], new[0])


def shrink(case: Case, reproduces: Callable[[Case], object | None], *, budget_s: float,
           log: Callable[[str], None] = lambda s: None, speculation: bool = True,
           start_key: Callable[[Case], object] | None = None,
           prepare: Callable[[Case], None] | None = None,
           on_kept: Callable[[Case, object], bool] | None = None,
           seen: frozenset[int] | None = None) -> ShrinkResult:
    """Greedy shrinking: ``reproduces(c)`` returns the run (truthy) when ``c`` still shows
    the entry's problem, else None. Stops when no candidate reproduces, at the budget, or
    on KeyboardInterrupt (Ctrl-C, or SIGTERM through the CLI): a kill must not throw away
    the reductions already confirmed, so they are the result, marked not minimal.
    ``speculation``: whether the runs speculate (see :func:`candidates`).
    ``start_key``, ``prepare``, ``on_kept``, ``seen``: see :func:`shrink_family`."""
    return shrink_family((case,), lambda f: reproduces(f[0]), budget_s=budget_s, log=log, speculation=speculation, seen=seen,
                         start_key=None if start_key is None else lambda f: start_key(f[0]),
                         prepare=None if prepare is None else lambda f: prepare(f[0]),
                         on_kept=None if on_kept is None else lambda f, run: on_kept(f[0], run))


def shrink_family(family: Sequence[Case], reproduces: Callable[[Family], object | None], *, budget_s: float,
                  log: Callable[[str], None] = lambda s: None, speculation: bool = True,
                  start_key: Callable[[Family], object] | None = None,
                  prepare: Callable[[Family], None] | None = None,
                  on_kept: Callable[[Family, object], bool] | None = None,
                  seen: frozenset[int] | None = None) -> ShrinkResult:
    """:func:`shrink` for a family of request patterns that crash (or fail) mixed in one
    engine call: ``reproduces(f)`` runs every pattern of ``f`` mixed. Candidates from
    :func:`family_candidates`; the result's ``family`` holds the patterns left, ``case`` the
    first of them.
    ``start_key(f)``: what needs an engine start to change (vocabulary, EOS, speculation
    settings, ...: fuzz/run.py start_key), for candidates run on one engine that swaps tables
    and restarts otherwise. Each pass then runs the candidates the current case's engine
    serves by a swap first, then the others grouped by start (each group in the order above):
    in the plain order a pass whose reductions all fail restarts the engine for each change of
    kind (a vocabulary drop, back for the prompt cuts, a smaller K, back for the sampling
    settings, no EOS, back for zero tables), ~20-30 s each on SGLang.
    ``prepare(f)``: with ``start_key``, for an engine that can start one in the background:
    called with the first candidate that needs another start before the pass runs those that
    do not, so that the start runs while they do.
    ``on_kept(f, run)``: called after each kept reduction with the family kept and its run;
    True ends the shrink there (``stopped``), e.g. once the kept case is a known bug.
    ``seen``: the tokens the given family's failing run emitted (:func:`seen_tokens`), so that
    the first pass drops every other token at once (:func:`_vocab_drops`); after each kept
    reduction, the tokens every failing run so far emitted (:func:`_still_seen`)."""
    t0 = time.monotonic()
    fam = tuple(family)
    res = ShrinkResult(fam[0], family=fam)
    tried: set[str] = {family_key(list(fam))}
    try:
        _greedy(res, reproduces, tried, t0, budget_s, log, speculation, start_key, prepare, on_kept, seen)
    except KeyboardInterrupt:
        res.interrupted = res.budget_exhausted = True
        log(f"interrupted after {res.tried} candidates: keeping the {res.kept} reductions so far")
    res.seconds = time.monotonic() - t0
    return res


def _by_start(cands: list[Family], current: Family, start_key, tried: set[str]) -> tuple[list[Family], Family | None]:
    """``cands`` in :func:`shrink_family`'s ``start_key`` order, and the first untried one that
    needs another start, when untried ones served by the current start come before it."""
    groups: dict = {}
    for f in cands:
        groups.setdefault(start_key(f), []).append(f)
    cur = start_key(current)
    same = groups.pop(cur, [])
    others = [f for g in groups.values() for f in g]
    untried = [f for f in others if family_key(list(f)) not in tried]
    ahead = untried[0] if untried and any(family_key(list(f)) not in tried for f in same) else None
    return same + others, ahead


def _greedy(res: ShrinkResult, reproduces, tried: set[str], t0: float, budget_s: float, log, speculation: bool,
            start_key=None, prepare=None, on_kept=None, seen=None) -> None:
    improved = True
    while improved:
        improved = False
        cands = family_candidates(res.family, speculation, seen)
        if start_key is not None:
            cands, ahead = _by_start(cands, res.family, start_key, tried)
            if prepare is not None and ahead is not None:
                prepare(ahead)
        for cand in cands:
            if time.monotonic() - t0 > budget_s:
                res.budget_exhausted = True
                return
            k = family_key(list(cand))
            if k in tried:
                continue
            tried.add(k)
            res.tried += 1
            try:
                run = reproduces(cand)
            except (AmbiguousSemantics, InvalidInput):
                run = None
            if run:
                res_vocab = res.family[0].vocab_size
                step = _describe_family(res.family, cand)
                # The family first: an interrupt landing inside this statement can at worst
                # leave the last step out of the record, never pair old steps with a new case.
                res.family, res.case, res.last_run, res.steps, res.kept = cand, cand[0], run, res.steps + [step], res.kept + 1
                log(f"kept ({res.kept}/{res.tried}): {step}")
                seen = _still_seen(seen, seen_tokens(run), cand[0].vocab_size == res_vocab)
                if on_kept is not None and on_kept(cand, run):
                    res.stopped = True
                    return
                improved = True
                break


def entry_family(entry) -> Family:
    """The request patterns a stored entry is shrunk (and replayed) with: for a crash entry
    that records its crashing batch (``extra.batch_patterns``), every pattern of it on the
    entry's model, the entry's own case first; otherwise the entry's case alone."""
    case = Case.from_json(entry.case)
    patterns = entry.extra.get("batch_patterns") if entry.kind == "crash" else None
    fam = [case.with_(prompt=tuple(p["prompt"]), params=SamplingParams.from_json(p["params"])) for p in patterns or []]
    main = next((i for i, c in enumerate(fam) if c.prompt == case.prompt and c.params == case.params), None)
    fam.insert(0, case if main is None else fam.pop(main))
    return tuple(fam)


def entry_reproducer(entry, engine, *, work_dir: Path, samples: int, alpha: float, seed: int,
                     dtype: str, settings: dict | None, attempts: int = 1,
                     fresh_kept: bool = True) -> Callable[[Case | Family], object | None]:
    """The ``reproduces`` predicate for a stored entry on a started-on-demand IsolatedEngine:
    it takes a case, or a family of request patterns run mixed in each engine call (a crash's
    batch, :func:`shrink_family`), and returns the run of its first pattern (or the
    EngineCrash) when the entry's problem shows, else None.
    ``attempts``: runs per candidate (fresh seeds) before it counts as not reproducing, for
    crashes that do not happen every time (uninitialised memory, races).
    ``fresh_kept``: a finding's candidate that reproduced on a swapped engine is run again on a
    freshly started one before it counts. A campaign turns it off: it confirms the shrinker's
    smallest case on a fresh engine before storing it (falling back to what it had confirmed
    before when that does not confirm), and on a GPU engine a fresh start per kept reduction
    would be most of the greedy shrinker's time."""
    from specfuzz.engines.isolation import EngineCrash
    from specfuzz.fuzz.run import entry_replay_calls, run_family

    profile = engine.capabilities().profile
    # Candidates run as the entry was run: its split of generate calls, a crash's batch.
    calls = entry_replay_calls(entry)
    want_crash = entry_crash_key(entry) if entry.kind == "crash" else None
    label = entry.label
    counter = [seed]
    # What the attempts that did not reproduce saw instead (reproduces.misses, newest last):
    # a crash that comes and goes often crashes another way in the runs it misses.
    misses: list[str] = []

    def miss(what: str) -> None:
        misses.append(what)
        del misses[:-20]

    def said(crash) -> str:
        return f"{crash.kind}: {str(crash)[:160]}"

    def reproduces(c: Case | Family):
        for i in range(max(1, int(attempts))):
            # A crash candidate starts on a fresh engine process; its further attempts run
            # on that same process (crashes that come and go with the process's history).
            got = once(c, fresh=want_crash is not None and i == 0)
            if got:
                return got
        return None

    def once(c: Case | Family, fresh: bool = False):
        # A finding's candidate may run on a swapped engine; one that reproduces there is run
        # again on a fresh one before it counts (a swap never decides what is kept).
        counter[0] += 1
        swaps = getattr(engine, "swaps", 0)
        cases = [c] if isinstance(c, Case) else list(c)
        try:
            run = run_family(engine, cases, ckpt_root=work_dir / "checkpoints", alphas=[alpha] * len(cases),
                             max_samples=samples, seed=counter[0], profile=profile,
                             speculation=entry.kind != "calibration", dtype=dtype, settings=settings,
                             fresh=fresh, **calls)[0]
        except EngineCrash as exc:
            if want_crash is not None and crash_key(exc) == want_crash:
                return exc
            miss(f"crashed another way: {said(exc)}")
            return None
        except SpecfuzzError as exc:
            miss(f"could not run: {str(exc)[:160]}")
            return None
        if want_crash is not None:
            if run.crash is not None and crash_key(run.crash) == want_crash:
                return run
            miss(f"crashed another way: {said(run.crash)}" if run.crash is not None else f"no crash in {run.n} samples")
            return None
        if run.crash is not None or not run.failed:
            miss(f"crashed: {said(run.crash)}" if run.crash is not None else f"passed ({run.n} samples)")
            return None
        got = run.judgement.attribution.label if run.judgement.attribution else None
        if label not in (None, "unknown") and got != label:
            miss(f"failed with another attribution: {got}")
            return None
        if fresh_kept and not fresh and getattr(engine, "swaps", 0) != swaps:
            return once(c, fresh=True)
        return run

    reproduces.misses = misses  # type: ignore[attr-defined]
    return reproduces
