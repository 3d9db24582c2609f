"""Where an SGLang engine's sampling time goes, and which adapter settings change it.

A campaign family is ~2,900 samples, and SGLang 0.5.17 samples a campaign's batches at
~450-700 samples/s per engine (H100/H200, 2026-12-06): 5-7 s per family, the ceiling of
families per minute. This bench starts one engine per *variant* (adapter settings), each in
its own process under a timeout (one started SGLang engine per process), and times
campaign-like batches on it: ``--requests`` requests (default 3000) over six request
patterns (plain; temperature 0.7 with top-k 3; top-p 0.8; repetition penalty 1.3; min-p
0.1 with a frequency penalty; a 40-token prompt), 4 tokens each, a V=6 table, NGRAM K=8
(what the tracked campaign drew most) or ``--mode``. Per variant: start, warm-up (the
sampler paths SGLang compiles on first use), then ``--calls`` timed generate calls;
samples/s is the best call.

``--pyspy`` runs the first variant under ``py-spy record --subprocesses`` (py-spy 0.4.2, a
wheel carried in ``.ship_sf``): ``--profile-out`` gets py-spy's raw collapsed stacks and a
summary of the scheduler process's and the engine host's busiest functions while they
sample (stacks of SGLang's scheduler event loop and of ``generate``), self and inclusive.
On an H100 (2026-12-06) that run did not finish within the variant's 240 s and wrote no
profile (the variant was then run again without py-spy): leave ``--pyspy`` off until that
is understood.

Results (H100, 2026-12-06, ``bench/results/profile_sglang.json``): adapter defaults 1,742
samples/s, ``max_running_requests`` 4096 1,392/s, CUDA graphs 1,338/s (best of 4 calls; the
calls of one engine varied 1.7-7.1 s for the same 3000 requests): neither setting helps, and
one engine alone samples 2-3x faster than a campaign's workers did on the same machine.

Needs CUDA and SGLang. Run: ``python3 bench/profile_sglang.py [--variant NAME=JSON ...]
[--mode ngram-K8] [--requests 3000] [--calls 4] [--pyspy] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
V, EOS = 6, 5
DTYPE = "bfloat16"
MAX_TOKENS = 4
DEFAULT_VARIANTS = {
    "adapter defaults": {},
    "4096 running": {"max_running_requests": 4096, "max_total_tokens": 262144},
    "cuda graphs": {"disable_cuda_graph": False},
}


def _spec(mode: str):
    from specfuzz.oracle.speculative import SpecConfig

    return {
        "off": None,
        "ngram-K8": SpecConfig("ngram", 8, ngram_min=1, ngram_max=3),
        "eagle3-K3": SpecConfig("eagle3", 3, draft_sampling="greedy"),
    }[mode]


def _patterns():
    from specfuzz.oracle.params import SamplingParams

    long_prompt = tuple(int(x) for x in np.random.default_rng(3).integers(0, EOS, 40))
    return [
        ((1,), SamplingParams(max_tokens=MAX_TOKENS)),
        ((1, 2), SamplingParams(max_tokens=MAX_TOKENS, temperature=0.7, top_k=3)),
        ((2, 0, 1), SamplingParams(max_tokens=MAX_TOKENS, top_p=0.8)),
        ((0,), SamplingParams(max_tokens=MAX_TOKENS, repetition_penalty=1.3)),
        ((3, 1), SamplingParams(max_tokens=MAX_TOKENS, min_p=0.1, frequency_penalty=0.5)),
        (long_prompt, SamplingParams(max_tokens=MAX_TOKENS)),
    ]


def run_variant(name: str, settings: dict, mode: str, n_requests: int, calls: int) -> dict:
    """One engine in this process: start, warm-up, ``calls`` timed batches, close."""
    from specfuzz.case import Case
    from specfuzz.engines.base import EngineConfig, Request
    from specfuzz.engines.checkpoints import materialize
    from specfuzz.engines.sglang_engine import SGLangEngine

    rng = np.random.default_rng(11)
    table = (rng.integers(-8, 9, (V, V)) / 4).astype(np.float32)
    spec = _spec(mode)
    pats = _patterns()
    row: dict = {"variant": name, "settings": settings, "mode": mode, "requests": n_requests}
    try:
        import torch

        row["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    except ImportError:
        row["device"] = "unknown"
    with tempfile.TemporaryDirectory(prefix="specfuzz-profile-sglang-") as tmp:
        draft, d2t = None, None
        if spec is not None and spec.method == "eagle3":
            d2t, draft = tuple(range(V // 2)), np.ascontiguousarray(table[:, : V // 2])
        case = Case(target_table=table, prompt=pats[0][0], params=pats[0][1], eos_token_id=EOS, spec=spec,
                    draft_table=draft, draft_d2t=d2t)
        ck = materialize(case, Path(tmp), dtype=DTYPE)
        t0 = time.perf_counter()
        eng = SGLangEngine(**settings)
        eng.start(EngineConfig(target_dir=ck.target_dir, draft_dir=ck.draft_dir, speculation=spec, dtype=DTYPE,
                               max_model_len=64))
        row["start_seconds"] = round(time.perf_counter() - t0, 2)
        try:
            row["warm_up"] = eng.warm_up()
            reqs = [Request(pats[i % len(pats)][0], pats[i % len(pats)][1]) for i in range(n_requests)]
            secs = []
            for _ in range(calls):
                t0 = time.perf_counter()
                outs = eng.generate(reqs)
                secs.append(time.perf_counter() - t0)
            row["call_seconds"] = [round(s, 3) for s in secs]
            row["samples_per_s"] = round(n_requests / min(secs), 1)
            row["tokens_per_request"] = round(sum(len(o.token_ids) for o in outs) / len(outs), 2)
            row["drafted"] = sum(o.num_draft_tokens or 0 for o in outs)
            row["accepted"] = sum(o.num_accepted_tokens or 0 for o in outs)
        finally:
            eng.close()
    return row


def _pyspy() -> str | None:
    """The py-spy binary: on PATH, or in an unpacked py_spy wheel on sys.path."""
    found = shutil.which("py-spy")
    if found:
        return found
    for p in sys.path:
        for cand in Path(p or ".").glob("py_spy-*.data/scripts/py-spy"):
            cand.chmod(0o755)
            return str(cand)
    return None


def summarize_raw(raw: Path, top: int = 40) -> dict:
    """Busiest functions of py-spy's raw collapsed stacks, per process (the stack's first frame
    names it), over the stacks that pass through sampling: SGLang's scheduler event loop, or
    the engine host's ``generate``."""
    per_proc_self: dict[str, Counter] = {}
    per_proc_incl: dict[str, Counter] = {}
    totals: Counter = Counter()
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        frames = stack.split(";")
        proc = frames[0][:80]
        body = ";".join(frames)
        if "event_loop" not in body and "generate" not in body:
            continue
        count = int(n)
        totals[proc] += count
        per_proc_self.setdefault(proc, Counter())[frames[-1][:160]] += count
        inc = per_proc_incl.setdefault(proc, Counter())
        for f in set(frames[1:]):
            inc[f[:160]] += count
    return {proc: {"samples": totals[proc],
                   "self": per_proc_self[proc].most_common(top),
                   "inclusive": per_proc_incl[proc].most_common(top)}
            for proc in sorted(totals, key=totals.get, reverse=True)}


def _attempt(cmd: list[str], name: str, row_path: Path, timeout: float) -> dict:
    """Run one variant's process: the row it wrote, or why there is none."""
    try:
        p = subprocess.run(cmd, timeout=timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return {"variant": name, "status": f"timed out after {timeout:.0f} s"}
    if row_path.exists():
        return json.loads(row_path.read_text())
    return {"variant": name, "status": f"exit {p.returncode}", "stderr_tail": p.stderr[-1500:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", action="append", default=None, help="NAME=JSON adapter settings (repeatable)")
    ap.add_argument("--mode", default="ngram-K8", choices=("off", "ngram-K8", "eagle3-K3"))
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per variant")
    ap.add_argument("--pyspy", action="store_true")
    ap.add_argument("--profile-out", type=Path, default=Path("/tmp/profile_sglang"))
    ap.add_argument("--out", type=Path, default=RESULTS / "profile_sglang.json")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # NAME=JSON: this process runs one variant
    ap.add_argument("--row", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:
        name, _, js = args.one.partition("=")
        args.row.write_text(json.dumps(run_variant(name, json.loads(js or "{}"), args.mode, args.requests, args.calls)))
        return
    variants = dict(DEFAULT_VARIANTS)
    if args.variant:
        variants = {}
        for v in args.variant:
            name, _, js = v.partition("=")
            variants[name] = json.loads(js or "{}")
    results = {"bench": "profile_sglang", "mode": args.mode, "requests": args.requests, "calls": args.calls,
               "variants": {}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for i, (name, settings) in enumerate(variants.items()):
        with tempfile.TemporaryDirectory() as tmp:
            row_path = Path(tmp) / "row.json"
            cmd = [sys.executable, __file__, "--one", f"{name}={json.dumps(settings)}", "--row", str(row_path),
                   "--mode", args.mode, "--requests", str(args.requests), "--calls", str(args.calls)]
            spy = _pyspy() if (args.pyspy and i == 0) else None
            if args.pyspy and i == 0 and spy is None:
                results["pyspy"] = "py-spy not found"
            if spy is not None:
                args.profile_out.mkdir(parents=True, exist_ok=True)
                raw = args.profile_out / "pyspy_raw.txt"
                cmd = [spy, "record", "--subprocesses", "--nonblocking", "--rate", "100", "--format", "raw",
                       "-o", str(raw), "--"] + cmd
            t0 = time.perf_counter()
            row = _attempt(cmd, name, row_path, args.timeout)
            if spy is not None and "samples_per_s" not in row:  # py-spy itself failed (ptrace refused?): without it
                row_spy = row
                row = _attempt(cmd[cmd.index("--") + 1:], name, row_path, args.timeout)
                row["pyspy_failed"] = row_spy
            row["wall_seconds"] = round(time.perf_counter() - t0, 1)
            if spy is not None:
                raw = args.profile_out / "pyspy_raw.txt"
                if raw.exists():
                    summary = summarize_raw(raw)
                    (args.profile_out / "summary.json").write_text(json.dumps(summary, indent=1))
                    row["pyspy"] = {"raw": str(raw), "processes": {k: v["samples"] for k, v in summary.items()}}
                else:
                    row["pyspy"] = "no profile written"
        results["variants"][name] = row
        args.out.write_text(json.dumps(results, indent=1))
        print(f"sglang {name:18s} {row.get('samples_per_s', '-')} samples/s  start {row.get('start_seconds', '-')} s  "
              f"calls {row.get('call_seconds', row.get('status'))}", flush=True)
    print("wrote", args.out, flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
