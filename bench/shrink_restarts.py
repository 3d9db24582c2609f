"""Engine restarts of the greedy shrinker, candidates in the plain order against grouped by start.

The greedy shrinker (fuzz/shrink.py) runs its candidates on one engine that swaps tables and
restarts for anything a swap cannot change (fuzz/run.py ``start_key``: vocabulary, EOS,
speculation settings, the draft's shape, the context length). In the plain candidate order a
pass whose reductions fail goes back and forth between starts; with ``start_key`` each pass
runs the candidates served by the running start first, then the others grouped by start.
A restart took 20-37 s on SGLang on the H200 (2026-12-04).

This counts, for random cases and a random failure condition per case (which features,
vocabulary size, K, EOS and output length the failure needs), the restarts a simulated engine
makes (consecutive candidates with different start keys), the candidates run and the final
case, in both orders. No engine runs: the failure is a predicate, so the numbers are exact
counts for the orders, not timings.

Two failure models: ``threshold`` (the failure needs at least ``v`` vocabulary tokens, any
of them) and ``tokens`` (it needs a set of tokens of the case, which its runs emit along with
some others, and non-zero tables: the greedy shrinker is told what the failing run emitted,
as a campaign tells it). ``--label`` names the run (e.g. the code it ran on: run this file
from a checkout of an older commit with ``--label before``); each label's numbers are kept
in the output file beside the others'.

    python bench/shrink_restarts.py [--cases 300] [--label after] [--out bench/results/shrink_restarts.json]
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import statistics
from itertools import combinations
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from specfuzz.case import Case
from specfuzz.fuzz.run import start_key
from specfuzz.fuzz.shrink import shrink
from specfuzz.oracle.params import SamplingParams
from specfuzz.oracle.speculative import SpecConfig


def random_case(rng: np.random.Generator) -> Case:
    V = int(rng.integers(3, 7))
    method = str(rng.choice(["draft_model", "ngram"]))
    K = int(rng.integers(1, 6))
    spec = SpecConfig(method, K, ngram_max=3) if method == "ngram" else SpecConfig(method, K)
    prompt = tuple(int(t) for t in rng.integers(0, V, int(rng.integers(1, 5))))
    eos = int(rng.integers(0, V)) if rng.random() < 0.5 else None
    params = SamplingParams(
        max_tokens=int(rng.integers(2, 5)),
        temperature=float(rng.choice([1.0, 0.7, 1.5])),
        top_k=int(rng.choice([-1, 2, 3])),
        top_p=float(rng.choice([1.0, 0.9])),
        presence_penalty=float(rng.choice([0.0, 0.5])),
        frequency_penalty=float(rng.choice([0.0, 0.5])),
        repetition_penalty=float(rng.choice([1.0, 1.5])),
    )
    table = (rng.integers(-8, 9, (V, V)) / 4).astype(np.float32)
    draft = (rng.integers(-8, 9, (V, V)) / 4).astype(np.float32) if method == "draft_model" else None
    return Case(table, prompt, params, eos_token_id=eos, spec=spec, draft_table=draft)


def failure_condition(case: Case, rng: np.random.Generator, vocabulary: bool = True):
    """A predicate: the failure needs at least ``v`` vocabulary tokens (unless not
    ``vocabulary``), K >= ``k``, the EOS if ``eos``, ``m`` output tokens, and each of ``need``
    sampling settings off its default."""
    defaults = SamplingParams()
    features = [f for f in ("temperature", "top_k", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty")
                if getattr(case.params, f) != getattr(defaults, f)]
    need = [f for f in features if rng.random() < 0.4]
    v = int(rng.integers(2, case.vocab_size + 1))
    k = int(rng.integers(1, case.spec.num_speculative_tokens + 1))
    eos = case.eos_token_id is not None and rng.random() < 0.5
    m = int(rng.integers(1, case.params.max_tokens + 1))
    if not vocabulary:
        v = 2

    def fails(c: Case) -> bool:
        return (c.vocab_size >= v and c.spec.num_speculative_tokens >= k and (c.eos_token_id is not None or not eos)
                and c.params.max_tokens >= m and all(getattr(c.params, f) != getattr(defaults, f) for f in need))
    return fails


def kept_tokens(case: Case, small: Case) -> list[int] | None:
    """Which of ``case``'s tokens ``small`` still has (its rows of the tables), or None when
    its tables are zeroed."""
    if not np.any(small.target_table):
        return None
    for keep in combinations(range(case.vocab_size), small.vocab_size):
        if np.array_equal(np.asarray(case.target_table)[np.ix_(keep, keep)], small.target_table):
            return list(keep)
    raise AssertionError("not a reduction of the case")


def token_condition(case: Case, rng: np.random.Generator):
    """``failure_condition`` with its vocabulary part replaced: the failure needs a random set
    of the case's tokens (which the tables tell apart: zeroed tables do not fail); its runs
    emit those and each other token with probability 0.3. Returns (fails, the tokens the
    failing run of ``case`` emitted)."""
    rest = failure_condition(case, rng, vocabulary=False)
    V = case.vocab_size
    need = {int(t) for t in rng.choice(V, int(rng.integers(1, V + 1)), replace=False)}
    emitted = need | {t for t in range(V) if rng.random() < 0.3}

    def fails(c: Case):
        left = kept_tokens(case, c)
        if left is None or not need <= set(left) or not rest(c):
            return None
        return SimpleNamespace(judgement=True, counts={tuple(left.index(t) for t in sorted(emitted) if t in left): 1})
    return fails, frozenset(emitted)


def run(case: Case, fails, grouped: bool, seen=None) -> dict:
    running = [start_key(case)]
    restarts = [0]

    def reproduces(c: Case):
        k = start_key(c)
        if k != running[0]:
            restarts[0] += 1
            running[0] = k
        got = fails(c)
        return (c if got is True else got) if got else None

    kw = {"seen": seen} if seen is not None and "seen" in inspect.signature(shrink).parameters else {}
    res = shrink(case, reproduces, budget_s=600, start_key=start_key if grouped else None, **kw)
    c = res.case
    return {"restarts": restarts[0], "candidates": res.tried, "kept": res.kept,
            "final": (c.vocab_size, c.spec.num_speculative_tokens, len(c.prompt), c.params.max_tokens, c.eos_token_id is None)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench/results/shrink_restarts.json"))
    ap.add_argument("--label", default="after", help="the name this run's numbers are kept under in --out")
    a = ap.parse_args(argv)
    models = {}
    for model in ("threshold", "tokens"):
        rng = np.random.default_rng(a.seed if model == "threshold" else a.seed + 1)
        rows = []
        for _ in range(a.cases):
            case = random_case(rng)
            if model == "threshold":
                fails, seen = failure_condition(case, rng), None
            else:
                fails, seen = token_condition(case, rng)
            if not fails(case):
                continue
            rows.append({"plain": run(case, fails, False, seen), "grouped": run(case, fails, True, seen)})

        def summary(order: str) -> dict:
            r = [x[order]["restarts"] for x in rows]
            c = [x[order]["candidates"] for x in rows]
            v = [x[order]["final"][0] for x in rows]
            return {"restarts_mean": round(statistics.mean(r), 2), "restarts_median": statistics.median(r),
                    "restarts_max": max(r), "candidates_mean": round(statistics.mean(c), 2),
                    "final_V_mean": round(statistics.mean(v), 2)}

        models[model] = {
            "cases": len(rows),
            "plain": summary("plain"),
            "grouped": summary("grouped"),
            "fewer_restarts": sum(x["grouped"]["restarts"] < x["plain"]["restarts"] for x in rows),
            "more_restarts": sum(x["grouped"]["restarts"] > x["plain"]["restarts"] for x in rows),
            "same_final_shape": sum(x["plain"]["final"] == x["grouped"]["final"] for x in rows),
        }
    old = json.loads(a.out.read_text()) if a.out.exists() else {}
    out = {
        "bench": __doc__.splitlines()[0],
        "note": "final shape: (V, K, prompt length, max_tokens, EOS dropped); both orders end at a case no single "
                "reduction shrinks further, not always the same one. threshold: the failure needs v tokens, any; "
                "tokens: it needs a set of the case's tokens, and the shrinker is told the tokens its run emitted",
        "runs": {**old.get("runs", {}), a.label: {"date": datetime.date.today().isoformat(), "seed": a.seed,
                                                   "models": models}},
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["runs"][a.label], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
