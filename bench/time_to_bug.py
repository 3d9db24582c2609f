"""Time-to-bug: how long a fresh campaign takes to store a given bug (as Magma and FuzzBench measure fuzzers).

Two benches, each writing a JSON file under bench/results/ that docs/benchmarks.md quotes:

``mutants`` — the reference engine with each bug injected: the catalogue N1-N7 and the mutants
M01-M16 of :mod:`specfuzz.oracle.mutants` (each acting in one speculation event), and the
lossless controls L1, L2 plus the uninjected engine (which must store nothing). For each, and
each seed, ``specfuzz fuzz --engine reference --inject X --budget B --seed S --max-findings 1``
runs on a fresh corpus; the time to bug is the time from the command's start to the mtime
of the first entry it stored (shrinking and calibration included). Reported: per bug the
median over seeds (a run that stored nothing counts as the budget, "not found"), and the
event the mutant acts in. Steering on (default) or off (``--no-steer``), side by side.

``engines`` — a real engine (vllm, hf) from a fresh corpus: for every known bug stored for
that engine in the tracked corpus (``corpus/*.json``: findings and crashes), the time until
the campaign met it again: an entry it stored whose triage key (method, symptom, sampling
features; crashes: their cause) is the known entry's. Steered and unsteered campaigns run one
after the other in the same invocation (same machine, same load).

Run:
  .venv/bin/python bench/time_to_bug.py mutants [--seeds 3] [--budget 150] [--only M01,N4] [--steer both]
  .venv/bin/python bench/time_to_bug.py engines --engine vllm --budget 900 [--steer both]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def _campaign(args: list[str], corpus: Path, budget_s: float, steer: bool, seed: int) -> dict:
    """One fresh campaign: seconds to its first stored entry (None: none), and its totals."""
    work = corpus.parent / "work"
    cmd = [sys.executable, "-m", "specfuzz", "fuzz", *args, "--budget", f"{budget_s:.0f}s", "--seed", str(seed),
           "--corpus", str(corpus), "--work-dir", str(work), "--quiet", "--max-findings", "1"]
    cmd += [] if steer else ["--no-steer"]
    t0 = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=budget_s + 900, cwd=ROOT)
    wall = time.time() - t0
    stored = sorted((p.stat().st_mtime - t0, p.name) for p in corpus.glob("*.json"))
    state = corpus / ".specfuzz" / "state.json"
    totals = json.loads(state.read_text()).get("totals", {}) if state.exists() else {}
    cov = totals.get("coverage", {}).get("methods", {})
    return {
        "exit": done.returncode, "wall_s": round(wall, 1),
        "time_to_bug_s": round(stored[0][0], 1) if stored else None,
        "stored": [n for _, n in stored],
        "families": totals.get("engine", {}).get("families"),
        "multi_position_families": sum(m.get("multi_events", 0) for m in cov.values()),
        "stderr_tail": done.stderr[-400:] if done.returncode not in (0, 1) else "",
    }


def _median(times: list[float | None], budget_s: float) -> float | None:
    """Median time over runs, a run that found nothing counting as past the budget (None if
    the median run found nothing)."""
    vals = sorted(float("inf") if t is None else t for t in times)
    m = statistics.median(vals)
    return None if m == float("inf") or m > budget_s * 10 else round(m, 1)


def _save_rows(out: Path, res: dict) -> None:
    """Write ``res`` to ``out``, keeping the rows of other (bug, steering) pairs already there:
    a bench split over several processes, or killed, keeps every row it finished."""
    if out.exists():
        old = json.loads(out.read_text())
        done = {(r["bug"], r["steer"]) for r in res["rows"]}
        res = {**res, "rows": [r for r in old.get("rows", []) if (r["bug"], r["steer"]) not in done] + res["rows"]}
    out.write_text(json.dumps(res, indent=1) + "\n")


def bench_mutants(seeds: int, budget_s: float, only: list[str] | None, steer_modes: list[bool], out: Path) -> dict:
    from specfuzz.oracle.mutants import CONTROLS, MUTANTS
    from specfuzz.oracle.speculative import BUG_CLASSES

    targets = [*sorted(BUG_CLASSES), *sorted(MUTANTS), *sorted(CONTROLS), "none"]
    if only:
        targets = [t for t in targets if t in only]
    rows = []
    for bug in targets:
        for steer in steer_modes:
            runs = []
            for s in range(1, seeds + 1):
                with tempfile.TemporaryDirectory() as tmp:
                    args = ["--engine", "reference"] + ([] if bug == "none" else ["--inject", bug])
                    r = _campaign(args, Path(tmp) / "corpus", budget_s, steer, s)
                runs.append(r)
                print(f"{bug} steer={steer} seed={s}: {r['time_to_bug_s']} s, {r['families']} families", flush=True)
            lossless = bug == "none" or bug in CONTROLS
            rows.append({
                "bug": bug,
                "kind": "control" if lossless else "catalogue" if bug in BUG_CLASSES else "mutant",
                "event": MUTANTS[bug][0] if bug in MUTANTS else None,
                "what": (MUTANTS.get(bug) or (None, BUG_CLASSES.get(bug, (None, CONTROLS.get(bug, "no injection")))[1]))[1],
                "steer": steer,
                "median_s": None if lossless else _median([r["time_to_bug_s"] for r in runs], budget_s),
                "found": sum(r["time_to_bug_s"] is not None for r in runs),
                "runs": runs,
            })
            _save_rows(out, {**_header(budget_s, seeds), "rows": rows[-1:]})
    return {**_header(budget_s, seeds), "rows": rows}


def _header(budget_s: float, seeds: int) -> dict:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent).stdout.strip() or None
    return {"bench": "time_to_bug_mutants", "budget_s": budget_s, "seeds": seeds, "date": time.strftime("%Y-%m-%d"),
            "commit": commit,
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}}


def _known_keys(engine_name: str, corpus: Path | None = None, cpu: bool = True) -> dict[str, tuple]:
    """Stored entries of an engine (CPU ones of the tracked corpus by default): path -> the key
    a fresh campaign's entry must share."""
    from specfuzz.fuzz.corpus import Corpus, Entry

    out = {}
    for path, e in Corpus(corpus or ROOT / "corpus").entries():
        if (isinstance(e, Entry) and e.engine.get("name") == engine_name and e.kind in ("finding", "crash", "calibration")
                and (not cpu or str(e.engine.get("device", "")).startswith("cpu"))):
            out[path.name] = _key(e)
    return out


def match_fresh(engine_name: str, fresh: Path, known_corpus: Path, t0: float) -> dict:
    """Known entries of ``known_corpus`` met again by the fresh campaign corpus ``fresh`` started
    at ``t0`` (epoch seconds): entry -> seconds from t0 to the first fresh entry sharing its key."""
    from specfuzz.fuzz.corpus import Corpus, Entry

    known = _known_keys(engine_name, known_corpus, cpu=False)
    met: dict[str, float] = {}
    for path, e in Corpus(fresh).entries():
        if isinstance(e, Entry):
            k, t = _key(e), path.stat().st_mtime - t0
            for name, kk in known.items():
                if kk == k:
                    met[name] = round(min(met.get(name, t), t), 1)
    return {"known": {k: list(v) for k, v in known.items()}, "time_to_known_s": {k: met.get(k) for k in known},
            "fresh_entries": sorted(p.name for p in Path(fresh).glob("*.json"))}


def _key(e) -> tuple:
    """What makes two entries the same bug for this bench: crashes by their cause; findings by
    method, symptom and sampling features (triage's 'likely one bug' key)."""
    from specfuzz.fuzz.campaign import entry_crash_key
    from specfuzz.fuzz.corpus import active_features
    from specfuzz.fuzz.triage import profile_for, symptom

    spec = e.case.get("spec") or {}
    if e.kind == "crash":
        return ("crash", entry_crash_key(e))
    return (e.kind, spec.get("method"), symptom(e.case, e.counts, profile_for(e)), tuple(sorted(active_features(e.case))))


def bench_engine(engine: str, budget_s: float, steer_modes: list[bool], seed: int, keep: Path | None = None) -> dict:
    from specfuzz.fuzz.corpus import Corpus, Entry

    name = {"vllm": "vllm", "hf": "hf-transformers"}[engine]
    known = _known_keys(name)
    rows = []
    for steer in steer_modes:
        with tempfile.TemporaryDirectory() as tmp:
            corpus = Path(tmp) / "corpus"
            t0 = time.time()
            cmd = [sys.executable, "-m", "specfuzz", "fuzz", "--engine", engine, "--budget", f"{budget_s:.0f}s",
                   "--seed", str(seed), "--corpus", str(corpus), "--work-dir", str(Path(tmp) / "work"), "--quiet"]
            cmd += [] if steer else ["--no-steer"]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=budget_s + 1800, cwd=ROOT)
            met: dict[str, float] = {}
            new: list[str] = []
            for path, e in Corpus(corpus).entries():
                if not isinstance(e, Entry):
                    continue
                k, t = _key(e), path.stat().st_mtime - t0
                for known_name, kk in known.items():
                    if kk == k:
                        met[known_name] = round(min(met.get(known_name, t), t), 1)
                if k not in known.values() and keep is not None:
                    # an entry of no known bug: kept for triage (the campaign's corpus is a temporary folder)
                    dest = keep / f"{engine}-{'steered' if steer else 'unsteered'}-seed{seed}"
                    dest.mkdir(parents=True, exist_ok=True)
                    shutil.copy(path, dest / path.name)
                    new.append(str(dest / path.name))
            state = json.loads((corpus / ".specfuzz" / "state.json").read_text()).get("totals", {})
            cov = state.get("coverage", {}).get("methods", {})
            rows.append({
                "steer": steer, "exit": done.returncode, "wall_s": round(time.time() - t0, 1),
                "families": state.get("engine", {}).get("families"),
                "multi_position_families": sum(m.get("multi_events", 0) for m in cov.values()),
                "k_ge_2_families": sum(m.get("multi_config", 0) for m in cov.values()),
                "methods": {m: r.get("families") for m, r in state.get("methods", {}).items()},
                "stored": sorted(p.name for p in corpus.glob("*.json")),
                "time_to_known_s": {k: met.get(k) for k in known},
                "unknown_kept": new,
            })
            print(f"{engine} steer={steer}: {rows[-1]['time_to_known_s']}", flush=True)
    return {"bench": "time_to_bug_engines", "engine": engine, "budget_s": budget_s, "seed": seed,
            "known": {k: list(v) for k, v in known.items()}, "rows": rows}


def markdown(res: dict) -> str:
    """The benchmarks page's table of a ``mutants`` result: per bug, the event it acts in, the
    median time to stored over seeds, the times of each seed, families run."""
    rows = ["| bug | acts in | steering | median (s) | per seed (s) | families per run |", "|---|---|---|---|---|---|"]
    for r in res["rows"]:
        times = ", ".join("—" if x["time_to_bug_s"] is None else f"{x['time_to_bug_s']:.0f}" for x in r["runs"])
        fams = ", ".join(str(x["families"]) for x in r["runs"])
        med = "stores nothing" if r["kind"] == "control" and not r["found"] else (
            "—" if r["median_s"] is None else f"{r['median_s']:.0f}")
        if r["kind"] == "control" and r["found"]:
            med = f"**stored {r['found']}**"
        event = r["event"] or {"N1": "coin_reused", "N2": "lag:min_tokens", "N3": "lag:thinking", "N4": "tree_unfilled",
                               "N5": "outside_draft", "N6": "short_draft", "N7": "narrow_lag"}.get(r["bug"], "—")
        rows.append(f"| {r['bug']} | `{event}` | {'on' if r['steer'] else 'off'} | {med} | {times} | {fams} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    m = sub.add_parser("mutants")
    m.add_argument("--seeds", type=int, default=3)
    m.add_argument("--budget", type=float, default=150.0)
    m.add_argument("--only", default=None, help="comma-separated bug ids (N1, M05, L1, none)")
    m.add_argument("--steer", choices=("on", "off", "both"), default="on")
    m.add_argument("--out", default=str(RESULTS / "time_to_bug_mutants.json"))
    t = sub.add_parser("table", help="print the Markdown table of a mutants result file")
    t.add_argument("path", nargs="?", default=str(RESULTS / "time_to_bug_mutants.json"))
    g = sub.add_parser("match", help="time to each known bug of a fresh campaign run elsewhere (the GPU machine)")
    g.add_argument("--engine-name", required=True, help="the engine's version record name: vllm, sglang")
    g.add_argument("--fresh", required=True, help="the fresh campaign's corpus folder (file mtimes kept)")
    g.add_argument("--t0", required=True, type=float, help="its start, epoch seconds")
    g.add_argument("--known", required=True, help="the tracked corpus of that engine, e.g. corpus/h200/sglang")
    g.add_argument("--label", default="")
    g.add_argument("--out", required=True)
    e = sub.add_parser("engines")
    e.add_argument("--engine", choices=("vllm", "hf"), required=True)
    e.add_argument("--budget", type=float, default=900.0)
    e.add_argument("--seed", type=int, default=1)
    e.add_argument("--steer", choices=("on", "off", "both"), default="both")
    e.add_argument("--out", default=None)
    e.add_argument("--keep", default="/tmp/specfuzz-time-to-bug",
                   help="where entries of no known bug are copied for triage (the campaigns' corpora are temporary)")
    a = ap.parse_args()
    t0 = time.time()
    if a.what == "table":
        print(markdown(json.loads(Path(a.path).read_text())))
        return
    if a.what == "match":
        out = Path(a.out)
        res = json.loads(out.read_text()) if out.exists() else {"bench": "time_to_bug_gpu", "rows": []}
        res["rows"].append({"label": a.label, "engine": a.engine_name, **match_fresh(a.engine_name, Path(a.fresh), Path(a.known), a.t0)})
        out.write_text(json.dumps(res, indent=1) + "\n")
        print(f"wrote {out}")
        return
    modes = {"on": [True], "off": [False], "both": [True, False]}[a.steer]
    if a.what == "mutants":
        # Rows are written as they finish, beside those of other bugs already in the file.
        bench_mutants(a.seeds, a.budget, a.only.split(",") if a.only else None, modes, Path(a.out))
        print(f"wrote {a.out}")
        return
    res = bench_engine(a.engine, a.budget, modes, a.seed, Path(a.keep))
    out = Path(a.out or RESULTS / f"time_to_bug_engines_{a.engine}.json")
    res["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}
    res["seconds"] = round(time.time() - t0, 1)
    res["date"] = time.strftime("%Y-%m-%d")
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
