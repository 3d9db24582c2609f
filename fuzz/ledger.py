"""The campaign's α ledger on disk: one per corpus, shared by its workers and resumed runs.

``<corpus>/.specfuzz/alpha.json`` holds the :class:`~specfuzz.oracle.budget.ConfirmationBudget`
(α total, confirmations spent, α spent before a migration). A confirmation takes its
index j and level α_j under an exclusive lock (``alpha.lock``, ``fcntl.flock``) and the
ledger is written (atomically) *before* the confirmation runs: two workers never get
the same j, and a run killed mid-confirmation has spent its α_j rather than hand it out
again after a resume. Each j also owns a window of engine seeds no screening run and no
other confirmation uses (:func:`confirmation_seed`), so a confirmation's samples are
fresh.

Campaign state written before the two-stage budget (schema 1) held one per-family
:class:`~specfuzz.oracle.budget.AlphaSpender` per worker; the first ledger of such a
corpus is migrated from all of them (their α adds up to the campaign's, what they spent
is kept as spent).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from specfuzz.errors import InvalidInput
from specfuzz.fuzz.corpus import atomic_write_json
from specfuzz.oracle.budget import ConfirmationBudget

LEDGER_FILE = "alpha.json"
LOCK_FILE = "alpha.lock"
# Confirmation j draws its requests' seeds from [BASE + j·STRIDE, BASE + (j+1)·STRIDE).
# Screening seeds stay below BASE (search seeds x 1,000,003 plus run offsets: below
# 2^62 for any campaign seed under 10^7; a worker's is --seed x 1000 + w), and every
# engine here takes 64-bit seeds.
CONFIRM_SEED_BASE = 2**62
CONFIRM_SEED_STRIDE = 2**24  # requests one confirmation may draw (16.7 million)


def confirmation_seed(j: int) -> int:
    """The first engine seed of the j-th confirmation (j >= 1)."""
    return CONFIRM_SEED_BASE + int(j) * CONFIRM_SEED_STRIDE


def legacy_spenders(state_dir: Path) -> list[dict]:
    """The per-family spenders of the campaign state files in ``state_dir`` (schema 1:
    ``spender``; schema 2 keeps it as ``legacy_spender``)."""
    out = []
    for path in sorted(Path(state_dir).glob("state*.json")):
        try:
            d = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            continue
        if not isinstance(d, dict):
            continue
        sp = d.get("spender") if d.get("schema_version") == 1 else d.get("legacy_spender")
        if isinstance(sp, dict):
            out.append(sp)
    return out


class AlphaLedger:
    """The shared confirmation budget of the corpus whose state folder is ``state_dir``.

    Opening it creates the ledger (``alpha`` total; migrated from schema-1 state files
    when there are any) or reads the existing one, whose α total wins over ``alpha``. A
    damaged ledger is refused (starting afresh would hand out α already spent) unless
    ``reset`` (``--reset-state``): then it is kept beside under a new name, a fresh one
    starts, and a line saying so goes to ``notes``.
    """

    def __init__(self, state_dir: Path, alpha: float, *, reset: bool = False, notes: list[str] | None = None) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / LEDGER_FILE
        with self._locked():
            if self.path.exists() and reset:
                try:
                    self._read()
                except InvalidInput:
                    kept = self._set_aside()
                    if notes is not None:
                        notes.append(f"--reset-state: kept the damaged α ledger as {kept}; starting a fresh one "
                                     "(α spending restarts)")
            if not self.path.exists():
                spenders = legacy_spenders(self.dir)
                budget = ConfirmationBudget.migrate(spenders) if spenders else ConfirmationBudget(alpha)
                atomic_write_json(self.path, budget.to_dict())
            self._read()  # a damaged ledger is refused now, before anything runs

    def _set_aside(self) -> Path:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target, i = self.path.with_name(f"{LEDGER_FILE}.damaged-{stamp}"), 1
        while target.exists():
            i += 1
            target = self.path.with_name(f"{LEDGER_FILE}.damaged-{stamp}-{i}")
        self.path.rename(target)
        return target

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _read(self) -> ConfirmationBudget:
        try:
            d = json.loads(self.path.read_text())
            return ConfirmationBudget.from_dict(d)
        except (OSError, json.JSONDecodeError, UnicodeDecodeError, RecursionError, InvalidInput) as exc:
            raise InvalidInput(
                "campaign α ledger", str(self.path),
                f"a readable alpha.json (this one: {type(exc).__name__}). It is left as it is (starting afresh would hand "
                "out α already spent); put back a copy of the corpus's .specfuzz/ folder, or run again with "
                "--reset-state to keep it aside and start a fresh ledger") from exc

    def read(self) -> ConfirmationBudget:
        """The budget now (every worker's confirmations included)."""
        with self._locked():
            return self._read()

    def spend(self) -> tuple[int, float]:
        """Take the next confirmation: ``(j, α_j)``, written to disk before it returns."""
        with self._locked():
            budget, j, a = self._read().spend()
            atomic_write_json(self.path, budget.to_dict())
        return j, a
