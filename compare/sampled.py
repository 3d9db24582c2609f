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

Catalogued alternatives (draft-model methods)
---------------------------------------------
With a draft model the draft's own law ``q_t`` at every step is known too (its checkpoint
teacher-forced the same way), so the laws of the classic ways to break lossless
speculation (SPEC §3, condition 1) are computable per token, as the fuzzer's catalogue
is for table models:

* ``resample-from-p``: on rejection the next token is drawn from ``p`` instead of the
  residual ``(p − q)+``: ``b = min(p, q) + (1 − Σ min(p, q)) · p``;
* ``no-verification``: draft tokens are emitted as drawn: ``q``.

Which output positions are draft positions (and which are the bonus token of a fully
accepted round, drawn from ``p``) cannot be seen from outside, so each alternative bets
``1 + λ (a(x)/p(x) − 1)`` per token, mixed over ``λ`` in :data:`ALT_LAMBDAS`: a test
martingale under the null whatever the rounds were (``E_p[a/p − 1] = 0``), divided by
``1 + λε`` under tolerance ε. The decision uses the mixture ``½ E_PIT + ½ mean_j E_j``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from specfuzz.compare.reference import PIT_ORDER, LawSettings, ambiguous_rows, pit_parts, sampling_laws
from specfuzz.compare.runs import Record
from specfuzz.oracle.stats import SequentialTest

PIT_BINS = 10
# The tolerance assumes logit errors up to this many times the largest spread measured.
TOLERANCE_SAFETY = 10.0
# Bet sizes of the catalogued alternatives (equal weights), see the module docstring.
ALT_LAMBDAS = (0.5, 1.0)
ALTERNATIVES = ("resample-from-p", "no-verification")


@dataclass
class PitSet:
    """PIT values (and alternative likelihood ratios) of every tested token of a set of outputs."""

    u: np.ndarray  # [tokens] in [0, 1), in generation order, samples one after the other
    samples: int
    tokens: int  # tested tokens (len(u))
    ambiguous: int  # steps left out: top-k / top-p cut not decided within the noise
    impossible: list[dict] = field(default_factory=list)  # tokens outside the kept set
    ratios: dict[str, np.ndarray] = field(default_factory=dict)  # alternative -> [tokens] a(x)/p(x)


def pit_values(records: Sequence[Record], logits: Sequence[np.ndarray], settings: LawSettings,
               noise: float, rng: np.random.Generator, draft_logits: Sequence[np.ndarray] | None = None) -> PitSet:
    """Randomized PIT of every emitted token of ``records``; ``logits[i]`` is ``[len(records[i]), V]``
    (the target's raw logits), ``draft_logits[i]`` the draft's, when there is a draft model."""
    us: list[np.ndarray] = []
    ratios: dict[str, list[np.ndarray]] = {a: [] for a in ALTERNATIVES} if draft_logits is not None else {}
    amb = 0
    impossible: list[dict] = []
    for i, (r, lg) in enumerate(zip(records, logits)):  # lg: [T, V]
        T = len(r.token_ids)
        if T == 0:
            continue
        toks = np.asarray(r.token_ids, dtype=np.int64)  # [T]
        v = rng.random(T)  # [T] drawn for every step: the randomization never depends on the data
        p = sampling_laws(lg, settings)  # [T, V]
        skip = ambiguous_rows(lg, settings, noise)  # [T]
        prob, before = pit_parts(p, toks)  # [T], [T]
        bad = (~skip) & (prob <= 0.0)
        for t in np.flatnonzero(bad):
            impossible.append({"prompt_id": r.prompt_id, "sample": r.repeat, "position": int(t), "token": int(toks[t])})
        ok = (~skip) & (prob > 0.0)
        amb += int(skip.sum())
        us.append(np.minimum(before[ok] + v[ok] * prob[ok], np.nextafter(1.0, 0.0)))
        if draft_logits is not None:
            q = sampling_laws(draft_logits[i], settings)  # [T, V] the draft's law at the same prefixes
            rows = np.arange(T)
            m = np.minimum(p, q)  # [T, V]
            beta = m.sum(axis=1)  # [T] acceptance probability of a draft token
            b = m[rows, toks] + (1.0 - beta) * prob  # [T] resample-from-p law at the emitted tokens
            with np.errstate(divide="ignore", invalid="ignore"):
                ratios["resample-from-p"].append((b / prob)[ok])
                ratios["no-verification"].append((q[rows, toks] / prob)[ok])
    u = np.concatenate(us) if us else np.zeros(0)
    return PitSet(u, len(records), int(u.shape[0]), amb, impossible,
                  {k: (np.concatenate(x) if x else np.zeros(0)) for k, x in ratios.items()})


def merge(parts: Sequence[PitSet]) -> PitSet:
    """One PitSet of several, in order."""
    u = np.concatenate([p.u for p in parts]) if parts else np.zeros(0)
    names = [k for k in ALTERNATIVES if parts and all(k in p.ratios for p in parts)]
    return PitSet(u, sum(p.samples for p in parts), int(u.shape[0]), sum(p.ambiguous for p in parts),
                  [x for p in parts for x in p.impossible], {k: np.concatenate([p.ratios[k] for p in parts]) for k in names})


# The exponent of ε is capped here: past e^50 - 1 no departure can be told apart anyway, and a
# large logit spread at a low temperature would overflow math.expm1.
MAX_TOLERANCE_EXPONENT = 50.0


def tolerance_from_noise(noise: float, temperature: float) -> tuple[float, float]:
    """``(δ, ε)``: assumed logit error and relative probability tolerance (see the module
    docstring); ε at most e^MAX_TOLERANCE_EXPONENT - 1 (a test without power)."""
    delta = TOLERANCE_SAFETY * float(noise)
    return delta, math.expm1(min(2.0 * delta / float(temperature), MAX_TOLERANCE_EXPONENT))


def alternative_log_e(ratio: np.ndarray, tolerance: float) -> float:
    """log of the λ-mixture e-process ``mean_λ Π_t (1 + λ (r_t − 1)) / (1 + λ ε)``."""
    r = np.asarray(ratio, dtype=np.float64)  # [tokens] a(x_t) / p(x_t)
    if r.size == 0:
        return 0.0
    logs = []
    for lam in ALT_LAMBDAS:
        with np.errstate(divide="ignore"):
            logs.append(float(np.sum(np.log1p(lam * (r - 1.0))) - r.size * math.log1p(lam * tolerance)))
    m = max(logs)
    if m == -math.inf:
        return -math.inf
    return m + math.log(sum(math.exp(x - m) for x in logs) / len(logs))


@dataclass
class SampledTest:
    status: str  # pass / fail / undecided
    log_e: float  # the decision's e-value: ½ PIT + ½ alternatives (PIT alone without alternatives)
    samples: int
    tokens: int
    ambiguous: int
    impossible: int
    alpha: float
    tolerance: float  # ε, relative per-token probability tolerance
    bin_tolerance: float  # ε / PIT_BINS, what the PIT e-process is given
    ks_p_value: float | None  # fixed-n Kolmogorov-Smirnov test of uniformity (information only)
    histogram: list[int]  # PIT_BINS counts
    evidence: str
    log_e_pit: float = 0.0
    log_e_alternatives: dict[str, float] = field(default_factory=dict)
    impossible_examples: list[dict] = field(default_factory=list)

    @property
    def e_value(self) -> float:
        return math.exp(self.log_e) if self.log_e < 700 else math.inf

    @property
    def driver(self) -> str:
        """The component with the most evidence (the PIT test or an alternative)."""
        comps = {"PIT": self.log_e_pit, **self.log_e_alternatives}
        return max(comps, key=lambda k: comps[k])

    def to_json(self) -> dict:
        def enc(x: float):
            return x if math.isfinite(x) else str(x)

        return {
            "status": self.status, "log_e_value": enc(self.log_e), "e_value": enc(self.e_value),
            "log_e_pit": enc(self.log_e_pit), "log_e_alternatives": {k: enc(v) for k, v in self.log_e_alternatives.items()},
            "driver": self.driver,
            "samples": self.samples, "tokens_tested": self.tokens, "ambiguous_steps_left_out": self.ambiguous,
            "impossible_tokens": self.impossible, "alpha": self.alpha, "tolerance_relative": self.tolerance,
            "tolerance_per_bin": self.bin_tolerance, "ks_p_value": self.ks_p_value, "pit_bins": PIT_BINS,
            "pit_order": PIT_ORDER, "histogram": self.histogram, "evidence": self.evidence,
            "impossible_examples": self.impossible_examples[:10],
        }


def _fmt(log_e: float) -> str:
    if log_e == math.inf:
        return "inf"
    return f"{math.exp(log_e):.3g}" if log_e < 700 else f"e^{log_e:.0f}"


def sampled_test(pits: PitSet, alpha: float, tolerance: float) -> SampledTest:
    """The anytime-valid test of "every token follows the model's law" at relative tolerance
    ``tolerance``: PIT e-process, mixed with the catalogued alternatives when given."""
    bins = np.minimum((pits.u * PIT_BINS).astype(int), PIT_BINS - 1)  # [tokens]
    hist = np.bincount(bins, minlength=PIT_BINS).tolist()
    tau = min(tolerance / PIT_BINS, 0.999)
    uniform = {(b,): 1.0 / PIT_BINS for b in range(PIT_BINS)}
    test = SequentialTest(uniform, alpha=alpha, tolerance=tau)
    test.update([(int(b),) for b in bins])
    log_pit = float(test.verdict(n_planned=len(bins)).log_e)
    alts = {k: alternative_log_e(r, tolerance) for k, r in pits.ratios.items()}
    if alts:
        parts = [math.log(0.5) + log_pit] + [math.log(0.5 / len(alts)) + v for v in alts.values()]
        m = max(parts)
        log_e = m + math.log(sum(math.exp(x - m) for x in parts)) if m > -math.inf else -math.inf
    else:
        log_e = log_pit
    ks = None
    if pits.tokens >= 2:
        from scipy.stats import kstest

        ks = float(kstest(pits.u, "uniform").pvalue)
    threshold = math.log(1.0 / alpha)
    tail = f"anytime-valid; relative tolerance {tolerance:.2g}"
    if pits.impossible:
        ex = pits.impossible[0]
        status, log_e = "fail", math.inf
        evidence = (f"{len(pits.impossible)} token(s) outside the top-k/top-p set of the model's law at steps where that "
                    f"set is decided (first: prompt {ex['prompt_id']} sample {ex['sample']} position {ex['position']} "
                    f"token {ex['token']}): impossible under the null")
    elif pits.tokens == 0:
        status, evidence = "undecided", "no token could be tested"
    elif log_e >= threshold:
        comps = {"the PIT test": log_pit, **{f"the {k} alternative": v for k, v in alts.items()}}
        drv = max(comps, key=lambda k: comps[k])
        status = "fail"
        evidence = f"e-value {_fmt(log_e)} ≥ 1/α = {1 / alpha:g} after {pits.tokens} tokens, driven by {drv} ({tail})"
    else:
        status = "pass"
        evidence = f"e-value {_fmt(log_e)} < 1/α = {1 / alpha:g} after all {pits.tokens} tokens: no evidence against the model's laws ({tail})"
    return SampledTest(status, log_e, pits.samples, pits.tokens, pits.ambiguous, len(pits.impossible), alpha, tolerance,
                       tau, ks, hist, evidence, log_pit, alts, pits.impossible)
