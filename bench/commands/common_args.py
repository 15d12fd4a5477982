"""Flags shared by several commands, defined once so that they read the same everywhere."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

from bench.errors import UserError
from bench.judge.comparison import DEFAULT_ALPHA, DEFAULT_FACTOR


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
    add_filter(
        parser,
        "keep cases matching comma-separated field=pattern terms (e.g. mode=p2p,cp=2) or a case-id "
        "wildcard (e.g. '*cp4*'); repeat the flag for OR",
    )


def add_filter(parser: argparse.ArgumentParser, help: str) -> None:
    """--filter EXPR (repeatable, into `filters`)."""
    parser.add_argument("--filter", dest="filters", action="append", default=[], metavar="EXPR", help=help)


def add_result(parser: argparse.ArgumentParser, help: str) -> None:
    """The positional RESULT, a file or `latest`, `latest~N` (default latest: bench.results.names)."""
    parser.add_argument("result", metavar="RESULT", nargs="?", default="latest", help=help)


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


def add_backend_modules(parser: argparse.ArgumentParser) -> None:
    """--backend-module: imported before any scenario is read, in bench and in every rank (bench.cli,
    bench.launch.user_backends)."""
    parser.add_argument(
        "--backend-module",
        dest="backend_modules",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE (a dotted name on PYTHONPATH) for the backends it registers "
        "(gdn_cp.ops.register_backend), before the scenarios are read, in every rank and on both sides of a "
        "compare; repeatable; BENCH_BACKENDS=MOD1,MOD2 does the same. Installed packages that declare a "
        "`gdn_cp.backends` entry point need neither",
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


EXIT_REGRESSION = 3
"""compare --fail-on-regression and gate: a case got worse (1 is a user error, 2 `bench run`'s failed
cases)."""
EXIT_NO_VERDICT = 6
"""compare --fail-on-regression and gate: no case got a verdict (every one too noisy, contended or not
comparable): a gate that judged nothing fails."""


def add_compare(parser: argparse.ArgumentParser, command: str) -> None:
    """The flags `bench compare` and `bench gate` share, how two sides are measured and judged: --factor,
    --alpha, --budget, --unpaired, --save-dir (`command` names the default folder)."""
    parser.add_argument(
        "--factor",
        type=float,
        default=DEFAULT_FACTOR,
        help=f"a case is better/worse only when head/base passes this factor (default {DEFAULT_FACTOR})",
    )
    parser.add_argument(
        "--alpha",
        type=float,
        default=DEFAULT_ALPHA,
        help=f"the ratio's interval has confidence 1 - alpha (default {DEFAULT_ALPHA}: 95%%)",
    )
    parser.add_argument(
        "--budget",
        type=parse_budget,
        metavar="DURATION",
        help="with two git refs: after the planned rounds, keep adding rounds to the cases not yet decided "
        "until each is called or DURATION (90s, 10m, 1h) is spent; verdicts by alpha spending, the "
        "false-verdict rate still at most --alpha",
    )
    parser.add_argument(
        "--unpaired",
        action="store_true",
        help="with two refs: run each ref's own bench in lifetimes of its own, round by round in turn, "
        "instead of both refs' gdn_cp paired in each lifetime (use it when bench itself changed; its "
        "intervals carry the lifetimes' differences)",
    )
    parser.add_argument(
        "--save-dir",
        metavar="DIR",
        help=f"with refs: where both sides' result files go (default: <results_dir>/{command}-<date>-<time>)",
    )


def parse_budget(text: str) -> float:
    """`--budget 10m` -> 600.0 seconds (s, m or h; a bare number is seconds); ArgumentTypeError otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if match is None or float(match[1]) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive duration, e.g. 90s, 10m or 1h")
    return float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[match[2]]


def check_thresholds(factor: float, alpha: float) -> None:
    """UserError, naming the flag, for a verdict factor or confidence that cannot work (compare, gate)."""
    if factor <= 1.0:
        raise UserError(f"--factor {factor}: must be > 1, e.g. --factor 1.10 for 10%")
    if not 0.0 < alpha < 1.0:
        raise UserError(f"--alpha {alpha}: must be between 0 and 1, e.g. --alpha 0.05")
