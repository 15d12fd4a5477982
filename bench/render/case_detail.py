"""One case of a result file in full (`bench show RESULT --case ID`): what was asked, what ran (as gdn_cp
recorded it: bench.measure.gate), the correctness gate's checks, then its figures.

Lines are plain text, each "label: value"; the caller wraps them to the terminal.
"""

from __future__ import annotations

from bench.formats import format_checkpoint, format_mib, format_seconds, format_time
from bench.measure.gate import CaseCheck
from bench.results.store import CaseResult
from gdn_cp.ops.ran import Ran

NOT_RECORDED = "not recorded (a file before schema version 7, or a gdn_cp that does not record it)"


def case_detail(result: CaseResult) -> list[str]:
    """The case's lines: asked, ran, checked, measured."""
    case = result.case
    lines = [
        f"case: {case.scenario}/{case.case_id} ({result.status})",
        "asked: "
        + ", ".join(
            [
                f"mode {case.mode}",
                f"cp {case.cp}",
                f"layout {case.layout}",
                f"checkpoint {format_checkpoint(case.checkpoint)}",
                f"overlap {'on' if case.overlap else 'off'}",
                f"backend {case.backend}",
                f"{case.dtype}",
                f"precision {case.precision}",
                f"chunk {case.layer.chunk_size}",
            ]
        ),
    ]
    if result.error:
        lines.append(f"error: {result.error}")
    lines += ran_lines(result.ran)
    lines += check_lines(result.check)
    if result.status == "ok":
        n = len(result.rounds)
        lines.append(f"time: {format_time(result)} over {n} round{'s' if n != 1 else ''}")
        first = [r.first_use_s for r in result.rounds if r.first_use_s is not None]
        if first:
            lines.append(
                f"first pass (untimed: first use, compiles, autotuning): {format_seconds(max(first))} at most"
            )
        lines.append(f"peak allocated: {format_mib(result.memory)}")
    return lines


def ran_lines(ran: list[Ran] | None) -> list[str]:
    """What ran, one line a distinct call (a model's layers that ran alike share one)."""
    if ran is None:
        return [f"ran: {NOT_RECORDED}"]
    if not ran:
        return ["ran: nothing recorded (no layer or op call)"]
    seen: dict[str, int] = {}
    for call in ran:
        text = describe_call(call)
        seen[text] = seen.get(text, 0) + 1
    return [f"ran: {text}" + (f" (x{n})" if n > 1 else "") for text, n in seen.items()]


def describe_call(call: Ran) -> str:
    """One call as "GatedDeltaNet under p2p (gdn_cp....P2PMode), contiguous, ..., op gdn_cp....(gdn_cp)"."""
    if call.mode is None:
        parts = [f"{call.call} on one device"]
    else:
        parts = [f"{call.call} under {call.mode} ({call.mode_class})", f"layout {call.layout}"]
        if call.checkpoint_summary is not None:
            parts.append(f"checkpoint {'on' if call.checkpoint_summary else 'off'}")
        if call.overlap is not None:
            parts.append(f"overlap {'on' if call.overlap else 'off'}")
        parts.append(f"local path {call.local_path}")
    given = {"chunk": call.chunk_size, "dtype": call.dtype, "precision": call.precision}
    parts += [f"{name} {value}" for name, value in given.items() if value is not None]
    parts += [f"op {op.op} (backend {op.backend})" for op in call.ops]
    return ", ".join(parts)


def check_lines(check: CaseCheck | None) -> list[str]:
    """The gate's reference checks."""
    if check is None:
        return ["checked: not recorded"]
    lines = [f"checked: outputs finite every round; bar rel-L2 {check.bar:.0e}"]
    if check.small is not None:
        worst = ", ".join(f"{name} {rel:.1e}" for name, rel in check.small.rel_l2.items())
        lines.append(f"  small input ({check.small.seq_len} tokens) vs fp64 single device: {worst}")
    if check.reference is not None:
        lines.append(f"  against {check.reference} (cp 1): rel-L2 {check.reference_rel_l2:.1e}")
    return lines
