"""``specfuzz impact ENTRY``: does a finding's trigger move a real model's outputs too?

A finding is made on a lookup-table model; a maintainer's first question is whether a real
model under the same settings leaves its distribution. :func:`plan_impact` carries what can be
carried from the entry to the embedded SmolLM2-135M-Instruct (``specfuzz compare``'s default
model): the engine and its adapter settings, the speculation method with its K, n-gram window
and tree shape (a draft-model method drafts with compare's cut-down draft), temperature, top-k,
top-p and min-p. What cannot be carried is named with the reason: token ids of the table's
vocabulary (logit bias, allowed tokens, bad words, stop tokens) have no counterpart in a real
vocabulary; compare's reference law has no penalties or min_tokens; an EAGLE head exists only
for the table targets; a draft of another vocabulary needs a second tokenizer. Where the
method itself cannot be carried, the impact is "not measurable" with that reason.

:func:`run_impact` runs ``specfuzz compare``'s pipeline with that one configuration: the
sampled test (randomized PIT of every speculative token against the model's own teacher-forced
law, anytime-valid at level α, with the tolerance its float spread needs) and the greedy
comparison against speculation off; a calibration entry (speculation off disagreed with μ)
runs speculation off alone and its calibration test is the verdict. :func:`impact_record` is
what goes into the entry's ``extra.impact`` (verdict, e-value, tokens tested and, when nothing
was seen, the power the run had) and from there into its drafted ISSUE.md.
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from specfuzz.errors import SpecfuzzError

IMPACT_SCHEMA_VERSION = 1
# specfuzz engine names -> compare's engine, and the module that must import.
ENGINES = {"vllm": ("vllm", "vllm"), "sglang": ("sglang", "sglang"), "hf-transformers": ("hf", "transformers"),
           "hf": ("hf", "transformers"), "mlx-lm": ("mlx", "mlx_lm"), "mlx": ("mlx", "mlx_lm")}
HEAD_METHODS = ("eagle", "eagle3")
# A real model's outputs are longer than a table finding's 2-4 tokens: this many tokens per sample.
DEFAULT_MAX_TOKENS = 32
# Sampling settings compare's reference law does not have, and why.
NOT_IN_REFERENCE = {
    "min_tokens": "compare's reference law has no min_tokens",
    "thinking_budget": "compare's reference law has no thinking budget",
}
PENALTIES = ("repetition_penalty", "presence_penalty", "frequency_penalty")
# Sampling settings that name token ids of the table's vocabulary.
TOKEN_ID_SETTINGS = ("logit_bias", "allowed_token_ids", "bad_words", "stop_token_ids", "regex", "choice",
                     "think_end_token_id")


class ImpactError(SpecfuzzError):
    """The entry cannot be measured on a real model here (bad input: one line, exit 2)."""


@dataclass(frozen=True)
class ImpactPlan:
    entry_kind: str
    engine: str  # compare's engine: vllm, sglang, hf
    engine_name: str  # the entry's
    spec: Any  # SpecConfig, or None: speculation off (a calibration entry)
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    dtype: str
    penalties: tuple[float, float, float] = (1.0, 0.0, 0.0)  # repetition, presence, frequency (carried ones)
    settings: dict = field(default_factory=dict)
    carried: tuple[str, ...] = ()
    not_carried: tuple[str, ...] = ()
    reason: str | None = None  # set: the trigger cannot be carried at all

    @property
    def measurable(self) -> bool:
        return self.reason is None

    def summary(self) -> str:
        return "; ".join(self.carried)


def _table_vocab(case_json: dict) -> int:
    return len(case_json.get("target_table") or [])


def plan_impact(entry) -> ImpactPlan:
    """What of the entry's trigger is carried to the real model (ImpactError for entries that are no
    distribution finding of a real engine)."""
    from specfuzz.oracle.params import SamplingParams
    from specfuzz.oracle.speculative import SpecConfig

    if entry.kind == "crash":
        raise ImpactError("a crash entry: `specfuzz impact` measures a departure from the model's distribution; "
                          "give a finding or calibration entry")
    if entry.kind not in ("finding", "calibration"):
        raise ImpactError(f"a {entry.kind} entry: `specfuzz impact` takes finding and calibration entries")
    name = str(entry.engine.get("name", ""))
    if name not in ENGINES:
        raise ImpactError(f"engine {name!r} runs no real model here; `specfuzz impact` runs vllm, sglang, "
                          "hf-transformers and mlx-lm findings")
    cj = entry.case
    params = SamplingParams.from_json(cj.get("params") or {})
    spec_json = None if entry.kind == "calibration" else cj.get("spec")
    spec = None if not spec_json else SpecConfig.from_json({**spec_json, "inject": None})
    from specfuzz.fuzz.triage import entry_dtype, entry_settings

    V = _table_vocab(cj)
    dtype = entry_dtype(entry)
    carried, not_carried = [], []
    reason = None
    if spec is None:
        carried.append("speculation off (the entry failed with speculation off)")
    else:
        bits = [f"{spec.method} K={spec.num_speculative_tokens}"]
        if spec.method in ("ngram", "ngram_tree"):
            bits.append(f"n-gram window {spec.ngram_min}..{spec.ngram_max}")
        if spec.is_tree:
            bits.append(f"tree top-k {spec.tree_topk}, budget {spec.tree_budget}")
        if spec.uses_draft_model and spec.method not in HEAD_METHODS:
            bits.append("drafted by SmolLM2's first layers (compare's cut-down draft)")
        carried.append(", ".join(bits))
        if spec.method in HEAD_METHODS:
            reason = (f"the finding's drafter is an {spec.method} head; EAGLE heads exist here only for the table targets "
                      "(specfuzz.tablegen writes them), none for SmolLM2-135M, so the method cannot run on the real model")
        dw = cj.get("draft_table")
        if reason is None and dw and spec.uses_draft_model and len(dw[0]) != V:
            reason = (f"the finding needs a draft whose vocabulary ({len(dw[0])} tokens) differs from the target's ({V}); "
                      "the real model's only draft here (cut from it) shares its tokenizer")
    if params.greedy:
        carried.append("greedy")
    else:
        carried.append(f"temperature {params.temperature:g}")
        if params.top_k >= 1:
            carried.append(f"top_k {params.top_k}")
        if params.top_p < 1.0:
            carried.append(f"top_p {params.top_p:g}")
    if ENGINES[name][0] == "mlx" and not params.greedy and params.temperature != 1.0 and (
            params.top_k >= 1 or params.top_p < 1.0 or params.min_p > 0.0):
        # mlx-lm cuts on the temperature-1 law and samples the kept tokens at the temperature;
        # compare's reference law cuts after the temperature (vLLM's order): equal only at 1.
        reason = reason or (f"mlx-lm applies top-k/top-p/min-p before its temperature ({params.temperature:g}); "
                            "compare's reference law applies them after it (vLLM's order), so the laws differ")
    min_p = float(params.min_p)
    if min_p > 0.0:
        if (params.top_k >= 1 or params.top_p < 1.0) and name != "vllm":
            not_carried.append(f"min_p={min_p:g} (with top-k/top-p {name} orders them otherwise than compare's reference)")
            min_p = 0.0
        else:
            carried.append(f"min_p {min_p:g}")
    for k, why in NOT_IN_REFERENCE.items():
        v = getattr(params, k)
        if v not in (None, 0, 0.0, 1.0):
            not_carried.append(f"{k}={v!r} ({why})")
    from specfuzz.compare.reference import PENALTY_ENGINES

    penalties = [1.0, 0.0, 0.0]
    for i, k in enumerate(PENALTIES):
        v = float(getattr(params, k))
        if v == (1.0 if i == 0 else 0.0):
            continue
        if ENGINES[name][0] in PENALTY_ENGINES:
            penalties[i] = v
            carried.append(f"{k} {v:g}")
        else:
            not_carried.append(f"{k}={v!r} (compare's reference law does not model {name}'s penalties)")
    for k in TOKEN_ID_SETTINGS:
        v = getattr(params, k, None)
        if v not in (None, (), [], {}):
            not_carried.append(f"{k}={_short(v)} (token ids of the table's {V}-token vocabulary have no counterpart in "
                               "SmolLM2's 49,152)")
    if cj.get("eos_token_id") is not None:
        not_carried.append(f"EOS id {cj['eos_token_id']} of the table (SmolLM2 stops at its own EOS)")
    settings = dict(entry_settings(entry))
    if settings:
        carried.append("adapter settings " + json.dumps(settings, sort_keys=True))
    return ImpactPlan(entry.kind, ENGINES[name][0], name, spec, float(params.temperature), max(int(params.top_k), 0),
                      float(params.top_p), min_p, dtype, tuple(penalties), settings, tuple(carried), tuple(not_carried),
                      reason)


def _short(v) -> str:
    s = json.dumps(v, sort_keys=True) if not isinstance(v, str) else repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def require_engine(plan: ImpactPlan) -> None:
    """ImpactError when the entry's engine does not import here."""
    module = ENGINES[plan.engine_name][1]
    if importlib.util.find_spec(module) is None:
        raise ImpactError(f"engine {plan.engine_name!r} is not installed here (no module {module!r}); run `specfuzz impact` "
                          "where the finding's engine is installed")


@dataclass(frozen=True)
class ImpactOptions:
    prompts: int = 8  # built-in prompts used (spread over lengths and kinds)
    samples: int = 8  # samples per prompt
    max_tokens: int = DEFAULT_MAX_TOKENS
    alpha: float = 1e-3
    seed: int = 0
    threads: int = 1
    cache_dir: Path | None = None
    one_call: bool = False  # all sampled requests in one engine call (GPU engines: many requests running at once)


def detectable_tv(tokens: int, alpha: float, bin_tolerance: float, bins: int) -> float:
    """About the smallest total variation between the PIT-bin law and uniform that the run would have
    detected: the tolerance, plus the departure whose KL reaches ln(1/α) plus the KT mixture's regret
    ((bins - 1)/2 · ln n) within ``tokens`` tokens (Pinsker: TV ≥ t gives KL ≥ 2 t²)."""
    if tokens <= 0:
        return 1.0
    kl = (math.log(1.0 / alpha) + (bins - 1) / 2.0 * math.log(tokens + 1.0)) / tokens
    return min(1.0, bins * bin_tolerance / 2.0 + math.sqrt(kl / 2.0))


def run_impact(plan: ImpactPlan, opts: ImpactOptions, log: Callable[[str], None] = lambda s: None):
    """The compare pipeline on the plan's one configuration; returns the Comparison."""
    from specfuzz.compare.pipeline import CompareOptions, run_compare, validate

    co = CompareOptions(
        engines=(plan.engine,), limit=opts.prompts, max_tokens=opts.max_tokens,
        mode="greedy" if plan.temperature < 1e-5 else ("sampled" if plan.spec is None else "both"),
        temperature=plan.temperature if plan.temperature >= 1e-5 else 1.0, top_k=plan.top_k, top_p=plan.top_p,
        min_p=plan.min_p, samples=opts.samples, repeats=1, repeat_prompts=0, alpha=opts.alpha, seed=opts.seed,
        cache_dir=opts.cache_dir, settings=plan.settings, threads=opts.threads, spec=plan.spec,
        baseline_only=plan.spec is None, dtype=plan.dtype, batch_prompt_tokens=(1 << 30) if opts.one_call else None,
        num_speculative_tokens=plan.spec.num_speculative_tokens if plan.spec is not None else 3,
        repetition_penalty=plan.penalties[0], presence_penalty=plan.penalties[1], frequency_penalty=plan.penalties[2],
    )
    return run_compare(validate(co), log=log)


def impact_record(plan: ImpactPlan, comp=None, *, command: str = "") -> dict:
    """The entry's ``extra.impact``: the verdict on the real model, or why it cannot be measured."""
    from specfuzz.compare.sampled import PIT_BINS

    rec: dict[str, Any] = {"schema_version": IMPACT_SCHEMA_VERSION,
                           "date": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()[:10],
                           "model": "SmolLM2-135M-Instruct", "command": command}
    if not plan.measurable:
        return {**rec, "carried": False, "reason": plan.reason}
    a = comp.engines[0]
    test = a.calibration if plan.spec is None else a.sampled.get("finding")
    rec.update(carried=True, engine=plan.engine_name, engine_version=str(a.version.get("version", "")),
               device=str(a.version.get("device", "")), settings=plan.summary(),
               not_carried="; ".join(plan.not_carried) or None)
    if test is not None:
        rec.update(verdict=test.status, e_value=_e(test.log_e), log_e=test.log_e if math.isfinite(test.log_e) else str(test.log_e),
                   tokens=test.tokens, samples=test.samples, tolerance=round(test.tolerance, 6), evidence=test.evidence)
        if test.status != "fail":
            tv = detectable_tv(test.tokens, test.alpha, test.bin_tolerance, PIT_BINS)
            rec["power"] = (f"power: a departure of the PIT-bin law from uniform of total variation ≥ {tv:.2g} would have "
                            f"reached 1/α = {1 / test.alpha:g} within these {test.tokens} tokens" if tv < 0.5 else
                            f"power: none to speak of: the {plan.dtype} rounding spread needs a relative tolerance of "
                            f"{test.tolerance:.2g} per token, under which no departure could have been told apart")
        if plan.spec is not None and a.calibration is not None:
            c = a.calibration
            rec["speculation_off"] = f"{c.status}: e-value {_e(c.log_e)} after {c.tokens} tokens"
        if plan.spec is not None and a.calibration is not None and a.calibration.status == "fail":
            rec["verdict"] = "undecided"
            rec["evidence"] = ("speculation off already fails the same test (the reference does not describe this "
                               f"engine's sampler here): {a.calibration.evidence}")
    else:
        rec.update(verdict="undecided", e_value="-", tokens=0)
    g = a.greedy.get("finding")
    if g is not None:
        rec["greedy"] = (f"{g.matches}/{g.prompts} prompts identical to speculation off"
                         + (f" ({'; '.join(g.flags)})" if g.flags else ""))
    return rec


def _e(log_e: float) -> str:
    return "inf" if log_e == math.inf else (f"{math.exp(log_e):.3g}" if log_e < 700 else f"e^{log_e:.0f}")


def record_in_entry(path: Path, rec: dict) -> None:
    """Write ``rec`` as the entry file's ``extra.impact`` (atomically; the rest of the file as it was)."""
    from specfuzz.fuzz.corpus import atomic_write_json

    data = json.loads(Path(path).read_text(encoding="utf-8"))
    data.setdefault("extra", {})["impact"] = rec
    atomic_write_json(Path(path), data)


def draft_dir_of(path: Path) -> Path | None:
    """The entry's stored draft folder (corpus/drafts/STEM or corpus/h200/drafts/STEM), if any."""
    p = Path(path)
    for d in (p.parent / "drafts" / p.stem, p.parent.parent / "drafts" / p.stem):
        if (d / "ISSUE.md").is_file():
            return d
    return None
