"""How often a correct engine makes a (false) candidate, per screening level.

The two-stage campaign screens every pattern at a fixed level α_s; on a correct engine
each crossing is a false candidate that costs a confirmation run and one step of the
confirmation sequence. Ville's inequality bounds the rate by α_s per pattern; the
e-process is conservative, so the real rate is lower. This bench measures it.

Families are drawn by the campaign's own strategy with the reference engine's
capabilities and the campaign defaults (V <= 5, 4 tokens, K <= 3, up to 3 patterns);
each pattern's test (``CaseTest`` with every catalogued bug law, as in the campaign) is
fed 1,000 samples of μ itself (what a correct engine samples) in the campaign's looks
(600/patterns samples per look), and the largest log e-value over the looks is kept:
the pattern is a candidate at level a iff that maximum reaches ln(1/a). The share of time
is the confirmation runs' cost (one pattern's test and 1,000 samples, measured here) over
the campaign's (every pattern's, measured here). Campaign time on a real engine also
holds engine starts and checkpoint writing, so the real share is smaller still.

Run: ``.venv/bin/python bench/bench_screening.py [--families 1500]``
(writes bench/results/screening.json).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, Phase, given, seed, settings

from specfuzz.engines.reference_engine import ReferenceEngine
from specfuzz.errors import AmbiguousSemantics
from specfuzz.oracle.budget import SCREEN_ALPHA
from specfuzz.oracle.judge import CaseTest
from specfuzz.oracle.law import OutputSpaceTooLarge
from specfuzz.strategies import case_families

LEVELS = (0.3, 0.1, 0.03, 0.01, 3e-3, 1e-3, 3e-4, 1e-4)
SAMPLES = 1000  # --samples
BATCH = 600  # --batch: one look per pattern every BATCH // patterns samples


def _upper95(k: int, n: int) -> float:
    """One-sided 95% upper confidence bound of a binomial rate (Clopper-Pearson)."""
    from scipy.stats import beta

    return 1.0 if k >= n else float(beta.ppf(0.95, k + 1, n - k))


def run(families: int, seed_: int) -> dict:
    caps = ReferenceEngine().capabilities()
    strategy = case_families(max_patterns=3, max_vocab=5, max_tokens=4, max_k=3, methods=caps.methods,
                             sampling=caps.sampling, draft_vocab=caps.draft_vocab, speculation=True)
    rng = np.random.default_rng(seed_)
    rows: list[dict] = []  # one per pattern
    fams: list[list[int]] = []
    t_start = time.perf_counter()

    @seed(seed_)
    @settings(max_examples=families * 3, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def draw(cases) -> None:
        if len(fams) >= families:
            return
        tests = []
        try:
            for c in cases:
                t0 = time.perf_counter()
                ct = CaseTest(c, alpha=0.5)
                if ct.mu is None:
                    return  # μ too large to enumerate: not sampled here
                tests.append((ct, time.perf_counter() - t0))
        except (AmbiguousSemantics, OutputSpaceTooLarge):
            return  # the campaign rejects these too
        idx = []
        per_look = max(1, BATCH // len(cases))
        for ct, t_build in tests:
            t0 = time.perf_counter()
            outs = list(ct.mu)
            p = np.fromiter((ct.mu[o] for o in outs), dtype=np.float64, count=len(outs))  # [M]
            p = p / p.sum()
            best, n = -math.inf, 0
            while n < SAMPLES:
                b = min(per_look, SAMPLES - n)
                ct.update([outs[k] for k in rng.choice(len(outs), size=b, p=p)])
                n += b
                best = max(best, ct.test.log_e)
            idx.append(len(rows))
            rows.append({"max_log_e": best, "seconds": t_build + time.perf_counter() - t0,
                         "method": ct.case.spec.method if ct.case.spec else "off"})
        fams.append(idx)

    draw()
    elapsed = time.perf_counter() - t_start
    n_pat, n_fam = len(rows), len(fams)
    sup = np.array([r["max_log_e"] for r in rows])  # [patterns]
    secs = np.array([r["seconds"] for r in rows])  # [patterns]
    per_level = []
    for a in LEVELS:
        hit = sup >= math.log(1 / a)  # [patterns]
        k = int(hit.sum())
        fam_hits = sum(int(any(hit[i] for i in idx)) for idx in fams)
        per_level.append({
            "screen_alpha": a, "false_candidates": k, "patterns": n_pat,
            "per_pattern": k / n_pat, "per_pattern_upper95": _upper95(k, n_pat),
            "per_family": k / n_fam, "families_with_one": fam_hits,
            "ratio_to_ville_bound": (k / n_pat) / a,
            # each false candidate re-runs one pattern (mean pattern cost) on top of the campaign's time
            "time_share": k * float(secs.mean()) / float(secs.sum()),
            "time_share_upper95": _upper95(k, n_pat) * n_pat * float(secs.mean()) / float(secs.sum()),
        })
    chosen = next(r for r in per_level if r["screen_alpha"] == SCREEN_ALPHA)
    chosen = dict(chosen, per_family_upper95=chosen["per_pattern_upper95"] * n_pat / n_fam)
    return {
        "families": n_fam, "patterns": n_pat, "seconds": elapsed, "mean_pattern_seconds": float(secs.mean()),
        "max_log_e_quantiles": {q: float(np.quantile(sup, q)) for q in (0.5, 0.9, 0.99, 0.999)},
        "max_log_e_max": float(sup.max()),
        "levels": per_level, "chosen": chosen,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=16)
    args = ap.parse_args()
    res = run(args.families, args.seed)
    print(f"{res['families']} families, {res['patterns']} patterns in {res['seconds']:.0f} s; "
          f"max log e quantiles {res['max_log_e_quantiles']}, max {res['max_log_e_max']:.2f}")
    print(f"{'α_s':>8} {'false':>6} {'per pattern':>12} {'(95% ub)':>9} {'/ α_s':>7} {'time share':>11} {'(95% ub)':>9}")
    for r in res["levels"]:
        print(f"{r['screen_alpha']:8g} {r['false_candidates']:6d} {r['per_pattern']:12.2e} {r['per_pattern_upper95']:9.2e}"
              f" {r['ratio_to_ville_bound']:7.3f} {r['time_share']:11.3%} {r['time_share_upper95']:9.3%}")
    out = Path(__file__).parent / "results" / "screening.json"
    meta = {"python": sys.version.split()[0], "numpy": np.__version__, "machine": platform.machine(),
            "date": time.strftime("%Y-%m-%d"), "screen_alpha": SCREEN_ALPHA, "seed": args.seed}
    out.write_text(json.dumps({"meta": meta, **res}, indent=2) + "\n")
    c = res["chosen"]
    print(f"chosen α_s={SCREEN_ALPHA:g}: {c['per_family']:.2e} false candidates per family "
          f"(95% upper bound {c['per_family_upper95']:.2e}); written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
