"""The `bench` command line: a thin dispatcher over bench.commands (one module per subcommand)."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from bench.commands import COMMANDS
from bench.console import print_error
from bench.errors import UserError
from bench.results.store import ResultWriteError
from gdn_cp import __version__
from gdn_cp.distributed import PlatformError


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors (an unknown flag, a bad value) are user errors like any other: one red
    line and exit code 1, not argparse's 2, which `bench run` uses for "some cases failed". --help and
    --version still exit 0."""

    def error(self, message: str) -> NoReturn:
        raise UserError(f"{self.prog}: {self._without_optional(message)}; see `{self.prog} --help`")

    def _without_optional(self, message: str) -> str:
        """argparse names a positional of nargs="*" among the required ones when a required one is missing
        (`required: BASE, HEAD, SCENARIO`): the optional ones are left out of the list."""
        prefix = "the following arguments are required: "
        if not message.startswith(prefix):
            return message
        optional = {
            a.metavar or a.dest for a in self._actions if not a.option_strings and a.nargs in ("*", "?")
        }
        named = [n for n in message.removeprefix(prefix).split(", ") if n not in optional]
        return prefix + ", ".join(named) if named else message


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="bench",
        description="Benchmark, profile and verify context parallelism of Gated DeltaNet linear attention.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        # argparse %-formats a subcommand's help ("%(prog)s"): a literal % ("95% interval") is written %%
        cmd = sub.add_parser(module.NAME, help=module.HELP.replace("%", "%%"), description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(_main=module.main, _parser=cmd)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a command; a user error (UserError, a usage error, or a device that cannot be used) is one red
    line, exit 1."""
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # named by the subcommand, whose --help lists its flags
            getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
        if getattr(args, "_main", None) is None:
            parser.print_help()
            return 0 if args.command is None else 1
        return int(args._main(args) or 0)
    except (UserError, PlatformError) as exc:
        print_error(str(exc))
        return 1
    except ResultWriteError as exc:  # a result file that cannot be written (disk full): it keeps what it held
        print_error(exc.strerror or str(exc))
        return 1


if __name__ == "__main__":
    sys.exit(main())
