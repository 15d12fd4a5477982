"""Backends from other packages: the `gdn_cp.backends` entry points, and modules imported by name.

A package that brings backends declares an entry point in its metadata, naming a module whose import
registers them (gdn_cp.ops.register_backend, add_backend) or a callable that does, called with no arguments:

    [project.entry-points."gdn_cp.backends"]
    mine = "my_kernels"                  # or "my_kernels.plugin:register"

`load_backend_plugins()` loads every such entry point once per process, on the first lookup of a name no
one registered (gdn_cp.ops.get_backend). Not as gdn_cp imports: a plugin imports gdn_cp.ops to register,
which would be half imported then, and a kernel package may take seconds to import or query the devices,
which a process that never looks a plugin's backend up (every `import gdn_cp` of a program using the built-in
backends) should not pay. (bench loads them at once in each process it uses, before it reads a scenario:
bench.launch.user_backends.) A plugin that fails to load is one line (the entry point, its distribution,
the error) on the `gdn_cp.ops.backends.plugins` logger, and the other backends stay.

A module that is not installed with an entry point (a file beside a script) is imported by name with
`import_backend_module` (bench's --backend-module and BENCH_BACKENDS), in every process that needs its
backends: code run under `if __name__ == "__main__":` registers in that process alone. `backend_sources()`
says what was imported this way, and from where (what a result's environment records).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

ENTRY_POINT_GROUP = "gdn_cp.backends"
"""The entry point group of packages that register backends."""

_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")

log = logging.getLogger(__name__)


class BackendModuleError(ImportError):
    """A module named for its backends cannot be imported (the message is one line: which and why)."""


@dataclass(frozen=True, slots=True)
class BackendSource:
    """Where registered backends came from: a module imported by name, or an entry point."""

    target: str
    """What was imported: a module (`my_kernels`), or for an entry point its value (`my_kernels:register`,
    the callable called)."""
    origin: str
    """Its distribution and version (`my-kernels 1.2`) where one holds it, else the module's file."""
    entry_point: str | None = None
    """The entry point's name (group ENTRY_POINT_GROUP); None: imported by name."""

    @property
    def module(self) -> str:
        """The module imported (the target without its callable)."""
        return self.target.partition(":")[0].strip()


_SOURCES: dict[str, BackendSource] = {}
_PLUGINS_LOADED = False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _distribution_of(module: ModuleType) -> str | None:
    """`name version` of the installed distribution that holds `module`'s top-level package, if any."""
    top = module.__name__.split(".")[0]
    for dist in importlib.metadata.packages_distributions().get(top, []):
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _origin(module: ModuleType) -> str:
    return _distribution_of(module) or getattr(module, "__file__", None) or "(no file: a namespace package)"


def import_backend_module(name: str) -> BackendSource:
    """Import module `name`, whose import registers backends (once per process, as any import); what it is
    and where it came from. BackendModuleError, one line naming the module and the error, otherwise."""
    if not isinstance(name, str) or not _MODULE_NAME.fullmatch(name) or name.endswith(".py"):
        raise BackendModuleError(
            f"backend module {name!r} is not a module name: give a dotted name such as my_kernels or "
            "my_pkg.kernels (importable from sys.path), not a file path"
        )
    try:
        module = importlib.import_module(name)
    except Exception as exc:
        missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
        # the module itself (or its package) not found, not one of its dependencies
        itself = missing is not None and (name == missing or name.startswith(missing + "."))
        hint = " (put its folder on PYTHONPATH, or install its package)" if itself else ""
        line = f"backend module {name} cannot be imported: {_first_line(exc)}{hint}"
        raise BackendModuleError(line) from exc
    source = _SOURCES.get(name) or BackendSource(target=name, origin=_origin(module))
    _SOURCES[name] = source
    return source


def load_target(target: str) -> None:
    """Import `module` or `module:callable` (an entry point's value) and call the callable: what registering
    a plugin's backends takes; raises what the import or the call raises."""
    loaded = importlib.metadata.EntryPoint(name="", value=target, group=ENTRY_POINT_GROUP).load()
    if callable(loaded) and not isinstance(loaded, ModuleType):
        loaded()


def load_backend_plugins(report: Callable[[str], None] | None = None) -> tuple[BackendSource, ...]:
    """Load every `gdn_cp.backends` entry point installed here, the first time it is called in this process
    (later calls return what the first loaded); each that fails is one line to `report` (default: a warning
    on this module's logger) and is skipped. The sources loaded."""
    global _PLUGINS_LOADED
    if not _PLUGINS_LOADED:
        _PLUGINS_LOADED = True  # first: a plugin that looks a backend up as it loads does not load them again
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "an unknown distribution"
            try:
                load_target(ep.value)
            except Exception as exc:
                line = (
                    f"{ENTRY_POINT_GROUP} entry point {ep.name} = {ep.value} of {dist} failed to load, its "
                    f"backends are not registered: {_first_line(exc)}"
                )
                (report or log.warning)(line)
                continue
            source = BackendSource(target=ep.value, origin=dist, entry_point=ep.name)
            _SOURCES[f"{ep.name} = {ep.value}"] = source
    return tuple(s for s in _SOURCES.values() if s.entry_point is not None)


def backend_sources() -> tuple[BackendSource, ...]:
    """The modules imported for their backends in this process (`import_backend_module`) and the entry
    points loaded, in the order they came."""
    return tuple(_SOURCES.values())
