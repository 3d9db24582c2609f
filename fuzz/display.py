"""Console output of a campaign: a live progress panel and the final summary (rich)."""

from __future__ import annotations

import json
import time

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from specfuzz.fuzz.corpus import Corpus, Entry


def _fmt_s(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def _stats_table(cfg, stats) -> Table:
    elapsed = time.monotonic() - stats.started
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    t.add_row("engine", cfg.engine + (f" (+{cfg.engine_kwargs['inject']})" if cfg.engine_kwargs.get("inject") else ""))
    t.add_row("time", f"{_fmt_s(elapsed)} elapsed, {_fmt_s(cfg.budget_s - elapsed)} left")
    t.add_row("cases", f"{stats.cases} families, {stats.patterns} request patterns, {stats.rejected} rejected (ambiguous)"
              + (f", {stats.refused} refused by the engine" if stats.refused else ""))
    t.add_row("samples", f"{stats.samples:,}")
    t.add_row("findings", f"{stats.findings_new} new, {stats.findings_updated} seen again"
              + (f" ({stats.calibration_known} candidates were stored calibration bugs)" if getattr(stats, "calibration_known", 0) else "")
              + (f" ({stats.findings_known} candidates were stored speculation findings under more settings"
                 + (f", {stats.shrunk_known} of them once shrunk" if getattr(stats, "shrunk_known", 0) else "") + ")"
                 if getattr(stats, "findings_known", 0) else ""))
    for label, text in _alpha_rows(cfg, stats, elapsed):
        t.add_row(label, text)
    t.add_row("crashes", str(stats.crashes))
    t.add_row("engine starts", f"{stats.engine_starts}, {getattr(stats, 'swaps', 0)} table swaps"
              + (f" ({stats.swap_fallbacks} fell back to a start)" if getattr(stats, "swap_fallbacks", 0) else ""))
    t.add_row("searches", str(stats.searches))
    return t


def _alpha_rows(cfg, stats, elapsed: float) -> list[tuple[str, str]]:
    """Screening and confirmation: candidates, confirmations, α spent and α left."""
    screen = getattr(cfg, "screen_alpha", None)
    if screen is None or not hasattr(stats, "candidates"):
        return []
    share = stats.unconfirmed_s / elapsed if elapsed > 0 else 0.0
    rows = [
        ("screening", f"α={screen:g} per pattern (not spent): {stats.candidates} candidates"
                      + (f", {stats.rescreened_out} passed when screened again alone"
                         if getattr(stats, "rescreened_out", 0) else "")),
        ("confirmations", f"{stats.confirmations} ({stats.confirmed} confirmed); unconfirmed ones took {share:.2%} of the time"),
    ]
    b = stats.budget
    if b is not None:
        legacy = f" ({b.legacy_spent:.3g} of it by per-family spending before)" if b.legacy_spent else ""
        rows.append(("α budget", f"{b.spent:.3g} spent{legacy} of {b.alpha_total:g} over {b.confirmations} confirmations in all, "
                                  f"{b.remaining:.3g} left; next confirmation at α={b.next_alpha:.3g}"))
    return rows


class LiveDisplay:
    def __init__(self, cfg, console: Console) -> None:
        self.cfg = cfg
        self.console = console
        self.last = "starting"
        self.live = Live(console=console, refresh_per_second=2, transient=True)
        self.stats = None

    def update(self, message: str, stats) -> None:
        self.stats = stats
        if message:
            self.last = message
            self.console.log(message)
        self.live.update(Panel(Group(_stats_table(self.cfg, stats), Text(self.last, style="dim")), title="specfuzz campaign"))

    def __enter__(self) -> "LiveDisplay":
        self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.live.__exit__(*exc)


def engine_time_table(engine: str, eng: dict, wall: float, workers: int = 1) -> Table:
    """Per engine: starts, swaps, families, and the share of wall time spent starting,
    swapping, sampling, shrinking and on everything else (oracle, Hypothesis); families per
    minute of campaign time (``workers`` processes running side by side add up)."""
    sec = eng.get("seconds", {})
    total = sum(sec.values()) or wall or 1.0
    who = f", {workers} workers" if workers > 1 else ""
    t = Table(title=f"engine {engine}: where the time went ({total:.0f} s over every run{who})")
    for col in ("starts", "swaps", "families", "fam/min", "start", "swap", "sample", "shrink", "other"):
        t.add_column(col, justify="right")
    share = [f"{100 * sec.get(k, 0.0) / total:.0f}%" for k in ("start", "swap", "sample", "shrink", "other")]
    fpm = 60 * eng.get("families", 0) * workers / total
    how = [f"{eng[k]} {word}" for k, word in (("warm_starts", "warm"), ("hot_starts", "prestarted")) if eng.get(k)]
    starts = str(eng.get("starts", 0)) + (f" ({', '.join(how)})" if how else "")
    fams = str(eng.get("families", 0)) + (f" ({eng['filled_families']} filling start waits)" if eng.get("filled_families") else "")
    t.add_row(starts, str(eng.get("swaps", 0)), fams, f"{fpm:.1f}", *share)
    return t


def print_summary(console: Console, cfg, stats, corpus: Corpus, totals: dict | None = None) -> None:
    console.print(Panel(_stats_table(cfg, stats), title="specfuzz campaign summary"))
    if totals and totals.get("methods"):
        who = f" of {totals['workers']} workers" if totals.get("workers", 1) > 1 else ""
        t = Table(title=f"campaign totals over {totals.get('runs', 1)} run(s){who}, {totals.get('seconds', 0):.0f} s (resumed runs add up)")
        for col in ("method", "families", "patterns", "samples", "variants (families)"):
            t.add_column(col)
        for m, row in sorted(totals["methods"].items()):
            var = row.get("variants") or {}
            t.add_row(m, str(row["families"]), str(row["patterns"]), str(row["samples"]),
                      ", ".join(f"{k} {n}" for k, n in sorted(var.items())))
        console.print(t)
    cov = (totals or {}).get("coverage")
    if cov and cov.get("methods"):
        from specfuzz.fuzz.coverage import Coverage, coverage_table, multi_position_line

        report = Coverage(json.loads(json.dumps(cov))).report()
        console.print(coverage_table(report))
        console.print(multi_position_line(report))
    eng = (totals or {}).get("engine")
    if eng and eng.get("families"):
        console.print(engine_time_table(cfg.engine, eng, totals.get("seconds", 0.0), int(totals.get("workers", 1))))
    entries = [(p, e) for p, e in corpus.entries() if isinstance(e, Entry) and p.name in stats.stored]
    if entries:
        t = Table(title="stored this campaign")
        for col in ("entry", "kind", "attribution", "method", "evidence"):
            t.add_column(col)
        for p, e in entries:
            spec = e.case.get("spec") or {}
            t.add_row(p.name, e.kind, str(e.label), str(spec.get("method")), e.evidence[:90])
        console.print(t)
    elif stats.findings_new == 0:
        console.print("No new findings.")


def print_ray_summary(console: Console, outcome) -> None:
    """A Ray campaign's engine actors and hosts (families, samples, starts, families per
    minute) and its scaling efficiency against a one-actor run of the same engine."""
    from specfuzz.fuzz.ray_driver import summary_rows

    rows = summary_rows(outcome.snapshot, outcome.run)
    run = outcome.run
    t = Table(title=f"ray: {run['engines']} engine actors ({run['gpus_per_engine']:g} GPU each) on {run['hosts']} host(s) ({run.get('nodes', run['hosts'])} Ray nodes), "
                    f"{run['wall_s']:.0f} s, {run['actor_deaths']} actor deaths")
    for col in ("actor", "host", "GPU", "srch", "fam", "samples", "starts", "swaps", "f/min", ""):
        t.add_column(col, justify="right" if col not in ("actor", "host", "") else "left")
    for r in rows["actors"]:
        t.add_row(r["actor"], str(r["host"]), r["gpus"], str(r["searches"]), str(r["families"]), f"{r['samples']:,}",
                  str(r["starts"]), str(r["swaps"]), f"{r['fpm']:.1f}", "died" if r["status"] != "ok" else "")
    console.print(t)
    for r in rows["actors"]:
        if r["status"] != "ok":
            console.print(f"actor {r['actor']} {r['status']}")
    h = Table(title="ray: per host (families per minute of campaign time)")
    for col in ("host", "actors", "families", "samples", "fam/min"):
        h.add_column(col, justify="left" if col == "host" else "right")
    for r in rows["hosts"]:
        h.add_row(r["host"], str(r["actors"]), str(r["families"]), f"{r['samples']:,}", f"{r['fpm']:.1f}")
    console.print(h)
    base = rows["baseline"]
    if rows["efficiency"] is not None:
        console.print(f"scaling: {run['fpm']:.1f} families/min with {run['engines']} actors vs {base['fpm']:.1f} with one "
                      f"({base['time']}): efficiency {rows['efficiency']:.0%}")
    elif run["engines"] > 1:
        console.print(f"scaling: {run['fpm']:.1f} families/min with {run['engines']} actors; no one-actor run of "
                      f"{run['engine']} on this corpus yet to compare with (`--engines 1` records one)")
    else:
        console.print(f"one actor: {run['fpm']:.1f} families/min (the baseline later runs with more actors compare with)")
