"""The plot of a draft: observed frequencies vs μ (and μD) per output, or per token at the
worst position when there are too many outputs to show."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specfuzz.fuzz.draft.data import DraftData, conditional_at, fmt_out, project_counts

# Per-output plot up to this many outputs; beyond it, per token at the worst position.
MAX_PLOT_OUTPUTS = 24


def write_plot(data: DraftData, path: Path) -> str:
    """plot.png; returns a one-line description of what it shows."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    n = max(data.n, 1)
    law = data.mu if data.mu is not None else data.expected
    counts = data.counts if data.mu is not None else project_counts(data.counts, data.depth)
    suspected = data.mud if data.mu is not None else data.suspected
    keys = sorted(set(counts) | {x for x, p in law.items() if p > 0} | ({x for x, p in suspected.items() if p > 0} if suspected else set()),
                  key=lambda x: (len(x), x))
    series: list[tuple[str, list[float], str]]
    if len(keys) <= MAX_PLOT_OUTPUTS:
        labels = [fmt_out(x) for x in keys]
        series = [(f"observed (n={data.n})", [counts.get(x, 0) / n for x in keys], "#d62728"),
                  ("expected μ", [law.get(x, 0.0) for x in keys], "#1f77b4")]
        if suspected is not None:
            series.append((f"μD ({data.label})", [suspected.get(x, 0.0) for x in keys], "#2ca02c"))
        xlabel = "output (token ids)" if data.depth is None else f"first {data.depth} tokens of the output"
        what = "per output"
        title = "observed frequency vs exact law μ" + ("" if suspected is None else f" and μD of {data.label}")
    else:
        wt = data.effect.worst_token or {}
        context = tuple(wt.get("context") or ())
        V = data.vocab_size
        obs = conditional_at({x: c / n for x, c in data.counts.items()}, context, V)
        if data.mu is not None:
            exp = conditional_at(data.mu, context, V)
        else:
            tl = data.case.target_law(data.profile)
            exp = np.zeros(V + 2)
            if tl.is_terminal(context):
                exp[V + 1] = 1.0
            else:
                exp[:V] = tl.conditional(context)
        labels = [str(t) for t in range(V)] + ["<oov>", "<end>"]
        series = [("observed", obs.tolist(), "#d62728"), ("expected μ", exp.tolist(), "#1f77b4")]
        if data.mud is not None:
            series.append((f"μD ({data.label})", conditional_at(data.mud, context, V).tolist(), "#2ca02c"))
        xlabel = f"next token after output prefix {fmt_out(context)}"
        what = ("per token at the first position" if not context else
                f"per token at the worst position, after output prefix {fmt_out(context)}")
        title = f"next-token law after {fmt_out(context)}: observed vs μ"
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(labels) + 2), 4.2), dpi=110)
    xs = np.arange(len(labels))
    for i, (name, ys, color) in enumerate(series):
        ax.bar(xs + (i - (len(series) - 1) / 2) * width, ys, width, label=name, color=color)
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, rotation=60 if len(labels) > 8 else 0, ha="right" if len(labels) > 8 else "center",
                       fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("probability")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return what


