"""Reference speculative sampler, and the exact law of every catalogued bug.

One implementation of a speculation *round* (draft, verify, commit) serves two drivers:

* :class:`MonteCarloDriver` answers the round's random requests with a numpy RNG:
  this is the reference engine that produces samples;
* :class:`ExactDriver` answers them by enumerating every branch with its exact
  probability: this computes the law of the whole generation process, so the law of
  a correct configuration (which must equal μ) and the bug law μD of every injected
  bug class are *computed*, not estimated.

A round asks for randomness through two requests only:

* ``Draw(probs)`` — a categorical draw (draft tokens, residual / bonus tokens, the
  cumulative coin of tree verification);
* ``Coin(threshold, slot)`` — ``u < threshold`` for a uniform ``u``; ``slot=None`` is a
  fresh uniform, an integer slot is the uniform of that draft slot, which the N1 bug
  draws once per request and reuses every round. The exact driver tracks, per slot, the
  interval of uniform values consistent with the history, so reuse is computed exactly.

Correct algorithms (SPEC §3):

* chain drafts, token-wise verification (Leviathan et al. 2023): accept draft ``d`` at
  position i with probability ``min(1, p_i(d)/q_i(d))``; on rejection sample the
  normalised residual ``(p_i - q_i)+``; after K acceptances sample a bonus token from
  ``p_{K+1}``. Point-mass drafts (n-gram / prompt lookup, greedy drafters) are the case
  ``q_i = one-hot(d_i)``.
* chain drafts, block verification (Sun et al. 2024, arXiv 2403.10444, Algorithm 2):
  weights ``w_0 = 1, w_i = min(1, w_{i-1} p_i(d_i)/q_i(d_i))``, stopping probabilities
  ``h_i = r_i / (r_i + 1 - w_i)`` with ``r_i = Σ_x (w_i p_{i+1}(x) - q_{i+1}(x))+`` for
  i < K and ``h_K = w_K``; ``τ = max{i : η_i <= h_i}``; keep ``d_1..d_τ`` and sample the
  next token from ``p_{K+1}`` if τ = K, else from ``(w_τ p_{τ+1} - q_{τ+1})+`` normalised.
* deterministic trees (EAGLE top-k trees, n-gram trees): at each node one uniform is
  compared with the cumulative target mass of the node's distinct children; the child
  whose interval holds it is accepted, otherwise the token is drawn from p restricted to
  non-children. This samples p exactly because the children are distinct.

At verification position i every logits processor sees the committed output plus the
i uncommitted draft tokens before it (condition 2): the target conditional is always
evaluated on the full prefix. Bugs are injected by the switches in :data:`BUG_CLASSES`
(the published catalogue N1-N7) and :data:`specfuzz.oracle.mutants.MUTANTS` (the time-to-bug bench's mutants, each
acting in exactly one speculation event of :mod:`specfuzz.oracle.events`).

Events. With ``record_events=True`` a round also lists the speculation events it went
through (``RoundResult.events``: ``reject@2``, ``bonus@3``, ``lag:min_tokens``, ...; the
catalogue is :data:`specfuzz.oracle.events.EVENTS`). Recording draws no randomness, so a
recorded run samples exactly as an unrecorded one. The drivers live in
:mod:`specfuzz.oracle.drivers` (re-exported here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generator, Mapping, Protocol, Sequence

import numpy as np

from specfuzz.errors import AmbiguousSemantics, InvalidInput
from specfuzz.oracle.spec_config import (  # noqa: F401  (re-exported)
    BUG_CLASSES, CHAIN_DRAFT_METHODS, CHAIN_METHODS, DRAFT_SAMPLING, ENGINE_METHODS, METHODS, PLACEHOLDER_TOKEN_ID,
    TREE_PAD_TOKEN_ID, VERIFY_MODES, DraftModel, SpecConfig,
)

# A residual (p - q)+ of total mass below this is "small" (event residual_small).
RESIDUAL_SMALL_MASS = 0.05
# Coin slot of a uniform shared by the acceptance tests of one round (mutant M16); the
# drivers forget it at the end of the round.
ROUND_SLOT = -1


class TargetLawLike(Protocol):
    vocab_size: int

    def conditional(self, out: tuple[int, ...], stale: Mapping[str, int] = ...) -> np.ndarray: ...

    def is_terminal(self, out: tuple[int, ...]) -> bool: ...


# ----------------------------------------------------------------------------- random requests


@dataclass(frozen=True)
class Draw:
    probs: np.ndarray  # [n] non-negative, sums to 1


@dataclass(frozen=True)
class Coin:
    threshold: float  # the round asks whether u < threshold
    slot: int | None = None  # None: a fresh uniform; int: the (possibly reused) uniform of that slot


RoundGen = Generator[object, object, None]


@dataclass
class RoundResult:
    emitted: list[int] = field(default_factory=list)
    done: bool = False
    accepted: int = 0  # draft tokens accepted this round
    proposed: int = 0  # draft tokens proposed this round
    events: list[str] = field(default_factory=list)  # with record_events: the events this round went through
    coined: list[int] = field(default_factory=list)  # with record_events: slots of its probabilistic acceptance tests
    # Set by the driver: the slots the earlier rounds of this output tested with a coin (event coin_reused).
    coined_before: frozenset[int] = frozenset()
    # Set by the round: draft slots from here on are accepted untested (mutant M14's padding).
    untested_from: int | None = None


# ----------------------------------------------------------------------------- the round


def _normalise(v: np.ndarray) -> np.ndarray | None:  # [W] -> [W] or None when the mass is 0
    s = float(v.sum())
    if not s > 0:
        return None
    return v / s


class SpeculativeProcess:
    """The generation process of one request under a speculative configuration.

    ``round(committed, result)`` is a generator that yields :class:`Draw` / :class:`Coin`
    requests and fills ``result``. It is pure apart from those requests, so the exact
    driver can replay it along every branch.
    """

    def __init__(
        self,
        target: TargetLawLike,
        prompt: Sequence[int],
        max_tokens: int,
        spec: SpecConfig,
        draft: DraftModel | None = None,
        temperature: float = 1.0,
        *,
        record_events: bool = False,
        untruncated: TargetLawLike | None = None,
    ) -> None:
        self.target = target
        self.prompt = tuple(int(t) for t in prompt)
        self.max_tokens = int(max_tokens)
        self.spec = spec
        self.draft = draft
        self.V = int(target.vocab_size)
        if spec.method not in METHODS:
            raise InvalidInput("method", spec.method, f"one the reference sampler runs: {METHODS}")
        if spec.uses_draft_model:
            if draft is None:
                raise InvalidInput("draft", None, f"a DraftModel for method {spec.method!r}")
            tab = np.asarray(draft.table)
            if tab.ndim != 2 or not np.all(np.isfinite(tab) | (tab == -np.inf)) or np.any(np.isnan(tab)):
                raise InvalidInput("draft table", getattr(tab, "shape", tab), "a 2-D array of finite logits (or -inf)")
            need_rows = max(self.V, draft.vocab_size)
            if tab.shape[0] < need_rows:
                raise InvalidInput(
                    "draft table rows", tab.shape[0],
                    f">= max(target vocab {self.V}, draft vocab {draft.vocab_size}) = {need_rows}: the drafter must read every token of its context",
                )
            if spec.is_tree and draft.vocab_size > self.V:
                raise InvalidInput("draft vocab", draft.vocab_size, f"<= target vocab {self.V} for tree drafts (a reduced draft vocabulary)")
            t_ids = draft.target_ids()
            if t_ids.shape != (draft.vocab_size,) or len(set(t_ids.tolist())) != draft.vocab_size or t_ids.min() < 0:
                raise InvalidInput("d2t", draft.d2t, f"{draft.vocab_size} distinct non-negative target ids")
            self._d2t = t_ids  # [V_draft]
            self._W = max(self.V, int(t_ids.max()) + 1)  # width of the verification rows
            dt = spec.draft_temperature or (temperature if temperature >= 1e-5 else 1.0)
            self._draft_logits = tab.astype(np.float64) / dt  # [R, V_draft]
        else:
            self._W = self.V
        self._qcache: dict[tuple[int, ...], np.ndarray] = {}
        self._pcache: dict[tuple[tuple[int, ...], int], np.ndarray] = {}
        # Target ids a narrower draft cannot propose [W] (N5, N7, events outside_draft/narrow_lag).
        self._outside = np.zeros(self._W, dtype=bool)
        if draft is not None:
            self._outside[: self.V] = True
            self._outside[self._d2t[self._d2t < self.V]] = False
        self._narrow = bool(self._outside.any())
        self.record_events = bool(record_events)
        params = getattr(target, "params", None)
        active = {} if params is None else {
            "min_tokens": params.min_tokens > 0,
            "thinking": params.thinking_budget is not None,
            "penalties": params.repetition_penalty != 1.0 or params.frequency_penalty != 0.0 or params.presence_penalty != 0.0,
            "bad_words": bool(params.bad_words),
            "constraint": params.regex is not None or params.choice is not None,
        }
        known = getattr(getattr(target, "profile", None), "processors", ())
        # Stateful processors of this request whose view could lag behind the drafts (events lag:<name>).
        self._lag_processors = tuple(n for n, on in active.items() if on and n in known)
        self._penalised = bool(active.get("penalties"))
        # The law without top-k/top-p/min-p (event draft_truncated, mutant M12).
        if untruncated is None and (record_events or spec.inject == "M12") and hasattr(target, "untruncated"):
            untruncated = target.untruncated()
        self._untruncated = untruncated

    # -- distributions -----------------------------------------------------------------

    def p_at(self, out: tuple[int, ...], lag: int) -> np.ndarray:
        """Target distribution at the position after ``out`` (``lag`` uncommitted drafts). [W]"""
        key = (out, lag)
        hit = self._pcache.get(key)
        if hit is not None:
            return hit
        W = self._W
        if any(t < 0 or t >= self.V for t in out):
            # A stray id (only after an injected bug emitted it): the output has ended.
            row = np.zeros(W)
            row[0] = 1.0
        else:
            # Past a stop token or max_tokens the values cannot change the emitted tokens'
            # law under correct verification, but block verification's stopping weights
            # read them, and so does a buggy verifier: use what an engine computes there,
            # the table's real next-token distribution.
            stale = {}
            if self.spec.inject == "N2" and lag:
                stale["min_tokens"] = lag
            elif self.spec.inject == "N3" and lag:
                stale["thinking"] = lag
            elif self.spec.inject == "M11" and lag:
                stale["penalties"] = lag
            try:
                p = np.asarray(self.target.conditional(out, stale) if stale else self.target.conditional(out), dtype=np.float64)
            except AmbiguousSemantics:
                # Only prefixes of probability 0 or past the end of the output get here
                # (the law raises on reachable ones before any sampling); use a fixed
                # absorbing distribution.
                p = np.zeros(self.V)
                p[out[-1] if out else 0] = 1.0
            row = np.zeros(W)
            row[: self.V] = p
            if self.spec.inject == "N5" and self.draft is not None and self.draft.vocab_size < self.V:
                cut = row.copy()
                cut[self.draft.vocab_size :] = 0.0
                n = _normalise(cut)
                if n is None:  # all target mass beyond the cut: argmax of the cut logits is token 0
                    n = np.zeros(W)
                    n[0] = 1.0
                row = n
        self._pcache[key] = row
        return row

    def q_at(self, context_tail: int, depth_key: tuple[int, ...]) -> np.ndarray:
        """Draft distribution in *draft* ids after a context ending in ``context_tail``. [V_draft]"""
        key = (context_tail,)
        hit = self._qcache.get(key)
        if hit is not None:
            return hit
        logits = self._draft_logits[context_tail]  # [V_draft]
        m = np.max(logits)
        e = np.exp(logits - m) if np.isfinite(m) else np.zeros_like(logits)
        q = e / e.sum()
        self._qcache[key] = q
        return q

    def _to_target_width(self, q_draft: np.ndarray) -> np.ndarray:  # [V_draft] -> [W]
        row = np.zeros(self._W)
        row[self._d2t] = q_draft
        return row

    # -- proposers -----------------------------------------------------------------------

    def ngram_proposal(self, ctx: tuple[int, ...]) -> list[int]:
        """Prompt-lookup drafts: the tokens after the latest earlier match of the longest suffix."""
        K = self.spec.num_speculative_tokens
        n_ctx = len(ctx)
        for n in range(min(self.spec.ngram_max, n_ctx - 1), self.spec.ngram_min - 1, -1):
            suffix = ctx[n_ctx - n :]
            starts = range(n_ctx - n - 1, -1, -1) if self.spec.inject != "L2" else range(n_ctx - n)
            for start in starts:
                if ctx[start : start + n] == suffix:
                    return list(ctx[start + n : start + n + K])
        return []

    def ngram_continuations(self, ctx: tuple[int, ...]) -> list[int]:
        """Distinct next tokens after every earlier match of the longest matching suffix (latest first)."""
        n_ctx = len(ctx)
        for n in range(min(self.spec.ngram_max, n_ctx - 1), self.spec.ngram_min - 1, -1):
            suffix = ctx[n_ctx - n :]
            conts: list[int] = []
            for start in range(n_ctx - n - 1, -1, -1):
                if ctx[start : start + n] == suffix and ctx[start + n] not in conts:
                    conts.append(ctx[start + n])
            if conts:
                return conts
        return []

    # -- trees ---------------------------------------------------------------------------

    def build_tree(self, committed: tuple[int, ...]) -> dict[tuple[int, ...], list[int]]:
        """children[path] for a deterministic draft tree rooted at the committed output.

        ``path`` is the tuple of draft tokens from the root. EAGLE trees take the top-k
        tokens of q at each node and grow best-first by cumulative q; n-gram trees take
        the distinct continuations of the context's longest matching suffix. Both stop at
        ``tree_budget`` nodes and depth ``num_speculative_tokens``.
        """
        spec = self.spec
        ctx0 = self.prompt + committed
        children: dict[tuple[int, ...], list[int]] = {}
        # frontier entries: (-score, order, path)
        frontier: list[tuple[float, int, tuple[int, ...]]] = [(0.0, 0, ())]
        budget = spec.tree_budget
        order = 1
        used = 0
        while frontier and used < budget:
            frontier.sort(key=lambda e: (e[0], e[1]))
            neg_score, _, path = frontier.pop(0)
            if len(path) >= spec.num_speculative_tokens:
                continue
            ctx = ctx0 + path
            if spec.method == "eagle_tree":
                q = self.q_at(ctx[-1], ())
                ranked = sorted((i for i in range(len(q)) if q[i] > 0), key=lambda i: (-q[i], i))
                cand = [(int(self._d2t[i]), float(q[i])) for i in ranked[: spec.tree_topk]]
            else:
                cand = [(t, 1.0 / (r + 1)) for r, t in enumerate(self.ngram_continuations(ctx)[: spec.tree_topk])]
            kids: list[int] = []
            for tok, w in cand:
                if used >= budget:
                    break
                kids.append(tok)
                used += 1
                frontier.append((neg_score - float(np.log(w)) if w > 0 else np.inf, order, path + (tok,)))
                order += 1
            if kids:
                children[path] = kids
        if spec.inject == "N4":
            # Unfilled slots of every expanded level are padded with token 0 and verified as children.
            for path in list(children) or [()]:
                kids = children.get(path, [])
                children[path] = kids + [TREE_PAD_TOKEN_ID] * (spec.tree_topk - len(kids))
        return children

    # -- events --------------------------------------------------------------------------

    def _note(self, res: RoundResult, *names: str) -> None:
        if self.record_events:
            res.events.extend(names)

    def _at_position(self, res: RoundResult, out: tuple[int, ...], lag: int, p: np.ndarray, verifying: bool) -> None:
        """Events of a position whose target distribution ``p`` [W] the round uses, ``lag``
        uncommitted drafts after the committed output (``verifying``: a draft is tested there)."""
        if not self.record_events or any(t < 0 or t >= self.V for t in out):
            return
        if lag and self._lag_processors:
            try:
                base = self.target.conditional(out)  # [V]
            except AmbiguousSemantics:
                base = None  # only past the output's end (after an injected bug)
            for name in self._lag_processors if base is not None else ():
                try:
                    lagging = self.target.conditional(out, {name: lag})  # [V]
                except AmbiguousSemantics:
                    lagging = None  # the lagging view masks every token: it differs too
                if lagging is None or not np.array_equal(base, lagging):
                    res.events.append(f"lag:{name}")
        if lag and verifying and self._narrow:
            res.events.append("narrow_lag")
        if self._narrow and float(p[self._outside].sum()) > 0:
            res.events.append("outside_draft")

    def _truncated(self, out: tuple[int, ...], tok: int, p: np.ndarray) -> bool:
        """Whether top-k/top-p/min-p removed ``tok`` at this position (p[tok] = 0 < untruncated)."""
        if self._untruncated is None or p[tok] > 0 or tok >= self.V or any(t < 0 or t >= self.V for t in out):
            return False
        try:
            return float(self._untruncated.conditional(out)[tok]) > 0
        except AmbiguousSemantics:
            return False

    def _is_stop(self, tok: int) -> bool:
        is_stop = getattr(self.target, "is_stop_token", None)
        return 0 <= tok < self.V and is_stop is not None and bool(is_stop(tok))

    def _residual_events(self, res: RoundResult, raw: np.ndarray) -> None:
        """Events of a rejection's residual (the unnormalised (p - q)+ [W])."""
        if not self.record_events:
            return
        mass = float(raw.sum())
        if int(np.count_nonzero(raw)) == 1:
            res.events.append("residual_single")
        if 0 < mass < RESIDUAL_SMALL_MASS:
            res.events.append("residual_small")

    def _coin(self, res: RoundResult, slot: int) -> int | None:
        """Events of a probabilistic acceptance test at ``slot``; the slot its uniform comes from."""
        if self.record_events:
            if slot in res.coined_before:
                res.events.append("coin_reused")
            if res.coined:
                res.events.append("coin_repeat")
            res.coined.append(slot)
        if self.spec.inject == "N1":
            return slot
        return ROUND_SLOT if self.spec.inject == "M16" else None

    # -- one round -----------------------------------------------------------------------

    def round(self, committed: tuple[int, ...], res: RoundResult) -> RoundGen:
        """One round from the committed output (subclasses may override the steps below with
        these signatures; the round's inputs and scratch beyond them live in ``res``)."""
        if self.spec.is_tree:
            yield from self._tree_round(committed, res)
        else:
            yield from self._chain_round(committed, res)

    def _emit(self, committed: tuple[int, ...], res: RoundResult, tok: int) -> bool:
        """Append a token; True when the output is complete."""
        res.emitted.append(int(tok))
        out = committed + tuple(res.emitted)
        if tok < 0 or tok >= self.V or len(out) >= self.max_tokens or self.target.is_terminal(out):
            res.done = True
        return res.done

    def _resample(self, res: RoundResult, raw: np.ndarray, p: np.ndarray, rejected: int | None, from_p: bool) -> RoundGen:
        """The token after a rejection: drawn from the residual ``raw`` [W] normalised (p [W] when
        it has no mass, or ``from_p``: mutants M01, M03). ``rejected``: the rejected draft (in a
        tree, the node's first child). Mutants M05, M06, M15 act here too."""
        self._residual_events(res, raw)
        inject = self.spec.inject
        if inject == "M05" and rejected is not None and int(np.count_nonzero(raw)) == 1:
            return rejected
        dist = _normalise(raw)
        if dist is None or from_p or (inject == "M06" and 0 < raw.sum() < RESIDUAL_SMALL_MASS):
            dist = p
        if inject == "M15" and self._narrow and float(dist[self._outside].sum()) > 0:
            inside = np.where(self._outside, 0.0, dist)
            dist = _normalise(inside) if inside.sum() > 0 else dist
        return (yield Draw(dist))

    def _final_draw(self, committed: tuple[int, ...], res: RoundResult, p: np.ndarray, greedy: bool) -> RoundGen:
        """The round's last token from ``p`` [W]; ``greedy`` (mutants M04, M13): its argmax, no draw."""
        tok = int(np.argmax(p)) if greedy else (yield Draw(p))
        self._emit(committed, res, int(tok))

    def _chain_round(self, committed: tuple[int, ...], res: RoundResult) -> RoundGen:
        spec = self.spec
        K = spec.num_speculative_tokens
        W = self._W
        # 1. draft
        drafts: list[int] = []
        qs: list[np.ndarray] = []  # each [W], the distribution the drafter sampled from
        if spec.method in CHAIN_DRAFT_METHODS:
            ctx = self.prompt + committed
            greedy = spec.draft_sampling == "greedy" or spec.inject == "L1"
            for _ in range(K):
                qd = self.q_at(ctx[-1], ())  # [V_draft]
                if greedy:
                    j = int(np.argmax(qd))
                else:
                    j = yield Draw(qd)
                tok = int(self._d2t[j])
                drafts.append(tok)
                if greedy:
                    qrow = np.zeros(W)
                    qrow[tok] = 1.0
                else:
                    qrow = self._to_target_width(qd)
                qs.append(qrow)
                ctx = ctx + (tok,)
        else:  # ngram: point-mass drafts
            drafts = self.ngram_proposal(self.prompt + committed)
            if 0 < len(drafts) < K:
                self._note(res, "short_draft")
                if spec.inject == "M14":
                    res.untested_from = len(drafts)
                    drafts = drafts + [drafts[-1]] * (K - len(drafts))
            if spec.inject == "N6":
                drafts = drafts + [PLACEHOLDER_TOKEN_ID] * (K - len(drafts))
            for tok in drafts:
                qrow = np.zeros(W)
                if tok >= 0:
                    qrow[tok] = 1.0
                qs.append(qrow)
        res.proposed = len(drafts)
        if not drafts:
            self._note(res, "no_draft")
        if spec.inject == "N7" and self.draft is not None and self.draft.vocab_size < self.V:
            qs = self._strided_q_reads(qs)
        # 2. verify
        if spec.verify == "block":
            yield from self._block_verify(committed, drafts, qs, res)
        else:
            yield from self._token_verify(committed, drafts, qs, res)

    def _strided_q_reads(self, qs: list[np.ndarray]) -> list[np.ndarray]:
        """N7: q stored as a flat [K * V_draft] buffer, read at row i from offset i * V_target."""
        flat = np.concatenate([q[self._d2t] for q in qs])  # [K * V_draft] in draft ids
        out = []
        for i in range(len(qs)):
            seg = flat[i * self._W : i * self._W + self._W]
            row = np.zeros(self._W)
            row[: len(seg)] = seg  # read past the end: zeros
            out.append(row)
        return out

    def _token_verify(self, committed, drafts, qs, res: RoundResult) -> RoundGen:
        V = self.V
        inject = self.spec.inject
        n = len(drafts)
        out = committed
        for i, (d, q) in enumerate(zip(drafts, qs)):
            p = self.p_at(out, i)  # [W]
            self._at_position(res, out, i, p, verifying=True)
            cut = len(out) + 1 >= self.max_tokens and i < n - 1  # the output's last position, drafts after it
            if cut:
                self._note(res, "max_tokens_cut")
            if d == PLACEHOLDER_TOKEN_ID:  # only reachable with N6: p[-1] read with wrap-around
                pd, qd = p[V - 1], 1.0
            else:
                pd, qd = p[d], q[d]
                if qd > 0 and (self.record_events or inject == "M12") and self._truncated(out, d, p):
                    self._note(res, "draft_truncated")
                    if inject == "M12":
                        pd = float(self._untruncated.conditional(out)[d])
            if inject == "N7":
                accept_prob = 1.0 if qd == 0 else min(1.0, pd / qd)  # kernel tests p >= u * q
            else:
                accept_prob = 0.0 if qd == 0 else min(1.0, pd / qd)
            if (res.untested_from is not None and i >= res.untested_from) or (inject == "M10" and cut):
                accepted = True
            elif 0 < accept_prob < 1.0:
                accepted = yield Coin(accept_prob, self._coin(res, i))
            else:
                accepted = accept_prob >= 1.0
            if accepted:
                res.accepted += 1
                stop_inside = i < n - 1 and self._is_stop(d) and len(out) + 1 < self.max_tokens
                if stop_inside:
                    self._note(res, "stop_mid_round")
                    if inject == "M09":
                        res.emitted.append(int(d))
                        out = out + (d,)
                        continue
                if self._emit(committed, res, d):
                    return
                out = out + (d,)
                continue
            self._note(res, f"reject@{i + 1}")
            tok = yield from self._resample(res, np.maximum(p - q, 0.0), p, d if d >= 0 else None, i >= 1 and inject == "M01")
            done = self._emit(committed, res, int(tok))
            if self._penalised and d >= 0 and tok != d and not done:
                self._note(res, "rejected_in_history")
            return
        p = self.p_at(out, n)
        self._at_position(res, out, n, p, verifying=False)
        if n:
            self._note(res, f"bonus@{n}")
        if inject == "M02" and n >= 2:
            p = self.p_at(out[:-1], n - 1)
        yield from self._final_draw(committed, res, p, greedy=inject == "M13" and n == 0)

    def _block_verify(self, committed, drafts, qs, res: RoundResult) -> RoundGen:
        K = len(drafts)
        inject = self.spec.inject
        if K == 0:
            p = self.p_at(committed, 0)
            self._at_position(res, committed, 0, p, verifying=False)
            yield from self._final_draw(committed, res, p, greedy=inject == "M13")
            return
        outs = [committed + tuple(drafts[:i]) for i in range(K + 1)]
        ps = [self.p_at(outs[i], i) for i in range(K + 1)]  # ps[i]: target at draft slot i+1 (0-based i)
        if len(committed) + K > self.max_tokens:
            self._note(res, "max_tokens_cut")
        w = [1.0]
        for i in range(K):
            d = drafts[i]
            self._at_position(res, outs[i], i, ps[i], verifying=True)
            qd = qs[i][d] if d >= 0 else 1.0
            pd = ps[i][d] if d >= 0 else ps[i][self.V - 1]
            if d >= 0 and qd > 0 and (self.record_events or inject == "M12") and self._truncated(outs[i], d, ps[i]):
                self._note(res, "draft_truncated")
                if inject == "M12":
                    pd = float(self._untruncated.conditional(outs[i])[d])
            carried = 1.0 if inject == "M07" else w[-1]  # M07: the weight is not carried over positions
            w.append(min(1.0, carried * pd / qd) if qd > 0 else 0.0)
        if any(x < 1.0 for x in w[1:K]):
            self._note(res, "block_weight")
        tau = 0
        for i in range(1, K + 1):
            if i < K:
                r = float(np.maximum(w[i] * ps[i] - qs[i], 0.0).sum())
                denom = r + 1.0 - w[i]
                h = 1.0 if denom <= 0 else r / denom
            else:
                h = w[K]
            if h >= 1.0:
                tau = i
            elif h > 0 and (yield Coin(h, self._coin(res, i - 1))):
                tau = i
        res.accepted = tau
        for j, d in enumerate(drafts[:tau]):
            if j < K - 1 and self._is_stop(d) and len(committed) + j + 1 < self.max_tokens:
                self._note(res, "stop_mid_round")
            if self._emit(committed, res, d):
                return
        if tau == K:
            self._at_position(res, outs[K], K, ps[K], verifying=False)
            self._note(res, f"bonus@{K}")
            nxt = ps[K - 1] if inject == "M02" and K >= 2 else ps[K]
        else:
            self._note(res, f"reject@{tau + 1}")
            raw = np.maximum(w[tau] * ps[tau] - qs[tau], 0.0)  # [W]
            tok = yield from self._resample(res, raw, ps[tau], drafts[tau] if drafts[tau] >= 0 else None,
                                            tau >= 1 and inject == "M01")
            self._emit(committed, res, int(tok))
            return
        tok = yield Draw(nxt)
        self._emit(committed, res, int(tok))

    def _tree_round(self, committed: tuple[int, ...], res: RoundResult) -> RoundGen:
        spec = self.spec
        inject = spec.inject
        children = self.build_tree(committed)
        res.proposed = sum(len(v) for v in children.values())
        if not children:
            self._note(res, "no_draft")
        path: tuple[int, ...] = ()
        while True:
            out = committed + path
            p = self.p_at(out, len(path))  # [W]
            kids = children.get(path, [])
            self._at_position(res, out, len(path), p, verifying=bool(kids))
            if self.record_events:
                if (kids and len(kids) < spec.tree_topk) or (not children and not path):
                    res.events.append("tree_unfilled")
                if any(c >= 0 and self._truncated(out, c, p) for c in kids):
                    res.events.append("draft_truncated")
                if len(out) + 1 >= self.max_tokens and any(path + (c,) in children for c in kids):
                    res.events.append("max_tokens_cut")
            if inject == "M12" and any(c >= 0 and self._truncated(out, c, p) for c in kids):
                # M12: the children are tested against the untruncated p
                full = self._untruncated.conditional(out)  # [V]
                p = p.copy()
                for c in kids:
                    if 0 <= c < self.V and p[c] == 0:
                        p[c] = float(full[c])
            if not kids:
                if path:
                    self._note(res, f"tree_leaf@{len(path)}")
                greedy = (inject == "M04" and len(path) >= 2) or (inject == "M13" and not children)
                yield from self._final_draw(committed, res, p, greedy)
                return
            # One uniform, cumulative target mass of the children in order.
            cum = np.minimum(np.cumsum([p[c] for c in kids]), 1.0)  # [m]
            lo = np.concatenate([[0.0], cum[:-1]])
            seg = np.append(cum - lo, 1.0 - cum[-1])  # [m+1] interval lengths; last = no child
            if inject == "M08":
                left, seg = 1.0, []
                for c in kids:
                    seg.append(left * min(1.0, p[c]))
                    left -= seg[-1]
                seg = np.array(seg + [left])
            j = yield Draw(seg)
            if j >= 1 and len(kids) >= 2:
                self._note(res, "tree_sibling")
            if j < len(kids):
                tok = kids[j]
                res.accepted += 1
                if self._is_stop(tok) and path + (tok,) in children and len(out) + 1 < self.max_tokens:
                    self._note(res, "stop_mid_round")
                    if inject == "M09":
                        res.emitted.append(int(tok))
                        path = path + (tok,)
                        continue
                if self._emit(committed, res, tok):
                    return
                path = path + (tok,)
                continue
            self._note(res, f"tree_reject@{len(path) + 1}")
            rest = p.copy()
            rest[list(set(kids))] = 0.0
            tok = yield from self._resample(res, rest, p, kids[0], bool(path) and inject == "M03")
            self._emit(committed, res, int(tok))
            return


def __getattr__(name: str):
    """The drivers, importable from here too (they live in :mod:`specfuzz.oracle.drivers`,
    which imports this module)."""
    if name in ("ExactDriver", "MonteCarloDriver", "SampleStats"):
        from specfuzz.oracle import drivers

        return getattr(drivers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
