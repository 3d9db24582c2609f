"""Benchmark: samples/s through HFEngine.generate vs raw ``model.generate`` (HF, CPU).

One V=8 table model (float32), max_tokens=8, the same requests (distinct per-request
seeds, as the fuzzer sends them) in three modes:

* speculation off: HFEngine batches identical requests into one ``generate`` call with
  ``num_return_sequences``; compared with the same raw batched call (the adapter's
  overhead) and with one raw call per request (what batching saves);
* assisted generation (a related draft, K=3) and prompt lookup (K=3): one call per
  request in both (HF allows batch size 1 only).

Overhead % = (engine time - raw time) / raw time, from the medians of REPEATS alternating
runs after a warm-up (and from the fastest runs, less sensitive to other processes'
load), torch on one thread for both. Writes ``bench/results/engines_hf.json``.

Run: ``.venv/bin/python bench/bench_engines_hf.py``
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from specfuzz.case import Case
from specfuzz.engines.base import EngineConfig, Request
from specfuzz.engines.checkpoints import materialize
from specfuzz.engines.hf_engine import HFEngine, generation_kwargs
from specfuzz.oracle.params import SamplingParams
from specfuzz.oracle.speculative import SpecConfig

V = 8
EOS = 7
MAX_TOKENS = 8
K = 3
SEED = 20261129
REPEATS = 5
N_OFF = 4000
N_ON = 200
PROMPT = (1, 2, 3, 4, 1, 2, 3, 4, 1, 2)  # repeated n-grams: prompt lookup drafts fire
RESULTS = Path(__file__).resolve().parent / "results" / "engines_hf.json"


def tables() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(SEED)
    target = np.round(rng.standard_normal((V, V)) * 1.5, 3).astype(np.float32)  # [V, V]
    target[:, EOS] -= 2.0  # outputs mostly run to max_tokens
    draft = np.round(target + rng.standard_normal((V, V)) * 0.3, 3).astype(np.float32)  # [V, V] related draft
    return target, draft


def median_time(fn, repeats: int = REPEATS) -> tuple[float, list[float]]:
    fn()  # warm-up
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs), runs


def paired_times(engine_fn, raw_fn, repeats: int = REPEATS) -> tuple[float, list[float], float, list[float]]:
    """Alternate engine and raw runs (after one warm-up each) so that load from other
    processes hits both alike; medians and all runs."""
    engine_fn()
    raw_fn()
    eng, raw = [], []
    for _ in range(repeats):
        for fn, runs in ((engine_fn, eng), (raw_fn, raw)):
            t0 = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - t0)
    return statistics.median(eng), eng, statistics.median(raw), raw


def main() -> dict:
    import torch
    import transformers

    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    target, draft = tables()
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.9, top_k=6, top_p=0.95)
    case = Case(target, PROMPT, params, eos_token_id=EOS, spec=SpecConfig("draft_model", K), draft_table=draft)
    root = Path(tempfile.mkdtemp(prefix="bench-hf-"))
    ck = materialize(case, root)
    engine = HFEngine(threads=1)
    torch.set_num_threads(1)
    gen_kw = generation_kwargs(params, EOS, V)
    ids = torch.tensor([list(PROMPT)], dtype=torch.long)

    def load(d):
        m = transformers.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32)
        m.eval()
        m.generation_config = transformers.GenerationConfig()
        return m

    raw_target = load(ck.target_dir)
    raw_draft = load(ck.draft_dir)
    raw_draft.generation_config = transformers.GenerationConfig(
        num_assistant_tokens=K, num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0
    )

    results = {}

    # -- speculation off
    engine.start(EngineConfig(ck.target_dir))
    reqs = [Request(PROMPT, params, SEED + i) for i in range(N_OFF)]

    def raw_batched():
        torch.manual_seed(SEED)
        with torch.no_grad():
            raw_target.generate(ids, generation_config=transformers.GenerationConfig(**gen_kw, num_return_sequences=N_OFF))

    t_eng, runs_eng, t_raw, runs_raw = paired_times(lambda: engine.generate(reqs), raw_batched)
    n_loop = 200

    def raw_loop():
        with torch.no_grad():
            for i in range(n_loop):
                torch.manual_seed(SEED + i)
                raw_target.generate(ids, generation_config=transformers.GenerationConfig(**gen_kw))

    t_loop, _ = median_time(raw_loop, repeats=1)
    results["speculation_off"] = {
        "samples": N_OFF,
        "engine_samples_per_s": N_OFF / t_eng,
        "raw_batched_samples_per_s": N_OFF / t_raw,
        "raw_one_call_per_request_samples_per_s": n_loop / t_loop,
        "overhead_pct_vs_raw_batched": 100.0 * (t_eng - t_raw) / t_raw,
        "overhead_pct_vs_raw_batched_min_of_runs": 100.0 * (min(runs_eng) - min(runs_raw)) / min(runs_raw),
        "batching_speedup_vs_one_call_per_request": (N_OFF / t_eng) / (n_loop / t_loop),
        "engine_runs_s": runs_eng,
        "raw_runs_s": runs_raw,
    }

    # -- speculation on
    for name, spec, raw_extra in (
        ("assisted_K3", SpecConfig("draft_model", K), {"assistant_model": raw_draft}),
        ("prompt_lookup_K3", SpecConfig("ngram", K, ngram_max=2), {}),
    ):
        engine.start(EngineConfig(ck.target_dir, ck.draft_dir if spec.method == "draft_model" else None, spec))
        reqs = [Request(PROMPT, params, SEED + i) for i in range(N_ON)]
        kw = dict(gen_kw)
        if spec.method == "ngram":
            kw.update(prompt_lookup_num_tokens=K, max_matching_ngram_size=2)
        gc = transformers.GenerationConfig(**kw)

        def raw_loop_spec():
            with torch.no_grad():
                for i in range(N_ON):
                    torch.manual_seed(SEED + i)
                    raw_target.generate(ids, generation_config=gc, **raw_extra)

        engine.acceptance.update(proposed=0, accepted=0, rounds=0)
        t_eng, runs_eng, t_raw, runs_raw = paired_times(lambda: engine.generate(reqs), raw_loop_spec)
        acc = dict(engine.acceptance)
        results[name] = {
            "samples": N_ON,
            "engine_samples_per_s": N_ON / t_eng,
            "raw_samples_per_s": N_ON / t_raw,
            "overhead_pct": 100.0 * (t_eng - t_raw) / t_raw,
            "overhead_pct_min_of_runs": 100.0 * (min(runs_eng) - min(runs_raw)) / min(runs_raw),
            "acceptance_rate": acc["accepted"] / acc["proposed"] if acc["proposed"] else None,
            "drafts_per_run": acc["proposed"] / (REPEATS + 1),
            "engine_runs_s": runs_eng,
            "raw_runs_s": runs_raw,
        }
    engine.close()

    out = {
        "benchmark": "HFEngine.generate vs raw model.generate, V=8 table model, float32, max_tokens=8",
        "params": params.to_json(),
        "prompt": list(PROMPT),
        "num_speculative_tokens": K,
        "repeats": REPEATS,
        "torch_threads": 1,
        "results": results,
        "environment": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "load_average_1min_at_end": round(os.getloadavg()[0], 2),
        },
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    res = main()
    for name, r in res["results"].items():
        eng = r["engine_samples_per_s"]
        raw = r.get("raw_samples_per_s", r.get("raw_batched_samples_per_s"))
        ovh = r.get("overhead_pct", r.get("overhead_pct_vs_raw_batched"))
        ovh_min = r.get("overhead_pct_min_of_runs", r.get("overhead_pct_vs_raw_batched_min_of_runs"))
        print(f"{name:18s} engine {eng:9.1f} samples/s   raw {raw:9.1f} samples/s   overhead {ovh:+6.1f}% "
              f"(fastest runs {ovh_min:+5.1f}%)", file=sys.stdout)
    off = res["results"]["speculation_off"]
    print(f"speculation off: one raw call per request {off['raw_one_call_per_request_samples_per_s']:.1f} samples/s "
          f"(batching speedup {off['batching_speedup_vs_one_call_per_request']:.0f}x)")
