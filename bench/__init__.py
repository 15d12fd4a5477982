"""bench: sweeps, timing, memory, accuracy checks, comparisons and reports for gdn_cp's context
parallelism."""

from gdn_cp import __version__

__all__ = ["__version__"]
