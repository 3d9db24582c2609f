"""The sampled test: do speculative samples follow the model's own next-token laws?

At temperature > 0 two runs differ by design, so comparing strings says nothing. What
lossless speculation promises is a *law*: every emitted token ``x_t`` is drawn from the
target's next-token distribution ``p_t`` after exactly the prefix emitted so far, with
the request's temperature / top-k / top-p applied. The reference laws come from
:mod:`specfuzz.compare.reference` (HF transformers, float32, teacher-forced).

Randomized probability integral transform (PIT)
-----------------------------------------------
Order the vocabulary by :data:`~specfuzz.compare.reference.PIT_ORDER` and let ``F_t(x-)``
be the mass ranked before ``x``. With ``V_t`` an independent uniform,
``U_t = F_t(x_t-) + V_t · p_t(x_t)`` is exactly Uniform(0, 1) when ``x_t ~ p_t``, and
the ``U_t`` of successive tokens (and of independent samples) are independent
(Rosenblatt): under the null the whole stream of PIT values is i.i.d. uniform, whatever
the prompts, prefixes and lengths. A broken sampler that favours some tokens shifts mass
inside ``[0, 1]``; ranking by probability puts "too many likely tokens" near 0 and "too
many unlikely ones" near 1.

Anytime-valid test
------------------
The PIT values, cut into :data:`PIT_BINS` equal bins, are fed one at a time to the
project's e-process (:class:`specfuzz.oracle.stats.SequentialTest`, Krichevsky–Trofimov
predictive bets plus a sparse mixture) against the uniform law on the bins. Under the
null its e-value is a test supermartingale: ``fail`` when it reaches ``1/α`` is a
level-α decision however often one looks.

Tolerance (float32 is not bit-exact)
------------------------------------
The engine's logits and the reference's differ in their last bits (other kernels, other
batch shapes). If every logit is within ``δ`` of the reference, every probability is
within a factor ``exp(±2δ/T)`` of it, the PIT density is within ``1 ± ε`` with
``ε = exp(2δ/T) − 1``, and each bin's probability is within ``ε / PIT_BINS`` of uniform:
the test runs at that per-bin tolerance (the e-process is valid for every law in the
tolerant set). ``δ`` is :data:`TOLERANCE_SAFETY` times the largest logit spread
measured; steps whose top-k / top-p cut is not decided within ``δ`` are left out
(:mod:`~specfuzz.compare.reference`). A token outside the reference's kept set at a step
that is not ambiguous is impossible under the null: infinite evidence.

Calibration: the same test on samples from the same engine with speculation off must
pass; if it does not, the reference does not describe this engine's sampler and the
speculative verdict says so instead of blaming speculation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from specfuzz.compare.reference import PIT_ORDER, LawSettings, step_law
from specfuzz.compare.runs import Record
from specfuzz.oracle.stats import SequentialTest

PIT_BINS = 20
# The tolerance assumes logit errors up to this many times the largest spread measured.
TOLERANCE_SAFETY = 10.0


@dataclass
class PitSet:
    """PIT values of every tested token of a set of sampled outputs."""

    u: np.ndarray  # [tokens] in [0, 1), in generation order, samples one after the other
    samples: int
    tokens: int  # tested tokens (len(u))
    ambiguous: int  # steps left out: top-k / top-p cut not decided within the noise
    impossible: list[dict] = field(default_factory=list)  # tokens outside the kept set


def pit_values(records: Sequence[Record], logits: Sequence[np.ndarray], settings: LawSettings,
               noise: float, rng: np.random.Generator) -> PitSet:
    """Randomized PIT of every emitted token of ``records``; ``logits[i]`` is ``[len(records[i]), V]``."""
    us: list[float] = []
    amb = 0
    impossible: list[dict] = []
    for r, lg in zip(records, logits):  # lg: [T, V]
        for t, tok in enumerate(r.token_ids):
            law = step_law(lg[t], int(tok), settings, noise)
            v = float(rng.random())  # drawn for every step: the randomization never depends on the data
            if law.ambiguous:
                amb += 1
                continue
            if law.prob <= 0.0:
                impossible.append({"prompt_id": r.prompt_id, "sample": r.repeat, "position": t, "token": int(tok)})
                continue
            us.append(min(law.before + v * law.prob, math.nextafter(1.0, 0.0)))
    return PitSet(np.asarray(us, dtype=np.float64), len(records), len(us), amb, impossible)


def merge(parts: Sequence[PitSet]) -> PitSet:
    """One PitSet of several, in order."""
    u = np.concatenate([p.u for p in parts]) if parts else np.zeros(0)
    return PitSet(u, sum(p.samples for p in parts), int(u.shape[0]), sum(p.ambiguous for p in parts),
                  [x for p in parts for x in p.impossible])


def tolerance_from_noise(noise: float, temperature: float) -> tuple[float, float]:
    """``(δ, ε)``: assumed logit error and relative probability tolerance (see the module docstring)."""
    delta = TOLERANCE_SAFETY * float(noise)
    return delta, math.expm1(2.0 * delta / float(temperature))


@dataclass
class SampledTest:
    status: str  # pass / fail / undecided
    log_e: float
    samples: int
    tokens: int
    ambiguous: int
    impossible: int
    alpha: float
    tolerance: float  # ε, relative per-token probability tolerance
    bin_tolerance: float  # ε / PIT_BINS, what the e-process is given
    ks_p_value: float | None  # fixed-n Kolmogorov-Smirnov test of uniformity (information only)
    histogram: list[int]  # PIT_BINS counts
    evidence: str
    impossible_examples: list[dict] = field(default_factory=list)

    @property
    def e_value(self) -> float:
        return math.exp(self.log_e) if self.log_e < 700 else math.inf

    def to_json(self) -> dict:
        return {
            "status": self.status, "log_e_value": self.log_e, "e_value": self.e_value if math.isfinite(self.e_value) else "inf",
            "samples": self.samples, "tokens_tested": self.tokens, "ambiguous_steps_left_out": self.ambiguous,
            "impossible_tokens": self.impossible, "alpha": self.alpha, "tolerance_relative": self.tolerance,
            "tolerance_per_bin": self.bin_tolerance, "ks_p_value": self.ks_p_value, "pit_bins": PIT_BINS,
            "pit_order": PIT_ORDER, "histogram": self.histogram, "evidence": self.evidence,
            "impossible_examples": self.impossible_examples[:10],
        }


def sampled_test(pits: PitSet, alpha: float, tolerance: float) -> SampledTest:
    """The anytime-valid test of "PIT values are uniform" at relative tolerance ``tolerance``."""
    bins = np.minimum((pits.u * PIT_BINS).astype(int), PIT_BINS - 1)  # [tokens]
    hist = np.bincount(bins, minlength=PIT_BINS).tolist()
    tau = min(tolerance / PIT_BINS, 0.999)
    uniform = {(b,): 1.0 / PIT_BINS for b in range(PIT_BINS)}
    test = SequentialTest(uniform, alpha=alpha, tolerance=tau)
    test.update([(int(b),) for b in bins])
    v = test.verdict(n_planned=len(bins))
    ks = None
    if pits.tokens >= 2:
        from scipy.stats import kstest

        ks = float(kstest(pits.u, "uniform").pvalue)
    status, log_e, evidence = v.status, float(v.log_e), v.evidence
    if pits.impossible:
        ex = pits.impossible[0]
        status, log_e = "fail", math.inf
        evidence = (f"{len(pits.impossible)} token(s) outside the top-k/top-p set of the model's law at steps where that "
                    f"set is decided (first: prompt {ex['prompt_id']} sample {ex['sample']} position {ex['position']} "
                    f"token {ex['token']}): impossible under the null")
    elif pits.tokens == 0:
        status, evidence = "undecided", "no token could be tested"
    else:
        evidence = evidence.replace("samples", "tokens")
    return SampledTest(status, log_e, pits.samples, pits.tokens, pits.ambiguous, len(pits.impossible), alpha, tolerance,
                       tau, ks, hist, evidence, pits.impossible)
