"""The campaign's false-alarm budget: how α is spread over the tests of a campaign."""

from __future__ import annotations

import json
from typing import Mapping

from specfuzz.errors import InvalidInput
from specfuzz.oracle.cells import SCHEMA_VERSION, _check_alpha, _is_int


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
