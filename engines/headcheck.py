"""Does an engine's EAGLE path draft what specfuzz's heads say? (greedy, deterministic)

With a greedy target whose rows have unique maxima and greedy drafting, which drafts are
accepted is a deterministic function of the two tables
(:func:`specfuzz.tablegen.eagle.greedy_acceptance`). An engine whose per-request accepted
counts equal the prediction for every prompt drafts from exactly the head's table row of
the current token; a head the engine loads differently (another layout, a random bias,
the wrong aux hidden states) gives other counts. The outputs themselves must be the
greedy path (lossless greedy speculation).

Three heads per run: EAGLE (shares the target's lm_head), EAGLE-3 with a reduced draft
vocabulary and a permuted ``d2t``, and a full-width EAGLE-3 in permuted order. Each runs
in its own engine process. Used by ``bench/check_heads.py`` (results file) and by the
engine tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from specfuzz.case import Case
from specfuzz.engines.base import EngineConfig, Request
from specfuzz.engines.checkpoints import materialize
from specfuzz.engines.isolation import EngineCrash, IsolatedEngine
from specfuzz.oracle.params import SamplingParams
from specfuzz.oracle.speculative import SpecConfig
from specfuzz.tablegen.eagle import greedy_acceptance

V = 6
K = 3
MAX_TOKENS = 12
COPIES = 4  # requests per prompt


def tables() -> tuple[np.ndarray, np.ndarray]:
    """(target [V, V], draft [V, V]): target x -> V-1-x; the draft agrees on even rows only.
    Values are multiples of 1/4 (exact in bfloat16), every row maximum unique."""
    rng = np.random.default_rng(7)
    T = (rng.integers(-12, 13, (V, V)) / 4).astype(np.float32)
    T[np.arange(V), np.arange(V)[::-1]] = 4.0
    D = np.where(np.arange(V)[:, None] % 2 == 0, T, -T).astype(np.float32)
    return T, D


def head_cases() -> dict[str, tuple[str, np.ndarray, tuple[int, ...] | None]]:
    """name -> (method, draft table [V, V_draft], d2t)."""
    _, D = tables()
    reduced = (5, 0, 3, 2)
    full = (3, 1, 5, 0, 2, 4)
    return {
        "eagle": ("eagle", D, None),
        "eagle3-reduced": ("eagle3", np.ascontiguousarray(D[:, list(reduced)]), reduced),
        "eagle3-full-permuted": ("eagle3", np.ascontiguousarray(D[:, list(full)]), full),
    }


def check_heads(engine: str, root: Path, *, dtype: str = "float32", settings: Mapping[str, Any] | None = None,
                names: tuple[str, ...] | None = None, log_dir: Path | None = None) -> dict:
    """Run each head case on ``engine``; return a JSON-able report (``ok`` per case and overall)."""
    T, _ = tables()
    greedy_path = {}
    for p in range(V):
        path = [int(np.argmax(T[p]))]
        while len(path) < MAX_TOKENS:
            path.append(int(np.argmax(T[path[-1]])))
        greedy_path[p] = path
    report: dict = {"engine": engine, "dtype": dtype, "K": K, "max_tokens": MAX_TOKENS, "cases": {}}
    for name, (method, draft, d2t) in head_cases().items():
        if names and name not in names:
            continue
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
        spec = SpecConfig(method, K, draft_sampling="greedy")
        case = Case(T, (0,), params, spec=spec, draft_table=draft, draft_d2t=d2t)
        ck = materialize(case, Path(root), dtype=dtype)
        cfg = EngineConfig(target_dir=ck.target_dir, draft_dir=ck.draft_dir, speculation=spec, dtype=dtype,
                           max_model_len=64, settings=dict(settings or {}))
        row: dict = {"method": method, "draft_vocab_size": int(draft.shape[1]), "d2t": list(d2t) if d2t else None}
        eng = IsolatedEngine(engine, log_dir=log_dir or Path(root) / "logs")
        try:
            eng.start(cfg)
            reqs = [Request((p,), params) for p in range(V) for _ in range(COPIES)]
            outs = eng.generate(reqs)
            row["version"] = dict(eng.version())
        except EngineCrash as exc:
            row.update(ok=False, crash=f"{exc.kind}: {exc.detail}"[:500])
            report["cases"][name] = row
            continue
        except Exception as exc:  # noqa: BLE001 - a refusal or start failure is reported, not raised
            row.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:500])
            report["cases"][name] = row
            continue
        finally:
            eng.close()
        wrong_outputs, per_prompt = 0, []
        for i, o in enumerate(outs):
            p = reqs[i].prompt[0]
            if list(o.token_ids) != greedy_path[p]:
                wrong_outputs += 1
            drafted, accepted = greedy_acceptance(T, draft, d2t, p, MAX_TOKENS, K)
            per_prompt.append({"prompt": p, "accepted": o.num_accepted_tokens, "predicted_accepted": accepted,
                               "drafted": o.num_draft_tokens, "predicted_drafted": drafted})
        stats = [r for r in per_prompt if r["accepted"] is not None]
        matches = sum(r["accepted"] == r["predicted_accepted"] for r in stats)
        # An engine without per-request acceptance statistics (vLLM 0.25 has no RequestOutput
        # spec_decode_metrics) leaves the drafting unverified, not wrong.
        status = ("wrong outputs" if wrong_outputs else "no acceptance statistics" if not stats
                  else "accepted counts differ" if matches < len(stats) or len(stats) < len(outs) else "match")
        row.update(
            requests=len(outs), wrong_outputs=wrong_outputs, with_stats=len(stats), accepted_matches=matches,
            accepted_total=sum(r["accepted"] for r in stats), predicted_accepted_total=sum(r["predicted_accepted"] for r in stats),
            status=status, ok=status == "match", requests_detail=per_prompt[::COPIES],
        )
        report["cases"][name] = row
    report["ok"] = bool(report["cases"]) and all(r["ok"] for r in report["cases"].values())
    return report
