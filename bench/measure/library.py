"""The gdn_cp a rank measures: this checkout's, or another checkout's loaded beside it in the same process.

A paired `bench compare REF REF` (bench.launch.paired) times base's and head's layer in one lifetime of the
ranks, pass by pass in turn, so that what a lifetime shares (thread and memory placement, the allocator's
state, the clock) is in both and cancels in the ratio. For that one process holds two copies of gdn_cp:
`load_library(root)` imports the package from `root` under its own name (`gdn_cp`), keeps the modules it
got, and puts back whatever `gdn_cp` modules were loaded before, so that neither copy sees the other's.
A copy's functions keep their own module globals, and gdn_cp imports only at module level, so each copy
keeps calling its own code afterwards. What the measurement harness itself uses (platform, sequence
sharding, process groups: torch's global state) stays this checkout's. A copy's registration of a name in
torch's process-wide registries (gdn_cp.distributed.launch registers its rendezvous backend) is skipped
while it imports: the process keeps this checkout's, and a copy only builds layers.

A library is used through three names, the surface the harness builds a case with: GatedDeltaNetConfig,
seeded_layer and LinearAttentionContextParallel. A ref without them cannot be paired (LibraryError).
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
from gdn_cp import layers as this_layers

PACKAGE = "gdn_cp"


class LibraryError(RuntimeError):
    """A checkout's gdn_cp cannot be loaded, or lacks what the harness builds a case with."""


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

    def config(self, config: Any) -> Any:
        """`config` (this checkout's GatedDeltaNetConfig) as this library's: the fields both declare (a
        field only this library has keeps its default)."""
        if isinstance(config, self.config_type):
            return config
        names = {f.name for f in dataclasses.fields(self.config_type)}
        return self.config_type(
            **{f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name in names}
        )


THIS = Library(
    root=None,
    config_type=gdn_cp.GatedDeltaNetConfig,
    seeded_layer=this_layers.seeded_layer,
    context_parallel=gdn_cp.LinearAttentionContextParallel,
)
"""This checkout's gdn_cp (what `bench run` measures)."""


def _package_modules() -> dict[str, Any]:
    return {n: m for n, m in sys.modules.items() if n == PACKAGE or n.startswith(PACKAGE + ".")}


@contextlib.contextmanager
def _registrations_skipped() -> Iterator[None]:
    """In the block, registering a rendezvous backend whose name is taken does nothing (it raises otherwise:
    another copy's module registers the same name with its own function)."""
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
        with _registrations_skipped():
            package = importlib.import_module(PACKAGE)
            layers = importlib.import_module(f"{PACKAGE}.layers")
    except Exception as exc:
        raise LibraryError(f"{root}: importing its {PACKAGE} failed ({type(exc).__name__}: {exc})") from exc
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
        )
    except AttributeError as exc:
        raise LibraryError(
            f"{root}: its {PACKAGE} has no {exc.name} (the harness builds a case with GatedDeltaNetConfig, "
            "seeded_layer and LinearAttentionContextParallel)"
        ) from None
