"""A user's backends in every process a command uses: the modules --backend-module and BENCH_BACKENDS name,
and the installed packages' `gdn_cp.backends` entry points (gdn_cp.ops.backends.plugins).

Who imports them: the launcher, before it reads a scenario (`load`: an unknown backend stays one line before
any rank starts); every local rank, before it builds anything (`prepare_rank`, from the rank entries of
bench.launch.pool_rank and bench.launch.local: pools and run_on_ranks alike); a torchrun rank, which is a
`bench` process of its own, as a launcher does; each ref's gdn_cp of a paired compare
(bench.measure.library) and each ref's own bench of an unpaired one (bench.launch.interleave, through
BENCH_BACKENDS).

A rank learns them from its environment (`rank_env`): the modules, the folders the launcher found them in (a
rank forks from a server that may have started before a folder joined sys.path), and the names registered
in the launcher, so that a name the launcher had and a rank lacks says why (`BackendOnlyInLauncher`): code
under `if __name__ == "__main__":` runs in the launcher alone, since a rank imports the script without it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.console import print_warning
from bench.errors import UserError
from gdn_cp.ops import backend_names, backend_sources, import_backend_module, load_backend_plugins
from gdn_cp.ops.backends import BackendModuleError
from gdn_cp.ops.backends.plugins import ENTRY_POINT_GROUP

BACKENDS_ENV = "BENCH_BACKENDS"
"""Comma-separated modules to import for the backends they register, as --backend-module does."""
SEARCH_PATH_ENV = "BENCH_BACKEND_PATH"
"""Set for the ranks: the folders the launcher imported those modules from (os.pathsep between them)."""
LAUNCHER_NAMES_ENV = "BENCH_LAUNCHER_BACKENDS"
"""Set for the ranks: the backends registered in the launcher, comma-separated."""

_FLAGGED: list[str] = []
"""The modules --backend-module named in this process, in order (what a result's command line repeats)."""


class BackendOnlyInLauncher(ValueError):
    """A backend registered in the launcher that a rank does not have."""


def launcher_only_message(name: str) -> str:
    """Why a rank lacks backend `name` that its launcher has, and the fix (one line)."""
    return (
        f"backend {name!r} is registered in the launcher only (registered under "
        '`if __name__ == "__main__":`, or by code the ranks do not import): put it in a module and pass '
        f"--backend-module MODULE or {BACKENDS_ENV}, or declare a `{ENTRY_POINT_GROUP}` entry point"
    )


def env_modules(environ: Mapping[str, str] | None = None) -> list[str]:
    """The modules BENCH_BACKENDS names (in `environ`, default this process's environment)."""
    text = (os.environ if environ is None else environ).get(BACKENDS_ENV, "")
    return [name.strip() for name in text.split(",") if name.strip()]


def load(flagged: Sequence[str] = ()) -> None:
    """In a launcher, before any scenario is read: the `gdn_cp.backends` entry points (once per process; one
    warning line per plugin that fails), then the modules of --backend-module (`flagged`) and of
    BENCH_BACKENDS. UserError naming the flag or the variable, the module and why, for one that does not
    import."""
    load_backend_plugins(report=print_warning)
    named = [(f"--backend-module {name}", name) for name in flagged]
    named += [(f"{BACKENDS_ENV}={os.environ[BACKENDS_ENV]}", name) for name in env_modules()]
    for where, name in named:
        try:
            import_backend_module(name)
        except BackendModuleError as exc:
            raise UserError(f"{where}: {exc}") from None
    _FLAGGED.extend(name for name in dict.fromkeys(flagged) if name not in _FLAGGED)


def flagged() -> tuple[str, ...]:
    """The modules --backend-module named in this process (bench.commands.session.command_argv repeats
    them in the command line a result records, and in the resume command)."""
    return tuple(_FLAGGED)


def imported_modules() -> list[str]:
    """The modules imported by name for their backends in this process, and those BENCH_BACKENDS names."""
    named = [s.module for s in backend_sources() if s.entry_point is None]
    return list(dict.fromkeys([*named, *env_modules()]))


def _search_path_of(module: str) -> str | None:
    """The sys.path folder `module` was imported from (None where it has no file: built in, namespace)."""
    top = sys.modules.get(module.split(".")[0])
    if top is None:
        return None
    folders = list(getattr(top, "__path__", None) or [])  # a package: its folder's parent
    file = folders[0] if folders else getattr(top, "__file__", None)
    return None if file is None else str(Path(file).resolve().parent)


def search_path() -> list[str]:
    """The folders `imported_modules` came from (what another process needs on its path to import them)."""
    return list(dict.fromkeys(f for m in imported_modules() if (f := _search_path_of(m)) is not None))


def rank_env() -> dict[str, str]:
    """What a launch from this process tells its ranks (bench.launch.pool.RankPool and run_on_ranks add it
    to their environment): the modules to import, where they were found, the backends registered here."""
    return {
        BACKENDS_ENV: ",".join(imported_modules()),
        SEARCH_PATH_ENV: os.pathsep.join(search_path()),
        LAUNCHER_NAMES_ENV: ",".join(backend_names()),
    }


@dataclass(frozen=True, slots=True)
class RankBackends:
    """What a rank found as it prepared (`prepare_rank`)."""

    launcher_only: tuple[str, ...] = ()
    """Backends registered in the launcher and not here."""

    def explain(self, exc: BaseException) -> BaseException:
        """`exc`, or BackendOnlyInLauncher where it is the lookup of a backend the launcher alone has."""
        if isinstance(exc, ValueError) and not isinstance(exc, BackendOnlyInLauncher):
            for name in self.launcher_only:
                if f"backend {name!r}" in str(exc):
                    return BackendOnlyInLauncher(launcher_only_message(name))
        return exc


def prepare_rank(environ: Mapping[str, str] | None = None) -> RankBackends:
    """In a local rank, before it builds anything: the launcher's folders on sys.path (after this rank's
    own), the `gdn_cp.backends` entry points (their failures already said by the launcher), the modules of
    BENCH_BACKENDS. BackendModuleError, one line, for a module this rank cannot import."""
    env = os.environ if environ is None else environ
    for folder in env.get(SEARCH_PATH_ENV, "").split(os.pathsep):
        if folder and folder not in sys.path:
            sys.path.append(folder)
    load_backend_plugins(report=lambda line: None)
    for name in env_modules(env):
        try:
            import_backend_module(name)
        except BackendModuleError as exc:
            raise BackendModuleError(f"in a rank: {exc} (the launcher imported it)") from None
    here = set(backend_names())
    missing = [n for n in env.get(LAUNCHER_NAMES_ENV, "").split(",") if n and n not in here]
    return RankBackends(launcher_only=tuple(missing))
