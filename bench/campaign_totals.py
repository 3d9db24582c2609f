"""A campaign's measured totals as a bench result: families per minute and where the wall time went.

Reads a campaign's state file (``<corpus>/.specfuzz/state.json``, written by every campaign:
per-engine starts, swaps, families, samples and seconds spent starting, swapping, sampling,
shrinking and otherwise) and, with ``--before``, the state file of the same corpus before the
run, so that the engine and per-method counts (which add up over resumed runs) are this run's alone.
Appends one run to ``--out`` (bench/results/*.json; the README quotes them).

    python bench/campaign_totals.py --state /tmp/corpus_vllm/.specfuzz/state.json \\
        --before old_state.json --label "vLLM 0.25.0, H200, 15 min" --out bench/results/reuse_h200.json
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
        "shapes": eng.get("shapes", {}),
        "share": {k: round(v / wall, 3) for k, v in sec.items()} if wall else {},
        "seconds": {k: round(v, 1) for k, v in sec.items()},
        "methods": _methods_delta(totals, (before or {}).get("totals")),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state", required=True, type=Path)
    ap.add_argument("--before", type=Path, default=None, help="the corpus's state file before this run")
    ap.add_argument("--label", required=True)
    ap.add_argument("--note", default="")
    ap.add_argument("--out", required=True, type=Path)
    a = ap.parse_args(argv)
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
