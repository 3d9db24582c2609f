"""Drafting an upstream issue from a corpus entry: ISSUE.md, plot.png and repro.py.

``draft_entry(path, out_dir)`` reads one corpus entry, recomputes what a maintainer needs
(the exact law μ of its case under the engine's semantics profile, the bug law μD of
the attributed class, the worst deviation, the evidence in one checkable sentence, the
suspected broken condition of SPEC §3) and writes

* ``ISSUE.md``: the engine's own bug-report form (vLLM, SGLang, HF transformers), the symptom
  and its trigger on top, the maths below the fold;
* ``plot.png``: observed frequencies vs μ (and μD) per output, or per token at the worst
  position when there are many outputs;
* ``repro.py``: one standalone script of a screen or so plus one data block: it writes the
  table checkpoints, runs only the engine as the finding ran it, and tests the outputs
  against μ embedded as data, ending in ``PASS`` or ``FAIL``.

The package is split by role: :mod:`~specfuzz.fuzz.draft.data` (data preparation: the laws,
the effect, the condition), :mod:`~specfuzz.fuzz.draft.launch` (how the engine was
started: the adapter's recorded launch, or a reconstruction for older entries),
:mod:`~specfuzz.fuzz.draft.native` (the request in the engine's own arguments),
:mod:`~specfuzz.fuzz.draft.markdown` and :mod:`~specfuzz.fuzz.draft.forms` (ISSUE.md),
:mod:`~specfuzz.fuzz.draft.plot` (plot.png), :mod:`~specfuzz.fuzz.draft.repro` (repro.py,
rendered like Schemathesis' code samples from templates that are real Python files in
``templates/``), :mod:`~specfuzz.fuzz.draft.github` (``--format github``: the body ready to
paste), :mod:`~specfuzz.fuzz.draft.index` (the drafts index, ``docs/findings.md``),
:mod:`~specfuzz.fuzz.draft.scrub` (scrubbing) and :mod:`~specfuzz.fuzz.draft.verify`
(``--verify``: run repro.py and the engine's environment command, record both in ISSUE.md).

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


def _kept_record(out: Path, repro: str) -> tuple[str, str | None]:
    """The Verification section and the captured environment of ``out``'s ISSUE.md when ``out``'s
    repro.py is ``repro`` unchanged (("", None) otherwise: a changed script has not been verified)."""
    from specfuzz.fuzz.draft.forms import captured_env
    from specfuzz.fuzz.draft.verify import section_span

    try:
        if (out / "repro.py").read_text(encoding="utf-8") != repro:
            return "", None
        text = (out / "ISSUE.md").read_text(encoding="utf-8")
    except OSError:
        return "", None
    span = section_span(text)
    return ("" if span is None else text[span[0]:span[1]]), captured_env(text)


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
    repro = render_repro(data, n_samples, title)
    leaks = data.scrub.leaks(repro)
    if leaks:
        raise DraftError(f"refusing to write repro.py: it would contain machine-identifying text {leaks[:3]}")
    # A redraft (e.g. after `specfuzz bisect` or `specfuzz impact` added to the entry) keeps the record
    # of a verification of the same repro.py, and the environment it captured: only when the script is
    # byte for byte the one run.
    kept, env = _kept_record(out, repro)
    issue = render_issue(data, plot_what=plot_what, repro_samples=n_samples, top=top, repro=repro, env=env)
    if kept:
        issue = issue.rstrip("\n") + "\n\n" + kept.rstrip("\n") + "\n"
    (out / "ISSUE.md").write_text(issue, encoding="utf-8")
    files.append(out / "ISSUE.md")
    if plot_what:
        files.append(out / "plot.png")
    (out / "repro.py").write_text(repro, encoding="utf-8")
    files.append(out / "repro.py")
    hint = "add --correct for the sampler without the injected bug" if data.engine_kind == "reference" and data.inject else ""
    return DraftResult(out, files, title, hint)
