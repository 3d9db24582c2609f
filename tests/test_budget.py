"""The two-stage α budget: screening at a fixed level, confirmation spent per confirmation.

What is checked: the confirmation levels and what they add up to; that a campaign's
false stored findings stay below α however many candidates the screening makes (a
simulation of many campaigns on a null process, with the real e-process and the real
budget, and a budget that does not spend as the negative control); migration of the
per-family spender of old campaign states; the ledger shared by concurrent workers and
resumed runs; and, on the correct reference engine, that a screen loose enough to make
candidates stores nothing and confirms each candidate on seeds no screening run used.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specfuzz.errors import InvalidInput
from specfuzz.fuzz.campaign import STATE_SCHEMA_VERSION, Campaign, CampaignConfig
from specfuzz.fuzz.ledger import CONFIRM_SEED_BASE, CONFIRM_SEED_STRIDE, AlphaLedger, confirmation_seed
from specfuzz.oracle.budget import SCREEN_ALPHA, AlphaSpender, ConfirmationBudget
from specfuzz.oracle.eprocess import SequentialTest

ROOT = Path(__file__).resolve().parents[1]

# ----------------------------------------------------------------- the sequence


@settings(max_examples=100, deadline=None)
@given(st.floats(1e-9, 0.999), st.floats(0.0, 0.999), st.integers(0, 3000), st.integers(0, 50))
def test_confirmation_levels_stay_within_alpha_and_resume_from_the_stored_budget(total, legacy_share, k, more):
    b = ConfirmationBudget(total, legacy_spent=total * legacy_share)
    given_out = []
    for want in range(1, k + 1):
        b, j, a = b.spend()
        assert j == want and a == pytest.approx(b.available / (j * (j + 1)))
        given_out.append(a)
    assert b.legacy_spent + math.fsum(given_out) <= total
    assert b.spent == pytest.approx(b.legacy_spent + math.fsum(given_out), rel=1e-9, abs=1e-300)
    assert b.remaining > 0 and b.next_alpha < b.remaining
    resumed = ConfirmationBudget.from_dict(json.loads(json.dumps(b.to_dict())))
    assert resumed == b
    for _ in range(more):
        resumed, _, ra = resumed.spend()
        b, _, a = b.spend()
        assert ra == a


def test_first_confirmation_gets_half_the_budget_whatever_the_number_of_families_screened():
    b = ConfirmationBudget(1e-3)
    assert b.next_alpha == pytest.approx(5e-4)
    assert [b.alpha_of(j) for j in (1, 2, 3)] == pytest.approx([5e-4, 1e-3 / 6, 1e-3 / 12])
    assert 0.0 < SCREEN_ALPHA < 1.0


def test_migration_keeps_what_the_per_family_spenders_of_every_worker_spent():
    olds = [AlphaSpender(5e-4, 143), AlphaSpender(5e-4, 10)]
    b = ConfirmationBudget.migrate([json.loads(s.to_json()) for s in olds])
    assert b.alpha_total == pytest.approx(1e-3)
    assert b.legacy_spent == pytest.approx(olds[0].spent + olds[1].spent)
    assert b.spent == pytest.approx(b.legacy_spent)
    for _ in range(1000):
        b, _, _ = b.spend()
    assert b.spent < b.alpha_total


@pytest.mark.parametrize("call", [
    lambda: ConfirmationBudget(0.0),
    lambda: ConfirmationBudget(1.0),
    lambda: ConfirmationBudget(1e-3, -1),
    lambda: ConfirmationBudget(1e-3, 0, 1e-3),
    lambda: ConfirmationBudget(1e-3, 0, float("nan")),
    lambda: ConfirmationBudget(1e-3).alpha_of(0),
    lambda: ConfirmationBudget.from_dict({"kind": "alpha_spender", "schema_version": 1}),
    lambda: ConfirmationBudget.from_dict({"kind": "confirmation_budget", "schema_version": 1}),
    lambda: ConfirmationBudget.migrate([]),
])
def test_bad_budget_input_raises_invalid_input(call):
    with pytest.raises(InvalidInput):
        call()


# ------------------------------------------------------ the guarantee, simulated

NULL = {(0,): 0.5, (1,): 0.5}  # what the engine samples: μ
BUG = {(0,): 0.6, (1,): 0.4}  # the catalogued alternative the test also bets on
LOOK, LOOKS = 20, 20  # a confirmation looks after every 20 samples, up to 400


def _log_e_after_looks() -> np.ndarray:
    """log e of the real mixture test after each look, per count of output (0,): ``[LOOKS, N+1]``
    (with tolerance 0 the e-process is a function of the counts)."""
    n_max = LOOK * LOOKS
    table = np.full((LOOKS, n_max + 1), -np.inf)
    for n0 in range(n_max + 1):
        t = SequentialTest(NULL, {"bug": BUG}, alpha=0.5)
        if n0:
            t.update_counts({(0,): n0})
        for k in range(LOOKS):
            n1 = LOOK * (k + 1) - n0
            if n1 < 0:
                continue
            if n1 > t.n - n0:
                t.update_counts({(1,): n1 - (t.n - n0)})
            table[k, n0] = t.log_e
    return table


def _false_stored_rate(levels: list[float], campaigns: int, table: np.ndarray, rng) -> float:
    """Share of campaigns on a correct engine that store a false finding, when every family
    is a candidate (the most a screen can do: every family is confirmed) and the j-th
    confirmation runs on fresh samples at ``levels[j-1]``."""
    fams = len(levels)
    zeros = rng.binomial(LOOK, 0.5, size=(campaigns * fams, LOOKS)).cumsum(axis=1)  # [C*F, LOOKS]
    sup = table[np.arange(LOOKS), zeros].max(axis=1).reshape(campaigns, fams)  # [C, F]
    return float(np.mean(np.any(sup >= np.log(1.0 / np.asarray(levels)), axis=1)))


def test_false_stored_findings_stay_below_alpha_whatever_the_screen_lets_through():
    alpha, families, campaigns = 0.2, 10, 4000
    table = _log_e_after_looks()
    rng = np.random.default_rng(16)
    b, levels = ConfirmationBudget(alpha), []
    for _ in range(families):
        b, _, a = b.spend()
        levels.append(a)
    rate = _false_stored_rate(levels, campaigns, table, rng)
    slack = 3 * math.sqrt(alpha * (1 - alpha) / campaigns)
    assert 0.0 < rate <= alpha * families / (families + 1) + slack, rate
    # Negative control: confirmations that do not spend (each at α) break the bound, so
    # this simulation can see a broken budget.
    broken = _false_stored_rate([alpha] * families, campaigns, table, rng)
    assert broken > alpha + slack, broken


# ------------------------------------------------------------------- the ledger


def test_ledger_resumes_its_count_and_migrates_schema_1_states_of_every_worker(tmp_path):
    state = tmp_path / ".specfuzz"
    state.mkdir()
    olds = {"state.json": AlphaSpender(5e-4, 143), "state-w1.json": AlphaSpender(5e-4, 9)}
    for name, sp in olds.items():
        (state / name).write_text(json.dumps({"schema_version": 1, "spender": json.loads(sp.to_json()), "searches": 3}))
    ledger = AlphaLedger(state, alpha=0.05)  # the stored campaign's α wins
    b = ledger.read()
    assert b.alpha_total == pytest.approx(1e-3) and b.legacy_spent == pytest.approx(sum(s.spent for s in olds.values()))
    assert ledger.spend() == (1, pytest.approx(b.alpha_of(1)))
    again = AlphaLedger(state, alpha=0.05)  # a resumed run: no second migration, the count goes on
    assert again.read().confirmations == 1 and again.spend()[0] == 2
    assert again.read().legacy_spent == b.legacy_spent


def test_concurrent_workers_never_share_a_confirmation_index(tmp_path):
    code = ("import sys; from specfuzz.fuzz.ledger import AlphaLedger; "
            "L = AlphaLedger(sys.argv[1], 1e-3); print(' '.join(str(L.spend()[0]) for _ in range(40)))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    got = [int(j) for p in procs for j in p.communicate(timeout=120)[0].split()]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(got) == list(range(1, 121))
    b = AlphaLedger(tmp_path, 1e-3).read()
    assert b.confirmations == 120 and b.spent < 1e-3


def test_corrupt_ledger_is_refused_and_only_reset_state_sets_it_aside(tmp_path):
    AlphaLedger(tmp_path, 1e-3).spend()
    (tmp_path / "alpha.json").write_text("{not json")
    with pytest.raises(InvalidInput, match="alpha.json.*--reset-state"):
        AlphaLedger(tmp_path, 1e-3)
    assert (tmp_path / "alpha.json").read_text() == "{not json"
    notes: list[str] = []
    fresh = AlphaLedger(tmp_path, 1e-3, reset=True, notes=notes)
    kept = list(tmp_path.glob("alpha.json.damaged-*"))
    assert len(kept) == 1 and kept[0].read_text() == "{not json" and kept[0].name in notes[0]
    assert fresh.read().confirmations == 0
    fresh.spend()
    assert AlphaLedger(tmp_path, 1e-3, reset=True).read().confirmations == 1  # a sound ledger goes on


def test_confirmation_seed_windows_are_disjoint_and_above_every_screening_seed():
    assert confirmation_seed(1) >= CONFIRM_SEED_BASE
    assert confirmation_seed(2) - confirmation_seed(1) == CONFIRM_SEED_STRIDE
    assert confirmation_seed(10**6) < 2**63  # an int64 seed


# ------------------------------------------------------------- campaign state


def test_schema_1_campaign_state_is_migrated_not_discarded(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / ".specfuzz").mkdir(parents=True)
    old = {"schema_version": 1, "spender": json.loads(AlphaSpender(1e-3, 143).to_json()), "searches": 14,
           "totals": {"seconds": 2074.5, "runs": 4, "methods": {"ngram": {"families": 8, "patterns": 17, "samples": 16750}}},
           "simplest_run": ["abc"]}
    (corpus / ".specfuzz" / "state.json").write_text(json.dumps(old))
    c = Campaign(CampaignConfig(corpus_dir=corpus, work_dir=tmp_path / "work"))
    try:
        assert c.search_index == 14 and c.simplest_run == {"abc"} and c.totals["runs"] == 5
        assert c.stats.budget.legacy_spent == pytest.approx(AlphaSpender(1e-3, 143).spent)
        c._save_state()
    finally:
        c.engine.close()
    new = json.loads((corpus / ".specfuzz" / "state.json").read_text())
    assert new["schema_version"] == STATE_SCHEMA_VERSION == 2
    assert new["legacy_spender"] == old["spender"] and "spender" not in new
    assert new["totals"]["methods"] == old["totals"]["methods"]


def test_campaign_state_of_a_newer_schema_is_refused_and_left_alone(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / ".specfuzz").mkdir(parents=True)
    text = json.dumps({"schema_version": 99, "totals": {"runs": 1}})
    (corpus / ".specfuzz" / "state.json").write_text(text)
    with pytest.raises(InvalidInput, match="schema_version"):
        Campaign(CampaignConfig(corpus_dir=corpus, work_dir=tmp_path / "work"))
    assert (corpus / ".specfuzz" / "state.json").read_text() == text


# --------------------------------------------------------- a real campaign


class _SeedLog(Campaign):
    """The campaign, recording the α and first seed of every run it makes."""

    def _run(self, cases, alphas, seed, speculation=True, engine=None, fresh=False, max_samples=None):
        self.runs_seen.append((tuple(alphas), seed))
        return super()._run(cases, alphas, seed, speculation, engine, fresh, max_samples)


@pytest.mark.slow
def test_loose_screen_on_the_correct_engine_makes_candidates_confirms_each_on_fresh_seeds_and_stores_nothing(tmp_path):
    # Screening at 0.9 with a look every sample or two on two-token models: false
    # candidates on purpose (about one pattern in four). Each is screened again alone first;
    # those that cross again are confirmed. The campaign stops after its second confirmation
    # (the budget is only a cap).
    cfg = CampaignConfig(budget_s=150, corpus_dir=tmp_path / "corpus", work_dir=tmp_path / "work", seed=3,
                         screen_alpha=0.9, batch=2, max_samples=20, max_vocab=2, max_tokens=2)

    def stop_after_two(msg, stats):
        if stats.confirmations >= 2:
            c.deadline = 0.0

    c = _SeedLog(cfg, on_event=stop_after_two)
    c.runs_seen = []
    stats = c.run()
    assert stats.candidates >= 2, stats
    assert stats.confirmations + stats.rescreened_out == stats.candidates and stats.confirmed == 0
    assert stats.stored == [] and not list((tmp_path / "corpus").glob("*.json"))
    b = AlphaLedger(tmp_path / "corpus" / ".specfuzz", 1e-3).read()
    assert b.confirmations == stats.confirmations and b.spent <= 1e-3
    confirms = [(a, s) for a, s in c.runs_seen if s >= CONFIRM_SEED_BASE]
    screens = [(a, s) for a, s in c.runs_seen if s < CONFIRM_SEED_BASE]
    assert [s for _, s in confirms] == [confirmation_seed(j) for j in range(1, b.confirmations + 1)]
    assert [a[0] for a, _ in confirms] == pytest.approx([b.alpha_of(j) for j in range(1, b.confirmations + 1)])
    assert screens and all(set(a) == {0.9} for a, _ in screens)
