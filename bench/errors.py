"""The errors the CLI shows as a single red line (exit code 1) instead of a traceback, and the "did you
mean" hint their messages share."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UserError(Exception):
    """A mistake the user can fix: a bad scenario, flag or file. The message names where and how."""


class FieldError(ValueError):
    """A config field has a bad value. `str()` is "key: problem; fix"; the loader adds the file and line."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


def suggest(key: str, known: Iterable[str]) -> str:
    """ "did you mean 'x'?" for the closest known key, else the list of known keys."""
    known = sorted(known)
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if close:
        return f"did you mean '{close[0]}'?"
    return f"use one of {', '.join(known)}"


def first_line(message: str | None) -> str:
    """The first line of an error message ("" for none): status lines and tables show only that."""
    lines = (message or "").strip().splitlines()
    return lines[0] if lines else ""
