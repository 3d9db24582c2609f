"""The bugs a corpus holds, one row per bug: the table on the README's front page.

Entries are joined into one bug when the corpus says they are one: an entry shrunk into
another (``extra.shrunk_into``), marked a duplicate (``extra.duplicate_of``,
``extra.suspected_duplicate_of``), crashing with the same cause (``extra.crash_cause``),
traced to the same upstream issue, or likely one bug met under several methods (triage's
``related``). A bug is *diagnosed* when one of its entries records what goes wrong
(``extra.title``, ``mechanism``, ``root_cause`` or ``upstream``); the table lists those, and
counts the others, which the findings page lists entry by entry.

Each row: engine and version, where it ran, one line of what goes wrong (the title of the
representative entry's drafted ``ISSUE.md``), the releases affected (``specfuzz bisect``'s
result, ``extra.bisect``) and a link to the draft.

``python -m specfuzz.fuzz.bug_table README.md`` rewrites the table between the markers
:data:`BEGIN` and :data:`END` in that file (``--check``: exit 1 when it is stale).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from specfuzz.fuzz.triage import EntryReport, triage, upstream_of

BEGIN = "<!-- bug-table:begin (python -m specfuzz.fuzz.bug_table README.md) -->"
END = "<!-- bug-table:end -->"
# Keys of ``extra`` that name another entry of the same bug.
SAME_BUG_LINKS = ("shrunk_into", "duplicate_of", "suspected_duplicate_of")
# Keys of ``extra`` that say what goes wrong: an entry holding one is diagnosed.
DIAGNOSIS_KEYS = ("title", "mechanism", "root_cause", "upstream")
# Longest "what goes wrong" line in the table.
MAX_WHAT = 150
# What triage's symptom (effect.symptom) of an entry's counts says, as the table words it.
SYMPTOM_TEXT = {"past end": "with outputs past a stop token or EOS", "impossible output": "with another output μ forbids",
                "frequencies": "with frequencies off μ"}
KIND_NOUN = {"finding": "speculation finding", "calibration": "sampling failure", "crash": "crash"}
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "hf-transformers": "transformers", "llama.cpp": "llama.cpp"}


@dataclass
class Bug:
    reports: list[EntryReport] = field(default_factory=list)

    @property
    def head(self) -> EntryReport:
        """The entry that stands for the bug: a titled one, else the end of a shrink chain,
        else a shrunk one, else the most recently seen."""
        def rank(r: EntryReport) -> tuple:
            x = r.entry.extra
            return ("title" in x, "mechanism" in x or "root_cause" in x, not any(k in x for k in SAME_BUG_LINKS),
                    bool(x.get("shrunk")), r.entry.last_seen, r.rel)
        return max(self.reports, key=rank)

    @property
    def diagnosed(self) -> bool:
        return any(k in r.entry.extra for r in self.reports for k in DIAGNOSIS_KEYS)


def _name(rel: str) -> str:
    return Path(rel).name.removesuffix(".json")


def bugs(root: Path | str) -> list[Bug]:
    """The corpus's entries joined into bugs (see the module docstring), in a stable order."""
    report = triage(root)
    reports = [r for r in report.reports if r.entry.kind in ("finding", "calibration", "crash")]
    parent = list(range(len(reports)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(i: int, j: int) -> None:
        parent[find(i)] = find(j)

    by_name = {_name(r.rel): i for i, r in enumerate(reports)}
    by_sig: dict[str, list[int]] = {}
    for i, r in enumerate(reports):
        by_sig.setdefault(r.entry.signature, []).append(i)
    by_cause: dict[tuple, int] = {}
    for i, r in enumerate(reports):
        for key in SAME_BUG_LINKS:
            other = r.entry.extra.get(key)
            if isinstance(other, str) and _name(other) in by_name:
                union(i, by_name[_name(other)])
        cause = r.entry.extra.get("crash_cause")
        if isinstance(cause, str):
            k = (str(r.entry.engine.get("name")), cause)
            union(i, by_cause.setdefault(k, i))
    for g in report.groups:
        members = [i for i in by_sig.get(g.signature, [])]
        for sig in list(g.related) + list(g.same_upstream):
            for i in members:
                for j in by_sig.get(sig, []):
                    union(i, j)
        for i in members[1:]:
            union(members[0], i)
    joined: dict[int, Bug] = {}
    for i, r in enumerate(reports):
        joined.setdefault(find(i), Bug()).reports.append(r)
    out = list(joined.values())
    for b in out:
        b.reports.sort(key=lambda r: r.rel)
    return sorted(out, key=lambda b: (str(b.head.entry.engine.get("name")), b.head.rel))


def draft_path(root: Path, rel: str) -> Path | None:
    """The drafted ISSUE.md of an entry (``drafts/NAME/ISSUE.md`` beside its folder's corpus root)."""
    name = _name(rel)
    parts = Path(rel).parts
    for base in (root / Path(*parts[:-1]), root / Path(*parts[:1]) if len(parts) > 2 else None, root):
        if base is None:
            continue
        p = base / "drafts" / name / "ISSUE.md"
        if p.is_file():
            return p
    return None


def what_goes_wrong(root: Path, r: EntryReport) -> str:
    """One line: the entry's title, or its draft's title without the engine prefix."""
    title = r.entry.extra.get("title")
    if not isinstance(title, str) or not title.strip():
        p = draft_path(root, r.rel)
        first = p.read_text(encoding="utf-8").splitlines()[0] if p is not None else ""
        # "# [Bug]: vLLM 0.32.0: what goes wrong": the form's tag, then the engine prefix
        first = re.sub(r"^\[[^\]]*\]:\s*", "", first.lstrip("# "))
        title = first.split(": ", 1)[-1] if first else (r.entry.evidence or r.entry.kind)
    line = " ".join(title.replace("|", "/").split())
    line = line if len(line) <= MAX_WHAT else line[: MAX_WHAT - 1].rstrip() + "…"
    up = upstream_of(r.entry)
    if up and "/issues/" in up:
        repo, num = up.rstrip("/").split("github.com/")[-1].split("/issues/")
        line += f" ([{repo.split('/')[-1]}#{num}]({up}))"
    return line


def releases(b: Bug) -> str:
    """The releases affected: a diagnosis's own statement (``extra.releases``, where a bisect's
    verdict needs a correction, e.g. older releases fail the same way with another exception),
    else the first bisected entry's (``extra.bisect``)."""
    for r in [b.head] + b.reports:
        said = r.entry.extra.get("releases")
        if isinstance(said, str) and said.strip():
            return " ".join(said.split())
    for r in [b.head] + b.reports:
        bis = r.entry.extra.get("bisect")
        if not isinstance(bis, dict) or not bis.get("first_bad"):
            continue
        first, last_good = bis["first_bad"]["version"], bis.get("last_good")
        start = f"{first} ({last_good['version']} passes)" if last_good else f"{first} (oldest that runs it)"
        fixed = bis.get("first_fixed")
        end = f"fixed in {fixed['version']}" if fixed else f"still in {(bis.get('last_bad') or {}).get('version', '?')}"
        return f"{bis.get('package', '')} {start} to {end}".strip()
    return "not bisected"


def where(r: EntryReport) -> str:
    device = str(r.entry.engine.get("device") or "")
    if "H100" in device:
        return "H100"
    if "H200" in device or r.rel.startswith("h200/"):
        return "H200"
    return "CPU"


def kind_text(r: EntryReport) -> str:
    return {"finding": "speculation", "calibration": "sampling (speculation off)", "crash": "crash"}[r.entry.kind]


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "es" if noun.endswith("sh") else "s")


def markdown(root: Path | str, link_prefix: str = "corpus/", findings_link: str = "docs/findings.md") -> str:
    """The table: a row per diagnosed bug, then a row per engine release and kind counting the
    entries not yet diagnosed (listed one by one on the findings page)."""
    root = Path(root)
    all_bugs = bugs(root)
    shown = [b for b in all_bugs if b.diagnosed]
    lines = ["| engine | what goes wrong | kind | releases affected | draft |", "|---|---|---|---|---|"]
    for b in shown:
        h = b.head
        eng = h.entry.engine
        name = f"{ENGINE_NAMES.get(str(eng.get('name')), eng.get('name'))} {eng.get('version', '')} ({where(h)})"
        p = draft_path(root, h.rel)
        link = f"[{_name(h.rel)}]({link_prefix}{p.relative_to(root).as_posix()})" if p else f"`{_name(h.rel)}`"
        more = f" (+{_count(len(b.reports) - 1, 'entry').replace('entrys', 'entries')})" if len(b.reports) > 1 else ""
        lines.append(f"| {name} | {what_goes_wrong(root, h)} | {kind_text(h)} | {releases(b)} | {link}{more} |")
    rest: dict[tuple, list[Bug]] = {}
    for b in all_bugs:
        if not b.diagnosed:
            eng = b.head.entry.engine
            rest.setdefault((str(eng.get("name")), str(eng.get("version", "")), b.head.entry.kind), []).append(b)
    for (eng_name, version, kind), bs in sorted(rest.items()):
        rs = [r for b in bs for r in b.reports]
        places = ", ".join(sorted({where(r) for r in rs}))
        symptoms: dict[str, int] = {}
        for r in rs:
            text = SYMPTOM_TEXT.get(r.effect.symptom or "")
            if text:
                symptoms[text] = symptoms.get(text, 0) + 1
        what = f"{_count(len(rs), KIND_NOUN[kind])} in {_count(len(bs), 'group')}, not yet diagnosed" + (
            ": " + ", ".join(f"{n} {s}" for s, n in sorted(symptoms.items(), key=lambda x: -x[1])) if symptoms else "")
        lines.append(f"| {ENGINE_NAMES.get(eng_name, eng_name)} {version} ({places}) | {what} | {kind_text(rs[0])} | "
                     f"- | [findings]({findings_link}) |")
    return "\n".join(lines)


def rewrite(path: Path, table: str) -> str:
    """The file's text with the table between the markers replaced."""
    text = path.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path}: no bug table markers ({BEGIN!r} ... {END!r})")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specfuzz.fuzz.bug_table", description=__doc__.split("\n\n")[0])
    ap.add_argument("file", type=Path, help="a Markdown file holding the table markers (README.md)")
    ap.add_argument("--corpus", type=Path, default=Path("corpus"))
    ap.add_argument("--check", action="store_true", help="exit 1 when the table in FILE is stale; write nothing")
    a = ap.parse_args(argv)
    new = rewrite(a.file, markdown(a.corpus))
    if a.check:
        if new != a.file.read_text(encoding="utf-8"):
            print(f"{a.file}: the bug table is stale; run python -m specfuzz.fuzz.bug_table {a.file}", file=sys.stderr)
            return 1
        return 0
    a.file.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
