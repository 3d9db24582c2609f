"""Bad input on the command line: one line naming the value and what is allowed, exit status 2,
no traceback, and nothing in the corpus or its campaign state changed (issue 15).

Each test runs the real ``specfuzz`` command group (click's CliRunner on ``specfuzz.cli.main``,
the object the ``specfuzz`` entry point calls; one test goes through the entry point in a
subprocess). The Hypothesis test at the end fuzzes the CLI itself: it draws command lines
with one bad value each (bad numbers and durations, unknown engines, methods and bug
classes, unreadable or corrupted files, corrupted corpus entries and state files, folders
that cannot be written) and checks the rule on every one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specfuzz.cli import main
from specfuzz.fuzz.campaign import STATE_SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[1]
ENTRY = ROOT / "corpus" / "regression" / "regression-N6.json"  # a real entry (reference engine)


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``root``: bytes and modification time (ns)."""
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def invoke(args: list[str]):
    return CliRunner().invoke(main, args, catch_exceptions=False)


def assert_one_line_exit_2(result, *needles: str) -> str:
    """The rule: exit 2, exactly one line on stderr, starting 'error:', naming the value; no traceback."""
    err = result.stderr.strip()
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output, result.output
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


@pytest.fixture
def corpus(tmp_path) -> Path:
    """A corpus holding one entry and a valid campaign state."""
    c = tmp_path / "corpus"
    (c / ".specfuzz").mkdir(parents=True)
    (c / ENTRY.name).write_bytes(ENTRY.read_bytes())
    state = {"schema_version": 1, "spender": {"alpha_total": 0.001, "count": 7, "kind": "alpha_spender", "schema_version": 1},
             "searches": 3, "totals": {"seconds": 12.5, "runs": 2, "methods": {"ngram": {"families": 3, "patterns": 5, "samples": 900}}},
             "simplest_run": ["abc"]}
    (c / ".specfuzz" / "state.json").write_text(json.dumps(state, indent=1) + "\n")
    return c


# ----------------------------------------------------------------------------- items 1-6 of issue 15


def test_item1_max_vocab_below_two_is_refused_on_one_line(corpus, tmp_path):
    before = snapshot(corpus)
    r = invoke(["--max-vocab", "1", "--corpus", str(corpus), "--work-dir", str(tmp_path / "w"), "--quiet"])
    assert_one_line_exit_2(r, "--max-vocab", "'1'", "an integer in [2, 4096]")
    assert snapshot(corpus) == before


def test_item2_a_corpus_folder_that_cannot_be_created_is_refused_on_one_line(tmp_path):
    r = invoke(["--corpus", "/proc/forbidden", "--work-dir", str(tmp_path / "w"), "--quiet"])
    assert_one_line_exit_2(r, "--corpus", "'/proc/forbidden'", "cannot be created")
    assert not Path("/proc/forbidden").exists()
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    r = invoke(["--corpus", str(blocker / "corpus"), "--work-dir", str(tmp_path / "w"), "--quiet"])
    assert_one_line_exit_2(r, "--corpus", "is not a folder")


def test_item3_negative_samples_are_refused_before_a_campaign_runs(corpus, tmp_path):
    before = snapshot(corpus)
    t0 = time.monotonic()
    r = invoke(["--samples", "-5", "--budget", "30s", "--corpus", str(corpus), "--work-dir", str(tmp_path / "w"), "--quiet"])
    assert_one_line_exit_2(r, "--samples", "'-5'", "an integer in [1, 1000000000]")
    assert time.monotonic() - t0 < 10  # refused at parse time: no campaign ran
    assert snapshot(corpus) == before


def test_max_findings_must_be_positive_and_is_refused_with_ray(corpus, tmp_path):
    before = snapshot(corpus)
    args = ["--budget", "30s", "--corpus", str(corpus), "--work-dir", str(tmp_path / "w"), "--quiet"]
    assert_one_line_exit_2(invoke(["--max-findings", "0", *args]), "--max-findings", "'0'", "an integer in [1,")
    assert_one_line_exit_2(invoke(["--max-findings", "1", "--ray", *args]), "--max-findings", "not with --ray")
    assert snapshot(corpus) == before


def test_item4_a_damaged_campaign_state_is_refused_and_reset_state_keeps_it_aside(corpus, tmp_path):
    state = corpus / ".specfuzz" / "state.json"
    full = state.read_bytes()
    state.write_bytes(full[: len(full) // 2])  # truncated, as by a full disk
    before = snapshot(corpus)
    args = ["--engine", "reference", "--budget", "2s", "--samples", "50", "--corpus", str(corpus), "--work-dir", str(tmp_path / "w"), "--quiet"]
    r = invoke(args)
    line = assert_one_line_exit_2(r, str(state), "not JSON", "--reset-state")
    assert "α" in line  # it says what is at stake
    assert snapshot(corpus) == before  # the damaged file is left as it is
    r = invoke(args + ["--reset-state"])
    assert r.exit_code == 0, r.output
    kept = sorted((corpus / ".specfuzz").glob("state.json.damaged-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == full[: len(full) // 2]
    assert kept[0].name in " ".join(r.output.split())
    fresh = json.loads(state.read_text())
    assert fresh["schema_version"] == STATE_SCHEMA_VERSION and fresh["totals"]["runs"] == 1  # a new state, counting this run only


def test_item5_replay_of_a_file_that_is_not_a_corpus_entry_is_refused(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"a": 1}')
    r = invoke(["replay", str(bad), "--work-dir", str(tmp_path / "w")])
    assert_one_line_exit_2(r, "'" + str(bad) + "'", "not a corpus entry", "corpus entry file")
    assert "0 of 0" not in r.output
    empty = tmp_path / "empty"
    empty.mkdir()
    r = invoke(["replay", str(empty), "--work-dir", str(tmp_path / "w")])
    assert_one_line_exit_2(r, "no corpus entries")


def test_item6_check_of_json_that_is_not_a_case_says_what_a_case_is(tmp_path, corpus):
    bad = tmp_path / "bad.json"
    bad.write_text('{"a": 1}')
    before = snapshot(corpus)
    r = invoke(["check", str(bad), "--corpus", str(corpus), "--work-dir", str(tmp_path / "w")])
    line = assert_one_line_exit_2(r, "'" + str(bad) + "'", "not a case", "target_table")
    assert "schema_version=None: 1" not in line
    assert snapshot(corpus) == before


def test_the_installed_entry_point_prints_the_same_one_line(tmp_path):
    """Through ``python -m specfuzz`` (what the ``specfuzz`` script runs), not only CliRunner."""
    p = subprocess.run([sys.executable, "-m", "specfuzz", "--max-vocab", "1", "--quiet", "--work-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines() == ["error: Invalid value for '--max-vocab': '1': an integer in [2, 4096]"]
    assert p.stdout == ""


# ----------------------------------------------------------------------------- the CLI, fuzzed

# Values no option accepts, with a piece of the message that names them.
BAD_COUNTS = st.sampled_from(["-5", "0", "1.5", "nan", "ten", "", "1e3", "--", "9" * 30])
BAD_FLOATS = st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1", "2", "x", "1e309"])
BAD_DURATIONS = st.sampled_from(["0", "-1", "soon", "10x", "1h30", "m", "nan", "inf", "0s", "1 h", "1e999"])
BAD_ENGINES = st.sampled_from(["nope", "vllmx", "no_such_pkg_xyz:Engine", "os:", ":Engine", "a b:C", "reference:"])
BAD_METHODS = st.sampled_from(["bogus", "NGRAM", "draft-model", "", "none2"])
BAD_BUGS = st.sampled_from(["N0", "N8", "n1", "X", ""])

NUMBER_OPTIONS = {
    "fuzz": {"--samples": BAD_COUNTS, "--max-vocab": st.sampled_from(["1", "0", "-3", "5000", "two"]),
             "--max-tokens": st.sampled_from(["0", "129", "-1", "x"]), "--alpha": BAD_FLOATS, "--screen-alpha": BAD_FLOATS,
             "--workers": st.sampled_from(["0", "65", "-1"]), "--batch": BAD_COUNTS,
             "--patterns": st.sampled_from(["0", "65", "x"]), "--seed": st.sampled_from(["-1", "x", "1.5"]),
             "--max-findings": BAD_COUNTS},
    "check": {"--samples": BAD_COUNTS, "--alpha": BAD_FLOATS, "--tolerance": st.sampled_from(["-0.1", "1", "nan", "inf"]),
              "--seed": st.sampled_from(["-1", "x"])},
    "replay": {"--samples": BAD_COUNTS, "--alpha": BAD_FLOATS, "--seed": st.sampled_from(["-7", "y"])},
    "shrink": {"--samples": BAD_COUNTS, "--alpha": BAD_FLOATS, "--attempts": st.sampled_from(["0", "21", "x"])},
    "catalogue": {"--max-samples": BAD_COUNTS, "--alpha": BAD_FLOATS, "--seed": st.sampled_from(["-2"])},
    "calibrate": {"--samples": BAD_COUNTS, "--alpha": BAD_FLOATS},
    "law": {"--top": BAD_COUNTS},
    "triage": {"--samples": BAD_COUNTS, "--alpha": BAD_FLOATS},
    "draft": {"--samples": BAD_COUNTS, "--top": BAD_COUNTS},
}


def _corruptions(text: str):
    """Strategies for corrupted versions of a JSON document (never valid as the same kind)."""
    body = text.rstrip()
    truncated = st.integers(0, len(body) - 1).map(lambda n: body[:n].encode())
    garbage = st.binary(min_size=1, max_size=64).filter(lambda b: not b.strip().startswith((b"{", b"[")))
    return st.one_of(truncated, garbage, st.just(b"\xff\xfe\x00"), st.just(b"[]"), st.just(b"null"), st.just(b"{}"))


ENTRY_DOC = json.loads(ENTRY.read_text())
FIELD_DAMAGE = [
    ("schema_version", 2), ("kind", "bogus"), ("case", "not a case"), ("engine", None), ("case.target_table", "x"),
    ("case.prompt", [99]), ("case.schema_version", None), ("case.params", {"top_p": 7}), ("counts", "x"),
    ("case.target_table", [[0.0, "nan"], [0.0, 0.0]]), ("case.spec", {"method": "bogus"}),
]


def _damaged_entry(where: str, value) -> bytes:
    d = json.loads(json.dumps(ENTRY_DOC))
    node, *path = where.split(".")
    if path:
        d[node][path[0]] = value
    else:
        d[node] = value
    return json.dumps(d).encode()


BAD_ENTRY_BYTES = st.one_of(_corruptions(ENTRY.read_text()),
                            st.sampled_from(FIELD_DAMAGE).map(lambda fv: _damaged_entry(*fv)))
BAD_CASE_BYTES = st.one_of(_corruptions(json.dumps(ENTRY_DOC["case"])),
                           st.sampled_from([fv for fv in FIELD_DAMAGE if fv[0].startswith("case.")])
                           .map(lambda fv: json.dumps({**ENTRY_DOC["case"], fv[0][5:]: fv[1]}).encode()))
STATE_TEXT = json.dumps({"schema_version": 1, "spender": {"alpha_total": 0.001, "count": 7, "kind": "alpha_spender",
                                                          "schema_version": 1}, "searches": 3, "totals": {}, "simplest_run": []})
BAD_STATE_BYTES = st.one_of(
    _corruptions(STATE_TEXT),
    st.sampled_from([{"schema_version": 9}, {"schema_version": 1, "spender": None}, {"schema_version": 1, "spender": {
        "alpha_total": 2, "count": 1, "kind": "alpha_spender", "schema_version": 1}}, {**json.loads(STATE_TEXT), "searches": -1},
        {**json.loads(STATE_TEXT), "totals": {"runs": "x"}}, {**json.loads(STATE_TEXT), "simplest_run": "abc"}])
    .map(lambda d: json.dumps(d).encode()),
)


def _unwritable_dirs(tmp: Path) -> list[str]:
    blocker = tmp / "plain-file"
    blocker.write_text("x")
    out = ["/proc/specfuzz-nope/corpus", str(blocker), str(blocker / "below")]
    if os.geteuid() != 0:  # root writes into read-only folders; a read-only folder refuses others
        ro = tmp / "read-only"
        ro.mkdir(exist_ok=True)
        ro.chmod(0o555)
        out.append(str(ro))
    return out


@st.composite
def bad_command_lines(draw, tmp: Path, corpus: Path):
    """(argv, needle): a command line with exactly one bad value, and a piece of the error naming it."""
    work = ["--work-dir", str(tmp / "work")]
    files = tmp / "inputs"
    files.mkdir(exist_ok=True)
    entry = str(corpus / ENTRY.name)
    kind = draw(st.sampled_from(["number", "duration", "engine", "method", "bug", "entry", "case", "state", "folder",
                                 "missing"]))
    if kind == "number":
        cmd = draw(st.sampled_from(sorted(NUMBER_OPTIONS)))
        opt = draw(st.sampled_from(sorted(NUMBER_OPTIONS[cmd])))
        value = draw(NUMBER_OPTIONS[cmd][opt])
        # Small budgets first: the bad value comes last and wins (click keeps an option's last value).
        small = ["--samples", "10"]
        base = {"fuzz": ["fuzz", "--corpus", str(corpus), *work, "--quiet", "--budget", "1s", *small],
                "check": ["check", entry, "--corpus", str(corpus), *work, *small], "replay": ["replay", entry, *work, *small],
                "shrink": ["shrink", entry, *work, "--dry-run", "--budget", "1s", *small],
                "catalogue": ["catalogue", "--max-samples", "10"], "calibrate": ["calibrate", *work, *small],
                "law": ["law", entry], "triage": ["triage", str(corpus)],
                "draft": ["draft", entry, "--out", str(tmp / "drafts")]}[cmd]
        return base + [f"{opt}={value}"], opt
    if kind == "duration":
        value = draw(BAD_DURATIONS)
        cmd = draw(st.sampled_from([["fuzz", "--corpus", str(corpus), *work, "--quiet"], ["shrink", entry, *work, "--dry-run"],
                                    ["draft", entry, "--out", str(tmp / "drafts"), "--verify"]]))
        opt = "--verify-timeout" if cmd[0] == "draft" else "--budget"
        return cmd + [f"{opt}={value}"], opt
    if kind == "engine":
        value = draw(BAD_ENGINES)
        cmd = draw(st.sampled_from([["fuzz", "--corpus", str(corpus), *work, "--quiet"], ["check", entry, *work],
                                    ["replay", entry, *work], ["calibrate", *work], ["shrink", entry, *work, "--dry-run"]]))
        return cmd + [f"--engine={value}"], "--engine"
    if kind == "method":
        return ["fuzz", "--corpus", str(corpus), *work, "--quiet", f"--method={draw(BAD_METHODS)}"], "--method"
    if kind == "bug":
        cmd = draw(st.sampled_from([["fuzz", "--corpus", str(corpus), *work, "--quiet", "--inject"], ["catalogue", "--bug"],
                                    ["check", entry, *work, "--inject"]]))
        return cmd + [draw(BAD_BUGS)], cmd[-1]
    if kind in ("entry", "case"):
        p = files / f"damaged-{kind}.json"
        p.write_bytes(draw(BAD_ENTRY_BYTES if kind == "entry" else BAD_CASE_BYTES))
        # law and check take any JSON holding a valid case, so damaged entries go to the entry commands only.
        cmd = (draw(st.sampled_from([["replay", str(p), *work], ["shrink", str(p), *work], ["draft", str(p), "--out", str(tmp / "d")]]))
               if kind == "entry" else draw(st.sampled_from([["law", str(p)], ["check", str(p), "--corpus", str(corpus), *work]])))
        return cmd, p.name
    if kind == "state":
        (corpus / ".specfuzz" / "state.json").write_bytes(draw(BAD_STATE_BYTES))
        return ["fuzz", "--engine", "reference", "--corpus", str(corpus), *work, "--quiet", "--budget", "5s"], "state.json"
    if kind == "folder":
        folder = draw(st.sampled_from(_unwritable_dirs(tmp)))
        cmd, opt = draw(st.sampled_from([
            (["fuzz", "--quiet", *work, "--corpus"], "--corpus"), (["fuzz", "--quiet", "--corpus", str(corpus), "--work-dir"], "--work-dir"),
            (["check", entry, *work, "--corpus"], "--corpus"), (["catalogue", "--store"], "--store"),
            (["draft", entry, "--out"], "--out"), (["calibrate", "--work-dir"], "--work-dir"),
            (["replay", entry, "--work-dir"], "--work-dir"),
        ]))
        return cmd + [folder], opt
    missing = str(tmp / "no-such-file.json")
    cmd = draw(st.sampled_from([["law", missing], ["check", missing, *work], ["replay", missing, *work],
                                ["shrink", missing, *work], ["draft", missing, "--corpus", str(corpus)], ["triage", missing]]))
    return cmd, "no-such-file.json"


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cli-fuzz")


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzzed_bad_command_lines_get_one_line_exit_2_and_leave_the_corpus_untouched(fuzz_root, data):
    tmp = fuzz_root
    corpus = tmp / "corpus"
    if not (corpus / ".specfuzz").is_dir():
        (corpus / ".specfuzz").mkdir(parents=True)
    (corpus / ENTRY.name).write_bytes(ENTRY.read_bytes())
    (corpus / ".specfuzz" / "state.json").write_text(STATE_TEXT)
    argv, needle = data.draw(bad_command_lines(tmp, corpus), label="argv")
    before = snapshot(corpus)
    r = CliRunner().invoke(main, argv, catch_exceptions=False)
    assert_one_line_exit_2(r, needle)
    assert snapshot(corpus) == before, argv
