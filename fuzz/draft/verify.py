"""``specfuzz draft ENTRY --verify``: run a draft's repro.py on the installed engine and record
what it printed in its ISSUE.md.

:func:`verify_draft` runs ``python repro.py`` in the draft's folder (a subprocess, with a
timeout), reads its outcome and writes a "Verification" section into ISSUE.md (replacing
an earlier one): the outcome, the engine line the script printed (its version), the date,
the seconds it took and the tail of its output, scrubbed. Outcomes:

* ``PASS`` / ``FAIL``: the last line the script printed (for a crash entry FAIL means the
  engine crashed; where the engine's process died without saying why, e.g. SGLang, whose
  scheduler has the process tree killed, the script holds ``CRASH_CAUSE``, the exception the
  engine's log named when the crash was found, and the verification records whether the
  repro's output names it again, with the line that does: the same crash, not just a crash);
* ``crash``: the script ended without either (it raised, e.g. the engine did not start);
* ``timeout``: it ran past the timeout and was killed.

After the run it runs the engine's own environment command with the same Python
(``python -m vllm.collect_env``, ``python -m sglang.check_env``, ``transformers env``:
:mod:`specfuzz.fuzz.draft.forms`) and puts its output, scrubbed, into ISSUE.md's environment
block, which the engine's bug-report form asks for first.

It needs only the standard library and the draft folder, so it also runs on a machine
where specfuzz cannot draft (no matplotlib): ``python fuzz/draft/verify.py DRAFT_DIR ...
[--timeout S] [--json FILE]`` verifies drafts in place (``bin/verify-h200-drafts`` does that
for the GPU drafts).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path



def _module(name: str, path: str):
    """``specfuzz.<name>``, or, where specfuzz is not installed (this file run by path on a machine that
    has only the engine), the same standard-library-only module loaded from its file in this tree."""
    import importlib
    import importlib.util

    try:
        return importlib.import_module(f"specfuzz.{name}")
    except ImportError:
        spec = importlib.util.spec_from_file_location(f"_specfuzz_{name}", Path(__file__).resolve().parents[1] / path)
        mod = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod


numbers_out = _module("fuzz.corpus", "corpus.py").numbers_out  # a crash's cause as recorded, numbers as #
forms = _module("fuzz.draft.forms", "draft/forms.py")  # the engine's environment command and block

# Default time a repro may run (engine start included).
DEFAULT_TIMEOUT_S = 900.0
# Lines of the repro's output kept in ISSUE.md.
TAIL_LINES = 25
# Seconds to wait for a timed-out repro's output once its process group is killed: a process
# that left the group (or a GPU context still tearing down) can hold its pipes open, and an
# unbounded wait there would hang the verification with no record written.
KILL_GRACE_S = 20.0
# Seconds the engine's environment command may take (vLLM's collect_env probes pip, the GPU, ...).
ENV_TIMEOUT_S = 240.0
SECTION = "### Verification"
# The engine a repro ran, from the first word of its "engine: " line.
ENGINE_WORDS = {"vLLM": "vllm", "SGLang": "sglang", "transformers": "hf-transformers", "specfuzz": "reference",
                "llama-server": "llamacpp", "mlx-lm": "mlx"}
OUTCOMES = ("PASS", "FAIL", "crash", "timeout")


@dataclass(frozen=True)
class Verification:
    outcome: str  # one of OUTCOMES
    engine_line: str  # the "engine: ..." line the script printed (its engine and version), or ""
    date: str  # UTC, ISO 8601
    seconds: float
    returncode: int | None
    tail: str  # the last TAIL_LINES lines of stdout + stderr
    command: str
    cause: str | None = None  # a crash repro's CRASH_CAUSE (the exception named when found, numbers as #)
    cause_line: str | None = None  # the line of this run's output that names it again (None: none does)

    def to_json(self) -> dict:
        return asdict(self)


def outcome_of(stdout: str, returncode: int | None, timed_out: bool) -> str:
    """PASS/FAIL from the script's last printed line; crash or timeout otherwise."""
    if timed_out:
        return "timeout"
    lines = [ln.strip() for ln in stdout.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    if last == "PASS" and returncode == 0:
        return "PASS"
    if last == "FAIL" and returncode == 1:
        return "FAIL"
    return "crash"


def _text(data: bytes | str | None) -> str:
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else (data or "")


def _engine_line(stdout: str) -> str:
    for ln in stdout.splitlines():
        if ln.startswith("engine: "):
            return ln.strip()
    return ""


def recorded_cause(repro: Path) -> str | None:
    """The ``CRASH_CAUSE`` a crash repro.py holds (None: none)."""
    import ast

    try:
        tree = ast.parse(Path(repro).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "CRASH_CAUSE"):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return None
            return value if isinstance(value, str) and value.strip() else None
    return None


# How repro.py prints the recorded cause itself (templates/repro_main.py): not the engine naming it.
CAUSE_ECHO = "when found, the engine's log named"


def cause_line(cause: str, *outputs: str) -> str | None:
    """The first line of ``outputs`` that names ``cause`` (numbers aside), the repro's own echo of
    it passed over; None when none does."""
    want = numbers_out(cause)
    for text in outputs:
        for line in text.splitlines():
            if want in numbers_out(line) and not line.lstrip().startswith(CAUSE_ECHO):
                return line.strip()
    return None


def run_repro(draft_dir: Path, *, timeout_s: float = DEFAULT_TIMEOUT_S, python: str | None = None,
              extra_args: tuple[str, ...] = ()) -> Verification:
    """Run ``repro.py`` in ``draft_dir`` (its own process group, killed whole on timeout)."""
    d = Path(draft_dir)
    cmd = [python or sys.executable, "repro.py", *extra_args]
    t0 = time.monotonic()
    date = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
    proc = subprocess.Popen(cmd, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            out, err = proc.communicate(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired as exc:  # the pipes outlived the group: keep what was read
            out, err = _text(exc.stdout), _text(exc.stderr) + f"\n(its output pipes were still open {KILL_GRACE_S:g} s after the kill)"
            for f in (proc.stdout, proc.stderr):
                try:
                    f.close()
                except OSError:
                    pass
            proc.wait()
    seconds = round(time.monotonic() - t0, 1)
    # The repro's engine may leave processes in its group (spawned workers): end them with it.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    outcome = outcome_of(out, proc.returncode, timed_out)
    tail_lines = out.rstrip("\n").splitlines()  # the verdict and its table
    died = "the engine's process died" in out  # a crash repro whose engine took its process down
    if outcome in ("crash", "timeout") or "the engine raised" in out or died:  # the error is in stderr: keep its end last
        tail_lines = tail_lines[-6:] + err.rstrip("\n").splitlines()
    tail = "\n".join(tail_lines[-TAIL_LINES:])
    cause = recorded_cause(d / "repro.py")
    return Verification(outcome, _engine_line(out), date, seconds, proc.returncode, tail,
                        " ".join(["python", "repro.py", *extra_args]), cause,
                        cause_line(cause, err, out) if cause else None)


def summary(v: Verification) -> str:
    """One line: the outcome, its seconds, the engine line and, for a crash repro holding
    ``CRASH_CAUSE`` that printed FAIL, whether its output named that crash again."""
    line = f"{v.outcome} in {v.seconds:.0f} s ({v.engine_line or 'no engine line'})"
    if v.cause and v.outcome == "FAIL":
        line += "; the recorded crash named again" if v.cause_line else "; the recorded crash NOT named in its output"
    return line


def section(v: Verification, scrub=None) -> str:
    """The ISSUE.md section that records a verification."""
    clean = scrub or (lambda s: s)
    what = {"PASS": "printed `PASS`", "FAIL": "printed `FAIL`", "crash": "ended without PASS or FAIL (it raised)",
            "timeout": "did not finish in time and was stopped"}[v.outcome]
    L = [SECTION, "",
         f"`{v.command}` was run as found (no hand-set environment) on {v.date[:10]} ({v.date} UTC): it {what} after "
         f"{v.seconds:.0f} s (exit status {v.returncode}).", ""]
    if v.engine_line:
        L += [f"It reported `{clean(v.engine_line)}`.", ""]
    if v.cause and v.outcome == "FAIL":
        if v.cause_line:
            L += ["Its output names the crash recorded when it was found (numbers aside), in this line:", "", "```",
                  clean(v.cause_line), "```", ""]
        else:
            L += [f"**Its output does not name the crash recorded when it was found** (`{clean(v.cause)}`, numbers "
                  "as #): this FAIL may be another crash.", ""]
    L += ["<details><summary>output (last lines)</summary>", "", "```", clean(v.tail).strip() or "(none)", "```", "",
          "</details>", ""]
    return "\n".join(L)


def section_span(text: str) -> tuple[int, int] | None:
    """Where an ISSUE.md's Verification section is: (start, end) of its lines, up to the next
    section or the end; None when it has none."""
    i = text.find("\n" + SECTION + "\n")
    if i < 0:
        return None
    ends = [j for j in (text.find("\n## ", i + len(SECTION) + 2), text.find("\n### ", i + len(SECTION) + 2)) if j >= 0]
    return i + 1, (min(ends) + 1 if ends else len(text))


def record(issue_path: Path, v: Verification, scrub=None, env: str | None = None) -> None:
    """Write (or replace) the Verification section of an ISSUE.md, and its environment block with ``env``."""
    p = Path(issue_path)
    with open(p, encoding="utf-8", newline="") as f:  # as written: an engine log's "\r" (progress bars) kept
        text = f.read()
    if env is not None:
        text = forms.replace_env(text, (scrub or (lambda s: s))(env))
    span = section_span(text)
    if span is not None:
        text = text[:span[0]] + text[span[1]:]
    text = text.rstrip("\n") + "\n\n" + section(v, scrub).rstrip("\n") + "\n"
    with open(p, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def engine_of(v: Verification) -> str | None:
    """The engine kind a verification ran (from its "engine: " line), or None."""
    word = v.engine_line.removeprefix("engine: ").split(" ", 1)[0]
    return ENGINE_WORDS.get(word)


def capture_env(engine_kind: str, python: str | None = None, timeout_s: float = ENV_TIMEOUT_S) -> str:
    """The output of the engine's own environment command, run with ``python`` (the first that works)."""
    last = ""
    for cmd in forms.env_commands(engine_kind, python):
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                               env={**os.environ, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1"})
        except (OSError, subprocess.TimeoutExpired) as exc:
            last = f"{' '.join(cmd[1:])}: {type(exc).__name__}"
            continue
        out = re.sub(r"\x1b\[[0-9;]*m", "", r.stdout).strip("\n")
        if r.returncode == 0 and out:
            return out
        last = f"{' '.join(cmd[1:])} exited {r.returncode}: " + "\n".join((r.stderr or r.stdout).strip().splitlines()[-5:])
    return f"(the environment command did not run: {last})"


def _scrubber():
    try:
        from specfuzz.fuzz.draft.scrub import Scrubber
    except Exception:  # noqa: BLE001 - a machine without specfuzz's dependencies: paths only
        path = re.compile(r"(?<![\w:/.~-])/(?:[^\s/'\"`<>()\[\]{},;:|]+/)+[^\s/'\"`<>()\[\]{},;:|]*")
        keep = re.compile(r"(?:site-packages|dist-packages)/.*|python3(?:\.\d+)?/.*")

        def sub(m: re.Match) -> str:
            k = keep.search(m.group(0))
            return k.group(0) if k else "[path]"

        return lambda s: path.sub(sub, s)
    return Scrubber.for_entry(None).text


def verify_draft(draft_dir: Path, *, timeout_s: float = DEFAULT_TIMEOUT_S, python: str | None = None,
                 extra_args: tuple[str, ...] = (), capture: bool = True) -> Verification:
    """Run a draft's repro.py (and, with ``capture``, the engine's environment command) and record the
    results in its ISSUE.md (see the module docstring)."""
    d = Path(draft_dir)
    v = run_repro(d, timeout_s=timeout_s, python=python, extra_args=extra_args)
    kind = engine_of(v)
    env = capture_env(kind, python) if kind is not None and capture else None
    if (d / "ISSUE.md").is_file():
        record(d / "ISSUE.md", v, _scrubber(), env=env)
    return v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run drafts' repro.py on the installed engine and record the results in their ISSUE.md.")
    ap.add_argument("drafts", nargs="+", type=Path, help="draft folders (each with repro.py and ISSUE.md)")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per repro (default %(default)s)")
    ap.add_argument("--json", type=Path, default=None, help="also write every result here")
    args = ap.parse_args(argv)
    results = {}
    for d in args.drafts:
        if not (d / "repro.py").is_file():
            print(f"{d}: no repro.py", file=sys.stderr)
            return 2
        v = verify_draft(d, timeout_s=args.timeout)
        results[d.name] = v.to_json()
        print(f"{d.name}: {summary(v)}", flush=True)
        if args.json is not None:
            args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
