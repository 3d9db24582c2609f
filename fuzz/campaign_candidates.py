"""The candidate pipeline: from a pattern that crossed its screening level to a confirmed failure.

Every family's tests screen at a fixed loose level (``screen_alpha``, not spent from α); a
pattern that crosses it is a *candidate*. Before a fresh engine is started for it, it is
checked against what is known (:meth:`CandidatesMixin._candidate`):

1. a stored calibration bug (the target's own sampler fails, whatever the speculation):
   :meth:`~CandidatesMixin._known_calibration`;
2. a stored entry of the same signature: confirmed once per run on the running engine, then
   marked seen again;
3. a stored speculation finding met under more sampling settings or another method of the
   same engine path: :meth:`~CandidatesMixin._known_finding`;
4. speculation off on the speculation-off engine (a failure there too makes it a calibration
   bug, confirmed and shrunk with speculation off), and screened again alone on the running
   engine (a candidate that failed only among its family's other patterns, or by chance,
   passes there).

What is left is confirmed on a freshly started engine with fresh samples at the level of
the campaign's next confirmation, α_j, spent from the α ledger that every worker and resumed
run shares (:meth:`~CandidatesMixin._confirm`, ``fuzz/ledger.py``). Only a confirmed failure
counts: the search then shrinks it.
"""

from __future__ import annotations

import itertools
import math
import time
from pathlib import Path
from typing import Callable

from specfuzz.case import Case
from specfuzz.engines.isolation import IsolatedEngine
from specfuzz.errors import AmbiguousSemantics, InvalidInput
from specfuzz.fuzz.corpus import active_features, reduced_to_features
from specfuzz.fuzz.ledger import confirmation_seed
from specfuzz.fuzz.run import CaseRun
from specfuzz.fuzz.triage import symptom
from specfuzz.oracle.law import OutputSpaceTooLarge

# Reductions of a candidate tried against one stored calibration entry whose own features the
# oracle refuses (Campaign._reduced_calibration).
MAX_CALIBRATION_REDUCTIONS = 16
# A confirmation samples up to this many times --samples: as many as the candidate's own run
# suggests its level needs (confirmation_samples), since a fresh start costs far more than
# samples (a GPU engine's start takes tens of seconds; it samples hundreds per second).
CONFIRM_MAX_FACTOR = 8
# Margin on that estimate (the evidence of a run of n samples grows about linearly in n).
CONFIRM_MARGIN = 1.5


class CandidatesMixin:
    """Known-bug checks and fresh confirmations of candidates (a part of
    :class:`~specfuzz.fuzz.campaign.Campaign`)."""

    def _candidate(self, run: CaseRun, speculation: bool, next_seed: Callable[[], int]) -> tuple[CaseRun, int] | None:
        """A search's candidate ``run`` through the pipeline (the module docstring): its
        confirmation and confirmation index j where it is a new failure, confirmed on a fresh
        engine (then kept on disk as this worker's pending record until it is shrunk and stored;
        ``_spec_off_found`` says whether it is a calibration bug); None where it is a known bug
        met again, passes when checked again, or does not confirm. ``next_seed``: the search's
        seeds, one per run."""
        if speculation and self._known_calibration(run, next_seed()):
            return None  # a stored calibration bug, met under another speculation setting
        if (sig := self._entry_for(run).signature) in self.known:
            # A known bug: confirmed once per run, then marked seen again.
            if sig not in self.seen_again and self._confirm(run, speculation, engine=self.engine)[0].failed:
                self.seen_again.add(sig)
                self._update_known(run)
            return None
        if speculation and self._known_finding(run, next_seed()):
            return None  # a stored speculation finding, met under more sampling settings
        cand, spec, pre = run, speculation, None
        # Its fresh confirmation's engine starts now, in the background, while the
        # checks below run on the running engines (speculation off, screened again):
        # with speculation off where most candidates confirmed so far were calibration
        # bugs (the kind of start a confirmation most likely needs).
        ahead = speculation and not self._calibration_likely()
        self._prestart_fresh(run.case, ahead)
        if speculation:
            # Speculation off first, on the running speculation-off engine (its tables
            # swapped in and checked): where the target's own sampler fails too, the
            # bug is not speculation's, and it is confirmed on a fresh engine with
            # speculation off (the entry it makes is a calibration entry: its
            # evidence is then a fresh speculation-off run) and shrunk with
            # speculation off (no candidates that only change speculation knobs, which
            # such a run ignores; candidates swap into the speculation-off engine).
            pre = self._calibrate(run.case, seed=next_seed(), alpha=self.cfg.screen_alpha)
            if pre.crash is not None:
                self.on_event(f"the speculation-off engine crashed on a candidate ({pre.crash.kind}: "
                              f"{pre.crash.detail[:120]}); it goes on with speculation on", self.stats)
            if pre.failed:
                cand, spec = pre, False
            if spec != ahead:
                self._prestart_fresh(run.case, spec)  # the other kind after all
        if spec == speculation:
            # Screened again alone, on the running engine (fresh samples, the screening
            # level), before a fresh engine starts for it: the confirmation runs it alone
            # too, and a fresh start costs far more than a run. A candidate that failed
            # only among the family's other patterns (vLLM's top-p kernel runs on batches
            # of 8+ rows) or by chance passes here. (The speculation-off run above is
            # this second look for a calibration bug.)
            again = self._run([run.case], [self.cfg.screen_alpha], next_seed(), speculation=spec)[0]
            if again.crash is not None:
                self._end_fresh_prestart("the candidate crashed the engine when screened again")
                self._record_crash(run.case, again.crash, [run.case])  # a finding of its own
                return None
            if not again.failed:
                self.stats.rescreened_out += 1
                self._end_fresh_prestart("the candidate passed when screened again")
                return None
        conf, j = self._confirm(cand, spec)
        if not conf.failed:
            return None
        self._spec_off_found = not spec and speculation
        self._confirmed_kinds[int(self._spec_off_found)] += 1
        # Kept on disk until the failure is shrunk and stored: a campaign killed (or
        # its machine lost) meanwhile stores it unshrunk when it resumes.
        self._write_pending(conf, j, pre if spec else None)
        return conf, j

    def _confirm(self, run: CaseRun, speculation: bool, engine: IsolatedEngine | None = None) -> tuple[CaseRun, int]:
        """A candidate run again on fresh samples (its own seed window), on a freshly
        started engine, at the next confirmation's α_j (spent and written to the ledger
        first); returns the run and j. ``engine``: on that running engine instead (a known
        bug met again: its tables swapped in and checked, its state reset, no fresh start)."""
        j, a = self.ledger.spend()
        t0 = time.monotonic()
        if engine is not None:
            self._reset_state(engine)  # () where no engine runs there yet
        conf = self._run([run.case], [a], confirmation_seed(j), speculation=speculation, fresh=engine is None,
                         engine=engine, max_samples=confirmation_samples(run, a, self.cfg.max_samples))[0]
        self.stats.confirmations += 1
        self.stats.confirmed += int(conf.failed)
        self.stats.unconfirmed_s += 0.0 if conf.failed else time.monotonic() - t0  # engine start included
        self.stats.budget = self.ledger.read()
        return conf, j

    def _reset_state(self, engine: IsolatedEngine) -> tuple[str, ...]:
        """Reset ``engine``'s state that outlives a request before a candidate runs on it again
        (:meth:`IsolatedEngine.reset_state`); counted in ``stats.state_resets``."""
        reset = engine.reset_state()
        self.stats.state_resets += int(bool(reset))
        return reset

    def _calibrate(self, case: Case, seed: int, alpha: float) -> CaseRun:
        """The same engine, speculation off, on the failing pattern (at the level of the
        confirmation that let it be stored: it only decides the entry's kind)."""
        if self._spec_off_engine is None:
            self._spec_off_engine = self._new_engine()
        return self._run([case], [alpha], seed, speculation=False, engine=self._spec_off_engine)[0]

    def _known_finding(self, run: CaseRun, seed: int) -> bool:
        """Whether a speculative candidate is a stored speculation finding met again under more
        sampling settings, or under another method of the same engine path.

        A stored finding of this engine whose method is the candidate's, or another method the
        engine runs through the same implementation (``Capabilities.spec_paths``) or, for a
        finding whose sampling features are all ones the verifier's sampler applies, verifies
        with the same sampler (``Capabilities.verify_samplers``, ``shared_code``), whose
        sampling features are the candidate's, or some of them (and whose attribution does not
        differ from the candidate's where both are attributed): the candidate reduced to those
        features (the others back at their defaults: the case the stored bug is met on, with
        this table, prompt and speculation config) runs on the running engine at the screening
        level. If it fails (under another method, with the stored finding's symptom too:
        ``triage.symptom``, past the end, another impossible output, or frequencies only), the
        candidate is that finding met again: the entry is marked seen again (once per run and
        method, after a confirmation at the next α_j on the same engine, as any known bug; the
        other method is recorded in its ``extra.also_seen_under``) and the candidate is not
        confirmed afresh, shrunk or stored as a variant: one engine bug met with more sampling
        settings, or under another method that runs through the same worker (SGLang's EAGLE,
        EAGLE-3 and STANDALONE), stays one entry. The candidate's own method's findings are
        tried first. The stored bug masks a second one only while the stored one is not fixed:
        a variant whose reduction passes, or shows another symptom, goes on as any candidate.

        The running engine's state that outlives a request (the prefix cache, SGLang's n-gram
        trie) is reset before the reduced run, as the swap before the candidate's own run reset
        it: SGLang's NGRAM zero padding shows only while the trie holds no continuation, so on
        the candidate's filled trie the reduced case would pass and the candidate be stored
        again as a new variant."""
        case_json = run.case.to_json()
        method = (case_json.get("spec") or {}).get("method")
        if not method or not self.finding_entries:
            return False
        name = str(self.engine.version().get("name"))
        caps = self.engine.capabilities()
        feats = set(active_features(case_json))
        label = attributed_label(run)
        matches = sorted(((k[1] == method, len(k[2]), k, shared) for k in self.finding_entries
                          if k[0] == name and set(k[2]) <= feats
                          and (shared := caps.shared_code(method, k[1], k[2])) is not None), reverse=True)
        for same, _, key, shared in matches:
            path, stored_label, stored_sig = self.finding_entries[key]
            if label not in (None, "unknown") and stored_label not in (None, "unknown") and label != stored_label:
                continue
            try:
                case = Case.from_json(reduced_to_features(case_json, key[2]))
                self._reset_state(self.engine)
                reduced = self._run([case], [self.cfg.screen_alpha], seed, speculation=True)[0]
            except (InvalidInput, AmbiguousSemantics, OutputSpaceTooLarge, ValueError, TypeError):
                continue
            self.stats.finding_checks += 1
            if reduced.crash is not None or not reduced.failed:
                continue
            shown = None
            if not same:
                try:
                    shown = symptom(reduced.case.to_json(), reduced.counts, self._profile or caps.profile)
                except (InvalidInput, AmbiguousSemantics, OutputSpaceTooLarge, ValueError, TypeError):
                    continue
                if shown != self._stored_symptom(stored_sig):
                    continue
            seen_key = stored_sig if same else f"{stored_sig} under {method}"
            first = seen_key not in self.seen_again  # marked once per run, by whichever check meets it first
            if not self._confirmed_seen_again(seen_key, path, reduced, True, self.engine, None if same else method):
                continue
            if first:
                how = "" if same else f" under {method} (stored under {key[1]}; one engine path, {shared}; symptom: {shown})"
                self.on_event(f"speculation finding seen again{how} (the candidate fails reduced to its features): {path.name}",
                              self.stats)
            self.stats.findings_known += 1
            return True
        return False

    def _stored_symptom(self, signature: str) -> str | None:
        """The symptom (triage.symptom) of the stored finding ``signature``'s counts, once per run."""
        if signature not in self._finding_symptoms:
            evidence = self._finding_evidence.get(signature)
            try:
                self._finding_symptoms[signature] = None if evidence is None else symptom(*evidence)
            except (InvalidInput, AmbiguousSemantics, OutputSpaceTooLarge, ValueError, TypeError, KeyError):
                self._finding_symptoms[signature] = None
        return self._finding_symptoms[signature]

    def _confirmed_seen_again(self, key, path: Path, run: CaseRun, speculation: bool, engine: IsolatedEngine,
                              also_under: str | None = None) -> bool:
        """A stored entry (``path``; ``key`` in :attr:`seen_again`) met again by ``run``: marked
        seen again once per run, after a confirmation of ``run`` at the next α_j on the running
        ``engine`` (a known bug is not started afresh); ``also_under``: the speculation method
        it was met under, when not its own (recorded with the entry). False when that
        confirmation passes; True when it fails or the entry was marked earlier in this run."""
        if key in self.seen_again:
            return True
        if not self._confirm(run, speculation, engine=engine)[0].failed:
            return False
        self.seen_again.add(key)
        if self._mark_seen(path, also_under):
            self.stats.findings_updated += 1
        return True

    def _known_calibration(self, run: CaseRun, seed: int) -> bool:
        """Whether a speculative candidate is a stored calibration bug met again.

        A stored calibration entry of this engine (corpus.calibration_key: any speculation
        method) whose sampling features are the case's, or some of them: the case is run with
        speculation off on the speculation-off engine (its tables swapped in and checked) at
        the screening level, and, where the entry has fewer features, so is the case with the
        others back at their defaults (the case the stored bug is met on). If both fail, the
        candidate is the target sampler's bug, not speculation's: the entry is marked seen
        again (once per run, after a confirmation with speculation off at the next α_j, on the
        same engine: a known bug is not started afresh) and the candidate is not confirmed,
        shrunk or stored again. Otherwise it goes on as any candidate."""
        name = str(self.engine.version().get("name"))
        case_json = run.case.to_json()
        feats = set(active_features(case_json))
        # The stored entries this case could be met on: same features first, then the largest subsets.
        matches = sorted(((len(key[1]), key) for key in self.calibration_entries
                          if key[0] == name and set(key[1]) <= feats), reverse=True)
        if not matches:
            return False
        self.stats.calibration_checks += 1
        calib = self._calibrate(run.case, seed=seed, alpha=self.cfg.screen_alpha)
        if not calib.failed:
            return False
        for n, key in matches:
            if n == len(feats):
                reduced = calib
            else:
                reduced = self._reduced_calibration(case_json, key[1], feats, seed + 1)
                if reduced is None or not reduced.failed:
                    continue
            path = self.calibration_entries[key]
            first = key not in self.seen_again
            if not self._confirmed_seen_again(key, path, reduced, False, self._spec_off_engine):
                continue
            if first:
                self.on_event(f"calibration bug seen again (speculation off fails too): {path.name}", self.stats)
            self.stats.calibration_known += 1
            return True
        return False

    def _reduced_calibration(self, case_json: dict, features: tuple[str, ...], feats: set[str], seed: int) -> CaseRun | None:
        """The candidate reduced to a stored calibration entry's ``features`` (the others back at
        their defaults), run with speculation off at the screening level. Where the oracle refuses
        that case (e.g. a top-p boundary tie once a penalty that broke it is gone: ambiguous
        semantics; or an output space too large once ignore_eos is off), the reductions that keep
        one more of the candidate's features, then two, ... (at most MAX_CALIBRATION_REDUCTIONS),
        are tried in turn and the first one the oracle takes is run, so that e.g. a stored top-p
        bug met with ignore_eos, min_tokens and a repetition penalty is still recognised. None:
        no reduction could be run."""
        extra = sorted(feats - set(features))
        why = ""
        tries = itertools.chain.from_iterable(itertools.combinations(extra, k) for k in range(len(extra)))
        for more in itertools.islice(tries, MAX_CALIBRATION_REDUCTIONS):
            try:
                case = Case.from_json(reduced_to_features(case_json, tuple(features) + more))
                return self._calibrate(case, seed=seed, alpha=self.cfg.screen_alpha)
            except (InvalidInput, AmbiguousSemantics, OutputSpaceTooLarge, ValueError, TypeError) as exc:
                why = why or f"{type(exc).__name__}: {str(exc)[:120]}"
        self.on_event(f"no reduction to the features {list(features)} of a stored calibration entry could be run ({why})", self.stats)
        return None


def confirmation_samples(run: CaseRun, alpha: float, samples: int) -> int:
    """Most samples of a confirmation at level ``alpha`` of a candidate whose screening run is
    ``run``, where every family samples ``samples`` at most: the samples at which the run's
    evidence, growing at the rate it showed, would reach 1/alpha (with CONFIRM_MARGIN), between
    ``samples`` and CONFIRM_MAX_FACTOR x ``samples``. A candidate screened at 1e-3 with 1000
    samples and confirmed at an α_j of 1e-9 needs about three times the evidence: with only
    ``samples`` its confirmation would often not reach its level, a fresh engine start spent for
    nothing. The test is anytime-valid and stops at its level,
    so a decisive failure (an output μ forbids) still stops at once; sizing the confirmation
    from an earlier, independent run does not change its false-alarm level."""
    j = run.judgement
    log_e = None if j is None else j.verdict.log_e
    if log_e is None or not math.isfinite(log_e) or log_e <= 0 or run.n <= 0 or not 0 < alpha < 1:
        return samples
    need = math.ceil(CONFIRM_MARGIN * run.n * math.log(1 / alpha) / log_e)
    return int(min(CONFIRM_MAX_FACTOR * samples, max(samples, need)))


def attributed_label(run: CaseRun) -> str | None:
    """The attributed class of a judged run (None: not judged or not attributed)."""
    j = run.judgement
    return None if j is None or j.attribution is None else j.attribution.label
