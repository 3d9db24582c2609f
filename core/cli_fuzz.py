"""``specfuzz fuzz``: a fuzz campaign, in one process, in ``--workers`` processes sharing the
corpus, or on a Ray cluster (``--ray``). Its options are shown in groups (rich-click panels)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import rich_click as click

from specfuzz.cli_common import announce, check_methods, choose_engine, console, engine_kwargs_for, parse_settings
from specfuzz.cli_input import (
    ALPHA, COUNT, DURATION, ENGINE, MAX_TOKENS, MAX_VOCAB, SEED, WRITABLE_DIR, Number, bug_choice, dtype_choice,
    method_choice,
)
from specfuzz.oracle.budget import SCREEN_ALPHA


@click.command("fuzz")
@click.option_panel("What to fuzz", options=["--engine", "--method", "--inject", "--engine-setting", "--dtype",
                                             "--max-vocab", "--max-tokens", "--max-k"])
@click.option_panel("Search", options=["--budget", "--seed", "--batch", "--patterns", "--no-swap", "--no-steer", "--max-findings"])
@click.option_panel("Statistics", options=["--alpha", "--screen-alpha", "--samples"])
@click.option_panel("Engine processes", options=["--workers", "--spare-engines", "--prestart", "--fill-waits", "--ray",
                                                 "--engines", "--gpus-per-engine", "--cpus-per-engine"])
@click.option_panel("Output", options=["--corpus", "--work-dir", "--quiet", "--junit-xml", "--json", "--reset-state",
                                       "--help"])
@click.option("--budget", default="60s", show_default=True, type=DURATION, help="Time budget: 90s, 10m, 2h, 1h30m.")
@click.option("--engine", default=None, type=ENGINE,
              help="reference, vllm, hf, sglang, llamacpp, mlx, or package.module:Class. Default: the best engine installed here "
                   "(SGLang or vLLM on a GPU, vLLM's CPU build, HF transformers; the first output line says which); "
                   "with --inject: reference.")
@click.option("--inject", default=None, type=bug_choice(),
              help="Reference engine only: inject a catalogued bug (N1..N7) or a mutant of the time-to-bug bench (M01..M16); the campaign must find it.")
@click.option("--method", "methods", multiple=True, type=method_choice(),
              help="Speculation methods to fuzz (repeatable); 'none' = speculation off (a calibration campaign). Default: all the engine supports.")
@click.option("--corpus", "corpus_dir", default="corpus", show_default=True, type=WRITABLE_DIR,
              help="Where findings, crashes and the campaign state are stored (shared by resumed runs).")
@click.option("--seed", default=0, show_default=True, type=SEED, help="Deterministic with the same seed (and engine).")
@click.option("--workers", default=1, show_default=True, type=Number(1, 64, integer=True), help="Parallel campaign processes sharing the corpus.")
@click.option("--alpha", default=1e-3, show_default=True, type=ALPHA,
              help="Campaign-wide false-alarm probability (spent per confirmation; shared by workers and resumed runs).")
@click.option("--screen-alpha", default=SCREEN_ALPHA, show_default=True, type=ALPHA,
              help="Fixed level of every family's screening test (not spent from --alpha): crossing it makes a candidate, "
                   "which is confirmed on fresh samples.")
@click.option("--samples", "max_samples", default=1000, show_default=True, type=COUNT,
              help="Samples per request pattern when the verdict does not fail earlier.")
@click.option("--max-vocab", default=5, show_default=True, type=MAX_VOCAB, help="Largest vocabulary of a drawn table model.")
@click.option("--max-tokens", default=4, show_default=True, type=MAX_TOKENS, help="Most output tokens per request.")
@click.option("--max-k", default=3, show_default=True, type=Number(1, 16, integer=True),
              help="Largest number of speculative tokens (chain length, tree depth) drawn where the engine does not fix it.")
@click.option("--dtype", default="float32", show_default=True, type=dtype_choice(),
              help="The dtype of the table checkpoints and of the engine's computation.")
@click.option("--work-dir", default=".specfuzz-cache", show_default=True, type=WRITABLE_DIR,
              help="Checkpoints, engine logs and drafts of this run.")
@click.option("--quiet", is_flag=True, help="No live display; print the summary only.")
@click.option("--engine-setting", "engine_settings", multiple=True, metavar="KEY=VALUE",
              help="An engine knob passed to the engine's start (value parsed as JSON when it can be), e.g. enforce_eager=false.")
@click.option("--batch", default=600, show_default=True, type=COUNT, help="Requests per engine call (all patterns of a family mixed).")
@click.option("--patterns", default=3, show_default=True, type=Number(1, 64, integer=True),
              help="Most request patterns (prompt + sampling settings) per model family; one engine start serves them all. Raise it where starts are slow (GPU engines).")
@click.option("--no-steer", is_flag=True,
              help="Draw every start shape and family uniformly instead of steering them toward the speculation events "
                   "the campaign has covered least (longer drafts, deeper trees, the thin events' sampling features).")
@click.option("--no-swap", is_flag=True,
              help="Start the engine afresh for every table model instead of loading new tables into the running engine.")
@click.option("--spare-engines/--no-spare-engines", "spare_engines", default=None,
              help="Keep one engine process warmed up (its imports made) for the next start of an engine that restarts in a new "
                   "process (vLLM, SGLang). Default: on with 8 or more CPUs.")
@click.option("--prestart/--no-prestart", "prestart", default=None,
              help="Start the next search's engine in the background while this search samples (engines that restart in "
                   "a new process; it holds a second engine's memory). Default: wherever spare engines are on.")
@click.option("--fill-waits/--no-fill-waits", "fill_waits", default=None,
              help="While a fresh confirmation engine or the speculation-off engine starts, sample more families of the "
                   "running search on its engine (by table swaps). Default: wherever prestarts are on.")
@click.option("--reset-state", is_flag=True,
              help="Start a fresh campaign state (α spending, totals, Hypothesis database kept): the old state file, "
                   "damaged or not, is kept beside it under a new name. Needed to go on after the state file was damaged.")
@click.option("--max-findings", default=None, type=COUNT, metavar="N",
              help="Stop after the search in which the Nth new corpus entry (finding, crash or stale weights) was stored "
                   "(each --workers process counts its own). Default: run to the budget.")
@click.option("--junit-xml", "junit_out", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Write a JUnit XML report here: a failed test per new entry (its drafted ISSUE.md as text), a skipped one per known entry met again.")
@click.option("--json", "json_out", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Write a JSON report here (schema: docs/results-schema.json).")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="Run on Ray: engine actors search, this process alone writes the corpus. Alone: a new local cluster; 'auto': the cluster running here; or HOST:PORT.")
@click.option("--engines", default=None, type=Number(1, 4096, integer=True),
              help="With --ray: engine actors (default: one per GPU; CPU engines: one per CPU).")
@click.option("--gpus-per-engine", default=None, type=Number(0, 64),
              help="With --ray: GPUs per engine actor (0.25 packs four engines on a GPU; 0: CPU actors). Default: 1 on a cluster with GPUs (reference engine: 0).")
@click.option("--cpus-per-engine", default=1.0, show_default=True, type=Number(0, 1024, lo_open=True),
              help="With --ray: CPUs per engine actor.")
@click.option("--worker-index", default=0, hidden=True, type=Number(0, 64, integer=True))
def fuzz_cmd(budget, engine, inject, methods, corpus_dir, seed, workers, alpha, screen_alpha, max_samples, max_vocab, max_tokens, max_k,
             dtype, work_dir, quiet, engine_settings, batch, patterns, no_swap, no_steer, spare_engines, prestart, fill_waits, reset_state,
             max_findings, junit_out, json_out, ray_address, engines, gpus_per_engine, cpus_per_engine, worker_index) -> None:
    """Run a fuzz campaign: search, shrink, calibrate, store every finding in the corpus.

    Exit status: 0 nothing new (known entries met again included), 1 a new finding or
    crash was stored, 2 bad input, 3 the engine could not start at all.

    Example: specfuzz fuzz --engine vllm --budget 10m --method ngram
    """
    from specfuzz.fuzz.campaign import Campaign, CampaignConfig
    from specfuzz.fuzz.display import LiveDisplay, print_summary

    # Everything is checked before anything is written or started.
    budget_s = float(budget)
    if ray_address is None and (engines is not None or gpus_per_engine is not None):
        raise click.BadParameter("--engines and --gpus-per-engine: only with --ray", param_hint="--ray")
    if ray_address is not None and max_findings is not None:
        raise click.BadParameter(f"{max_findings}: not with --ray (its actors search until the budget ends)", param_hint="--max-findings")
    if ray_address is not None and workers > 1:
        raise click.BadParameter(f"{workers}: 1 with --ray (--engines sets the engine actors)", param_hint="--workers")
    meth: tuple[str, ...] | None
    if not methods:
        meth = None
    elif "none" in methods:
        if len(methods) > 1:
            raise click.BadParameter(f"{methods!r}: 'none' alone, or speculation methods", param_hint="--method")
        meth = ()
    else:
        meth = tuple(dict.fromkeys(methods))
    engine, chosen = choose_engine(engine, inject)
    engine_kwargs = engine_kwargs_for(engine, inject)
    parse_settings(engine_settings)  # a bad KEY=VALUE is refused here
    from specfuzz.engines.availability import require_engine
    from specfuzz.engines.isolation import EngineCrash
    from specfuzz.errors import EngineUnavailable
    from specfuzz.fuzz import outcome

    t0 = time.monotonic()
    try:
        require_engine(engine)
    except EngineUnavailable as exc:
        _finish_campaign(engine, corpus_dir, None, [], str(exc), time.monotonic() - t0, junit_out, json_out)
    before = outcome.snapshot(corpus_dir)  # before any worker can store: what this campaign met is the difference
    if workers > 1:
        # N campaign processes on one device: split its memory between their engines.
        engine_settings = tuple(engine_settings) + tuple(f"{k}={json.dumps(v)}" for k, v in _device_share(engine, workers, engine_settings, prestart).items())
    # Workers share the corpus's α ledger (fuzz/ledger.py): each passes the campaign's α.
    cfg = CampaignConfig(
        engine=engine, engine_kwargs=engine_kwargs, budget_s=budget_s, corpus_dir=corpus_dir,
        seed=seed, methods=meth, alpha=alpha, screen_alpha=screen_alpha, max_samples=max_samples, max_vocab=max_vocab, max_tokens=max_tokens,
        max_k=max_k,
        dtype=dtype, work_dir=work_dir, worker=worker_index, workers=workers, engine_settings=parse_settings(engine_settings), batch=batch,
        max_patterns=patterns, swap=not no_swap, reset_state=reset_state, spare_engines=spare_engines, prestart=prestart,
        fill_waits=fill_waits, max_findings=max_findings, steer=not no_steer,
    )
    refusals: list[str] = []
    display = None if quiet else LiveDisplay(cfg, console)

    def on_event(msg: str, stats) -> None:
        if msg.startswith("engine refused a case:"):
            refusals.append(msg)
        if display is not None:
            display.update(msg, stats)

    if ray_address is not None:
        _fuzz_on_ray(cfg, ray_address, engines, gpus_per_engine, cpus_per_engine, display, on_event, meth, max_vocab,
                     chosen)
        return
    campaign = Campaign(cfg, on_event=on_event)  # refuses a damaged campaign state (InvalidInput)
    announce(chosen)
    try:
        check_methods(campaign.engine.capabilities(), meth, max_vocab)
    except EngineCrash as exc:  # the engine does not even say what it supports
        campaign.engine.close()
        _finish_campaign(engine, corpus_dir, None, [], f"engine {engine!r} could not start: {exc}",
                         time.monotonic() - t0, junit_out, json_out)
    except BaseException:
        campaign.engine.close()
        raise
    for note in campaign.state_notes:
        console.print(f"[yellow]{note}[/yellow]", highlight=False, soft_wrap=True)
    procs = []
    if workers > 1 and worker_index == 0:
        import subprocess

        for w in range(1, workers):
            cmd = [sys.executable, "-m", "specfuzz", "fuzz", "--budget", str(budget_s), "--engine", engine,
                   "--corpus", str(corpus_dir), "--seed", str(seed * 1000 + w), "--alpha", str(alpha),
                   "--screen-alpha", str(screen_alpha),
                   "--samples", str(max_samples), "--max-vocab", str(max_vocab), "--max-tokens", str(max_tokens), "--max-k", str(max_k),
                   "--dtype", dtype, "--work-dir", str(work_dir / f"w{w}"), "--quiet", "--worker-index", str(w),
                   "--workers", str(workers)]
            cmd += ["--inject", inject] if inject else []
            cmd += ["--reset-state"] if reset_state else []
            for m in methods:
                cmd += ["--method", m]
            for kv in engine_settings:
                cmd += ["--engine-setting", kv]
            cmd += ["--batch", str(batch), "--patterns", str(patterns)] + (["--no-swap"] if no_swap else [])
            cmd += ["--no-steer"] if no_steer else []
            cmd += [] if spare_engines is None else ["--spare-engines" if spare_engines else "--no-spare-engines"]
            cmd += [] if prestart is None else ["--prestart" if prestart else "--no-prestart"]
            cmd += [] if fill_waits is None else ["--fill-waits" if fill_waits else "--no-fill-waits"]
            cmd += [] if max_findings is None else ["--max-findings", str(max_findings)]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL))
    error = None
    try:
        if display is not None:
            with display:
                stats = campaign.run()
        else:
            stats = campaign.run()
    except EngineCrash as exc:  # before any case ran: the engine's capabilities or version
        stats, error = campaign.stats, f"engine {engine!r} could not start: {exc}"
    finally:
        for p in procs:
            p.wait()
    totals = campaign.totals
    if procs:
        from specfuzz.fuzz.campaign import merge_worker_totals

        totals = merge_worker_totals(corpus_dir, workers, totals)
    print_summary(console, cfg, stats, campaign.corpus, totals)
    if refusals and stats.cases == 0:
        # Every case was refused: a setting the engine does not take, not an empty search space.
        raise click.UsageError(f"the engine refused every case ({refusals[-1].split(':', 1)[1].strip()}); "
                               "check --engine-setting and --dtype")
    if worker_index:
        return  # a helper worker: the first process reports for the campaign
    met = outcome.met_since(corpus_dir, before)
    error = error or outcome.engine_error(stats, engine, cfg.engine_kwargs, work_dir=work_dir, dtype=dtype,
                                          settings=cfg.engine_settings)
    _finish_campaign(engine, corpus_dir, stats, met, error, time.monotonic() - t0, junit_out, json_out, work_dir,
                     coverage=totals.get("coverage"))


def _finish_campaign(engine, corpus_dir, stats, met, error, seconds, junit_out, json_out, work_dir=None,
                     coverage: dict | None = None) -> None:
    """Report what a campaign met (console, --junit-xml, --json) and end with its exit status."""
    from specfuzz.exitcodes import finish, for_campaign
    from specfuzz.fuzz.results import fuzz_results, write_reports

    new = [m for m in met if m.is_new_bug]
    code = for_campaign(len(new), error)
    if error:
        click.echo(f"error: {error}", err=True)
    elif new:
        console.print(f"{len(new)} new corpus entries: " + ", ".join(m.path.name for m in new), highlight=False)
    if junit_out or json_out:
        # The engine's version record, as stored with what it met (no extra engine start).
        info = next((dict(m.entry.engine) for m in met if m.entry.engine.get("version")), {"name": engine})
        results = fuzz_results(engine=engine, engine_info=info, corpus=corpus_dir, stats=stats, met=met,
                               seconds=seconds, exit_code=int(code), engine_error=error,
                               drafts_dir=None if work_dir is None else Path(work_dir) / "drafts", coverage=coverage)
        write_reports(results, json_path=json_out, junit_path=junit_out)
    finish(code)


def _fuzz_on_ray(cfg, address: str, engines, gpus_per_engine, cpus_per_engine, display, on_event, methods,
                 max_vocab: int, chosen: str | None = None) -> None:
    """``fuzz --ray``: the campaign on Ray (specfuzz.fuzz.ray_driver), then its summary.
    The campaign state and the methods are checked here first, as without Ray (the
    methods where the engine can be loaded here: a driver node need not have it)."""
    import dataclasses
    from types import SimpleNamespace

    from specfuzz.engines.isolation import IsolatedEngine, load_engine_class
    from specfuzz.errors import SpecfuzzError
    from specfuzz.fuzz.campaign import Campaign
    from specfuzz.fuzz.corpus import Corpus
    from specfuzz.fuzz.display import print_ray_summary, print_summary
    from specfuzz.fuzz.ray_driver import RayOptions, run_ray_campaign

    state = SimpleNamespace(state_path=Path(cfg.corpus_dir) / ".specfuzz" / "state.json", cfg=cfg)
    Campaign._load_state(state)  # type: ignore[arg-type]  # a damaged state: refused; --reset-state: set aside
    announce(chosen)
    for note in getattr(state, "state_notes", ()):
        console.print(f"[yellow]{note}[/yellow]", highlight=False, soft_wrap=True)
    if hasattr(cfg, "reset_state"):
        cfg = dataclasses.replace(cfg, reset_state=False)
    try:
        load_engine_class(cfg.engine)
    except SpecfuzzError:
        pass  # not importable here: the engine actors check it
    else:
        eng = IsolatedEngine(cfg.engine, cfg.engine_kwargs, log_dir=Path(cfg.work_dir) / "logs")
        try:
            check_methods(eng.capabilities(), methods, max_vocab)
        finally:
            eng.close()
    opts = RayOptions(address=None if address == "local" else address, engines=engines,
                      gpus_per_engine=gpus_per_engine, cpus_per_engine=cpus_per_engine)
    if display is not None:
        with display:
            outcome = run_ray_campaign(cfg, opts, on_event=on_event)
    else:
        outcome = run_ray_campaign(cfg, opts, on_event=on_event)
    if isinstance(outcome.fatal, SpecfuzzError):
        raise outcome.fatal
    if outcome.fatal is not None and not isinstance(outcome.fatal, KeyboardInterrupt):
        console.print(f"[red]error:[/red] an engine actor's searches failed: {str(outcome.fatal)[-2000:]}")
    print_summary(console, cfg, outcome.stats, Corpus(cfg.corpus_dir), outcome.totals)
    print_ray_summary(console, outcome)
    if isinstance(outcome.fatal, KeyboardInterrupt):
        sys.exit(130)
    if outcome.fatal is not None:
        sys.exit(1)


# Each campaign process runs up to this many engines at once (searching, speculation-off
# calibration, a fresh confirmation engine, the next search's prestarted engines: speculation on and off).
ENGINES_PER_WORKER = 5
# The share of a GPU that specfuzz's engines may use in all.
DEVICE_SHARE = 0.8
# The engine setting that sizes an engine's share of the GPU, per built-in engine.
MEMORY_SETTING = {"vllm": "gpu_memory_utilization", "sglang": "mem_fraction_static"}


def _device_share(engine: str, workers: int, given: tuple[str, ...], prestart: bool | None = None) -> dict:
    """Settings that split one GPU between ``workers`` campaign processes (none when the
    engine has no such setting, there is no GPU, or the user or site sized it already);
    ``prestart`` False: two engines fewer per worker (no prestarted ones)."""
    import os

    key = MEMORY_SETTING.get(engine)
    if key is None:
        return {}
    site = os.environ.get(f"SPECFUZZ_{engine.upper()}_SETTINGS", "")
    if any(kv.split("=", 1)[0] in (key, "kv_cache_memory_bytes") for kv in given) or key in site or "kv_cache_memory_bytes" in site:
        return {}
    try:
        import torch

        if not torch.cuda.is_available():
            return {}
    except ImportError:
        return {}
    per_worker = ENGINES_PER_WORKER - (2 if prestart is False else 0)
    return {key: round(DEVICE_SHARE / (per_worker * workers), 4)}

