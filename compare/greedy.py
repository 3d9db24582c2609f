"""The greedy report: speculative vs baseline outputs at temperature 0, prompt by prompt.

Speculative decoding is lossless, so at temperature 0 a correct engine returns the
baseline's output token for token, except where float rounding flips an argmax between
two (nearly) tied logits: the verifier scores K+1 positions in one batched forward while
the baseline decodes one token at a time, and float32 kernels are not bit-exact across
those shapes. This module measures what differs and sorts every difference into

* ``nondeterministic``: the prompt's output also varies between baseline repeats (the
  engine's own nondeterminism, not speculation);
* ``near-tie``: at the first divergence the reference model's two largest logits are
  within the tie threshold (rounding can explain the flip);
* ``speculation``: neither: speculation changed the output.

Self-draft (the target drafting for itself) must accept every draft token and reproduce
the baseline exactly; anything else not explained as a near-tie is flagged as a
verification bug.
"""

from __future__ import annotations

import difflib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from specfuzz.compare.prompts import EncodedPrompt
from specfuzz.compare.runs import Record

# Share of differing prompts above which the report flags speculation (issue: "1-2%").
FLAG_DIFFER_RATE = 0.02
NOTE_DIFFER_RATE = 0.01
# Acceptance below this gets a warning.
LOW_ACCEPTANCE = 0.5
# The Wilcoxon signed-rank test runs when at least this many pairs differ.
WILCOXON_MIN_PAIRS = 6
# A divergence is a near-tie when the reference's top-2 logit gap there is below
# max(NEAR_TIE_FLOOR, NEAR_TIE_FACTOR x the measured logit noise).
NEAR_TIE_FLOOR = 1e-4
NEAR_TIE_FACTOR = 20.0


def edit_distance(a: Sequence[int], b: Sequence[int]) -> int:
    """Levenshtein distance between two token sequences (insert, delete, substitute: 1 each)."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, y in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y))
        prev = cur
    return prev[-1]


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where two outputs differ (None when equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass(frozen=True)
class PromptDiff:
    prompt_id: str
    kind: str
    length: str
    similarity: float  # difflib ratio of the texts
    differing_tokens: int  # positions (aligned) where the token ids differ, length difference included
    edit_distance: int  # token-level Levenshtein distance
    first_divergence: int
    baseline_len: int
    speculative_len: int
    cause: str  # "nondeterministic", "near-tie", "speculation"
    gap: float | None  # reference top-2 logit gap at the divergence
    baseline_text: str
    speculative_text: str

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class GreedyReport:
    method: str
    prompts: int
    matches: int
    diffs: list[PromptDiff]
    by_group: dict[str, dict[str, float]]
    wilcoxon: dict | None
    baseline_varying: list[str]  # prompts whose baseline output varies across repeats
    speculative_varying: list[str]
    repeats: int
    repeat_prompts: int
    acceptance: float | None  # accepted / drafted over the greedy run (engine metrics, else estimated)
    drafted: int | None
    accepted: int | None
    tie_threshold: float
    flags: list[str] = field(default_factory=list)
    acceptance_source: str = "engine"  # "engine" (its own counters), "estimated" (replayed), "none"

    @property
    def match_rate(self) -> float:
        return self.matches / self.prompts if self.prompts else float("nan")

    def to_json(self) -> dict:
        return {
            "method": self.method, "prompts": self.prompts, "exact_matches": self.matches, "exact_match_rate": self.match_rate,
            "differences": [d.to_json() for d in self.diffs], "by_group": self.by_group, "wilcoxon": self.wilcoxon,
            "baseline_varying": self.baseline_varying, "speculative_varying": self.speculative_varying,
            "repeats": self.repeats, "repeat_prompts": self.repeat_prompts, "acceptance": self.acceptance,
            "drafted": self.drafted, "accepted": self.accepted, "acceptance_source": self.acceptance_source,
            "tie_threshold": self.tie_threshold, "flags": self.flags,
        }


def acceptance(records: Sequence[Record]) -> tuple[float | None, int | None, int | None]:
    """accepted / drafted summed over records that carry engine metrics (None if none do)."""
    have = [r for r in records if r.num_draft_tokens is not None and r.num_accepted_tokens is not None]
    if not have:
        return None, None, None
    d = sum(int(r.num_draft_tokens) for r in have)
    a = sum(int(r.num_accepted_tokens) for r in have)
    return (a / d if d else None), d, a


def replay_greedy_acceptance(outputs: Sequence[Sequence[int]], draft_argmax: Sequence[Sequence[int]], k: int) -> tuple[int, int]:
    """``(drafted, accepted)`` of greedy chain drafting with ``k`` tokens per round, replayed
    on the emitted outputs: ``draft_argmax[i][t]`` is the draft's argmax after the prompt and
    ``outputs[i][:t]`` (teacher-forced). Exact for greedy drafts verified greedily: a draft
    token is proposed from a prefix that equals the output as long as the round's earlier
    drafts were accepted. Used when an engine exposes no acceptance counters."""
    drafted = accepted = 0
    for out, am in zip(outputs, draft_argmax):
        t, n = 0, len(out)
        while t < n - 1:  # a round needs a next token to verify against
            got = 0
            while got < k and t + got < n and int(am[t + got]) == int(out[t + got]):
                got += 1
            drafted += k
            accepted += got
            t += got + 1
    return drafted, accepted


def varying(records: Sequence[Record]) -> list[str]:
    """Prompt ids whose greedy output is not the same in every repeat."""
    seen: dict[str, set] = defaultdict(set)
    reps: dict[str, int] = defaultdict(int)
    for r in records:
        seen[r.prompt_id].add(r.token_ids)
        reps[r.prompt_id] += 1
    return sorted(p for p, outs in seen.items() if reps[p] > 1 and len(outs) > 1)


def _wilcoxon(base: Sequence[int], spec: Sequence[int]) -> dict | None:
    """Paired output lengths (tokens): does speculation shift them? (zeros dropped)."""
    d = np.asarray(spec, dtype=float) - np.asarray(base, dtype=float)
    nz = int(np.count_nonzero(d))
    if nz < WILCOXON_MIN_PAIRS:
        return {"applies": False, "why": f"{nz} prompts with different output lengths (needs >= {WILCOXON_MIN_PAIRS})"}
    from scipy.stats import wilcoxon

    r = wilcoxon(d, zero_method="wilcox")
    return {"applies": True, "measure": "output length (tokens), speculative - baseline", "pairs": nz,
            "statistic": float(r.statistic), "p_value": float(r.pvalue), "median_difference": float(np.median(d[d != 0]))}


def greedy_report(method: str, prompts: Sequence[EncodedPrompt], baseline: Sequence[Record], speculative: Sequence[Record],
                  gaps: Mapping[str, float], noise: float, repeats: int, repeat_prompts: int, self_draft: bool) -> GreedyReport:
    """Compare repeat 0 of each prompt; ``gaps``: reference top-2 logit gap at each differing
    prompt's first divergence (from :mod:`specfuzz.compare.reference`)."""
    base0 = {r.prompt_id: r for r in baseline if r.repeat == 0}
    spec0 = {r.prompt_id: r for r in speculative if r.repeat == 0}
    bvar, svar = varying(baseline), varying(speculative)
    tie = max(NEAR_TIE_FLOOR, NEAR_TIE_FACTOR * noise)
    diffs: list[PromptDiff] = []
    groups: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    matches = 0
    for p in prompts:
        b, s = base0[p.id], spec0[p.id]
        same = b.token_ids == s.token_ids
        matches += same
        for g in (f"length={p.length}", f"kind={p.prompt.kind}"):
            groups[g][0] += 1
            groups[g][1] += 0 if same else 1
        if same:
            continue
        fd = first_divergence(b.token_ids, s.token_ids)
        n = max(len(b.token_ids), len(s.token_ids))
        differing = sum(1 for i in range(n) if i >= len(b.token_ids) or i >= len(s.token_ids) or b.token_ids[i] != s.token_ids[i])
        gap = gaps.get(p.id)
        if p.id in bvar:
            cause = "nondeterministic"
        elif gap is not None and gap <= tie:
            cause = "near-tie"
        else:
            cause = "speculation"
        diffs.append(PromptDiff(p.id, p.prompt.kind, p.length, difflib.SequenceMatcher(None, b.text, s.text).ratio(), differing,
                                edit_distance(b.token_ids, s.token_ids), int(fd), len(b.token_ids), len(s.token_ids), cause,
                                gap, b.text, s.text))
    by_group = {g: {"prompts": n, "differing": d, "differ_rate": d / n} for g, (n, d) in sorted(groups.items())}
    wil = _wilcoxon([len(base0[p.id].token_ids) for p in prompts], [len(spec0[p.id].token_ids) for p in prompts])
    acc, drafted, accepted = acceptance([r for r in speculative if r.repeat == 0])
    rep = GreedyReport(method, len(prompts), matches, diffs, by_group, wil, bvar, svar, repeats, repeat_prompts, acc,
                       drafted, accepted, tie)
    rate = 1.0 - rep.match_rate if prompts else 0.0
    by_spec = [d for d in diffs if d.cause == "speculation"]
    if rate > FLAG_DIFFER_RATE:
        rep.flags.append(f"{rate:.1%} of prompts differ from the baseline (more than {FLAG_DIFFER_RATE:.0%}); "
                         f"{len(by_spec)} not explained by nondeterminism or a near-tie")
    elif rate > NOTE_DIFFER_RATE:
        rep.flags.append(f"{rate:.1%} of prompts differ from the baseline (more than {NOTE_DIFFER_RATE:.0%})")
    if acc is not None and acc < LOW_ACCEPTANCE and not self_draft:
        rep.flags.append(f"low acceptance: {acc:.1%} of draft tokens accepted (below {LOW_ACCEPTANCE:.0%})")
    if self_draft:
        if acc is not None and accepted != drafted:
            rep.flags.append(f"self-draft accepted {accepted} of {drafted} draft tokens ({acc:.2%}), not 100%: the draft "
                             "(the target itself, run in other batch shapes) and the verifier disagreed on some argmax" + (
                                 "; every output still equals the baseline's (float near-ties, not a verification bug)"
                                 if not by_spec else " — verification bug?"))
        if by_spec:
            rep.flags.append(f"VERIFICATION BUG? self-draft output differs from the baseline on {len(by_spec)} prompt(s) "
                             "without a near-tie or baseline nondeterminism to explain it")
    if svar:
        rep.flags.append(f"speculative output varies between repeats on {len(svar)} prompt(s)")
    return rep
