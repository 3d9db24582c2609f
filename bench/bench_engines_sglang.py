"""Benchmark: samples per second through specfuzz's SGLang adapter vs SGLang's own API.

Like :mod:`bench_engines` (vLLM): on one started engine, the same batch of requests (one
prompt, 3 tokens, temperature 1) goes through ``SGLangEngine.generate`` (validation,
mapping to SGLang sampling dicts, one ``Engine.generate`` call, output normalisation) and
through SGLang's raw ``Engine.generate(input_ids=..., sampling_params=...)`` with the very
same dicts built beforehand, alternating, best of ``--repeats``. The adapter's own work
alone is timed with SGLang's answer replayed. Modes: speculation off, NGRAM (chain, K=3),
STANDALONE (identical draft, chain, K=3) and EAGLE-3 (a tablegen head, reduced draft
vocabulary V/2, chain, K=3), bfloat16, SGLang's defaults as the adapter
sets them. Engine start and close times, and acceptance counts, are recorded too.

Each mode runs in its own Python process (``--mode``) under a timeout: SGLang's
``Engine.shutdown`` kills every child of its process and has been seen to hang, so one
engine per process, and the results file is rewritten after every mode (a mode that
hangs or is cut by the overall timeout loses only itself).

``--settings JSON`` starts every mode with those adapter settings (e.g.
``'{"disable_cuda_graph": false}'``: CUDA graphs, which the adapter turns off), and
``--tag`` names its rows (``MODE TAG``), so that a run with and without them on one machine
can share an output file.

Needs CUDA and SGLang. Run: ``python3 bench/bench_engines_sglang.py [--requests 1000]
[--repeats 2] [--mode-timeout 80] [--settings JSON --tag TAG] [--out bench/results/engines_sglang_h200.json]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engines import _time_pair  # noqa: E402  (adapter and raw runs alternated, as for vLLM)

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_OUT = RESULTS / "engines_sglang_h200.json"
V, EOS = 8, 7
PROMPT = (1, 2, 1, 2)
MAX_TOKENS = 3
DTYPE = "bfloat16"
GOAL_OVERHEAD_PCT = 10.0
MODES = ("off", "ngram-K3", "standalone-K3", "eagle3-K3-reduced")


def _table() -> np.ndarray:
    rng = np.random.default_rng(7)
    return (rng.integers(-8, 9, (V, V)) / 4).astype(np.float32)  # [V, V] multiples of 1/4


def _spec(name: str):
    from specfuzz.oracle.speculative import SpecConfig

    return {
        "off": None,
        "ngram-K3": SpecConfig("ngram", 3, ngram_min=1, ngram_max=3),
        "standalone-K3": SpecConfig("draft_model", 3, draft_sampling="greedy"),
        # An EAGLE-3 head (tablegen.eagle) drafting over half the vocabulary, SGLang's argmax drafter.
        "eagle3-K3-reduced": SpecConfig("eagle3", 3, draft_sampling="greedy"),
    }[name]


class _Replay:
    """Stands in for ``sglang.Engine`` to time the adapter alone: returns recorded outputs."""

    def __init__(self, outs) -> None:
        self._outs = outs

    def generate(self, input_ids=None, sampling_params=None, **kw):
        assert len(input_ids) == len(sampling_params) == len(self._outs)
        return self._outs


def bench_mode(name: str, n_requests: int, repeats: int, settings: dict | None = None) -> dict:
    """One mode on one engine in this process: start, adapter vs raw, own work, close."""
    from specfuzz.case import Case
    from specfuzz.engines.base import EngineConfig, Request
    from specfuzz.engines.checkpoints import materialize
    from specfuzz.engines.sglang_engine import SGLangEngine
    from specfuzz.oracle.params import SamplingParams

    table = _table()
    spec = _spec(name)
    params = SamplingParams(max_tokens=MAX_TOKENS)  # temperature 1
    row: dict = {"mode": name, "settings": dict(settings or {})}
    with tempfile.TemporaryDirectory(prefix="specfuzz-bench-sglang-") as tmp:
        draft, d2t = (table if spec is not None and spec.uses_draft_model else None), None
        if name == "eagle3-K3-reduced":
            d2t = tuple(range(V // 2))
            draft = np.ascontiguousarray(table[:, : V // 2])
        case = Case(target_table=table, prompt=PROMPT, params=params, eos_token_id=EOS, spec=spec,
                    draft_table=draft, draft_d2t=d2t)
        ck = materialize(case, Path(tmp), dtype=DTYPE)
        t0 = time.perf_counter()
        import sglang  # noqa: F401  (import time reported separately from start time)

        row["import_seconds"] = round(time.perf_counter() - t0, 2)
        eng = SGLangEngine(**(settings or {}))
        t0 = time.perf_counter()
        eng.start(EngineConfig(target_dir=ck.target_dir, draft_dir=ck.draft_dir, speculation=spec, dtype=DTYPE, max_model_len=64))
        row["start_seconds"] = round(time.perf_counter() - t0, 2)
        row["engine"] = dict(eng.version())
        row["random_seed"] = eng.random_seed
        try:
            requests = [Request(PROMPT, params) for _ in range(n_requests)]
            shared = eng.sampling_params(requests[0])  # what the adapter sends; built outside the timing
            sps = [shared] * n_requests
            ids = [list(PROMPT) for _ in range(n_requests)]
            raw = eng.engine
            warm = eng.generate(requests)
            row["drafted"] = sum(c.num_draft_tokens or 0 for c in warm)
            row["accepted"] = sum(c.num_accepted_tokens or 0 for c in warm)
            ta, tr = _time_pair(
                lambda: eng.generate(requests),
                lambda: raw.generate(input_ids=ids, sampling_params=sps),
                repeats,
            )
            outs = raw.generate(input_ids=ids, sampling_params=sps)
            eng._engine = _Replay(outs)
            own = []
            for _ in range(max(3, repeats)):
                t0 = time.perf_counter()
                eng.generate(requests)
                own.append(time.perf_counter() - t0)
            eng._engine = raw
        finally:
            t0 = time.perf_counter()
            eng.close()
            row["close_seconds"] = round(time.perf_counter() - t0, 2)
            row["close_timed_out"] = eng.close_timed_out
    a, r = min(ta), min(tr)
    o = min(own)
    row.update({
        "requests": n_requests,
        "adapter_samples_per_s": round(n_requests / a, 1),
        "raw_samples_per_s": round(n_requests / r, 1),
        "overhead_pct": round(100.0 * (a - r) / r, 2),
        "overhead_pct_median": round(100.0 * (statistics.median(ta) - statistics.median(tr)) / statistics.median(tr), 2),
        "adapter_own_seconds": round(o, 4),
        "adapter_own_pct_of_raw": round(100.0 * o / r, 2),
        "adapter_seconds": [round(x, 4) for x in ta],
        "raw_seconds": [round(x, 4) for x in tr],
    })
    return row


def _write(out: Path, results: dict) -> None:
    modes = [m for m in results["modes"].values() if "adapter_own_pct_of_raw" in m]
    if modes:
        worst = max(m["adapter_own_pct_of_raw"] for m in modes)
        results["worst_overhead_pct"] = worst
        results["meets_goal"] = worst < GOAL_OVERHEAD_PCT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--mode", choices=MODES, action="append", help="mode(s) to run (default: all, each in its own process)")
    ap.add_argument("--mode-timeout", type=float, default=80.0, help="seconds per mode process")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--settings", type=json.loads, default=None, help="adapter settings for every mode (JSON)")
    ap.add_argument("--tag", default="", help="a suffix for this run's row names (MODE TAG)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:  # one mode, in this process; the row goes to --out
        row = bench_mode(args.mode[0], args.requests, args.repeats, args.settings)
        args.out.write_text(json.dumps(row) + "\n")
        return 0
    results: dict = {"engine": "sglang", "dtype": DTYPE, "requests": args.requests, "max_tokens": MAX_TOKENS,
                     "repeats": args.repeats, "goal_overhead_pct": GOAL_OVERHEAD_PCT, "modes": {}}
    if args.tag and args.out.exists():  # a tagged run adds its rows to the file's
        results["modes"] = json.loads(args.out.read_text()).get("modes", {})
    for name in args.mode or MODES:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            row_path = Path(f.name)
        cmd = [sys.executable, __file__, "--child", "--mode", name, "--requests", str(args.requests),
               "--repeats", str(args.repeats), "--out", str(row_path)]
        if args.settings:
            cmd += ["--settings", json.dumps(args.settings)]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, timeout=args.mode_timeout)
            status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            status = f"timeout after {args.mode_timeout:.0f} s"
        try:
            row = json.loads(row_path.read_text()) if status == "ok" else {"mode": name}
        except (OSError, json.JSONDecodeError):
            row, status = {"mode": name}, "no result"
        row_path.unlink(missing_ok=True)
        row["status"] = status
        row["wall_seconds"] = round(time.perf_counter() - t0, 1)
        key = f"{name} {args.tag}" if args.tag else name
        results["modes"][key] = row
        if "adapter_samples_per_s" in row:
            print(
                f"sglang {key:14s} start {row['start_seconds']:5.1f} s  adapter {row['adapter_samples_per_s']:8.1f}/s  "
                f"raw {row['raw_samples_per_s']:8.1f}/s  overhead {row['overhead_pct']:+.1f}% "
                f"(adapter's own work {row['adapter_own_pct_of_raw']:.1f}% of raw)  close {row['close_seconds']:.1f} s",
                flush=True,
            )
        else:
            print(f"sglang {key:14s} {status}", flush=True)
        _write(args.out, results)
    print(f"wrote {args.out}")
    return 0 if all(m.get("status") == "ok" for m in results["modes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
