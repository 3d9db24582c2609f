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
evaluated on the full prefix. Bugs are injected by the switches in :data:`BUG_CLASSES`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Generator, Iterable, Mapping, Protocol, Sequence

import numpy as np

from specfuzz.errors import AmbiguousSemantics, InvalidInput

# A draft slot that the proposer could not fill (vLLM's PLACEHOLDER_TOKEN_ID).
PLACEHOLDER_TOKEN_ID = -1
# The token id that SGLang's NGRAM tree pads unfilled branches with (N4).
TREE_PAD_TOKEN_ID = 0

# Methods the reference sampler runs.
METHODS = ("draft_model", "ngram", "eagle_tree", "ngram_tree", "eagle", "eagle3")
# Chain drafts from a table drafter. "eagle"/"eagle3" are EAGLE heads written by tablegen
# (specfuzz.tablegen.eagle): their draft distribution after token x is exactly the draft
# table's row x, as for "draft_model", so the reference runs them as the same chain.
CHAIN_DRAFT_METHODS = ("draft_model", "eagle", "eagle3")
# Chain methods (block verification applies to these).
CHAIN_METHODS = CHAIN_DRAFT_METHODS + ("ngram",)
# Every method an engine adapter may be asked for (the reference runs METHODS only).
ENGINE_METHODS = METHODS + ("suffix", "mtp")
VERIFY_MODES = ("token", "block")
DRAFT_SAMPLING = ("sampled", "greedy")

# Catalogued bug classes (SPEC §4): id -> (broken condition, mechanism as modelled here).
BUG_CLASSES: dict[str, tuple[int, str]] = {
    "N1": (4, "the acceptance uniform of each draft slot is drawn once per request and reused every round"),
    "N2": (2, "min_tokens masks stop tokens by the committed length, ignoring the draft tokens before the position"),
    "N3": (2, "the thinking budget counts committed tokens only, ignoring the draft tokens before the position"),
    "N4": (3, "unfilled tree branches are padded with token 0 and verified as real (duplicate) children"),
    "N5": (3, "target probabilities are cut to the draft vocabulary width and renormalised"),
    "N6": (3, "placeholder (-1) draft slots are verified with the wrapped-around probability p[-1] and emitted"),
    "N7": (3, "the narrow draft probabilities q [K, V_draft] are read with the target's row stride V_target"),
}


class TargetLawLike(Protocol):
    vocab_size: int

    def conditional(self, out: tuple[int, ...], stale: Mapping[str, int] = ...) -> np.ndarray: ...

    def is_terminal(self, out: tuple[int, ...]) -> bool: ...


# ----------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class DraftModel:
    """A table drafter: ``table[ctx_token, draft_token]`` logits.

    Rows are indexed by *target* token ids (the drafter reads the target's context, as an
    EAGLE-3 head with a reduced vocabulary does), columns by draft ids; ``d2t`` maps draft
    ids to target ids (identity by default). Narrower drafts have fewer columns than the
    target vocabulary; wider drafts propose ids the target cannot produce.
    """

    table: np.ndarray  # [R, V_draft] float, R >= max(V_target, V_draft)
    d2t: tuple[int, ...] | None = None  # [V_draft] target id of each draft id

    @property
    def vocab_size(self) -> int:
        return int(self.table.shape[1])

    def target_ids(self) -> np.ndarray:  # [V_draft]
        if self.d2t is None:
            return np.arange(self.vocab_size)
        return np.asarray(self.d2t, dtype=np.int64)


@dataclass(frozen=True)
class SpecConfig:
    """How the reference engine speculates. Defaults shrink toward the simplest case."""

    method: str = "draft_model"
    num_speculative_tokens: int = 1  # K: chain length, or tree depth for tree methods
    verify: str = "token"  # chain drafts only: "token" or "block"
    draft_sampling: str = "sampled"  # draft_model / eagle_tree: sample q, or propose argmax q
    draft_temperature: float | None = None  # None: the request's temperature (1.0 if greedy)
    ngram_min: int = 1
    ngram_max: int = 3
    tree_topk: int = 2  # children per node
    tree_budget: int = 4  # draft nodes per tree (excluding the root)
    inject: str | None = None  # one of BUG_CLASSES
    # The engine's own default configuration of this method: the adapter sends only the
    # knobs the engine requires (method, draft model, and K where the engine has no
    # default), and the fields above hold what the engine documents it then uses
    # (Capabilities.spec_defaults), as far as SpecConfig can say it.
    engine_default: bool = False
    # Trees whose breadth falls with depth (SGLang's NGRAM: from tree_topk children per
    # node after a short match down to tree_topk_min after the deepest one); None: every
    # node has up to tree_topk children. The reference sampler models only the latter:
    # μ does not depend on it (the verdict stays exact), only bug-law attribution does.
    tree_topk_min: int | None = None

    def __post_init__(self) -> None:
        if self.method not in ENGINE_METHODS:
            raise InvalidInput("method", self.method, f"one of {ENGINE_METHODS}")
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 16:
            raise InvalidInput("num_speculative_tokens", k, "an integer in [1, 16]")
        if self.verify not in VERIFY_MODES:
            raise InvalidInput("verify", self.verify, f"one of {VERIFY_MODES}")
        if self.verify == "block" and self.method not in CHAIN_METHODS:
            raise InvalidInput("verify", self.verify, "'token' for tree methods (block verification needs a chain draft)")
        if self.draft_sampling not in DRAFT_SAMPLING:
            raise InvalidInput("draft_sampling", self.draft_sampling, f"one of {DRAFT_SAMPLING}")
        if self.draft_temperature is not None and not (self.draft_temperature > 0 and np.isfinite(self.draft_temperature)):
            raise InvalidInput("draft_temperature", self.draft_temperature, "None or a finite number > 0")
        if not 1 <= self.ngram_min <= self.ngram_max <= 16:
            raise InvalidInput("ngram_min/ngram_max", (self.ngram_min, self.ngram_max), "1 <= ngram_min <= ngram_max <= 16")
        if not 1 <= self.tree_topk <= 16:
            raise InvalidInput("tree_topk", self.tree_topk, "an integer in [1, 16]")
        if not 1 <= self.tree_budget <= 64:
            raise InvalidInput("tree_budget", self.tree_budget, "an integer in [1, 64]")
        m = self.tree_topk_min
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= self.tree_topk):
            raise InvalidInput("tree_topk_min", m, f"None or an integer in [1, tree_topk={self.tree_topk}]")
        if self.inject is not None and self.inject not in BUG_CLASSES:
            raise InvalidInput("inject", self.inject, f"None or one of {sorted(BUG_CLASSES)}")

    @property
    def uses_draft_model(self) -> bool:
        return self.method in ("draft_model", "eagle_tree", "eagle", "eagle3")

    @property
    def is_tree(self) -> bool:
        return self.method in ("eagle_tree", "ngram_tree")

    def to_json(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        if not self.engine_default:
            del out["engine_default"]  # absent = False: cases stored before the field stay byte-equal
        if self.tree_topk_min is None:
            del out["tree_topk_min"]  # absent = None, likewise
        return out

    @classmethod
    def from_json(cls, d: Mapping) -> "SpecConfig":
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise InvalidInput("speculation setting", sorted(unknown)[0], f"one of {sorted(cls.__dataclass_fields__)}")
        return cls(**d)


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
        if spec.inject in ("N5", "N7") and (draft is None or draft.vocab_size >= self.V):
            # These bugs need a narrower draft vocabulary; with none they change nothing.
            pass
        self._qcache: dict[tuple[int, ...], np.ndarray] = {}
        self._pcache: dict[tuple[tuple[int, ...], int], np.ndarray] = {}

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
            for start in range(n_ctx - n - 1, -1, -1):
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

    # -- one round -----------------------------------------------------------------------

    def round(self, committed: tuple[int, ...], res: RoundResult) -> RoundGen:
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

    def _chain_round(self, committed: tuple[int, ...], res: RoundResult) -> RoundGen:
        spec = self.spec
        K = spec.num_speculative_tokens
        W = self._W
        # 1. draft
        drafts: list[int] = []
        qs: list[np.ndarray] = []  # each [W], the distribution the drafter sampled from
        if spec.method in CHAIN_DRAFT_METHODS:
            ctx = self.prompt + committed
            for _ in range(K):
                qd = self.q_at(ctx[-1], ())  # [V_draft]
                if spec.draft_sampling == "greedy":
                    j = int(np.argmax(qd))
                else:
                    j = yield Draw(qd)
                tok = int(self._d2t[j])
                drafts.append(tok)
                if spec.draft_sampling == "greedy":
                    qrow = np.zeros(W)
                    qrow[tok] = 1.0
                else:
                    qrow = self._to_target_width(qd)
                qs.append(qrow)
                ctx = ctx + (tok,)
        else:  # ngram: point-mass drafts
            drafts = self.ngram_proposal(self.prompt + committed)
            if spec.inject == "N6":
                drafts = drafts + [PLACEHOLDER_TOKEN_ID] * (K - len(drafts))
            for tok in drafts:
                qrow = np.zeros(W)
                if tok >= 0:
                    qrow[tok] = 1.0
                qs.append(qrow)
        res.proposed = len(drafts)
        if spec.inject == "N7" and self.draft is not None and self.draft.vocab_size < self.V:
            qs = self._strided_q_reads(qs)
        # 2. verify
        if spec.verify == "block":
            yield from self._block_verify(committed, drafts, qs, res)
        else:
            yield from self._token_verify(committed, drafts, qs, res)

    def _strided_q_reads(self, qs: list[np.ndarray]) -> list[np.ndarray]:
        """N7: q stored as a flat [K * V_draft] buffer, read at row i from offset i * V_target."""
        Vd = self.draft.vocab_size
        flat = np.concatenate([q[self._d2t] for q in qs])  # [K * V_draft] in draft ids
        out = []
        for i in range(len(qs)):
            seg = flat[i * self._W : i * self._W + self._W]
            row = np.zeros(self._W)
            row[: len(seg)] = seg  # read past the end: zeros
            out.append(row)
        _ = Vd
        return out

    def _coin_slot(self, i: int) -> int | None:
        return i if self.spec.inject == "N1" else None

    def _token_verify(self, committed, drafts, qs, res: RoundResult) -> RoundGen:
        V = self.V
        out = committed
        for i, (d, q) in enumerate(zip(drafts, qs)):
            p = self.p_at(out, i)  # [W]
            if d == PLACEHOLDER_TOKEN_ID:  # only reachable with N6: p[-1] read with wrap-around
                pd, qd = p[V - 1], 1.0
            else:
                pd, qd = p[d], q[d]
            if self.spec.inject == "N7":
                accept_prob = 1.0 if qd == 0 else min(1.0, pd / qd)  # kernel tests p >= u * q
            else:
                accept_prob = 0.0 if qd == 0 else min(1.0, pd / qd)
            accepted = accept_prob >= 1.0 or (accept_prob > 0 and (yield Coin(accept_prob, self._coin_slot(i))))
            if accepted:
                res.accepted += 1
                if self._emit(committed, res, d):
                    return
                out = out + (d,)
                continue
            resid = _normalise(np.maximum(p - q, 0.0))
            if resid is None:
                resid = p
            tok = yield Draw(resid)
            self._emit(committed, res, int(tok))
            return
        p = self.p_at(out, len(drafts))
        tok = yield Draw(p)
        self._emit(committed, res, int(tok))

    def _block_verify(self, committed, drafts, qs, res: RoundResult) -> RoundGen:
        K = len(drafts)
        if K == 0:
            tok = yield Draw(self.p_at(committed, 0))
            self._emit(committed, res, int(tok))
            return
        outs = [committed + tuple(drafts[:i]) for i in range(K + 1)]
        ps = [self.p_at(outs[i], i) for i in range(K + 1)]  # ps[i]: target at draft slot i+1 (0-based i)
        w = [1.0]
        for i in range(K):
            d = drafts[i]
            qd = qs[i][d] if d >= 0 else 1.0
            pd = ps[i][d] if d >= 0 else ps[i][self.V - 1]
            w.append(min(1.0, w[-1] * pd / qd) if qd > 0 else 0.0)
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
            elif h > 0 and (yield Coin(h, self._coin_slot(i - 1))):
                tau = i
        res.accepted = tau
        for d in drafts[:tau]:
            if self._emit(committed, res, d):
                return
        if tau == K:
            nxt = ps[K]
        else:
            nxt = _normalise(np.maximum(w[tau] * ps[tau] - qs[tau], 0.0))
            if nxt is None:
                nxt = ps[tau]
        tok = yield Draw(nxt)
        self._emit(committed, res, int(tok))

    def _tree_round(self, committed: tuple[int, ...], res: RoundResult) -> RoundGen:
        children = self.build_tree(committed)
        res.proposed = sum(len(v) for v in children.values())
        path: tuple[int, ...] = ()
        while True:
            out = committed + path
            p = self.p_at(out, len(path))  # [W]
            kids = children.get(path, [])
            if not kids:
                tok = yield Draw(p)
                self._emit(committed, res, int(tok))
                return
            # One uniform, cumulative target mass of the children in order.
            cum = np.minimum(np.cumsum([p[c] for c in kids]), 1.0)  # [m]
            lo = np.concatenate([[0.0], cum[:-1]])
            seg = np.append(cum - lo, 1.0 - cum[-1])  # [m+1] interval lengths; last = no child
            j = yield Draw(seg)
            if j < len(kids):
                tok = kids[j]
                res.accepted += 1
                if self._emit(committed, res, tok):
                    return
                path = path + (tok,)
                continue
            rest = p.copy()
            rest[list(set(kids))] = 0.0
            rest = _normalise(rest)
            tok = yield Draw(rest if rest is not None else p)
            self._emit(committed, res, int(tok))
            return


# ----------------------------------------------------------------------------- drivers


class _Branch(Exception):
    """Raised inside a replay when the round asks for a choice past the script."""


def _run_round(gen: RoundGen, answer: Callable[[object], object]) -> None:
    try:
        req = next(gen)
        while True:
            req = gen.send(answer(req))
    except StopIteration:
        return


@dataclass
class SampleStats:
    rounds: int = 0
    proposed: int = 0
    accepted: int = 0


class MonteCarloDriver:
    """Runs a :class:`SpeculativeProcess` with real randomness: the reference engine."""

    def __init__(self, process: SpeculativeProcess, rng: np.random.Generator) -> None:
        self.process = process
        self.rng = rng
        self.stats = SampleStats()

    def sample(self) -> tuple[int, ...]:
        rng = self.rng
        slots: dict[int, float] = {}

        def answer(req: object) -> object:
            if isinstance(req, Draw):
                c = np.cumsum(req.probs)
                return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(c) - 1))
            assert isinstance(req, Coin)
            if req.slot is None:
                u = rng.random()
            else:
                if req.slot not in slots:
                    slots[req.slot] = rng.random()
                u = slots[req.slot]
            return u < req.threshold

        committed: tuple[int, ...] = ()
        while True:
            res = RoundResult()
            _run_round(self.process.round(committed, res), answer)
            self.stats.rounds += 1
            self.stats.proposed += res.proposed
            self.stats.accepted += res.accepted
            committed = committed + tuple(res.emitted)
            if res.done:
                return committed

    def sample_many(self, n: int) -> list[tuple[int, ...]]:
        return [self.sample() for _ in range(n)]


class ExactDriver:
    """Computes the exact law of a :class:`SpeculativeProcess` over complete outputs.

    States between rounds are (committed output, per-slot uniform intervals); a round is
    enumerated by replaying it along every branch of its random requests.
    """

    def __init__(self, process: SpeculativeProcess, max_states: int = 2_000_000) -> None:
        self.process = process
        self.max_states = max_states

    def _round_outcomes(self, committed, intervals):
        """[(prob, emitted tuple, done, new intervals)] for one round from a state."""
        results = []
        stack: list[list[object]] = [[]]
        replays = 0
        while stack:
            script = stack.pop()
            replays += 1
            if replays > self.max_states:
                raise RuntimeError("speculative process too large to enumerate exactly")
            ivs = dict(intervals)
            prob = 1.0
            pos = 0
            branch: list | None = None

            def answer(req: object) -> object:
                nonlocal pos, prob, branch
                if pos < len(script):
                    a = script[pos]
                    pos += 1
                    if isinstance(req, Draw):
                        prob *= float(req.probs[a])
                    else:
                        t = req.threshold
                        if req.slot is None:
                            prob *= t if a else 1.0 - t
                        else:
                            lo, hi = ivs.get(req.slot, (0.0, 1.0))
                            cut = min(max(t, lo), hi)
                            width = hi - lo
                            if a:
                                prob *= (cut - lo) / width
                                ivs[req.slot] = (lo, cut)
                            else:
                                prob *= (hi - cut) / width
                                ivs[req.slot] = (cut, hi)
                    return a
                # Past the script: list this request's options with positive probability.
                if isinstance(req, Draw):
                    branch = [int(i) for i in np.flatnonzero(req.probs > 0)]
                else:
                    t = req.threshold
                    if req.slot is None:
                        branch = [a for a, pa in ((True, t), (False, 1.0 - t)) if pa > 0]
                    else:
                        lo, hi = ivs.get(req.slot, (0.0, 1.0))
                        cut = min(max(t, lo), hi)
                        branch = [a for a, pa in ((True, cut - lo), (False, hi - cut)) if pa > 0]
                raise _Branch

            res = RoundResult()
            gen = self.process.round(committed, res)
            try:
                _run_round(gen, answer)
            except _Branch:
                for a in reversed(branch):
                    stack.append(script + [a])
                continue
            if prob > 0:
                results.append((prob, tuple(res.emitted), res.done, tuple(sorted(ivs.items()))))
        return results

    def law(self) -> dict[tuple[int, ...], float]:
        frontier: dict[tuple, float] = {((), ()): 1.0}
        final: dict[tuple[int, ...], float] = {}
        while frontier:
            nxt: dict[tuple, float] = {}
            for (committed, ivs), mass in frontier.items():
                for prob, emitted, done, new_ivs in self._round_outcomes(committed, ivs):
                    out = committed + emitted
                    if done:
                        final[out] = final.get(out, 0.0) + mass * prob
                    else:
                        key = (out, new_ivs)
                        nxt[key] = nxt.get(key, 0.0) + mass * prob
            if len(nxt) > self.max_states:
                raise RuntimeError("speculative process has too many states to enumerate exactly")
            frontier = nxt
        return final

