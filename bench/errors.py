"""The one exception the CLI shows as a single red line (exit code 1) instead of a traceback."""

from __future__ import annotations


class UserError(Exception):
    """A mistake the user can fix: a bad scenario, flag or file. The message names where and how."""


class FieldError(ValueError):
    """A config field has a bad value. `str()` is "key: problem; fix"; the loader adds the file and line."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message
