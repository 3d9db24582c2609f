"""The exit status of every ``specfuzz`` command, decided in one place.

====  ===================================================================================
code  meaning
====  ===================================================================================
0     nothing new: no new finding or crash (known corpus entries met again do not count)
1     a new finding or crash was stored (``fuzz``, ``check``); an entry still fails
      (``replay --check``); a calibration or catalogue check failed
2     bad input: a bad value, file or option (one line naming it and what is allowed)
3     the engine could not start at all (its package is missing, or no start succeeded)
====  ===================================================================================

Commands end with :func:`finish` (an outcome code); exceptions that escape a command are
mapped by :func:`for_exception` in the CLI group, so the command line, ``CliRunner`` and
``python -m specfuzz`` agree.
"""

from __future__ import annotations

import enum

import click

from specfuzz.errors import EngineUnavailable, SpecfuzzError


class ExitCode(enum.IntEnum):
    OK = 0
    FOUND = 1
    BAD_INPUT = 2
    ENGINE_UNAVAILABLE = 3


def for_exception(exc: BaseException) -> ExitCode | None:
    """The exit code of an exception that ended a command; None: not ours to map."""
    from specfuzz.engines.isolation import EngineCrash

    if isinstance(exc, (EngineUnavailable, EngineCrash)):
        # An EngineCrash that reaches the command line was not caught as a finding: the
        # engine failed before any case ran (its capabilities, its version, its start).
        return ExitCode.ENGINE_UNAVAILABLE
    if isinstance(exc, (SpecfuzzError, click.ClickException)):
        return ExitCode.BAD_INPUT
    return None


def finish(code: ExitCode | int) -> None:
    """End the current command with ``code`` (works under ``CliRunner`` too)."""
    raise click.exceptions.Exit(int(code))


def for_campaign(met_new: int, engine_error: str | None) -> ExitCode:
    """``specfuzz fuzz``: 3 if the engine never started, 1 if the run stored a new entry
    (finding, crash or calibration failure), else 0 (known entries met again included)."""
    if engine_error:
        return ExitCode.ENGINE_UNAVAILABLE
    return ExitCode.FOUND if met_new else ExitCode.OK


def for_replay(still_failing: int, unavailable: int, *, check: bool) -> ExitCode:
    """``specfuzz replay``: with ``--check``, 1 if an entry still fails; 3 if an entry's
    engine could not start (and none still fails); else 0."""
    if check and still_failing:
        return ExitCode.FOUND
    if unavailable:
        return ExitCode.ENGINE_UNAVAILABLE
    return ExitCode.OK
