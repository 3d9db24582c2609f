"""Check that an engine's EAGLE / EAGLE-3 path drafts what specfuzz's heads say.

Greedy target, greedy drafts: the accepted count of every request is predicted from the
tables (:mod:`specfuzz.engines.headcheck`); the engine's counts must equal it and its
outputs must be the greedy path. Writes a JSON report; exit status 0 only when every head
case matched. Run: ``python3 bench/check_heads.py --engine sglang --dtype bfloat16
[--out bench/results/heads_sglang_h200.json]`` (vLLM: ``--engine vllm``, any dtype).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import click

from specfuzz.cli import parse_settings
from specfuzz.engines.headcheck import check_heads, head_cases

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", required=True, help="engine name (vllm, sglang) or module:Class")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--setting", action="append", default=[], metavar="KEY=JSON", help="engine setting (repeatable)")
    ap.add_argument("--case", action="append", choices=sorted(head_cases()), help="head case(s) (default: all)")
    ap.add_argument("--out", type=Path, help="results file (default: bench/results/heads_<engine>.json)")
    args = ap.parse_args(argv)
    try:
        settings = parse_settings(tuple(args.setting))  # the CLI's --engine-setting parser
    except click.BadParameter as exc:
        ap.error(f"--setting: {exc.message}")
    out = args.out or RESULTS / f"heads_{args.engine.replace(':', '_')}.json"
    with tempfile.TemporaryDirectory(prefix="specfuzz-heads-") as tmp:
        report = check_heads(args.engine, Path(tmp), dtype=args.dtype, settings=settings,
                             names=tuple(args.case) if args.case else None)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    for name, row in report["cases"].items():
        if "accepted_total" in row:
            print(f"{name}: {row['status']}: accepted {row['accepted_total']} predicted {row['predicted_accepted_total']} "
                  f"matches {row['accepted_matches']}/{row['with_stats']} wrong outputs {row['wrong_outputs']}/{row['requests']}")
        else:
            print(f"{name}: ok=False {row.get('crash') or row.get('error')}")
    print(f"wrote {out}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
