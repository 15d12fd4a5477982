"""The CP modes of GatedDeltaNet, and the registry that is the one place a mode's facts are read from.

    base.py            CPMode: the call boundary, and the facts every mode declares (summary, shape rules,
                       communication model); how charts draw a mode is bench's (bench.render.charts)
    sequence_shard.py  the pipeline the full-head modes share (halo, Conv1D, prepare, summary, outputs)
    ulysses.py, p2p.py, all_gather.py, scan.py   one module per mode

Adding a mode is one module here and one entry in MODE_CLASSES (and the name in ModeName, which a test
keeps equal). bench, the estimate, the plots and the communication model read everything else from the
class. The order of MODE_CLASSES is the display order.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from gdn_cp.distributed.layout import DEFAULT_LAYOUT, check_layout
from gdn_cp.distributed.modes.all_gather import AllGatherMode
from gdn_cp.distributed.modes.base import CommCase, CPMode
from gdn_cp.distributed.modes.p2p import P2PMode
from gdn_cp.distributed.modes.scan import ScanMode
from gdn_cp.distributed.modes.sequence_shard import SequenceShardMode
from gdn_cp.distributed.modes.ulysses import UlyssesMode
from gdn_cp.distributed.sharding import check_layout_split
from gdn_cp.layers import GatedDeltaNetConfig
from gdn_cp.ops.backends import get_backend

ModeName = Literal["ulysses", "p2p", "all_gather", "scan"]
"""The names of the CP modes, for type hints and config validation (equal to MODES, in order)."""

MODE_CLASSES: dict[str, type[CPMode]] = {m.name: m for m in (UlyssesMode, P2PMode, AllGatherMode, ScanMode)}
"""The registry: name -> mode class, in display order."""

MODES: tuple[str, ...] = tuple(MODE_CLASSES)
"""The CP modes in display order; the first is the default."""
DEFAULT_MODE: str = MODES[0]
SUMMARY_MODES: tuple[str, ...] = tuple(n for n, m in MODE_CLASSES.items() if m.has_summary)
"""The modes that compute an (S, M) summary, where checkpoint_summary applies."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CPOptions:
    """How a CP call runs, the one record every mode takes (FLA's FLACPContext pattern). Checked on
    construction: an unknown name raises ValueError listing the known ones."""

    mode: str = DEFAULT_MODE
    """A name of MODES; the first, ulysses, is the default everywhere (the op, the style, the configs)."""
    layout: str = DEFAULT_LAYOUT
    """How the sequence is cut over the ranks (gdn_cp.distributed.LAYOUTS), for inputs and outputs alike."""
    checkpoint_summary: bool | None = None
    """Modes with a summary: trade time for memory. On: the least memory (the local op keeps its inputs and
    recomputes the rest in backward); off: keep what makes the backward fastest. None (the default): the
    backend's choice, on for a backend with a summaries-then-outputs pair (gdn_cp, fla), off for another
    (SequenceShardMode.checkpoint_for; what ran records the value applied). What each backend keeps either
    way: SequenceShardMode.local_path."""
    overlap: bool = False
    """Modes with a summary, on the split path (SequenceShardMode.local_path): compute the outputs'
    state-free part while the summary exchange is in flight. The affine path computes every output's
    state-free part before the exchange anyway; overlap there is refused rather than ignored."""
    backend: str | None = None
    """The local op (gdn_cp.ops.backends): None takes the layer's own (GatedDeltaNetConfig.backend), or
    gdn_cp at the op level."""

    @classmethod
    def build(cls, options: CPOptions | None = None, /, **fields: object) -> CPOptions:
        """The options every CP surface takes (the style, the model's apply_context_parallel, the op): a
        record, or its fields by name (CPOptions(**fields)), not both. ValueError naming an unknown field."""
        if options is not None:
            if fields:
                named = ", ".join(fields)
                raise ValueError(
                    f"pass the CP options whole (options=CPOptions(...)) or as fields ({named}), not both"
                )
            if not isinstance(options, CPOptions):
                got = type(options).__name__
                raise ValueError(f"options must be a gdn_cp.distributed.CPOptions, got {got}")
            return options
        unknown = [name for name in fields if name not in OPTION_FIELDS]
        if unknown:
            named = ", ".join(map(repr, unknown))
            raise ValueError(f"unknown CP option {named}; the options are {', '.join(OPTION_FIELDS)}")
        return cls(**fields)  # type: ignore[arg-type]

    def __post_init__(self) -> None:
        check_mode(self.mode)
        check_layout(self.layout)
        if self.checkpoint_summary is not None and not isinstance(self.checkpoint_summary, bool):
            raise ValueError(
                f"CPOptions.checkpoint_summary must be True, False or None (the backend's choice), got "
                f"{self.checkpoint_summary!r}"
            )
        if not isinstance(self.overlap, bool):
            raise ValueError(f"CPOptions.overlap must be True or False, got {self.overlap!r}")
        if self.backend is not None:
            get_backend(self.backend)


OPTION_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(CPOptions))
"""The names of the CP options, in declaration order."""


def check_mode(mode: str) -> None:
    if mode not in MODE_CLASSES:
        raise ValueError(f"unknown CP mode {mode!r}; use one of {', '.join(MODES)}")


def mode_class(mode: str) -> type[CPMode]:
    """The class of `mode`; ValueError listing the modes for an unknown name."""
    check_mode(mode)
    return MODE_CLASSES[mode]


def mode_order(mode: str) -> int:
    """Sort key of a mode name in tables and charts (unknown names last)."""
    return MODES.index(mode) if mode in MODE_CLASSES else len(MODES)


def check_cp_shapes(
    mode: str,
    config: GatedDeltaNetConfig,
    cp_size: int,
    seq_len: int | None = None,
    layout: str = DEFAULT_LAYOUT,
) -> None:
    """Raise ValueError, with the fix, if `mode` cannot run `config` on `cp_size` ranks at `seq_len` tokens
    sharded evenly in `layout` (gdn_cp.distributed.shard_sequence).

    Rules: the mode exists; cp_size >= 1; the mode's own shape rules (ulysses: heads divisible by cp); the
    global sequence must split evenly over the ranks (zigzag: into 2 cp pieces). The layers themselves also
    take uneven contiguous shards.
    """
    cls = mode_class(mode)
    if isinstance(cp_size, bool) or not isinstance(cp_size, int) or cp_size < 1:
        raise ValueError(f"cp size must be a positive integer, got {cp_size!r}")
    try:
        cls.check_shapes(config, cp_size)
    except ValueError as exc:  # the mode's own rule; the registry knows which modes would run it
        fits = [n for n, m in MODE_CLASSES.items() if m is not cls and _fits(m, config, cp_size)]
        alternatives = f", or a mode that runs it: {', '.join(fits)}" if fits else ""
        raise ValueError(f"{exc}{alternatives}") from None
    if seq_len is not None:
        check_layout_split(seq_len, cp_size, layout)


def _fits(mode: type[CPMode], config: GatedDeltaNetConfig, cp_size: int) -> bool:
    try:
        mode.check_shapes(config, cp_size)
    except ValueError:
        return False
    return True


__all__ = [
    "DEFAULT_MODE",
    "MODES",
    "MODE_CLASSES",
    "OPTION_FIELDS",
    "SUMMARY_MODES",
    "CPMode",
    "CPOptions",
    "CommCase",
    "ModeName",
    "SequenceShardMode",
    "check_cp_shapes",
    "check_mode",
    "mode_class",
    "mode_order",
]
