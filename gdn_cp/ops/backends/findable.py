"""Whether a module could be imported here, found without importing it or any package above it.

`importlib.util.find_spec("a.b.c")` imports `a` and `a.b` to search them, and importing a kernel package
may query the accelerator (FLA's `fla/__init__` asks for device 0 and Triton's driver): a launcher that
only checks whether a backend's package is installed must not create a device context. Here each level
is located on the path (a package's folder, then the next name inside it) and nothing is executed.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys


def module_findable(name: str) -> bool:
    """Whether `name` (dotted) is on this Python's path, or already imported, without running any of it."""
    if name in sys.modules:
        return True
    parts = name.split(".")
    # a top-level name is found without importing anything (meta path finders: editable installs too)
    spec = importlib.util.find_spec(parts[0])
    for depth, part in enumerate(parts[1:], start=1):
        if spec is None or spec.submodule_search_locations is None:
            return False  # not found, or a plain module where a package is needed
        parent = ".".join(parts[:depth])
        if parent in sys.modules:
            spec = importlib.util.find_spec(f"{parent}.{part}")  # its parent is imported already
        else:
            spec = importlib.machinery.PathFinder.find_spec(part, list(spec.submodule_search_locations))
    return spec is not None
