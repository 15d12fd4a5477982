"""The `bench` command's entry point (console script and `python -m bench`): checks that bench's
dependencies import (bench.dependencies) before importing the command line, which needs them all."""

from __future__ import annotations

import importlib
import sys

from bench.dependencies import install_hint, missing


def main(argv: list[str] | None = None) -> int:
    """bench.cli.main(argv), or exit 1 with one line on stderr naming what is not installed."""
    absent = missing()
    if absent:
        print(f"error: {install_hint(absent)}", file=sys.stderr)
        return 1
    # imported only now: it imports every dependency checked above
    return importlib.import_module("bench.cli").main(argv)
