"""The model's own next-token laws, teacher-forced through HF transformers at float32.

For every emitted token ``x_t`` of an output, the law it should have been drawn from is
the target model's next-token distribution after exactly that prefix (prompt plus
``x_<t``) with the request's sampling settings applied. :class:`ReferenceModel` computes
the raw logits of every output position in one batched forward per prompt (the prompt's
KV cache computed once and shared by its outputs); :func:`sampling_law` applies
temperature, top-k and top-p in the order vLLM and HF transformers share for these
three settings (temperature, then top-k on the scaled logits keeping ties, then top-p on
the softmax keeping the smallest set of most probable tokens whose mass reaches
``top_p``).

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


@dataclass(frozen=True)
class LawSettings:
    """The sampling settings ``specfuzz compare`` applies (and the laws follow)."""

    temperature: float  # > 0 for a law (greedy has none)
    top_k: int = 0  # 0 = off
    top_p: float = 1.0

    def to_json(self) -> dict:
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}


@dataclass(frozen=True)
class StepLaw:
    """The law at one output position and where the emitted token falls in it."""

    prob: float  # p(x_t) under the law (0: outside the kept set)
    before: float  # mass of the tokens ranked before x_t (PIT order)
    ambiguous: bool  # the kept set is not decided within the noise
    top1: int  # argmax token of the raw logits
    gap: float  # raw-logit gap between the two largest logits (greedy near-ties)


def sampling_law(logits: np.ndarray, s: LawSettings) -> tuple[np.ndarray, np.ndarray]:
    """``(probs [V] float64, kept [V] bool)`` of one raw-logits row ``[V]`` under ``s``."""
    z = np.asarray(logits, dtype=np.float64) / float(s.temperature)  # [V]
    kept = np.ones(z.shape[0], dtype=bool)  # [V]
    if s.top_k and s.top_k < z.shape[0]:
        kth = np.partition(z, -s.top_k)[-s.top_k]
        kept &= z >= kth  # ties at the k-th value are kept (vLLM and HF both do)
    zm = np.where(kept, z, -np.inf)  # [V]
    p = np.exp(zm - zm.max())
    p /= p.sum()
    if s.top_p < 1.0:
        order = np.lexsort((np.arange(p.shape[0]), -p))  # [V] descending, ties by id
        before = np.cumsum(p[order]) - p[order]  # [V] mass ranked before each
        drop = order[before >= s.top_p]
        kept[drop] = False
        p[drop] = 0.0
        p /= p.sum()
    return p, kept


def _ambiguous(logits: np.ndarray, s: LawSettings, noise: float) -> bool:
    """Whether a perturbation of every logit by at most ``noise`` can change the kept set."""
    if s.top_k == 0 and s.top_p >= 1.0:
        return False
    z = np.asarray(logits, dtype=np.float64) / float(s.temperature)
    margin = 2.0 * noise / float(s.temperature)  # scaled-logit gap that noise can close
    if s.top_k and s.top_k < z.shape[0]:
        top = np.sort(np.partition(z, -(s.top_k + 1))[-(s.top_k + 1):])[::-1]  # [k+1] descending
        if top[s.top_k - 1] - top[s.top_k] <= margin:
            return True
    if s.top_p < 1.0:
        p, kept = sampling_law(logits, LawSettings(s.temperature, s.top_k, 1.0))
        order = np.lexsort((np.arange(p.shape[0]), -p))
        before = np.cumsum(p[order]) - p[order]
        rel = math.expm1(margin) + 1e-12  # relative change of any probability mass under the noise
        near = np.abs(before - s.top_p) <= rel * np.maximum(before, s.top_p)
        if near[p[order] > 0].any():
            return True
        # Tied probabilities across the cut: the kept set depends on an unspecified order.
        cut = int(np.searchsorted(before, s.top_p, side="left"))
        if 0 < cut < p.shape[0] and abs(p[order][cut - 1] - p[order][cut]) <= rel * p[order][cut - 1]:
            return True
    return False


def step_law(logits: np.ndarray, token: int, s: LawSettings | None, noise: float) -> StepLaw:
    """Where ``token`` falls in the law of one raw-logits row (``s`` None: greedy, no law)."""
    row = np.asarray(logits, dtype=np.float64)  # [V]
    top2 = np.partition(row, -2)[-2:]
    gap = float(top2[1] - top2[0])
    top1 = int(np.argmax(row))
    if s is None:
        return StepLaw(1.0 if token == top1 else 0.0, 0.0, False, top1, gap)
    p, _ = sampling_law(row, s)
    if not 0 <= token < p.shape[0]:
        return StepLaw(0.0, 0.0, False, top1, gap)
    # Mass ranked before the token in PIT order: larger probability, or equal with a smaller id.
    pt = p[token]
    before = float(p[p > pt].sum() + p[:token][p[:token] == pt].sum())
    return StepLaw(float(pt), before, _ambiguous(row, s, noise), top1, gap)


class ReferenceModel:
    """The target checkpoint loaded by HF transformers at float32 on CPU, for teacher forcing."""

    def __init__(self, folder: Path, threads: int = 1) -> None:
        import torch
        import transformers

        transformers.logging.set_verbosity_error()
        try:
            transformers.utils.logging.disable_progress_bar()
        except AttributeError:  # pragma: no cover
            pass
        torch.set_num_threads(int(threads))
        try:
            self.model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
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
