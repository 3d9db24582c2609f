"""Statistics for verdicts, re-exported from the modules that hold them (one per role).

* :mod:`specfuzz.oracle.cells`: laws as the tests see them (:class:`Law`,
  :class:`EnumeratedLaw`), cells per output prefix, input checks;
* :mod:`specfuzz.oracle.universal`: the universal tree e-process (KT per context,
  sparse mixture, tolerant bets by :func:`ripr_projection`);
* :mod:`specfuzz.oracle.eprocess`: the mixture e-process of one case
  (:class:`SequentialTest`, :func:`position_test`) and its power
  (:func:`kl_divergence`, :func:`optimal_sample_count`);
* :mod:`specfuzz.oracle.verdict`: :class:`Verdict`, :class:`TokenDeviation`, evidence;
* :mod:`specfuzz.oracle.attribution`: :class:`Attribution`, :func:`attribute`;
* :mod:`specfuzz.oracle.budget`: the campaign's false-alarm budget.

``from specfuzz.oracle.stats import ...`` keeps working for every name below.
"""

from __future__ import annotations

from specfuzz.oracle.attribution import ATTRIBUTION_ALPHA, ATTRIBUTION_MARGIN, Attribution, attribute
from specfuzz.oracle.budget import AlphaSpender
from specfuzz.oracle.cells import (
    CONDITIONAL_SUM_TOLERANCE,
    DISTRIBUTION_SUM_TOLERANCE,
    SCHEMA_VERSION,
    EnumeratedLaw,
    Law,
)
from specfuzz.oracle.eprocess import IDENTICAL_KL, SequentialTest, kl_divergence, optimal_sample_count, position_test
from specfuzz.oracle.universal import (
    KT_IMPOSSIBLE_TOTAL,
    KT_POSSIBLE_PRIOR,
    REFRESH_DIVISOR,
    SPARSE_DEPTH_DECAY,
    ripr_projection,
    universal_log_e,
)
from specfuzz.oracle.verdict import END_LABEL, MIN_EXPECTED_COUNT, OOV_LABEL, TokenDeviation, Verdict

__all__ = [
    "Law",
    "EnumeratedLaw",
    "Verdict",
    "TokenDeviation",
    "SequentialTest",
    "AlphaSpender",
    "Attribution",
    "attribute",
    "position_test",
    "kl_divergence",
    "optimal_sample_count",
    "ripr_projection",
    "universal_log_e",
    "SCHEMA_VERSION",
    "ATTRIBUTION_ALPHA",
    "ATTRIBUTION_MARGIN",
    "CONDITIONAL_SUM_TOLERANCE",
    "DISTRIBUTION_SUM_TOLERANCE",
    "END_LABEL",
    "IDENTICAL_KL",
    "KT_IMPOSSIBLE_TOTAL",
    "KT_POSSIBLE_PRIOR",
    "MIN_EXPECTED_COUNT",
    "OOV_LABEL",
    "REFRESH_DIVISOR",
    "SPARSE_DEPTH_DECAY",
]
