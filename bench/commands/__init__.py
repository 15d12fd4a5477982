"""One module per `bench` subcommand. Each defines NAME, HELP, `add_arguments(parser)` and `main(args)`.

`main(args)` turns parsed arguments into a call of the module's `run(...)`, which takes plain arguments so
that tests call it without argparse, and returns the exit code.

The modules are imported only when their command runs (`module`): most import torch, which takes seconds,
and `bench --help` needs none of them; it reads each command's HELP from its source (`summary`).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from functools import cache
from pathlib import Path
from types import ModuleType

NAMES: tuple[str, ...] = (
    *("init", "list", "run", "show", "hist", "export", "compare", "gate", "history", "plot", "report"),
    *("verify",),
    *("profile", "model", "doctor"),
)
"""The subcommands, in the order `bench --help` lists them; each is the module bench.commands.<name>."""


def module(name: str) -> ModuleType:
    """The module of the subcommand `name` (imported now, if it was not)."""
    return importlib.import_module(f"{__name__}.{name}")


@cache
def summary(name: str) -> str:
    """The subcommand's HELP, read from its module's source without importing it."""
    spec = importlib.util.find_spec(f"{__name__}.{name}")
    assert spec is not None and spec.origin is not None, name
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "HELP" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise AssertionError(f"bench.commands.{name} has no literal HELP")


def __getattr__(attribute: str) -> list[ModuleType]:
    """COMMANDS: every subcommand's module, in NAMES' order (each imported: for tests and the docs)."""
    if attribute == "COMMANDS":
        return [module(name) for name in NAMES]
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")
