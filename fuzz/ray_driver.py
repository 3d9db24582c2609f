"""A campaign across GPUs and hosts on Ray (``specfuzz fuzz --ray [ADDRESS]``).

Split of work (what runs where, what crosses the wire):

* The **driver** (this module, the ``specfuzz`` process) connects to a Ray cluster (or
  starts a local one), creates the hub and the example store on its own node, starts the
  engine actors, hands out searches by index, watches for dead actors and prints the
  summary. It sends an actor only a search index and the seconds left; it gets back a
  one-line result per search.
* The **hub** (``fuzz/ray_hub.py``, a Ray actor pinned to the driver's node) is the only
  writer of the corpus, the α budget, the campaign state and the event log. Actors send
  it entries and families as JSON, ask it for α levels and known signatures, and report
  their totals after every family.
* The **example store** (``fuzz/exampledb.py``, pinned likewise) is the Hypothesis database
  every actor's searches share (``<corpus>/.specfuzz/hypothesis``).
* **Engine actors** (``fuzz/ray_actors.py``), one per GPU by default (``--gpus-per-engine``
  packs several on one GPU; CPU engines get CPU actors), each run Hypothesis, the engine
  (in its own child process, as without Ray), the oracle, shrinking and calibration.
  Checkpoints are written on the actor's node from the tables in the case; nothing large
  crosses the wire.

Faults: an actor announces every family to the hub before running it. When an actor or
its node dies, the driver asks the hub for that family, starts a replacement actor (with
the same resources, wherever Ray finds them), and has the next free actor run the family
again on a fresh engine; if an actor dies on that family too, it is stored as a crash
entry (crash kind ``actor``). Nothing stored is lost: entries, the α budget and the state
are written atomically by the hub, never by an actor. Killing the driver kills its actors
(Ray ends a job's actors with its driver); started again on the same corpus, the
campaign resumes from the state and the Hypothesis database, as it does without Ray.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from specfuzz.errors import InvalidInput
from specfuzz.fuzz.campaign import CampaignConfig, CampaignStats
from specfuzz.fuzz.campaign_state import load_state

# A family during which an actor died runs again on another actor this many times; if an
# actor dies on it then too, it is stored as a crash entry.
FAMILY_RETRIES = 1
# Replacement actors per actor slot (an actor that keeps dying, e.g. one that cannot
# start on its node, is not replaced forever).
MAX_REPLACEMENTS = 3
# An actor whose searches raise this many times in a row stops the campaign (an error that
# is not the engine's: the engine's crashes are findings and never reach the driver).
MAX_SEARCH_ERRORS = 3
# After the budget, actors may still be storing a failure (calibration, the write): they
# are given this long before they are killed.
STOP_GRACE_S = 120.0
# The driver polls the hub for the display this often (seconds).
POLL_S = 1.0
# Share of a GPU that specfuzz's engines may use in all, and engines per actor at once
# (searching, speculation-off calibration, a fresh confirmation engine): as for --workers.
DEVICE_SHARE = 0.8
ENGINES_PER_ACTOR = 3
MEMORY_SETTING = {"vllm": "gpu_memory_utilization", "sglang": "mem_fraction_static"}
# Object store of a local cluster: what crosses the wire is small (JSON, totals), so a
# small store, whatever the machine's /dev/shm.
LOCAL_OBJECT_STORE_BYTES = 200 * 1024 * 1024
# Seconds to wait for a Ray head's port to answer before refusing --ray ADDRESS.
CONNECT_TIMEOUT_S = 5.0
# Engines that need no GPU: their actors are CPU actors by default even on a GPU cluster.
CPU_ENGINES = ("reference",)


@dataclass(frozen=True)
class RayOptions:
    """How a campaign uses Ray. ``address``: None starts a local cluster; ``"auto"`` joins
    the cluster running on this machine; ``"host:port"`` joins that one."""

    address: str | None = None
    engines: int | None = None  # None: as many as the cluster's GPUs (or CPUs) hold
    gpus_per_engine: float | None = None  # None: 1 on a cluster with GPUs (CPU engines: 0)
    cpus_per_engine: float = 1.0
    stop_grace_s: float = STOP_GRACE_S


@dataclass
class RayOutcome:
    stats: CampaignStats
    totals: dict
    snapshot: dict
    run: dict
    fatal: BaseException | None = None
    results: list[dict] = field(default_factory=list)


def import_ray():
    try:
        import ray
    except ImportError:
        raise InvalidInput("--ray", "ray", "Ray installed (pip install 'specfuzz[ray]')") from None
    return ray


def connect(address: str | None, *, num_cpus: int | None = None, num_gpus: int | None = None):
    """Join the cluster at ``address`` or start a local one (``num_cpus``/``num_gpus``:
    its resources, where Ray's own detection is not wanted); returns the ray module."""
    ray = import_ray()
    kw = dict(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False, configure_logging=True)
    if address in (None, "", "local"):
        if num_cpus is not None:
            kw["num_cpus"] = num_cpus
        if num_gpus is not None:
            kw["num_gpus"] = num_gpus
        # "local": a new cluster of this machine, even where `ray start` runs one here.
        ray.init(address="local", object_store_memory=LOCAL_OBJECT_STORE_BYTES, **kw)
    else:
        if address != "auto":
            _check_reachable(address)
        try:
            ray.init(address=address, **kw)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise InvalidInput("--ray", address, f"'auto' or the address of a running Ray cluster ({str(exc)[:200]})") from None
    return ray


def _check_reachable(address: str) -> None:
    """Refuse at once an address where no Ray head answers (Ray itself retries for minutes)."""
    import socket

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InvalidInput("--ray", address, "nothing (a local cluster), 'auto', or HOST:PORT of a running Ray head")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise InvalidInput("--ray", address, f"HOST:PORT of a running Ray head (nothing answers there: {exc})") from None


def plan_engines(engine: str, opts: RayOptions, resources: dict) -> tuple[int, float, float]:
    """How many engine actors, and each one's GPUs and CPUs, on a cluster with ``resources``."""
    gpus_total = float(resources.get("GPU", 0.0))
    cpus_total = float(resources.get("CPU", 0.0))
    g = opts.gpus_per_engine
    if g is None:
        g = 1.0 if gpus_total > 0 and engine not in CPU_ENGINES else 0.0
    if g < 0 or (g > 1 and g != int(g)):
        raise InvalidInput("--gpus-per-engine", g, "0 (a CPU actor), a fraction of one GPU such as 0.25, or a whole number")
    if g > gpus_total:
        raise InvalidInput("--gpus-per-engine", g, f"at most the cluster's {gpus_total:g} GPUs")
    c = opts.cpus_per_engine
    if c <= 0:
        raise InvalidInput("--cpus-per-engine", c, "a number > 0")
    fit = int(gpus_total // g + 1e-9) if g > 0 else int(cpus_total // c + 1e-9)
    if g > 0:
        fit = min(fit, int(cpus_total // c + 1e-9))
    n = opts.engines if opts.engines is not None else fit
    if n < 1:
        raise InvalidInput("--engines", n, f"at least 1 (this cluster fits {fit} engine actors of {g:g} GPU and {c:g} CPU)")
    if n > fit:
        raise InvalidInput("--engines", n, f"at most {fit}: the cluster has {gpus_total:g} GPUs and {cpus_total:g} CPUs, "
                                           f"each actor takes {g:g} GPU and {c:g} CPU")
    return n, g, c


def gpu_share(engine: str, gpus_per_engine: float, settings: dict) -> dict:
    """Engine settings that size each engine to its actor's share of a GPU (none for an
    engine without such a setting, a CPU actor, or a size set by the user or the site)."""
    key = MEMORY_SETTING.get(engine)
    if key is None or gpus_per_engine <= 0:
        return {}
    site = os.environ.get(f"SPECFUZZ_{engine.upper()}_SETTINGS", "")
    if key in settings or "kv_cache_memory_bytes" in settings or key in site or "kv_cache_memory_bytes" in site:
        return {}
    return {key: round(DEVICE_SHARE * min(1.0, gpus_per_engine) / ENGINES_PER_ACTOR, 4)}


def _config_json(cfg: CampaignConfig) -> dict:
    d = {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}
    d["corpus_dir"] = str(Path(cfg.corpus_dir).resolve())
    d["work_dir"] = str(Path(cfg.work_dir).resolve())
    return d


def stats_from(snapshot: dict, started: float) -> CampaignStats:
    """The campaign's counters: every actor's added up."""
    s = CampaignStats(started=started)
    for a in snapshot["actors"].values():
        for k, v in (a.get("stats") or {}).items():
            if hasattr(s, k) and isinstance(v, (int, float)):
                setattr(s, k, getattr(s, k) + v)
    s.stored = list(snapshot["stored"])
    if hasattr(s, "budget"):
        s.budget = snapshot.get("budget")
    s.crashes += int(snapshot.get("crash_records", 0))
    return s


class _Slots:
    """Engine actor slots: each holds the current actor of a rank and its replacements."""

    def __init__(self, ray, cls, config: dict, hub, store, run_id: str, gpus: float, cpus: float) -> None:
        self.ray, self.cls, self.config, self.hub, self.store, self.run_id = ray, cls, config, hub, store, run_id
        self.gpus, self.cpus = gpus, cpus
        self.handles: dict[str, object] = {}
        self.rank_of: dict[str, int] = {}
        self.incarnations: dict[int, int] = {}
        self.dead: set[str] = set()

    def start(self, rank: int) -> str | None:
        inc = self.incarnations.get(rank, -1) + 1
        if inc > MAX_REPLACEMENTS:
            return None
        self.incarnations[rank] = inc
        key = f"a{rank}.{inc}"
        opts = dict(num_cpus=self.cpus, max_restarts=0, max_task_retries=0)
        if self.gpus > 0:
            opts["num_gpus"] = self.gpus
        self.handles[key] = self.cls.options(**opts).remote(self.config, self.hub, self.store, rank, inc, self.run_id)
        self.rank_of[key] = rank
        return key

    def kill_all(self) -> None:
        for h in self.handles.values():
            try:
                self.ray.kill(h, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass


def run_ray_campaign(cfg: CampaignConfig, opts: RayOptions,
                     on_event: Callable[[str, CampaignStats], None] | None = None) -> RayOutcome:
    """Run ``cfg``'s campaign on Ray (see the module docstring). A process already
    connected to Ray (a benchmark running several campaigns) keeps its connection."""
    ray = import_ray()
    connected = ray.is_initialized()
    if not connected:
        connect(opts.address)
    try:
        return _run(ray, cfg, opts, on_event or (lambda m, s: None))
    finally:
        if not connected:
            ray.shutdown()


def _pinned(ray, node_id: str) -> dict:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return dict(num_cpus=0, max_restarts=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False))


def _run(ray, cfg: CampaignConfig, opts: RayOptions, on_event) -> RayOutcome:
    from ray.exceptions import RayActorError, RayTaskError

    from specfuzz.fuzz.ray_actors import EngineActor
    from specfuzz.fuzz.exampledb import ExampleStore
    from specfuzz.fuzz.ray_hub import CampaignHub

    n, g, c = plan_engines(cfg.engine, opts, ray.cluster_resources())
    # The campaign state as a campaign without Ray reads it: a state this specfuzz cannot
    # read is refused here, in one line, before anything starts.
    load_state(Path(cfg.corpus_dir) / ".specfuzz" / "state.json", cfg.reset_state, [])
    settings = dict(cfg.engine_settings)
    settings.update(gpu_share(cfg.engine, g, settings))
    cfg = CampaignConfig(**{**{f: getattr(cfg, f) for f in cfg.__dataclass_fields__}, "engine_settings": settings})
    engine_name = cfg.engine + (f"+{cfg.engine_kwargs['inject']}" if cfg.engine_kwargs.get("inject") else "")
    node = ray.get_runtime_context().get_node_id()
    corpus = Path(cfg.corpus_dir).resolve()
    run_info = {"engine": engine_name, "engines": n, "gpus_per_engine": g, "cpus_per_engine": c, "dtype": cfg.dtype}
    hub = ray.remote(CampaignHub).options(**_pinned(ray, node)).remote(str(corpus), cfg.alpha, run_info)
    store = ray.remote(ExampleStore).options(**_pinned(ray, node)).remote(str(corpus / ".specfuzz" / "hypothesis"))
    next_index = ray.get(hub.first_search.remote())
    run_id = _dt.datetime.now().strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    slots = _Slots(ray, ray.remote(EngineActor), _config_json(cfg), hub, store, run_id, g, c)
    keys = [slots.start(r) for r in range(n)]
    on_event(f"ray: {n} engine actors ({g:g} GPU, {c:g} CPU each) on {len(ray.nodes())} node(s)", stats_from(
        {"actors": {}, "stored": []}, time.monotonic()))

    t0 = time.monotonic()
    end = t0 + cfg.budget_s
    pending: dict = {}
    retry_queue: list[dict] = []
    results: list[dict] = []
    fatal: BaseException | None = None
    deaths = 0
    errors: dict[str, int] = {}  # searches in a row that raised, per actor
    stopping = False
    hard_end = None
    seen_msgs = 0.0

    def submit(key: str) -> None:
        nonlocal next_index
        h = slots.handles[key]
        left = end - time.monotonic()
        if retry_queue:
            rec = retry_queue.pop(0)
            rec["retried_by"] = key
            pending[h.retry.remote(rec, left)] = (key, "retry", rec)
        else:
            next_index += 1
            hub.begin_search.remote(next_index)
            pending[h.search.remote(next_index, left)] = (key, "search", next_index)

    for k in keys:
        submit(k)
    try:
        while pending:
            now = time.monotonic()
            if not stopping and now >= end:
                stopping, hard_end = True, now + opts.stop_grace_s
            if stopping and now >= hard_end:
                for ref, (key, _, _) in list(pending.items()):
                    ray.kill(slots.handles[key], no_restart=True)
                    slots.dead.add(key)
                    ray.get(hub.note.remote(f"actor {key} still busy {opts.stop_grace_s:.0f} s after the budget: stopped"))
                pending.clear()
                break
            done, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
            seen_msgs = _show(ray, hub, seen_msgs, t0, on_event)
            for ref in done:
                key, kind, payload = pending.pop(ref)
                try:
                    results.append(ray.get(ref))
                except RayActorError as exc:
                    deaths += 1
                    slots.dead.add(key)
                    reason = _reason(exc)
                    rec = ray.get(hub.actor_died.remote(key, reason))
                    if kind == "retry":
                        lost = dict(payload, reasons=list(payload.get("reasons", [])) + [f"{key}: {reason}"])
                        if len(lost["reasons"]) > FAMILY_RETRIES:
                            name, _ = ray.get(hub.record_lost_family.remote(lost, lost["reasons"]))
                            ray.get(hub.note.remote(f"family lost twice with its actor: stored as {name}"))
                        else:
                            retry_queue.append(lost)
                    elif rec is not None:
                        retry_queue.append(dict(rec, reasons=[f"{key}: {reason}"]))
                    new = slots.start(slots.rank_of[key])
                    if new is not None and not stopping:
                        submit(new)
                    elif new is None:
                        ray.get(hub.note.remote(f"actor slot {slots.rank_of[key]} gave up after {MAX_REPLACEMENTS} replacements"))
                    continue
                except RayTaskError as exc:
                    cause = getattr(exc, "cause", None)
                    errors[key] = errors.get(key, 0) + 1
                    ray.get(hub.note.remote(f"{kind} {payload if kind == 'search' else ''} on {key} raised: {str(exc)[-300:]}"))
                    if isinstance(cause, InvalidInput) or errors[key] >= MAX_SEARCH_ERRORS:
                        # Bad input, or a search that fails the same way again and again (a
                        # missing module, a bug): the campaign stops and says why.
                        fatal = cause if isinstance(cause, InvalidInput) else exc
                        stopping, hard_end = True, time.monotonic()
                        continue
                else:
                    errors[key] = 0
                if not stopping and time.monotonic() < end:
                    submit(key)
    except KeyboardInterrupt:
        fatal = KeyboardInterrupt()
    wall = time.monotonic() - t0
    # Engines down first, so that the record below is final: idle actors close their
    # engines; busy ones (an interrupted campaign) are killed, and their engine processes
    # follow them (they watch their parent).
    busy = {key for key, _, _ in pending.values()}
    for key in busy:
        ray.kill(slots.handles[key], no_restart=True)
        slots.dead.add(key)
    try:
        ray.get([h.close.remote() for k, h in slots.handles.items() if k not in slots.dead], timeout=30)
    except Exception:  # noqa: BLE001 - a dead actor's engines die with it
        pass
    snap = ray.get(hub.snapshot.remote())
    families = sum(int((a.get("stats") or {}).get("cases", 0)) for a in snap["actors"].values())
    run = {"time": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(), "engine": engine_name,
           "engines": n, "gpus_per_engine": g, "hosts": len({a.get("host") for a in snap["actors"].values()}),
           "nodes": len({a.get("node") for a in snap["actors"].values()}),
           "wall_s": round(wall, 1), "families": families, "fpm": round(60 * families / wall, 2) if wall > 0 else 0.0,
           "actor_deaths": deaths, "searches": len([r for r in results if "index" in r])}
    if fatal is not None:
        run["interrupted"] = True
    run["actors"] = summary_rows(snap, run)["actors"]
    snap = ray.get(hub.finish.remote(run))
    try:
        snap["store_ops"] = ray.get(store.counts.remote(), timeout=10)
    except Exception:  # noqa: BLE001
        snap["store_ops"] = {}
    slots.kill_all()
    for h in (hub, store):
        ray.kill(h, no_restart=True)
    _show(ray, None, seen_msgs, t0, on_event, snap)
    return RayOutcome(stats_from(snap, t0), snap["totals"], snap, run, fatal, results)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return " ".join(line.strip() for line in text[:6])[:500] or type(exc).__name__


def _show(ray, hub, since: float, t0: float, on_event, snap: dict | None = None) -> float:
    """New hub messages to the display; returns the time of the last one shown."""
    if snap is None:
        try:
            snap = ray.get(hub.snapshot.remote(since), timeout=10)
        except Exception:  # noqa: BLE001 - the display must not stop the campaign
            return since
    stats = stats_from(snap, t0)
    msgs = [(t, m) for t, m in snap["messages"] if t > since]
    for t, m in msgs:
        on_event(m, stats)
        since = max(since, t)
    on_event("", stats)
    return since


def summary_rows(snapshot: dict, run: dict) -> dict:
    """Per-actor and per-host totals, and the scaling efficiency against the most recent
    one-actor run of the same engine on this corpus (the state's history of Ray runs)."""
    wall = max(1e-9, float(run.get("wall_s") or 0.0))
    actors = []
    hosts: dict[str, dict] = {}
    nodes_of: dict[str, set] = {}
    for a in snapshot["actors"].values():
        nodes_of.setdefault(str(a.get("host")), set()).add(a.get("node"))

    def where(a: dict) -> str:
        """The host, and the Ray node where one host runs several (a test cluster)."""
        host = str(a.get("host"))
        return host if len(nodes_of.get(host, ())) <= 1 else f"{host}/{str(a.get('node'))[:8]}"

    for key, a in sorted(snapshot["actors"].items()):
        st, eng = a.get("stats") or {}, (a.get("totals") or {}).get("engine") or {}
        fam = int(st.get("cases", 0))
        row = {"actor": key, "host": where(a), "gpus": ",".join(a.get("gpus") or []) or "-",
               "families": fam, "samples": int(st.get("samples", 0)), "starts": int(eng.get("starts", 0)),
               "swaps": int(eng.get("swaps", 0)), "searches": int(st.get("searches", 0)),
               "seconds": round(float((a.get("totals") or {}).get("seconds", 0.0)), 1),
               "status": ("died: " + a["dead"][:200]) if a.get("dead") else "ok"}
        row["fpm"] = round(60 * fam / row["seconds"], 2) if row["seconds"] > 0 else 0.0
        actors.append(row)
        h = hosts.setdefault(where(a), {"host": where(a), "actors": 0, "families": 0, "samples": 0})
        h["actors"] += 1
        h["families"] += fam
        h["samples"] += row["samples"]
    for h in hosts.values():
        h["fpm"] = round(60 * h["families"] / wall, 2)
    base = None
    for r in reversed(snapshot.get("history") or []):
        if r is not run and r.get("engines") == 1 and r.get("engine") == run.get("engine") and r.get("time") != run.get("time"):
            base = r
            break
    eff = None
    if base and base.get("fpm") and run.get("engines", 1) > 1:
        eff = run["fpm"] / (run["engines"] * base["fpm"])
    return {"actors": actors, "hosts": sorted(hosts.values(), key=lambda h: h["host"]), "baseline": base, "efficiency": eff}


def run_json(outcome: RayOutcome) -> str:
    """The run record and summary rows as JSON (bench/bench_ray.py writes them)."""
    return json.dumps({"run": outcome.run, **summary_rows(outcome.snapshot, outcome.run)}, indent=1, default=str)
