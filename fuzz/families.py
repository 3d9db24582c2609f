"""Case families as a campaign keys, draws and counts them, and the key of a crash.

A *family* is the list of request patterns (cases) one example of a search runs together
on one engine. Its key (:func:`family_key`) names it in the campaign state (the simplest
families already run) and in the shrinker; its variants (:func:`family_variants`) are what
the campaign's totals count per method. Two crashes are "the same" when their
:func:`crash_key` is: that is what a crash's shrink keeps and what a stored crash met again
is recognised by.
"""

from __future__ import annotations

import hashlib
import json
import re

from hypothesis import HealthCheck, Phase, given, seed as hyp_seed, settings

from specfuzz.case import Case
from specfuzz.engines.isolation import EngineCrash
from specfuzz.fuzz.corpus import Entry, active_features, crash_cause


def family_key(cases: list[Case]) -> str:
    """A digest of a case family (tables, prompts, params, speculation)."""
    blob = json.dumps([c.to_json() for c in cases], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def family_variants(case: Case) -> tuple[str, ...]:
    """The speculation variant of a family, as counters: engine default, K, verification,
    draft sampling, draft width relative to the target, tree shape, long prompt."""
    spec = case.spec
    if spec is None:
        return ()
    out = ["engine default"] if spec.engine_default else []
    out += [f"K={spec.num_speculative_tokens}", f"verify={spec.verify}"]
    if len(case.prompt) > 8:
        out.append("long prompt")
    if case.draft_table is not None:
        V, Vd = case.vocab_size, int(case.draft_table.shape[1])
        out.append("draft=" + ("reduced" if Vd < V else "wider" if Vd > V else "full"))
        out.append(f"draft_sampling={spec.draft_sampling}")
    if spec.method.endswith("_tree"):
        out.append(f"tree={spec.tree_topk}x{spec.tree_budget}")
    return tuple(out)


def draw_example(strategy, seed: int, simplest: bool = False):
    """One value of ``strategy`` for ``seed``: Hypothesis's first (simplest) example when
    ``simplest``, else a random one."""
    seen: list = []

    @hyp_seed(seed)
    @settings(database=None, max_examples=1 if simplest else 4, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def pick(value) -> None:
        seen.append(value)

    pick()
    return seen[-1]


def family_fields(cases: list[Case], speculation: bool) -> dict:
    """What the campaign log and the family log record of a family: its speculation method
    (None with speculation off), vocabulary, request patterns and the sampling features in play."""
    spec = cases[0].spec if speculation else None
    return {"method": None if spec is None else spec.method, "V": cases[0].vocab_size, "patterns": len(cases),
            "features": sorted({f for c in cases for f in active_features(c.to_json())})}


def simplest_key(strategy) -> str | None:
    """The key of the example Hypothesis tries first in a search (its all-simplest choices,
    whatever the seed); not ``find``'s result, which prefers fewer choices (another method)."""
    fam = simplest_family(strategy)
    return None if fam is None else family_key(fam)


def simplest_family(strategy):
    """The example Hypothesis tries first in a search of ``strategy`` (None: none)."""
    seen: list = []

    @settings(database=None, max_examples=1, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def first(fam) -> None:
        seen.append(fam)

    try:
        first()
    except Exception:  # noqa: BLE001 - no simplest example to skip is harmless
        return None
    return seen[0] if seen else None


def crash_key(crash: EngineCrash) -> str:
    """What makes two crashes "the same" (while shrinking, and a stored crash met again): kind
    and message, numbers stripped, and where the engine process died without naming why, the
    exception its log names (:func:`~specfuzz.fuzz.corpus.crash_cause`)."""
    return _crash_key_of(crash.kind, f"engine {crash.kind}: {crash.detail}", crash.log_tail)


def entry_crash_key(entry: Entry) -> str:
    """:func:`crash_key` of a stored crash entry (its evidence and log tail)."""
    return _crash_key_of(entry.extra.get("crash_kind"), entry.evidence, entry.log)


def _crash_key_of(kind: object, evidence: str, log: str | None = None) -> str:
    detail = evidence.split(": ", 1)[1] if evidence.startswith("engine ") and ": " in evidence else evidence
    if kind == "raise":
        # Entries stored before 2026-11-29 name an exception raised by generate() kind "raise",
        # without the call: the key of the same crash met today.
        kind = "exception"
        detail = detail if " raised " in detail.split(":", 1)[0] else f"generate raised {detail}"
    key = f"{kind}:{re.sub(r'-?[0-9]+', '#', detail)[:160]}"
    cause = crash_cause(kind, evidence, log)
    return f"{key} <- {cause}" if cause else key
