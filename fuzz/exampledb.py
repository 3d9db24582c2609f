"""The campaign's Hypothesis example database: failing examples, shared by every engine actor.

A search saves the failing examples Hypothesis finds and shrinks (keyed by the search's
start shape), so a campaign killed while shrinking replays its failure first when it is
started again. :class:`FailuresOnly` keeps just those: the targeting phase's Pareto front
(``<key>.pareto``), which Hypothesis would otherwise write for nearly every example and
replay up to 30 of at each search's start, is left out, so a search begins with new
examples rather than old high-evidence ones.

On Ray, :class:`ExampleStore` is an actor on the driver's node that owns the database
folder (``<corpus>/.specfuzz/hypothesis``, the same folder a campaign without Ray uses,
so examples survive a restart with or without Ray), and :class:`RayExampleDatabase` is
Hypothesis's :class:`~hypothesis.database.ExampleDatabase` interface in front of it: an
example one host found is replayed by every actor whose search meets the same start
shape, here or on another host, and by the next run.

What crosses the wire: keys and values are Hypothesis's own byte strings (a digest and a
choice sequence, a few hundred bytes). Saves, deletes and moves are sent without waiting
(calls from one actor reach the store in order; the database is a cache, so a save lost
with a dying actor costs a replay, never a corpus entry); fetches wait for the answer.
"""

from __future__ import annotations

from typing import Iterable

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

# Hypothesis's sub-key of the targeting phase's Pareto front.
PARETO_SUFFIX = b".pareto"


class FailuresOnly(ExampleDatabase):
    """``inner`` without the Pareto front: failing examples (primary and secondary keys) only."""

    def __init__(self, inner: ExampleDatabase) -> None:
        super().__init__()
        self.inner = inner

    @staticmethod
    def _kept(key: bytes) -> bool:
        return not bytes(key).endswith(PARETO_SUFFIX)

    def save(self, key: bytes, value: bytes) -> None:
        if self._kept(key):
            self.inner.save(key, value)

    def fetch(self, key: bytes) -> Iterable[bytes]:
        if self._kept(key):
            yield from self.inner.fetch(key)

    def delete(self, key: bytes, value: bytes) -> None:
        if self._kept(key):
            self.inner.delete(key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        if self._kept(src) and self._kept(dest):
            self.inner.move(src, dest, value)
        elif self._kept(dest):
            self.inner.save(dest, value)
        elif self._kept(src):
            self.inner.delete(src, value)

    def __repr__(self) -> str:
        return f"FailuresOnly({self.inner!r})"


class ExampleStore:
    """The database folder behind every actor's :class:`RayExampleDatabase` (run as a Ray actor)."""

    def __init__(self, path: str) -> None:
        self.db = DirectoryBasedExampleDatabase(path)
        self.ops = {"save": 0, "fetch": 0, "delete": 0, "move": 0}

    def save(self, key: bytes, value: bytes) -> None:
        self.ops["save"] += 1
        self.db.save(key, value)

    def fetch(self, key: bytes) -> list[bytes]:
        self.ops["fetch"] += 1
        return list(self.db.fetch(key))

    def delete(self, key: bytes, value: bytes) -> None:
        self.ops["delete"] += 1
        self.db.delete(key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.ops["move"] += 1
        self.db.move(src, dest, value)

    def counts(self) -> dict:
        """Operations served so far (the summary shows them)."""
        return dict(self.ops)


class RayExampleDatabase(ExampleDatabase):
    """Hypothesis's database interface backed by an :class:`ExampleStore` actor."""

    def __init__(self, store) -> None:
        super().__init__()
        self.store = store

    def save(self, key: bytes, value: bytes) -> None:
        self.store.save.remote(bytes(key), bytes(value))

    def fetch(self, key: bytes) -> Iterable[bytes]:
        import ray

        yield from ray.get(self.store.fetch.remote(bytes(key)))

    def delete(self, key: bytes, value: bytes) -> None:
        self.store.delete.remote(bytes(key), bytes(value))

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.store.move.remote(bytes(src), bytes(dest), bytes(value))

    def __repr__(self) -> str:
        return f"RayExampleDatabase({self.store!r})"
