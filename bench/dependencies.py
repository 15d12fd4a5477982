"""What bench needs installed beside torch, checked before the command line imports any of it.

Offline cluster nodes often hold torch's usual stack and little more (no pydantic, say). `bench.entry` asks
here first, so that a missing package is one line naming it and the way to install it offline, for every
command, instead of a traceback from deep inside an import. REQUIRED mirrors pyproject.toml's
dependencies (a test keeps the two equal).
"""

from __future__ import annotations

import importlib.util

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
