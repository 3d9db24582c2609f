"""Campaign benchmark on the reference engine: time to first finding per injected class,
and a long campaign against the correct engine (which must store nothing).

For each class N1-N7 a campaign with ``--inject N`` runs for up to ``--budget`` (default
5 minutes, the acceptance bar) and stops at the first stored entry attributed to N;
the time, the cases and samples it took, and the shrunk case's size are recorded. Then
the correct engine runs for ``--clean-budget`` (default 10 minutes): cases per minute,
samples per second, and the number of entries stored (must be 0).

Run: ``.venv/bin/python bench/bench_campaign.py [--budget 300] [--clean-budget 600]``
(writes bench/results/campaign.json).
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

from specfuzz.fuzz.campaign import Campaign, CampaignConfig
from specfuzz.fuzz.corpus import Corpus, Entry
from specfuzz.oracle.speculative import BUG_CLASSES


def _run(budget: float, inject: str | None, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        first: dict = {}
        t0 = time.monotonic()

        def on_event(msg: str, stats) -> None:
            if msg.startswith("stored") and inject and f"({inject})" in msg and not first:
                first.update(seconds=time.monotonic() - t0, cases=stats.cases, samples=stats.samples)
                campaign.deadline = time.monotonic()  # stop: found

        cfg = CampaignConfig(engine_kwargs={"inject": inject} if inject else {}, budget_s=budget,
                             corpus_dir=tmp / "corpus", work_dir=tmp / "work", seed=seed)
        campaign = Campaign(cfg, on_event=on_event)
        stats = campaign.run()
        elapsed = time.monotonic() - t0
        entries = [e for _, e in Corpus(cfg.corpus_dir).entries() if isinstance(e, Entry)]
        row = {
            "inject": inject, "budget_s": budget, "elapsed_s": elapsed, "cases": stats.cases,
            "patterns": stats.patterns, "samples": stats.samples, "engine_starts": stats.engine_starts,
            "cases_per_minute": stats.cases / elapsed * 60, "samples_per_second": stats.samples / elapsed,
            "stored": [{"kind": e.kind, "label": e.label, "method": (e.case.get("spec") or {}).get("method"),
                        "vocab": len(e.case["target_table"]), "max_tokens": e.case["params"]["max_tokens"],
                        "K": (e.case.get("spec") or {}).get("num_speculative_tokens")} for e in entries],
        }
        if inject:
            row["time_to_first_finding_s"] = first.get("seconds")
            row["found"] = bool(first)
        return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=300)
    ap.add_argument("--clean-budget", type=float, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args()
    rows = []
    for bug in args.only or sorted(BUG_CLASSES):
        r = _run(args.budget, bug, args.seed)
        rows.append(r)
        print(f"{bug}: found={r['found']} in {r['time_to_first_finding_s']}s; stored {r['stored']}", flush=True)
    clean = _run(args.clean_budget, None, args.seed) if args.clean_budget > 0 else None
    if clean:
        print(f"correct engine: {clean['cases']} cases in {clean['elapsed_s']:.0f}s "
              f"({clean['cases_per_minute']:.0f}/min, {clean['samples_per_second']:.0f} samples/s); stored {len(clean['stored'])}")
    out = Path(__file__).parent / "results" / "campaign.json"
    out.parent.mkdir(exist_ok=True)
    meta = {"python": platform.python_version(), "machine": platform.machine(), "date": time.strftime("%Y-%m-%d"),
            "note": "2-core CPU machine; other jobs may have shared it"}
    out.write_text(json.dumps({"meta": meta, "injected": rows, "correct": clean}, indent=2) + "\n")
    ok = all(r["found"] for r in rows) and (clean is None or not clean["stored"])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
