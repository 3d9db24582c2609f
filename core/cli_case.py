"""The commands on one case: ``law`` (its exact law μ), ``check`` (one case on an engine),
``calibrate`` (speculation off on standard settings) and ``catalogue`` (the bug classes N1-N7
on the reference sampler)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import rich_click as click
from rich.table import Table

from specfuzz.cli_common import announce, choose_engine, console, engine_kwargs_for, parse_settings, require_engine
from specfuzz.cli_input import (
    ALPHA, COUNT, ENGINE, SEED, TOLERANCE, WRITABLE_DIR, bug_choice, check_writable_file, dtype_choice, read_case_file,
)


@click.command("law")
@click.argument("case_file", type=click.Path(path_type=Path))
@click.option("--top", default=20, show_default=True, type=COUNT, help="Show the most likely outputs only.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole law as JSON.")
def law_cmd(case_file: Path, top: int, as_json: bool) -> None:
    """Print the exact target law μ of a case (a case JSON file, or a corpus entry holding one).

    Example: specfuzz law corpus/regression/regression-N3.json --top 5
    """
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


@click.command("catalogue")
@click.option("--bug", "bugs", multiple=True, type=bug_choice(), help="Only these classes (N1..N7); default all.")
@click.option("--alpha", default=1e-3, show_default=True, type=ALPHA, help="Level of each case's test.")
@click.option("--max-samples", default=20_000, show_default=True, type=COUNT)
@click.option("--seed", default=0, show_default=True, type=SEED)
@click.option("--store", "store_dir", default=None, type=WRITABLE_DIR,
              help="Also write each class as a regression corpus entry into this folder.")
def catalogue_cmd(bugs: tuple[str, ...], alpha: float, max_samples: int, seed: int, store_dir: Path | None) -> None:
    """Run the regression catalogue N1-N7 on the reference sampler: detect and attribute each.

    Example: specfuzz catalogue --bug N3 --bug N6
    """
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


@click.command("check")
@click.argument("case_file", type=click.Path(path_type=Path))
@click.option("--engine", default=None, type=ENGINE,
              help="reference, vllm, hf, sglang, llamacpp, mlx, or package.module:Class. Default: the best engine installed here "
                   "(as for fuzz); with --inject: reference.")
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

    Example: specfuzz check corpus/regression/regression-N3.json --engine reference --inject N3
    """
    from specfuzz.engines.isolation import IsolatedEngine
    from specfuzz.fuzz.corpus import Corpus
    from specfuzz.fuzz.run import crash_entry, finding_entry, run_case

    case = read_case_file(case_file)
    corpus = Corpus(corpus_dir)
    engine, chosen = choose_engine(engine, inject)
    kwargs = engine_kwargs_for(engine, inject)
    require_engine(engine)  # a missing engine package: exit 3, not a stored "crash"
    announce(chosen)
    eng = IsolatedEngine(engine, kwargs, log_dir=work_dir / "logs")
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


@click.command("calibrate")
@click.option("--engine", default=None, type=ENGINE,
              help="reference, vllm, hf, sglang, llamacpp, mlx, or package.module:Class. Default: the best engine installed here "
                   "(as for fuzz); with --inject: reference.")
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

    Example: specfuzz calibrate --engine vllm --json calibration.json
    """
    from specfuzz.engines.isolation import EngineCrash, IsolatedEngine
    from specfuzz.errors import AmbiguousSemantics
    from specfuzz.fuzz.run import run_family
    from specfuzz.oracle.judge import target_law_dict

    settings = parse_settings(engine_settings)
    if json_out is not None:
        check_writable_file(json_out, "--json")
    suite = calibration_suite()
    engine, chosen = choose_engine(engine)
    require_engine(engine)  # a missing engine package: exit 3, not a stored "crash"
    announce(chosen)
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


