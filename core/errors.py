"""Errors raised for bad input: each names the bad value and what is allowed."""

from __future__ import annotations


class SpecfuzzError(Exception):
    """Base class of every error specfuzz raises on purpose."""


class InvalidInput(SpecfuzzError, ValueError):
    """A user-supplied value is outside what is allowed.

    The message always has the form ``<name>=<value!r>: <what is allowed>``.
    """

    def __init__(self, name: str, value: object, allowed: str) -> None:
        self.name = name
        self.value = value
        self.allowed = allowed
        super().__init__(f"{name}={value!r}: {allowed}")


class AmbiguousSemantics(SpecfuzzError):
    """The engine's documented semantics do not determine the law for this case.

    Raised e.g. when a top-p/top-k cut falls exactly on tied probabilities, where the
    kept set depends on an unspecified sort order. Strategies avoid such cases.
    """


class EngineUnavailable(SpecfuzzError):
    """The engine cannot run here at all (its package is missing, or it never starts).

    Not a finding about the engine and not a bad command line: the exit status is 3
    (see :mod:`specfuzz.exitcodes`).
    """
