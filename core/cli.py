"""The ``specfuzz`` command line."""

from __future__ import annotations

import json
import math
import signal
import sys
import time
from pathlib import Path

import click
import numpy as np
from rich.console import Console
from rich.table import Table

from specfuzz.cli_input import (
    ALPHA, COUNT, DURATION, ENGINE, MAX_TOKENS, MAX_VOCAB, SEED, TOLERANCE, WRITABLE_DIR, Duration, Number, OneLineErrors,
    bug_choice, check_writable_file, dtype_choice, method_choice, parse_duration, read_case_file, read_entry_file,
)
from specfuzz.oracle.budget import SCREEN_ALPHA

console = Console()


class _DefaultToFuzz(OneLineErrors):
    """``specfuzz --budget 2h`` means ``specfuzz fuzz --budget 2h``; errors are one line
    (cli_input) with the exit status of :mod:`specfuzz.exitcodes`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0].startswith("-") and args[0] not in ("-h", "--help", "--version")):
            args = ["fuzz", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_DefaultToFuzz, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="specfuzz")
def main() -> None:
    """Prove or refute that an engine's speculative decoding samples exactly from the target law.

    Without a command, runs a fuzz campaign (`specfuzz --budget 2h` = `specfuzz fuzz --budget 2h`).
    A bad value on any command gets one line naming it and what is allowed, and exit status 2;
    nothing in the corpus or its campaign state is changed.
    """


def parse_budget(text: str) -> float:
    """'90s', '10m', '2h', '1h30m' or plain seconds -> seconds (click.BadParameter otherwise)."""
    try:
        return parse_duration(text)
    except ValueError:
        raise click.BadParameter(f"{text!r}: {Duration.ALLOWED}", param_hint="--budget") from None


def parse_settings(items: tuple[str, ...]) -> dict:
    """('enforce_eager=false', 'attention_config={"backend": "TRITON_ATTN"}') -> dict."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r}: KEY=VALUE (VALUE parsed as JSON when it can be)", param_hint="--engine-setting")
        try:
            out[key] = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            out[key] = value
    return out


def _check_methods(caps, methods: tuple[str, ...] | None, max_vocab: int) -> None:
    """Refuse methods the engine does not run, and a --max-vocab below every requested method's floor."""
    if methods is None or methods == ():
        return
    unsupported = [m for m in methods if m not in caps.methods]
    if unsupported:
        raise click.BadParameter(f"{unsupported[0]!r}: one of {', '.join(caps.methods)} on this engine, or none",
                                 param_hint="--method")
    floors = dict(getattr(caps, "min_vocab", {}) or {})
    if all(floors.get(m, 2) > max_vocab for m in methods):
        need = min(floors.get(m, 2) for m in methods)
        raise click.BadParameter(f"{max_vocab}: >= {need} for methods {', '.join(methods)} on this engine "
                                 f"(its smallest vocabulary per method: {floors})", param_hint="--max-vocab")


@main.command("fuzz")
@click.option("--budget", default="60s", show_default=True, type=DURATION, help="Time budget: 90s, 10m, 2h, 1h30m.")
@click.option("--engine", default="reference", show_default=True, type=ENGINE, help="reference, vllm, hf, sglang, mlx, or package.module:Class.")
@click.option("--inject", default=None, type=bug_choice(), help="Reference engine only: inject a catalogued bug (N1..N7).")
@click.option("--method", "methods", multiple=True, type=method_choice(),
              help="Speculation methods to fuzz (repeatable); 'none' = speculation off (a calibration campaign). Default: all the engine supports.")
@click.option("--corpus", "corpus_dir", default="corpus", show_default=True, type=WRITABLE_DIR)
@click.option("--seed", default=0, show_default=True, type=SEED, help="Deterministic with the same seed (and engine).")
@click.option("--workers", default=1, show_default=True, type=Number(1, 64, integer=True), help="Parallel campaign processes sharing the corpus.")
@click.option("--alpha", default=1e-3, show_default=True, type=ALPHA,
              help="Campaign-wide false-alarm probability (spent per confirmation; shared by workers and resumed runs).")
@click.option("--screen-alpha", default=SCREEN_ALPHA, show_default=True, type=ALPHA,
              help="Fixed level of every family's screening test (not spent from --alpha): crossing it makes a candidate, "
                   "which is confirmed on fresh samples.")
@click.option("--samples", "max_samples", default=1000, show_default=True, type=COUNT,
              help="Samples per request pattern when the verdict does not fail earlier.")
@click.option("--max-vocab", default=5, show_default=True, type=MAX_VOCAB)
@click.option("--max-tokens", default=4, show_default=True, type=MAX_TOKENS)
@click.option("--dtype", default="float32", show_default=True, type=dtype_choice())
@click.option("--work-dir", default=".specfuzz-cache", show_default=True, type=WRITABLE_DIR)
@click.option("--quiet", is_flag=True, help="No live display; print the summary only.")
@click.option("--engine-setting", "engine_settings", multiple=True, metavar="KEY=VALUE",
              help="An engine knob passed to the engine's start (value parsed as JSON when it can be), e.g. enforce_eager=false.")
@click.option("--batch", default=600, show_default=True, type=COUNT, help="Requests per engine call (all patterns of a family mixed).")
@click.option("--patterns", default=3, show_default=True, type=Number(1, 64, integer=True),
              help="Most request patterns (prompt + sampling settings) per model family; one engine start serves them all. Raise it where starts are slow (GPU engines).")
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
def fuzz_cmd(budget, engine, inject, methods, corpus_dir, seed, workers, alpha, screen_alpha, max_samples, max_vocab, max_tokens,
             dtype, work_dir, quiet, engine_settings, batch, patterns, no_swap, spare_engines, prestart, fill_waits, reset_state,
             max_findings, junit_out, json_out, ray_address, engines, gpus_per_engine, cpus_per_engine, worker_index) -> None:
    """Run a fuzz campaign: search, shrink, calibrate, store every finding in the corpus.

    Exit status: 0 nothing new (known entries met again included), 1 a new finding or
    crash was stored, 2 bad input, 3 the engine could not start at all."""
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
    engine_kwargs = _engine_kwargs(engine, inject)
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
        dtype=dtype, work_dir=work_dir, worker=worker_index, workers=workers, engine_settings=parse_settings(engine_settings), batch=batch,
        max_patterns=patterns, swap=not no_swap, reset_state=reset_state, spare_engines=spare_engines, prestart=prestart,
        fill_waits=fill_waits, max_findings=max_findings,
    )
    refusals: list[str] = []
    display = None if quiet else LiveDisplay(cfg, console)

    def on_event(msg: str, stats) -> None:
        if msg.startswith("engine refused a case:"):
            refusals.append(msg)
        if display is not None:
            display.update(msg, stats)

    if ray_address is not None:
        _fuzz_on_ray(cfg, ray_address, engines, gpus_per_engine, cpus_per_engine, display, on_event, meth, max_vocab)
        return
    campaign = Campaign(cfg, on_event=on_event)  # refuses a damaged campaign state (InvalidInput)
    try:
        _check_methods(campaign.engine.capabilities(), meth, max_vocab)
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
                   "--samples", str(max_samples), "--max-vocab", str(max_vocab), "--max-tokens", str(max_tokens),
                   "--dtype", dtype, "--work-dir", str(work_dir / f"w{w}"), "--quiet", "--worker-index", str(w),
                   "--workers", str(workers)]
            cmd += ["--inject", inject] if inject else []
            cmd += ["--reset-state"] if reset_state else []
            for m in methods:
                cmd += ["--method", m]
            for kv in engine_settings:
                cmd += ["--engine-setting", kv]
            cmd += ["--batch", str(batch), "--patterns", str(patterns)] + (["--no-swap"] if no_swap else [])
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
    _finish_campaign(engine, corpus_dir, stats, met, error, time.monotonic() - t0, junit_out, json_out, work_dir)


def _finish_campaign(engine, corpus_dir, stats, met, error, seconds, junit_out, json_out, work_dir=None) -> None:
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
                               drafts_dir=None if work_dir is None else Path(work_dir) / "drafts")
        write_reports(results, json_path=json_out, junit_path=junit_out)
    finish(code)


def _fuzz_on_ray(cfg, address: str, engines, gpus_per_engine, cpus_per_engine, display, on_event, methods,
                 max_vocab: int) -> None:
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
            _check_methods(eng.capabilities(), methods, max_vocab)
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


@main.command("law")
@click.argument("case_file", type=click.Path(path_type=Path))
@click.option("--top", default=20, show_default=True, type=COUNT, help="Show the most likely outputs only.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole law as JSON.")
def law_cmd(case_file: Path, top: int, as_json: bool) -> None:
    """Print the exact target law μ of a case (a case JSON file, or a corpus entry holding one)."""
    case = read_case_file(case_file)
    law = case.target_law().enumerate()
    if as_json:
        click.echo(json.dumps({"outputs": [list(o) for o in law.outputs], "probs": law.probs.tolist(), "error_bound": law.error_bound}))
        return
    order = np.argsort(-law.probs)[:top]
    t = Table(title=f"μ: {len(law.outputs)} outputs, every probability exact to {law.error_bound:.1e}")
    t.add_column("output")
    t.add_column("probability", justify="right")
    for i in order:
        t.add_row(" ".join(map(str, law.outputs[i])), f"{law.probs[i]:.6f}")
    console.print(t)


@main.command("catalogue")
@click.option("--bug", "bugs", multiple=True, type=bug_choice(), help="Only these classes (N1..N7); default all.")
@click.option("--alpha", default=1e-3, show_default=True, type=ALPHA, help="Level of each case's test.")
@click.option("--max-samples", default=20_000, show_default=True, type=COUNT)
@click.option("--seed", default=0, show_default=True, type=SEED)
@click.option("--store", "store_dir", default=None, type=WRITABLE_DIR,
              help="Also write each class as a regression corpus entry into this folder.")
def catalogue_cmd(bugs: tuple[str, ...], alpha: float, max_samples: int, seed: int, store_dir: Path | None) -> None:
    """Run the regression catalogue N1-N7 on the reference sampler: detect and attribute each."""
    from specfuzz.oracle.catalogue import catalogue
    from specfuzz.oracle.judge import CaseTest
    from specfuzz.oracle.speculative import BUG_CLASSES, MonteCarloDriver

    entries = catalogue()
    unknown = [b for b in bugs if b not in entries]
    if unknown:
        raise click.BadParameter(f"{unknown[0]!r}: one of {', '.join(sorted(entries))}", param_hint="--bug")
    t = Table(title=f"Regression catalogue on the reference sampler (α = {alpha:g} per case)")
    for col in ("class", "where seen", "samples", "optimal", "verdict", "attributed", "condition"):
        t.add_column(col)
    ok = True
    for bug in bugs or sorted(entries):
        e = entries[bug]
        ct = CaseTest(e.case, alpha=alpha)
        driver = MonteCarloDriver(e.case.process(target=ct.law), np.random.default_rng(seed))
        while ct.n < max_samples and ct.test.log_e < math.log(1 / alpha):
            ct.update(driver.sample_many(5))
        j = ct.judgement()
        label = j.attribution.label if j.attribution else "-"
        ok &= j.failed and label == bug
        opt = j.optimal_samples.get(bug, float("nan"))
        if store_dir is not None:
            _store_regression(store_dir, e, ct, j)
        t.add_row(bug, e.where_seen, str(ct.n), f"{opt:.1f}", j.verdict.status, label, str(BUG_CLASSES[bug][0]))
    console.print(t)
    sys.exit(0 if ok else 1)


def _store_regression(store_dir: Path, entry, ct, judgement) -> None:
    """A regression corpus entry: the catalogue case, replayed with its bug injected."""
    from dataclasses import replace

    from specfuzz.engines.reference_engine import ReferenceEngine
    from specfuzz.fuzz.corpus import Corpus, Entry

    case = entry.case.with_(spec=replace(entry.case.spec, inject=None))
    e = Entry(
        kind="regression",
        engine=dict(ReferenceEngine(inject=entry.bug).version()),
        case=case.to_json(),
        counts=dict(ct.test.counts),
        verdict=judgement.verdict.to_dict(),
        attribution=None if judgement.attribution is None else judgement.attribution.to_dict(),
        evidence=judgement.verdict.evidence,
        extra={"bug": entry.bug, "where_seen": entry.where_seen, "published_effect": entry.published_effect,
               "note": entry.note, "inject": entry.bug, "broken_condition": judgement.broken_condition},
    )
    path = Corpus(store_dir).root / f"regression-{entry.bug}.json"
    from specfuzz.fuzz.corpus import atomic_write_json

    atomic_write_json(path, e.to_json())


def _require_engine(engine: str) -> None:
    from specfuzz.engines.availability import require_engine

    require_engine(engine)


def _engine_kwargs(engine: str, inject: str | None) -> dict:
    if inject is None:
        return {}
    if engine != "reference":
        raise click.BadParameter(f"{inject!r}: --inject only applies to --engine reference", param_hint="--inject")
    return {"inject": inject}


@main.command("check")
@click.argument("case_file", type=click.Path(path_type=Path))
@click.option("--engine", default="reference", show_default=True, type=ENGINE, help="reference, vllm, hf, sglang, mlx, or package.module:Class.")
@click.option("--inject", default=None, type=bug_choice(), help="Reference engine only: inject a catalogued bug (N1..N7).")
@click.option("--samples", default=4000, show_default=True, type=COUNT, help="Samples per run (fewer if the verdict fails earlier).")
@click.option("--alpha", default=1e-3, show_default=True, type=ALPHA)
@click.option("--tolerance", default=0.0, show_default=True, type=TOLERANCE, help="Per-token probability tolerance (for inexact dtypes).")
@click.option("--dtype", default="float32", show_default=True, type=dtype_choice())
@click.option("--corpus", "corpus_dir", default="corpus", show_default=True, type=WRITABLE_DIR)
@click.option("--seed", default=0, show_default=True, type=SEED)
@click.option("--work-dir", default=".specfuzz-cache", show_default=True, type=WRITABLE_DIR)
def check_cmd(case_file, engine, inject, samples, alpha, tolerance, dtype, corpus_dir, seed, work_dir) -> None:
    """Run one case on an engine: calibration with speculation off, then speculation on.

    A speculation-on failure whose calibration passed is stored in the corpus as a
    finding; a calibration failure is stored as a calibration entry (an oracle/profile
    error or a non-speculative engine bug); a crash as a crash entry.
    """
    from specfuzz.engines.isolation import IsolatedEngine
    from specfuzz.fuzz.corpus import Corpus
    from specfuzz.fuzz.run import crash_entry, finding_entry, run_case

    case = read_case_file(case_file)
    corpus = Corpus(corpus_dir)
    _require_engine(engine)  # a missing engine package: exit 3, not a stored "crash"
    eng = IsolatedEngine(engine, _engine_kwargs(engine, inject), log_dir=work_dir / "logs")
    try:
        profile = eng.capabilities().profile
        kw = dict(ckpt_root=work_dir / "checkpoints", alpha=alpha, max_samples=samples, seed=seed,
                  profile=profile, tolerance=tolerance, dtype=dtype)
        t = Table(title=f"{case_file.name} on {engine}" + (f" (+{inject})" if inject else ""))
        for col in ("run", "samples", "verdict", "e-value", "attribution", "seconds"):
            t.add_column(col)
        runs = {}
        for label, spec_on in (("speculation off", False), ("speculation on", True)):
            if spec_on and case.spec is None:
                continue
            r = run_case(eng, case, speculation=spec_on, **kw)
            runs[label] = r
            if r.crash is not None:
                path, _ = corpus.store(crash_entry(eng, case, r.crash, engine, dtype=dtype))
                t.add_row(label, str(r.n), f"crash ({r.crash.kind})", "-", "-", f"{r.seconds:.1f}")
                console.print(f"[red]{r.crash}[/red] -> {path}")
                continue
            j = r.judgement
            attr = j.attribution.label if j.attribution else "-"
            t.add_row(label, str(r.n), j.verdict.status, f"{j.verdict.e_value:.3g}", attr, f"{r.seconds:.1f}")
        console.print(t)
        off, on = runs.get("speculation off"), runs.get("speculation on")
        version = eng.version()
        if off is not None and off.failed:
            entry = finding_entry(version, off, None)
            entry.kind = "calibration"
            path, _ = corpus.store(entry)
            console.print(f"[yellow]calibration failed[/yellow] (speculation off disagrees with μ): stored {path}")
            sys.exit(1)
        if on is not None and on.failed:
            path, new = corpus.store(finding_entry(version, on, off))
            console.print(f"[red]finding[/red]: {on.judgement.verdict.evidence}\n{'stored' if new else 'updated'} {path}")
            sys.exit(1)
        if any(r.crash for r in runs.values()):
            sys.exit(1)
    finally:
        eng.close()


def calibration_suite(vocab: int = 6, seed: int = 9):
    """Standard speculation-off settings on one table model (one engine start serves all)."""
    from specfuzz.case import Case
    from specfuzz.oracle.params import SamplingParams as SP

    rng = np.random.default_rng(seed)
    table = rng.integers(-8, 9, size=(vocab, vocab)) / 4.0  # [V, V], multiples of 1/4: exact in every dtype
    eos = vocab - 1
    settings = {
        "plain": SP(max_tokens=3),
        "temperature 0.5": SP(temperature=0.5, max_tokens=3),
        "greedy": SP(temperature=0.0, max_tokens=3),
        "top_k 2": SP(top_k=2, max_tokens=3),
        "top_p 0.7": SP(top_p=0.7, max_tokens=3),
        # Engines differ on whether top-p sees the top-k renormalised distribution (vLLM)
        # or the full one (SGLang's pytorch sampler): total variation 0.46 between the laws.
        "top_k 3 + top_p 0.7": SP(top_k=3, top_p=0.7, max_tokens=3),
        "min_p 0.2": SP(min_p=0.2, max_tokens=3),
        "min_tokens 2 + EOS": SP(min_tokens=2, max_tokens=3),
        "stop token": SP(stop_token_ids=(1,), max_tokens=3),
        "penalties": SP(repetition_penalty=1.5, frequency_penalty=0.5, presence_penalty=0.5, max_tokens=3),
        "logit_bias": SP(logit_bias={0: 1.0, 2: -1.0}, max_tokens=3),
        "allowed_token_ids": SP(allowed_token_ids=(0, 2, 3, eos), max_tokens=3),
    }
    cases = {name: Case(table, (0, 1, 2), params, eos_token_id=eos) for name, params in settings.items()}
    # Greedy again from a context whose argmax path (3 -> 4 -> EOS) has no tie at the
    # maximum: the prompt above reaches row 2, whose maximum is tied (1.75 at tokens 0
    # and 3), which profiles that leave greedy ties unspecified ("sglang") cannot judge.
    cases["greedy, untied argmax"] = Case(table, (0, 1, 3), SP(temperature=0.0, max_tokens=3), eos_token_id=eos)
    return cases


# Prompt of the logits check in ``specfuzz calibrate``: every context token of the suite's table.
def _logits_prompt(vocab: int) -> list[int]:
    return list(range(vocab)) + [2, 4]


@main.command("calibrate")
@click.option("--engine", default="reference", show_default=True, type=ENGINE)
@click.option("--samples", default=3000, show_default=True, type=COUNT)
@click.option("--alpha", default=1e-3, show_default=True, type=ALPHA)
@click.option("--dtype", default="float32", show_default=True, type=dtype_choice())
@click.option("--engine-setting", "engine_settings", multiple=True, metavar="KEY=VALUE")
@click.option("--work-dir", default=".specfuzz-cache", show_default=True, type=WRITABLE_DIR)
@click.option("--json", "json_out", default=None, type=click.Path(path_type=Path), help="Also write results here.")
def calibrate_cmd(engine, samples, alpha, dtype, engine_settings, work_dir, json_out) -> None:
    """Speculation off on standard sampling settings: does the engine sample μ under its profile?

    Run this first on a new engine or build: a failure here is an oracle/profile error or
    a non-speculative engine bug, and speculation findings on that setting mean nothing.
    Settings the engine does not support, or whose law its profile leaves unspecified
    (ties the engine may break either way), are skipped and listed. Engines with a
    ``logits_match_table`` method (vLLM, SGLang) also check that their own next-token
    logits or logprobs reproduce the table (row "logits"). Results are written to
    ``--json`` before the engine is shut down.
    """
    from specfuzz.engines.isolation import EngineCrash, IsolatedEngine
    from specfuzz.errors import AmbiguousSemantics
    from specfuzz.fuzz.run import run_family
    from specfuzz.oracle.judge import target_law_dict

    settings = parse_settings(engine_settings)
    if json_out is not None:
        check_writable_file(json_out, "--json")
    suite = calibration_suite()
    _require_engine(engine)  # a missing engine package: exit 3, not a stored "crash"
    eng = IsolatedEngine(engine, {}, log_dir=work_dir / "logs")
    rows: list[dict] = []
    skipped: list[str] = []
    version: dict = {"name": engine}
    t = None
    try:
        caps = eng.capabilities()
        names = []
        for n, c in suite.items():
            unsupported = [f for f, v in c.params.to_json().items()
                           if v != SamplingParams_default().get(f) and f != "max_tokens" and f not in caps.sampling]
            if unsupported:
                skipped.append(f"{n} (not supported: {', '.join(unsupported)})")
                continue
            try:
                target_law_dict(c, profile=caps.profile)
            except AmbiguousSemantics as exc:
                skipped.append(f"{n} (ambiguous under profile {caps.profile}: {str(exc)[:120]})")
                continue
            names.append(n)
        cases = [suite[n] for n in names]
        if not cases:
            raise click.ClickException(f"no calibration setting applies to engine {engine!r} (skipped: {'; '.join(skipped)})")
        runs = run_family(eng, cases, ckpt_root=work_dir / "checkpoints", alphas=[alpha / len(cases)] * len(cases),
                          max_samples=samples, batch=min(6000, samples * len(cases)), speculation=False,
                          profile=caps.profile, dtype=dtype, settings=settings)
        t = Table(title=f"calibration of {engine} ({dtype}, speculation off, profile {caps.profile})")
        for col in ("setting", "samples", "verdict", "e-value", "worst token"):
            t.add_column(col)
        for name, r in zip(names, runs):
            if r.crash is not None:
                t.add_row(name, str(r.n), f"crash ({r.crash.kind})", "-", r.crash.detail[:60])
                rows.append({"setting": name, "status": "crash", "detail": r.crash.detail})
                continue
            v = r.judgement.verdict
            wt = v.worst_token
            wts = "-" if wt is None else f"{tuple(wt.context)}→{wt.token}: {wt.observed:.3f} vs {wt.expected:.3f}"
            t.add_row(name, str(r.n), v.status, f"{v.e_value:.3g}", wts)
            rows.append({"setting": name, "status": v.status, "n": r.n, "log_e": v.log_e if math.isfinite(v.log_e) else "inf",
                         "evidence": v.evidence})
        try:
            version = dict(eng.version())
        except EngineCrash as exc:
            version = {"name": engine, "error": str(exc)}
        if not any(r.crash for r in runs):
            row = _logits_row(eng, cases[0].vocab_size if cases else 0)
            if row is not None:
                rows.append(row)
                t.add_row("logits", str(row.get("positions", "-")), row["status"], "-", row.get("detail", "")[:60])
        _write_calibration(json_out, version, dtype, rows, skipped)
    finally:
        eng.close()
    if t is not None:
        console.print(t)
    if skipped:
        console.print(f"skipped: {'; '.join(skipped)}")
    _write_calibration(json_out, version, dtype, rows, skipped)
    sys.exit(1 if any(r["status"] in ("fail", "crash") for r in rows) else 0)


def _logits_row(eng, vocab: int) -> dict | None:
    """The engine's own logits/logprobs against the table (None when it has no such check)."""
    from specfuzz.engines.isolation import EngineCrash

    try:
        report = eng.call("logits_match_table", _logits_prompt(vocab))
    except AttributeError:
        return None
    except EngineCrash as exc:
        return {"setting": "logits", "status": "crash", "detail": exc.detail}
    d = report.to_json()
    return {"setting": "logits", "status": "pass" if report.ok else "fail", "positions": report.positions,
            "detail": f"{d['mode']}: max |diff| {d['max_abs_diff']:.3g} (tolerance {d['tolerance']:g})", "report": d}


def _write_calibration(json_out: Path | None, version: dict, dtype: str, rows: list[dict], skipped: list[str]) -> None:
    if not json_out:
        return
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps({"engine": dict(version), "dtype": dtype, "rows": rows, "skipped": skipped}, indent=1))


def SamplingParams_default() -> dict:
    from specfuzz.oracle.params import SamplingParams

    return SamplingParams().to_json()


ENGINE_NAMES = {"hf-transformers": "hf", "vllm": "vllm", "sglang": "sglang", "mlx-lm": "mlx"}


def engine_for_entry(entry) -> tuple[str, dict]:
    """The engine spec and kwargs that re-run a stored entry (as it was found)."""
    name = str(entry.engine.get("name", "reference"))
    if entry.kind == "regression" or name.startswith("reference"):
        inject = entry.extra.get("inject") or (name.split("+", 1)[1] if "+" in name else None)
        return "reference", ({"inject": inject} if inject else {})
    if name in ENGINE_NAMES:
        return ENGINE_NAMES[name], {}
    spec = entry.engine.get("engine_spec")
    if spec:
        return spec, {}
    raise click.UsageError(f"entry engine {name!r}: cannot tell how to start it; pass --engine "
                           "(reference, vllm, hf, sglang or package.module:Class)")


@main.command("replay")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--engine", default=None, type=ENGINE, help="Engine to replay on (default: each entry's own; regression entries: the reference with their bug).")
@click.option("--inject", default=None, type=bug_choice(), help="With --engine reference: inject this class instead.")
@click.option("--samples", default=2000, show_default=True, type=COUNT)
@click.option("--alpha", default=1e-3, show_default=True, type=ALPHA)
@click.option("--seed", default=12345, show_default=True, type=SEED, help="Fresh samples: a seed the campaign did not use.")
@click.option("--work-dir", default=".specfuzz-cache", show_default=True, type=WRITABLE_DIR)
@click.option("--check", is_flag=True, help="Exit 1 if any entry still fails (a gate for a fixed engine).")
@click.option("--junit-xml", "junit_out", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Write a JUnit XML report here: a test per entry, failed while it still fails.")
@click.option("--json", "json_out", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Write a JSON report here (schema: docs/results-schema.json).")
def replay_cmd(paths, engine, inject, samples, alpha, seed, work_dir, check, junit_out, json_out) -> None:
    """Re-run stored corpus entries (files or folders) and report which still fail.

    Exit status: 1 with --check when an entry still fails (or crashes); 3 when an
    entry's engine could not start at all (its entries are not counted as failing);
    2 bad input; else 0."""
    from specfuzz.case import Case
    from specfuzz.engines.availability import require_engine, start_error
    from specfuzz.engines.isolation import EngineCrash, IsolatedEngine
    from specfuzz.errors import EngineUnavailable
    from specfuzz.exitcodes import finish, for_replay
    from specfuzz.cli_input import entry_problem
    from specfuzz.fuzz.corpus import Corpus, Entry
    from specfuzz.fuzz.results import ReplayRow, replay_results, write_reports
    from specfuzz.fuzz.run import entry_replay_calls, run_case

    t0 = time.monotonic()
    items: list[tuple[Path, Entry]] = []
    skipped: list[str] = []
    for p in paths:
        if p.is_dir():
            for path, e in Corpus(p).entries():
                if isinstance(e, Entry) and entry_problem(e.to_json()) is None:
                    items.append((path, e))
                else:
                    skipped.append(f"[yellow]skipped[/yellow] {path}: {e if not isinstance(e, Entry) else 'no case'}")
        elif p.exists():
            items.append((p, read_entry_file(p, "PATHS")))  # a file named on its own must be an entry
        else:
            raise click.BadParameter(f"{str(p)!r}: no such file or folder; a corpus entry file or a folder of them",
                                     param_hint="PATHS")
    if not items:
        raise click.BadParameter(f"{', '.join(map(str, paths))!r}: no corpus entries found ({len(skipped)} files skipped); "
                                 "a corpus entry file or a folder holding some", param_hint="PATHS")
    specs = {}
    for path, e in items:
        specs[path] = (engine, _engine_kwargs(engine, inject)) if engine else engine_for_entry(e)
    for line in skipped:
        console.print(line)
    t = Table(title="replay")
    for col in ("entry", "engine", "stored", "now", "samples", "e-value", "attribution"):
        t.add_column(col)
    engines: dict[tuple, IsolatedEngine] = {}
    down: dict[tuple, str] = {}  # engines that cannot start here, with the reason
    rows: list[ReplayRow] = []
    row_keys: list[tuple] = []  # the engine key of each row
    try:
        for path, e in items:
            spec, kw = specs[path]
            key = (spec, tuple(sorted(kw.items())))
            label = spec + (f"+{kw['inject']}" if kw.get("inject") else "")
            stored = f"{e.kind}/{e.label}"
            t1 = time.monotonic()
            if key not in engines and key not in down:
                try:
                    require_engine(spec)
                    engines[key] = IsolatedEngine(spec, kw, log_dir=work_dir / "logs")
                    engines[key].capabilities()
                except EngineUnavailable as exc:
                    down[key] = str(exc)
                except EngineCrash as exc:
                    down[key] = f"engine {label!r} could not start: {exc}"
                    engines.pop(key, None)
            row_keys.append(key)
            if key in down:
                rows.append(ReplayRow(path, e, label, "unavailable", down[key]))
                t.add_row(path.name, label, stored, "engine could not start", "-", "-", "-")
                continue
            eng = engines[key]
            case = Case.from_json(e.case)
            profile = eng.capabilities().profile
            run = run_case(eng, case, ckpt_root=work_dir / "checkpoints", alpha=alpha, max_samples=samples,
                           seed=seed, profile=profile, speculation=e.kind != "calibration", **entry_replay_calls(e))
            if run.crash is not None:
                now, ev, attr = f"crash ({run.crash.kind})", "-", "-"
                detail = f"engine {run.crash.kind}: {run.crash.detail}"
            else:
                j = run.judgement
                now = "still fails" if j.failed else "passes"
                ev = f"{j.verdict.e_value:.3g}"
                attr = j.attribution.label if j.attribution else "-"
                detail = j.verdict.evidence
            rows.append(ReplayRow(path, e, label, now, detail, time.monotonic() - t1))
            t.add_row(path.name, label, stored, now, str(run.n), ev, attr)
    finally:
        for eng in engines.values():
            eng.close()
    # An engine whose every entry crashed without one successful start: can it start at all?
    for key, eng in engines.items():
        mine = [i for i, k in enumerate(row_keys) if k == key]
        if eng.starts == 0 and mine and all(rows[i].outcome.startswith("crash") for i in mine):
            reason = start_error(key[0], dict(key[1]), work_dir=work_dir)
            if reason:
                for i in mine:
                    r = rows[i]
                    rows[i] = ReplayRow(r.path, r.entry, r.engine, "unavailable",
                                        f"engine {r.engine!r} could not start: {reason}", r.seconds)
    console.print(t)
    still = sum(r.outcome not in ("passes", "unavailable") for r in rows)
    unavailable = [r for r in rows if r.outcome == "unavailable"]
    console.print(f"{still} of {len(items)} entries still fail")
    for r in unavailable:
        click.echo(f"error: {r.path.name}: {r.detail}", err=True)
    code = for_replay(still, len(unavailable), check=check)
    if junit_out or json_out:
        results = replay_results(rows, engine=engine, seconds=time.monotonic() - t0, exit_code=int(code))
        write_reports(results, json_path=json_out, junit_path=junit_out)
    finish(code)


def _raise_keyboard_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@main.command("shrink")
@click.argument("entry_path", type=click.Path(path_type=Path))
@click.option("--engine", default=None, type=ENGINE, help="Engine to shrink on (default: the entry's own).")
@click.option("--inject", default=None, type=bug_choice(), help="With --engine reference: inject this class.")
@click.option("--budget", default="10m", show_default=True, type=DURATION, help="Time budget: 90s, 10m, 2h.")
@click.option("--samples", default=2000, show_default=True, type=COUNT, help="Samples per candidate (findings and calibration entries).")
@click.option("--alpha", default=1e-3, show_default=True, type=ALPHA, help="Level of each candidate's test (findings).")
@click.option("--seed", default=54321, show_default=True, type=SEED)
@click.option("--work-dir", default=".specfuzz-cache", show_default=True, type=WRITABLE_DIR)
@click.option("--attempts", default=1, show_default=True, type=Number(1, 20, integer=True),
              help="Runs per candidate before it counts as not reproducing (for crashes that do not happen every time).")
@click.option("--dry-run", is_flag=True, help="Report the shrunk case; do not write it into the corpus.")
def shrink_cmd(entry_path, engine, inject, budget, samples, alpha, seed, work_dir, attempts, dry_run) -> None:
    """Shrink a stored entry on its engine (greedy: smaller vocabulary, prompt, output,
    K, tree and sampling settings while it still reproduces) and store the result in the
    entry's folder: a crash stored unshrunk is replaced (its old case kept in the entry).
    A crash that records the request patterns of its crashing batch is shrunk with them
    mixed in each engine call, as it was found: patterns are dropped while it still crashes."""
    from specfuzz.engines.isolation import EngineCrash, IsolatedEngine
    from specfuzz.cli_input import writable_dir_problem
    from specfuzz.fuzz.corpus import Corpus, atomic_write_json
    from specfuzz.fuzz.run import crash_entry, entry_replay_calls, finding_entry, start_key
    from specfuzz.fuzz.shrink import entry_family, entry_reproducer, seen_tokens, shrink_family
    from specfuzz.fuzz.triage import entry_dtype, entry_settings

    entry = read_entry_file(entry_path, "ENTRY")
    if entry.kind not in ("crash", "finding", "calibration", "regression"):
        raise click.BadParameter(f"{entry_path}: kind {entry.kind!r} cannot be shrunk", param_hint="ENTRY")
    if not dry_run:
        why = writable_dir_problem(entry_path.parent)
        if why is not None:
            raise click.BadParameter(f"{str(entry_path)!r}: its folder is {why}; an entry in a folder specfuzz can "
                                     "write in (or --dry-run)", param_hint="ENTRY")
    spec, kw = (engine, _engine_kwargs(engine, inject)) if engine else engine_for_entry(entry)
    budget_s = float(budget)
    dtype, settings = entry_dtype(entry), entry_settings(entry) or None
    # A crash's whole crashing batch (extra.batch_patterns), mixed as found; otherwise the case alone.
    family = entry_family(entry)
    _require_engine(spec)  # a missing engine package: exit 3, not a stored "crash"
    eng = IsolatedEngine(spec, kw, log_dir=work_dir / "logs")
    prev_term = None
    try:
        repro = entry_reproducer(entry, eng, work_dir=work_dir, samples=samples, alpha=alpha, seed=seed,
                                 dtype=dtype, settings=settings, attempts=attempts)
        mixed = f" ({len(family)} request patterns mixed in each call, as found)" if len(family) > 1 else ""
        console.print(f"checking that {entry_path.name} reproduces on {spec}{mixed} ...")
        first = repro(family)
        try:
            eng.version()  # cached now, while an engine runs: the stored entry's GPU/driver details
        except EngineCrash:
            pass  # the first run crashed the engine: crash_entry falls back to the engine's name
        # SIGTERM (a lease's timeout, a job scheduler) stops shrinking like Ctrl-C: the
        # reductions confirmed so far are stored, not lost with the process.
        try:
            prev_term = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
        except ValueError:  # not the main thread (an embedding caller): leave signals alone
            prev_term = None
        if not first:
            seen = list(dict.fromkeys(getattr(repro, "misses", [])))  # distinct, in order
            console.print(f"[yellow]{entry_path.name} does not reproduce on {spec} in {attempts} attempt(s): "
                          f"nothing to shrink (a crash that comes and goes: try --attempts 5)[/yellow]"
                          + "".join(f"\n  seen instead: {m}" for m in seen[-5:]), highlight=False, soft_wrap=True)
            sys.exit(1)
        # A finding's candidates run on one engine that swaps tables: each pass runs those it
        # serves by a swap first, then the others grouped by the start they need (a crash's
        # candidates each start a fresh process anyway).
        speculating = entry.kind != "calibration"
        grouped = None if entry.kind == "crash" else (
            lambda f: start_key(f[0], speculation=speculating, family=f[1:]))
        res = shrink_family(family, repro, budget_s=budget_s, log=lambda m: console.print(f"  {m}"),
                            speculation=speculating, start_key=grouped,
                            seen=seen_tokens(first))
        if res.last_run is None:
            res.last_run = first
        console.print(f"{res.kept} reductions kept of {res.tried} tried in {res.seconds:.0f} s"
                      + (" (interrupted: not minimal yet)" if res.interrupted else
                         " (budget exhausted: not minimal yet)" if res.budget_exhausted else " (no smaller candidate reproduces)"))
        c = res.case
        console.print(f"shrunk case: V={c.vocab_size}, prompt {list(c.prompt)}, params {c.params.to_json()}, "
                      f"spec {None if c.spec is None else c.spec.to_json()}")
        for i, other in enumerate(res.family[1:], start=2):
            console.print(f"  batch pattern {i} of {len(res.family)}: prompt {list(other.prompt)}, params {other.params.to_json()}")
        if dry_run or not res.kept:
            return
        run = res.last_run
        if entry.kind == "crash":
            crash = run if isinstance(run, EngineCrash) else run.crash
            # The patterns left (batch_patterns when more than one) and the calls they crashed in.
            calls = entry_replay_calls(entry)
            new = crash_entry(eng, c, crash, spec, dtype=dtype, settings=settings, launch=getattr(run, "launch", None),
                              family=res.family, batch=calls["batch"], call_prompt_tokens=calls["call_prompt_tokens"])
        else:
            new = finding_entry(dict(eng.version()), run, None)
            new.kind = entry.kind if entry.kind == "calibration" else new.kind
            new.attribution = new.attribution if entry.kind != "calibration" else None
        for k in ("title", "note", "mechanism", "root_cause", "workaround", "upstream", "where_seen"):
            if k in entry.extra:
                new.extra[k] = entry.extra[k]
        # A second pass on an entry `specfuzz shrink` made continues it: its record adds up.
        prev = entry.extra.get("shrunk_by") if isinstance(entry.extra.get("shrunk_by"), dict) else {}
        new.extra.update(shrunk=True, shrunk_from=entry_path.name,
                         shrunk_by={"command": "specfuzz shrink", "steps": list(prev.get("steps", [])) + res.steps,
                                    "tried": int(prev.get("tried", 0)) + res.tried,
                                    "seconds": round(float(prev.get("seconds", 0.0)) + res.seconds, 1),
                                    "passes": int(prev.get("passes", 1)) + 1 if prev else 1,
                                    "minimal": not res.budget_exhausted and not res.interrupted})
        path, is_new = Corpus(entry_path.parent).store(new)
        if path.resolve() != entry_path.resolve():
            # The smaller case has another signature (fewer features in play): the old entry
            # stays, pointing at its shrunk version.
            old = json.loads(entry_path.read_text())
            old.setdefault("extra", {})["shrunk_into"] = path.name
            atomic_write_json(entry_path, old)
        console.print(f"stored {path} ({'new entry; ' + entry_path.name + ' points at it' if is_new else 'replaced, old case kept in it'})")
    finally:
        if prev_term is not None:
            signal.signal(signal.SIGTERM, prev_term)
        eng.close()


def _register_optional_commands() -> None:
    from specfuzz.doctor import doctor_cmd
    from specfuzz.fuzz.triage_cli import draft_cmd, triage_cmd

    main.add_command(triage_cmd, "triage")
    main.add_command(draft_cmd, "draft")
    main.add_command(doctor_cmd, "doctor")
    from specfuzz.compare.command import compare_cmd

    main.add_command(compare_cmd, "compare")
    from specfuzz.fuzz.bisect_cli import bisect_cmd

    main.add_command(bisect_cmd, "bisect")


_register_optional_commands()


def run() -> None:
    main(standalone_mode=True)  # errors: one line and an exit status (OneLineErrors)


if __name__ == "__main__":
    run()
