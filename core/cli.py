"""The ``specfuzz`` command line: the command group and where each command lives.

* ``fuzz`` (the default command): :mod:`specfuzz.cli_fuzz`;
* ``law``, ``check``, ``calibrate``, ``catalogue`` (one case): :mod:`specfuzz.cli_case`;
* ``replay``, ``shrink`` (stored entries): :mod:`specfuzz.cli_corpus`;
* ``triage``, ``draft`` (:mod:`specfuzz.fuzz.triage_cli`), ``bisect`` (:mod:`specfuzz.fuzz.bisect_cli`),
  ``compare`` (:mod:`specfuzz.compare.command`), ``doctor`` (:mod:`specfuzz.doctor`).

What the commands share (the console, ``--budget`` and ``--engine-setting`` values, the engine
chosen when ``--engine`` is not given) is in :mod:`specfuzz.cli_common`; what they accept, and
the one-line errors, in :mod:`specfuzz.cli_input`. Help is rendered with rich-click.
"""

from __future__ import annotations

import click
import rich_click

from specfuzz.cli_common import engine_for_entry, parse_budget, parse_settings
from specfuzz.cli_input import OneLineErrors

# engine_for_entry, parse_budget and parse_settings are imported from here by other modules.
__all__ = ["engine_for_entry", "main", "parse_budget", "parse_settings", "run"]

# One example per command, for the commands defined outside this package's CLI modules (the
# others carry theirs in their docstrings); shown at the end of each command's help.
EXAMPLES = {
    "triage": "specfuzz triage corpus/h200/sglang --json triage.json",
    "draft": "specfuzz draft corpus/finding-721b7b8587fd119d.json --out drafts/721b",
    "doctor": "specfuzz doctor --start",
    "compare": "specfuzz compare --limit 8 --max-tokens 24",
    "bisect": "specfuzz bisect corpus/finding-721b7b8587fd119d.json --versions 0.30.0..0.32.0",
}


class _DefaultToFuzz(OneLineErrors):
    """``specfuzz --budget 2h`` means ``specfuzz fuzz --budget 2h``; errors are one line
    (cli_input) with the exit status of :mod:`specfuzz.exitcodes`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0].startswith("-") and args[0] not in ("-h", "--help", "--version")):
            args = ["fuzz", *args]
        return super().parse_args(ctx, args)


@rich_click.group(cls=_DefaultToFuzz, context_settings={"help_option_names": ["-h", "--help"]})
@rich_click.command_panel("Find bugs", commands=["fuzz", "check", "calibrate", "compare"])
@rich_click.command_panel("Work with findings", commands=["replay", "shrink", "triage", "draft", "bisect"])
@rich_click.command_panel("Reference", commands=["law", "catalogue", "doctor"])
@rich_click.version_option(package_name="specfuzz")
def main() -> None:
    """Prove or refute that an engine's speculative decoding samples exactly from the target law.

    Without a command, runs a fuzz campaign (`specfuzz --budget 2h` = `specfuzz fuzz --budget 2h`)
    on the best engine installed here (`--engine reference`: the built-in self-test).
    A bad value on any command gets one line naming it and what is allowed, and exit status 2;
    nothing in the corpus or its campaign state is changed.

    Example: specfuzz --budget 2m
    """


def with_example(cmd: click.Command, example: str) -> click.Command:
    """A command built with plain click, as a rich-click command whose help ends with an example
    (the same callback and parameters: it runs exactly as before)."""
    help_text = (cmd.help or "").rstrip()
    if "Example:" not in help_text:
        help_text = f"{help_text}\n\nExample: {example}\n"
    return rich_click.RichCommand(
        name=cmd.name, context_settings=cmd.context_settings, callback=cmd.callback, params=cmd.params,
        help=help_text, epilog=cmd.epilog, short_help=cmd.short_help, options_metavar=cmd.options_metavar,
        add_help_option=cmd.add_help_option, no_args_is_help=cmd.no_args_is_help, hidden=cmd.hidden,
        deprecated=cmd.deprecated)


def _register_commands() -> None:
    from specfuzz.cli_case import calibrate_cmd, catalogue_cmd, check_cmd, law_cmd
    from specfuzz.cli_corpus import replay_cmd, shrink_cmd
    from specfuzz.cli_fuzz import fuzz_cmd
    from specfuzz.compare.command import compare_cmd
    from specfuzz.doctor import doctor_cmd
    from specfuzz.fuzz.bisect_cli import bisect_cmd
    from specfuzz.fuzz.triage_cli import draft_cmd, triage_cmd

    for cmd in (fuzz_cmd, law_cmd, catalogue_cmd, check_cmd, calibrate_cmd, replay_cmd, shrink_cmd):
        main.add_command(cmd)
    for cmd in (triage_cmd, draft_cmd, doctor_cmd, compare_cmd, bisect_cmd):
        main.add_command(with_example(cmd, EXAMPLES[cmd.name]), cmd.name)


_register_commands()


def run() -> None:
    main(standalone_mode=True)  # errors: one line and an exit status (OneLineErrors)


if __name__ == "__main__":
    run()
