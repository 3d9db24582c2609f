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
import os
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from specfuzz.case import Case
from specfuzz.engines.base import EngineConfig, Request
from specfuzz.engines.checkpoints import materialize
from specfuzz.engines.isolation import EngineCrash, IsolatedEngine
from specfuzz.fuzz.corpus import Entry, crash_cause
from specfuzz.oracle.judge import CaseTest, Judgement, target_law_dict


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
    dtype: str = "float32"
    launch: dict | None = None  # what the adapter applied to the engine (launch_record)
    call_requests: int = 0  # requests of the largest generate call of the run
    call_prompt_tokens: int | None = None  # the split the run's calls kept to (run_family)
    profile: str = "vllm"  # the semantics profile μ was computed under

    @property
    def failed(self) -> bool:
        return self.judgement is not None and self.judgement.failed


def max_model_len(tokens: int) -> int:
    """An engine's context length for ``tokens`` of prompt and output: the next power of two
    with 16 to spare, at least 64, so that prompts of any length up to it share a start."""
    n = 64
    while n < tokens + 16:
        n *= 2
    return n


def engine_config(case: Case, ckpt_root: Path, *, dtype: str = "float32", speculation: bool = True,
                  settings: dict | None = None, family: Sequence[Case] = ()) -> EngineConfig:
    """The engine configuration that serves ``case`` (its tables written under ``ckpt_root``);
    ``family``: the request patterns sent to it along with ``case``, whose longest prompt +
    max_tokens the context length must hold too."""
    ck = materialize(case, ckpt_root, dtype)
    spec = case.spec if speculation else None
    st = dict(settings or {})
    with_draft = spec is not None and case.draft_table is not None
    return EngineConfig(
        target_dir=ck.target_dir,
        draft_dir=ck.draft_dir if spec is not None else None,
        speculation=spec,
        dtype=dtype,
        max_model_len=max_model_len(max(len(c.prompt) + c.params.max_tokens for c in (case, *family))),
        settings=st,
        draft_vocab_size=int(case.draft_table.shape[1]) if with_draft else None,
        draft_d2t=tuple(case.draft_d2t) if with_draft and case.draft_d2t is not None else None,
    )


def start_key(case: Case, *, speculation: bool = True, family: Sequence[Case] = ()) -> tuple:
    """What decides whether an engine started for ``case`` serves another case by a swap
    (for one dtype and settings, equal keys give equal :func:`engine_config` swap_keys), computed
    without writing checkpoints: vocabulary, EOS, speculation settings, the draft's shape and id
    map, the context length."""
    spec = case.spec if speculation else None
    with_draft = spec is not None and case.draft_table is not None
    return (case.vocab_size, case.eos_token_id, None if spec is None else repr(spec),
            tuple(case.draft_table.shape) if with_draft else None,
            tuple(case.draft_d2t) if with_draft and case.draft_d2t is not None else None,
            max_model_len(max(len(c.prompt) + c.params.max_tokens for c in (case, *family))))


LAUNCH_SCHEMA_VERSION = 1
# Placeholders for the checkpoint folders in a launch record (a draft's repro.py fills them in).
TARGET_PLACEHOLDER = "{target}"
DRAFT_PLACEHOLDER = "{draft}"
# Process environment variables that steer the engines (recorded as inherited by the engine).
ENGINE_ENV_PREFIXES = ("VLLM_", "SGLANG_", "SGL_")
# The last launch record per engine (crash entries are made from the engine, not a run).
_LAST_LAUNCH: "weakref.WeakKeyDictionary[IsolatedEngine, dict]" = weakref.WeakKeyDictionary()


def _placeholders(value, cfg: EngineConfig):
    """``value`` with the config's checkpoint paths replaced by TARGET/DRAFT_PLACEHOLDER."""
    if isinstance(value, dict):
        return {k: _placeholders(v, cfg) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_placeholders(v, cfg) for v in value]
    if isinstance(value, str):
        paths = [(str(cfg.target_dir), TARGET_PLACEHOLDER)]
        if cfg.draft_dir is not None:
            d = str(cfg.draft_dir)
            paths = [(d + "-sglang", DRAFT_PLACEHOLDER), (d, DRAFT_PLACEHOLDER)] + paths
        for path, mark in paths:
            if value == path:
                return mark
        return value
    return value


def launch_record(engine: IsolatedEngine, cfg: EngineConfig) -> dict | None:
    """What the engine's adapter applies for ``cfg`` (its ``launch_args``: environment and
    keyword arguments), as stored in corpus entries (``extra["launch"]``) so that a drafted
    repro.py starts the engine exactly the same way; None for adapters without launch_args.
    Raises InvalidInput as start would."""
    try:
        env, kwargs = engine.launch_args(cfg)  # an engine process computes it (kept per config)
    except AttributeError:
        return None
    set_by_adapter = set(env)
    inherited = {k: v for k, v in sorted(os.environ.items())
                 if k.startswith(ENGINE_ENV_PREFIXES) and k not in set_by_adapter}
    rec = {"schema_version": LAUNCH_SCHEMA_VERSION, "source": "recorded", "env": dict(env),
           "inherited_env": inherited, "kwargs": _placeholders(dict(kwargs), cfg)}
    _LAST_LAUNCH[engine] = rec
    return rec


# Requests per engine call in a campaign (``specfuzz fuzz --batch``'s default).
DEFAULT_BATCH = 600


def run_family(
    engine: IsolatedEngine,
    cases: Sequence[Case],
    *,
    ckpt_root: Path,
    alphas: Sequence[float],
    max_samples: int = 4000,
    batch: int = 500,
    seed: int = 0,
    speculation: bool = True,
    profile: str = "vllm",
    tolerance: float = 0.0,
    dtype: str = "float32",
    settings: dict | None = None,
    unseeded: Sequence[bool] | None = None,
    tests: Sequence[CaseTest] | None = None,
    fresh: bool = False,
    call_prompt_tokens: int | None = None,
) -> list[CaseRun]:
    """Sample request patterns sharing one model family on one engine, in mixed batches.

    Every batch holds requests of every pattern still undecided (distinct seeds, or no
    seed for patterns marked ``unseeded``); a pattern stops early once its evidence
    reaches 1/α, otherwise at ``max_samples``. A crash ends every pattern's run.
    ``fresh``: start the engine afresh (no reuse, no table swap) before sampling.
    ``call_prompt_tokens``: a batch of seeded requests goes to the engine in several calls of
    at most that many prompt tokens each (``Capabilities.seeded_call_prompt_tokens``).
    """
    t0 = time.perf_counter()
    pending = None
    if tests is not None:
        tests = list(tests)
    else:
        # μ now: a case the oracle cannot take (ambiguous semantics, too many outputs) is
        # refused before the engine does anything. The catalogued bug laws (the test's
        # alternatives: 99% of the oracle's time for EAGLE-3 families, up to 1.8 s a
        # pattern) are computed in a thread while the engine starts or swaps and samples
        # the first batch (the main thread waits on the engine process then), and the
        # tests are built before the first outputs are counted.
        from concurrent.futures import ThreadPoolExecutor

        laws = [(c.target_law(profile), target_law_dict(c, profile=profile)) for c in cases]

        def build() -> list[CaseTest]:
            return [CaseTest(c, alpha=a, tolerance=tolerance, profile=profile, with_bug_laws=speculation, law=law, mu=mu)
                    for c, a, (law, mu) in zip(cases, alphas, laws)]

        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specfuzz-oracle")
        pending = pool.submit(build)
        pool.shutdown(wait=False)

    def ready() -> list[CaseTest]:
        nonlocal tests, pending
        if pending is not None:
            tests, pending = pending.result(), None
        return tests

    runs = [CaseRun(c, None, dtype=dtype, profile=profile) for c in cases]
    unseeded = list(unseeded or [False] * len(cases))
    thresholds = [math.log(1 / a) for a in alphas]
    # The context length holds the family's longest pattern, not only the first one's.
    cfg = engine_config(cases[0], ckpt_root, dtype=dtype, speculation=speculation, settings=settings, family=cases)
    per_pattern = max(1, batch // len(cases))
    next_seed = seed
    call_requests = 0
    crash: EngineCrash | None = None
    launch: dict | None = None
    try:
        launch = launch_record(engine, cfg)
        engine.start(cfg, fresh=fresh)
        while True:
            # Before the first outputs every pattern is undecided (its test may still be building).
            live = [i for i, r in enumerate(runs) if r.n < max_samples and (r.n == 0 or ready()[i].test.log_e < thresholds[i])]
            if not live:
                break
            reqs, owner = [], []
            for i in live:
                k = min(per_pattern, max_samples - runs[i].n)
                for _ in range(k):
                    reqs.append(Request(cases[i].prompt, cases[i].params, None if unseeded[i] else next_seed))
                    owner.append(i)
                    next_seed += 1
            outs = []
            for part in split_calls(reqs, call_prompt_tokens):
                call_requests = max(call_requests, len(part))
                outs.extend(engine.generate(part))
            grouped: dict[int, list[tuple[int, ...]]] = {i: [] for i in live}
            for i, o in zip(owner, outs):
                grouped[i].append(tuple(o.token_ids))
                runs[i].proposed += o.num_draft_tokens or 0
                runs[i].accepted += o.num_accepted_tokens or 0
            for i, toks in grouped.items():
                runs[i].counts.update(toks)
                runs[i].n += len(toks)
                ready()[i].update(toks)
    except EngineCrash as exc:
        crash = exc
    for r, t in zip(runs, ready()):
        r.crash = crash
        r.launch = launch
        r.call_requests = call_requests
        r.call_prompt_tokens = call_prompt_tokens
        r.judgement = t.judgement(n_planned=max_samples) if r.n else None
        r.seconds = time.perf_counter() - t0
    return runs


def split_calls(requests: list[Request], prompt_tokens: int | None) -> list[list[Request]]:
    """``requests`` cut, in order, into calls of at most ``prompt_tokens`` prompt tokens each
    (a longer prompt goes alone); one call when there is no limit or no request is seeded."""
    if not prompt_tokens or all(r.seed is None for r in requests):
        return [requests]
    out: list[list[Request]] = [[]]
    total = 0
    for r in requests:
        if out[-1] and total + len(r.prompt) > prompt_tokens:
            out.append([])
            total = 0
        out[-1].append(r)
        total += len(r.prompt)
    return out


def entry_call_prompt_tokens(entry: Entry) -> int | None:
    """The split of generate calls an entry was found with (``extra.call_prompt_tokens``), for
    its replays; None (one call per batch) for entries found without one."""
    v = entry.extra.get("call_prompt_tokens")
    return int(v) if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def entry_replay_calls(entry: Entry) -> dict:
    """run_family/run_case keyword arguments that replay an entry's calls as it was found: the
    split of its seeded calls and the requests per call: for a crash the batch it crashed in,
    for a finding the recorded size of its failing run's calls (:func:`entry_run_batch`)."""
    calls: dict = {"call_prompt_tokens": entry_call_prompt_tokens(entry)}
    if entry.kind == "crash":
        calls["batch"] = entry_crash_batch(entry)
    elif (batch := entry_run_batch(entry)) is not None:
        calls["batch"] = batch
    return calls


def entry_run_batch(entry: Entry) -> int | None:
    """Requests per engine call of a (non-crash) entry's failing run (``extra.batch_size``), or
    None for entries stored before it was recorded (their replays keep the callers' default)."""
    return None if entry.kind == "crash" else _recorded_batch(entry)


def run_case(engine: IsolatedEngine, case: Case, *, alpha: float, case_test: CaseTest | None = None, **kw) -> CaseRun:
    """Sample one case until the verdict fails or ``max_samples`` are drawn (see run_family)."""
    return run_family(engine, [case], alphas=[alpha], tests=None if case_test is None else [case_test], **kw)[0]


def crash_entry(engine: IsolatedEngine, case: Case, crash: EngineCrash, engine_name: str, *,
                dtype: str = "float32", settings: dict | None = None, family: Sequence[Case] = (),
                launch: dict | None = None, batch: int | None = None, call_prompt_tokens: int | None = None) -> Entry:
    """A crash entry. ``family``: every request pattern that was in the crashing batch
    (the engine ran them mixed; the crash may need several of them together). ``launch``:
    the crashing run's launch record (default: the engine's last one). ``batch``: requests
    per engine call of the crashing run (recorded as ``extra.batch_size``: replays, bisection
    and the drafted repro.py send batches that large, see :func:`entry_crash_batch`).
    ``call_prompt_tokens``: the split of generate calls the run kept to (run_family)."""
    try:
        version = dict(engine.version())
    except EngineCrash:
        version = {"name": engine_name}
    evidence = f"engine {crash.kind}: {crash.detail}"
    extra: dict = {"crash_kind": crash.kind, "dtype": dtype, "engine_default": _engine_default(case)}
    cause = crash_cause(crash.kind, evidence, crash.log_tail)
    if cause:  # what broke, where the evidence says only that the engine process died
        extra["crash_cause"] = cause
    if settings:
        extra["engine_settings"] = dict(settings)
    launch = launch if launch is not None else _LAST_LAUNCH.get(engine)
    if launch is not None:
        extra["launch"] = launch
    if batch is not None and batch > 0:
        extra["batch_size"] = int(batch)
    if call_prompt_tokens:
        extra["call_prompt_tokens"] = int(call_prompt_tokens)
    if len(family) > 1:
        extra["batch_patterns"] = [{"prompt": list(c.prompt), "params": c.params.to_json()} for c in family]
    return Entry(
        kind="crash", engine=version, case=case.to_json(),
        evidence=evidence, log=crash.log_tail,
        extra=extra,
    )


def entry_crash_batch(entry: Entry) -> int:
    """Requests per engine call when a crash entry is run again (replay, bisection, repro.py):
    the batch it crashed in (``extra.batch_size``), else the campaign's default ``--batch``
    (entries stored before the batch was recorded ran in batches that large or smaller).
    Some crashes need the whole batch: vLLM CPU's chunked-prefill crash (corpus
    crash-8364f7220f732b16) needs 17-token prompts in calls of more than 500 requests."""
    return _recorded_batch(entry) or DEFAULT_BATCH


def _recorded_batch(entry: Entry) -> int | None:
    """The entry's ``extra.batch_size`` (requests per engine call of the run it records), or None."""
    recorded = entry.extra.get("batch_size")
    return int(recorded) if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded > 0 else None


def _engine_default(case: Case) -> bool:
    """Whether the case ran its speculation method at the engine's own defaults."""
    return bool(case.spec is not None and case.spec.engine_default)


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
               "dtype": run.dtype, "engine_default": _engine_default(run.case), "profile": run.profile,
               "acceptance": {"proposed": run.proposed, "accepted": run.accepted},
               **({"launch": run.launch} if run.launch is not None else {}),
               **({"call_prompt_tokens": run.call_prompt_tokens} if run.call_prompt_tokens else {}),
               # Requests per engine call of the failing run: replays and repro.py send calls that
               # large (SGLang's penalties went wrong only in calls of more requests than its
               # max_running_requests: corpus h200/sglang calibration-1f04b0bc1b814d69).
               **({"batch_size": run.call_requests} if run.call_requests else {})},
    )

