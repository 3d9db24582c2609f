"""`specfuzz bisect`: the release search, a synthetic engine package bisected end to end, bad input.

The end-to-end test builds tiny wheels of a synthetic engine package (``specfuzz-toy-engine``
1.0 ... 2.1, a wrapper of the reference sampler with catalogued bug N5 switched on in
1.2-1.6 and a release, 1.3, that refuses the case's speculation method), installs each
into its own environment with uv (numpy comes from the package index), and bisects a
finding stored on 1.6: the first bad release must be exactly 1.2, the last good 1.1, the
first fixed 2.0, and 1.3 must be reported as unable to run the case.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specfuzz.fuzz.bisect import crash_fingerprint, draft_lines, search
from specfuzz.fuzz.release_envs import Release, parse_range

ROOT = Path(__file__).resolve().parents[1]
SPECFUZZ = [sys.executable, "-m", "specfuzz"]
TOY = "specfuzz-toy-engine"
# version -> (bug injected, speculation methods refused)
TOY_RELEASES = {
    "1.0": (None, ()), "1.1": (None, ()), "1.2": ("N5", ()), "1.3": ("N5", ("draft_model",)),
    "1.4": ("N5", ()), "1.5": ("N5", ()), "1.6": ("N5", ()), "2.0": (None, ()), "2.1": (None, ()),
}
TOY_MODULE = '''
"""A synthetic engine release for specfuzz's bisect test (version {version})."""
import json
from pathlib import Path

import numpy as np

import specfuzz.tablegen
from specfuzz.engines.reference_engine import ReferenceEngine
from specfuzz.errors import InvalidInput

__version__ = {version!r}
BUG = {bug!r}
REFUSES = {refuses!r}


def _load_table(ckpt_dir):
    """The [V, V] table from lm_head, read with numpy alone (float32 checkpoints)."""
    raw = (Path(ckpt_dir) / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    meta = json.loads(raw[8:8 + n])["lm_head.weight"]
    a, b = meta["data_offsets"]
    lm = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=np.float32).reshape(meta["shape"])  # [V, H]
    v = lm.shape[0]
    return np.ascontiguousarray(lm[:, :v].T)  # [V, V]


class ToyEngine(ReferenceEngine):
    name = "toy"

    def __init__(self):
        super().__init__(inject=BUG)

    def version(self):
        return {{**super().version(), "name": "toy", "version": __version__}}

    def generate(self, requests):
        if BUG and any(r.params.top_k == 2 for r in requests):  # the buggy releases also crash on top_k=2
            raise RuntimeError(f"index {{885600000 + len(requests)}} is out of bounds for dimension 1 with size 3")
        return super().generate(requests)

    def start(self, config):
        # As vLLM 0.22-0.24 inspect the model class: a plain interpreter in a subprocess must
        # import this release (bisect's prebuilt releases: their site folder on its PYTHONPATH).
        import subprocess
        import sys

        # (found, not imported: this module needs specfuzz, which only the engine process is given)
        subprocess.run([sys.executable, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('toy_engine') is None)"],
                       check=True)
        spec = config.speculation
        if spec is not None and spec.method in REFUSES:
            raise InvalidInput("speculation method", spec.method, "not supported by toy-engine " + __version__)
        specfuzz.tablegen.load_table = _load_table
        super().start(config)
'''


def _wheel(out: Path, version: str, bug: str | None, refuses: tuple) -> Path:
    """A real (tiny) wheel of the synthetic engine package, written by hand."""
    dist = f"{TOY.replace('-', '_')}-{version}"
    files = {
        "toy_engine/__init__.py": TOY_MODULE.format(version=version, bug=bug, refuses=refuses).encode(),
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {TOY}\nVersion: {version}\nRequires-Dist: numpy\n".encode(),
        f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: specfuzz-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    path = out / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return path


def _toy_entry(path: Path, version: str = "1.6", engine_name: str = "toy") -> Path:
    """A finding entry stored on the toy engine: regression N5's case (draft_model K=1, V=4)."""
    data = json.loads((ROOT / "corpus" / "regression" / "regression-N5.json").read_text())
    data["kind"] = "finding"
    data["engine"] = {"name": engine_name, "version": version, "engine_spec": "toy_engine:ToyEngine", "package": TOY}
    data["extra"] = {}
    path.write_text(json.dumps(data, indent=1))
    return path


def _run(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([*SPECFUZZ, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


# ----------------------------------------------------------------------------- the search


def test_search_finds_the_exact_boundaries_with_every_release_testable():
    outcomes = ["good"] * 4 + ["bad"] * 5 + ["good"] * 3  # introduced in 4, fixed in 9
    calls: list[int] = []

    def outcome(i):
        calls.append(i)
        return outcomes[i]

    res = search(len(outcomes), 6, outcome)
    assert (res.last_good, res.first_bad, res.last_bad, res.first_fixed) == (3, 4, 8, 9)
    assert len(calls) == len(set(calls)) <= 9  # each release at most once, fewer than all 12


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 40).flatmap(lambda n: st.tuples(
    st.just(n), st.integers(0, n - 1), st.integers(0, n - 1),
    st.lists(st.sampled_from(["cannot-run", "not-installable"]) | st.none(), min_size=n, max_size=n))))
def test_search_boundaries_are_adjacent_testable_releases_around_one_bad_stretch(args):
    n, a, b, untestable = args
    lo, hi = min(a, b), max(a, b)
    truth = ["bad" if lo <= i <= hi else "good" for i in range(n)]
    anchor = (lo + hi) // 2
    untestable[anchor] = None
    seen = {i: (u or truth[i]) for i, u in enumerate(untestable)}
    res = search(n, anchor, lambda i: seen[i])
    assert res.anchor_bad
    fb, lg, lb, ff = res.first_bad, res.last_good, res.last_bad, res.first_fixed
    assert seen[fb] == "bad" and seen[lb] == "bad" and fb <= anchor <= lb
    # Everything testable between the boundaries is untestable: no testable release was skipped.
    if lg is None:
        assert res.untested_before == list(range(fb))  # every older release is named as not testable / not tested
        k = next(i for i in range(n) if seen[i] in ("good", "bad"))
        if all(seen[i] in ("good", "bad") for i in range(k, n)):  # untestable releases only at the old end
            assert all(seen[i] not in ("good", "bad") for i in range(fb))
    else:
        assert seen[lg] == "good" and lg < fb and all(seen[i] not in ("good", "bad") for i in range(lg + 1, fb))
        assert res.untested_before == list(range(lg + 1, fb))
    if ff is None:
        assert all(seen[i] not in ("good", "bad") for i in range(lb + 1, n))
    else:
        assert seen[ff] == "good" and ff > lb and all(seen[i] not in ("good", "bad") for i in range(lb + 1, ff))
    # With one bad stretch, the true boundary lies within the reported bounds.
    assert (lg is None or lg < lo) and lo <= fb and lb <= hi and (ff is None or ff > hi)


def test_search_stops_when_the_entry_does_not_reproduce_on_its_own_release():
    res = search(5, 4, lambda i: "good")
    assert not res.anchor_bad and res.first_bad is None


def test_crash_fingerprint_ignores_numbers_and_the_wrapper_words():
    stored = "engine exception: generate raised RuntimeError: index 885600070 is out of bounds for dimension 1 with size 3"
    again = "engine exception: generate raised RuntimeError: index 195092853 is out of bounds for dimension 1 with size 3"
    older = "engine raise: RuntimeError: index 12 is out of bounds for dimension 1 with size 3"
    other = "engine exception: generate raised ValueError: top_k must be positive"
    assert crash_fingerprint(stored) == crash_fingerprint(again) == crash_fingerprint(older)
    assert crash_fingerprint(stored) != crash_fingerprint(other)


def test_the_same_crash_is_found_in_the_engine_log_when_only_a_generic_error_reaches_the_caller():
    from specfuzz.fuzz.bisect import _same_crash

    want = "engine exception: generate raised RuntimeError: index 885600070 is out of bounds for dimension 1 with size 5"
    dead = "engine exception: generate raised EngineDeadError: EngineCore encountered an issue. See stack trace (above)"
    log = ("(Worker pid=2933) ERROR 12-01 18:44:31 [multiproc_executor.py:1063] RuntimeError: index 1216423509 is out of "
           "bounds for dimension 1 with size 5\n(EngineCore pid=2653) ERROR 12-01 [core.py:1512] EngineCore encountered a fatal error.\n")
    assert _same_crash(want, dead, log)
    assert not _same_crash(want, dead, log.replace("index 1216423509 is out of bounds", "shape mismatch"))
    # A negative index (uninitialised memory) and vLLM's wrapper around a worker's error are the same crash.
    wrapped = ("(EngineCore pid=8193) ERROR [core.py:1136] RuntimeError: Worker failed with error 'index -308545933 is out "
               "of bounds for dimension 1 with size 5', please check the stack trace above for the root cause\n")
    assert _same_crash(want, dead, wrapped)
    assert not _same_crash(want, dead, wrapped.replace("dimension", "axis"))


def test_release_ranges_are_inclusive_and_skip_prereleases_unless_named():
    rel = [Release(v, None) for v in ("0.9", "1.0", "1.1rc1", "1.1", "2.0")]
    assert [r.version for r in parse_range("1.0..1.1", rel)] == ["1.0", "1.1"]
    assert [r.version for r in parse_range("1.1rc1..", rel)] == ["1.1rc1", "1.1", "2.0"]
    assert [r.version for r in parse_range(None, rel)] == ["0.9", "1.0", "1.1", "2.0"]


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def toy_index(tmp_path_factory):
    wheels = tmp_path_factory.mktemp("toy-wheels")
    for version, (bug, refuses) in TOY_RELEASES.items():
        _wheel(wheels, version, bug, refuses)
    return wheels, tmp_path_factory.mktemp("toy-envs")


@pytest.mark.slow
def test_bisect_finds_the_exact_release_that_introduced_and_the_one_that_fixed_a_synthetic_engine_bug(toy_index, tmp_path):
    wheels, envs = toy_index
    entry = _toy_entry(tmp_path / "finding-toy.json")
    # --jobs 2: environments of the releases the search may test next are made ahead, in a thread.
    proc = _run("bisect", str(entry), "--engine-package", TOY, "--find-links", str(wheels), "--env-dir", str(envs),
                "--samples", "300", "--work-dir", str(tmp_path / "work"), "--deps", "latest", "--jobs", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rec = json.loads(entry.read_text())["extra"]["bisect"]
    assert rec["complete"] and rec["package"] == TOY and rec["releases_in_range"] == len(TOY_RELEASES)
    assert (rec["last_good"]["version"], rec["first_bad"]["version"]) == ("1.1", "1.2")
    assert (rec["last_bad"]["version"], rec["first_fixed"]["version"]) == ("1.6", "2.0")
    probes = {p["version"]: p for p in rec["probes"]}
    assert probes["1.3"]["outcome"] == "cannot-run" and "not supported by toy-engine 1.3" in probes["1.3"]["evidence"]
    assert probes["1.2"]["outcome"] == "bad" and probes["1.1"]["outcome"] == "good"
    assert all(p["tested_at"] and p["env"]["status"] == "ready" for p in probes.values())
    assert rec["summary"] == f"{TOY}: introduced in 1.2 (1.1 passes); fixed in 2.0 (1.6 still fails)."
    assert "introduced in 1.2" in proc.stdout and "fixed in 2.0" in proc.stdout
    assert "fixed in 2.0" in "\n".join(draft_lines(rec))
    # A second bisection with the same settings reuses every stored probe: no release re-tested.
    again = _run("bisect", str(entry), "--engine-package", TOY, "--find-links", str(wheels), "--env-dir", str(envs),
                 "--samples", "300", "--work-dir", str(tmp_path / "work"), "--deps", "latest")
    assert again.returncode == 0 and "testing ..." not in again.stderr and "(stored)" in again.stderr


@pytest.mark.slow
def test_bisect_of_a_crash_entry_needs_the_same_crash_and_names_the_release_that_cannot_run(toy_index, tmp_path):
    wheels, envs = toy_index
    entry = _toy_entry(tmp_path / "crash-toy.json", version="1.6")
    data = json.loads(entry.read_text())
    data.update(kind="crash", counts=[], verdict=None, attribution=None,
                evidence="engine exception: generate raised RuntimeError: index 195092853 is out of bounds for dimension 1 with size 3")
    data["case"]["params"]["top_k"] = 2
    # The crashing batch as a campaign stores it: the case among its patterns (sent once each).
    other = dict(data["case"]["params"], top_k=-1)
    data.setdefault("extra", {})["batch_patterns"] = [{"prompt": data["case"]["prompt"], "params": data["case"]["params"]},
                                                      {"prompt": data["case"]["prompt"], "params": other}]
    entry.write_text(json.dumps(data))
    proc = _run("bisect", str(entry), "--engine-package", TOY, "--find-links", str(wheels), "--env-dir", str(envs),
                "--samples", "200", "--attempts", "1", "--work-dir", str(tmp_path / "work"), "--deps", "latest",
                "--versions", "1.0..2.0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rec = json.loads(entry.read_text())["extra"]["bisect"]
    assert (rec["last_good"]["version"], rec["first_bad"]["version"]) == ("1.1", "1.2")
    assert (rec["last_bad"]["version"], rec["first_fixed"]["version"]) == ("1.6", "2.0")
    probes = {p["version"]: p for p in rec["probes"]}
    assert probes["1.2"]["evidence"].startswith("the same crash") and "no crash in 1 runs" in probes["1.1"]["evidence"]
    assert probes["1.3"]["outcome"] == "cannot-run"


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_a_killed_bisection_keeps_the_releases_tested_and_resumes_from_them(toy_index, tmp_path, sig):
    import signal
    import time

    wheels, envs = toy_index
    entry = _toy_entry(tmp_path / "finding-toy.json")
    args = [*SPECFUZZ, "bisect", str(entry), "--engine-package", TOY, "--find-links", str(wheels), "--env-dir", str(envs),
            "--samples", "300", "--work-dir", str(tmp_path / "work"), "--deps", "latest"]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    probes: list = []
    while time.monotonic() < deadline and proc.poll() is None and not probes:
        time.sleep(0.1)
        probes = json.loads(entry.read_text()).get("extra", {}).get("bisect", {}).get("probes", [])
    assert probes and proc.poll() is None, "the bisection finished or stalled before the first release was stored"
    proc.send_signal(getattr(signal, sig))
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == (130 if sig == "SIGTERM" else -signal.SIGKILL), err
    rec = json.loads(entry.read_text())["extra"]["bisect"]  # a valid entry, whatever the moment of the kill
    assert not rec["complete"] and len(rec["probes"]) >= 1
    kept = {p["version"]: p["outcome"] for p in rec["probes"]}
    again = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert all(f"{v}: {o} (stored)" in again.stderr for v, o in kept.items()), again.stderr  # not tested again
    done = json.loads(entry.read_text())["extra"]["bisect"]
    assert done["complete"] and done["first_bad"]["version"] == "1.2" and done["first_fixed"]["version"] == "2.0"


# ----------------------------------------------------------------------------- bad input


def _unchanged_after(entry: Path, *args: str) -> subprocess.CompletedProcess:
    before = entry.read_bytes()
    proc = _run("bisect", str(entry), *args, timeout=120)
    assert entry.read_bytes() == before
    return proc


def _one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr and all(n in lines[0] for n in needles), lines[0]


def test_an_entry_whose_engine_is_no_pip_package_is_refused_in_one_line(tmp_path):
    entry = _toy_entry(tmp_path / "finding-ref.json", engine_name="reference")
    data = json.loads(entry.read_text())
    del data["engine"]["package"]
    entry.write_text(json.dumps(data))
    _one_line_error(_unchanged_after(entry), "engine='reference'", "pip package")


@pytest.mark.parametrize("versions, needle", [("2.0..1.0", "reversed"), ("1.0", "A..B"), ("x..y", "release versions")])
def test_a_malformed_or_reversed_range_is_refused_before_any_lookup(tmp_path, versions, needle):
    entry = _toy_entry(tmp_path / "finding-toy.json")
    # An index nobody listens on: the range is checked first, so this is never reached.
    proc = _unchanged_after(entry, "--engine-package", TOY, "--versions", versions, "--index-url", "http://127.0.0.1:9/simple")
    _one_line_error(proc, "--versions", needle)


def test_an_empty_range_is_refused_naming_the_releases_there_are(toy_index, tmp_path):
    wheels, _ = toy_index
    entry = _toy_entry(tmp_path / "finding-toy.json")
    proc = _unchanged_after(entry, "--engine-package", TOY, "--find-links", str(wheels), "--versions", "3.0..4.0")
    _one_line_error(proc, "--versions='3.0..4.0'", "1.0..2.1")


def test_an_unreachable_registry_is_refused_in_one_line(toy_index, tmp_path):
    wheels, _ = toy_index
    entry = _toy_entry(tmp_path / "finding-toy.json")
    proc = _unchanged_after(entry, "--engine-package", TOY, "--find-links", str(wheels), "--index-url", "http://127.0.0.1:9/simple")
    _one_line_error(proc, "cannot be reached", "127.0.0.1:9")


@pytest.mark.slow
def test_triage_latest_marks_an_entry_fixed_when_the_newest_release_passes_and_skips_unreleased_engines(toy_index, tmp_path):
    import jsonschema

    wheels, envs = toy_index
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    found = _toy_entry(corpus / "finding-toy.json", version="1.2")
    ref = _toy_entry(corpus / "finding-ref.json", engine_name="reference")
    data = json.loads(ref.read_text())
    del data["engine"]["package"]
    ref.write_text(json.dumps(data))
    ref_before = ref.read_bytes()
    proc = _run("triage", str(corpus), "--latest", "--json", "--find-links", str(wheels), "--env-dir", str(envs),
                "--samples", "300", "--work-dir", str(tmp_path / "work"), "--deps", "latest")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    jsonschema.validate(out, json.loads((ROOT / "docs" / "triage-schema.json").read_text()))
    stored = json.loads(found.read_text())
    assert stored["status"] == "fixed"
    latest = stored["extra"]["latest"]
    assert (latest["package"], latest["version"], latest["outcome"]) == (TOY, "2.1", "good")
    assert latest["status_before"] == "new" and latest["status_after"] == "fixed"
    by_path = {e["path"]: e for g in out["groups"] for e in g["entries"]}
    assert by_path["finding-toy.json"]["latest"]["version"] == "2.1" and out["latest"] is True
    assert "not a pip-installable package" in by_path["finding-ref.json"]["latest"]["skipped"]
    assert ref.read_bytes() == ref_before


@pytest.mark.slow
def test_bisect_runs_on_prebuilt_release_folders_with_no_index_reachable(toy_index, tmp_path):
    """The H200 way: releases unpacked from carried bundles (<version>/site), no index, no installs."""
    import numpy

    wheels, _ = toy_index
    prebuilt = tmp_path / "releases"
    for version in ("1.1", "1.2", "1.6", "2.0"):
        site = prebuilt / version / "site"
        with zipfile.ZipFile(next(wheels.glob(f"*-{version}-py3-none-any.whl"))) as z:
            z.extractall(site)
        # The machine's own packages (numpy here; torch and the rest on the H200) come from "also".
        (prebuilt / version / "release.json").write_text(json.dumps(
            {"released": f"2026-0{int(float(version))}-01", "also": [str(Path(numpy.__file__).parents[1])],
             "env": {"SPECFUZZ_TOY_RELEASE": version}}))
    entry = _toy_entry(tmp_path / "finding-toy.json")
    proc = _run("bisect", str(entry), "--engine-package", TOY, "--prebuilt", str(prebuilt), "--samples", "300",
                "--index-url", "http://127.0.0.1:9/simple", "--work-dir", str(tmp_path / "work"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rec = json.loads(entry.read_text())["extra"]["bisect"]
    assert rec["summary"] == f"{TOY}: introduced in 1.2 (1.1 passes); fixed in 2.0 (1.6 still fails)."
    assert rec["first_bad"]["released"] == "2026-01-01" and rec["settings"]["deps"] == "bundled"
    assert all(p["env"]["env"] == {"SPECFUZZ_TOY_RELEASE": p["version"]} for p in rec["probes"])
