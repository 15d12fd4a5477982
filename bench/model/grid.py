"""`bench model table`'s predictions: every CP mode at each (sequence length, cp) of a grid, which of them
can run and fit, fastest first, and why the others are left out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.launch.estimate import human_bytes
from bench.model.links import Interconnect
from bench.model.predict import ComputeModel, Prediction, pipeline, predict, scaled
from bench.suite.config import Case
from gdn_cp.distributed import MODES, check_cp_shapes, mode_class


@dataclass(frozen=True, slots=True)
class GridPoint:
    """Every mode's prediction at one sequence length and cp."""

    seq_len: int
    cp: int
    predictions: list[Prediction]
    """Of every mode that can run and has its compute measured, in the registry's order."""
    fits: list[Prediction]
    """Those not excluded, fastest first: the first is the pick."""
    excluded: dict[str, str]
    """Mode -> why it is left out (cannot run, no measured compute, over the memory)."""


def _feasible(case: Case) -> str | None:
    """Why `case` cannot run (short: the table's legend gives the rule), or None."""
    config = case.layer
    try:
        mode_class(case.mode).check_shapes(config, case.cp)
    except ValueError:
        return f"heads {config.num_k_heads}/{config.num_v_heads} do not split over cp"
    try:
        check_cp_shapes(case.mode, config, case.cp, case.seq_len, case.layout)
    except ValueError:
        return "the sequence does not split over cp"
    return None


def _unmeasured(compute: ComputeModel, case: Case) -> str | None:
    if any(k[:3] == (pipeline(case.mode), case.checkpoint, case.pass_) for k in compute.fits):
        return None
    return "no cp 1 case measured to fit its compute"


def _predict_point(
    template: Case,
    compute: ComputeModel,
    interconnect: Interconnect,
    *,
    seq_len: int,
    cp: int,
    pass_: str,
    threads: int,
    memory_gib: float | None,
) -> tuple[GridPoint, list[str]]:
    """Every mode at one point, and the predictions' notes."""
    preds, excluded, notes = [], {}, []
    for mode in MODES:
        checkpoint = True if mode_class(mode).has_summary else None
        case = scaled(template, mode=mode, cp=cp, seq_len=seq_len, pass_=pass_, checkpoint=checkpoint)
        reason = _feasible(case) or _unmeasured(compute, case)
        if reason is None:
            p = predict(case, compute, interconnect, threads=threads)
            notes += p.notes
            if memory_gib is not None and p.peak_bytes > memory_gib * 2**30:
                reason = f"needs {human_bytes(p.peak_bytes)} > {memory_gib:g} GiB"
            preds.append(p)
        if reason is not None:
            excluded[mode] = reason
    fits = sorted((p for p in preds if p.case.mode not in excluded), key=lambda p: p.total_s)
    return GridPoint(seq_len, cp, preds, fits, excluded), notes


def predict_grid(
    template: Case,
    compute: ComputeModel,
    interconnect: Interconnect,
    *,
    cps: Sequence[int],
    seq_lens: Sequence[int],
    pass_: str,
    threads: int,
    memory_gib: float | None,
) -> tuple[list[GridPoint], set[str]]:
    """(a GridPoint per sequence length and cp, in that order; every prediction's notes): `template`'s
    layer scaled to each point (bench.model.predict.scaled), one rank per device, `threads` per rank; a
    mode needing more than `memory_gib` (None: no limit) is not picked."""
    points, notes = [], set()
    for seq_len in seq_lens:
        for cp in cps:
            point, point_notes = _predict_point(
                template,
                compute,
                interconnect,
                seq_len=seq_len,
                cp=cp,
                pass_=pass_,
                threads=threads,
                memory_gib=memory_gib,
            )
            notes.update(point_notes)
            points.append(point)
    return points, notes
