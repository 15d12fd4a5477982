"""The gdn_cp a rank measures: this checkout's, or another checkout's loaded beside it in the same process.

A paired `bench compare REF REF` (bench.launch.paired) times base's and head's layer in one lifetime of the
ranks, pass by pass in turn, so that what a lifetime shares (thread and memory placement, the allocator's
state, the clock) is in both and cancels in the ratio. For that one process holds two copies of gdn_cp:
`load_library(root)` imports the package from `root` under its own name (`gdn_cp`), keeps the modules it
got, and puts back whatever `gdn_cp` modules were loaded before, so that neither copy sees the other's.
A copy's functions keep their own module globals, and gdn_cp imports only at module level, so each copy
keeps calling its own code afterwards. What the measurement harness itself uses (platform, sequence
sharding, process groups: torch's global state) stays this checkout's. Today's gdn_cp registers nothing
in torch's process-wide registries (the launcher and its rendezvous backend are bench's, bench.launch.local),
but a ref from before that move registers its own rendezvous backend as it imports (its
gdn_cp.distributed.launch), under one name for every such ref: with two of them paired, the second's
registration is skipped (`_registrations_skipped`), and a copy only builds layers anyway.

A library is used through three names, the surface the harness builds a case with: GatedDeltaNetConfig,
seeded_layer and LinearAttentionContextParallel. A ref without them cannot be paired (LibraryError). A case
may set what an older ref does not take (a backend, overlap, a layout): `Library.unsupported` names those
fields, and the case is then not comparable for that ref (never run with the field silently dropped, which
would time the ref's own default under the case's name). A ref whose gdn_cp records what ran
(gdn_cp.ops.ran) is recorded through its own module (`Library.recording`): each copy has its own. So does
each copy's backend registry: the modules and entry points this process imported for a user's backends
(bench.launch.user_backends) are imported again while a copy loads, registering with its registry (one that
does not import with a ref's gdn_cp is a BackendImportError naming the module).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

import gdn_cp
from bench.errors import first_line
from gdn_cp import layers as this_layers
from gdn_cp.ops import backend_sources
from gdn_cp.ops import ran as this_ran
from gdn_cp.ops.backends import DEFAULT_BACKEND
from gdn_cp.ops.backends.plugins import load_target

PACKAGE = "gdn_cp"


class LibraryError(RuntimeError):
    """A checkout's gdn_cp cannot be loaded, or lacks what the harness builds a case with."""


class BackendImportError(LibraryError):
    """A module imported for its backends (bench.launch.user_backends) does not import with a checkout's
    gdn_cp."""

    def __init__(self, root: str, module: str, exc: BaseException) -> None:
        reason = f"{type(exc).__name__}: {first_line(str(exc))}"
        super().__init__(f"{root}: backend module {module} does not import with its {PACKAGE} ({reason})")
        self.module = module
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Library:
    """What the harness builds a case's layer with, from one copy of gdn_cp."""

    root: str | None
    """The checkout it was loaded from; None: the one this process runs."""
    config_type: type
    """Its GatedDeltaNetConfig."""
    seeded_layer: Callable[..., Any]
    """Its seeded_layer(config, seed, device)."""
    context_parallel: type
    """Its LinearAttentionContextParallel (the ParallelStyle)."""
    options_type: type | None = None
    """Its CPOptions, where it has one (the style's fields otherwise)."""
    ran: Any = None
    """Its gdn_cp.ops.ran module, where it records what ran; None: an older gdn_cp that does not."""

    def option_fields(self) -> set[str]:
        """The CP options it takes: its CPOptions' fields, or its style's; the backend also where only its
        layer config has one (the case's backend reaches the layer through the config)."""
        declared = self.options_type or self.context_parallel
        taken = {f.name for f in dataclasses.fields(declared)} - {"src_data_rank"}
        return taken | ({"backend"} & _field_names(self.config_type))

    def unsupported(self, case: Any) -> list[str]:
        """The fields `case` sets (a value other than this checkout's default) that this library does not
        take, each as "name value": every one a reason the case cannot run on it as named."""
        lacking = _set_fields(case.layer, _field_names(self.config_type))
        lacking += _set_fields(_plain(case.options), self.option_fields())
        return list(dict.fromkeys(f"{name} {value!r}" for name, value in lacking))  # a backend is in both

    def config(self, config: Any) -> Any:
        """`config` (this checkout's GatedDeltaNetConfig) as this library's: the fields both declare.
        LibraryError where `config` sets one this library lacks (`unsupported` is checked before any rank
        starts; this is the last guard)."""
        if isinstance(config, self.config_type):
            return config
        names = _field_names(self.config_type)
        self._refuse(_set_fields(config, names))
        return self.config_type(
            **{f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name in names}
        )

    def style(self, options: Any) -> Any:
        """Its LinearAttentionContextParallel with `options` (this checkout's CPOptions), given the fields
        its style takes; LibraryError where `options` sets one this library lacks."""
        if self.root is None:
            return self.context_parallel(options)
        self._refuse(_set_fields(_plain(options), self.option_fields()))
        takes = _field_names(self.options_type or self.context_parallel)
        return self.context_parallel(
            **{f.name: getattr(options, f.name) for f in dataclasses.fields(options) if f.name in takes}
        )

    def _refuse(self, lacking: list[tuple[str, Any]]) -> None:
        if lacking:
            named = ", ".join(f"{name} {value!r}" for name, value in lacking)
            raise LibraryError(f"{self.root}: its gdn_cp has no {named} (the case sets it)")

    def recording(self) -> contextlib.AbstractContextManager[Any]:
        """Record what the block runs with this copy's gdn_cp.ops.ran (its Recording), or yield None where
        the copy records nothing."""
        return contextlib.nullcontext(None) if self.ran is None else self.ran.recording()


THIS = Library(
    root=None,
    config_type=gdn_cp.GatedDeltaNetConfig,
    seeded_layer=this_layers.seeded_layer,
    context_parallel=gdn_cp.LinearAttentionContextParallel,
    options_type=gdn_cp.CPOptions,
    ran=this_ran,
)
"""This checkout's gdn_cp (what `bench run` measures)."""


def _package_modules() -> dict[str, Any]:
    return {n: m for n, m in sys.modules.items() if n == PACKAGE or n.startswith(PACKAGE + ".")}


@contextlib.contextmanager
def _registrations_skipped() -> Iterator[None]:
    """In the block, registering a rendezvous backend whose name is taken does nothing (it raises otherwise:
    two refs older than bench.launch.local register the same name, each with its own function)."""
    original = rendezvous_handler_registry.register

    def register(backend: str, creator: Callable[..., Any]) -> None:
        with contextlib.suppress(ValueError):  # taken: this process keeps the first
            original(backend, creator)

    rendezvous_handler_registry.register = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        del rendezvous_handler_registry.register  # the class's method again


@functools.cache
def load_library(root: str) -> Library:
    """gdn_cp as checked out at `root` (a folder holding gdn_cp/), loaded once per process beside any other
    copy; LibraryError when it is not there or lacks the harness's three names."""
    if not (Path(root) / PACKAGE / "__init__.py").is_file():
        raise LibraryError(f"{root}: no {PACKAGE}/ package there to measure")
    before = _package_modules()
    for name in before:
        del sys.modules[name]
    sys.path.insert(0, root)
    importlib.invalidate_caches()
    try:
        try:
            with _registrations_skipped():
                package = importlib.import_module(PACKAGE)
                layers = importlib.import_module(f"{PACKAGE}.layers")
                ran = _optional_module(f"{PACKAGE}.ops.ran")
        except Exception as exc:
            raise LibraryError(
                f"{root}: importing its {PACKAGE} failed ({type(exc).__name__}: {exc})"
            ) from exc
        _register_user_backends(root)  # while its gdn_cp is the one `import gdn_cp` finds
    finally:
        sys.path.remove(root)
        for name in _package_modules():  # this copy's modules: reachable through its objects alone
            del sys.modules[name]
        sys.modules.update(before)
    if not str(Path(package.__file__).resolve()).startswith(str(Path(root).resolve())):
        raise LibraryError(f"{root}: `import {PACKAGE}` found {package.__file__} instead of the checkout's")
    try:
        return Library(
            root=root,
            config_type=package.GatedDeltaNetConfig,
            seeded_layer=layers.seeded_layer,
            context_parallel=package.LinearAttentionContextParallel,
            options_type=getattr(package, "CPOptions", None),
            ran=ran,
        )
    except AttributeError as exc:
        raise LibraryError(
            f"{root}: its {PACKAGE} has no {exc.name} (the harness builds a case with GatedDeltaNetConfig, "
            "seeded_layer and LinearAttentionContextParallel)"
        ) from None


def _register_user_backends(root: str) -> None:
    """Import again, into the copy being loaded, every module and entry point this process imported for its
    backends (gdn_cp.ops.backend_sources: --backend-module, BENCH_BACKENDS, `gdn_cp.backends`), so that they
    register with the copy's registry (a user backend's name means the same op on both sides); the modules
    this process had are put back after. BackendImportError for one that does not import with the copy."""
    sources = backend_sources()
    tops = {s.module.split(".")[0] for s in sources} - {PACKAGE}  # a module of gdn_cp's: the copy's own
    mine = {n: m for n, m in sys.modules.items() if n.split(".")[0] in tops}
    for name in mine:
        del sys.modules[name]
    try:
        for source in sources:
            try:
                load_target(source.target)
            except Exception as exc:
                raise BackendImportError(root, source.module, exc) from exc
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] in tops]:
            del sys.modules[name]
        sys.modules.update(mine)


def _optional_module(name: str) -> Any:
    """The module `name` of the copy being imported, or None where that copy has none."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        return None


def _field_names(record: type) -> set[str]:
    return {f.name for f in dataclasses.fields(record)}


def _set_fields(record: Any, taken: set[str]) -> list[tuple[str, Any]]:
    """(name, value) of `record`'s fields outside `taken` whose value is not the field's default."""
    return [
        (f.name, getattr(record, f.name))
        for f in dataclasses.fields(record)
        if f.name not in taken and getattr(record, f.name) != f.default
    ]


def _plain(options: Any) -> Any:
    """`options` with the default backend spelled as the record's default (None): a ref without backends
    runs this package's op, which is what backend gdn_cp asks for."""
    return dataclasses.replace(options, backend=None) if options.backend == DEFAULT_BACKEND else options
