"""Shared by the SGLang adapter's tests: SGLang's source (read, never imported) and one table.

``SGLANG_SITE`` (default ``/tmp/sglang-gpu-bundle/site``): the unpacked SGLang 0.5.17 wheel,
read with ``ast`` (its compiled dependencies are for the GPU machine's Python); the fixtures
skip a test where it is missing.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import numpy as np
import pytest

SGLANG_SITE = Path(os.environ.get("SGLANG_SITE", "/tmp/sglang-gpu-bundle/site"))
V, EOS = 6, 5
PROMPT = (1, 2, 1, 2)
_rng = np.random.default_rng(2025)
T = (_rng.integers(-8, 9, (V, V)) / 4).astype(np.float32)  # [V, V] multiples of 1/4: exact in bfloat16


def _class_fields(path: Path, cls: str) -> frozenset[str]:
    """Annotated field names of a class in a source file (parsed, not imported)."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return frozenset(n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name))
    raise AssertionError(f"{cls} not found in {path}")


@pytest.fixture(scope="module")
def server_args_fields() -> frozenset[str]:
    path = SGLANG_SITE / "sglang/srt/server_args.py"
    if not path.is_file():
        pytest.skip(f"SGLang source not found at {SGLANG_SITE} (set SGLANG_SITE)")
    return _class_fields(path, "ServerArgs")


@pytest.fixture(scope="module")
def sampling_fields() -> frozenset[str]:
    path = SGLANG_SITE / "sglang/srt/sampling/sampling_params.py"
    if not path.is_file():
        pytest.skip(f"SGLang source not found at {SGLANG_SITE} (set SGLANG_SITE)")
    return _class_fields(path, "SamplingParams")

