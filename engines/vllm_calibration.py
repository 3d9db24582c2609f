"""Calibration of a running vLLM engine: do its own next-token logits reproduce the table?

:func:`logits_match_table` asks vLLM for every vocabulary entry's logit (or log-probability,
by the engine's ``logprobs_mode``) after each position of one request and compares them with
the checkpoint's table: the check behind every table swap (``VLLMEngine.check_tables``) and
the engine's calibration. :class:`LogitsReport` is what it found (SGLang's adapter reports in
the same form).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from specfuzz.engines.base import EngineConfig
from specfuzz.errors import InvalidInput

# A logits row that comes back as log-probabilities (vLLM 0.25 CUDA V1 prompt logprobs under
# raw_logits) is compared with the table's float64 log-softmax within this (float32 rounding).
LOGPROB_ROW_TOLERANCE = 1e-5
# Log-probabilities come back in float32: besides the absolute tolerance, a compared value may
# differ from the table's float64 log-softmax by this many float32 epsilons of its magnitude
# (vLLM 0.25's Model Runner V2 returns rows with table logits near -32768 up to ~0.002 off:
# within one float32 spacing there, 0.0039, far beyond a 1e-5 check).
LOGPROB_FLOAT32_ULPS = 16
_F32_EPS = 2.0 ** -23


@dataclass(frozen=True)
class LogitsReport:
    """What :func:`logits_match_table` found."""

    ok: bool  # every compared row within ``tolerance`` (exactly equal when 0)
    mode: str  # vLLM logprobs_mode the values came from
    positions: int  # next-token distributions compared
    max_abs_diff: float
    tolerance: float
    contexts: tuple[int, ...] = ()  # the context token of each compared row
    mismatches: tuple[tuple[int, int, float, float], ...] = field(default=())  # (context, token, engine, table)

    def __bool__(self) -> bool:
        return self.ok

    def to_json(self) -> dict:
        return {
            "ok": self.ok, "mode": self.mode, "positions": self.positions,
            "max_abs_diff": self.max_abs_diff, "tolerance": self.tolerance,
            "mismatches": [list(m) for m in self.mismatches[:20]],
        }


def logits_match_table(llm, config: EngineConfig, prompt_tokens: Sequence[int], *, max_tokens: int = 4,
                       tolerance: float | None = None) -> LogitsReport:
    """Do vLLM's own next-token logits reproduce the table of ``config``'s target checkpoint?
    (``llm``: the running ``vllm.LLM`` started on ``config``.)

    One request with ``prompt_logprobs=-1`` and ``logprobs=-1`` (every vocabulary
    entry): the prompt logprobs give the row after each prompt token but the last, the
    sample logprobs the row after the last prompt token and after each generated token.
    With ``logprobs_mode="raw_logits"`` (the default here) these are the raw logits
    and must equal the table bit for bit (tolerance 0); with ``raw_logprobs`` they are
    compared with the table's float64 log-softmax within ``tolerance`` (default 1e-5).
    Expected values: :func:`specfuzz.tablegen.load_table` of the target checkpoint
    (the float32 table it holds, masked entries as MASKED_LOGIT).
    """
    import numpy as np
    from vllm import SamplingParams as VSP
    from vllm.inputs import TokensPrompt

    from specfuzz.tablegen import load_table

    table = load_table(config.target_dir).astype(np.float64)  # [V, V]
    V = table.shape[0]
    prompt = [int(t) for t in prompt_tokens]
    if not prompt or any(not 0 <= t < V for t in prompt):
        raise InvalidInput("prompt_tokens", prompt_tokens, f"a non-empty list of token ids in [0, {V})")
    max_tokens = max(1, min(int(max_tokens), config.max_model_len - len(prompt)))
    mode = str(llm.llm_engine.model_config.logprobs_mode)
    sp = VSP(temperature=1.0, max_tokens=max_tokens, ignore_eos=True, logprobs=-1, prompt_logprobs=-1, detokenize=False, seed=0)
    out = llm.generate([TokensPrompt(prompt_token_ids=prompt)], [sp], use_tqdm=False)[0]
    c = out.outputs[0]
    rows: list[tuple[int, dict]] = []  # (context token, {token: value})
    for i, lp in enumerate(out.prompt_logprobs or []):
        if lp is None:  # the first prompt position has no prediction
            continue
        rows.append((prompt[i - 1], lp))
    context = [prompt[-1], *c.token_ids]
    for i, lp in enumerate(c.logprobs or []):
        rows.append((int(context[i]), lp))
    logsoftmax = table - table.max(axis=1, keepdims=True)
    logsoftmax = logsoftmax - np.log(np.exp(logsoftmax).sum(axis=1, keepdims=True))  # [V, V]
    if mode == "raw_logits":
        expect = table
        tol = 0.0 if tolerance is None else float(tolerance)
    elif mode == "raw_logprobs":
        expect = logsoftmax
        tol = 1e-5 if tolerance is None else float(tolerance)
    else:
        raise InvalidInput("logprobs_mode", mode, "'raw_logits' or 'raw_logprobs' for calibration")

    def diffs(got: dict, ref: np.ndarray, ctx: int, relative: bool) -> list[tuple[int, float, float, float]]:
        """(token, engine, table, difference); ``relative``: float32 log-probabilities, the
        difference net of LOGPROB_FLOAT32_ULPS float32 epsilons of the value's magnitude."""
        out = []
        for tok in range(V):
            g = got.get(tok, -math.inf)
            e = float(ref[ctx, tok])
            d = abs(g - e) if math.isfinite(g) or math.isfinite(e) else 0.0
            if relative and math.isfinite(d):
                d = max(0.0, d - LOGPROB_FLOAT32_ULPS * _F32_EPS * max(1.0, abs(e)))
            out.append((tok, g, e, math.inf if math.isnan(d) else d))
        return out

    worst = 0.0
    bad: list[tuple[int, int, float, float]] = []
    as_logprobs = 0
    for ctx, lp in rows:
        got = {int(k): float(v.logprob) for k, v in lp.items()}
        row = diffs(got, expect, ctx, relative=mode == "raw_logprobs")
        if mode == "raw_logits" and any(d > tol for *_, d in row):
            # vLLM 0.25 (CUDA, V1 runner) returns prompt logprobs as log-probabilities
            # even under raw_logits: a row that is exactly the table's log-softmax (within
            # 1e-5) still shows that the engine's logits are the table's.
            alt = diffs(got, logsoftmax, ctx, relative=True)
            if all(d <= LOGPROB_ROW_TOLERANCE for *_, d in alt):
                as_logprobs += 1
                worst = max(worst, max(d for *_, d in alt))
                continue
        for tok, g, e, d in row:
            worst = max(worst, d)
            if d > tol:
                bad.append((ctx, tok, g, e))
    if mode == "raw_logprobs":
        mode = f"{mode} (float32: tolerance {tol:g} + {LOGPROB_FLOAT32_ULPS} float32 epsilons of |log p|)"
    return LogitsReport(
        ok=not bad and len(rows) > 0,
        mode=mode if not as_logprobs else (
            f"{mode} ({as_logprobs} of {len(rows)} rows came back as log-probabilities: compared with the "
            f"table's log-softmax within {LOGPROB_ROW_TOLERANCE:g} + {LOGPROB_FLOAT32_ULPS} float32 epsilons of |log p|; "
            f"tolerance {tol:g} for the others)"),
        positions=len(rows), max_abs_diff=worst,
        tolerance=tol, contexts=tuple(c for c, _ in rows), mismatches=tuple(bad),
    )
