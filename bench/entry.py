"""The `bench` command's entry point (console script and `python -m bench`): checks that bench's
dependencies are installed (bench.dependencies) before importing the command line, which needs them all,
and turns a dependency whose import fails (present but broken), wherever a command first imports it, into
one line."""

from __future__ import annotations

import importlib
import sys

from bench.dependencies import import_failure, install_hint, missing


def main(argv: list[str] | None = None) -> int:
    """bench.cli.main(argv), or exit 1 with one line on stderr naming what is not installed, or which
    dependency failed to import and why."""
    absent = missing()
    if absent:
        print(f"error: {install_hint(absent)}", file=sys.stderr)
        return 1
    try:
        # imported only now: it imports every dependency checked above (a command its heavy ones later)
        return importlib.import_module("bench.cli").main(argv)
    except ImportError as exc:
        line = import_failure(exc)
        if line is None:  # bench's own import went wrong: the traceback is for whoever fixes it
            raise
        print(f"error: {line}", file=sys.stderr)
        return 1
