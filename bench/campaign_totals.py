"""A campaign's measured totals as a bench result: families per minute and where the wall time went.

Reads a campaign's state file (``<corpus>/.specfuzz/state.json``, written by every campaign:
per-engine starts, swaps, families, samples and seconds spent starting, swapping, sampling,
shrinking and otherwise) and, with ``--before``, the state file of the same corpus before the
run, so that the engine and per-method counts (which add up over resumed runs) are this run's alone.
Appends one run to ``--out`` (bench/results/*.json; the README quotes them).

    python bench/campaign_totals.py --state /tmp/corpus_vllm/.specfuzz/state.json \\
        --before old_state.json --label "vLLM 0.25.0, H200, 15 min" --out bench/results/reuse_h200.json

A ``--workers N`` campaign keeps one state file per worker (``state.json``, ``state-w1.json``, ...):
``--corpus DIR [--before-corpus OLD_DIR]`` reads every one of them (and the same names before the
run; a worker without one then started fresh) and adds the workers up. Families per minute are
then over the campaign's wall time (the longest worker's), the shares over every worker's seconds.
It also adds ``roles``: the run's family records (``families.jsonl``, the lines after those the
corpus held before) per role (search, filler, shrink, calibration: speculation-off checks,
fresh: runs on a freshly started engine), with their samples, engine starts and seconds
starting, swapping, generating and in all (wall): on an H100,
2026-12-06, 17 fresh-engine runs took 836 of four workers' 3,163 s.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path


def _methods_delta(now: dict, before: dict | None) -> dict:
    out = {}
    for m, d in now.get("methods", {}).items():
        b = (before or {}).get("methods", {}).get(m, {})
        fam = d.get("families", 0) - b.get("families", 0)
        if fam <= 0:
            continue
        variants = {k: v - b.get("variants", {}).get(k, 0) for k, v in d.get("variants", {}).items()}
        out[m] = {"families": fam, "patterns": d.get("patterns", 0) - b.get("patterns", 0),
                  "samples": d.get("samples", 0) - b.get("samples", 0),
                  "variants": {k: v for k, v in variants.items() if v > 0}}
    return out


def _engine_delta(now: dict, before: dict | None) -> dict:
    """The engine totals of this run alone: counters, seconds and shapes minus ``before``'s
    (the state adds every resumed run up)."""
    if not before:
        return now
    out: dict = {}
    for k, v in now.items():
        b = before.get(k)
        if isinstance(v, dict):
            out[k] = {n: x - (b or {}).get(n, 0) for n, x in v.items() if x - (b or {}).get(n, 0)}
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = v - (b or 0)
        else:
            out[k] = v
    return out


def summarize(state: dict, before: dict | None, label: str) -> dict:
    totals = state["totals"]
    eng = _engine_delta(totals.get("engine") or {}, ((before or {}).get("totals") or {}).get("engine"))
    sec = eng.get("seconds") or {}
    wall = sum(sec.values())
    fam = eng.get("families", 0)
    return {
        "label": label,
        "date": datetime.date.today().isoformat(),
        "wall_s": round(wall, 1),
        "families": fam,
        "families_per_min": round(60.0 * fam / wall, 2) if wall else 0.0,
        "samples": eng.get("samples", 0),
        "engine_starts": eng.get("starts", 0),
        "warm_starts": eng.get("warm_starts", 0),
        "prestarts": eng.get("prestarts", 0),
        "hot_starts": eng.get("hot_starts", 0),
        "swaps": eng.get("swaps", 0),
        "swap_fallbacks": eng.get("swap_fallbacks", 0),
        "stale_weights": eng.get("stale_weights", 0),
        "searches": eng.get("searches", 0),
        "filled_families": eng.get("filled_families", 0),
        "shapes": eng.get("shapes", {}),
        "share": {k: round(v / wall, 3) for k, v in sec.items()} if wall else {},
        "seconds": {k: round(v, 1) for k, v in sec.items()},
        # the "shrink" seconds split as the others (states written before 2026-12-04: none)
        "shrink_seconds": {k: round(v, 1) for k, v in (eng.get("shrink_seconds") or {}).items()},
        "methods": _methods_delta(totals, (before or {}).get("totals")),
    }


def add_workers(runs: list[dict], label: str) -> dict:
    """Worker runs of one campaign (they ran side by side) added up: counts and seconds summed,
    families per minute over the longest worker's wall time, shares over all their seconds."""
    out: dict = {"label": label, "date": datetime.date.today().isoformat(), "workers": len(runs)}
    for k in ("families", "samples", "engine_starts", "warm_starts", "prestarts", "hot_starts", "swaps",
              "swap_fallbacks", "stale_weights", "searches"):
        out[k] = sum(r.get(k, 0) for r in runs)
    sec: dict = {}
    for r in runs:
        for k, v in r["seconds"].items():
            sec[k] = sec.get(k, 0.0) + v
    total = sum(sec.values())
    wall = max(r["wall_s"] for r in runs)
    out["wall_s"] = wall
    out["families_per_min"] = round(60.0 * out["families"] / wall, 2) if wall else 0.0
    out["per_worker_families_per_min"] = [r["families_per_min"] for r in runs]
    out["share"] = {k: round(v / total, 3) for k, v in sec.items()} if total else {}
    out["seconds"] = {k: round(v, 1) for k, v in sec.items()}
    shrink: dict = {}
    for r in runs:
        for k, v in r.get("shrink_seconds", {}).items():
            shrink[k] = shrink.get(k, 0.0) + v
    out["shrink_seconds"] = {k: round(v, 1) for k, v in shrink.items()}
    methods: dict = {}
    shapes: dict = {}
    for r in runs:
        for v, n in r.get("shapes", {}).items():
            shapes[v] = shapes.get(v, 0) + n
        for m, d in r["methods"].items():
            dst = methods.setdefault(m, {"families": 0, "patterns": 0, "samples": 0, "variants": {}})
            for k in ("families", "patterns", "samples"):
                dst[k] += d.get(k, 0)
            for v, n in d.get("variants", {}).items():
                dst["variants"][v] = dst["variants"].get(v, 0) + n
    out["shapes"], out["methods"] = shapes, methods
    return out


def roles(corpus: Path, before: Path | None) -> dict:
    """The run's family records (``families.jsonl`` lines after the ``before`` corpus's), per role:
    records, samples, engine starts (records whose start took over 0.5 s) and seconds."""
    path = corpus / ".specfuzz" / "families.jsonl"
    if not path.is_file():
        return {}
    skip = 0
    if before is not None and (before / ".specfuzz" / "families.jsonl").is_file():
        skip = len((before / ".specfuzz" / "families.jsonl").read_text().splitlines())
    out: dict = {}
    for line in path.read_text().splitlines()[skip:]:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        r = out.setdefault(str(rec.get("role", "?")), {"records": 0, "samples": 0, "starts": 0, "start_s": 0.0, "swap_s": 0.0,
                                                       "generate_s": 0.0, "wall_s": 0.0})
        secs = rec.get("seconds") or {}
        r["records"] += 1
        r["samples"] += int(rec.get("samples") or 0)
        r["starts"] += int(float(secs.get("start", 0.0)) > 0.5)
        for k in ("start", "swap", "generate"):
            r[f"{k}_s"] = round(r[f"{k}_s"] + float(secs.get(k, 0.0)), 1)
        r["wall_s"] = round(r["wall_s"] + float(rec.get("wall_s") or 0.0), 1)
    return out


def _states(corpus: Path) -> dict[str, dict]:
    d = corpus / ".specfuzz"
    paths = sorted(d.glob("state*.json"), key=lambda p: (p.name != "state.json", len(p.name), p.name))  # worker 0 first
    return {p.name: json.loads(p.read_text()) for p in paths}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state", type=Path, help="one campaign state file")
    ap.add_argument("--before", type=Path, default=None, help="the corpus's state file before this run")
    ap.add_argument("--corpus", type=Path, help="a corpus: every worker's state file, added up")
    ap.add_argument("--before-corpus", type=Path, help="the same corpus before this run")
    ap.add_argument("--label", required=True)
    ap.add_argument("--note", default="")
    ap.add_argument("--out", required=True, type=Path)
    a = ap.parse_args(argv)
    if (a.state is None) == (a.corpus is None):
        ap.error("give --state FILE or --corpus DIR")
    if a.corpus is not None:
        now = _states(a.corpus)
        if not now:
            ap.error(f"--corpus {a.corpus}: no .specfuzz/state*.json in it")
        old = _states(a.before_corpus) if a.before_corpus else {}
        runs = [summarize(st, old.get(name), a.label if len(now) == 1 else f"{a.label} [{name}]") for name, st in now.items()]
        if old:
            # A worker's state left from an earlier run with more workers did not run this time.
            runs = [r for r in runs if r["wall_s"] > 0] or runs[:1]
        run = runs[0] if len(runs) == 1 else add_workers(runs, a.label)
        if len(runs) > 1:
            run["per_worker"] = runs
        run["roles"] = roles(a.corpus, a.before_corpus)
    else:
        state = json.loads(a.state.read_text())
        before = json.loads(a.before.read_text()) if a.before else None
        run = summarize(state, before, a.label)
    if a.note:
        run["note"] = a.note
    doc = json.loads(a.out.read_text()) if a.out.exists() else {"bench": "bench/campaign_totals.py", "runs": []}
    doc["runs"].append(run)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: run[k] for k in ("label", "families", "families_per_min", "share")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
