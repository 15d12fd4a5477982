"""Functions the user-backend tests run on local ranks (bench.launch.local.run_on_ranks): module-level, so
that the ranks import them by name."""

from __future__ import annotations

import sys

from gdn_cp.ops import backend_names, get_backend


def registered() -> tuple[tuple[str, ...], list[str]]:
    """The backends registered on this rank, and the user modules it imported (bench.launch.user_backends)."""
    return backend_names(), sorted(n for n in sys.modules if n.startswith("user_kernels_"))


def look_up(name: str) -> str:
    """Backend `name`'s description, looked up on this rank."""
    return get_backend(name).description
