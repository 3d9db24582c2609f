"""Validating a logit table and rounding it to what a checkpoint dtype can hold.

A table is a square float array ``L[prev, next]`` of shape [V, V]. What a checkpoint of
dtype ``d`` reproduces exactly is ``round_table(L, d)``: every value converted to float32
(round to nearest even), then to ``d`` (round to nearest even, via torch's cast), held
in a float32 array (zeros are +0.0). ``-inf`` (a masked token) becomes :data:`MASKED_LOGIT`, because an
infinite lm_head entry times the 0.0 entries of the one-hot hidden vector is NaN.
"""

from __future__ import annotations

import numpy as np

from specfuzz.errors import InvalidInput
from specfuzz.tablegen.vocab import MAX_VOCAB

# Checkpoint dtypes and the matching torch dtype names.
DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")

# Stand-in for -inf (a masked token). -2**15 is exact in float32, bfloat16 and float16,
# and exp(MASKED_LOGIT - m) is exactly 0.0 in float32 whenever the row maximum
# m > MASKED_LOGIT + 104 (float32 underflows below exp(-103.98)), so the masked token
# gets probability exactly 0 from a float32 softmax at temperature 1. (At temperature T
# the condition is m - MASKED_LOGIT > 104 * T; an engine that divides by T < 1 in
# float16 will see -inf, which is also probability 0.)
MASKED_LOGIT: float = -32768.0

MIN_VOCAB = 2


def _torch_dtype(dtype: str):  # -> torch.dtype
    import torch

    if dtype not in DTYPES:
        raise InvalidInput("dtype", dtype, f"one of {list(DTYPES)}")
    return getattr(torch, dtype)


def check_shape(table: np.ndarray) -> int:
    """The vocabulary size V of a [V, V] table; raises InvalidInput otherwise."""
    shape = tuple(np.shape(table))
    allowed = f"a square 2-D array [V, V] with {MIN_VOCAB} <= V <= MAX_VOCAB={MAX_VOCAB}"
    if len(shape) != 2 or shape[0] != shape[1] or not MIN_VOCAB <= shape[0] <= MAX_VOCAB:
        raise InvalidInput("table.shape", shape, allowed)
    return shape[0]


def round_table(table: np.ndarray, dtype: str) -> np.ndarray:
    """The [V, V] float32 table of values a ``dtype`` checkpoint of ``table`` holds.

    Rounds to nearest even (through float32 first), maps -inf to MASKED_LOGIT, and
    raises InvalidInput for a bad shape, NaN, +inf, or a finite value that overflows
    ``dtype``.
    """
    torch_dtype = _torch_dtype(dtype)
    arr = np.asarray(table)  # [V, V]
    if arr.dtype.kind not in "biuf":
        raise InvalidInput("table.dtype", str(arr.dtype), "a real numeric array")
    check_shape(arr)
    wide = arr.astype(np.float64)  # [V, V]
    for bad, what in ((np.isnan(wide), "NaN"), (wide == np.inf, "+inf")):
        if bad.any():
            i, j = (int(k) for k in np.argwhere(bad)[0])
            raise InvalidInput(
                f"table[{i}, {j}]", float(wide[i, j]),
                f"a finite value or -inf (masked); {what} is not allowed",
            )
    masked = wide == -np.inf  # [V, V]
    wide = np.where(masked, MASKED_LOGIT, wide)  # [V, V]

    import torch

    with np.errstate(over="ignore"):
        as_f32 = wide.astype(np.float32)  # [V, V]
    rounded = torch.from_numpy(as_f32).to(torch_dtype).to(torch.float32).numpy()  # [V, V]
    overflow = ~np.isfinite(rounded)
    if overflow.any():
        i, j = (int(k) for k in np.argwhere(overflow)[0])
        limit = float(torch.finfo(torch_dtype).max)
        raise InvalidInput(
            f"table[{i}, {j}]", float(wide[i, j]),
            f"a value that does not overflow {dtype} (|x| <= about {limit:.6g})",
        )
    # -0.0 -> +0.0: the sign of a zero logit is not something an engine can promise.
    return np.ascontiguousarray(rounded + np.float32(0.0), dtype=np.float32)


def rounding_changed(table: np.ndarray, rounded: np.ndarray) -> bool:
    """Whether ``rounded`` differs from ``table`` at any entry that is not -inf."""
    wide = np.asarray(table).astype(np.float64)  # [V, V]
    finite = np.isfinite(wide)  # [V, V]
    return bool((rounded.astype(np.float64)[finite] != wide[finite]).any())
