"""Benchmark: exact μ of one request with every sampling option on.

V = 16, max_tokens = 4, temperature / top-k / top-p / min-p / logit bias / allowed ids /
bad word / repetition, frequency and presence penalties / min_tokens / stop id / EOS /
thinking budget / regex constraint. Target: the median of 20 runs (after one warm-up)
under 50 ms on one core. Prints the timings and writes ``bench/results/oracle.json``.

Run: ``.venv/bin/python bench/bench_oracle.py``
"""

from __future__ import annotations

import os

# One core: no threaded math libraries, pinned to one CPU.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from specfuzz.oracle import SamplingParams, TargetLaw  # noqa: E402
from specfuzz.oracle.constraint import choice_dfa, regex_dfa  # noqa: E402

V = 16
MAX_TOKENS = 4
EOS = 15  # 'p'
THINK_END = 14  # 'o'
STOP = 13  # 'n'
SEED = 20240601
RUNS = 20
TARGET_MS = 50.0
RESULTS = Path(__file__).resolve().parent / "results" / "oracle.json"

PARAMS = SamplingParams(
    temperature=0.8,
    top_k=12,
    top_p=0.95,
    min_p=0.01,
    logit_bias={3: 1.0, 5: -0.5},
    allowed_token_ids=tuple(t for t in range(V) if t not in (2, 9)),  # 14 tokens
    bad_words=((4, 6),),
    repetition_penalty=1.1,
    frequency_penalty=0.2,
    presence_penalty=0.3,
    min_tokens=2,
    max_tokens=MAX_TOKENS,
    stop_token_ids=(STOP,),
    thinking_budget=2,
    think_end_token_id=THINK_END,
    regex="[a-m][a-o]*",  # any first letter but n/o, then anything: a large space
)
PROMPT = (0, 7)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> dict:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    table = np.random.default_rng(SEED).normal(size=(V, V)).astype(np.float32)  # [V, V]

    # Constraint compilation (cached per regex afterwards).
    regex_dfa.cache_clear()
    choice_dfa.cache_clear()
    t0 = time.perf_counter()
    TargetLaw(table, PROMPT, PARAMS, eos_token_id=EOS)
    cold_ms = (time.perf_counter() - t0) * 1e3

    def once() -> tuple[float, float, object]:
        t0 = time.perf_counter()
        law = TargetLaw(table, PROMPT, PARAMS, eos_token_id=EOS)
        t1 = time.perf_counter()
        mu = law.enumerate()
        t2 = time.perf_counter()
        return (t2 - t0) * 1e3, (t2 - t1) * 1e3, mu

    once()  # warm-up
    total, enum = [], []
    for _ in range(RUNS):
        a, b, mu = once()
        total.append(a)
        enum.append(b)
    med = statistics.median(total)
    res = {
        "benchmark": "oracle.enumerate, V=16, max_tokens=4, all sampling options on",
        "median_ms": med,
        "median_enumerate_only_ms": statistics.median(enum),
        "target_ms": TARGET_MS,
        "passed": med < TARGET_MS,
        "runs_ms": total,
        "cold_construct_ms": cold_ms,
        "support_size": len(mu),
        "total_mass": mu.total,
        "error_bound": mu.error_bound,
        "cpu_model": cpu_model(),
        "numpy_version": np.__version__,
        "python_version": platform.python_version(),
        "params": PARAMS.to_json(),
        "prompt": list(PROMPT),
        "eos_token_id": EOS,
        "table_seed": SEED,
    }
    print(f"exact μ (V={V}, max_tokens={MAX_TOKENS}, all options): support {len(mu)} outputs, mass {mu.total:.15f}, error bound {mu.error_bound:.2g}")
    print(f"construct + enumerate: median {med:.2f} ms over {RUNS} runs (min {min(total):.2f}, max {max(total):.2f}); target < {TARGET_MS:g} ms: {'OK' if med < TARGET_MS else 'MISSED'}")
    print(f"enumerate only: median {statistics.median(enum):.2f} ms; first construction incl. regex compile: {cold_ms:.2f} ms")
    print(f"CPU: {res['cpu_model']}; numpy {np.__version__}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return res


if __name__ == "__main__":
    main()
