"""bench/check_swaps.py, the engine-generic swap check the H200 runs, on the reference engine here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import check_swaps  # noqa: E402


def test_random_tables_have_no_ties_and_are_exact_in_bfloat16():
    for V in (3, 8, 100):
        t = check_swaps.random_table(np.random.default_rng(V), V)  # [V, V]
        assert all(len(set(row)) == V for row in t.tolist())
        k = t * 8  # multiples of 1/8 with at most 8 significant bits: exact in bfloat16 and float16
        assert np.array_equal(k, np.round(k)) and np.abs(k).max() <= 255


@pytest.mark.slow
def test_check_swaps_samples_every_table_of_every_method_and_finds_nothing_on_the_reference_engine(tmp_path):
    out = tmp_path / "swaps.json"
    rc = check_swaps.main(["--engine", "reference", "--tables", "2", "--samples", "40", "--method", "none",
                           "--method", "ngram_tree", "--variant", "explicit", "--out", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0
    rows = {r["method"]: r for r in report["rows"]}
    assert set(rows) == {"none", "ngram_tree"}
    for r in rows.values():
        # 3 table models per method, 2 request patterns each, all sampled and judged.
        assert sum(r["verdicts"].values()) == 6 and not r["fails"] and not r["crashes"]
        # One start, then every table model swapped in (the reference engine swaps target and draft).
        assert r["starts"] == 1 and r["swaps"] == 2 and not r["fallbacks"] and not r["fresh_checks_failed"]


@pytest.mark.slow
def test_check_swaps_never_samples_a_table_whose_swap_failed_its_check_and_stops_after_repeated_fallbacks(tmp_path):
    out = tmp_path / "swaps.json"
    rc = check_swaps.main(["--engine", "tests.example_engines:StaleSwapEngine", "--tables", "3", "--samples", "40",
                           "--method", "ngram", "--variant", "explicit", "--max-fallbacks", "2", "--out", str(out)])
    row = json.loads(out.read_text())["rows"][0]
    assert rc == 1  # failed checks make the run fail
    failed = [f for f in row["fallbacks"] if f["event"] == "table check failed after swap"]
    assert len(failed) == 2 and all(f.get("stale_weights") for f in failed)
    assert row["swaps"] == 0 and "stopped at table 3" in row["stopped"]
    # Every sampled table model ran on a freshly started (and checked) engine: none fails μ.
    assert row["verdicts"] == {"pass": 6} and not row["fails"]
