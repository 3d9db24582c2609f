"""Data preparation: what a draft is made of, computed once from a corpus entry.

:func:`prepare` reads one entry and recomputes what a maintainer needs: the exact law μ of
its case under the engine's semantics profile, the bug law μD of the attributed class, the
effect (worst deviation), the suspected broken condition of SPEC §3, the law embedded in
repro.py (projected onto the first tokens when μ has too many outputs), and how the engine
was started (:mod:`specfuzz.fuzz.draft.launch`). Everything in :class:`DraftData` is already
scrubbed (:mod:`specfuzz.fuzz.draft.scrub`). Calibration entries (speculation off disagreed
with μ) are drafted with speculation off, as they were found.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np

from specfuzz.errors import SpecfuzzError
from specfuzz.fuzz.corpus import Entry
from specfuzz.fuzz.draft.launch import launch_for
from specfuzz.fuzz.draft.scrub import Scrubber
from specfuzz.fuzz.triage import Effect, compute_effect, entry_dtype, entry_settings, profile_for, suspect_condition

# Outputs of μ embedded in a repro script at most; beyond this it embeds the law of the
# first DEPTH tokens (the largest depth whose prefixes fit).
MAX_EMBEDDED_OUTPUTS = 5000


class DraftError(SpecfuzzError):
    """The entry cannot be drafted (unreadable, or its law cannot be computed)."""


def fmt_out(x: Iterable[int]) -> str:
    x = tuple(x)
    return "(" + ", ".join(str(t) for t in x) + (",)" if len(x) == 1 else ")")


def project_law(law: Mapping[tuple[int, ...], float], depth: int | None) -> dict[tuple[int, ...], float]:
    """The law of ``x[:depth]`` (outputs shorter than ``depth`` stay whole); identity for None."""
    if depth is None:
        return dict(law)
    out: dict[tuple[int, ...], float] = {}
    for x, p in law.items():
        y = tuple(x[:depth])
        out[y] = out.get(y, 0.0) + p
    return out


def prefix_law(target_law, depth: int, max_cells: int) -> dict[tuple[int, ...], float] | None:
    """The exact law of the first ``depth`` tokens from μ's conditionals (None if too many cells)."""
    out: dict[tuple[int, ...], float] = {}
    frontier: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
    for t in range(depth + 1):
        nxt = []
        for prefix, m in frontier:
            if t == depth or target_law.is_terminal(prefix):
                out[prefix] = out.get(prefix, 0.0) + m
                continue
            p = target_law.conditional(prefix)  # [V]
            for tok in np.flatnonzero(p > 0.0):
                nxt.append((prefix + (int(tok),), m * float(p[tok])))
        if len(out) + len(nxt) > max_cells:
            return None
        frontier = nxt
    return out


def conditional_at(law: Mapping[tuple[int, ...], float], context: tuple[int, ...], vocab_size: int) -> np.ndarray:
    """P(next cell | context) of a law over outputs: ``[V + 2]`` cells (tokens, <oov>, <end>)."""
    cells = np.zeros(vocab_size + 2)  # [V + 2]
    d = len(context)
    for x, p in law.items():
        if tuple(x[:d]) != context:
            continue
        if len(x) == d:
            cells[vocab_size + 1] += p
        else:
            t = x[d]
            cells[t if 0 <= t < vocab_size else vocab_size] += p
    s = cells.sum()
    return cells / s if s > 0 else cells


@dataclass
class DraftData:
    """Everything the three files are made of (already scrubbed)."""

    entry: Entry
    stem: str
    case: Any  # specfuzz.case.Case
    engine: dict  # scrubbed engine dict
    engine_kind: str  # template key: reference, vllm, hf-transformers, generic
    profile: str
    dtype: str
    settings: dict
    counts: dict[tuple[int, ...], int]
    n: int
    mu: dict[tuple[int, ...], float] | None
    label: str | None
    mud: dict[tuple[int, ...], float] | None
    effect: Effect
    condition: Any  # ConditionGuess
    scrub: Scrubber
    expected: dict[tuple[int, ...], float] = field(default_factory=dict)  # embedded in repro (maybe projected)
    suspected: dict[tuple[int, ...], float] | None = None
    depth: int | None = None
    inject: str | None = None  # reference repro: the class injected when found
    launch: dict | None = None  # how the adapter started the engine (specfuzz.fuzz.draft.launch), scrubbed

    @property
    def vocab_size(self) -> int:
        return self.case.vocab_size

    @property
    def is_crash(self) -> bool:
        return self.entry.kind == "crash"


def engine_kind(entry: Entry) -> str:
    """The repro template for the entry's engine: reference, vllm, sglang, hf-transformers, llamacpp, mlx, generic."""
    name = str(entry.engine.get("name", ""))
    if name.startswith("reference") or entry.kind == "regression":
        return "reference"
    if name in ("vllm", "sglang"):
        return name
    if name in ("hf-transformers", "hf"):
        return "hf-transformers"
    if name == "llama.cpp":
        return "llamacpp"
    if name == "mlx-lm":
        return "mlx"
    return "generic"


def _inject_of(entry: Entry) -> str | None:
    name = str(entry.engine.get("name", ""))
    inj = entry.extra.get("inject") or (name.split("+", 1)[1] if "+" in name else None)
    return inj or None


def prepare(entry: Entry, stem: str) -> DraftData:
    from specfuzz.case import Case
    from specfuzz.oracle.judge import bug_laws, target_law_dict
    from specfuzz.oracle.speculative import BUG_CLASSES

    if entry.kind == "calibration":
        # A calibration entry failed with speculation off: draft (and repro) it that way.
        import dataclasses

        entry = dataclasses.replace(entry, case={**entry.case, "spec": None, "draft_table": None, "draft_d2t": None},
                                    extra={**entry.extra, "stored_signature": entry.signature})
    scrub = Scrubber.for_entry(entry)
    try:
        case = Case.from_json(entry.case)
    except Exception as exc:  # noqa: BLE001
        raise DraftError(f"{stem}: the stored case cannot be rebuilt: {exc}") from None
    profile = profile_for(entry)
    try:
        mu = target_law_dict(case, profile=profile)
    except SpecfuzzError as exc:
        if entry.kind != "crash":
            raise DraftError(f"{stem}: the exact law of the case cannot be computed: {exc}") from None
        mu = {}  # a crash needs no law (its repro runs the request and watches for the crash)
    label = entry.label if entry.label in BUG_CLASSES else None
    mud = None
    if label is not None and mu is not None:
        mud = bug_laws(case, mu, classes=[label], profile=profile).get(label)
    effect = compute_effect(entry)
    data = DraftData(
        entry=entry, stem=stem, case=case, engine=scrub.value(dict(entry.engine)), engine_kind=engine_kind(entry),
        profile=profile, dtype=entry_dtype(entry), settings=scrub.value(entry_settings(entry)),
        counts=dict(entry.counts), n=int(sum(entry.counts.values())), mu=mu, label=label, mud=mud, effect=effect,
        condition=suspect_condition(entry, effect), scrub=scrub, inject=_inject_of(entry),
    )
    try:
        data.launch = scrub.value(launch_for(entry, case, engine_kind(entry), data.dtype, entry_settings(entry)))
    except SpecfuzzError as exc:
        raise DraftError(f"{stem}: how the engine was started cannot be reconstructed: {exc}") from None
    if mu is not None and len(mu) <= MAX_EMBEDDED_OUTPUTS:
        data.expected, data.suspected, data.depth = dict(mu), (dict(mud) if mud else None), None
    else:
        law = case.target_law(profile)
        for depth in range(case.params.max_tokens - 1, 0, -1):
            pl = project_law(mu, depth) if mu is not None else prefix_law(law, depth, MAX_EMBEDDED_OUTPUTS)
            if pl is not None and len(pl) <= MAX_EMBEDDED_OUTPUTS:
                data.expected, data.depth = pl, depth
                data.suspected = project_law(mud, depth) if mud else None
                break
        else:
            raise DraftError(f"{stem}: even the first-token law is too large to embed")
    return data


@dataclass(frozen=True)
class Row:
    output: tuple[int, ...]
    count: int
    observed: float
    expected: float
    suspected: float | None


def comparison_rows(data: DraftData, top: int) -> list[Row]:
    """Outputs ordered by |observed − expected| (the ones that matter first)."""
    n = max(data.n, 1)
    law = data.mu if data.mu is not None else data.expected
    counts = data.counts if data.mu is not None else project_counts(data.counts, data.depth)
    keys = set(counts) | {x for x, p in law.items() if p > 0}
    if data.mud is not None and data.mu is not None:
        keys |= {x for x, p in data.mud.items() if p > 0}
    suspected = data.mud if data.mu is not None else data.suspected
    rows = [Row(x, counts.get(x, 0), counts.get(x, 0) / n, law.get(x, 0.0),
                None if suspected is None else suspected.get(x, 0.0)) for x in keys]
    rows.sort(key=lambda r: (-abs(r.observed - r.expected), -r.count, r.output))
    return rows[:top]


def project_counts(counts: Mapping[tuple[int, ...], int], depth: int | None) -> dict[tuple[int, ...], int]:
    if depth is None:
        return dict(counts)
    out: dict[tuple[int, ...], int] = {}
    for x, c in counts.items():
        y = tuple(x[:depth])
        out[y] = out.get(y, 0) + c
    return out


