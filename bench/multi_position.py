"""Side by side at equal budget: how many families of a campaign run multi-position
configurations (K >= 2 chains, trees deeper than one) and exercise multi-position speculation
events, and at what rate, for two checkouts of specfuzz (e.g. a commit before steering and
this one).

    .venv/bin/python bench/multi_position.py --engine vllm --budget 5m --seed 1 \\
        --checkout before=/path/to/old/worktree --checkout after=. [--known corpus]

Each checkout runs ``specfuzz fuzz --engine E --budget B --seed S`` with its own virtualenv
(``CHECKOUT/.venv``) on a fresh corpus (``--known DIR``: pre-filled with DIR's entries, so that
known bugs are met again rather than shrunk). Results are added to
``bench/results/multi_position.json`` (one row per engine, seed and checkout).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "multi_position.json"


def run(checkout: Path, engine: str, budget: str, seed: int, known: Path | None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus"
        corpus.mkdir()
        if known is not None:
            for p in known.glob("*.json"):
                shutil.copy(p, corpus)
        before = {p.name for p in corpus.glob("*.json")}
        t0 = time.time()
        p = subprocess.run([str(checkout / ".venv" / "bin" / "specfuzz"), "fuzz", "--engine", engine, "--budget", budget,
                            "--seed", str(seed), "--corpus", str(corpus), "--work-dir", str(Path(tmp) / "work"), "--quiet"],
                           capture_output=True, text=True, cwd=checkout)
        wall = time.time() - t0
        totals = json.loads((corpus / ".specfuzz" / "state.json").read_text())["totals"]
        fams = [json.loads(x) for x in (corpus / ".specfuzz" / "families.jsonl").read_text().splitlines()]
        k2 = spec = 0
        for m, row in totals["methods"].items():
            if m == "off":
                continue
            spec += row["families"]
            k2 += sum(c for k, c in row.get("variants", {}).items() if re.fullmatch(r"K=(\d+)", k) and int(k[2:]) >= 2)
        cov = totals.get("coverage", {}).get("methods", {})
        first: list = []
        for f in fams:
            if f["role"] == "search" and f["method"] and (f["search"], f["method"]) not in [x[:2] for x in first]:
                first.append((f["search"], f["method"], f["engine_default"]))
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=checkout).stdout.strip()
        return {"engine": engine, "budget": budget, "seed": seed, "commit": commit, "exit": p.returncode,
                "wall_s": round(wall), "seconds": round(totals["seconds"]), "families": totals["engine"]["families"],
                "families_per_min": round(totals["engine"]["families"] / totals["seconds"] * 60, 1),
                "speculating_families": spec, "k_ge_2_families": k2,
                "multi_config_families": sum(r.get("multi_config", 0) for r in cov.values()) if cov else None,
                "multi_event_families": sum(r.get("multi_events", 0) for r in cov.values()) if cov else None,
                "first_searches": first[:6],
                "stored_new": sorted(x.name for x in corpus.glob("*.json") if x.name not in before)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", required=True)
    ap.add_argument("--budget", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--checkout", action="append", required=True, help="LABEL=PATH (a checkout with its .venv)")
    ap.add_argument("--known", type=Path, default=None)
    a = ap.parse_args()
    res = json.loads(OUT.read_text()) if OUT.is_file() else {"bench": "multi_position", "rows": []}
    for spec in a.checkout:
        label, path = spec.split("=", 1)
        row = {"label": label, "date": time.strftime("%Y-%m-%d"), "known_corpus": a.known is not None,
               **run(Path(path).resolve(), a.engine, a.budget, a.seed, a.known)}
        print(json.dumps(row), flush=True)
        res["rows"].append(row)
        OUT.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
