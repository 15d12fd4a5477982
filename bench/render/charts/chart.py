"""A rendered chart: its stable name, its title and its matplotlib Figure, saved as PNG and SVG."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure

FORMATS = ("png", "svg")
DPI = 150


@dataclass(slots=True)
class Chart:
    """A rendered chart, ready to save."""

    name: str
    """Stable file stem: time_vs_seq, ... (prefixed with the scenario when there are several)."""
    title: str
    figure: Figure
    dpi: int = DPI
    """Resolution of its PNG."""

    def save(self, out_dir: Path, formats: Sequence[str] = FORMATS) -> list[Path]:
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = []
        for fmt in formats:
            path = out_dir / f"{self.name}.{fmt}"
            # A fixed salt for the SVG's ids and no date: an unchanged chart rewrites an identical file,
            # so re-rendering the committed charts shows no diff.
            metadata = {"Date": None} if fmt == "svg" else None
            with matplotlib.rc_context({"svg.hashsalt": "gdn-cp-bench"}):
                self.figure.savefig(path, format=fmt, dpi=self.dpi, bbox_inches="tight", metadata=metadata)
            paths.append(path)
        return paths

    def png_bytes(self) -> bytes:
        buf = io.BytesIO()
        self.figure.savefig(buf, format="png", dpi=self.dpi, bbox_inches="tight")
        return buf.getvalue()
