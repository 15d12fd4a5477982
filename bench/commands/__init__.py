"""One module per `bench` subcommand. Each defines NAME, HELP, `add_arguments(parser)` and `main(args)`.

`main(args)` turns parsed arguments into a call of the module's `run(...)`, which takes plain arguments so
that tests call it without argparse, and returns the exit code.
"""

from __future__ import annotations

from types import ModuleType

from bench.commands import (
    compare,
    doctor,
    export,
    gate,
    history,
    init,
    model,
    plot,
    profile,
    report,
    run,
    show,
    verify,
)
from bench.commands import list as list_command

COMMANDS: list[ModuleType] = [
    *(init, list_command, run, show, export, compare, gate, history, plot, report, verify, profile, model),
    doctor,
]
