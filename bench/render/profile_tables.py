"""`bench profile`'s views of what a profile found: per rank the step split into compute, each collective kind
and waiting (definitions in bench/profiling/traces.py), the straggler and the phase behind it; the bytes
each rank sent and received per collective kind, counted and modelled; the memory breakdown per rank; and
summary.json, the same as data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from bench.profiling import MEMORY_METER, RankBreakdown, RankProfile, breakdown, straggler
from bench.profiling.traces import Straggler
from bench.records import to_dict
from bench.render.tables import TableData, print_tables
from bench.suite.config import Case

MEMORY_KINDS = (
    ("Parameter", "parameters"),
    ("Gradient", "gradients"),
    ("Activation", "activations"),
    ("Temp", "temporaries"),
    ("Buffer", "buffers"),
    ("Other", "input + output grad"),
    ("Total", "peak total"),
)
"""MemTracker's kinds, and how the table names them ("Other": the tensors registered before the pass)."""

BytesRow = tuple[int, str, dict[str, int], dict[str, int], bool]
"""(rank, collective kind, counted {sent, received, calls}, modelled, whether the two are equal)."""


@dataclass(frozen=True, slots=True)
class Profiled:
    """What a profile found: each rank's profile and time breakdown, the straggler, of which case, over
    how many steps, on which device type."""

    profiles: Sequence[RankProfile]
    breakdowns: Sequence[RankBreakdown]
    slow: Straggler | None
    case: Case
    steps: int
    device_type: str

    @classmethod
    def of(cls, profiles: Sequence[RankProfile], case: Case, steps: int, device_type: str) -> Profiled:
        """The ranks' profiles with their breakdowns and straggler (bench.profiling.traces)."""
        breakdowns = breakdown([p.timeline for p in profiles])
        return cls(profiles, breakdowns, straggler(breakdowns), case, steps, device_type)

    @property
    def bytes_match(self) -> bool:
        """Every rank's counted bytes and calls equal the model's, kind by kind."""
        return all(row[4] for row in bytes_rows(self.profiles))


def _ms(us: float) -> str:
    return f"{us / 1e3:.3f} ms"


def _bytes(n: int) -> str:
    return f"{n:,} B"


def time_table(breakdowns: Sequence[RankBreakdown], steps: int) -> TableData:
    """rank | step | compute | each collective kind | waiting, per rank."""
    kinds = sorted({k for b in breakdowns for k in b.collectives_us})
    rows = [
        [
            str(b.rank),
            _ms(b.step_us),
            _ms(b.compute_us),
            *(_ms(b.collectives_us.get(k, 0.0)) for k in kinds),
            _ms(b.waiting_us),
        ]
        for b in breakdowns
    ]
    headers = ["rank", "step", "compute", *kinds, "waiting"]
    title = f"time per step on each rank (mean of {steps} profiled steps)"
    return TableData(title=title, headers=headers, rows=rows, numeric=set(range(len(headers))))


def bytes_rows(profiles: Sequence[RankProfile]) -> list[BytesRow]:
    """A BytesRow for every kind either side has, rank by rank."""
    rows = []
    empty = {"sent": 0, "received": 0, "calls": 0}
    for p in profiles:
        for kind in sorted(set(p.communication) | set(p.model)):
            counted, model = p.communication.get(kind, empty), p.model.get(kind, empty)
            equal = all(counted.get(k, 0) == model.get(k, 0) for k in ("sent", "received", "calls"))
            rows.append((p.rank, kind, counted, model, equal))
    return rows


def bytes_table(profiles: Sequence[RankProfile], case: Case) -> TableData:
    """Bytes per collective kind on each rank, counted on the wire against the model, and whether they
    match."""
    rows = [
        [
            str(rank),
            kind,
            _bytes(counted.get("sent", 0)),
            _bytes(model.get("sent", 0)),
            _bytes(counted.get("received", 0)),
            _bytes(model.get("received", 0)),
            f"{counted.get('calls', 0)} / {model.get('calls', 0)}",
            "yes" if equal else "NO",
        ]
        for rank, kind, counted, model, equal in bytes_rows(profiles)
    ]
    headers = ["rank", "kind", "sent", "sent (model)", "received", "received (model)", "calls", "match"]
    return TableData(
        title=f"bytes per collective kind in one {case.pass_.replace('_', '+')} pass: counted on the wire "
        "(gdn_cp comm_stats) vs the model (gdn_cp.distributed.comm_model)",
        headers=headers,
        rows=rows,
        numeric={0, 2, 3, 4, 5, 6},
        verdict_column=7,
        verdict_styles={"yes": "green", "NO": "bold red"},
    )


def memory_table(profiles: Sequence[RankProfile]) -> TableData:
    """Memory at the peak of one pass on each rank, by kind (or why it was not measured)."""
    rows, notes = [], []
    for p in profiles:
        if p.memory is None:
            rows.append([str(p.rank), *("-" for _ in MEMORY_KINDS)])
            notes.append(f"rank {p.rank}: not measured: {p.memory_error or ''}")
            continue
        rows.append([str(p.rank), *(f"{p.memory.get(kind, 0) / 2**20:.2f} MiB" for kind, _ in MEMORY_KINDS)])
    headers = ["rank", *(header for _, header in MEMORY_KINDS)]
    return TableData(
        title="memory at the peak of one pass, by kind",
        headers=headers,
        rows=rows,
        numeric=set(range(len(headers))),
        notes=notes,
    )


def time_notes(profiles: Sequence[RankProfile], device_type: str) -> list[str]:
    """What the time table's columns are, and what a device's own timeline says that the host's cannot."""
    notes = [
        "compute: the step outside collectives; each collective: its blocked time minus waiting; waiting: "
        "time in a collective before the last peer arrived (bench/profiling/traces.py); halo: the Conv1D "
        "halo exchange, all_to_all: Ulysses' exchanges"
    ]
    unpaired = sum(p.timeline.unpaired for p in profiles)
    if unpaired:
        notes.append(
            f"{unpaired} collective call(s) without a backend event in the trace: their blocked time is the "
            "c10d op's own"
        )
    if device_type != "cpu":
        notes.append(
            f"on {device_type} collectives are asynchronous on the host: their time shows as "
            "compute here; the device's timeline says what overlap hid:"
        )
        for prof in profiles:
            if prof.device is not None:
                d = prof.device
                notes.append(
                    f"rank {prof.rank} on the device: collective kernels {_ms(d.communication_us)} a step, "
                    f"exposed (no compute kernel alongside) {_ms(d.exposed_us)}, {d.hidden:.0%} hidden"
                )
    return notes


def print_profile(found: Profiled, console: Console) -> None:
    """The time per rank and phase, the straggler and what is behind it, the bytes against the
    communication model, and the peak memory per rank."""
    print_tables([time_table(found.breakdowns, found.steps)], console)
    slow = found.slow
    if slow is not None:
        console.print(
            f"straggler: rank {slow.rank} (step {_ms(slow.step_us)}, {_ms(slow.excess_us)} over the other "
            f"ranks' mean); behind it: {slow.phase} ({_ms(slow.phase_excess_us)} over the others' mean)"
        )
    for note in time_notes(found.profiles, found.device_type):
        console.print(note, style="dim")
    print_tables([bytes_table(found.profiles, found.case), memory_table(found.profiles)], console)
    console.print(f"meter: {MEMORY_METER}", style="dim")


def profile_summary(found: Profiled) -> dict[str, Any]:
    """summary.json: the case, the breakdown per rank, the straggler, the bytes against the model, memory
    and the device timeline, and the trace files."""
    profiles, slow = found.profiles, found.slow
    return {
        "case": to_dict(found.case),
        "steps": found.steps,
        "device_type": found.device_type,
        "breakdown": [
            {"rank": b.rank, "step_us": b.step_us, **{f"{k}_us": v for k, v in b.categories().items()}}
            for b in found.breakdowns
        ],
        "straggler": None
        if slow is None
        else {"rank": slow.rank, "step_us": slow.step_us, "excess_us": slow.excess_us, "phase": slow.phase},
        "communication": [
            {"rank": r, "kind": k, "counted": c, "model": m, "match": eq}
            for r, k, c, m, eq in bytes_rows(profiles)
        ],
        "memory": [{"rank": p.rank, "bytes": p.memory, "error": p.memory_error} for p in profiles],
        "memory_meter": MEMORY_METER,
        "device_timeline": [
            {"rank": p.rank, "communication_us": p.device.communication_us, "exposed_us": p.device.exposed_us}
            for p in profiles
            if p.device is not None
        ],
        "traces": [Path(p.trace_path).name for p in profiles],
    }
