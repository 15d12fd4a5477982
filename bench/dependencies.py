"""What bench needs installed beside torch, checked before the command line imports any of it.

Offline cluster nodes often hold torch's usual stack and little more (no pydantic, say). `bench.entry` asks
here first, so that a missing package is one line naming it and the way to install it offline, for every
command, instead of a traceback from deep inside an import. REQUIRED mirrors pyproject.toml's
dependencies (a test keeps the two equal).

A package can also be present but broken: its import raises (a scipy built against a libopenblas the node
lacks, a matplotlib missing one of its own dependencies). Importing every dependency at start-up to find
out would cost every command matplotlib's and torch's import time, so `missing` only finds them; the
ImportError a command then meets, where it first imports the package, reaches `bench.entry`, which asks
`import_failure` whose it is and prints that one line instead of the traceback.
"""

from __future__ import annotations

import importlib.util
import os

REQUIRED: dict[str, str] = {
    "numpy": "numpy",
    "yaml": "pyyaml",
    "rich": "rich",
    "matplotlib": "matplotlib",
    "scipy": "scipy",
    "safetensors": "safetensors",
    "pydantic": "pydantic",
}
"""Import name -> distribution name of every dependency but torch (the node's own build)."""
WHEELHOUSE = "python scripts/wheelhouse.py --dest wheelhouse"
"""Builds, on a connected machine, the wheels of the dependencies but torch (scripts/wheelhouse.py)."""
OFFLINE_INSTALL = "python -m pip install --no-index --find-links wheelhouse -r wheelhouse/requirements.txt"
"""Installs them on the offline node, from the carried folder."""


def missing() -> list[str]:
    """The distributions of REQUIRED whose module is not installed here, in REQUIRED's order. Found, not
    imported: the command imports what it uses (matplotlib only to draw), so the check costs no start-up."""
    return [dist for module, dist in REQUIRED.items() if importlib.util.find_spec(module) is None]


def install_hint(absent: list[str]) -> str:
    """One line: what is missing and how to install it, online or on an offline node."""
    names = ", ".join(absent)
    verb = "is" if len(absent) == 1 else "are"
    return (
        f"bench needs {names}, which {verb} not installed here: pip install -e . "
        f"(or pip install {' '.join(absent)}); "
        f"on an offline node, run `{WHEELHOUSE}` on a connected machine, carry wheelhouse/ over and run "
        f"`{OFFLINE_INSTALL}`"
    )


BUILT_BY_THE_NODE = {"torch": "torch"}
"""Dependencies whose build is the node's own (installed as its platform documents): named when broken."""


def import_failure(exc: ImportError) -> str | None:
    """One line for an ImportError raised by a dependency's own import (bench's import of it, or its import
    of a package it needs): which dependency, where it is installed, its error, how to reinstall it; None
    when the error is not a dependency's (bench's own code: its traceback stays)."""
    places = _installed()
    module = _failing_dependency(exc, places)
    if module is None:
        return None
    dist = {**REQUIRED, **BUILT_BY_THE_NODE}[module]
    reason = " ".join(f"{type(exc).__name__}: {exc}".split())
    if module in BUILT_BY_THE_NODE:
        fix = f"reinstall the node's {dist} build as its platform documents"
    else:
        fix = (
            f"reinstall it: pip install --force-reinstall {dist} (on an offline node add --no-index "
            "--find-links wheelhouse, the wheels that scripts/wheelhouse.py gathered)"
        )
    return (
        f"bench cannot import {dist}: it is installed ({places[module]}) but its import fails ({reason}); "
        f"{fix}"
    )


def _failing_dependency(exc: ImportError, places: dict[str, str]) -> str | None:
    """The dependency (an import name of REQUIRED or BUILT_BY_THE_NODE) whose code raised `exc`: that of the
    innermost traceback frame inside a dependency's package; else the one `exc.name` names (bench asked a
    dependency for a name it lacks: another version)."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not filename.startswith("<"):  # not importlib's frozen frames
            path = os.path.realpath(filename)
            found = next((m for m, place in places.items() if _inside(path, place)), found)
        tb = tb.tb_next
    if found is None and exc.name:
        top = exc.name.split(".")[0]
        found = top if top in places else None
    return found


def _installed() -> dict[str, str]:
    """Import name -> where it is installed (a package's folder, a module's file), for the dependencies
    found here. Found, not imported: a broken one is found like any other."""
    out = {}
    for module in (*REQUIRED, *BUILT_BY_THE_NODE):
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):  # left half-imported by the failure
            continue
        if spec is not None and spec.submodule_search_locations:
            out[module] = os.path.realpath(next(iter(spec.submodule_search_locations)))
        elif spec is not None and spec.origin:
            out[module] = os.path.realpath(spec.origin)
    return out


def _inside(path: str, place: str) -> bool:
    return path == place or path.startswith(place + os.sep)
