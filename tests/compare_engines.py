"""Engines for the ``specfuzz compare`` power check (tests/test_compare.py).

:class:`ResampleFromPHF` is HF transformers' own assisted generation with one deliberate
bug in its verification step: on rejection the next token is drawn from the target's law
``p`` instead of the normalised residual ``(p - q)+`` (SPEC §3, condition 1). Everything
else (drafting, KV caches, logits processors, acceptance test) is HF's. The verification
function below is written for this test from Leviathan et al.'s algorithm; it replaces
``transformers.generation.utils._speculative_sampling`` only while this engine generates.
"""

from __future__ import annotations

import contextlib
from typing import Sequence

from specfuzz.engines.base import Completion, Request
from specfuzz.engines.hf_engine import HFEngine


def resample_from_p(candidate_input_ids, candidate_logits, candidate_length, new_logits, assistant_ensemble_weight=None):
    """Token-wise verification of ``candidate_length`` draft tokens that resamples from ``p``
    (not the residual) after a rejection. Same arguments and results as HF's function."""
    import torch

    drafts = candidate_input_ids[0, -candidate_length:]  # [K]
    q = candidate_logits[0].softmax(dim=-1)  # [K, V] the draft's (processed) laws
    p = new_logits[0].softmax(dim=-1)  # [K + 1, V] the target's
    k = torch.arange(candidate_length)
    ratio = p[k, drafts] / q[k, drafts]  # [K]
    accepted = torch.rand(candidate_length, device=ratio.device) <= ratio  # [K]
    n = int(torch.cumprod(accepted.long(), dim=0).sum())  # drafts accepted before the first rejection
    # The bug: the token after the accepted drafts comes from p even when a draft was rejected.
    nxt = torch.multinomial(p[n], num_samples=1)  # [1]
    tokens = torch.cat([drafts[:n], nxt])[None, :]  # [1, n + 1]
    return tokens, torch.tensor(n)


@contextlib.contextmanager
def _patched_verification():
    import transformers.generation.utils as gen_utils

    original = gen_utils._speculative_sampling
    gen_utils._speculative_sampling = resample_from_p
    try:
        yield
    finally:
        gen_utils._speculative_sampling = original


class ResampleFromPHF(HFEngine):
    """HF assisted generation whose rejection step resamples from p (a deliberate bug)."""

    name = "hf-resample-from-p"

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        with _patched_verification():
            return super().generate(requests)

    def version(self):
        return {**dict(super().version()), "name": self.name, "bug": "rejection resamples from p, not the residual"}
