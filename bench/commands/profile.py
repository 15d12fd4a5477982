"""`bench profile SCENARIO --case FILTER`: where one case's step goes, on every rank.

Exactly one case of the scenario must match --case (the --filter syntax). Its `cp` ranks run one warmup
pass, one pass counting the bytes of every collective (beside the analytic model of
gdn_cp.distributed.comm_model), one pass under MemTracker (memory by kind), then --steps passes under
torch.profiler (bench/profiling/rank.py). Written under results/profiles/<run>/: one Chrome trace per rank
(rank<r>.json: open it in https://ui.perfetto.dev or chrome://tracing) and summary.json (the tables below
as data). Printed: per rank the step split into compute, each collective kind and waiting (definitions in
bench/profiling/traces.py), the straggler and the phase behind it; the bytes each rank sent and received
per collective kind, counted and modelled; the memory breakdown per rank.

Exit code: 0; 3 when the counted bytes differ from the model (a bug in a collective or in the model);
2 when the case did not run; 1 for a user error.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from bench.commands import common_args
from bench.commands.session import CaseChoice, Session
from bench.console import console as default_console
from bench.console import print_path
from bench.errors import UserError
from bench.launch.launcher import TorchrunEnv
from bench.profiling import MEMORY_METER, RankBreakdown, RankProfile, breakdown, profile_on_rank, straggler
from bench.profiling.traces import Straggler
from bench.records import to_dict
from bench.render.tables import TableData, print_tables
from bench.results.env import collect_environment
from bench.results.paths import free_path
from bench.results.store import result_filename
from bench.suite.config import Case
from bench.suite.loader import display
from bench.suite.selection import Selection
from gdn_cp.distributed import Platform

NAME = "profile"
HELP = (
    "Profile one case on every rank: a Chrome trace per rank, time in compute / each collective / waiting, "
    "the straggler, bytes per collective against the model, memory by kind."
)

EXIT_MODEL_MISMATCH = 3
"""The bytes counted on the wire differ from the analytic model."""
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
PROFILE_FILES = ("summary.json", "rank*.json")
"""What a profile writes into its folder; an --output folder that holds any of them is refused."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", metavar="SCENARIO", help="a scenario name or .yaml path")
    parser.add_argument(
        "--case",
        required=True,
        metavar="FILTER",
        help="the one case to profile, in --filter syntax (e.g. mode=p2p,cp=2,checkpoint=true or a case id)",
    )
    parser.add_argument("--steps", type=int, default=3, metavar="N", help="profiled steps (default 3)")
    common_args.add_sets(parser)
    common_args.add_device(parser)
    parser.add_argument(
        "--output",
        metavar="DIR",
        help="folder of the traces, new or without a profile in it (default: a new "
        "results/profiles/<date>-...-<case>/)",
    )
    common_args.add_config(parser)


def main(args: argparse.Namespace) -> int:
    return run(
        args.scenario,
        case=args.case,
        steps=args.steps,
        sets=args.sets,
        device=args.device,
        output=args.output,
        config=args.config,
    )


def _one_case(cases: Sequence[Case], expr: str, scenario: str) -> Case:
    if len(cases) == 1:
        return cases[0]
    listed = ", ".join(c.case_id for c in cases[:8]) + (
        f", ... ({len(cases)} in all)" if len(cases) > 8 else ""
    )
    raise UserError(
        f"--case {expr} matches {len(cases)} cases of {scenario} ({listed}); narrow it to one, e.g. "
        f"--case {cases[0].case_id}"
    )


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


def bytes_rows(
    profiles: Sequence[RankProfile],
) -> list[tuple[int, str, dict[str, int], dict[str, int], bool]]:
    """(rank, kind, counted, model, equal) for every kind either side has."""
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


def _run_dir(
    output: str | None, results_dir: Path, platform: Platform, case: Case, job: TorchrunEnv | None
) -> Path:
    """--output (a new folder, or one without a profile in it; UserError for a file or a profile's
    folder), else results/profiles/<date>-<branch>-<commit>-<scenario>-<case> (-2, -3, ... when taken:
    `run` creates it once the case has passed the checks); under torchrun the job's run id replaces the
    date, so that every rank (each with its own clock) names the same folder, which is then not numbered."""
    if output:
        path = Path(output)
        if path.exists() and not path.is_dir():
            raise UserError(f"--output {output}: is a file; give a folder for the traces (a new one)")
        if path.is_dir() and any(next(path.glob(pattern), None) for pattern in PROFILE_FILES):
            raise UserError(
                f"--output {output}: already holds a profile (summary.json or rank<r>.json), which this one "
                "would overwrite; give a new folder"
            )
        return path
    env = collect_environment(platform, threads_per_rank=None, world_sizes=[case.cp], launcher="local")
    name = result_filename(datetime.datetime.now(), env.git_branch, env.git_commit, case.key())
    name = name.removesuffix(".json")
    if job is not None:
        stamp = name.split("-", 2)[:2]  # <YYYYmmdd>-<HHMMSS>
        name = name.replace("-".join(stamp), os.environ.get("TORCHELASTIC_RUN_ID", "torchrun"), 1)
        return results_dir / "profiles" / name
    return free_path(results_dir / "profiles" / name)


def _create_run_dir(run_dir: Path, *, claim: bool) -> None:
    """Create the traces' folder before any rank starts; `claim` (a default name): it must still be free."""
    try:
        run_dir.mkdir(parents=True, exist_ok=not claim)
    except FileExistsError:
        if claim and run_dir.is_dir():
            raise UserError(
                f"{display(run_dir)}: another profile took this folder meanwhile; run the command again"
            ) from None
        raise UserError(
            f"{display(run_dir)}: cannot create the folder (a file is in the way); give --output DIR"
        ) from None
    except OSError as exc:
        raise UserError(
            f"{display(run_dir)}: cannot create the folder ({exc.strerror}); give --output DIR"
        ) from None


def run(
    scenario: str,
    *,
    case: str,
    steps: int = 3,
    sets: Sequence[str] = (),
    device: str | None = None,
    output: str | None = None,
    config: str | None = None,
    console: Console | None = None,
) -> int:
    """Profile the one case of `scenario` that `case` (a --filter expression) matches; the exit code."""
    if steps < 1:
        raise UserError(f"--steps {steps}: give a positive number of steps, e.g. --steps 3")

    def one_case(found: list[Selection]) -> list[Selection]:
        (sel,) = found
        if not sel.cases:  # CaseChoice.choose says so, as every command does
            return found
        return [dataclasses.replace(sel, cases=[_one_case(sel.cases, case, sel.scenario.name)])]

    choice = CaseChoice([scenario], sets, [case], device, config, filter_flag="--case")
    session = Session.open(choice, console or default_console, one_case)
    (the_case,) = session.cases
    platform, job, console = session.platform, session.job, session.console
    run_dir = _run_dir(output, session.suite.results_dir, platform, the_case, job)
    launcher = session.launcher(
        functools.partial(profile_on_rank, steps=steps, trace_dir=str(run_dir.resolve()))
    )
    _create_run_dir(run_dir, claim=not output and job is None)
    console.print(f"profiling {escape(the_case.key())} on {the_case.cp} ranks ({platform.device_type})")
    with launcher.group():
        outcome = launcher.run(the_case)
    if outcome.status != "ok":
        console.print(f"[red]{outcome.status}[/]: {escape(outcome.error or '')}")
        return 2
    profiles: list[RankProfile] = outcome.results
    breakdowns = breakdown([p.timeline for p in profiles])
    slow = straggler(breakdowns)
    found = _Profiled(profiles, breakdowns, slow, the_case, steps, platform.device_type)
    _print_profile(found, console)
    if job is None or job.rank == 0:
        summary = _summary(found)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        print_path(console, "traces", f"{display(run_dir)}/rank<r>.json", "(open in https://ui.perfetto.dev)")
    return 0 if all(row[4] for row in bytes_rows(profiles)) else EXIT_MODEL_MISMATCH


def _notes(profiles: Sequence[RankProfile], device_type: str) -> list[str]:
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


@dataclass(frozen=True, slots=True)
class _Profiled:
    """What a profile found: each rank's profile and time breakdown, the straggler, of which case, over
    how many steps, on which device type."""

    profiles: Sequence[RankProfile]
    breakdowns: Sequence[RankBreakdown]
    slow: Straggler | None
    the_case: Case
    steps: int
    device_type: str


def _print_profile(found: _Profiled, console: Console) -> None:
    """The time per rank and phase, the straggler and what is behind it, the bytes against the
    communication model, and the peak memory per rank."""
    profiles, breakdowns, slow, the_case = found.profiles, found.breakdowns, found.slow, found.the_case
    steps, device_type = found.steps, found.device_type
    print_tables([time_table(breakdowns, steps)], console)
    if slow is not None:
        console.print(
            f"straggler: rank {slow.rank} (step {_ms(slow.step_us)}, {_ms(slow.excess_us)} over the other "
            "ranks' "
            f"mean); behind it: {slow.phase} ({_ms(slow.phase_excess_us)} over the others' mean)"
        )
    for note in _notes(profiles, device_type):
        console.print(note, style="dim")
    print_tables([bytes_table(profiles, the_case), memory_table(profiles)], console)
    console.print(f"meter: {MEMORY_METER}", style="dim")


def _summary(found: _Profiled) -> dict[str, Any]:
    """summary.json: the case, the breakdown per rank, the straggler, the bytes against the model, memory
    and the device timeline, and the trace files."""
    profiles, breakdowns, slow = found.profiles, found.breakdowns, found.slow
    the_case, steps, device_type = found.the_case, found.steps, found.device_type
    return {
        "case": to_dict(the_case),
        "steps": steps,
        "device_type": device_type,
        "breakdown": [
            {"rank": b.rank, "step_us": b.step_us, **{f"{k}_us": v for k, v in b.categories().items()}}
            for b in breakdowns
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
