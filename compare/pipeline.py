"""``specfuzz compare`` end to end: validate, prepare, run, analyse; no rendering.

:func:`validate` checks every user input before anything heavy runs or anything is
written (bad input: :class:`~specfuzz.errors.InvalidInput`, one line, exit 2);
:func:`run_compare` prepares the model and drafts, runs every engine (baseline and each
method), teacher-forces the outputs through the reference and returns the analysis as
a :class:`Comparison` that :mod:`specfuzz.compare.report` renders and writes.
"""

from __future__ import annotations

import math
import platform
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from specfuzz.errors import InvalidInput
from specfuzz.oracle.params import SamplingParams
from specfuzz.oracle.speculative import SpecConfig

from specfuzz.compare import models as M
from specfuzz.compare.greedy import GreedyReport, greedy_report
from specfuzz.compare.prompts import EncodedPrompt, Prompt, builtin_prompts, encode, has_chat_template, load_prompts, subset
from specfuzz.compare.greedy import acceptance
from specfuzz.compare.reference import (
    PENALTY_ENGINES, PENALTY_WINDOW, LawSettings, ReferenceModel, dtype_spread, greedy_gaps, measure_logit_noise,
    penalized_logits,
)
from specfuzz.compare.runs import METHODS, Method, Record, RunPlan, RunResult, engine_label, run_engine
from specfuzz.compare.sampled import SampledTest, merge, pit_values, sampled_test, tolerance_from_noise

MODES = ("both", "greedy", "sampled")
DEFAULT_METHODS = ("ngram", "self", "cut")
# The method name of CompareOptions.spec (a finding's own speculative configuration).
FINDING_METHOD = "finding"
# Outputs of the first sampled prompt teacher-forced twice to measure the float32 spread.
NOISE_PROBE_OUTPUTS = 4


@dataclass(frozen=True)
class CompareOptions:
    engines: tuple[str, ...] = ("hf",)
    model: Path | None = None
    methods: tuple[str, ...] = ()
    draft: Path | None = None
    draft_layers: int = M.DEFAULT_CUT_LAYERS
    num_speculative_tokens: int = 3
    prompts: Path | None = None
    limit: int | None = None
    max_tokens: int = 48
    mode: str = "both"
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    samples: int = 8
    repeats: int = 2
    repeat_prompts: int = 8
    alpha: float = 1e-3
    seed: int = 0
    out: Path = Path("specfuzz-compare")
    cache_dir: Path | None = None
    chat: bool | None = None  # None: when the tokenizer has a chat template
    settings: Mapping[str, Any] = field(default_factory=dict)
    threads: int = 1
    min_p: float = 0.0
    # One speculative configuration run as the method "finding" instead of ``methods`` (specfuzz
    # impact: a finding's method and knobs; a draft-model method drafts with the cut-down draft).
    spec: SpecConfig | None = None
    batch_prompt_tokens: int | None = None  # None: runs.SEEDED_BATCH_PROMPT_TOKENS
    baseline_only: bool = False  # speculation off only (its calibration test is the verdict)
    dtype: str = "float32"  # the engines' dtype; other than float32 widens the tolerance by the reference's own spread in it
    # Penalties of the sampled requests, in the reference law with each engine's history rule
    # (reference.PENALTY_WINDOW); engines in reference.PENALTY_ENGINES only.
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0


@dataclass
class Validated:
    opts: CompareOptions
    engines: tuple[str, ...]
    methods: tuple[str, ...]
    prompts: list[Prompt]
    greedy: bool
    sampled: bool


def _int(name: str, v: object, lo: int, allowed: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise InvalidInput(name, v, allowed)
    return int(v)


def validate(o: CompareOptions) -> Validated:
    """Every check that needs no model: InvalidInput for the first bad value."""
    from specfuzz.engines.isolation import resolve_engine

    t = o.temperature
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        raise InvalidInput("--temperature", t, "a number >= 0 (0: greedy comparison only)")
    if not (0.0 < o.top_p <= 1.0):
        raise InvalidInput("--top-p", o.top_p, "a number in (0, 1]")
    if not (0.0 <= o.min_p < 1.0):
        raise InvalidInput("--min-p", o.min_p, "a number in [0, 1)")
    rp, pp, fp = o.repetition_penalty, o.presence_penalty, o.frequency_penalty
    try:  # the ranges SamplingParams allows, named by their options
        SamplingParams(repetition_penalty=rp, presence_penalty=pp, frequency_penalty=fp)
    except InvalidInput as exc:
        raise InvalidInput("--" + exc.name.replace("_", "-"), exc.value, exc.allowed) from None
    if (rp != 1.0 or pp != 0.0 or fp != 0.0):
        for e in o.engines:
            if engine_label(e) not in PENALTY_ENGINES:
                raise InvalidInput("--engine", e, f"an engine whose penalties compare models ({', '.join(PENALTY_ENGINES)}) "
                                   "with --repetition-penalty / --presence-penalty / --frequency-penalty")
    if o.dtype not in ("float32", "bfloat16", "float16"):
        raise InvalidInput("dtype", o.dtype, "float32, bfloat16 or float16")
    _int("--top-k", o.top_k, 0, "an integer >= 0 (0 = off)")
    _int("--max-tokens", o.max_tokens, 1, "an integer >= 1")
    _int("--samples", o.samples, 1, "an integer >= 1 (samples per prompt in sampled mode)")
    _int("--repeats", o.repeats, 1, "an integer >= 1 (greedy runs per mode on the repeat subset)")
    _int("--repeat-prompts", o.repeat_prompts, 0, "an integer >= 0")
    _int("--num-speculative-tokens", o.num_speculative_tokens, 1, "an integer in [1, 16]")
    if o.num_speculative_tokens > 16:
        raise InvalidInput("--num-speculative-tokens", o.num_speculative_tokens, "an integer in [1, 16]")
    _int("--threads", o.threads, 1, "an integer >= 1")
    if o.limit is not None:
        _int("--limit", o.limit, 1, "an integer >= 1 (prompts to use)")
    if not (0.0 < o.alpha < 1.0):
        raise InvalidInput("--alpha", o.alpha, "a number in (0, 1)")
    if o.mode not in MODES:
        raise InvalidInput("--mode", o.mode, f"one of {MODES}")
    greedy = o.mode in ("both", "greedy")
    sampled = o.mode in ("both", "sampled") and t > 0
    if o.mode == "sampled" and t == 0:
        raise InvalidInput("--temperature", t, "a number > 0 with --mode sampled")
    if not o.engines:
        raise InvalidInput("--engine", None, "at least one engine")
    for e in o.engines:
        resolve_engine(e)
    methods = tuple(dict.fromkeys(o.methods)) if o.methods else DEFAULT_METHODS + (("draft",) if o.draft else ())
    if o.spec is not None:
        methods = (FINDING_METHOD,)
    if o.baseline_only:
        methods = ()
    for m in methods:
        if m not in METHODS and m != FINDING_METHOD:
            raise InvalidInput("--method", m, f"one of {tuple(METHODS)}")
    if "draft" in methods and o.draft is None:
        raise InvalidInput("--draft", None, "a draft checkpoint folder for --method draft")
    if o.draft is not None:
        d = Path(o.draft)
        if not (d / "config.json").is_file():
            raise InvalidInput("--draft", str(o.draft), "an existing checkpoint folder containing config.json")
    if o.model is not None:
        M.user_model(Path(o.model))
    else:
        M.embedded_gguf()
    prompts = load_prompts(Path(o.prompts)) if o.prompts is not None else builtin_prompts()
    prompts = subset(prompts, o.limit)
    out = Path(o.out)
    if out.exists() and not out.is_dir():
        raise InvalidInput("--out", str(out), "a folder (it exists and is not one)")
    return Validated(o, tuple(o.engines), methods, prompts, greedy, sampled)


@dataclass
class EngineAnalysis:
    engine: str
    version: Mapping[str, Any]
    runs: list[RunResult]
    greedy: dict[str, GreedyReport] = field(default_factory=dict)  # method -> report
    calibration: SampledTest | None = None  # baseline (speculation off) samples
    sampled: dict[str, SampledTest] = field(default_factory=dict)
    sampled_acceptance: dict[str, tuple[float | None, int | None, int | None]] = field(default_factory=dict)
    baseline_argmax: dict[str, Any] = field(default_factory=dict)  # baseline greedy tokens vs reference argmax
    noise: float = 0.0  # logit spread used: max(reference across batch shapes, engine vs reference)
    engine_noise: float | None = None  # the engine's own logits vs the reference's, where the engine exposes them
    tolerance: tuple[float, float] = (0.0, 0.0)  # (δ assumed logit error, ε relative probability tolerance)
    pits: dict[str, np.ndarray] = field(default_factory=dict)  # "off" and each method -> PIT values


@dataclass
class Comparison:
    options: CompareOptions
    model: M.ModelFolders
    draft_dirs: dict[str, str]
    prompts: list[EncodedPrompt]
    chat: bool
    greedy: bool
    sampled: bool
    engines: list[EngineAnalysis]
    noise: float  # reference's own float32 spread across batch shapes
    seconds: dict[str, float]
    host: dict[str, str]
    records: dict[str, list[Record]]  # "baseline" / "speculative"


def _methods(names: Sequence[str], o: CompareOptions, target: Path, log) -> tuple[list[Method], dict[str, str]]:
    K = o.num_speculative_tokens
    out, dirs = [], {}
    if o.baseline_only:
        return [], dirs
    if o.spec is not None:
        d = M.cut_draft(Path(target), int(o.draft_layers), o.cache_dir) if o.spec.uses_draft_model else None
        if d is not None:
            log(f"cut-down draft: first {o.draft_layers} layers of the target in {d}")
            dirs[FINDING_METHOD] = str(d)
        return [Method(FINDING_METHOD, o.spec, d)], dirs
    for n in names:
        if n == "ngram":
            out.append(Method("ngram", SpecConfig("ngram", K, ngram_min=1, ngram_max=3)))
        elif n == "self":
            out.append(Method("self", SpecConfig("draft_model", K), Path(target)))
            dirs[n] = str(target)
        elif n == "cut":
            d = M.cut_draft(Path(target), int(o.draft_layers), o.cache_dir)
            log(f"cut-down draft: first {o.draft_layers} layers of the target in {d}")
            out.append(Method("cut", SpecConfig("draft_model", K), d))
            dirs[n] = str(d)
        elif n == "draft":
            out.append(Method("draft", SpecConfig("draft_model", K), Path(o.draft)))
            dirs[n] = str(o.draft)
    return out, dirs


def _engine_kwargs(engine: str, o: CompareOptions, model: M.ModelFolders) -> dict:
    if engine_label(engine) == "llamacpp":
        # llama.cpp runs the GGUF itself (the embedded model's; a user's HF folder has none).
        return {"model_gguf": str(M.embedded_gguf())} if model.embedded else {}
    return {"threads": o.threads} if engine_label(engine) == "hf" else {}


def run_compare(v: Validated, log: Callable[[str], None] = lambda s: None) -> Comparison:
    o = v.opts
    t_all = time.perf_counter()
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    model = M.user_model(Path(o.model)) if o.model is not None else M.embedded_model(o.cache_dir, log=log)
    seconds["prepare_model"] = time.perf_counter() - t0
    tok = M.load_tokenizer(model.target)
    if o.draft is not None:
        M.check_same_tokenizer(tok, Path(o.draft))
    chat = has_chat_template(tok) if o.chat is None else bool(o.chat)
    if chat and not has_chat_template(tok):
        raise InvalidInput("--chat", True, "--no-chat for a tokenizer without a chat template")
    prompts = encode(v.prompts, tok, chat)
    t0 = time.perf_counter()
    methods, draft_dirs = _methods(v.methods, o, model.target, log)
    seconds["prepare_drafts"] = time.perf_counter() - t0
    eos = getattr(tok, "eos_token_id", None)
    plan = RunPlan(tuple(prompts), o.max_tokens, v.greedy, v.sampled, float(o.temperature), int(o.top_k), float(o.top_p),
                   o.samples, o.repeats, min(o.repeat_prompts, len(prompts)), o.seed, eos, float(o.min_p),
                   **({} if o.batch_prompt_tokens is None else {"batch_prompt_tokens": int(o.batch_prompt_tokens)}),
                   dtype=o.dtype, repetition_penalty=float(o.repetition_penalty), presence_penalty=float(o.presence_penalty),
                   frequency_penalty=float(o.frequency_penalty))

    def decode(ids):
        return tok.decode(list(ids), skip_special_tokens=False)

    all_runs: dict[str, list[RunResult]] = {}
    for e in v.engines:
        t0 = time.perf_counter()
        all_runs[e] = run_engine(e, _engine_kwargs(e, o, model), methods, plan, model.target, model.name, o.settings, decode, log)
        seconds[f"engine:{engine_label(e)}"] = time.perf_counter() - t0
    log("teacher-forcing the outputs through the reference (HF transformers, float32)")
    t0 = time.perf_counter()
    ref = ReferenceModel(model.target, threads=o.threads)
    settings = LawSettings(float(o.temperature), int(o.top_k), float(o.top_p), float(o.min_p), float(o.repetition_penalty),
                           float(o.presence_penalty), float(o.frequency_penalty)) if v.sampled else None
    by_prompt = {p.id: p for p in prompts}
    # The reference's own float32 spread across batch shapes, on real outputs.
    noise = 0.0
    first = next(iter(all_runs.values()))[0]
    recs = [r for r in (first.sampled or first.greedy) if r.token_ids]
    if recs:
        pid = recs[0].prompt_id
        probe = [r.token_ids for r in recs if r.prompt_id == pid][:NOISE_PROBE_OUTPUTS]
        noise = measure_logit_noise(ref, by_prompt[pid].token_ids, probe)
        if o.dtype != "float32":  # the engines compute in a lower dtype: its rounding spread on the same outputs
            noise = max(noise, dtype_spread(ref, ReferenceModel(model.target, threads=o.threads, dtype=o.dtype),
                                            by_prompt[pid].token_ids, probe))
    drafts = {m.name: ReferenceModel(m.draft_dir, threads=o.threads) for m in methods
              if v.sampled and m.draft_dir is not None and m.name != "self"}
    analyses = []
    rng_seed = 1_000_000 + o.seed
    for e, runs in all_runs.items():
        base = runs[0]
        engine_noise = _engine_noise(ref, base.probe)
        a = EngineAnalysis(engine_label(e), base.version, runs, noise=max(noise, engine_noise or 0.0),
                           engine_noise=engine_noise)
        if v.greedy:
            gaps, argmax = _greedy_reference(ref, prompts, base.greedy, a.noise)
            a.baseline_argmax = argmax
            for r in runs[1:]:
                g = greedy_report(r.method.name, prompts, base.greedy, r.greedy, _divergence_gaps(
                    gaps, base.greedy, r.greedy), a.noise, o.repeats, plan.repeat_prompts, r.method.name == "self")
                if g.acceptance is None:
                    _estimate_acceptance(g, r, prompts, ref if r.method.name == "self" else None, o, log)
                a.greedy[r.method.name] = g
        if v.sampled:
            settings_e = replace(settings, penalty_window=PENALTY_WINDOW.get(engine_label(e)))  # the engine's penalty history
            a.tolerance = tolerance_from_noise(a.noise, o.temperature)
            delta, eps = a.tolerance
            rng = np.random.default_rng(rng_seed)
            cal = _pits(ref, prompts, base.sampled, settings_e, delta, rng, None)
            a.pits["off"] = cal.u
            a.calibration = sampled_test(cal, o.alpha, eps)
            for r in runs[1:]:
                pit = _pits(ref, prompts, r.sampled, settings_e, delta, rng, drafts.get(r.method.name))
                a.pits[r.method.name] = pit.u
                a.sampled[r.method.name] = sampled_test(pit, o.alpha, eps)
                a.sampled_acceptance[r.method.name] = acceptance(r.sampled)
        analyses.append(a)
    seconds["reference"] = time.perf_counter() - t0
    seconds["total"] = time.perf_counter() - t_all
    records = {"baseline": [x for runs in all_runs.values() for x in runs[0].greedy + runs[0].sampled],
               "speculative": [x for runs in all_runs.values() for r in runs[1:] for x in r.greedy + r.sampled]}
    host = {"python": platform.python_version(), "machine": platform.machine(), "cpus": str(__import__("os").cpu_count())}
    return Comparison(o, model, draft_dirs, prompts, chat, v.greedy, v.sampled, analyses, noise, seconds, host, records)


def _estimate_acceptance(g: GreedyReport, run: RunResult, prompts: Sequence[EncodedPrompt], ref: ReferenceModel | None,
                         o: CompareOptions, log) -> None:
    """Acceptance replayed from the draft's teacher-forced argmax, for engines without counters
    (draft-model methods; n-gram drafting depends on the engine's matcher and is not replayed)."""
    from specfuzz.compare.greedy import LOW_ACCEPTANCE, replay_greedy_acceptance

    if run.method.draft_dir is None:
        g.acceptance_source = "none"
        return
    draft = ref if ref is not None else ReferenceModel(run.method.draft_dir, threads=o.threads)
    outs, ams = [], []
    for p in prompts:
        for r in run.greedy:
            if r.prompt_id == p.id and r.repeat == 0 and r.token_ids:
                lg = draft.output_logits(p.token_ids, [r.token_ids])[0]  # [T, V]
                outs.append(r.token_ids)
                ams.append(lg.argmax(axis=1))
    d, a = replay_greedy_acceptance(outs, ams, run.method.spec.num_speculative_tokens)
    g.drafted, g.accepted = d, a
    g.acceptance = a / d if d else None
    g.acceptance_source = "estimated"
    if g.acceptance is not None and g.acceptance < LOW_ACCEPTANCE and run.method.name != "self":
        g.flags.append(f"low acceptance (estimated): {g.acceptance:.1%} of draft tokens accepted (below {LOW_ACCEPTANCE:.0%})")
    log(f"{run.engine} {run.method.name}: no acceptance counters; estimated {g.acceptance} by replaying greedy drafting")


def _engine_noise(ref: ReferenceModel, probe) -> float | None:
    """Largest |engine logit - reference logit| over the probed tokens (None: not exposed)."""
    if not probe:
        return None
    worst = 0.0
    for prompt, output, got in probe:
        lg = ref.output_logits(prompt, [output])[0]  # [T, V]
        want = lg[np.arange(len(output)), np.asarray(output)]  # [T]
        worst = max(worst, float(np.max(np.abs(np.asarray(got, dtype=np.float64) - want.astype(np.float64)))))
    return worst


def _pits(ref: ReferenceModel, prompts: Sequence[EncodedPrompt], records: Sequence[Record], settings: LawSettings,
          delta: float, rng: np.random.Generator, draft: ReferenceModel | None):
    parts = []
    for p in prompts:
        recs = [r for r in records if r.prompt_id == p.id]
        if not recs:
            continue
        outs = [r.token_ids for r in recs]
        lg = ref.output_logits(p.token_ids, outs)
        dl = draft.output_logits(p.token_ids, outs) if draft is not None else None
        if settings.penalized:  # each row penalised from its own history, as the engine does
            lg = [penalized_logits(x, p.token_ids, o, settings) for x, o in zip(lg, outs)]
            dl = None if dl is None else [penalized_logits(x, p.token_ids, o, settings) for x, o in zip(dl, outs)]
        parts.append(pit_values(recs, lg, settings, delta, rng, dl))
    return merge(parts)


def _greedy_reference(ref: ReferenceModel, prompts: Sequence[EncodedPrompt], baseline: Sequence[Record],
                      noise: float) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Per prompt, the reference's top-2 logit gap at every position of the baseline's greedy
    output (repeat 0), and how often the baseline token is the reference's argmax."""
    from specfuzz.compare.greedy import NEAR_TIE_FACTOR, NEAR_TIE_FLOOR

    tie = max(NEAR_TIE_FLOOR, NEAR_TIE_FACTOR * noise)
    gaps: dict[str, np.ndarray] = {}
    tokens = agree = near = tie_positions = 0
    off: list[dict] = []
    base0 = {r.prompt_id: r for r in baseline if r.repeat == 0}
    for p in prompts:
        r = base0.get(p.id)
        if r is None or not r.token_ids:
            continue
        am, gap = greedy_gaps(ref.output_logits(p.token_ids, [r.token_ids])[0])  # [T], [T]
        gaps[p.id] = gap
        tie_positions += int((gap <= tie).sum())
        for t, tok in enumerate(r.token_ids):
            tokens += 1
            if int(am[t]) == int(tok):
                agree += 1
            elif gap[t] <= tie:
                near += 1
            else:
                off.append({"prompt_id": p.id, "position": t, "token": int(tok), "argmax": int(am[t]), "gap": float(gap[t])})
    return gaps, {"tokens": tokens, "argmax_agree": agree, "near_ties": near, "off_argmax": off[:20], "n_off_argmax": len(off),
                  "tie_threshold": tie, "near_tie_positions": tie_positions}


def _divergence_gaps(gaps: Mapping[str, np.ndarray], baseline: Sequence[Record], spec: Sequence[Record]) -> dict[str, float]:
    from specfuzz.compare.greedy import first_divergence

    b0 = {r.prompt_id: r for r in baseline if r.repeat == 0}
    out = {}
    for r in spec:
        if r.repeat != 0 or r.prompt_id not in b0:
            continue
        fd = first_divergence(b0[r.prompt_id].token_ids, r.token_ids)
        g = gaps.get(r.prompt_id)
        if fd is not None and g is not None and fd < len(g):
            out[r.prompt_id] = float(g[fd])
    return out
