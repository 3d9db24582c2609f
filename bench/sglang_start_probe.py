"""Where a SGLang engine start goes, and what a warm fork server saves (``child_start``).

For each way SGLang's own processes start (``spawn``, SGLang's; ``forkserver``, from a server
that imported them ahead: engines/sglang_procs.py) this runs what a campaign's fresh
confirmation runs: an :class:`IsolatedEngine` with a spare process, a first start (cold: no
spare ready yet), then ``--fresh`` fresh starts each after ``--idle`` seconds (the spare
process has preloaded meanwhile, as during a search), each start followed by ``--samples``
samples of one table model tested against its exact law μ. SGLang logs at ``info`` level
into the engines' logs (its own timestamps say where a start goes).

Writes a JSON report: per mode, each start's seconds (and of it, waiting for the engine
process), generate seconds, the verdict (a run that fails is a problem of the mode: the
table model is one SGLang passes), and the median fresh start. Prints the better mode last.

On the H200 (environment of ``bin/gpu-run``): ``bin/gpu-run probe`` (writes
``$OUT/sglang_start_probe.json`` and the engines' logs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def probe(mode: str, case, *, work: Path, fresh: int, idle: float, samples: int, dtype: str) -> dict:
    from specfuzz.engines.isolation import IsolatedEngine
    from specfuzz.fuzz.run import run_family

    eng = IsolatedEngine("sglang", {"child_start": mode, "log_level": "info"}, log_dir=work / mode / "logs", spare=True)
    runs = []
    try:
        for i in range(1 + fresh):
            if i:
                time.sleep(idle)
            s0, r0, g0 = eng.seconds["start"], eng.ready_wait_s, eng.seconds["generate"]
            t0 = time.monotonic()
            try:
                run = run_family(eng, [case], ckpt_root=work / "checkpoints", alphas=[1e-3], max_samples=samples,
                                 batch=samples, seed=1000 + i, speculation=True, dtype=dtype, fresh=True)[0]
                verdict = {"failed": bool(run.failed), "n": run.n, "status": None if run.judgement is None else run.judgement.verdict.status,
                           "crash": None if run.crash is None else str(run.crash)[:300]}
            except Exception as exc:  # noqa: BLE001 - the report says what broke
                verdict = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            runs.append({"start_s": round(eng.seconds["start"] - s0, 2), "ready_wait_s": round(eng.ready_wait_s - r0, 2),
                         "generate_s": round(eng.seconds["generate"] - g0, 2), "wall_s": round(time.monotonic() - t0, 2),
                         "warm_spare": i > 0, **verdict})
            print(mode, i, json.dumps(runs[-1]), flush=True)
            eng.close(keep_spare=True, discard=True)
    finally:
        eng.close()
    warm = [r["start_s"] for r in runs[1:] if "error" not in r]
    return {"mode": mode, "runs": runs, "median_fresh_start_s": statistics.median(warm) if warm else None,
            "all_passed": all(not r.get("failed") and "error" not in r and not r.get("crash") for r in runs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="spawn,forkserver")
    ap.add_argument("--fresh", type=int, default=1, help="fresh starts after the first (default 1)")
    ap.add_argument("--idle", type=float, default=20.0, help="seconds between starts (the spare preloads)")
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--work", type=Path, default=Path("/tmp/sglang_start_probe"))
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)

    from specfuzz.case import Case
    from specfuzz.fuzz.corpus import reduced_to_features

    # A STANDALONE table model of the SGLang corpus with its sampling features taken away
    # (min_p, logit_bias, penalties): what SGLang passes.
    entry = json.loads((Path(__file__).resolve().parents[1] / "corpus/h200/sglang/finding-fa00db9d9d753086.json").read_text())
    case = Case.from_json(reduced_to_features(entry["case"], ()))
    report = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "case": "finding-fa00db9d9d753086 without its sampling features: STANDALONE K=4, greedy draft, V=4, temperature 1",
              "samples": a.samples, "idle_s": a.idle, "modes": []}
    for mode in a.modes.split(","):
        report["modes"].append(probe(mode, case, work=a.work, fresh=a.fresh, idle=a.idle, samples=a.samples, dtype=a.dtype))
        a.out.write_text(json.dumps(report, indent=1))
    ok = [m for m in report["modes"] if m["all_passed"] and m["median_fresh_start_s"] is not None]
    best = min(ok, key=lambda m: m["median_fresh_start_s"])["mode"] if ok else "spawn"
    report["best"] = best
    a.out.write_text(json.dumps(report, indent=1))
    for m in report["modes"]:
        print(f"{m['mode']}: median fresh start {m['median_fresh_start_s']} s, all passed {m['all_passed']}")
    print(best)
    return 0


if __name__ == "__main__":
    sys.exit(main())
