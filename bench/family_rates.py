"""Sampling rate per method and per sampling feature, from a campaign's family log.

Every family a campaign runs is one line of ``<corpus>/.specfuzz/families.jsonl``
(``Campaign._log_family``): method, vocabulary, the sampling features in play, samples,
and its seconds of start, swap and generate. This prints samples per second of generate
time per method and per feature, to tell which configurations make an engine slow (the
SGLang campaigns on the H200 sampled ~100/s where the adapter bench samples ~1000/s):

    python bench/family_rates.py CORPUS [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def rates(lines: list[dict]) -> dict:
    """{"method": {name: row}, "feature": {name: row}, "all": row}; a row: families, samples,
    generate seconds and samples per second. Features: each family counts for every feature it
    has ("none" for default sampling)."""
    groups: dict[str, dict[str, list[dict]]] = {"method": defaultdict(list), "feature": defaultdict(list)}
    for r in lines:
        groups["method"][str(r.get("method") or "off")].append(r)
        for f in r.get("features") or ["none"]:
            groups["feature"][f].append(r)

    def row(rs: list[dict]) -> dict:
        n = sum(int(r.get("samples", 0)) for r in rs)
        g = sum(float((r.get("seconds") or {}).get("generate", 0.0)) for r in rs)
        return {"families": len(rs), "samples": n, "generate_s": round(g, 2), "samples_per_s": round(n / g, 1) if g > 0 else None}

    return {"all": row(lines), **{k: {name: row(rs) for name, rs in sorted(v.items())} for k, v in groups.items()},
            "starts": starts(lines)}


def starts(lines: list[dict]) -> dict:
    """Engine starts per role (search; shrink: a family run while a failure is shrunk, logged as
    such since 2026-12-04; calibration; fresh: a confirmation's new engine):
    families that started one, start seconds, and of them the seconds spent waiting for the
    engine process to answer (``ready_s``: its imports, or a spare process's unfinished
    preload; logged since 2026-12-03)."""
    out: dict[str, dict] = {}
    for r in lines:
        s = float((r.get("seconds") or {}).get("start", 0.0))
        if s <= 0:
            continue
        row = out.setdefault(str(r.get("role") or "search"), {"starts": 0, "start_s": 0.0, "ready_s": 0.0, "ready_logged": 0})
        row["starts"] += 1
        row["start_s"] = round(row["start_s"] + s, 2)
        if "ready_s" in r:
            row["ready_logged"] += 1
            row["ready_s"] = round(row["ready_s"] + float(r["ready_s"]), 2)
    return dict(sorted(out.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus", type=Path, help="a campaign's corpus folder (or its families.jsonl)")
    ap.add_argument("--out", type=Path, default=None, help="also write the result as JSON here")
    args = ap.parse_args(argv)
    path = args.corpus if args.corpus.is_file() else args.corpus / ".specfuzz" / "families.jsonl"
    if not path.exists():
        print(f"{path}: no family log (campaigns write one since 2026-12-02)", file=sys.stderr)
        return 2
    lines = []
    for i, text in enumerate(path.read_text().splitlines(), 1):
        try:
            lines.append(json.loads(text))
        except json.JSONDecodeError:
            print(f"{path}:{i}: not JSON, skipped", file=sys.stderr)  # a line cut by a kill
    out = rates(lines)
    a = out["all"]
    print(f"{a['families']} families, {a['samples']} samples, {a['generate_s']} s of generate: {a['samples_per_s']} samples/s")
    for kind in ("method", "feature"):
        print(f"-- per {kind}")
        for name, r in out[kind].items():
            print(f"  {name:24s} {r['families']:5d} families {r['samples']:8d} samples {r['generate_s']:8.1f} s  {r['samples_per_s']} /s")
    print("-- engine starts per role (ready: waiting for the engine process to answer)")
    for role, r in out["starts"].items():
        ready = f"{r['ready_s']:.1f} s ready over {r['ready_logged']} logged" if r["ready_logged"] else "ready not logged"
        print(f"  {role:24s} {r['starts']:5d} starts {r['start_s']:8.1f} s  {ready}")
    if args.out is not None:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
