"""The model's own next-token laws, teacher-forced through HF transformers at float32.

For every emitted token ``x_t`` of an output, the law it should have been drawn from is
the target model's next-token distribution after exactly that prefix (prompt plus
``x_<t``) with the request's sampling settings applied. :class:`ReferenceModel` computes
the raw logits of every output position in one batched forward per prompt (the prompt's
KV cache computed once and shared by its outputs); :func:`sampling_laws` applies
temperature, top-k and top-p in the order vLLM and HF transformers share for these
three settings (temperature, then top-k on the scaled logits keeping ties, then top-p on
the softmax keeping the smallest set of most probable tokens whose mass reaches
``top_p``).

Penalties (repetition, presence, frequency) depend on the tokens before each position, so
they are applied to the raw logits of every row before the law (:func:`penalized_logits`),
as the engines apply them before the temperature, with the engine's own history
(:data:`PENALTY_WINDOW`): vLLM and HF transformers penalise repetition of any token of
prompt + output and (vLLM) presence and frequency of output tokens; mlx-lm all three on the
last 20 tokens of prompt + output.

Exactness: HF at float32 on CPU is not bit-exact across batch shapes (a token decoded
alone and the same token inside a batched teacher-forced forward can differ in the last
bits of their logits), and another engine's kernels differ more. :func:`measure_logit_noise`
measures that spread on real outputs; the sampled test turns it into a stated tolerance
(:mod:`specfuzz.compare.sampled`). Steps whose top-k / top-p cut is not decided within
that noise (a kept-set boundary closer than the noise) are *ambiguous*: which tokens
are allowed there is not determined by the model, so they are left out of the test (the
choice depends on the reference law only, never on the sampled token, which keeps the
test valid) and counted in the report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from specfuzz.errors import InvalidInput

# Outputs teacher-forced per forward call (bounded memory: logits are [B, T, V] float32).
TEACHER_BATCH = 8
# Rank of the PIT order: tokens sorted by descending probability, ties by ascending id.
PIT_ORDER = "descending probability, ties by token id"


# Engines whose penalties read a window of the last N tokens of prompt + output (all three
# penalties); every other engine: repetition on prompt + output, presence and frequency on the
# output, unwindowed (vLLM's rule; HF transformers has repetition only).
PENALTY_WINDOW = {"mlx": 20}
# Engines whose penalties compare can model (SGLang's penalizers are not modelled here).
PENALTY_ENGINES = ("vllm", "hf", "mlx")


@dataclass(frozen=True)
class LawSettings:
    """The sampling settings ``specfuzz compare`` applies (and the laws follow)."""

    temperature: float  # > 0 for a law (greedy has none)
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0  # 0 = off
    repetition_penalty: float = 1.0  # 1 = off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_window: int | None = None  # None: vLLM's history rule; N: the last N tokens of prompt + output

    @property
    def penalized(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def to_json(self) -> dict:
        d = {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "min_p": self.min_p}
        if self.penalized:
            d.update(repetition_penalty=self.repetition_penalty, presence_penalty=self.presence_penalty,
                     frequency_penalty=self.frequency_penalty, penalty_window=self.penalty_window)
        return d


def penalized_logits(logits: np.ndarray, prompt: Sequence[int], output: Sequence[int], s: LawSettings) -> np.ndarray:
    """Raw-logits rows ``[T, V]`` predicting ``output[t]`` after ``prompt + output[:t]``, with
    ``s``'s penalties applied to each row from its own history by the oracle's steps for the
    engine's rule: ``s.penalty_window`` None: :func:`specfuzz.oracle.steps.apply_penalties`
    (repetition over prompt + output[:t], presence and frequency over output[:t]); N:
    :func:`specfuzz.oracle.semantics_mlx.mlx_penalties` on the last N tokens of
    prompt + output[:t]. float64."""
    from specfuzz.oracle.semantics_mlx import mlx_penalties, window_counts
    from specfuzz.oracle.steps import apply_penalties

    z = np.array(logits, dtype=np.float64)  # [T, V]
    if not s.penalized or z.shape[0] == 0:
        return z
    T, V = z.shape
    out = np.asarray([int(t) for t in output][:T], dtype=np.int64)  # [T]
    rp, pp, fp = float(s.repetition_penalty), float(s.presence_penalty), float(s.frequency_penalty)
    if s.penalty_window is None:
        seen = np.bincount(np.asarray(prompt, dtype=np.int64), minlength=V)[:V] > 0  # [V]
        step = np.zeros((T, V), dtype=np.int64)  # [T, V] output[t - 1] at row t
        step[np.arange(1, T), out[: T - 1]] = 1
        return apply_penalties(z, seen, np.cumsum(step, axis=0), rp, fp, pp)
    ctx = tuple(int(t) for t in prompt)
    counts = np.concatenate([window_counts(ctx, out[None, :t], V, s.penalty_window) for t in range(T)])  # [T, V]
    return mlx_penalties(z, counts, rp, pp, fp)


def sampling_laws(logits: np.ndarray, s: LawSettings) -> np.ndarray:
    """The laws ``[T, V]`` (float64) of raw-logits rows ``[T, V]`` under ``s``.

    Temperature, then min-p (tokens with ``p < min_p * max p`` dropped, vLLM's place for it;
    alone it is the same in every engine), then top-k on the scaled logits (ties at the k-th
    value kept, as vLLM and HF do), softmax, then top-p: a token is kept when the mass of the
    tokens ranked before it (descending probability, ties by id) is below ``top_p``; renormalised.
    """
    if np.ndim(logits) == 1:
        return sampling_laws(np.asarray(logits)[None], s)[0]
    z = np.asarray(logits, dtype=np.float64) / float(s.temperature)  # [T, V]
    T, V = z.shape
    if s.min_p > 0.0:
        z = np.where(z - z.max(axis=1, keepdims=True) >= math.log(s.min_p), z, -np.inf)
    if s.top_k and s.top_k < V:
        kth = np.partition(z, V - s.top_k, axis=1)[:, V - s.top_k][:, None]  # [T, 1]
        z = np.where(z >= kth, z, -np.inf)
    p = np.exp(z - z.max(axis=1, keepdims=True))  # [T, V]
    p /= p.sum(axis=1, keepdims=True)
    if s.top_p < 1.0:
        order = np.argsort(-p, axis=1, kind="stable")  # [T, V] descending, ties by id
        ps = np.take_along_axis(p, order, axis=1)  # [T, V]
        before = np.cumsum(ps, axis=1) - ps  # [T, V] mass ranked before each
        drop = before >= s.top_p  # [T, V] in sorted order
        mask = np.zeros_like(drop)
        np.put_along_axis(mask, order, drop, axis=1)
        p = np.where(mask, 0.0, p)
        p /= p.sum(axis=1, keepdims=True)
    return p


def ambiguous_rows(logits: np.ndarray, s: LawSettings, noise: float) -> np.ndarray:
    """``[T]`` bool: rows whose kept set can change when every logit moves by at most ``noise``
    (a top-k gap or a top-p boundary within the noise, or tied probabilities across the cut)."""
    z = np.asarray(logits, dtype=np.float64) / float(s.temperature)  # [T, V]
    T, V = z.shape
    out = np.zeros(T, dtype=bool)
    margin = 2.0 * noise / float(s.temperature)  # scaled-logit gap the noise can close
    if s.min_p > 0.0:  # a token whose log(p / max p) is within the noise of log(min_p)
        gap = z - z.max(axis=1, keepdims=True)  # [T, V]
        out |= (np.abs(gap - math.log(s.min_p)) <= margin).any(axis=1)
        z = np.where(gap >= math.log(s.min_p), z, -np.inf)
    if s.top_k and s.top_k < V:
        top = -np.sort(-np.partition(z, V - s.top_k - 1, axis=1)[:, V - s.top_k - 1:], axis=1)  # [T, k+1] descending
        out |= top[:, s.top_k - 1] - top[:, s.top_k] <= margin
    if s.top_p < 1.0:
        p = sampling_laws(logits, LawSettings(s.temperature, s.top_k, 1.0, s.min_p))  # [T, V]
        ps = -np.sort(-p, axis=1)  # [T, V] descending
        before = np.cumsum(ps, axis=1) - ps
        rel = math.expm1(margin) + 1e-12  # relative change of any mass under the noise
        near = (np.abs(before - s.top_p) <= rel * np.maximum(before, s.top_p)) & (ps > 0)
        out |= near.any(axis=1)
        cut = (before < s.top_p).sum(axis=1)  # [T] kept count
        rows = np.arange(T)
        inside = (cut > 0) & (cut < V)
        c = np.clip(cut, 1, V - 1)
        tied = np.abs(ps[rows, c - 1] - ps[rows, c]) <= rel * ps[rows, c - 1]
        out |= inside & tied
    return out


def pit_parts(p: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(prob [T], before [T])``: each token's probability and the mass ranked before it
    (descending probability, ties by id) in its row of the laws ``p [T, V]``."""
    T, V = p.shape
    rows = np.arange(T)
    pt = p[rows, tokens]  # [T]
    higher = (p > pt[:, None]).astype(np.float64)  # [T, V]
    tie_before = (p == pt[:, None]) & (np.arange(V)[None, :] < tokens[:, None])  # [T, V]
    before = (p * (higher + tie_before)).sum(axis=1)  # [T]
    return pt, before


def greedy_gaps(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(argmax [T], gap [T])``: argmax token and top-2 raw-logit gap of each row ``[T, V]``."""
    lg = np.asarray(logits, dtype=np.float64)
    top2 = np.sort(np.partition(lg, -2, axis=1)[:, -2:], axis=1)  # [T, 2]
    return lg.argmax(axis=1), top2[:, 1] - top2[:, 0]


class ReferenceModel:
    """The target checkpoint loaded by HF transformers at float32 on CPU, for teacher forcing."""

    def __init__(self, folder: Path, threads: int = 1, dtype: str = "float32") -> None:
        import torch
        import transformers

        transformers.logging.set_verbosity_error()
        try:
            transformers.utils.logging.disable_progress_bar()
        except AttributeError:  # pragma: no cover
            pass
        torch.set_num_threads(int(threads))
        try:
            self.model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=getattr(torch, dtype))
        except Exception as exc:  # noqa: BLE001 - a model HF cannot load is bad input
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            raise InvalidInput("--model", str(folder), f"a checkpoint HF transformers loads at float32 ({first})") from None
        self.model.eval()
        self.vocab_size = int(self.model.config.vocab_size)

    def output_logits(self, prompt: Sequence[int], outputs: Sequence[Sequence[int]], *, share_prefix: bool = True) -> list[np.ndarray]:
        """Raw logits predicting each output token: one ``[len(output), V]`` float32 array per output.

        ``share_prefix``: the prompt's KV cache is computed once and shared by every output
        (one batched forward per :data:`TEACHER_BATCH` outputs); False: every output alone,
        without a cache (slow; used to measure the float32 spread across batch shapes).
        """
        import torch

        prompt = [int(t) for t in prompt]
        res: list[np.ndarray] = [np.zeros((0, self.vocab_size), np.float32)] * len(outputs)
        todo = [i for i, o in enumerate(outputs) if len(o) > 0]
        if not todo:
            return res
        with torch.no_grad():
            if not share_prefix:
                for i in todo:
                    ids = torch.tensor([prompt + [int(t) for t in outputs[i][:-1]]])  # [1, P + T - 1]
                    lg = self.model(ids).logits[0, len(prompt) - 1:]  # [T, V]
                    res[i] = lg.float().numpy()
                return res
            pre = self.model(torch.tensor([prompt]), use_cache=True)
            first = pre.logits[0, -1].float().numpy()  # [V] predicts every output's first token
            for lo in range(0, len(todo), TEACHER_BATCH):
                chunk = todo[lo: lo + TEACHER_BATCH]
                T = max(len(outputs[i]) for i in chunk)
                if T == 1:
                    for i in chunk:
                        res[i] = first[None].copy()
                    continue
                rows = [[int(t) for t in outputs[i][:-1]] for i in chunk]
                ids = torch.zeros((len(chunk), T - 1), dtype=torch.long)  # [B, T-1] right-padded
                mask = torch.zeros((len(chunk), len(prompt) + T - 1), dtype=torch.long)  # [B, P + T - 1]
                mask[:, : len(prompt)] = 1
                for j, r in enumerate(rows):
                    ids[j, : len(r)] = torch.tensor(r, dtype=torch.long)
                    mask[j, len(prompt): len(prompt) + len(r)] = 1
                cache = _repeat_cache(pre.past_key_values, len(chunk))
                lg = self.model(ids, past_key_values=cache, attention_mask=mask, use_cache=True).logits.float().numpy()  # [B, T-1, V]
                for j, i in enumerate(chunk):
                    n = len(outputs[i])
                    res[i] = np.concatenate([first[None], lg[j, : n - 1]], axis=0)  # [n, V]
        return res


def _repeat_cache(cache, n: int):
    """A copy of a batch-1 KV cache repeated to batch ``n`` (the original stays usable)."""
    import copy

    c = copy.deepcopy(cache)
    if hasattr(c, "batch_repeat_interleave"):
        c.batch_repeat_interleave(n)
        return c
    raise RuntimeError("this transformers version's cache cannot be repeated over a batch")  # pragma: no cover


def dtype_spread(ref: ReferenceModel, other: ReferenceModel, prompt: Sequence[int], outputs: Sequence[Sequence[int]]) -> float:
    """Largest |difference| between the raw logits of the same outputs under two references (the
    float32 one and one in the engines' lower dtype): the rounding spread of that dtype."""
    worst = 0.0
    for x, y in zip(ref.output_logits(prompt, outputs), other.output_logits(prompt, outputs)):
        if x.size:
            worst = max(worst, float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))))
    return worst


def measure_logit_noise(ref: ReferenceModel, prompt: Sequence[int], outputs: Sequence[Sequence[int]]) -> float:
    """Largest |difference| between the raw logits of the same outputs teacher-forced in two
    batch shapes (shared-prefix batch vs alone without a cache): the float32 spread of the
    reference itself."""
    a = ref.output_logits(prompt, outputs, share_prefix=True)
    b = ref.output_logits(prompt, outputs, share_prefix=False)
    worst = 0.0
    for x, y in zip(a, b):
        if x.size:
            worst = max(worst, float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))))
    return worst
