"""The alpha-beta model of an interconnect: each collective kind costs latency per step plus bytes over
bandwidth, measured here (bench.model.calibrate) or typed in a YAML for a target cluster.

    p2p        one message of n bytes:                      t = alpha + n / beta
    all_gather every rank contributes n bytes (ring):        t = (cp - 1) alpha + (cp - 1) n / beta
    all_to_all every rank sends n bytes in all, n / cp each: t = (cp - 1) alpha + (cp - 1) / cp n / beta
    all_reduce n bytes (ring reduce-scatter + all-gather):   t = 2 (cp - 1) alpha + 2 (cp - 1) / cp n / beta

`steps` and `wire_bytes` give the two coefficients of each kind; the fit (`fit_link`) and the prediction
(bench.model.predict) use the same ones. An interconnect file:

    name: ascend-910b-hccs                 # what it describes
    source: typed from the vendor's figures   # or "measured": how the numbers were obtained
    links:
      p2p: {latency_us: 15, bandwidth_gb_s: 28}
      all_gather: {latency_us: 20, bandwidth_gb_s: 28}
      all_to_all: {latency_us: 20, bandwidth_gb_s: 28}
      all_reduce: {latency_us: 20, bandwidth_gb_s: 28}

(GB/s = 1e9 bytes per second of one rank's sending.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from scipy.optimize import nnls

from bench.errors import UserError
from gdn_cp.distributed.comm_stats import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, HALO, P2P

LINK_KINDS = (P2P, ALL_GATHER, ALL_TO_ALL, ALL_REDUCE)
"""The kinds an interconnect describes. The Conv1D halo is an all-to-all-v (HALO costs as ALL_TO_ALL)."""
COSTED_AS = {HALO: ALL_TO_ALL}


def steps(kind: str, cp: int) -> int:
    """Latency terms of one call of `kind` on `cp` ranks (module docstring)."""
    kind = COSTED_AS.get(kind, kind)
    if kind == P2P:
        return 1
    return (2 if kind == ALL_REDUCE else 1) * (cp - 1)


def wire_bytes(kind: str, cp: int, nbytes: float) -> float:
    """Bytes one rank puts on the wire for a call of `kind` whose per-rank buffer is `nbytes`."""
    kind = COSTED_AS.get(kind, kind)
    if kind == P2P:
        return nbytes
    if kind == ALL_GATHER:
        return (cp - 1) * nbytes
    if kind == ALL_TO_ALL:
        return (cp - 1) / cp * nbytes
    return 2 * (cp - 1) / cp * nbytes


@dataclass(frozen=True, slots=True)
class Link:
    """One collective kind: seconds per latency step and bytes per second."""

    latency_s: float
    bandwidth_bytes_s: float

    def time_s(self, n_steps: float, n_bytes: float) -> float:
        return n_steps * self.latency_s + n_bytes / self.bandwidth_bytes_s


@dataclass(frozen=True, slots=True)
class Interconnect:
    """The links of a backend between ranks, and where the numbers come from."""

    name: str
    source: str
    links: dict[str, Link]
    samples: list[dict[str, Any]] = field(default_factory=list)
    """The calibration's measurements (kind, cp, bytes, seconds), when measured."""
    device: str | None = None
    """The device type whose links these are (cpu, cuda, npu); None: not stated (a typed file may say)."""

    def link(self, kind: str) -> Link:
        return self.links[COSTED_AS.get(kind, kind)]

    def call_s(self, kind: str, cp: int, nbytes: float) -> float:
        """Seconds of one call of `kind` on `cp` ranks with a per-rank buffer of `nbytes`."""
        return self.link(kind).time_s(steps(kind, cp), wire_bytes(kind, cp, nbytes))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "links": {
                k: {"latency_us": v.latency_s * 1e6, "bandwidth_gb_s": v.bandwidth_bytes_s / 1e9}
                for k, v in self.links.items()
            },
            **({"device": self.device} if self.device else {}),
            **({"samples": self.samples} if self.samples else {}),
        }


def _positive(value: Any, where: str) -> float:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value <= 0:
        raise UserError(f"{where} must be a positive number, got {value!r}")
    return float(value)


def interconnect_from_dict(data: Any, origin: str) -> Interconnect:
    """Validate an interconnect mapping (module docstring); UserError naming the field and the fix."""
    if not isinstance(data, dict):
        raise UserError(f"{origin}: an interconnect file is a mapping with name, source and links")
    links = data.get("links")
    if not isinstance(links, dict):
        raise UserError(
            f"{origin}: 'links' must map each of {', '.join(LINK_KINDS)} to latency_us and bandwidth_gb_s"
        )
    missing = [k for k in LINK_KINDS if k not in links]
    unknown = [k for k in links if k not in LINK_KINDS]
    if missing or unknown:
        raise UserError(
            f"{origin}: links must be exactly {', '.join(LINK_KINDS)}"
            + (f"; missing {', '.join(missing)}" if missing else "")
            + (f"; unknown {', '.join(map(str, unknown))}" if unknown else "")
        )
    parsed = {}
    for kind in LINK_KINDS:
        spec = links[kind]
        if not isinstance(spec, dict) or set(spec) != {"latency_us", "bandwidth_gb_s"}:
            raise UserError(f"{origin}: links.{kind} must be {{latency_us: ..., bandwidth_gb_s: ...}}")
        parsed[kind] = Link(
            _positive(spec["latency_us"], f"{origin}: links.{kind}.latency_us") * 1e-6,
            _positive(spec["bandwidth_gb_s"], f"{origin}: links.{kind}.bandwidth_gb_s") * 1e9,
        )
    device = data.get("device")
    if device is not None and device not in ("cpu", "cuda", "npu"):
        raise UserError(f"{origin}: device must be cpu, cuda or npu (the links' device), got {device!r}")
    return Interconnect(
        name=str(data.get("name", Path(origin).stem)),
        source=str(data.get("source", "not stated")),
        links=parsed,
        samples=list(data.get("samples", [])),
        device=device,
    )


def load_interconnect(path: Path) -> Interconnect:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise UserError(f"{path}: cannot read the interconnect file ({e})") from e
    return interconnect_from_dict(data, str(path))


@dataclass(frozen=True, slots=True)
class FitQuality:
    """How well a link's alpha-beta line fits its calibration samples."""

    median_error: float
    """Median |predicted - measured| / measured over the samples."""
    smallest_s: float
    """The fastest call measured: a latency fitted above it cannot be the cost of a call."""

    def trusted(self, link: Link) -> bool:
        """The fit is within 25% of its samples at the median and its latency is not above any call."""
        return self.median_error <= 0.25 and link.latency_s <= self.smallest_s


def fit_quality(kind: str, link: Link, samples: Sequence[tuple[int, int, float]]) -> FitQuality:
    """The fit's error on (cp, bytes, seconds) samples of one kind."""
    errors = [abs(link.time_s(steps(kind, cp), wire_bytes(kind, cp, n)) - s) / s for cp, n, s in samples]
    return FitQuality(median_error=float(np.median(errors)), smallest_s=min(s for _, _, s in samples))


def fit_link(kind: str, samples: Sequence[tuple[int, int, float]]) -> Link:
    """Least squares, non-negative, of t = steps alpha + wire_bytes / beta over (cp, bytes, seconds) samples
    of one kind."""
    a = np.array([[steps(kind, cp), wire_bytes(kind, cp, n)] for cp, n, _ in samples], dtype=float)
    t = np.array([s for _, _, s in samples], dtype=float)
    (alpha, inverse_beta), _ = nnls(a, t)
    # A bandwidth the data cannot resolve (all time in latency) is reported as very large, not infinite.
    return Link(latency_s=float(alpha), bandwidth_bytes_s=1.0 / max(float(inverse_beta), 1e-15))
