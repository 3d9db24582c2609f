"""Families per minute and where a campaign's wall time goes: engine reuse by table swaps.

Runs a real campaign (``specfuzz.fuzz.campaign.Campaign``) for a fixed budget on one engine
and reports the model families it ran per minute and the share of wall time spent
starting engines, swapping tables, sampling (the engine's generate calls) and on
everything else. The timing wraps ``IsolatedEngine.start`` / ``generate`` (and ``_swap``
where it exists) at class level, so the same bench runs on code from before table swaps
existed (the "before" numbers) and after, at equal budget:

    python bench/bench_reuse.py --engine vllm --budget 300 --label "before (af427f2)" --out bench/results/reuse_vllm_cpu.json
    python bench/bench_reuse.py --engine vllm --budget 300 --label after --out bench/results/reuse_vllm_cpu.json

``--no-swap`` runs the new code with swaps off (a start per table model). Results are
appended to ``--out`` (one JSON file per engine and machine).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _timed(cls, name: str, bucket: dict, key: str) -> None:
    orig = getattr(cls, name, None)
    if orig is None:
        return

    def wrapper(self, *a, **kw):
        t0 = time.monotonic()
        depth = bucket.setdefault("_depth_" + key, [0])  # a call inside another of its bucket counts once
        depth[0] += 1
        try:
            return orig(self, *a, **kw)
        finally:
            depth[0] -= 1
            dt = time.monotonic() - t0
            if depth[0] == 0:
                bucket[key] = bucket.get(key, 0.0) + dt
            if key == "swap":  # a swap runs inside start(): keep it out of the start bucket
                bucket["swap_in_start"] = bucket.get("swap_in_start", 0.0) + dt

    setattr(cls, name, wrapper)


def _profile_summary(folder: Path, top: int = 45) -> None:
    """DIR/summary.txt: the top functions by cumulative and by own time, driver and engines."""
    import io
    import pstats

    buf = io.StringIO()
    for f in sorted(folder.glob("*.prof")):
        try:
            st = pstats.Stats(str(f), stream=buf)
        except (OSError, TypeError, EOFError) as exc:
            buf.write(f"== {f.name}: unreadable ({exc})\n")
            continue
        buf.write(f"== {f.name}: cumulative\n")
        st.sort_stats("cumulative").print_stats(top)
        buf.write(f"== {f.name}: own time\n")
        st.sort_stats("tottime").print_stats(top)
    (folder / "summary.txt").write_text(buf.getvalue())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default="vllm")
    ap.add_argument("--budget", type=float, default=300.0, help="campaign seconds")
    ap.add_argument("--method", action="append", dest="methods", help="speculation method (repeatable); 'none' = off")
    ap.add_argument("--max-vocab", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=600)
    ap.add_argument("--patterns", type=int, default=3)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--engine-setting", action="append", default=[], metavar="KEY=JSON")
    ap.add_argument("--no-swap", action="store_true", help="new code, swaps off (a start per table model)")
    ap.add_argument("--spare", choices=("auto", "on", "off"), default="auto",
                    help="warmed-up spare engine processes (CampaignConfig.spare_engines; auto: with 8+ CPUs)")
    ap.add_argument("--prestart", choices=("auto", "on", "off"), default="auto",
                    help="the next search's engine started in the background (CampaignConfig.prestart; auto: with spares)")
    ap.add_argument("--fill-waits", choices=("auto", "on", "off"), default="auto",
                    help="families of the running search sampled while another engine starts (CampaignConfig.fill_waits; auto: with prestarts)")
    ap.add_argument("--known", type=Path, default=None,
                    help="a corpus folder whose entries the campaign starts with (known bugs are then seen again, not "
                         "shrunk again: a campaign resumed by a user who has its engine's findings already)")
    ap.add_argument("--keep", type=Path, default=None,
                    help="copy the bench's corpus (new entries, campaign state, events) and engine logs here at the end")
    ap.add_argument("--profile", type=Path, default=None,
                    help="profile the campaign (cProfile: DIR/driver.prof) and every engine process "
                         "(DIR/engine-<pid>.prof, engines/isolation.py PROFILE_ENV); DIR/summary.txt lists the top functions")
    ap.add_argument("--label", default=None)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    from specfuzz.engines import isolation
    from specfuzz.fuzz.campaign import Campaign, CampaignConfig

    bucket: dict = {}
    _timed(isolation.IsolatedEngine, "start", bucket, "start")
    _timed(isolation.IsolatedEngine, "_await_ready", bucket, "start")  # a new process's imports, before its first command
    _timed(isolation.IsolatedEngine, "generate", bucket, "sample")
    _timed(isolation.IsolatedEngine, "_swap", bucket, "swap")

    settings = {}
    for kv in args.engine_setting:
        k, _, v = kv.partition("=")
        try:
            settings[k] = json.loads(v)
        except json.JSONDecodeError:
            settings[k] = v
    methods = None if not args.methods else (() if args.methods == ["none"] else tuple(args.methods))
    with tempfile.TemporaryDirectory(prefix="bench-reuse-") as tmp:
        if args.known is not None:
            import shutil

            (Path(tmp) / "corpus").mkdir()
            for f in sorted(Path(args.known).glob("*.json")):
                shutil.copy(f, Path(tmp) / "corpus" / f.name)
        kw = dict(engine=args.engine, budget_s=args.budget, corpus_dir=Path(tmp) / "corpus", seed=args.seed, methods=methods,
                  max_samples=args.samples, batch=args.batch, max_vocab=args.max_vocab, max_tokens=args.max_tokens,
                  max_patterns=args.patterns, dtype=args.dtype, work_dir=Path(tmp) / "wd", engine_settings=settings)
        if "swap" in CampaignConfig.__dataclass_fields__:
            kw["swap"] = not args.no_swap
        elif args.no_swap:
            pass  # code from before swaps: a start per table model anyway
        if "spare_engines" in CampaignConfig.__dataclass_fields__:
            kw["spare_engines"] = {"auto": None, "on": True, "off": False}[args.spare]
        if "prestart" in CampaignConfig.__dataclass_fields__:
            kw["prestart"] = {"auto": None, "on": True, "off": False}[args.prestart]
        if "fill_waits" in CampaignConfig.__dataclass_fields__:
            kw["fill_waits"] = {"auto": None, "on": True, "off": False}[args.fill_waits]
        prof = None
        if args.profile is not None:
            import cProfile
            import os

            args.profile.mkdir(parents=True, exist_ok=True)
            os.environ[isolation.PROFILE_ENV] = str(args.profile.resolve())  # before any engine process
            prof = cProfile.Profile()
        camp = Campaign(CampaignConfig(**kw))
        if prof is not None:
            prof.enable()
        t0 = time.monotonic()
        stats = camp.run()
        wall = time.monotonic() - t0
        if prof is not None:
            prof.disable()
            prof.dump_stats(str(args.profile / "driver.prof"))
            _profile_summary(args.profile)
        totals = dict(camp.totals)
        # seconds a start lent to families filling its wait (IsolatedEngine.lent_s): sampling, not
        # starting (their swaps, inside that start too, are taken out of it as swap_in_start already)
        lent = sum(getattr(e, "lent_s", 0.0) for e in camp._engines) - getattr(camp, "_fill", {}).get("swap", 0.0)
        if args.keep is not None:  # what the bench found is kept: a finding is a finding
            import shutil

            shutil.copytree(Path(tmp) / "corpus", args.keep / "corpus", dirs_exist_ok=True)
            if (Path(tmp) / "wd" / "logs").is_dir():
                shutil.copytree(Path(tmp) / "wd" / "logs", args.keep / "logs", dirs_exist_ok=True)
    start = bucket.get("start", 0.0) - bucket.get("swap_in_start", 0.0) - lent
    swap = bucket.get("swap", 0.0)
    sample = bucket.get("sample", 0.0)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parent).stdout.strip()
    except OSError:
        commit = ""
    row = {
        "label": args.label or ("no swap" if args.no_swap else "swap"),
        "commit": commit,
        "date": time.strftime("%Y-%m-%d"),
        "engine": args.engine,
        "methods": list(methods) if methods is not None else "all",
        "budget_s": args.budget,
        "wall_s": round(wall, 1),
        "families": stats.cases,
        "families_per_min": round(60 * stats.cases / wall, 2),
        "patterns": stats.patterns,
        "samples": stats.samples,
        "engine_starts": stats.engine_starts,
        "warm_starts": (totals.get("engine") or {}).get("warm_starts"),
        "prestarts": (totals.get("engine") or {}).get("prestarts"),
        "hot_starts": (totals.get("engine") or {}).get("hot_starts"),
        "filled_families": (totals.get("engine") or {}).get("filled_families"),
        "swaps": getattr(stats, "swaps", 0),
        "swap_fallbacks": getattr(stats, "swap_fallbacks", 0),
        "searches": stats.searches,
        "stored": list(stats.stored),
        "known": str(args.known) if args.known else None,
        "findings_seen_again": getattr(stats, "findings_updated", 0),
        "calibration_known": getattr(stats, "calibration_known", 0),
        "share": {k: round(v / wall, 3) for k, v in (("start", start), ("swap", swap), ("sample", sample),
                                                      ("other", max(0.0, wall - start - swap - sample)))},
        "campaign_time_totals": (totals.get("engine") or {}).get("seconds"),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "python": platform.python_version(),
        "argv": sys.argv[1:],
    }
    out = json.loads(args.out.read_text()) if args.out.exists() else {"bench": "bench/bench_reuse.py", "runs": []}
    out["runs"].append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: row[k] for k in ("label", "families", "families_per_min", "engine_starts", "swaps", "share")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
