"""Families per minute of a Ray campaign with 1, 2, 4 ... engine actors, and the scaling efficiency.

Runs real Ray campaigns (``specfuzz.fuzz.ray_driver.run_ray_campaign``, the code behind
``specfuzz fuzz --ray``), one per configuration ``N x G`` (N engine actors of G GPUs each),
each on a fresh corpus (seeded with ``--known``'s entries, so the engine's known bugs are
seen again rather than shrunk again), with the same budget and seed, on one Ray cluster
(a local one unless ``--address``). For each it records the families the actors ran per
minute of campaign wall time (actor and engine starts included), per actor and per host,
engine starts, swaps and the share of engine time spent starting, swapping, sampling,
shrinking and on everything else; and the scaling efficiency against the first
configuration, normalised to one actor:

    efficiency(N) = fpm(N) / (N x fpm(1))      (fpm(1): the first configuration's rate per actor)

Examples (the H200 commands are in bin/gpu-run's ray-bench step):

    python bench/bench_ray.py --engine reference --configs 1x0,2x0 --budget 60 --out bench/results/ray_reference_cpu.json
    python bench/bench_ray.py --engine vllm --configs 1x1,4x0.25 --budget 150 --method ngram --method draft_model \\
        --known corpus/h200/vllm --out bench/results/ray_vllm_h200.json          # one H200
    python bench/bench_ray.py --engine vllm --configs 1x1,2x1,4x1 --budget 150 ...  # 4 H200s

Results are appended to ``--out`` (one JSON file per engine and machine).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def parse_configs(text: str) -> list[tuple[int, float]]:
    """'1x1,4x0.25' -> [(1, 1.0), (4, 0.25)]."""
    out = []
    for part in text.split(","):
        n, _, g = part.strip().partition("x")
        if not n.isdigit() or int(n) < 1 or not g:
            raise SystemExit(f"--configs {text!r}: comma-separated NxG (N engine actors of G GPUs each), e.g. 1x1,4x0.25")
        out.append((int(n), float(g)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default="vllm")
    ap.add_argument("--configs", default="1x1,4x0.25", help="NxG,...: N engine actors of G GPUs each (G=0: CPU actors)")
    ap.add_argument("--budget", type=float, default=150.0, help="campaign seconds per configuration")
    ap.add_argument("--address", default=None, help="a running Ray cluster (default: start a local one)")
    ap.add_argument("--num-gpus", type=int, default=None, help="a local cluster's GPUs (default: Ray's detection)")
    ap.add_argument("--cpus-per-engine", type=float, default=1.0)
    ap.add_argument("--method", action="append", dest="methods", help="speculation method (repeatable)")
    ap.add_argument("--inject", default=None)
    ap.add_argument("--max-vocab", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=600)
    ap.add_argument("--patterns", type=int, default=3)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--engine-setting", action="append", default=[], metavar="KEY=JSON")
    ap.add_argument("--known", type=Path, default=None, help="a corpus folder whose entries every configuration starts with")
    ap.add_argument("--keep", type=Path, default=None,
                    help="copy each configuration's corpus (new entries, campaign state) and engine logs to KEEP/<config>: "
                         "what a bench finds is kept (a finding is a finding)")
    ap.add_argument("--label", default=None)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    configs = parse_configs(args.configs)

    from specfuzz.fuzz.campaign import CampaignConfig
    from specfuzz.fuzz.ray_driver import RayOptions, connect, run_ray_campaign, summary_rows

    settings = {}
    for kv in args.engine_setting:
        k, _, v = kv.partition("=")
        try:
            settings[k] = json.loads(v)
        except json.JSONDecodeError:
            settings[k] = v
    ray = connect(args.address, num_gpus=args.num_gpus)
    resources = {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}
    rows = []
    try:
        for n, g in configs:
            with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
                corpus = Path(tmp) / "corpus"
                corpus.mkdir()
                if args.known is not None:
                    for f in sorted(Path(args.known).glob("*.json")):
                        shutil.copy(f, corpus / f.name)
                cfg = CampaignConfig(
                    engine=args.engine, engine_kwargs={"inject": args.inject} if args.inject else {}, budget_s=args.budget,
                    corpus_dir=corpus, seed=args.seed, methods=tuple(args.methods) if args.methods else None,
                    max_samples=args.samples, batch=args.batch, max_vocab=args.max_vocab, max_tokens=args.max_tokens,
                    max_patterns=args.patterns, dtype=args.dtype, work_dir=Path(tmp) / "wd", engine_settings=settings)
                print(f"== {n} engine actors x {g:g} GPU, {args.budget:.0f} s", flush=True)
                out = run_ray_campaign(cfg, RayOptions(address=args.address, engines=n, gpus_per_engine=g,
                                                       cpus_per_engine=args.cpus_per_engine))
                if out.fatal is not None:
                    raise SystemExit(f"{n}x{g:g}: {out.fatal}")
                if args.keep is not None:
                    dest = args.keep / f"{n}x{g:g}"
                    shutil.copytree(corpus, dest / "corpus", dirs_exist_ok=True)
                    if (Path(tmp) / "wd").is_dir():
                        shutil.copytree(Path(tmp) / "wd", dest / "wd", dirs_exist_ok=True,
                                        ignore=shutil.ignore_patterns("*.safetensors", "checkpoints"))
                summ = summary_rows(out.snapshot, out.run)
                eng = out.totals.get("engine") or {}
                sec = eng.get("seconds") or {}
                total = sum(sec.values()) or 1.0
                rows.append({
                    "config": f"{n}x{g:g}", "engines": n, "gpus_per_engine": g, "budget_s": args.budget,
                    "wall_s": out.run["wall_s"], "families": out.run["families"], "families_per_min": out.run["fpm"],
                    "samples": out.stats.samples, "engine_starts": eng.get("starts", 0), "swaps": eng.get("swaps", 0),
                    "searches": out.run["searches"], "stored": list(out.stats.stored), "actor_deaths": out.run["actor_deaths"],
                    "share": {k: round(v / total, 3) for k, v in sec.items()},
                    "actors": summ["actors"], "hosts": summ["hosts"],
                })
                print(json.dumps({k: rows[-1][k] for k in ("config", "families", "families_per_min", "engine_starts",
                                                           "swaps", "share")}), flush=True)
    finally:
        ray.shutdown()
    base = rows[0]["families_per_min"] / rows[0]["engines"] if rows and rows[0]["families_per_min"] else None
    for r in rows:
        r["efficiency"] = round(r["families_per_min"] / (r["engines"] * base), 3) if base else None
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parent).stdout.strip()
    except OSError:
        commit = ""
    run = {
        "label": args.label or f"{args.engine} {args.configs}", "commit": commit, "date": time.strftime("%Y-%m-%d"),
        "engine": args.engine, "methods": args.methods or "all", "cluster": resources,
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(), "python": platform.python_version(),
        "argv": sys.argv[1:], "configs": rows,
    }
    out_doc = json.loads(args.out.read_text()) if args.out.exists() else {"bench": "bench/bench_ray.py", "runs": []}
    out_doc["runs"].append(run)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out_doc, indent=1) + "\n")
    for r in rows:
        print(f"{r['config']:>8}: {r['families']:5d} families in {r['wall_s']:6.1f} s = {r['families_per_min']:7.2f}/min"
              + (f", efficiency {r['efficiency']:.0%}" if r["efficiency"] is not None else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
