"""Triage: read a corpus, group entries by signature, say what is broken and how badly.

``triage(root)`` reads every ``*.json`` under a corpus folder (files it cannot read as
entries are reported and skipped, never modified), recomputes each entry's effect size
against the exact law μ of its stored case (under the engine's semantics profile), names
the condition of lossless speculation (SPEC §3) most likely broken, and groups entries
by :attr:`~specfuzz.fuzz.corpus.Entry.signature`. Re-confirming entries on the installed
engine (``specfuzz triage --rerun``) is :mod:`specfuzz.fuzz.rerun`. Rendering (a rich
table, or JSON that validates against ``docs/triage-schema.json``) is in
:mod:`specfuzz.fuzz.triage_cli`; this module only computes.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from specfuzz.fuzz.corpus import ENTRY_SCHEMA_VERSION, STATUSES, Entry, active_features, now_iso

TRIAGE_SCHEMA_VERSION = 1

# SPEC §3: what lossless speculation requires (Leviathan et al.).
CONDITIONS: dict[int, str] = {
    1: "On rejection, resample from the normalised positive residual (p - q)+, not from p and not reusing the "
       "rejected draft token.",
    2: "At verification position i, logits processors (stop tokens, min_tokens, grammar masks, thinking budgets) "
       "see the committed prefix plus the i uncommitted draft tokens before that position.",
    3: "The verifier gets the exact q the drafter sampled from: same vocabulary width, same memory row stride, "
       "no padding of unused tree branches with valid token ids.",
    4: "Every acceptance test uses a fresh independent uniform, including after a rejection rewinds to an "
       "earlier slot.",
}
CONDITION_NAMES: dict[int, str] = {
    1: "residual resampling",
    2: "processors see drafts",
    3: "exact q",
    4: "fresh uniforms",
}
# Where the condition number of an entry comes from.
CONDITION_SOURCES = ("attribution", "recorded", "heuristic", "none")
# Engine names (Entry.engine["name"]) whose non-speculative semantics follow the "hf" profile.
HF_ENGINE_NAMES = ("hf-transformers", "hf")
# Group status: the most pressing status of its entries, in this order.
STATUS_PRECEDENCE = ("confirmed", "new", "flaky", "fixed")
# Sampling parameters that act as history-dependent logits processors (condition 2).
_PROCESSOR_PARAMS = ("min_tokens", "thinking_budget", "regex", "choice", "bad_words", "repetition_penalty",
                     "frequency_penalty", "presence_penalty", "stop_token_ids")


# ----------------------------------------------------------------------------- loading


@dataclass(frozen=True)
class Skipped:
    """A file in the corpus folder that is not a readable entry (left as it is)."""

    path: Path
    reason: str


def load_corpus(root: Path | str) -> tuple[list[tuple[Path, Entry]], list[Skipped]]:
    """Every entry under ``root`` (recursively, hidden files and folders excluded), and
    every ``*.json`` file that could not be read as one, with the reason.

    Never raises for a bad file and never writes: invalid JSON, a JSON value that is not
    an entry (a list, a foreign document, a wrong ``schema_version``), unreadable bytes
    or a folder named ``*.json`` are all reported as :class:`Skipped`.
    """
    root = Path(root)
    entries: list[tuple[Path, Entry]] = []
    skipped: list[Skipped] = []
    if not root.is_dir():
        return entries, skipped
    for path in sorted(root.rglob("*.json")):
        if any(part.startswith(".") for part in path.relative_to(root).parts):
            continue  # campaign state (.specfuzz/) and temporary files of interrupted writes
        try:
            text = path.read_text(encoding="utf-8")
        except IsADirectoryError:
            skipped.append(Skipped(path, "a folder, not a file"))
            continue
        except (OSError, UnicodeDecodeError) as exc:
            skipped.append(Skipped(path, f"unreadable: {exc}"))
            continue
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            skipped.append(Skipped(path, f"invalid JSON: {exc}"))
            continue
        if not isinstance(data, dict):
            skipped.append(Skipped(path, f"not a corpus entry: a JSON {type(data).__name__}, not an object"))
            continue
        if data.get("schema_version") != ENTRY_SCHEMA_VERSION:
            skipped.append(Skipped(path, f"not a corpus entry: schema_version={data.get('schema_version')!r}, "
                                         f"expected {ENTRY_SCHEMA_VERSION}"))
            continue
        try:
            entry = Entry.from_json(data)
            _ = entry.signature
        except Exception as exc:  # noqa: BLE001 - any malformed entry is reported, not fatal
            skipped.append(Skipped(path, f"malformed entry: {type(exc).__name__}: {exc}"))
            continue
        entries.append((path, entry))
    return entries, skipped


# ----------------------------------------------------------------------------- analysis


def profile_for(entry: Entry) -> str:
    """The semantics profile μ is computed under: the one recorded with the entry, else
    "hf" for HF transformers, "sglang" for SGLang, "mlx" for mlx-lm, "vllm" for the rest."""
    stored = entry.extra.get("profile")
    if isinstance(stored, str) and stored:
        return stored
    name = str(entry.engine.get("name", ""))
    if name in HF_ENGINE_NAMES:
        return "hf"
    return {"sglang": "sglang", "llama.cpp": "llamacpp", "mlx-lm": "mlx"}.get(name, "vllm")


def engine_label(entry: Entry) -> str:
    name = str(entry.engine.get("name", "?"))
    version = entry.engine.get("version")
    return f"{name} {version}" if version else name


def method_summary(case_json: Mapping) -> dict | None:
    spec = case_json.get("spec")
    if not spec:
        return None
    return {"name": spec.get("method"), "verify": spec.get("verify"), "k": spec.get("num_speculative_tokens")}


def method_label(case_json: Mapping) -> str:
    m = method_summary(case_json)
    if m is None:
        return "off"
    return f"{m['name']} K={m['k']}" + (f" {m['verify']}" if m.get("verify") and m["verify"] != "token" else "")


def _finite_or_text(x: Any) -> float | str | None:
    """A float for JSON: finite numbers as they are, ±inf as "inf"/"-inf", None/NaN as None."""
    if x is None:
        return None
    if isinstance(x, str):
        return x if x in ("inf", "-inf") else None
    x = float(x)
    if math.isnan(x):
        return None
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def _as_float(x: Any) -> float | None:
    if x is None:
        return None
    if isinstance(x, str):
        return {"inf": math.inf, "-inf": -math.inf}.get(x)
    return float(x)


def format_e_value(log_e: float | None) -> str:
    """``e^log_e`` for people: 1.6e3, inf, 0.19."""
    if log_e is None:
        return "-"
    if math.isinf(log_e):
        return "inf" if log_e > 0 else "0"
    log10 = log_e / math.log(10)
    if abs(log10) < 3:
        return f"{math.exp(log_e):.3g}"
    mant = 10 ** (log10 - math.floor(log10))
    return f"{mant:.2g}e{int(math.floor(log10))}"


@dataclass
class Effect:
    """How far the stored counts are from μ (recomputed from the stored case)."""

    n: int = 0
    tv: float | None = None  # total variation between the empirical law of the counts and μ
    worst_token: dict | None = None  # TokenDeviation.to_dict(): context, token, count, context_count, observed, expected
    impossible: int = 0  # samples whose output μ forbids
    impossible_example: list | None = None
    stray_ids: bool = False  # some output holds an id outside [0, V)
    source: str = "recomputed"  # "recomputed" from the case, or "stored" (the verdict's) when μ could not be rebuilt
    note: str = ""
    symptom: str | None = None  # symptom() of the counts: "past end", "impossible output", "frequencies"; None: not computed


@dataclass
class ConditionGuess:
    number: int | None
    source: str  # one of CONDITION_SOURCES
    reason: str

    @property
    def text(self) -> str | None:
        return None if self.number is None else CONDITIONS[self.number]

    def label(self) -> str:
        if self.number is None:
            return "unknown"
        tag = {"heuristic": " (heuristic)", "recorded": " (recorded)"}.get(self.source, "")
        return f"{self.number}: {CONDITION_NAMES[self.number]}{tag}"


@dataclass
class EntryReport:
    path: Path
    rel: str  # path relative to the corpus folder
    entry: Entry
    effect: Effect
    condition: ConditionGuess
    rerun: dict | None = None
    latest: dict | None = None  # `triage --latest`: the check on the newest installable release

    @property
    def cls(self) -> str | None:
        """The catalogued class the counts were attributed to ("unknown" when none), None for crashes."""
        if self.entry.kind == "crash":
            return None
        return self.entry.label or "unknown"

    @property
    def log_e(self) -> float | None:
        v = self.entry.verdict
        return None if not v else _as_float(v.get("log_e"))

    def to_json(self) -> dict:
        e = self.entry
        v = e.verdict or {}
        eng = {"name": str(e.engine.get("name", "?")), "version": e.engine.get("version")}
        eng["version"] = None if eng["version"] is None else str(eng["version"])
        eff = self.effect
        return {
            "path": self.rel,
            "signature": e.signature,
            "kind": e.kind,
            "status": e.status,
            "engine": eng,
            "profile": profile_for(e),
            "method": method_summary(e.case),
            "class": self.cls,
            "condition": {"number": self.condition.number, "name": None if self.condition.number is None else CONDITION_NAMES[self.condition.number],
                          "text": self.condition.text, "source": self.condition.source, "reason": self.condition.reason},
            "effect": {
                "n": eff.n, "tv": eff.tv, "worst_token": eff.worst_token, "impossible": eff.impossible,
                "impossible_example": eff.impossible_example, "stray_ids": eff.stray_ids, "source": eff.source,
                "note": eff.note, "symptom": eff.symptom,
            },
            "evidence": {
                "log_e": _finite_or_text(v.get("log_e")) if v else None,
                "e_value": format_e_value(self.log_e) if v else "-",
                "alpha": v.get("alpha") if v else None,
                "text": e.evidence,
            },
            "first_seen": e.first_seen,
            "last_seen": e.last_seen,
            "times_seen": e.times_seen,
            "rerun": self.rerun,
            "latest": self.latest,
        }


def _processors_active(params: Mapping) -> list[str]:
    """Names of the history-dependent logits processors a request switches on."""
    from specfuzz.oracle.params import SamplingParams

    default = SamplingParams().to_json()
    return [k for k in _PROCESSOR_PARAMS if k in params and params.get(k) != default.get(k)]


def _draft_width(case_json: Mapping) -> tuple[int, int | None]:
    v = len(case_json.get("target_table") or [])
    d = case_json.get("draft_table")
    return v, (len(d[0]) if d else None)


def suspect_condition(entry: Entry, effect: Effect) -> ConditionGuess:
    """The SPEC §3 condition most likely broken: from the attributed class, else the one
    recorded with the entry, else a heuristic from what the counts and the case show."""
    from specfuzz.oracle.speculative import BUG_CLASSES

    label = entry.label
    if label in BUG_CLASSES:
        cond, mechanism = BUG_CLASSES[label]
        why = (entry.attribution or {}).get("reason") or f"attributed to {label}"
        return ConditionGuess(cond, "attribution", f"{label}: {mechanism} ({why})")
    if entry.kind == "regression" and entry.extra.get("bug") in BUG_CLASSES:
        cond, mechanism = BUG_CLASSES[entry.extra["bug"]]
        return ConditionGuess(cond, "attribution", f"regression entry for {entry.extra['bug']}: {mechanism}")
    case = entry.case
    spec = case.get("spec")
    if not spec:
        return ConditionGuess(None, "none", "speculation off: no condition of lossless speculation is involved "
                                            "(a non-speculative sampler bug or a semantics-profile error)")
    recorded = entry.extra.get("broken_condition")
    if isinstance(recorded, int) and recorded in CONDITIONS:
        note = entry.extra.get("mechanism") or entry.extra.get("title") or "stored with the entry"
        return ConditionGuess(recorded, "recorded", f"recorded with the entry: {_clip(str(note), 300)}")
    known = entry.extra.get("root_cause") or entry.extra.get("mechanism")
    if isinstance(known, str) and known.strip():
        # A mechanism someone traced in the engine's code outranks a guess from the case's shape.
        return ConditionGuess(None, "recorded", "the mechanism recorded with the entry (in the notes below) names the "
                                                "cause; no condition of lossless speculation is suggested on top of it")
    v, vd = _draft_width(case)
    procs = _processors_active(case.get("params") or {})
    width_note = (f"the draft vocabulary is {'narrower' if vd < v else 'wider'} than the target's ({vd} vs {v})"
                  if vd is not None and vd != v else "")
    tree = spec.get("method") in ("eagle_tree", "ngram_tree")
    if entry.kind == "crash":
        if width_note:
            return ConditionGuess(3, "heuristic", f"heuristic: the engine crashes and {width_note}; shapes/strides "
                                                  "of q are the usual suspect (condition 3)")
        return ConditionGuess(None, "none", "crash without a distribution to compare; no condition suggested")
    if effect.impossible:
        ex = tuple(effect.impossible_example or ())
        if effect.stray_ids:
            return ConditionGuess(3, "heuristic", f"heuristic: outputs impossible under μ with token ids outside the "
                                                  f"target vocabulary (e.g. {ex}): the verifier accepted a token from a "
                                                  "q/p it should not read (placeholder, stride, width) (condition 3)")
        if procs:
            return ConditionGuess(2, "heuristic", f"heuristic: outputs impossible under μ (e.g. {ex}) while logits "
                                                  f"processors are active ({', '.join(procs)}): a processor probably did "
                                                  "not see the uncommitted draft tokens (condition 2)")
        return ConditionGuess(3, "heuristic", f"heuristic: outputs impossible under μ (e.g. {ex}) with no logits "
                                              "processor active: a token was verified against the wrong q or p "
                                              "(condition 3)")
    if procs:
        return ConditionGuess(2, "heuristic", f"heuristic: the law differs from μ only with logits processors "
                                              f"active ({', '.join(procs)}) (condition 2)")
    if width_note or tree:
        what = width_note or f"a tree method ({spec.get('method')}) verifies padded/duplicate branches"
        return ConditionGuess(3, "heuristic", f"heuristic: {what} (condition 3)")
    return ConditionGuess(1, "heuristic", "heuristic: no processor active and the draft has the target's width: the "
                                          "acceptance/residual step itself (condition 1, or 4 if uniforms are reused "
                                          "across rounds)")


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def compute_effect(entry: Entry) -> Effect:
    """TV distance and worst token of the stored counts against μ recomputed from the case."""
    from specfuzz.case import Case
    from specfuzz.oracle.judge import target_law_dict
    from specfuzz.oracle.eprocess import SequentialTest

    counts = entry.counts
    n = int(sum(counts.values()))
    eff = Effect(n=n)
    v = len(entry.case.get("target_table") or [])
    eff.stray_ids = any(not 0 <= t < v for x in counts for t in x)
    if n == 0:
        eff.source = "none"
        return eff
    try:
        case = Case.from_json(entry.case)
        law = case.target_law(profile_for(entry))
        mu = target_law_dict(case, profile=profile_for(entry))
        test = SequentialTest(law, {}, alpha=1e-3, enumerated=mu)
        test.update_counts(counts)
        verdict = test.verdict()
        eff.tv = verdict.tv_distance
        eff.worst_token = None if verdict.worst_token is None else verdict.worst_token.to_dict()
        imp = [(x, c) for x, c in counts.items() if _impossible(x, mu, law, v)]
        eff.impossible = int(sum(c for _, c in imp))
        if imp:
            eff.impossible_example = list(max(imp, key=lambda xc: xc[1])[0])
        forbidden = {tuple(int(t) for t in x) for x, _ in imp}
        eff.symptom = _classify(counts, law, v, forbidden.__contains__)
        if mu is None:
            eff.note = "μ too large to enumerate: TV not computed"
    except Exception as exc:  # noqa: BLE001 - fall back to what the entry stored
        stored = entry.verdict or {}
        eff.source = "stored"
        eff.tv = stored.get("tv_distance")
        eff.worst_token = stored.get("worst_token")
        ex = stored.get("impossible_example")
        eff.impossible_example = ex
        eff.impossible = int(counts.get(tuple(ex), 0)) if ex else 0
        eff.note = f"μ not recomputed ({type(exc).__name__}: {_clip(str(exc), 200)}); stored values shown"
    return eff


def _impossible(x: tuple[int, ...], mu: Mapping | None, law, vocab_size: int) -> bool:
    """Whether μ gives output ``x`` probability 0 (from the enumeration, else the conditionals)."""
    if any(not 0 <= t < vocab_size for t in x):
        return True
    if mu is not None:
        return mu.get(tuple(x), 0.0) <= 0.0
    for t in range(len(x)):
        if law.is_terminal(x[:t]) or law.conditional(x[:t])[x[t]] <= 0.0:
            return True
    return not law.is_terminal(x)


# What kind of departure from μ a failing run's outputs show (symptom): the known-finding
# check across methods of one engine path asks for the same one.
SYMPTOMS = ("past end", "impossible output", "frequencies")


def _past_end(x: tuple[int, ...], law, vocab_size: int) -> bool:
    """Whether output ``x`` goes on after a prefix (of ids in [0, V)) at which μ ends every output."""
    valid = next((i for i, t in enumerate(x) if not 0 <= t < vocab_size), len(x))
    return any(law.is_terminal(x[:t]) for t in range(1, min(valid + 1, len(x))))


def _classify(counts: Mapping, law, vocab_size: int, impossible) -> str:
    """The symptom of ``counts`` (see :func:`symptom`): ``impossible(x)`` says whether output
    ``x`` is one μ forbids, asked only until one is and only where no output is past the end."""
    shown = [tuple(int(t) for t in x) for x, c in counts.items() if c > 0]
    if any(_past_end(x, law, vocab_size) for x in shown):
        return "past end"
    return "impossible output" if any(impossible(x) for x in shown) else "frequencies"


def symptom(case_json: Mapping, counts: Mapping, profile: str) -> str:
    """``"past end"`` when some output goes on after a prefix at which μ ends every output
    (past an EOS or stop token that stops it, or beyond max_tokens), else ``"impossible
    output"`` when some output is one μ forbids (a token id outside the vocabulary included),
    else ``"frequencies"`` (only the frequencies differ)."""
    from specfuzz.case import Case
    from specfuzz.oracle.judge import target_law_dict

    case = Case.from_json(dict(case_json))
    law = case.target_law(profile)
    v = len(case_json.get("target_table") or [])
    mu: list = []  # μ, enumerated once, when an output's possibility is first asked

    def impossible(x: tuple[int, ...]) -> bool:
        if not mu:
            mu.append(target_law_dict(case, profile=profile) or None)
        return _impossible(x, mu[0], law, v)
    return _classify(counts, law, v, impossible)


def analyse(path: Path, entry: Entry, root: Path) -> EntryReport:
    try:
        rel = str(path.relative_to(root))
    except ValueError:
        rel = path.name
    effect = compute_effect(entry)
    return EntryReport(path, rel, entry, effect, suspect_condition(entry, effect))


# ----------------------------------------------------------------------------- grouping


@dataclass
class Group:
    signature: str
    reports: list[EntryReport] = field(default_factory=list)
    # Signatures of the groups that are likely the same bug met under another speculation
    # method or verification mode (:func:`likely_same_key`); filled in by :func:`group_reports`.
    related: list[str] = field(default_factory=list)
    # Signatures of the other groups whose entries name the same upstream issue (``extra.upstream``,
    # set when a finding's cause was traced to a reported bug); filled in by :func:`group_reports`.
    same_upstream: list[str] = field(default_factory=list)

    @property
    def upstream(self) -> str | None:
        """The upstream issue its entries name (the newest entry's first), or None."""
        return next((u for u in (upstream_of(r.entry) for r in self.reports) if u), None)

    @property
    def status(self) -> str:
        have = {r.entry.status for r in self.reports}
        return next(s for s in STATUS_PRECEDENCE if s in have)

    @property
    def times_seen(self) -> int:
        return sum(r.entry.times_seen for r in self.reports)

    @property
    def first_seen(self) -> str:
        return min(r.entry.first_seen for r in self.reports)

    @property
    def last_seen(self) -> str:
        return max(r.entry.last_seen for r in self.reports)

    def to_json(self) -> dict:
        head = self.reports[0]
        return {
            "signature": self.signature,
            "kind": head.entry.kind,
            "engine": str(head.entry.engine.get("name", "?")),
            "method": method_summary(head.entry.case),
            "class": head.cls,
            "condition": head.condition.number,
            "status": self.status,
            "files": len(self.reports),
            "times_seen": self.times_seen,
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
            "entries": [r.to_json() for r in self.reports],
            "related": list(self.related),
            "upstream": self.upstream,
            "same_upstream": list(self.same_upstream),
        }


@dataclass
class TriageReport:
    root: Path
    groups: list[Group]
    skipped: list[Skipped]
    reran: bool = False
    latest: bool = False  # entries re-checked on their engine's newest installable release

    @property
    def reports(self) -> list[EntryReport]:
        return [r for g in self.groups for r in g.reports]

    def to_json(self) -> dict:
        reports = self.reports
        by_status = {s: sum(1 for r in reports if r.entry.status == s) for s in STATUSES}
        return {
            "schema_version": TRIAGE_SCHEMA_VERSION,
            "kind": "triage",
            "corpus": str(self.root),
            "generated": now_iso(),
            "rerun": self.reran,
            "latest": self.latest,
            "totals": {"entries": len(reports), "groups": len(self.groups), "skipped": len(self.skipped),
                       "by_status": by_status},
            "groups": [g.to_json() for g in self.groups],
            "skipped": [{"path": _rel(s.path, self.root), "reason": s.reason} for s in self.skipped],
        }


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def likely_same_key(report: EntryReport) -> tuple | None:
    """What speculation findings met under different methods share when they are likely one
    bug: engine name and version, the sampling features in play (a penalty, min_p, a stop
    token, ...), the attributed class and the symptom (:func:`symptom`: outputs past the end,
    another impossible output, or frequencies only; the report's ``effect.symptom``, None where
    μ was not rebuilt or there are no counts). A signature keeps the method apart on
    purpose (the methods' code paths differ, and a fix of one need not fix the other); this
    key only groups them for a maintainer reading the corpus (corpus/h200/sglang: the
    past-the-EOS findings with no sampling feature under draft_model, eagle_tree, eagle and
    eagle3; the symptom keeps NGRAM's dropped tokens after an EOS, frequencies only, apart).
    The features must be equal, not a subset: SGLang's four min_p findings carry different
    feature sets and stay apart. None for other kinds: a calibration entry already covers
    every method, a crash is keyed by its message."""
    entry = report.entry
    if entry.kind != "finding" or not (entry.case.get("spec") or {}).get("method"):
        return None
    return (str(entry.engine.get("name")), str(entry.engine.get("version")), tuple(active_features(entry.case)),
            entry.label or "unknown", report.effect.symptom)


def upstream_of(entry: Entry) -> str | None:
    """The upstream issue an entry's cause was traced to (``extra.upstream``), or None."""
    u = entry.extra.get("upstream")
    return u.strip() if isinstance(u, str) and u.strip() else None


def _peers(groups: Iterable[Group], keys_of) -> dict[str, list[str]]:
    """For each group that shares a key with another (``keys_of(group)``: a set of keys), the
    sorted signatures of the groups it shares one with."""
    by_key: dict = {}
    for g in groups:
        for k in keys_of(g):
            by_key.setdefault(k, []).append(g)
    peers: dict[str, set[str]] = {}
    for gs in by_key.values():
        for g in gs:
            peers.setdefault(g.signature, set()).update(o.signature for o in gs if o is not g)
    return {sig: sorted(p) for sig, p in peers.items()}


def group_reports(reports: Iterable[EntryReport]) -> list[Group]:
    """Groups by signature; the most recently seen group first, entries newest first. Each
    group lists the others that are likely the same bug under another method or verification mode (``related``)."""
    groups: "OrderedDict[str, Group]" = OrderedDict()
    for r in reports:
        groups.setdefault(r.entry.signature, Group(r.entry.signature)).reports.append(r)
    for g in groups.values():
        g.reports.sort(key=lambda r: (r.entry.last_seen, r.rel), reverse=True)
    related = _peers(groups.values(), lambda g: {likely_same_key(r) for r in g.reports} - {None})
    # Groups whose entries were traced to one upstream issue are one known bug, whatever their
    # kind, method or features (corpus/: vllm#55005 behind findings and crashes of four methods).
    same_upstream = _peers(groups.values(), lambda g: {g.upstream} - {None})
    for g in groups.values():
        g.related = related.get(g.signature, [])
        g.same_upstream = same_upstream.get(g.signature, [])
    out = sorted(groups.values(), key=lambda g: (g.last_seen, g.signature), reverse=True)
    return sorted(out, key=lambda g: STATUS_PRECEDENCE.index(g.status))  # stable: newest first per status


def triage(root: Path | str) -> TriageReport:
    """Read, analyse and group a corpus folder (read only)."""
    root = Path(root)
    entries, skipped = load_corpus(root)
    reports = [analyse(p, e, root) for p, e in entries]
    return TriageReport(root, group_reports(reports), skipped)


# ----------------------------------------------------------------------------- an entry's engine settings


def entry_dtype(entry: Entry) -> str:
    return str(entry.extra.get("dtype") or entry.engine.get("dtype") or "float32")


def entry_settings(entry: Entry) -> dict:
    s = entry.extra.get("engine_settings")
    return dict(s) if isinstance(s, Mapping) else {}
