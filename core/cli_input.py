"""What the command line accepts: option types, files and folders, checked before anything runs.

The rule for every ``specfuzz`` command: a bad value gets **one line** naming the value and
what is allowed, exit status 2, no traceback, and nothing in the corpus or its campaign
state changed. The types here refuse a bad value while click parses the command line, so
no command body runs on it:

* numbers: :class:`Number` (an int or a finite float within a range; click's own ranges
  let ``nan`` through), durations (:class:`Duration`: ``90s``, ``10m``, ``2h``, ``1h30m``);
* names: engines (:class:`EngineName`: a built-in name, or ``package.module:Class`` whose
  module can be found), speculation methods, catalogued bug classes;
* files read (:func:`read_json_file`, :func:`read_case_file`, :func:`read_entry_file`):
  readable, UTF-8, JSON, and of the expected kind;
* folders written (:class:`WritableDir`): an existing folder a file can be created in, or
  a path whose nearest existing ancestor is one (probed with a temporary file that is
  removed again, so that the check holds for root and for read-only file systems too).

:class:`OneLineErrors` (the group class of ``specfuzz``) turns whatever escapes a command
as bad input (click's usage errors, :class:`~specfuzz.errors.InvalidInput`, OS errors on a
path the user gave) into that one line and the exit status.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import click
from rich_click import RichGroup

from specfuzz.errors import SpecfuzzError

# Exit status for bad input (click's own for usage errors).
BAD_INPUT_EXIT = 2
# OS errors that mean "this path cannot be used" (the user's value), not a failing machine.
PATH_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR, errno.EISDIR,
                         errno.EEXIST, errno.ENAMETOOLONG, errno.ELOOP, errno.EINVAL})
# Longest value quoted in an error line.
MAX_QUOTED = 120
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([hms])")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0}


def quoted(value: object) -> str:
    """``repr(value)``, shortened to one line of at most MAX_QUOTED characters."""
    r = " ".join(repr(value).split())
    return r if len(r) <= MAX_QUOTED else r[: MAX_QUOTED - 3] + "..."


def one_line(text: str) -> str:
    return " ".join(str(text).split())


# ----------------------------------------------------------------------------- numbers


class Number(click.ParamType):
    """An int (``integer=True``) or a finite float in ``[lo, hi]`` (``lo_open``/``hi_open``: excluded)."""

    def __init__(self, lo: float | None = None, hi: float | None = None, *, integer: bool = False,
                 lo_open: bool = False, hi_open: bool = False) -> None:
        self.lo, self.hi, self.integer, self.lo_open, self.hi_open = lo, hi, integer, lo_open, hi_open
        self.name = "integer" if integer else "number"

    def _fmt(self, x: float) -> str:
        return str(int(x)) if self.integer else f"{x:g}"

    def allowed(self) -> str:
        kind = "an integer" if self.integer else "a number"
        if self.lo is not None and self.hi is not None:
            left, right = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
            return f"{kind} in {left}{self._fmt(self.lo)}, {self._fmt(self.hi)}{right}"
        if self.lo is not None:
            return f"{kind} {'>' if self.lo_open else '>='} {self._fmt(self.lo)}"
        if self.hi is not None:
            return f"{kind} {'<' if self.hi_open else '<='} {self._fmt(self.hi)}"
        return kind if self.integer else "a finite number"

    def convert(self, value: Any, param, ctx) -> int | float:
        if isinstance(value, bool):
            self.fail(f"{quoted(value)}: {self.allowed()}", param, ctx)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            v: int | float = value
        else:
            text = str(value).strip()
            try:
                v = int(text, 10) if self.integer else float(text)
            except ValueError:
                self.fail(f"{quoted(value)}: {self.allowed()}", param, ctx)
        if self.integer and (not isinstance(v, int) and not float(v).is_integer()):
            self.fail(f"{quoted(value)}: {self.allowed()}", param, ctx)
        if not self.integer and not math.isfinite(float(v)):
            self.fail(f"{quoted(value)}: {self.allowed()} (finite)", param, ctx)
        v = int(v) if self.integer else float(v)
        too_low = self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo)
        too_high = self.hi is not None and (v >= self.hi if self.hi_open else v > self.hi)
        if too_low or too_high:
            self.fail(f"{quoted(value)}: {self.allowed()}", param, ctx)
        return v


MAX_COUNT = 10**9  # more samples, rows or examples than any run can use: a typo, not a plan
COUNT = Number(1, MAX_COUNT, integer=True)  # samples, batches, examples
SEED = Number(0, 2**63 - 1, integer=True)  # numpy's seeds are non-negative
ALPHA = Number(0.0, 1.0, lo_open=True, hi_open=True)  # a probability level
TOLERANCE = Number(0.0, 1.0, hi_open=True)  # a per-token probability tolerance
MAX_VOCAB = Number(2, 4096, integer=True)  # a table model needs two tokens
MAX_TOKENS = Number(1, 128, integer=True)  # outputs fit the table checkpoints' 256 positions with the prompt


def parse_duration(text: str) -> float:
    """'90s', '10m', '2h', '1h30m' or plain seconds -> seconds (> 0, finite); ValueError otherwise."""
    t = str(text).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", t):
        s = float(t)
    else:
        parts = _DURATION_PART.findall(t)
        if not parts or "".join(n + u for n, u in parts) != t:
            raise ValueError(text)
        s = sum(float(n) * _UNITS[u] for n, u in parts)
    if not math.isfinite(s) or s <= 0:
        raise ValueError(text)
    return s


class Duration(click.ParamType):
    """A time budget: 90s, 10m, 2h, 1h30m, or plain seconds; more than 0."""

    name = "duration"
    ALLOWED = "a duration > 0 like 90s, 10m, 2h or 1h30m (or plain seconds)"

    def convert(self, value: Any, param, ctx) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = repr(float(value))
        try:
            return parse_duration(str(value))
        except ValueError:
            self.fail(f"{quoted(value)}: {self.ALLOWED}", param, ctx)


DURATION = Duration()


# ----------------------------------------------------------------------------- names


class EngineName(click.ParamType):
    """A built-in engine name or ``package.module:Class`` whose module can be found (not imported)."""

    name = "engine"

    def convert(self, value: Any, param, ctx) -> str:
        import importlib.util

        from specfuzz.engines.isolation import BUILTIN_ENGINES

        v = str(value).strip()
        allowed = f"one of {', '.join(sorted(BUILTIN_ENGINES))}, or package.module:Class"
        if v in BUILTIN_ENGINES:
            return v
        module, sep, cls = v.partition(":")
        if not sep or not module or not cls.isidentifier() or not all(p.isidentifier() for p in module.split(".")):
            self.fail(f"{quoted(value)}: {allowed}", param, ctx)
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            self.fail(f"{quoted(value)}: {allowed} (no module {module!r} is importable here)", param, ctx)
        return v


ENGINE = EngineName()


class OneOf(click.ParamType):
    """One of a fixed set of names, refused with the whole set listed (click's Choice, on one line)."""

    def __init__(self, choices: tuple[str, ...], what: str) -> None:
        self.choices = tuple(choices)
        self.name = what

    def convert(self, value: Any, param, ctx) -> str:
        v = str(value)
        if v not in self.choices:
            self.fail(f"{quoted(value)}: one of {', '.join(self.choices)}", param, ctx)
        return v


def method_choice() -> OneOf:
    from specfuzz.oracle.speculative import ENGINE_METHODS

    return OneOf(("none",) + tuple(ENGINE_METHODS), "method")


def bug_choice() -> OneOf:
    from specfuzz.oracle.mutants import CONTROLS, MUTANTS
    from specfuzz.oracle.speculative import BUG_CLASSES

    return OneOf(tuple(sorted(BUG_CLASSES)) + tuple(sorted(MUTANTS)) + tuple(sorted(CONTROLS)), "bug class, mutant or control")


DTYPES = ("float32", "bfloat16", "float16")


def dtype_choice() -> OneOf:
    return OneOf(DTYPES, "dtype")


# ----------------------------------------------------------------------------- folders


def _probe_writable(folder: Path) -> str | None:
    """None if a file can be created in the existing folder ``folder``, else why not."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".specfuzz-probe-", dir=folder)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    os.close(fd)
    os.unlink(tmp)
    return None


def writable_dir_problem(path: Path) -> str | None:
    """Why ``path`` cannot be used as an output folder (None if it can). Creates nothing."""
    p = Path(path)
    if p.exists():
        if not p.is_dir():
            return "exists and is not a folder"
        why = _probe_writable(p)
        return None if why is None else f"a folder specfuzz cannot write in ({why})"
    ancestor = p.absolute().parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"cannot be created ({ancestor} is not a folder)"
    try:
        probe = tempfile.mkdtemp(prefix=".specfuzz-probe-", dir=ancestor)
    except OSError as exc:
        return f"cannot be created in {ancestor} ({exc.strerror or type(exc).__name__})"
    os.rmdir(probe)
    return None


class WritableDir(click.ParamType):
    """A folder specfuzz will write into: existing and writable, or creatable. Nothing is created here."""

    name = "folder"

    def convert(self, value: Any, param, ctx) -> Path:
        p = Path(value)
        why = writable_dir_problem(p)
        if why is not None:
            self.fail(f"{quoted(str(value))}: {why}; a folder specfuzz can create or write in", param, ctx)
        return p


WRITABLE_DIR = WritableDir()


def check_writable_file(path: Path, hint: str) -> None:
    """The folder of an output file must be usable (raises click.BadParameter)."""
    p = Path(path)
    if p.exists() and p.is_dir():
        raise click.BadParameter(f"{quoted(str(path))}: a folder; a file path is needed", param_hint=hint)
    why = writable_dir_problem(p.parent if str(p.parent) else Path("."))
    if why is not None:
        raise click.BadParameter(f"{quoted(str(path))}: its folder {why}", param_hint=hint)


# ----------------------------------------------------------------------------- files read


def read_json_file(path: Path, hint: str) -> Any:
    """The JSON value in ``path``, or click.BadParameter naming the file and what is wrong."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except IsADirectoryError:
        raise click.BadParameter(f"{quoted(str(path))}: a folder; a JSON file is needed", param_hint=hint) from None
    except OSError as exc:
        raise click.BadParameter(f"{quoted(str(path))}: cannot be read ({exc.strerror or type(exc).__name__})",
                                 param_hint=hint) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise click.BadParameter(f"{quoted(str(path))}: not UTF-8 text (byte {exc.start}); a JSON file is needed",
                                 param_hint=hint) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"{quoted(str(path))}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})",
                                 param_hint=hint) from None
    except RecursionError:
        raise click.BadParameter(f"{quoted(str(path))}: JSON nested too deeply", param_hint=hint) from None


def case_json_of(data: Any) -> dict | None:
    """The case inside a JSON value: a Case document itself, or a corpus entry's ``case``."""
    if isinstance(data, dict) and isinstance(data.get("case"), dict):
        return data["case"]
    if isinstance(data, dict) and "target_table" in data:
        return data
    return None


def read_case_file(path: Path, hint: str = "CASE_FILE"):
    """A :class:`~specfuzz.case.Case` from a case file or a corpus entry (click.BadParameter otherwise)."""
    from specfuzz.case import Case

    data = read_json_file(path, hint)
    cj = case_json_of(data)
    if cj is None:
        what = type(data).__name__ if not isinstance(data, dict) else "a JSON object with neither 'target_table' nor 'case'"
        raise click.BadParameter(
            f"{quoted(str(path))}: not a case ({what}); a specfuzz case file (schema_version, target_table, prompt, "
            "params, ...) or a corpus entry holding one", param_hint=hint)
    try:
        return Case.from_json(cj)
    except SpecfuzzError as exc:
        raise click.BadParameter(f"{quoted(str(path))}: not a valid case: {one_line(str(exc))}", param_hint=hint) from None
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError) as exc:
        detail = f"missing field {exc}" if isinstance(exc, KeyError) else one_line(str(exc)) or type(exc).__name__
        raise click.BadParameter(f"{quoted(str(path))}: not a valid case ({detail})", param_hint=hint) from None


def entry_problem(data: Any) -> str | None:
    """Why a JSON value is not a corpus entry (None if it is one)."""
    from specfuzz.fuzz.corpus import Entry

    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    try:
        Entry.from_json(data)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"missing field {exc}" if isinstance(exc, KeyError) else one_line(str(exc)) or type(exc).__name__
    cj = data.get("case")
    if not isinstance(cj, dict) or "target_table" not in cj:
        return "its 'case' holds no case"
    from specfuzz.case import Case

    try:
        Case.from_json(cj)
    except SpecfuzzError as exc:
        return f"its case is not valid: {one_line(str(exc))}"
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError) as exc:
        return f"its case is not valid ({'missing field ' + str(exc) if isinstance(exc, KeyError) else one_line(str(exc))})"
    return None


def read_entry_file(path: Path, hint: str = "ENTRY"):
    """A corpus :class:`~specfuzz.fuzz.corpus.Entry` (click.BadParameter naming what is wrong otherwise)."""
    from specfuzz.fuzz.corpus import Entry

    data = read_json_file(path, hint)
    why = entry_problem(data)
    if why is not None:
        raise click.BadParameter(f"{quoted(str(path))}: not a corpus entry ({why}); a corpus entry file as specfuzz "
                                 "writes them (<kind>-<signature>.json)", param_hint=hint)
    return Entry.from_json(data)


# ----------------------------------------------------------------------------- the error line


def error_line(exc: BaseException) -> tuple[str, int]:
    """The one line printed for an error that escaped a command, and the exit status."""
    if isinstance(exc, click.UsageError):
        hint = ""
        if exc.ctx is not None and not isinstance(exc, click.BadParameter):
            hint = f" (see '{exc.ctx.command_path} --help')"
        return f"error: {one_line(exc.format_message())}{hint}", BAD_INPUT_EXIT
    if isinstance(exc, click.ClickException):
        return f"error: {one_line(exc.format_message())}", exc.exit_code
    from specfuzz.engines.isolation import EngineCrash
    from specfuzz.errors import EngineUnavailable
    from specfuzz.exitcodes import for_exception

    if isinstance(exc, (EngineCrash, EngineUnavailable)):
        # Not caught as a finding: the engine failed before any case ran (exit 3).
        return f"error: {one_line(str(exc))[:400]}", int(for_exception(exc))
    if isinstance(exc, SpecfuzzError):
        return f"error: {one_line(str(exc))}", BAD_INPUT_EXIT
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        code = BAD_INPUT_EXIT if exc.errno in PATH_ERRNOS else 1
        return f"error: {where}{exc.strerror or one_line(str(exc))}", code
    raise exc


class OneLineErrors(RichGroup):
    """A click group whose errors are one line on stderr and an exit status (never a traceback
    for bad input), under the real CLI and click's CliRunner alike."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):  # noqa: D102
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        except (click.ClickException, SpecfuzzError, OSError) as exc:
            line, code = error_line(exc)
            click.echo(line, err=True)
            sys.exit(code)
        sys.exit(rv if isinstance(rv, int) else 0)
