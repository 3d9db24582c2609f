"""The README's bug table is generated from corpus/ (specfuzz.fuzz.bug_table) and kept current."""

from __future__ import annotations

from pathlib import Path

from specfuzz.fuzz.bug_table import BEGIN, END, bugs, main, markdown

ROOT = Path(__file__).resolve().parents[1]


def test_readme_bug_table_is_the_one_generated_from_the_corpus():
    assert main([str(ROOT / "README.md"), "--corpus", str(ROOT / "corpus"), "--check"]) == 0, (
        "README.md's bug table is stale: run python -m specfuzz.fuzz.bug_table README.md")


def test_entries_the_corpus_links_are_one_bug_and_every_entry_is_counted_once():
    found = bugs(ROOT / "corpus")
    names = [Path(r.rel).name for b in found for r in b.reports]
    assert len(names) == len(set(names))  # each entry in exactly one bug
    of = {Path(r.rel).name: i for i, b in enumerate(found) for r in b.reports}
    # a shrink chain (extra.shrunk_into) and a marked duplicate (extra.duplicate_of) are one bug
    assert of["crash-4a0e0ae88ccec0ec.json"] == of["crash-812bb3a92cd7b1d2.json"] == of["crash-8364f7220f732b16.json"]
    assert of["crash-ecc85dc270938fe3.json"] == of["crash-c35473a506b6e6fb.json"]
    # different engines never share a bug
    for b in found:
        assert len({str(r.entry.engine.get("name")) for r in b.reports}) == 1


def test_table_names_every_entry_and_links_existing_drafts(tmp_path):
    text = markdown(ROOT / "corpus")
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| engine")]
    total = 0
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[-1].startswith("[findings]"):
            total += int(cells[1].split()[0])
        else:
            link = cells[-1].split("](", 1)[1].split(")", 1)[0]
            assert (ROOT / link).is_file(), link
            more = cells[-1].split("(+")
            total += 1 + (int(more[1].split()[0]) if len(more) > 1 else 0)
    assert total == sum(len(b.reports) for b in bugs(ROOT / "corpus"))
    stale = tmp_path / "R.md"
    stale.write_text(f"x\n{BEGIN}\nold\n{END}\ny\n")
    assert main([str(stale), "--corpus", str(ROOT / "corpus"), "--check"]) == 1
    assert main([str(stale), "--corpus", str(ROOT / "corpus")]) == 0
    assert stale.read_text().startswith("x\n") and text in stale.read_text()
