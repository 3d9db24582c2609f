"""Bisection over engine releases: which release introduced a finding, and which one fixed it.

``bisect_entry`` replays a stored entry's case on engine releases, each in its own cached
environment (:mod:`specfuzz.fuzz.release_envs`, the engine adapter running there through
:class:`~specfuzz.engines.external.ExternalEngine`), with fresh samples and the same
anytime-valid test as ``specfuzz replay`` (a crash entry: the same crash, numbers aside).
Each release tested gets one of the :data:`OUTCOMES`:

* ``bad``: the entry reproduces (the test fails at level α; the same crash);
* ``good``: it does not (the planned samples drew no evidence, twice with different seeds;
  a crash entry: no crash in ``attempts`` runs);
* ``cannot-run``: the case cannot run there (the engine refuses the configuration, the
  feature does not exist yet, the release crashes another way) — never counted as good;
* ``not-installable``: no environment can be made here (e.g. its pinned torch build is
  on no reachable index).

The search (:func:`search`) assumes one bad stretch: it starts from the entry's own release
(which must reproduce), binary-searches older releases for the first bad one and newer
releases for the first good one, and steps around releases that cannot be tested (the
nearest testable release to the midpoint, as ``git bisect skip`` does). The boundaries come
with the evidence of the releases on either side, and the releases between them that could
not be tested are named. Every probe is written into the entry (``extra.bisect``) as soon
as it is done, atomically, so a killed bisection resumes where it stopped.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from specfuzz.errors import InvalidInput
from specfuzz.fuzz.corpus import EXC_LINE, Entry, atomic_write_json, last_exception, now_iso, numbers_out
from specfuzz.fuzz.release_envs import (
    ENGINE_PACKAGES, EnvResult, Release, ReleaseEnvs, list_releases, package_for_entry, parse_range, range_bounds,
)
from specfuzz.fuzz.rerun import SECOND_RUN_SEED_OFFSET, Rerunner, RunOutcome

BISECT_SCHEMA_VERSION = 1
OUTCOMES = ("bad", "good", "cannot-run", "not-installable")
TESTABLE = ("bad", "good")
# Runs of a crash entry per release before "no crash" counts (crashes that come and go).
DEFAULT_CRASH_ATTEMPTS = 3
# Settings a stored probe must share with this bisection to be reused instead of re-run.
_REUSE_KEYS = ("package", "samples", "alpha", "attempts", "deps", "torch_any_build", "batch")


@dataclass(frozen=True)
class Probe:
    """One release tested: the outcome, its evidence, when, and in what environment."""

    version: str
    released: str | None
    outcome: str  # one of OUTCOMES
    detail: str  # the evidence in one line
    tested_at: str
    seconds: float
    runs: tuple[dict, ...] = ()
    env: Mapping = field(default_factory=dict)

    @property
    def testable(self) -> bool:
        return self.outcome in TESTABLE

    def to_json(self) -> dict:
        return {"version": self.version, "released": self.released, "outcome": self.outcome, "evidence": self.detail,
                "tested_at": self.tested_at, "seconds": round(self.seconds, 1), "runs": list(self.runs),
                "env": dict(self.env)}

    @classmethod
    def from_json(cls, d: Mapping) -> "Probe":
        return cls(str(d["version"]), d.get("released"), str(d["outcome"]), str(d.get("evidence", "")),
                   str(d.get("tested_at", "")), float(d.get("seconds", 0.0)), tuple(d.get("runs", ())),
                   dict(d.get("env", {})))


@dataclass
class SearchResult:
    """Boundaries found by :func:`search` (indices into the release list; None: not found)."""

    anchor: int
    anchor_bad: bool
    first_bad: int | None = None  # the oldest bad release of the stretch holding the anchor
    last_good: int | None = None  # the newest good release before it
    last_bad: int | None = None  # the newest bad release of that stretch
    first_fixed: int | None = None  # the oldest good release after it
    untested_before: list[int] = field(default_factory=list)  # not testable, between last_good and first_bad
    untested_after: list[int] = field(default_factory=list)  # not testable, between last_bad and first_fixed


def _nearest(lo: int, hi: int, tried: set[int]) -> list[int]:
    """Indices strictly between lo and hi, nearest to the midpoint first."""
    if hi - lo < 2:
        return []
    mid = (lo + hi) // 2
    out, d = [], 0
    while len(out) < hi - lo - 1:
        for i in ((mid - d, mid + d) if d else (mid,)):
            if lo < i < hi and i not in out:
                out.append(i)
        d += 1
    return [i for i in out if i not in tried]


def search(n: int, anchor: int, outcome: Callable[[int], str], *, prefetch: Callable[[list[int]], None] | None = None) -> SearchResult:
    """Binary search over releases 0..n-1 (oldest first) around a bad ``anchor``.

    ``outcome(i)`` tests release i (one of :data:`OUTCOMES`; it is called at most once per
    index). Untestable releases are stepped around; boundaries are the testable releases
    on either side. ``prefetch(indices)``: releases that may be tested next (to prepare
    their environments ahead).
    """
    seen: dict[int, str] = {}

    def test(i: int) -> str:
        if i not in seen:
            seen[i] = outcome(i)
        return seen[i]

    res = SearchResult(anchor, test(anchor) == "bad")
    if not res.anchor_bad:
        return res

    def boundary(good_side: int, bad_side: int) -> tuple[int, int]:
        """Narrow (good_side, bad_side) (either order) to adjacent testable releases."""
        g, b = good_side, bad_side
        # Start from what earlier probes inside the interval already showed.
        lo, hi = min(g, b), max(g, b)
        if g < b:
            g = max([i for i in range(lo, hi + 1) if seen.get(i) == "good"], default=g)
            b = min([i for i in range(g, hi + 1) if seen.get(i) == "bad"], default=b)
        else:
            b = max([i for i in range(lo, hi + 1) if seen.get(i) == "bad"], default=b)
            g = min([i for i in range(b, hi + 1) if seen.get(i) == "good"], default=g)
        while True:
            lo, hi = min(g, b), max(g, b)
            cands = [i for i in _nearest(lo, hi, set()) if seen.get(i) not in ("cannot-run", "not-installable")]
            if not cands:
                return g, b
            if prefetch:
                prefetch(_next_mids(lo, hi, cands[0]))
            for i in cands:
                o = test(i)
                if o in TESTABLE:
                    if o == "bad":
                        b = i
                    else:
                        g = i
                    break
            else:
                return g, b

    # Older side: the oldest testable release, then the boundary between it and the anchor.
    oldest = _oldest_testable(anchor, test)
    if oldest is None or seen[oldest] == "bad":
        res.first_bad = anchor if oldest is None else oldest
        res.last_good = None
        res.untested_before = [i for i in range(res.first_bad) if seen.get(i) not in TESTABLE]
    else:
        g, b = boundary(oldest, anchor)
        res.last_good, res.first_bad = g, b
        res.untested_before = [i for i in range(g + 1, b)]
    # Newer side: the newest testable release, then the boundary between the anchor and it.
    newest = next((i for i in range(n - 1, anchor, -1) if test(i) in TESTABLE), None)
    if newest is None or seen[newest] == "bad":
        res.last_bad = anchor if newest is None else newest
        res.first_fixed = None
        res.untested_after = [i for i in range(res.last_bad + 1, n) if seen.get(i) not in TESTABLE]
    else:
        g, b = boundary(newest, anchor)
        res.last_bad, res.first_fixed = b, g
        res.untested_after = [i for i in range(b + 1, g)]
    return res


def _oldest_testable(anchor: int, test: Callable[[int], str]) -> int | None:
    """The oldest testable release before ``anchor`` (None: none is).

    Release 0 first (a range that is testable throughout costs one probe); when it is not,
    a binary search for the start of the testable releases, which assumes releases that
    cannot run the case or cannot be installed come first (the feature did not exist, the
    torch they pin is not here). Older releases it did not test stay listed as such.
    """
    if anchor == 0:
        return None
    if test(0) in TESTABLE:
        return 0
    lo, hi = 0, anchor  # lo untestable, hi testable (the anchor)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if test(mid) in TESTABLE:
            hi = mid
        else:
            lo = mid
    return hi if hi < anchor else None


def _next_mids(lo: int, hi: int, mid: int) -> list[int]:
    """The two midpoints the search may test after ``mid`` (for prefetching environments)."""
    return [i for i in ((lo + mid) // 2, (mid + hi) // 2) if lo < i < hi and i != mid]


# ----------------------------------------------------------------------------- crashes


def crash_fingerprint(text: str) -> str:
    """What makes two crashes the same across releases: the exception type and the start of
    its message, numbers stripped (``index 885600070 is out of bounds`` = ``index 195092853
    ...``); for crashes without an exception (a signal, a timeout) the words of the detail."""
    text = " ".join(str(text).split())
    m = None
    for m in EXC_LINE.finditer(text):
        pass
    core = f"{m.group(1).rsplit('.', 1)[-1]}: {m.group(2)}" if m else re.sub(r"^engine \w+: ", "", text)
    return numbers_out(core)[:80]


def _message(text: str) -> str:
    """The message of the last exception in ``text`` (numbers stripped), without its type."""
    m = None
    for m in EXC_LINE.finditer(" ".join(str(text).split())):
        pass
    return numbers_out(m.group(2) if m else re.sub(r"^engine \w+: ", "", str(text)))


# ----------------------------------------------------------------------------- probing


class ReleaseRerunner(Rerunner):
    """A Rerunner whose engine runs in a release environment (one engine process at a time)."""

    def __init__(self, *, python: str, engine_spec: str, site_dirs: tuple[str, ...] = (),
                 env: Mapping[str, str] | None = None, **kw) -> None:
        super().__init__(**kw)
        self.python = python
        self.spec = engine_spec
        self.site_dirs = site_dirs
        self.env = dict(env or {})

    def engine_spec(self, entry: Entry) -> tuple[str, dict]:
        return self.spec, {}

    def _engine(self, spec: str, kw: dict):
        from specfuzz.engines.external import ExternalEngine

        key = (spec, tuple(sorted(kw.items())))
        if key not in self._engines:
            self._engines[key] = ExternalEngine(spec, kw, python=self.python, site_dirs=self.site_dirs, env=self.env,
                                                log_dir=self.work_dir / "logs")
        return self._engines[key]


@dataclass
class BisectConfig:
    samples: int = 2000
    alpha: float = 1e-3
    seed: int = 12345
    attempts: int = DEFAULT_CRASH_ATTEMPTS
    work_dir: Path = Path(".specfuzz-cache")
    jobs: int = 1
    fresh: bool = False


def engine_spec_for(entry: Entry, package: str) -> str:
    known = ENGINE_PACKAGES.get(package)
    if known is not None and known.engine:
        return known.engine
    spec = entry.engine.get("engine_spec")
    if spec:
        return str(spec)
    raise InvalidInput("engine package", package, "a package specfuzz has an adapter for "
                       f"({', '.join(sorted(ENGINE_PACKAGES))}) or an entry that records its engine_spec")


def probe_release(entry: Entry, package: str, release: Release, env: EnvResult, cfg: BisectConfig,
                  log: Callable[[str], None]) -> Probe:
    """Test one release (its environment already made)."""
    t0 = time.monotonic()
    at = now_iso()
    env_json = env.to_json()
    if env.status != "ready":
        return Probe(release.version, release.released, "not-installable", f"not installable here: {env.detail}", at,
                     time.monotonic() - t0, (), env_json)
    rr = ReleaseRerunner(python=str(env.python), engine_spec=engine_spec_for(entry, package), site_dirs=env.site_dirs,
                         env=env.env, samples=cfg.samples,
                         alpha=cfg.alpha, seed=cfg.seed, work_dir=cfg.work_dir)
    runs: list[RunOutcome] = []
    try:
        if entry.kind == "crash":
            outcome, detail = _probe_crash(entry, rr, cfg, runs)
        else:
            outcome, detail = _probe_finding(entry, rr, runs)
        if outcome == "cannot-run" and "crash" in detail:
            cause = _root_cause(rr)
            if cause and cause not in detail:
                detail += f" (root cause in the engine log: {cause})"
    finally:
        rr.close()
    return Probe(release.version, release.released, outcome, detail, at, time.monotonic() - t0,
                 tuple(r.to_json() for r in runs), env_json)


def _root_cause(rr: ReleaseRerunner) -> str:
    """The last specific exception in the crashed engine's log (vLLM's engine core dies in a
    child process; the caller only hears "initialization failed")."""
    for eng in rr._engines.values():
        try:
            found = last_exception(eng.log_tail() if eng.log_path else "")
        except OSError:
            continue
        if found:
            return _clip(found, 240)
    return ""


def _probe_finding(entry: Entry, rr: ReleaseRerunner, runs: list[RunOutcome]) -> tuple[str, str]:
    for seed in (rr.seed, rr.seed + SECOND_RUN_SEED_OFFSET):
        r = rr.run_once(entry, seed)
        runs.append(r)
        if r.outcome == "fail":
            return "bad", f"fails: {r.detail}"
        if r.outcome == "crash":
            return "cannot-run", f"crashes instead (another problem): {r.detail}"
        if r.outcome == "error":
            return "cannot-run", f"cannot run the case: {r.detail}"
    return "good", f"passes twice ({runs[0].n} and {runs[1].n} samples, no evidence against μ): {runs[-1].detail}"


def _crash_once(entry: Entry, rr: ReleaseRerunner, seed: int, requests: int) -> tuple[RunOutcome, str]:
    """One run of a crash entry's case: its requests (every pattern of its crashing batch, when
    stored) in batches, with no law computed (μ plays no part in a crash). Returns the outcome
    and the crash's log tail (the root cause of an engine process's death is often only there)."""
    from itertools import cycle, islice

    from specfuzz.case import Case
    from specfuzz.engines.base import Request
    from specfuzz.engines.isolation import EngineCrash
    from specfuzz.fuzz.run import engine_config, entry_call_prompt_tokens, entry_crash_batch, split_calls
    from specfuzz.fuzz.shrink import entry_family
    from specfuzz.fuzz.triage import entry_dtype, entry_settings

    spec, kw = rr.engine_spec(entry)
    eng = rr._engine(spec, kw)
    sent = 0
    try:
        case = Case.from_json(entry.case)
        if entry.extra.get("sequence"):
            return rr._run_sequence(eng, entry, case, seed), ""
        # Every pattern of the crashing batch once, the entry's case first (an entry stored by a
        # campaign lists the case among its batch_patterns too; a shrunk one lists the others).
        family = entry_family(entry)
        patterns = [(tuple(c.prompt), c.params) for c in family]
        eng.start(engine_config(case, rr.work_dir / "checkpoints", dtype=entry_dtype(entry),
                                settings=entry_settings(entry) or None, family=family))
        batch = entry_crash_batch(entry)  # the batch it crashed in: some crashes need all of it
        split = entry_call_prompt_tokens(entry)  # as the campaign's calls were cut
        while sent < requests:
            k = min(batch, requests - sent)
            reqs = [Request(pr, params, seed + sent + j) for j, (pr, params) in enumerate(islice(cycle(patterns), k))]
            for part in split_calls(reqs, split):
                eng.generate(part)
            sent += k
    except EngineCrash as exc:
        return RunOutcome("crash", seed, sent, None, _clip(str(exc), 300)), exc.log_tail
    except InvalidInput as exc:
        return RunOutcome("error", seed, sent, None, _clip(f"InvalidInput: {exc.name} refused: {exc.allowed}", 300)), ""
    except Exception as exc:  # noqa: BLE001 - a case that cannot run is reported, not fatal
        return RunOutcome("error", seed, sent, None, _clip(f"{type(exc).__name__}: {exc}", 300)), ""
    return RunOutcome("pass", seed, sent, None, f"{sent} requests without a crash"), ""


def _clip(s: str, n: int) -> str:
    s = " ".join(str(s).split())
    return s if len(s) <= n else s[: n - 1] + "…"


def _same_crash(stored: str, detail: str, log_tail: str) -> bool:
    """The stored crash (its evidence text): the exception that ended the call has its type and
    message, numbers aside; or, when the engine process died and the caller only heard a generic
    error, the stored message appears in a line of the engine's log tail (vLLM wraps a worker's
    error as "Worker failed with error '<message>'")."""
    if crash_fingerprint(detail) == crash_fingerprint(stored):
        return True
    msg = _message(stored)[:60]
    return len(msg) >= 12 and any(msg in numbers_out(line) for line in log_tail.splitlines())


def _probe_crash(entry: Entry, rr: ReleaseRerunner, cfg: BisectConfig, runs: list[RunOutcome]) -> tuple[str, str]:
    other: RunOutcome | None = None
    for k in range(max(1, cfg.attempts)):
        r, tail = _crash_once(entry, rr, rr.seed + k * SECOND_RUN_SEED_OFFSET, cfg.samples)
        runs.append(r)
        if r.outcome == "crash" and _same_crash(entry.evidence, r.detail, tail):
            return "bad", f"the same crash (run {k + 1}): {r.detail}"
        if r.outcome == "error":
            return "cannot-run", f"cannot run the case: {r.detail}"
        if r.outcome == "crash":
            other = r
    if other is not None:
        return "cannot-run", f"crashes another way, not the stored crash: {other.detail}"
    n = sum(r.n for r in runs)
    return "good", f"no crash in {len(runs)} runs ({n} requests)"


# ----------------------------------------------------------------------------- the whole bisection


@dataclass
class Bisection:
    """A bisection's inputs, validated before anything is installed or written."""

    path: Path
    entry: Entry
    package: str
    releases: list[Release]  # in range, oldest first
    anchor: int  # index of the entry's own release (or the newest in range)
    range_text: str

    @property
    def versions(self) -> list[str]:
        return [r.version for r in self.releases]


def load_entry(path: Path) -> Entry:
    try:
        return Entry.from_json(json.loads(Path(path).read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise InvalidInput("ENTRY", str(path), "an existing corpus entry file") from None
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise InvalidInput("ENTRY", str(path), f"a readable corpus entry ({type(exc).__name__}: {exc})") from None


def plan(path: Path, *, package: str | None, versions: str | None, envs: ReleaseEnvs) -> Bisection:
    """Validate everything (entry, engine package, registry, range) without side effects."""
    entry = load_entry(path)
    if entry.kind == "regression":
        raise InvalidInput("ENTRY", str(path), "a finding, calibration or crash entry of a released engine "
                           "(regression entries run on the built-in reference sampler)")
    pkg = package or package_for_entry(entry.engine)
    if not pkg:
        raise InvalidInput("engine", str(entry.engine.get("name")), "an engine released as a pip package "
                           f"({', '.join(sorted(ENGINE_PACKAGES))}, or name one with --engine-package)")
    engine_spec_for(entry, pkg)
    range_bounds(versions)  # a malformed or reversed range is refused before any look-up
    releases = envs.list_releases(pkg)
    chosen = parse_range(versions, releases)
    own = str(entry.engine.get("version") or "")
    idx = next((i for i, r in enumerate(chosen) if _same_version(r.version, own)), None)
    if idx is None:
        idx = len(chosen) - 1  # the entry's release is outside the range: start from its newest
    return Bisection(Path(path), entry, pkg, chosen, idx, versions or f"{chosen[0].version}..{chosen[-1].version}")


def _same_version(a: str, b: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(a) == Version(b) or Version(a).public == Version(b).public and Version(b).local is not None
    except InvalidVersion:
        return a == b


def _settings(b: Bisection, cfg: BisectConfig, envs: ReleaseEnvs) -> dict:
    from specfuzz.fuzz.run import entry_crash_batch

    out = {"package": b.package, "samples": cfg.samples, "alpha": cfg.alpha, "attempts": cfg.attempts,
           "deps": envs.deps, "torch_any_build": envs.torch_any_build}
    if b.entry.kind == "crash":
        out["batch"] = entry_crash_batch(b.entry)  # requests per engine call of each run
    return out


def stored_probes(entry_path: Path, settings: Mapping) -> dict[str, Probe]:
    """Probes a previous (possibly killed) bisection of this entry stored with the same settings."""
    try:
        data = json.loads(Path(entry_path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    rec = (data.get("extra") or {}).get("bisect")
    if not isinstance(rec, dict):
        return {}
    if any(rec.get("settings", {}).get(k) != settings.get(k) for k in _REUSE_KEYS):
        return {}
    out = {}
    for p in rec.get("probes", []):
        try:
            pr = Probe.from_json(p)
        except (KeyError, TypeError, ValueError):
            continue
        # "not-installable" is asked again (cheap; a bundle may have arrived, a failed install is cached).
        if pr.outcome in OUTCOMES and pr.outcome != "not-installable":
            out[pr.version] = pr
    return out


def write_record(entry_path: Path, record: Mapping) -> None:
    """Put ``record`` at ``extra.bisect`` of the entry file (re-read first; atomic replace)."""
    path = Path(entry_path)
    data = json.loads(path.read_text(encoding="utf-8"))
    Entry.from_json(data)  # still an entry
    extra = dict(data.get("extra") or {})
    extra["bisect"] = dict(record)
    data["extra"] = extra
    mode = path.stat().st_mode & 0o777
    atomic_write_json(path, data)
    os.chmod(path, mode)


class _Envs:
    """Environments made on demand, ``jobs - 1`` of them ahead of the search (threads)."""

    def __init__(self, envs: ReleaseEnvs, package: str, releases: Sequence[Release], jobs: int) -> None:
        self.envs, self.package, self.releases = envs, package, releases
        self.pool = ThreadPoolExecutor(max_workers=jobs - 1) if jobs > 1 else None
        self.futures: dict[int, Future] = {}
        self.lock = threading.Lock()

    def prefetch(self, idx: list[int]) -> None:
        if self.pool is None:
            return
        with self.lock:
            for i in idx:
                if i not in self.futures:
                    self.futures[i] = self.pool.submit(self.envs.ensure, self.package, self.releases[i])

    def get(self, i: int) -> EnvResult:
        with self.lock:
            fut = self.futures.get(i)
        if fut is not None:
            return fut.result()
        return self.envs.ensure(self.package, self.releases[i])

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


def run_bisection(b: Bisection, envs: ReleaseEnvs, cfg: BisectConfig, *, log: Callable[[str], None] = lambda s: None) -> dict:
    """Bisect, writing ``extra.bisect`` into the entry after every probe; returns the record."""
    t0 = time.monotonic()
    settings = _settings(b, cfg, envs)
    done = {} if cfg.fresh else stored_probes(b.path, settings)
    probes: dict[str, Probe] = {v: p for v, p in done.items() if v in b.versions}
    started = now_iso()
    if probes:
        log(f"reusing {len(probes)} stored probe(s) of an earlier bisection with the same settings")
    envset = _Envs(envs, b.package, b.releases, cfg.jobs)

    def record(res: SearchResult | None, complete: bool) -> dict:
        return build_record(b, probes, res, settings=settings, started=started, seconds=time.monotonic() - t0,
                            complete=complete)

    def outcome(i: int) -> str:
        rel = b.releases[i]
        if rel.version in probes:
            p = probes[rel.version]
            log(f"{rel.version}: {p.outcome} (stored) — {p.detail[:160]}")
            return p.outcome
        log(f"{rel.version} ({rel.released or 'date unknown'}): testing ...")
        env = envset.get(i)
        p = probe_release(b.entry, b.package, rel, env, cfg, log)
        probes[rel.version] = p
        write_record(b.path, record(None, False))
        log(f"{rel.version}: {p.outcome} in {p.seconds:.0f} s — {p.detail[:200]}")
        return p.outcome

    try:
        res = search(len(b.releases), b.anchor, outcome, prefetch=envset.prefetch)
    finally:
        envset.close()
    rec = record(res, True)
    write_record(b.path, rec)
    return rec


def _point(b: Bisection, probes: Mapping[str, Probe], i: int | None) -> dict | None:
    if i is None:
        return None
    p = probes.get(b.releases[i].version)
    if p is None:
        return None
    return {"version": p.version, "released": p.released, "outcome": p.outcome, "evidence": p.detail,
            "tested_at": p.tested_at, "torch": p.env.get("torch"), "torch_swap": p.env.get("torch_swap")}


def build_record(b: Bisection, probes: Mapping[str, Probe], res: SearchResult | None, *, settings: Mapping,
                 started: str, seconds: float, complete: bool) -> dict:
    order = {v: i for i, v in enumerate(b.versions)}
    rec: dict = {
        "schema_version": BISECT_SCHEMA_VERSION,
        "package": b.package,
        "range": f"{b.versions[0]}..{b.versions[-1]}",
        "releases_in_range": len(b.versions),
        "entry_release": str(b.entry.engine.get("version")),
        "settings": dict(settings),
        "started": started,
        "finished": now_iso() if complete else None,
        "seconds": round(seconds, 1),
        "complete": complete,
        "probes": [probes[v].to_json() for v in sorted(probes, key=lambda v: order.get(v, -1))],
    }
    counts = {o: sum(1 for p in probes.values() if p.outcome == o) for o in OUTCOMES}
    rec["tested"] = counts
    if res is None:
        rec["summary"] = f"in progress: {len(probes)} release(s) tested"
        return rec
    V = b.versions
    rec.update(
        first_bad=_point(b, probes, res.first_bad), last_good=_point(b, probes, res.last_good),
        last_bad=_point(b, probes, res.last_bad), first_fixed=_point(b, probes, res.first_fixed),
        untested_before=[{"version": V[i], "outcome": probes[V[i]].outcome if V[i] in probes else "not tested"}
                         for i in res.untested_before],
        untested_after=[{"version": V[i], "outcome": probes[V[i]].outcome if V[i] in probes else "not tested"}
                        for i in res.untested_after],
    )
    rec["summary"] = summary(b, res, probes)
    return rec


def _group(versions: list[str]) -> str:
    if not versions:
        return ""
    return versions[0] if len(versions) == 1 else f"{versions[0]}–{versions[-1]} ({len(versions)} releases)"


def summary(b: Bisection, res: SearchResult, probes: Mapping[str, Probe]) -> str:
    """One or two sentences for people and drafts: introduced in X; fixed in Z / still present in Y."""
    V = b.versions
    anchor = probes.get(V[res.anchor])
    if not res.anchor_bad:
        why = anchor.detail if anchor else "not tested"
        return (f"does not reproduce on {b.package} {V[res.anchor]} ({anchor.outcome if anchor else '?'}: {why[:200]}); "
                "no bisection")
    untested = [V[i] for i in res.untested_before]
    reasons = sorted({probes[v].outcome if v in probes else "not tested" for v in untested})
    if res.last_good is None:
        first = V[res.first_bad]
        if res.first_bad == 0:
            intro = f"present since {first}, the oldest release in the range {V[0]}..{V[-1]}"
        else:
            intro = (f"introduced in {first} or earlier: the oldest release found here that can run the case "
                     f"(older: {_group(untested)}: {' / '.join(reasons)})")
    elif not untested:
        intro = f"introduced in {V[res.first_bad]} ({V[res.last_good]} passes)"
    else:
        intro = (f"introduced in one of {_group(untested + [V[res.first_bad]])}: {V[res.last_good]} passes, "
                 f"{V[res.first_bad]} fails, the releases between {' / '.join(reasons) or 'not tested'}")
    after = [V[i] for i in res.untested_after]
    if res.first_fixed is None:
        last = V[res.last_bad]
        newer = f" (newer: {_group(after)} could not be tested)" if after else ""
        tail = f"still present in the latest release {last}" + newer if last == V[-1] or after else \
            f"still present in {last}"
    elif not after:
        tail = f"fixed in {V[res.first_fixed]} ({V[res.last_bad]} still fails)"
    else:
        tail = f"fixed in one of {_group(after + [V[res.first_fixed]])} ({V[res.last_bad]} fails, {V[res.first_fixed]} passes)"
    return f"{b.package}: {intro}; {tail}."


def draft_lines(record: Mapping | None) -> list[str]:
    """Markdown lines for an issue draft from ``extra.bisect`` (empty when there is none)."""
    if not isinstance(record, Mapping) or not record.get("summary"):
        return []
    L = ["## Releases affected", "", str(record["summary"]), ""]
    rows = [(k, record.get(k)) for k in ("last_good", "first_bad", "last_bad", "first_fixed")]
    rows = [(k, p) for k, p in rows if isinstance(p, Mapping)]
    if rows:
        L += ["| | release | released | torch | result | tested |", "|---|---|---|---|---|---|"]
        for k, p in rows:
            torch = str(p.get("torch") or "-") + (" (swapped: no CPU build reachable)" if p.get("torch_swap") else "")
            L += [f"| {k.replace('_', ' ')} | {p.get('version')} | {p.get('released') or '-'} | {torch} | "
                  f"{str(p.get('evidence', ''))[:160]} | {str(p.get('tested_at', ''))[:10]} |"]
        L += [""]
    t = record.get("tested") or {}
    L += [f"Bisected by `specfuzz bisect` over {record.get('package')} {record.get('range')} "
          f"({record.get('releases_in_range')} releases; {sum(t.values()) if t else 0} tested: "
          + ", ".join(f"{n} {o}" for o, n in t.items() if n) + ").", ""]
    return L


# ----------------------------------------------------------------------------- triage --latest


def check_latest(path: Path, entry: Entry, envs: ReleaseEnvs, cfg: BisectConfig, *,
                 releases_cache: dict[str, list[Release]] | None = None,
                 log: Callable[[str], None] = lambda s: None) -> dict:
    """Re-check one entry on the newest installable release of its engine package.

    Writes ``extra.latest`` and the status (bad: confirmed; good: fixed; a release that
    cannot run the case changes no status) into the entry file, atomically. Returns the
    record; ``{"skipped": reason}`` for entries of engines that are not pip packages.
    """
    from specfuzz.fuzz.rerun import status_after_rerun

    pkg = package_for_entry(entry.engine)
    if entry.kind == "regression" or not pkg:
        return {"skipped": f"engine {entry.engine.get('name')!r} is not a pip-installable package"}
    try:
        engine_spec_for(entry, pkg)
    except InvalidInput as exc:
        return {"skipped": str(exc)}
    cache = releases_cache if releases_cache is not None else {}
    if pkg not in cache:
        cache[pkg] = envs.list_releases(pkg)
    own = str(entry.engine.get("version") or "")
    candidates = [r for r in reversed(cache[pkg]) if not r.yanked and not r.key.is_prerelease]
    probe: Probe | None = None
    skipped: list[str] = []
    for rel in candidates:
        env = envs.ensure(pkg, rel)
        if env.status == "ready":
            log(f"  {path.name}: testing on {pkg} {rel.version}")
            probe = probe_release(entry, pkg, rel, env, cfg, log)
            break
        skipped.append(f"{rel.version} ({env.detail[:80]})")
        if _same_version(rel.version, own):
            break  # nothing newer than the entry's own release is installable
    if probe is None:
        return {"skipped": f"no installable {pkg} release here (tried {', '.join(skipped[:5])})"}
    rec = {"package": pkg, "version": probe.version, "released": probe.released, "outcome": probe.outcome,
           "evidence": probe.detail, "tested_at": probe.tested_at, "seconds": round(probe.seconds, 1),
           "newer_not_installable": skipped}
    first = RunOutcome({"bad": "crash" if entry.kind == "crash" else "fail", "good": "pass"}.get(probe.outcome, "error"), cfg.seed)
    new = status_after_rerun(entry, first, first) if probe.outcome in TESTABLE else None
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    Entry.from_json(data)
    extra = dict(data.get("extra") or {})
    extra["latest"] = rec
    data["extra"] = extra
    rec["status_before"] = data.get("status")
    if new is not None:
        data["status"] = new
        entry.status = new
    rec["status_after"] = data.get("status")
    mode = Path(path).stat().st_mode & 0o777
    atomic_write_json(Path(path), data)
    os.chmod(path, mode)
    return rec
