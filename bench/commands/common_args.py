"""Flags shared by several commands, defined once so that they read the same everywhere."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def add_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="suite file (default: ./bench.yaml, else built-in defaults)",
    )


def add_scenarios(parser: argparse.ArgumentParser, help: str) -> None:
    """Positional scenario names or paths, --set and --filter."""
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO", help=help)
    add_sets(parser)
    parser.add_argument(
        "--filter",
        dest="filters",
        action="append",
        default=[],
        metavar="EXPR",
        help="keep cases matching comma-separated field=pattern terms (e.g. mode=p2p,cp=2) or a case-id "
        "wildcard (e.g. '*cp4*'); repeat the flag for OR",
    )


def add_sets(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a suite or scenario key, value in YAML (e.g. --set repeat=3 --set 'cp=[1,2]'); "
        "repeatable",
    )


def add_device(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device",
        default=None,
        metavar="{auto,cpu,cuda,npu}",
        help="run on this device (overrides bench.yaml and the scenario; the same as --set device=...)",
    )


def integer_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse `type`: a whole number >= minimum, else a usage error (argparse names the flag)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}; give a number >= {minimum}")
        return value

    return parse


def positive_number(text: str) -> float:
    """An argparse `type`: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be a finite number > 0")
    return value
