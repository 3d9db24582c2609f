"""Laws as the statistics see them: μ given by next-token conditionals or enumerated,
cut into cells per output prefix, and the input checks every statistics module shares.

Vocabulary
----------
* An *output* is a complete generation, a tuple of token ids. It may hold ids that are
  impossible under μ (``-1``, ids ``>= vocab_size``), tokens after a stop point, or stop
  before μ allows it.
* A *law* μ is either a :class:`Law` (exact next-token conditionals plus a deterministic
  stop rule) or an *enumerated law*: a mapping ``{output: probability}`` over complete
  outputs summing to 1 (wrapped by :class:`EnumeratedLaw`).
* A *catalogued alternative* μD (the law of a known bug class, SPEC §4) is always an
  enumerated mapping; it may put mass on outputs impossible under μ.
* *Cells*: at an output prefix (a *context*) the next event is one of ``K = V + 2``
  cells: a token ``0..V-1``, the single lumped out-of-vocabulary cell ``V`` (every id
  outside ``[0, V)``), or ``END`` (= ``V + 1``: the output stops here).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Mapping, Protocol, runtime_checkable

import numpy as np

from specfuzz.errors import InvalidInput

# Schema of every stored statistics object (verdict, attribution, α spender).
SCHEMA_VERSION = 1
# Enumerated laws (μ and every μD) must sum to 1 within this.
DISTRIBUTION_SUM_TOLERANCE = 1e-9
# Law.conditional(prefix) must sum to 1 within this.
CONDITIONAL_SUM_TOLERANCE = 1e-9

_INF = math.inf


# ----------------------------------------------------------------------------- laws


@runtime_checkable
class Law(Protocol):
    """An exact law over complete outputs given by next-token conditionals.

    ``conditional(prefix)`` is ``P(next token | output prefix)``: a float64 array of
    shape ``[vocab_size]`` summing to 1, asked only for prefixes that μ can reach and
    where ``is_terminal(prefix)`` is False. ``is_terminal(output)`` says whether
    generation stops after ``output`` (stop token, max length, ...); stopping is
    deterministic given the output.
    """

    vocab_size: int

    def conditional(self, prefix: tuple[int, ...]) -> np.ndarray: ...  # [V]

    def is_terminal(self, output: tuple[int, ...]) -> bool: ...


class EnumeratedLaw:
    """A :class:`Law` built from an enumerated mapping ``{output: probability}``.

    Unlike a generic :class:`Law`, the support need not be prefix-free: an output may be
    both complete and a prefix of another, in which case :meth:`stop_probability` is
    strictly between 0 and 1 and the tree tests treat ``END`` as an ordinary cell.
    ``vocab_size`` defaults to ``1 + max token id`` of the support.
    """

    def __init__(self, probabilities: Mapping[tuple[int, ...], float], vocab_size: int | None = None) -> None:
        probs = _check_distribution("law", probabilities, allow_oov=False)
        top = max((max(x) for x in probs if x), default=-1)
        if vocab_size is None:
            vocab_size = max(top + 1, 1)
        _check_vocab_size(vocab_size)
        if top >= vocab_size:
            raise InvalidInput("law token id", top, f"ids in [0, vocab_size={vocab_size})")
        self.vocab_size = int(vocab_size)
        self._probs = probs
        self._mass: dict[tuple[int, ...], float] = defaultdict(float)  # prefix -> μ(outputs extending it)
        self._children: dict[tuple[int, ...], dict[int, float]] = defaultdict(dict)
        for x, p in probs.items():
            for t in range(len(x) + 1):
                self._mass[x[:t]] += p
        for prefix in list(self._mass):
            if prefix:
                self._children[prefix[:-1]][prefix[-1]] = self._mass[prefix]
        self._mass = dict(self._mass)
        self._children = dict(self._children)

    @property
    def probabilities(self) -> dict[tuple[int, ...], float]:
        """The validated mapping (outputs of probability 0 dropped)."""
        return dict(self._probs)

    def probability(self, output: tuple[int, ...]) -> float:
        return self._probs.get(tuple(output), 0.0)

    def _reachable_mass(self, prefix: tuple[int, ...]) -> float:
        m = self._mass.get(tuple(prefix), 0.0)
        if m <= 0.0:
            raise InvalidInput("prefix", prefix, "a prefix with positive probability under the law")
        return m

    def stop_probability(self, prefix: tuple[int, ...]) -> float:
        """``P(output == prefix | output starts with prefix)``."""
        prefix = tuple(prefix)
        m = self._reachable_mass(prefix)
        if prefix not in self._children:
            return 1.0
        return min(1.0, self._probs.get(prefix, 0.0) / m)

    def is_terminal(self, output: tuple[int, ...]) -> bool:
        return self.stop_probability(output) >= 1.0

    def conditional(self, prefix: tuple[int, ...]) -> np.ndarray:
        """``P(next token | prefix, the output continues)``, shape ``[V]``."""
        prefix = tuple(prefix)
        self._reachable_mass(prefix)
        kids = self._children.get(prefix)
        if not kids:
            raise InvalidInput("prefix", prefix, "a prefix after which the law can continue")
        out = np.zeros(self.vocab_size)  # [V]
        for tok, m in kids.items():
            out[tok] = m
        return out / out.sum()

    def _cell_probabilities(self, prefix: tuple[int, ...]) -> np.ndarray:
        """μ(cell | prefix) over the ``V + 2`` cells, shape ``[K]``."""
        m = self._reachable_mass(prefix)
        out = np.zeros(self.vocab_size + 2)  # [K]
        for tok, cm in self._children.get(prefix, {}).items():
            out[tok] = cm / m
        out[self.vocab_size + 1] = self._probs.get(prefix, 0.0) / m
        return out


# ------------------------------------------------------------------------ validation


def _is_int(t: object) -> bool:
    return isinstance(t, (int, np.integer)) and not isinstance(t, (bool, np.bool_))


def _as_output(name: str, x: object) -> tuple[int, ...]:
    if isinstance(x, (str, bytes)) or not hasattr(x, "__iter__"):
        raise InvalidInput(name, x, "a sequence of integer token ids")
    out = tuple(x)  # type: ignore[arg-type]
    for t in out:
        if not _is_int(t):
            raise InvalidInput(name, x, "a sequence of integer token ids")
    return tuple(int(t) for t in out)


def _check_alpha(alpha: object, name: str = "alpha") -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.floating)) or not 0.0 < float(alpha) < 1.0:
        raise InvalidInput(name, alpha, "a number in (0, 1)")
    return float(alpha)


def _check_tolerance(tolerance: object) -> float:
    if (
        isinstance(tolerance, bool)
        or not isinstance(tolerance, (int, float, np.floating))
        or not math.isfinite(float(tolerance))
        or not 0.0 <= float(tolerance) < 1.0
    ):
        raise InvalidInput("tolerance", tolerance, "a number in [0, 1) (per-token conditional probability)")
    return float(tolerance)


def _check_vocab_size(v: object) -> int:
    if not _is_int(v) or int(v) < 1:  # type: ignore[call-overload]
        raise InvalidInput("vocab_size", v, "an integer >= 1")
    return int(v)  # type: ignore[call-overload]


def _check_distribution(name: str, mapping: object, *, allow_oov: bool) -> dict[tuple[int, ...], float]:
    """Validate an enumerated law; return ``{output: p}`` without zero entries."""
    if not isinstance(mapping, Mapping):
        raise InvalidInput(name, mapping, "a mapping from outputs (token-id tuples) to probabilities")
    out: dict[tuple[int, ...], float] = {}
    values = []
    for k, p in mapping.items():
        key = _as_output(f"{name} key", k)
        if not allow_oov and any(t < 0 for t in key):
            raise InvalidInput(f"{name} key", k, "outputs of token ids >= 0")
        if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)):
            raise InvalidInput(f"{name}[{k!r}]", p, "a finite probability >= 0")
        pf = float(p)
        if not math.isfinite(pf) or pf < 0.0:
            raise InvalidInput(f"{name}[{k!r}]", p, "a finite probability >= 0")
        values.append(pf)
        if pf > 0.0:
            out[key] = out.get(key, 0.0) + pf
    total = math.fsum(values)
    if not abs(total - 1.0) <= DISTRIBUTION_SUM_TOLERANCE:
        raise InvalidInput(f"sum of {name}", total, f"probabilities summing to 1 within {DISTRIBUTION_SUM_TOLERANCE:g}")
    return out


def _check_counts(counts: object) -> dict[tuple[int, ...], int]:
    if not isinstance(counts, Mapping):
        raise InvalidInput("counts", counts, "a mapping from outputs to counts")
    out: dict[tuple[int, ...], int] = {}
    for k, c in counts.items():
        key = _as_output("counts key", k)
        if not _is_int(c) or int(c) < 0:
            raise InvalidInput(f"counts[{k!r}]", c, "an integer >= 0")
        if int(c) > 0:
            out[key] = out.get(key, 0) + int(c)
    return out


def _check_alternatives(alternatives: object) -> dict[str, dict[tuple[int, ...], float]]:
    if alternatives is None:
        return {}
    if not isinstance(alternatives, Mapping):
        raise InvalidInput("alternatives", alternatives, "a mapping from class names to enumerated laws")
    out = {}
    for name, law in alternatives.items():
        if not isinstance(name, str) or not name or name == "universal":
            raise InvalidInput("alternative name", name, "a non-empty string other than 'universal'")
        out[name] = _check_distribution(f"alternatives[{name!r}]", law, allow_oov=True)
    return out


def _resolve_law(law: object, vocab_size: int | None) -> tuple[Law, dict[tuple[int, ...], float] | None]:
    """Return (a Law, the enumerated mapping if μ was given enumerated)."""
    if isinstance(law, EnumeratedLaw):
        if vocab_size is not None and _check_vocab_size(vocab_size) != law.vocab_size:
            raise InvalidInput("vocab_size", vocab_size, f"the law's own vocab_size {law.vocab_size}")
        return law, law.probabilities
    if isinstance(law, Mapping):
        e = EnumeratedLaw(law, vocab_size)
        return e, e.probabilities
    if isinstance(law, Law):
        _check_vocab_size(law.vocab_size)
        if vocab_size is not None and _check_vocab_size(vocab_size) != law.vocab_size:
            raise InvalidInput("vocab_size", vocab_size, f"the law's own vocab_size {law.vocab_size}")
        return law, None
    raise InvalidInput("law", law, "a Law (vocab_size, conditional, is_terminal) or a mapping {output: probability}")


# ------------------------------------------------------------------- μ per context


@dataclass(frozen=True)
class _CtxInfo:
    probs: np.ndarray  # [K] μ(cell | prefix); terminal contexts put all mass on END
    terminal: bool  # μ stops here with probability 1


class _MuCells:
    """μ's cell-level conditionals, cached per prefix (each prefix is asked once)."""

    def __init__(self, law: Law) -> None:
        self.law = law
        self.V = int(law.vocab_size)
        self.K = self.V + 2
        self.OOV = self.V
        self.END = self.V + 1
        self._cache: dict[tuple[int, ...], _CtxInfo] = {}

    def cell(self, token: int) -> int:
        return token if 0 <= token < self.V else self.OOV

    def info(self, prefix: tuple[int, ...]) -> _CtxInfo:
        hit = self._cache.get(prefix)
        if hit is not None:
            return hit
        law = self.law
        if isinstance(law, EnumeratedLaw):
            probs = law._cell_probabilities(prefix)  # [K]
            terminal = probs[self.END] >= 1.0
        else:
            terminal = bool(law.is_terminal(prefix))
            probs = np.zeros(self.K)  # [K]
            if not terminal:
                cond = np.asarray(law.conditional(prefix), dtype=np.float64)  # [V]
                if (
                    cond.shape != (self.V,)
                    or not np.all(np.isfinite(cond))
                    or np.any(cond < 0)
                    or abs(math.fsum(cond.tolist()) - 1.0) > CONDITIONAL_SUM_TOLERANCE
                ):
                    raise InvalidInput(
                        f"law.conditional({prefix!r})",
                        cond,
                        f"a float64 array of shape [{self.V}], entries >= 0, summing to 1 within {CONDITIONAL_SUM_TOLERANCE:g}",
                    )
                probs[: self.V] = cond
        if terminal:
            probs = np.zeros(self.K)
            probs[self.END] = 1.0
        probs.setflags(write=False)
        info = _CtxInfo(probs, bool(terminal))
        self._cache[prefix] = info
        return info

    def log_prob(self, x: tuple[int, ...]) -> float:
        """Exact ``log μ(x)`` of a complete output (``-inf`` when impossible)."""
        total = 0.0
        for t in range(len(x) + 1):
            info = self.info(x[:t])
            if info.terminal:
                return total if t == len(x) else -_INF
            p = info.probs[self.END if t == len(x) else self.cell(x[t])]
            if p <= 0.0:
                return -_INF
            total += math.log(p)
        return total



def _cell_path(mu: _MuCells, x: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(mu.cell(t) for t in x) + (mu.END,)

