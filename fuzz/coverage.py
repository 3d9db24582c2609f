"""Coverage of speculation events over a campaign, and the steering it drives.

For every family a campaign runs, the oracle computes the exact probability of each
speculation event (:mod:`specfuzz.oracle.events`) for each of its request patterns under
lossless speculation. :class:`Coverage` keeps, per engine method and event, the largest
probability any pattern gave the event ("max P") and the expected number of occurrences over
all samples drawn; it lives in the campaign state (``totals["coverage"]``), so it adds up over
resumed runs and over ``--workers`` processes. Events a method cannot reach on the engine
(:func:`reachable`) are "n/a" with the reason, not "uncovered".

:meth:`Coverage.steer` turns what is thinly covered into :class:`~specfuzz.strategies.Steer`
weights for the next search of a method: longer drafts and deeper trees while positional
events at high positions are thin, block verification, narrower drafts, the sampling
features whose processor events are thin, draft/target table relations that reach
rejections late in a round or residuals of small mass.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping, Sequence

from specfuzz.oracle.events import EVENTS, EVENT_KINDS, case_events, event_info, expressible, multi_position, position

COVERAGE_SCHEMA_VERSION = 1
# An event is covered once some pattern gave it at least this probability per sample: a
# bug living there changes at least that much of the output law's mass, enough for the
# campaign's samples (1,000 per pattern by default) to see.
COVERED_P = 0.05
# Steering keeps favouring an event until its expected occurrences over the samples drawn reach this.
STEER_OCCURRENCES = 1000
# Weight of the K values that reach a method's highest thin position (others: 1).
STEER_K_WEIGHT = 6
# Families whose events may wait for the background worker; past it they are not computed.
MAX_PENDING_FAMILIES = 64
# Case event laws memoised by the campaign (swaps and shrinks rerun the same patterns).
EVENT_CACHE_SIZE = 4096
# Niceness added to the background worker's thread (Linux): the engine processes come first.
WORKER_NICE = 10


def _lower_priority() -> None:
    """Lower the calling thread's CPU priority by WORKER_NICE (Linux sets niceness per thread);
    elsewhere nothing happens."""
    import os
    import threading

    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + WORKER_NICE)
    except (AttributeError, OSError):
        pass


def reachable(method: str, caps, max_k: int, default_k: int | None = None) -> dict[str, str | None]:
    """:func:`~specfuzz.oracle.events.expressible` for ``method`` on an engine with
    capabilities ``caps``, the campaign drawing K up to ``max_k`` (an engine default of
    ``default_k`` counts too)."""
    knobs = dict(getattr(caps, "spec_knobs", {}) or {})
    ks = knobs.get(f"{method}.num_speculative_tokens", knobs.get("num_speculative_tokens"))
    k_max = max([k for k in (ks or ()) if k] or [max_k])
    if default_k:
        k_max = max(k_max, int(default_k))
    verify = knobs.get(f"{method}.verify", knobs.get("verify")) or ("token", "block")
    sampling = caps.honoured(True) if hasattr(caps, "honoured") else getattr(caps, "sampling", ())
    narrower = getattr(caps, "draft_vocab", "equal") != "equal" or method in ("eagle", "eagle3")
    return expressible(method, k_max, verify=verify, sampling=sampling, narrower_draft=narrower)


def family_is_multi_position(spec) -> bool:
    """A family whose configuration lets one round cover two or more positions: a chain with
    K >= 2, or a tree of depth >= 2 with room for a second level."""
    if spec is None or spec.num_speculative_tokens < 2:
        return False
    return not spec.is_tree or spec.tree_budget >= 2


class Coverage:
    """Per method: families run, families whose configuration is multi-position, families
    whose patterns exercised a multi-position event, families whose events could not be
    computed, and per event [max P, expected occurrences]. ``data`` is the JSON-able dict
    kept in the campaign state; it is updated in place."""

    def __init__(self, data: dict | None = None, profile: str = "vllm") -> None:
        self.data = data if data is not None else {}
        self.data.setdefault("schema_version", COVERAGE_SCHEMA_VERSION)
        self.data.setdefault("methods", {})
        self.data.setdefault("reach", {})
        self.profile = profile
        self._cache: OrderedDict[str, dict | None] = OrderedDict()  # touched by one thread at a time
        self._pool: ThreadPoolExecutor | None = None
        self._pending: deque = deque()  # (method, samples, future) of families computed in the background

    # -- recording -----------------------------------------------------------------------

    def _events_of(self, case, profile: str) -> dict | None:
        """A case's event law as {"p": probabilities, "x": expected counts} (memoised)."""
        key = hashlib.sha256(json.dumps([profile, case.to_json()], sort_keys=True).encode()).hexdigest()
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        ev = case_events(case, profile)
        out = None if ev is None else {"p": ev.probability, "x": ev.expected}
        self._cache[key] = out
        if len(self._cache) > EVENT_CACHE_SIZE:
            self._cache.popitem(last=False)
        return out

    def record(self, cases: Sequence, samples: Sequence[int], background: bool = False) -> None:
        """Add one family: its patterns ``cases`` with the samples each drew. Its counts are
        added at once; its events are computed here, or with ``background`` on a worker thread
        (a campaign's main thread mostly waits for the engine process) and added by the next
        :meth:`drain`."""
        spec = cases[0].spec
        if spec is None:
            return
        row = self._row(spec.method)
        row["families"] += 1
        row["multi_config"] += family_is_multi_position(spec)
        cases, samples, profile = list(cases), list(samples), self.profile
        if not background:
            self._add(spec.method, samples, [self._events_of(c, profile) for c in cases])
            return
        if len(self._pending) >= MAX_PENDING_FAMILIES:
            row["uncomputed"] += 1  # the worker is that far behind: this family's events are not computed
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specfuzz-coverage", initializer=_lower_priority)
        fut = self._pool.submit(lambda: [self._events_of(c, profile) for c in cases])
        self._pending.append((spec.method, samples, fut))
        self.drain()

    def drain(self, wait: bool = False, timeout_s: float | None = None) -> None:
        """Add the events of families computed in the background, in the order they ran
        (``wait``: wait for all, up to ``timeout_s`` in all; the rest count as uncomputed)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self._pending and (wait or self._pending[0][2].done()):
            method, samples, fut = self._pending.popleft()
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                evs = fut.result(timeout=left)
            except Exception:  # a timeout, or a failure of the event computation: not counted
                evs = [None]
            self._add(method, samples, evs)
        if wait and self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def _row(self, method: str) -> dict:
        return self.data["methods"].setdefault(method, {"families": 0, "multi_config": 0, "multi_events": 0,
                                                        "uncomputed": 0, "events": {}})

    def _add(self, method: str, samples: Sequence[int], evs: Sequence[dict | None]) -> None:
        row = self._row(method)
        best: dict[str, float] | None = None
        for ev, n in zip(evs, samples):
            if ev is None:
                continue
            best = best or {}
            for e, p in ev["p"].items():
                best[e] = max(best.get(e, 0.0), p)
                cell = row["events"].setdefault(e, [0.0, 0.0])
                cell[0] = max(cell[0], p)
                cell[1] += n * ev["x"].get(e, 0.0)
        if best is None:
            row["uncomputed"] += 1
        elif any(multi_position(e) for e in best):
            row["multi_events"] += 1

    @staticmethod
    def merge(dst: dict, src: Mapping) -> dict:
        """Add the coverage data ``src`` (another worker's) into ``dst``: counts add up, max P
        takes the larger, expected occurrences add up."""
        dst.setdefault("schema_version", COVERAGE_SCHEMA_VERSION)
        for m, row in (src.get("methods") or {}).items():
            d = dst.setdefault("methods", {}).setdefault(m, {"families": 0, "multi_config": 0, "multi_events": 0,
                                                               "uncomputed": 0, "events": {}})
            for k in ("families", "multi_config", "multi_events", "uncomputed"):
                d[k] = d.get(k, 0) + int(row.get(k, 0))
            for e, (p, x) in (row.get("events") or {}).items():
                cell = d["events"].setdefault(e, [0.0, 0.0])
                cell[0] = max(cell[0], float(p))
                cell[1] += float(x)
        for m, r in (src.get("reach") or {}).items():
            dst.setdefault("reach", {}).setdefault(m, dict(r))
        return dst

    def set_reach(self, method: str, reach: Mapping[str, str | None]) -> None:
        """Remember which events ``method`` can reach on the engine (:func:`reachable`)."""
        self.data["reach"][method] = dict(reach)

    # -- reading -------------------------------------------------------------------------

    def report(self, reach: Mapping[str, Mapping[str, str | None]] | None = None) -> dict:
        """The JSON report: per method (``reach``: method -> :func:`reachable`; default: what
        :meth:`set_reach` stored), its family counts and per event max P, expected
        occurrences and a status (covered, thin, uncovered, or "n/a: why")."""
        reach = self.data.get("reach", {}) if reach is None else reach
        out: dict = {}
        for m in sorted(set(self.data["methods"]) | set(reach)):
            row = self.data["methods"].get(m, {})
            events = row.get("events", {})
            r = dict(reach.get(m) or {})
            names = sorted(set(r) | set(events), key=_event_order)
            ev_out = {}
            for e in names:
                p, x = events.get(e, (0.0, 0.0))
                why = r.get(e)
                status = f"n/a: {why}" if why and p == 0 else ("covered" if p >= COVERED_P else "thin" if p > 0 else "uncovered")
                ev_out[e] = {"max_probability": round(float(p), 6), "expected": round(float(x), 3), "status": status}
            out[m] = {k: int(row.get(k, 0)) for k in ("families", "multi_config", "multi_events", "uncomputed")}
            out[m]["events"] = ev_out
        return out

    def min_multi_position(self, reach: Mapping[str, Mapping[str, str | None]] | None = None,
                           positional_only: bool = True) -> float:
        """The smallest max P over the multi-position events the methods in ``reach`` (default:
        every method run) can reach (positional ones only, by default: reject@i, bonus@k,
        tree_reject@d, tree_leaf@d with i, k, d >= 2)."""
        reach = self.data.get("reach", {}) if reach is None else reach
        vals = []
        for m, r in reach.items():
            events = self.data["methods"].get(m, {}).get("events", {})
            for e, why in r.items():
                if why is None and multi_position(e) and (position(e) is not None or not positional_only):
                    vals.append(float(events.get(e, (0.0, 0.0))[0]))
        return min(vals) if vals else 0.0

    def thin(self, method: str, reach: Mapping[str, str | None]) -> list[str]:
        """The reachable events of ``method`` that steering favours, least covered first: below
        COVERED_P, or with fewer than STEER_OCCURRENCES expected occurrences (a bug that changes
        the law only a little inside its event needs many samples there)."""
        events = self.data["methods"].get(method, {}).get("events", {})
        out = [e for e, why in reach.items() if why is None
               and (events.get(e, (0.0, 0.0))[0] < COVERED_P or events.get(e, (0.0, 0.0))[1] < STEER_OCCURRENCES)]
        return sorted(out, key=lambda e: (events.get(e, (0.0, 0.0))[0], _event_order(e)))

    def steer(self, method: str, reach: Mapping[str, str | None], max_k: int):
        """The :class:`~specfuzz.strategies.Steer` for the next search of ``method``. Narrower
        drafts cost engine time (HF runs universal assisted generation for them): that lever
        waits until the method has run a family and its own coverage says which events need it.
        Long outputs (max_tokens at its cap half of the time) are pulled whenever a bonus or a
        leaf past the first position is thin: no round reaches one in fewer tokens."""
        from specfuzz.strategies import Steer

        thin = set(self.thin(method, reach))
        first = not self.data["methods"].get(method, {}).get("families")
        # K: every value that can reach a thin positional event gains STEER_K_WEIGHT (a rejection
        # at position i: K >= i; a bonus after k drafts, a leaf at depth d: K = k, d). K = 1 is
        # never favoured: a round of one position reaches no multi-position event.
        k_weights = [1] * max_k
        for e in thin:
            pos = position(e)
            if pos is None:
                continue
            exact = e.startswith(("bonus@", "tree_leaf@"))
            for k in ([pos] if exact else range(pos, max_k + 1)):
                if 2 <= k <= max_k:
                    k_weights[k - 1] += STEER_K_WEIGHT
        kinds = {event_info(e).kind for e in thin}
        features = sorted({f for e in thin for f in _FEATURES_FOR.get(e, ())})
        return Steer(
            k_weights=tuple(k_weights),
            block="block_weight" in thin,
            wide_trees=bool(thin & {"tree_sibling", "tree_unfilled"}),
            narrower="vocab" in kinds and not first,
            features=tuple(features),
            near="residual_small" in thin or any((position(e) or 0) >= 2 for e in thin),
            truncated="draft_truncated" in thin,
            stop=bool(thin & {"stop_mid_round", "lag:min_tokens", "lag:thinking"}),
            long=any(e.startswith(("bonus@", "tree_leaf@")) and (position(e) or 0) >= 2 for e in thin),
        )


# Sampling features a thin event asks the next search to draw more often.
_FEATURES_FOR: Mapping[str, tuple[str, ...]] = {
    "lag:min_tokens": ("min_tokens",),
    "lag:thinking": ("thinking_budget",),
    "lag:penalties": ("repetition_penalty", "frequency_penalty", "presence_penalty"),
    "rejected_in_history": ("repetition_penalty", "presence_penalty"),
    "draft_truncated": ("top_k", "top_p", "min_p"),
    "stop_mid_round": ("stop_token_ids",),
}


def _event_order(name: str) -> tuple:
    info = event_info(name)
    base = [e.name for e in EVENTS].index(info.name)
    return (EVENT_KINDS.index(info.kind), base, position(name) or 0)


def multi_position_line(report: Mapping[str, Mapping]) -> str:
    """One line: how many families exercised a multi-position event, and how many had a
    multi-position configuration (K >= 2, or a tree with room for two levels)."""
    fam = sum(r.get("families", 0) for r in report.values())
    ev = sum(r.get("multi_events", 0) for r in report.values())
    cfg = sum(r.get("multi_config", 0) for r in report.values())
    pct = (lambda n: f"{100 * n / fam:.0f}%") if fam else (lambda n: "-")
    return (f"multi-position: {ev} of {fam} speculating families ({pct(ev)}) exercised an event of a round past its "
            f"first position; {cfg} ({pct(cfg)}) ran K >= 2 or a tree deeper than one")


def coverage_table(report: Mapping[str, Mapping]):
    """A rich table of :meth:`Coverage.report`: one row per event, one column per method;
    a cell is 'max P / expected occurrences', '—' uncovered, 'n/a' where the method cannot
    reach the event. Rows that are n/a for every method are left out."""
    from rich.table import Table

    methods = [m for m in report if report[m].get("families")]
    t = Table(title="speculation coverage (max P per sample / expected occurrences)")
    t.add_column("event")
    for m in methods:
        fam = report[m]
        t.add_column(f"{m}\n{fam['multi_events']}/{fam['families']} multi-pos.")
    names: list[str] = []
    for m in methods:
        names += [e for e in report[m]["events"] if e not in names]
    for e in sorted(names, key=_event_order):
        cells = []
        for m in methods:
            c = report[m]["events"].get(e)
            if c is None or c["status"].startswith("n/a"):
                cells.append("[dim]n/a[/dim]")
            elif c["status"] == "uncovered":
                cells.append("[red]—[/red]")
            else:
                style = "green" if c["status"] == "covered" else "yellow"
                cells.append(f"[{style}]{c['max_probability']:.2g}[/{style}] / {_count(c['expected'])}")
        if all(c == "[dim]n/a[/dim]" for c in cells):
            continue
        t.add_row(e, *cells)
    return t


def _count(x: float) -> str:
    return f"{x / 1e6:.1f}M" if x >= 1e6 else f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}" if x >= 1 else f"{x:.2g}"
