"""Run one case on an engine: checkpoints, engine (re)use, sequential sampling, verdict.

``run_case`` is the executor the campaign, ``specfuzz check`` and the tests share. It
materialises the case's checkpoints, starts (or reuses) the engine on them, draws
batches of independent samples (distinct per-request seeds) until the anytime-valid
test decides or the sample budget is spent, and returns the judgement. ``calibrate``
does the same with speculation off: the check that separates an oracle/profile error
from a speculation finding (SPEC §5).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from specfuzz.case import Case
from specfuzz.engines.base import EngineConfig, Request
from specfuzz.engines.checkpoints import materialize
from specfuzz.engines.isolation import EngineCrash, IsolatedEngine
from specfuzz.fuzz.corpus import Entry
from specfuzz.oracle.judge import CaseTest, Judgement


@dataclass
class CaseRun:
    case: Case
    judgement: Judgement | None
    counts: Counter = field(default_factory=Counter)
    n: int = 0
    seconds: float = 0.0
    crash: EngineCrash | None = None
    accepted: int = 0
    proposed: int = 0

    @property
    def failed(self) -> bool:
        return self.judgement is not None and self.judgement.failed


def engine_config(case: Case, ckpt_root: Path, *, dtype: str = "float32", speculation: bool = True,
                  settings: dict | None = None) -> EngineConfig:
    ck = materialize(case, ckpt_root, dtype)
    spec = case.spec if speculation else None
    st = dict(settings or {})
    if spec is not None and case.draft_table is not None:
        # The reference engine needs the draft's true width (checkpoints are square).
        st.setdefault("draft_vocab_size", int(case.draft_table.shape[1]))
        if case.draft_d2t is not None:
            st.setdefault("draft_d2t", tuple(case.draft_d2t))
    return EngineConfig(
        target_dir=ck.target_dir,
        draft_dir=ck.draft_dir if spec is not None else None,
        speculation=spec,
        dtype=dtype,
        max_model_len=max(64, len(case.prompt) + case.params.max_tokens + 16),
        settings=st,
    )


def run_case(
    engine: IsolatedEngine,
    case: Case,
    *,
    ckpt_root: Path,
    alpha: float,
    max_samples: int = 4000,
    batch: int = 500,
    seed: int = 0,
    speculation: bool = True,
    profile: str = "vllm",
    tolerance: float = 0.0,
    dtype: str = "float32",
    settings: dict | None = None,
    case_test: CaseTest | None = None,
) -> CaseRun:
    """Sample ``case`` on ``engine`` until the verdict decides or ``max_samples`` are drawn."""
    t0 = time.perf_counter()
    test = case_test or CaseTest(case, alpha=alpha, tolerance=tolerance, profile=profile, with_bug_laws=speculation)
    run = CaseRun(case, None)
    cfg = engine_config(case, ckpt_root, dtype=dtype, speculation=speculation, settings=settings)
    threshold = math.log(1 / alpha)
    try:
        engine.start(cfg)
        next_seed = seed
        while run.n < max_samples:
            k = min(batch, max_samples - run.n)
            reqs = [Request(case.prompt, case.params, next_seed + i) for i in range(k)]
            next_seed += k
            outs = engine.generate(reqs)
            toks = [tuple(o.token_ids) for o in outs]
            run.counts.update(toks)
            run.n += len(toks)
            run.proposed += sum(o.num_draft_tokens or 0 for o in outs)
            run.accepted += sum(o.num_accepted_tokens or 0 for o in outs)
            test.update(toks)
            # Stop early on evidence only: refuting every catalogued bug says nothing
            # about unknown ones, so a pass needs the planned samples.
            if test.test.log_e >= threshold:
                break
    except EngineCrash as crash:
        run.crash = crash
    run.judgement = test.judgement(n_planned=max_samples) if run.n else None
    run.seconds = time.perf_counter() - t0
    return run


def crash_entry(engine: IsolatedEngine, case: Case, crash: EngineCrash, engine_name: str) -> Entry:
    try:
        version = dict(engine.version())
    except EngineCrash:
        version = {"name": engine_name}
    return Entry(
        kind="crash", engine=version, case=case.to_json(),
        evidence=f"engine {crash.kind}: {crash.detail}", log=crash.log_tail,
        extra={"crash_kind": crash.kind},
    )


def finding_entry(engine_version: dict, run: CaseRun, calibration: CaseRun | None) -> Entry:
    j = run.judgement
    assert j is not None
    return Entry(
        kind="finding",
        engine=dict(engine_version),
        case=run.case.to_json(),
        counts=dict(run.counts),
        verdict=j.verdict.to_dict(),
        attribution=None if j.attribution is None else j.attribution.to_dict(),
        calibration=None if calibration is None or calibration.judgement is None else calibration.judgement.verdict.to_dict(),
        evidence=j.verdict.evidence,
        extra={"broken_condition": j.broken_condition, "optimal_samples": j.to_json()["optimal_samples"],
               "acceptance": {"proposed": run.proposed, "accepted": run.accepted}},
    )

