"""`bench model`: the cost model (bench.model) on the command line.

    bench model calibrate [--cp 2 4] --output links.yaml     time this host's collectives, fit alpha-beta
    bench model check RESULT... --links links.yaml           predicted vs measured, case by case
    bench model table RESULT... --links links.yaml           predictions up to cp 128 and 1M tokens,
                                                             the mode to pick and why

RESULT files give the measured compute (their cp 1 cases); `--links` the interconnect, measured by
`calibrate` or typed for a target cluster (bench/model/links.py documents the file). `table` predicts the
measured layer, or `--scenario NAME`'s (its compute scaled by model FLOPs per token), one rank per device.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

import yaml
from rich.console import Console

from bench.commands import common_args
from bench.commands.session import CaseChoice
from bench.console import console as default_console
from bench.console import print_warning
from bench.errors import UserError
from bench.launch.devices import probe_devices
from bench.launch.launcher import MAX_RANKS_PER_CORE, torchrun_env
from bench.measure.contention import busy, probe
from bench.model.calibrate import calibrate
from bench.model.grid import predict_grid
from bench.model.links import Interconnect, load_interconnect
from bench.model.predict import ComputeModel, check_runs, fit_compute
from bench.render.model_tables import (
    assumptions,
    links_table,
    model_markdown,
    prediction_tables,
    print_checks,
)
from bench.render.tables import print_tables
from bench.results.names import resolve_result
from bench.results.outputs import check_output_file
from bench.results.paths import write_new
from bench.results.store import RunResult, load_result
from bench.suite.config import PASS_TAGS, Case
from gdn_cp.distributed import resolve_platform

NAME = "model"
HELP = "The cost model: calibrate this host's links, check predictions against runs, predict any scale."
TABLE_CP = (2, 4, 8, 16, 32, 64, 128)
TABLE_SEQ = (32768, 131072, 1048576)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    cal = actions.add_parser(
        "calibrate", help="time p2p, all-gather, all-to-all and all-reduce, fit the links"
    )
    cal.add_argument(
        "--cp",
        type=common_args.integer_at_least(2),
        nargs="+",
        default=[2, 4],
        help="world sizes to time (default 2 4)",
    )
    cal.add_argument("--output", required=True, help="the interconnect file to write (refused if it exists)")
    common_args.add_device(cal)
    for name, text in (
        ("check", "predicted vs measured for every cp > 1 case of the results"),
        ("table", "predicted step and peak memory per mode up to cp 128 and 1M tokens, with the pick"),
    ):
        sub = actions.add_parser(name, help=text)
        sub.add_argument(
            "results", nargs="+", metavar="RESULT", help="result files (their cp 1 cases: compute)"
        )
        sub.add_argument("--links", required=True, help="interconnect file (bench model calibrate, or typed)")
    table = actions.choices["table"]
    table.add_argument("--scenario", help="predict this scenario's layer (default: the measured one)")
    common_args.add_backend_modules(table)
    table.add_argument(
        "--cp", type=common_args.integer_at_least(1), nargs="+", default=list(TABLE_CP), help="CP degrees"
    )
    table.add_argument(
        "--seq-len",
        type=common_args.integer_at_least(1),
        nargs="+",
        default=list(TABLE_SEQ),
        help="global tokens",
    )
    table.add_argument("--pass", dest="pass_", choices=tuple(PASS_TAGS), default="forward_backward")
    table.add_argument(
        "--memory-gib",
        type=common_args.positive_number,
        help="device memory: a mode that does not fit is not picked",
    )
    table.add_argument("--markdown", help="also write the table and its assumptions to this markdown file")


def main(args: argparse.Namespace) -> int:
    if args.action == "calibrate":
        return run_calibrate(args.cp, Path(args.output), device=args.device or "cpu")
    results = [resolve_result(r) for r in args.results]  # `latest`, `latest~N`: as every command reads them
    if args.action == "check":
        return run_check(results, Path(args.links))
    return run_table(
        results,
        Path(args.links),
        scenario=args.scenario,
        cps=args.cp,
        seq_lens=args.seq_len,
        pass_=args.pass_,
        memory_gib=args.memory_gib,
        markdown=args.markdown,
    )


def _new_file(path: Path, flag: str = "--output", reading: Sequence[str | Path] = ()) -> None:
    """Refuse, before any work, a file that `_write_new` would not write."""
    check_output_file(path, flag=flag, reading=reading, hint=f"give another {flag}")
    if path.exists():
        raise UserError(f"{path} exists: give another {flag} (nothing is overwritten)")
    if not path.parent.is_dir():
        raise UserError(f"{path.parent} is not a folder: create it or give another --output")


def _write_new(path: Path, text: str) -> None:
    """Write a new file (claimed with O_EXCL: a file that appeared meanwhile is not overwritten)."""
    try:
        write_new(path, text)
    except FileExistsError:
        raise UserError(f"{path} exists: give another --output (nothing is overwritten)") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot write it ({exc.strerror}); give another path") from None


def run_calibrate(
    cps: Sequence[int], output: Path, *, device: str = "cpu", console: Console | None = None
) -> int:
    console = console or default_console
    bad = [cp for cp in cps if cp < 2]
    if bad:
        raise UserError(f"--cp {' '.join(map(str, bad))}: collectives need at least 2 ranks, e.g. --cp 2 4")
    platform, job = resolve_platform(device), torchrun_env()
    writes = job is None or job.rank == 0  # under torchrun, rank 0 writes
    most = MAX_RANKS_PER_CORE * (os.cpu_count() or 1)
    if job is None and platform.device_type != "cpu":
        most = len(probe_devices(platform))
    if job is None and max(cps) > most:
        raise UserError(
            f"--cp {max(cps)}: more local ranks than the {most} this host can run usefully "
            f"({'one per device' if platform.device_type != 'cpu' else f'{MAX_RANKS_PER_CORE} per core'}); "
            f"give world sizes up to {most}, or run across nodes under torchrun"
        )
    if writes:
        _new_file(output)
        reason = busy(probe())
        if reason is not None:  # a busy host's latencies are the other work's
            print_warning(f"busy machine: {reason}; the fitted links will carry it (calibrate when idle)")
    links = calibrate(tuple(cps), device=device)
    if writes:
        _write_new(output, yaml.safe_dump(links.to_dict(), sort_keys=False))
        print_tables([links_table(links)], console)
        console.print(f"wrote {output}")
    return 0


def _inputs(results: Sequence[str], links: Path) -> tuple[list[RunResult], ComputeModel, Interconnect]:
    """The runs, their compute fit and the links; UserError when the compute was measured on another kind
    of device than the links' (a CPU's cp 1 times do not say what a GPU's step costs)."""
    runs = [load_result(p) for p in results]
    interconnect = load_interconnect(links)
    if interconnect.device is not None:
        theirs = {run.environment.device_type for run in runs}
        others = sorted(theirs - {interconnect.device})
        if others:
            target = {"cuda": "gpu-smoke", "npu": "npu-cp4-32k"}.get(interconnect.device, "cpu-scaling")
            raise UserError(
                f"{', '.join(results)}: measured on {', '.join(others)}, but {links} holds "
                f"{interconnect.device} links: compute must come from the target device's own cp 1 "
                f"cases; run a scenario with cp 1 cases there (e.g. `bench run {target} --filter cp=1`) "
                "and give its result file"
            )
    try:
        compute = fit_compute(runs)
    except ValueError as e:
        raise UserError(f"{', '.join(results)}: {e}") from e
    return runs, compute, interconnect


def run_check(results: Sequence[str], links: Path, console: Console | None = None) -> int:
    console = console or default_console
    runs, compute, interconnect = _inputs(results, links)
    checks = check_runs(runs, compute, interconnect)
    if not checks:
        raise UserError(f"{', '.join(results)}: no ok case at cp > 1 on the measured layer to check")
    print_checks(checks, runs, interconnect.name, console)
    return 0


def _template(runs: Sequence[RunResult], scenario: str | None) -> Case:
    """The case whose layer the table predicts: the runs' first cp 1 case, or `scenario`'s first."""
    if scenario is None:
        return next(r.case for run in runs for r in run.cases if r.status == "ok" and r.case.cp == 1)
    return CaseChoice([scenario]).choose().cases[0]


def run_table(
    results: Sequence[str],
    links: Path,
    *,
    scenario: str | None = None,
    cps: Sequence[int] = TABLE_CP,
    seq_lens: Sequence[int] = TABLE_SEQ,
    pass_: str = "forward_backward",
    memory_gib: float | None = None,
    markdown: str | None = None,
    console: Console | None = None,
) -> int:
    console = console or default_console
    if markdown is not None:
        _new_file(Path(markdown), "--markdown", [*results, links])
    runs, compute, interconnect = _inputs(results, links)
    template = _template(runs, scenario)
    threads = max(k[3] for k in compute.fits)
    points, notes = predict_grid(
        template,
        compute,
        interconnect,
        cps=cps,
        seq_lens=seq_lens,
        pass_=pass_,
        threads=threads,
        memory_gib=memory_gib,
    )
    checks = check_runs(runs, compute, interconnect)
    tables, exclusions = prediction_tables(points, checks, pass_=pass_, links_name=interconnect.name)
    print_tables(tables, console)
    lines = assumptions(
        template,
        compute,
        interconnect,
        threads=threads,
        results=results,
        notes=sorted(notes),
        checks=checks,
        exclusions=exclusions,
    )
    for line in lines:
        console.print(line, style="dim")
    if markdown is not None:
        _write_new(Path(markdown), model_markdown(pass_, lines, tables))
        console.print(f"wrote {markdown}")
    return 0
