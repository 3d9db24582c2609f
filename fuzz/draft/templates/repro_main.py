# Template: the end of every repro.py (specfuzz.fuzz.draft.repro renders it last): the test, the
# sampling loop and, for a crash, the crash runner. The imports above the "repro.py begins" line are
# for linting and testing this file alone (the engine functions come from the script's engine part).
import argparse
import math
import os
import sys
import tempfile
from collections import Counter

from specfuzz.fuzz.draft.templates.repro_common import (
    ALPHA, BATCH, CALLS, CRASH_CAUSE, DEPTH, EXPECTED, FOCUS, MAX_TOKENS, PROMPT, SAMPLES, SAMPLING, TARGET_TABLE,
    engine_arg, write_checkpoints,
)
from specfuzz.fuzz.draft.templates.repro_reference import add_engine_arguments
from specfuzz.fuzz.draft.templates.repro_vllm import start_engine

# ---- repro.py begins ----


# [if not crash]
# ---- the test: e-values against the exact law mu; under mu, P(E ever >= 1/ALPHA) <= ALPHA (Ville) -----
def kt_log_e(counts, law):
    """log E: a Krichevsky-Trofimov mixture (Dirichlet(1/2) over law's cells) over law's likelihood."""
    n, k = sum(counts.values()), len(law)
    log_kt = math.lgamma(k / 2) - math.lgamma(k / 2 + n) + sum(math.lgamma(c + 0.5) - math.lgamma(0.5) for c in counts.values())
    return log_kt - sum(c * math.log(law[x]) for x, c in counts.items())


def impossible(x, mu):
    return len(x) > MAX_TOKENS or any(not 0 <= t < len(TARGET_TABLE) for t in x) or tuple(x[:DEPTH]) not in mu


def next_steps(outs):
    """What followed FOCUS's prefix in the outputs (a token, or None: the output ended there)."""
    n = len(FOCUS["context"])
    return Counter(y[n] if len(y) > n else None for y in outs.elements() if list(y[:n]) == FOCUS["context"])


def log_e_value(outs, mu):
    """+inf once an output mu forbids is drawn; else the mean of two e-values: the outputs against mu, and
    the next step after FOCUS's prefix (chosen from the finding's own samples) against mu's law there."""
    if any(impossible(y, mu) for y in outs):
        return math.inf
    logs = [kt_log_e(outs, mu)] + ([kt_log_e(next_steps(outs), dict(FOCUS["law"]))] if FOCUS else [])
    return max(logs) + math.log(sum(math.exp(v - max(logs)) for v in logs) / len(logs))


def report(outs, mu, log_e):
    n = sum(outs.values())
    print(f"{'output' if DEPTH is None else f'first {DEPTH} tokens':<22} {'count':>7} {'observed':>9} {'expected':>9}")
    for y in sorted(set(outs) | set(mu), key=lambda y: (-abs(outs[y] / n - mu.get(y, 0.0)), y))[:12]:
        print(f"{str(y):<22} {outs[y]:>7} {outs[y] / n:>9.4f} {mu.get(y, 0.0):>9.4f}" + "  <- impossible" * impossible(y, mu))
    if FOCUS:
        seen, m = next_steps(outs), max(1, sum(next_steps(outs).values()))
        print(f"after {tuple(FOCUS['context'])} ({m} samples): " + ", ".join(
            f"{'end' if t is None else t} {seen[t] / m:.3f} (mu {p:.3f})" for t, p in FOCUS["law"]))
    e = "inf" if log_e == math.inf else f"{math.exp(log_e):.3g}" if log_e < 700 else f"e^{log_e:.0f}"
    print(f"e-value after {n} samples: {e} (FAIL at 1/alpha = {1 / ALPHA:g})")
# [end crash]


# ---- main -------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0, help="request i has seed SEED + i")
    ap.add_argument("--batch", type=int, default=None, help="requests per engine call (default: as the finding ran)")
    # [if not crash]
    ap.add_argument("--samples", type=int, default=SAMPLES, help="samples at most (default %(default)s)")
    # [end crash]
    # [if launch]
    ap.add_argument("--no-speculation", action="store_true", help="the same requests with speculation off")
    ap.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE", type=engine_arg,
                    help="start the engine with this argument changed (VALUE as JSON; repeatable)")
    # [end launch]
    # [if own_arguments]
    add_engine_arguments(ap)
    # [end own_arguments]
    args = ap.parse_args()
    # [if crash]
    return run_crash(args)
    # [end crash]
    # [if not crash]
    generate = start_engine(write_checkpoints(tempfile.mkdtemp(prefix="repro-")), args)
    mu, outs, log_e, n = {tuple(x): p for x, p in EXPECTED}, Counter(), 0.0, 0
    while n < args.samples and log_e < math.log(1 / ALPHA):
        seeds = range(args.seed + n, args.seed + min(n + (args.batch or BATCH), args.samples))
        outs.update(y if impossible(y, mu) else y[:DEPTH] for y in generate(seeds, [(PROMPT, SAMPLING)] * len(seeds)))
        n, log_e = n + len(seeds), log_e_value(outs, mu)
    getattr(generate, "close", lambda: None)()  # engines that print on shutdown do it before the verdict
    report(outs, mu, log_e)
    print("FAIL" if log_e >= math.log(1 / ALPHA) else "PASS")
    return int(log_e >= math.log(1 / ALPHA))
    # [end crash]


# [if crash]
def run_crash(args):
    """The engine runs in a child process (this script again), so that a crash that takes down the
    process that started the engine (a segfault; SGLang's scheduler kills its parent's tree) still
    ends in FAIL; the child starts the engine and makes the calls that crashed it (CALLS)."""
    import signal
    import subprocess
    import traceback

    if os.environ.get("REPRO_CHILD") != "1":
        code = subprocess.run([sys.executable, os.path.abspath(__file__), *sys.argv[1:]], start_new_session=True,
                              env={**os.environ, "REPRO_CHILD": "1"}).returncode
        if code in (0, 1):
            return code  # the child printed PASS or FAIL
        how = f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        print(f"the engine's process died ({how}) at start or on the requests: it took down the process that started it")
        if CRASH_CAUSE:
            print(f"when found, the engine's log named (numbers as #): {CRASH_CAUSE}")
        print("FAIL")
        return 1
    seed = args.seed
    try:
        generate = start_engine(write_checkpoints(tempfile.mkdtemp(prefix="repro-")), args)
        for i, call in enumerate(CALLS):  # each call cycles through its request patterns
            reqs = [call["requests"][j % len(call["requests"])] for j in range(args.batch or call["batch"])]
            outs = generate(list(range(seed, seed + len(reqs))), reqs)
            seed += len(reqs)
            print(f"call {i + 1}/{len(CALLS)}: {len(reqs)} requests ({len(call['requests'])} patterns), first output {outs[0]}")
    except Exception:  # noqa: BLE001 - the crash is the finding
        traceback.print_exc(limit=6)
        print("the engine raised (at start or on the requests above)")
        print("FAIL")
        return 1
    getattr(generate, "close", lambda: None)()
    print("the requests ran without a crash")
    print("PASS")
    return 0
# [end crash]


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # [if hard_exit]
    os._exit(code)  # SGLang's shutdown and exit hooks can hang: leave at once, the verdict printed
    # [end hard_exit]
    # [if not hard_exit]
    sys.exit(code)
    # [end hard_exit]
