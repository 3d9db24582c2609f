"""The campaign's Hypothesis database: failing examples kept (not the Pareto front), replayed first.

A search is a seeded Hypothesis run (``@seed`` inside ``@settings``, as in
``Campaign._search``): Hypothesis switches the database off for a seeded test unless the
settings are applied over the seed, so these tests pin that arrangement down with a real
Hypothesis run and a real database folder.
"""

from __future__ import annotations

from hypothesis import given, seed, settings, strategies as st, target
from hypothesis.database import DirectoryBasedExampleDatabase

from specfuzz.fuzz.exampledb import PARETO_SUFFIX, FailuresOnly


class _Recording(DirectoryBasedExampleDatabase):
    def __init__(self, path) -> None:
        super().__init__(path)
        self.saved_keys: list[bytes] = []

    def save(self, key: bytes, value: bytes) -> None:
        self.saved_keys.append(bytes(key))
        super().save(key, value)


def _search(db, s: int, seen: list):
    def f(x: int) -> None:
        seen.append(x)
        target(float(x), label="x")  # the campaign targets its evidence; Hypothesis keeps a Pareto front for it
        assert x < 700

    f._hypothesis_internal_add_digest = b"one start shape"  # as Campaign._search keys a shape
    return settings(database=db, max_examples=300, deadline=None)(seed(s)(given(st.integers(0, 1000))(f)))


def test_seeded_search_saves_its_failure_without_the_pareto_front_and_the_next_search_replays_it_first(tmp_path):
    inner = _Recording(tmp_path / "db")
    db = FailuresOnly(inner)
    first: list = []
    try:
        _search(db, 1, first)()
        raise AssertionError("the search did not fail")
    except AssertionError as exc:
        assert "x < 700" in str(exc) or "assert" in str(exc)
    assert inner.saved_keys, "a seeded search saved nothing: the database was switched off"
    assert not [k for k in inner.saved_keys if k.endswith(PARETO_SUFFIX)]
    second: list = []
    try:
        _search(db, 2, second)()
    except AssertionError:
        pass
    assert second[0] == 700 == min(x for x in first if x >= 700)


def test_failures_only_drops_pareto_keys_and_passes_the_rest(tmp_path):
    db = FailuresOnly(DirectoryBasedExampleDatabase(tmp_path / "db"))
    db.save(b"k", b"v1")
    db.save(b"k" + PARETO_SUFFIX, b"p")
    db.move(b"k", b"k.secondary", b"v1")
    db.move(b"k.secondary", b"k" + PARETO_SUFFIX, b"v1")
    assert list(db.fetch(b"k")) == [] and list(db.fetch(b"k.secondary")) == []
    assert list(db.fetch(b"k" + PARETO_SUFFIX)) == []
    db.save(b"k", b"v2")
    assert list(db.fetch(b"k")) == [b"v2"]
    db.delete(b"k", b"v2")
    assert list(db.fetch(b"k")) == []
