"""The `bench` command line: a thin dispatcher over bench.commands (one module per subcommand)."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
from types import ModuleType
from typing import NoReturn

from bench.commands import NAMES, module, summary
from bench.console import print_error
from bench.errors import UserError


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


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line; `only`: the one subcommand whose module is imported and whose flags are added
    (the others listed by their help alone), None: every one."""
    parser = Parser(
        prog="bench",
        description="Benchmark, profile and verify context parallelism of Gated DeltaNet linear attention.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in NAMES:
        # argparse %-formats a subcommand's help ("%(prog)s"): a literal % ("95% interval") is written %%
        cmd = sub.add_parser(name, help=summary(name).replace("%", "%%"), description=summary(name))
        if only is None or name == only:
            command = module(name)
            command.add_arguments(cmd)
            cmd.set_defaults(_main=command.main, _parser=cmd)
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("gdn-cp-bench")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that is not installed
        return "unknown (not installed)"


def _command(argv: list[str]) -> str | None:
    """The subcommand `argv` names (the first word that is not a flag), if it is one."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in NAMES else None


def _user_facing() -> tuple[type[BaseException], ...]:
    """Errors of the library and the store that are the user's to fix, looked up when one is raised: the
    modules that define them import torch, which `bench --help` does without."""
    platform = importlib.import_module("gdn_cp.distributed").PlatformError
    return (platform, importlib.import_module("bench.results.store").ResultWriteError)


def _user_backends() -> ModuleType:
    """bench.launch.user_backends, which imports the user's backend modules before the command reads a
    scenario; looked up when a command that takes --backend-module runs (it imports torch, which
    `bench --help` does without)."""
    return importlib.import_module("bench.launch.user_backends")


def main(argv: list[str] | None = None) -> int:
    """Run a command; a user error (UserError, a usage error, or a device that cannot be used) is one red
    line, exit 1."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(only=_command(argv) or "")  # "" loads no command: `bench --help`, a typo
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # named by the subcommand, whose --help lists its flags
            getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
        if getattr(args, "_main", None) is None:
            parser.print_help()
            return 0 if args.command is None else 1
        if hasattr(args, "backend_modules"):  # a command that reads scenarios or starts ranks
            _user_backends().load(args.backend_modules)
        return int(args._main(args) or 0)
    except SystemExit:  # --help, --version: argparse's own exit, before any command module loads
        raise
    except UserError as exc:
        print_error(str(exc))
        return 1
    except Exception as exc:
        if not isinstance(exc, _user_facing()):
            raise
        # a device that cannot be used; a result file that cannot be written (disk full: it keeps its cases)
        print_error(getattr(exc, "strerror", None) or str(exc))
        return 1


if __name__ == "__main__":
    sys.exit(main())
