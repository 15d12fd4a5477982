"""The `bench` command line: a thin dispatcher over bench.commands (one module per subcommand)."""

from __future__ import annotations

import argparse
import sys

from bench import __version__
from bench.commands import COMMANDS
from bench.console import print_error
from bench.errors import UserError
from gdn_cp.distributed import PlatformError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench",
        description="Benchmark, profile and verify context parallelism of Gated DeltaNet linear attention.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        cmd = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(_main=module.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a command; a user error (UserError, or a device that cannot be used) is one red line, exit 1."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "_main", None) is None:
        parser.print_help()
        return 0 if args.command is None else 1
    try:
        return int(args._main(args) or 0)
    except (UserError, PlatformError) as exc:
        print_error(str(exc))
        return 1


if __name__ == "__main__":
    sys.exit(main())
