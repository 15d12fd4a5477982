"""One check's verdict, and how verdicts combine."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Status = Literal["ok", "info", "warn", "fail"]
"""ok: as it should be; info: a fact worth knowing; warn: timings will suffer (a problem to fix before a
sweep); fail: results would be wrong or the sweep cannot run."""
SEVERITY: dict[Status, int] = {"ok": 0, "info": 0, "warn": 1, "fail": 2}


@dataclass(frozen=True, slots=True)
class Check:
    group: str
    """What was checked: system, devices, backend, matmul, op, layer."""
    name: str
    status: Status
    detail: str
    """One line: the figure, and for a problem what to do."""


def worst(checks: Iterable[Check]) -> Status:
    """The most severe status of `checks` (ok when there are none)."""
    found: Status = "ok"
    for c in checks:
        if SEVERITY[c.status] > SEVERITY[found]:
            found = c.status
    return found
