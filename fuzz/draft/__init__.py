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

The package is split by role: :mod:`~specfuzz.fuzz.draft.data` (data preparation: the laws,
the effect, the condition), :mod:`~specfuzz.fuzz.draft.launch` (how the engine was
started: the adapter's recorded launch, or a reconstruction for older entries),
:mod:`~specfuzz.fuzz.draft.markdown` (ISSUE.md), :mod:`~specfuzz.fuzz.draft.plot`
(plot.png), :mod:`~specfuzz.fuzz.draft.repro` (repro.py, rendered like Schemathesis' code
samples from templates that are real Python files in ``templates/``: a shared part, the
checkpoints, one part per engine — the reference sampler, vLLM, SGLang, HF transformers,
and a generic one for third-party engines — and the main loop),
:mod:`~specfuzz.fuzz.draft.scrub` (scrubbing) and :mod:`~specfuzz.fuzz.draft.verify`
(``--verify``: run repro.py on the installed engine and record what it printed in ISSUE.md).

Nothing that identifies the machine that ran the campaign (absolute paths, user names,
host names, addresses) reaches a draft: :class:`Scrubber` cleans the engine dict, logs and
notes, and the rendered ISSUE.md once more as a whole.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specfuzz.fuzz.corpus import Entry
from specfuzz.fuzz.draft.data import DraftData, DraftError, comparison_rows, engine_kind, prepare
from specfuzz.fuzz.draft.markdown import evidence_sentence, headline, issue_title, render_issue
from specfuzz.fuzz.draft.plot import write_plot
from specfuzz.fuzz.draft.repro import default_samples, render_repro, repro_data
from specfuzz.fuzz.draft.scrub import Scrubber

__all__ = [
    "DraftData", "DraftError", "DraftResult", "Scrubber", "comparison_rows", "default_samples", "draft_entry",
    "engine_kind", "evidence_sentence", "headline", "issue_title", "load_entry", "prepare", "render_issue",
    "render_repro", "repro_data", "resolve_entry", "write_plot",
]




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


def _kept_verification(out: Path, repro: str) -> str:
    """The Verification section of ``out``'s ISSUE.md when ``out``'s repro.py is ``repro``
    unchanged (empty otherwise: a changed script has not been verified)."""
    from specfuzz.fuzz.draft.verify import section_span

    try:
        if (out / "repro.py").read_text(encoding="utf-8") != repro:
            return ""
        text = (out / "ISSUE.md").read_text(encoding="utf-8")
    except OSError:
        return ""
    span = section_span(text)
    return "" if span is None else text[span[0]:span[1]]


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
    repro = render_repro(data, n_samples, title)
    # A redraft (e.g. after `specfuzz bisect` added the releases affected) keeps the record of
    # a verification of the same repro.py: only when the script is byte for byte the one run.
    kept = _kept_verification(out, repro)
    if kept:
        issue = issue.rstrip("\n") + "\n\n" + kept.rstrip("\n") + "\n"
    (out / "ISSUE.md").write_text(issue, encoding="utf-8")
    files.append(out / "ISSUE.md")
    if plot_what:
        files.append(out / "plot.png")
    leaks = data.scrub.leaks(repro)
    if leaks:
        raise DraftError(f"refusing to write repro.py: it would contain machine-identifying text {leaks[:3]}")
    (out / "repro.py").write_text(repro, encoding="utf-8")
    files.append(out / "repro.py")
    hint = "add --correct for the sampler without the injected bug" if data.engine_kind == "reference" and data.inject else ""
    return DraftResult(out, files, title, hint)


