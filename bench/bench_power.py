"""Samples a campaign needs to store a finding, as a function of the family index.

Why: a campaign that spends its false-alarm budget α family by family tests family i at
α_i = α/(i(i+1)), so the samples a test needs, about ln(1/α_i)/KL, grow with i: the
longer a campaign runs, the less it can see. The two-stage campaign screens every
family at a fixed level and spends α only per confirmation (issue 16). This bench
measures both on the same bug laws.

What is measured. For each variant (N1-N7 from the catalogue, and three small-effect
variants with KL(μD‖μ) between 1e-3 and 1e-2), i.i.d. samples of the bug law μD (the
exact law of the reference sampler with the bug injected, sampled directly: the same
distribution as the Monte Carlo driver, much faster) are fed to the case's
anytime-valid test (``CaseTest``: universal part plus every catalogued bug law), which
is consulted after every batch (batches grow by 2%, so crossing times are exact to
2%); the first sample count at which ``log e >= ln(1/a)`` is recorded for every level a
the campaign uses. A stored finding needs a screening crossing and then a confirmation
crossing on fresh samples, so the expected samples to a stored finding is
``E[T(screen level)] + E[T(confirmation level)]``.

Levels per family index i (1, 100, 1000, 10000, 30000), taken from the code under test:

* per-family scheme (the code before issue 16): screening at ``AlphaSpender(α).peek()``
  after i-1 families, confirmation at ``CONFIRM_FACTOR`` x the next α (one spender step
  per family, the issue's reading; the old campaign stepped per pattern, which is worse);
* two-stage scheme (after): screening at the fixed level, confirmation at α_j where j-1
  is the number of confirmations before family i on a correct engine (every one a false
  candidate): ``measured`` uses the false-candidate rate per family measured on a correct
  engine (``--observed`` from a campaign's summary, or ``bench/bench_screening.py``),
  ``95% upper bound`` that rate's upper confidence bound,
  and ``worst case`` charges every pattern (3 per family) the full screening level α_s
  (Ville's bound, which the e-process is far from reaching).

Output: ``bench/results/power_<scheme>.json`` and a table. Run on the old code to get the
"before" file: ``git stash; .venv/bin/python bench/bench_power.py``.

Run: ``.venv/bin/python bench/bench_power.py [--seeds 40] [--small-seeds 20]``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from specfuzz.case import Case
from specfuzz.oracle.catalogue import catalogue
from specfuzz.oracle.judge import CaseTest
from specfuzz.oracle.params import SamplingParams
from specfuzz.oracle.speculative import ExactDriver, SpecConfig
from specfuzz.oracle.stats import kl_divergence

ALPHA = 1e-3  # the campaign default (--alpha)
FAMILY_INDICES = (1, 100, 1_000, 10_000, 30_000)
MAX_SAMPLES = 200_000  # per stage; a crossing later than this is recorded as this (censored)
CAMPAIGN_CAP = 1000  # --samples: per pattern and per stage in a campaign
PATTERNS_WORST = 3  # --patterns default: the most request patterns per family
BATCH_GROWTH = 0.02

try:  # the two-stage scheme (issue 16)
    from specfuzz.oracle.budget import SCREEN_ALPHA, ConfirmationBudget

    SCHEME = "two-stage"
except ImportError:  # the per-family scheme before it
    from specfuzz.fuzz.campaign import CONFIRM_FACTOR
    from specfuzz.oracle.stats import AlphaSpender

    SCHEME = "per-family"


def levels(index: int, false_rate_per_family: float) -> dict[str, float]:
    """The screening and confirmation levels the code under test gives family ``index``."""
    if SCHEME == "per-family":
        screen = AlphaSpender(ALPHA, count=index - 1).peek()
        confirm = AlphaSpender(ALPHA, count=index).peek() * CONFIRM_FACTOR
        return {"screen": screen, "confirm": confirm, "confirmation_index": None}
    j = 1 + math.floor(false_rate_per_family * (index - 1))
    return {"screen": SCREEN_ALPHA, "confirm": ConfirmationBudget(ALPHA).alpha_of(j), "confirmation_index": j}


# ------------------------------------------------------------------ variants


def _small_variants() -> dict[str, tuple[Case, str]]:
    """Three bugs of small effect: two catalogued classes on tables that hide them, and an
    uncatalogued perturbation of μ (the temperature off by a little)."""
    n1 = Case(np.zeros((2, 2)), (0,), SamplingParams(max_tokens=3), eos_token_id=None,
              spec=SpecConfig("draft_model", 3, verify="block", inject="N1"),
              draft_table=np.array([[0.0, 0.0], [0.0, -0.5]]))  # [V, V_draft]: q(.|b) = (0.62, 0.38)
    eos = np.array([[0, 0, 0, -2.0]] * 3 + [[0, 0, 0, 0]], dtype=float)  # [4, 4]: EOS unlikely
    n2 = Case(eos, (0,), SamplingParams(max_tokens=4, min_tokens=2), eos_token_id=3,
              spec=SpecConfig("draft_model", 2, inject="N2"),
              draft_table=np.array([[0, 0, 0, 2.0]] * 3 + [[0, 0, 0, 0]], dtype=float))
    table = np.array([[0.0, 0.5, -0.5, 1.0], [1.0, 0.0, 0.5, -1.0], [0.0, 0.0, 0.0, 0.0], [-1.0, 0.5, 1.0, 0.0]])  # [4, 4]
    temp = Case(table, (0,), SamplingParams(max_tokens=3), eos_token_id=None,
                spec=SpecConfig("draft_model", 2), draft_table=np.zeros((4, 4)))
    return {
        "N1-small": (n1, "N1 with a drafter close to the flat target: q(.|b) = (0.62, 0.38)"),
        "N2-small": (n2, "N2 with an unlikely EOS (logit -2 against 0)"),
        "T-small": (temp, "uncatalogued: the engine samples at temperature 1.15 instead of 1 (universal test only)"),
    }


TEMPERATURE_BUG = 1.15


def variants() -> dict[str, tuple[Case, dict, str]]:
    """name -> (case, μD over complete outputs, note)."""
    out = {}
    for bug, e in sorted(catalogue().items()):
        out[bug] = (e.case, ExactDriver(e.case.process()).law(), e.note)
    for name, (case, note) in _small_variants().items():
        if name == "T-small":
            bugged = case.with_(params=replace(case.params, temperature=TEMPERATURE_BUG))
            law = bugged.target_law().enumerate().as_dict()
        else:
            law = ExactDriver(case.process()).law()
        out[name] = (case, law, note)
    return out


# ------------------------------------------------------------------ crossing times


def crossing_times(case: Case, law: dict, thresholds: list[float], seed: int) -> list[int]:
    """Samples until ``log e >= L`` for each threshold L (ascending), one stream of μD."""
    outs = list(law)
    p = np.fromiter((law[o] for o in outs), dtype=np.float64, count=len(outs))  # [M]
    p = p / p.sum()
    rng = np.random.default_rng(20_000 + seed)
    ct = CaseTest(case, alpha=ALPHA)
    times: list[int] = []
    n = 0
    while len(times) < len(thresholds) and n < MAX_SAMPLES:
        b = min(max(1, int(n * BATCH_GROWTH)), MAX_SAMPLES - n)
        ct.update([outs[k] for k in rng.choice(len(outs), size=b, p=p)])
        n += b
        log_e = ct.test.log_e
        while len(times) < len(thresholds) and log_e >= thresholds[len(times)]:
            times.append(n)
    return times + [MAX_SAMPLES] * (len(thresholds) - len(times))


def run_variant(name: str, case: Case, law: dict, note: str, seeds: int, rates: dict[str, float]) -> dict:
    t0 = time.perf_counter()
    mu = case.target_law().enumerate().as_dict()
    kl = kl_divergence(law, mu)
    plan = {model: {i: levels(i, rate) for i in FAMILY_INDICES} for model, rate in rates.items()}
    needed = sorted({math.log(1 / lv[k]) for per in plan.values() for lv in per.values() for k in ("screen", "confirm")})
    times = np.array([crossing_times(case, law, needed, s) for s in range(seeds)])  # [seeds, L]
    col = {L: times[:, k] for k, L in enumerate(needed)}
    rows = {}
    for model, per in plan.items():
        rows[model] = []
        for i, lv in per.items():
            ts, tc = col[math.log(1 / lv["screen"])], col[math.log(1 / lv["confirm"])]
            rows[model].append({
                "family_index": i, "screen_alpha": lv["screen"], "confirm_alpha": lv["confirm"],
                "confirmation_index": lv["confirmation_index"],
                "screen_samples": float(ts.mean()), "confirm_samples": float(tc.mean()),
                "samples": float(ts.mean() + tc.mean()),
                "censored": int(np.sum(ts >= MAX_SAMPLES) + np.sum(tc >= MAX_SAMPLES)),
                # both stages within the campaign's per-pattern cap (independent stages)
                "found_within_cap": float(np.mean(ts <= CAMPAIGN_CAP) * np.mean(tc <= CAMPAIGN_CAP)),
            })
        first, last = rows[model][0]["samples"], rows[model][-1]["samples"]
        rows[model].append({"ratio_last_to_first": last / first})
    return {"variant": name, "note": note, "kl": kl, "seeds": seeds, "models": rows,
            "seconds": time.perf_counter() - t0}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--small-seeds", type=int, default=20)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--observed", nargs=3, type=int, metavar=("CANDIDATES", "PATTERNS", "FAMILIES"), default=None,
                    help="false candidates seen on a correct engine in so many patterns and families (a campaign's "
                         "summary); default: bench/results/screening.json")
    args = ap.parse_args()
    if SCHEME == "per-family":
        rates = {"per-family": 0.0}
    else:  # false candidates per family on a correct engine
        if args.observed:
            k, n_pat, n_fam = args.observed
            from scipy.stats import beta

            ub = 1.0 if k >= n_pat else float(beta.ppf(0.95, k + 1, n_pat - k))  # per pattern
            measured, upper = k / n_fam, ub * n_pat / n_fam
        else:
            chosen = json.loads((Path(__file__).parent / "results" / "screening.json").read_text())["chosen"]
            measured, upper = chosen["per_family"], chosen["per_family_upper95"]
        rates = {"measured": measured, "95% upper bound": upper, "worst case": PATTERNS_WORST * SCREEN_ALPHA}
    results = []
    for name, (case, law, note) in variants().items():
        if args.only and name not in args.only:
            continue
        seeds = args.small_seeds if name.endswith("-small") else args.seeds
        r = run_variant(name, case, law, note, seeds, rates)
        results.append(r)
        for model, rows in r["models"].items():
            cells = " ".join(f"{row['samples']:9.1f}" for row in rows[:-1])
            print(f"{name:9} KL {r['kl']:.2e} {model:15} {cells}  x{rows[-1]['ratio_last_to_first']:.2f}", flush=True)
    out = Path(__file__).parent / "results" / f"power_{SCHEME}.json"
    meta = {"python": sys.version.split()[0], "numpy": np.__version__, "machine": platform.machine(),
            "date": time.strftime("%Y-%m-%d"), "scheme": SCHEME, "alpha": ALPHA, "family_indices": list(FAMILY_INDICES),
            "false_candidates_per_family": rates, "observed": args.observed}
    out.write_text(json.dumps({"meta": meta, "variants": results}, indent=2) + "\n")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
