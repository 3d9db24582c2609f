"""What the ``specfuzz`` commands share: the console, ``--budget`` and ``--engine-setting``
values, which engine runs when ``--engine`` is not given, and which engine re-runs a stored entry."""

from __future__ import annotations

import json

import click
from rich.console import Console

from specfuzz.cli_input import Duration, parse_duration

console = Console()


def choose_engine(engine: str | None, inject: str | None = None) -> tuple[str, str | None]:
    """The engine a command runs on, and the line that announces a choice made for the user.

    The engine given with ``--engine``; without it, the reference sampler when ``--inject`` is
    given (only it takes an injected bug), else the best engine installed here
    (:func:`specfuzz.engines.availability.best_engine`). The line (None when the user chose) is
    printed by the command once its input is checked, so that bad input stays one line."""
    if engine is not None:
        return engine, None
    if inject is not None:
        return "reference", None
    from specfuzz.engines.availability import best_engine

    choice = best_engine()
    return choice.engine, choice.line()


def announce(line: str | None) -> None:
    """Print the engine choice of :func:`choose_engine` (stderr; nothing when the user chose)."""
    if line:
        click.echo(line, err=True)


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


def check_methods(caps, methods: tuple[str, ...] | None, max_vocab: int) -> None:
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


def require_engine(engine: str) -> None:
    """A built-in engine whose packages are missing: exit 3 at once, not a stored "crash"."""
    from specfuzz.engines.availability import require_engine as require

    require(engine)


def engine_kwargs_for(engine: str, inject: str | None) -> dict:
    """The engine's constructor arguments: ``--inject`` applies to the reference sampler only."""
    if inject is None:
        return {}
    if engine != "reference":
        raise click.BadParameter(f"{inject!r}: --inject only applies to --engine reference", param_hint="--inject")
    return {"inject": inject}


ENGINE_NAMES = {"hf-transformers": "hf", "vllm": "vllm", "sglang": "sglang", "llama.cpp": "llamacpp", "mlx-lm": "mlx"}


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
                           "(reference, vllm, hf, sglang, llamacpp, mlx or package.module:Class)")


