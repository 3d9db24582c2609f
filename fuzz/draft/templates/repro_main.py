# Template: the end of every repro.py (specfuzz.fuzz.draft.repro renders it last): the command line,
# the sampling loop with its anytime-valid test, and the crash runner. The imports above the
# "repro.py begins" line are for linting and testing this file alone (the engine functions come
# from whichever engine part the script holds).
import argparse
import math
import os
import sys
import tempfile
from collections import Counter

from specfuzz.fuzz.draft.templates.repro_common import (
    ALPHA, BATCH_PATTERNS, CRASH, CRASH_BATCH, CRASH_CAUSE, DEFAULT_SAMPLES, EXPECTED, PROMPT, RUN_BATCH, SAMPLING, SEQUENCE,
    SUSPECTED, law_of, log_e_value, report,
)
from specfuzz.fuzz.draft.templates.repro_draft import Checkpoints
from specfuzz.fuzz.draft.templates.repro_generic import DEFAULT_BATCH, add_engine_arguments, describe, start_engine

# ---- repro.py begins ----


# ---- main ----------------------------------------------------------------------------
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, help="samples to draw at most (default %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="first request seed; sample i uses seed + i")
    ap.add_argument("--batch", type=int, default=None,
                    help="samples per engine call (the test looks after each; default: as the failing run, "
                         f"{RUN_BATCH or DEFAULT_BATCH})")
    ap.add_argument("--alpha", type=float, default=ALPHA)
    ap.add_argument("--top", type=int, default=12, help="rows of the observed-vs-expected table")
    ap.add_argument("--keep", default=None, help="write the checkpoints here (kept) instead of a temporary folder")
    add_engine_arguments(ap)
    args = ap.parse_args(argv)
    if CRASH and os.environ.get(CRASH_CHILD_ENV) != "1":
        return run_crash_in_child(sys.argv[1:] if argv is None else list(argv))
    root = args.keep or tempfile.mkdtemp(prefix="specfuzz-repro-")
    ckpt = Checkpoints(root)
    print(describe(args))
    if CRASH:
        return run_crash(ckpt, args)
    generate = start_engine(ckpt, args)
    mu, mud = law_of(EXPECTED), law_of(SUSPECTED)
    counts = Counter()
    threshold = math.log(1.0 / args.alpha)
    batch = args.batch or RUN_BATCH or DEFAULT_BATCH
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


CRASH_CHILD_ENV = "SPECFUZZ_REPRO_CRASH_CHILD"


def run_crash_in_child(argv):
    """A crash finding: this script again in a child process of its own session, which starts the
    engine and runs the requests (run_crash). The verdict is printed here, so that a crash that
    takes down the process that started the engine still ends in FAIL: a segfault, or SGLang,
    whose scheduler on failure signals its parent process to kill its whole process tree."""
    import signal
    import subprocess

    env = dict(os.environ, **{CRASH_CHILD_ENV: "1"})
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv], env=env, start_new_session=True)
    try:
        code = child.wait()
    except KeyboardInterrupt:
        os.killpg(child.pid, signal.SIGKILL)
        raise
    sys.stdout.flush()
    if code in (0, 1):
        return code  # the child printed PASS (0) or FAIL (1) itself
    how = f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
    print(f"the engine's process died ({how}) at start or on the request sequence: the engine took down the "
          "process that started it")
    if CRASH_CAUSE:  # the process died without saying why: the engine's own output above names it
        print(f"when found, the engine's log named (numbers as #): {CRASH_CAUSE}")
    print("FAIL")
    return 1


def run_crash(ckpt, args):
    """A crash finding: start the engine and run the recorded request sequence, one request per
    step, or else the request as the campaign ran it: one engine call with a batch of requests
    with distinct seeds (--batch, default CRASH_BATCH: some crashes need the batch, e.g. a long
    prefill chunked among many), its requests taking the request patterns of the crashing batch
    in turn (BATCH_PATTERNS, this request among them: some crashes need them mixed); FAIL if the
    engine raises, at start or on a request."""
    import traceback

    steps = SEQUENCE or [SAMPLING]
    batch = 1 if SEQUENCE else (args.batch or CRASH_BATCH)
    mixed = [(list(p["prompt"]), p["params"]) for p in BATCH_PATTERNS or []]  # the crashing batch's patterns
    if (list(PROMPT), SAMPLING) not in mixed:
        mixed.insert(0, (list(PROMPT), SAMPLING))
    try:
        generate = start_engine(ckpt, args)
        for i, sampling in enumerate(steps):
            seeds = [args.seed + i * batch + j for j in range(batch)]
            if len(mixed) > 1 and not SEQUENCE:
                out = generate([mixed[j % len(mixed)][1] for j in range(batch)], seeds,
                               [mixed[j % len(mixed)][0] for j in range(batch)])
            else:
                out = generate(sampling, seeds)
            more = f" (and {batch - 1} more requests of the batch" if batch > 1 else ""
            more += f", {len(mixed)} request patterns in turn)" if more and len(mixed) > 1 and not SEQUENCE else ")" if more else ""
            print(f"request {i + 1}/{len(steps)}: output {tuple(out[0])}{more}")
    except Exception:  # noqa: BLE001 - the crash is the finding
        traceback.print_exc(limit=6)
        print("the engine raised (at start or on the request sequence above)")
        print("FAIL")
        return 1
    close = getattr(generate, "close", None)
    if close is not None:
        close()
    print("the request sequence ran without a crash")
    print("PASS")
    return 0


if __name__ == "__main__":
    code = main()
    if globals().get("HARD_EXIT", False):  # engines whose shutdown can hang at interpreter exit
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
