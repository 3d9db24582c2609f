"""The ``specfuzz compare`` command (registered by :mod:`specfuzz.cli`)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from specfuzz.errors import SpecfuzzError

from specfuzz.compare.models import DEFAULT_CUT_LAYERS


@click.command("compare")
@click.option("--engine", "engines", multiple=True, default=("hf",), show_default=True,
              help="hf, vllm, sglang or package.module:Class (repeatable: each engine runs the whole comparison).")
@click.option("--model", default=None, type=click.Path(path_type=Path),
              help="HF checkpoint folder. Default: the embedded SmolLM2-135M-Instruct (converted once into the cache).")
@click.option("--method", "methods", multiple=True,
              help="ngram, self (target drafts for itself), cut (a draft cut from the target), draft (--draft). "
                   "Repeatable. Default: ngram, self, cut (+ draft when --draft is given).")
@click.option("--draft", default=None, type=click.Path(path_type=Path), help="A draft checkpoint with the target's tokenizer.")
@click.option("--draft-layers", default=DEFAULT_CUT_LAYERS, show_default=True, help="Layers kept by the cut-down draft.")
@click.option("--num-speculative-tokens", "-k", default=3, show_default=True, help="Draft tokens per round (K).")
@click.option("--prompts", default=None, type=click.Path(path_type=Path),
              help="Prompt file: JSONL ({\"id\", \"text\"} per line) or one prompt per line. Default: the 64 built-in prompts.")
@click.option("--limit", default=None, type=int, help="Use at most N prompts (spread over lengths and kinds).")
@click.option("--max-tokens", default=48, show_default=True, help="Output tokens per request.")
@click.option("--mode", default="both", show_default=True, help="both, greedy or sampled.")
@click.option("--temperature", default=1.0, show_default=True, type=float,
              help="Sampled mode's temperature (0: greedy comparison only).")
@click.option("--top-k", default=0, show_default=True, help="Sampled mode's top-k (0 = off).")
@click.option("--top-p", default=1.0, show_default=True, type=float, help="Sampled mode's top-p.")
@click.option("--repetition-penalty", default=1.0, show_default=True, type=float,
              help="Sampled mode's repetition penalty (1 = off; engines vllm, hf, mlx).")
@click.option("--presence-penalty", default=0.0, show_default=True, type=float,
              help="Sampled mode's presence penalty (0 = off; engines vllm, mlx).")
@click.option("--frequency-penalty", default=0.0, show_default=True, type=float,
              help="Sampled mode's frequency penalty (0 = off; engines vllm, mlx).")
@click.option("--samples", default=8, show_default=True, help="Samples per prompt in sampled mode (each mode).")
@click.option("--repeats", default=2, show_default=True, help="Greedy runs per mode on the repeat subset (nondeterminism).")
@click.option("--repeat-prompts", default=8, show_default=True, help="Prompts in the repeat subset.")
@click.option("--alpha", default=1e-3, show_default=True, help="Level of each sampled test.")
@click.option("--seed", default=0, show_default=True)
@click.option("--out", default="specfuzz-compare", show_default=True, type=click.Path(path_type=Path),
              help="Folder for report.md, report.json, plots/, baseline.jsonl, speculative.jsonl.")
@click.option("--cache-dir", default=None, type=click.Path(path_type=Path),
              help="Where converted models and drafts are kept (default ~/.cache/specfuzz or $SPECFUZZ_CACHE).")
@click.option("--chat/--no-chat", default=None, help="Wrap prompts in the chat template (default: when the tokenizer has one).")
@click.option("--engine-setting", "engine_settings", multiple=True, metavar="KEY=VALUE", help="An engine knob (JSON value).")
@click.option("--threads", default=1, show_default=True, help="torch threads (HF engine and the reference).")
@click.option("--quiet", is_flag=True, help="No progress lines.")
@click.option("--check", is_flag=True, help="Exit 1 when a sampled test or a calibration fails or a verification bug is flagged.")
def compare_cmd(engines, model, methods, draft, draft_layers, num_speculative_tokens, prompts, limit, max_tokens, mode,
                temperature, top_k, top_p, repetition_penalty, presence_penalty, frequency_penalty, samples, repeats, repeat_prompts, alpha, seed, out, cache_dir, chat,
                engine_settings, threads, quiet, check) -> None:
    """Baseline vs speculative decoding on a real model and real prompts, greedy and sampled.

    Greedy: exact match, similarity, first divergence, nondeterminism, acceptance. Sampled:
    an exact test of the speculative samples against the model's own next-token laws.
    """
    from rich.console import Console

    from specfuzz.cli import parse_settings
    from specfuzz.compare.pipeline import CompareOptions, run_compare, validate

    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    try:
        opts = CompareOptions(
            engines=tuple(engines), model=model, methods=tuple(methods), draft=draft, draft_layers=draft_layers,
            num_speculative_tokens=num_speculative_tokens, prompts=prompts, limit=limit, max_tokens=max_tokens, mode=mode,
            temperature=temperature, top_k=top_k, top_p=top_p, samples=samples, repeats=repeats,
            repeat_prompts=repeat_prompts, alpha=alpha, seed=seed, out=out, cache_dir=cache_dir, chat=chat,
            settings=parse_settings(engine_settings), threads=threads, repetition_penalty=repetition_penalty,
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
        )
        v = validate(opts)
        log = (lambda s: None) if quiet else (lambda s: click.echo(f"compare: {s}", err=True))
        comp = run_compare(v, log=log)
    except SpecfuzzError as exc:
        # One line on stderr, exit 2, nothing written (the report is written only after a complete run).
        click.echo(f"error: {' '.join(str(exc).split())}", err=True)
        sys.exit(2)
    except click.BadParameter as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(2)
    from specfuzz.compare.report import terminal_flags, terminal_table, write

    files = write(comp, out)
    console.print(terminal_table(comp))
    for line in terminal_flags(comp):
        console.print(f"[yellow]flag[/yellow] {line}", highlight=False)
    console.print(f"report: {files['report.md']} (JSON: {files['report.json']}; plots and records beside it)", highlight=False)
    if check:
        bad = any((a.calibration is not None and a.calibration.status == "fail")
                  or any(t.status == "fail" for t in a.sampled.values())
                  or any("BUG" in f for g in a.greedy.values() for f in g.flags) for a in comp.engines)
        sys.exit(1 if bad else 0)
