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
import statistics
from collections.abc import Sequence
from pathlib import Path

import yaml
from rich.console import Console

from bench.commands import common_args
from bench.console import console as default_console
from bench.console import print_warning
from bench.errors import UserError
from bench.judge.reference import scenario_order
from bench.launch.estimate import human_bytes
from bench.launch.launcher import MAX_RANKS_PER_CORE, torchrun_env
from bench.measure.contention import busy, probe
from bench.model.calibrate import calibrate
from bench.model.links import Interconnect, fit_quality, load_interconnect
from bench.model.predict import (
    ComputeModel,
    Prediction,
    check_runs,
    fit_compute,
    pipeline,
    predict,
    scaled,
)
from bench.render.formats import format_seconds, format_time, format_tokens
from bench.render.tables import TableData, print_tables
from bench.results.paths import write_new
from bench.results.store import load_result
from bench.suite.config import PASS_TAGS, Case
from bench.suite.loader import find_scenario, load_scenario, load_suite
from gdn_cp.distributed import MODES, check_cp_shapes, mode_class, probe_devices, resolve_platform

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
    if args.action == "check":
        return run_check(args.results, Path(args.links))
    return run_table(
        args.results,
        Path(args.links),
        scenario=args.scenario,
        cps=args.cp,
        seq_lens=args.seq_len,
        pass_=args.pass_,
        memory_gib=args.memory_gib,
        markdown=args.markdown,
    )


def _new_file(path: Path) -> None:
    """Refuse, before any work, a file that `_write_new` would not write."""
    if path.exists():
        raise UserError(f"{path} exists: give another --output (nothing is overwritten)")
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


def _links_table(links: Interconnect) -> TableData:
    """Each kind's latency and bandwidth, and how well they fit the calibration's samples (the median
    error, the fastest call), with a note for each fit not to trust."""
    rows, notes = [], []
    for kind, link in links.links.items():
        cells = [kind, f"{link.latency_s * 1e6:.0f} us", f"{link.bandwidth_bytes_s / 1e9:.2f} GB/s"]
        samples = [(s["cp"], s["bytes"], s["seconds"]) for s in links.samples if s["kind"] == kind]
        if not samples:  # a typed links file: nothing measured to check the fit against
            cells += ["-", "-"]
        else:
            q = fit_quality(kind, link, samples)
            cells += [f"{100 * q.median_error:.0f}%", f"{q.smallest_s * 1e6:.0f} us"]
            if not q.trusted(link):
                notes.append(
                    f"{kind}: not a fit to trust (median error {q.median_error:.0%}, latency "
                    f"{link.latency_s * 1e6:.0f} us against a fastest call of {q.smallest_s * 1e6:.0f} us); "
                    "calibrate again on an idle machine, or with more --cp sizes"
                )
        rows.append(cells)
    headers = ["kind", "latency", "bandwidth", "fit error", "fastest call"]
    return TableData(
        title=f"{links.name} ({links.source})", headers=headers, rows=rows, numeric={1, 2, 3, 4}, notes=notes
    )


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
        print_tables([_links_table(links)], console)
        console.print(f"wrote {output}")
    return 0


def _inputs(results: Sequence[str], links: Path) -> tuple[list, ComputeModel, Interconnect]:
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
    order = scenario_order(list(dict.fromkeys(s for run in runs for s in run.scenarios)))
    rows = [
        [
            c.measured.case.case_id,
            format_time(c.measured),
            format_seconds(c.predicted.total_s),
            f"{(c.predicted.compute_s + c.predicted.exchange_s) * 1e3:.1f}",
            f"{c.predicted.comm_s * 1e3:.1f}",
            f"{c.error:+.0%}",
        ]
        for c in sorted(checks, key=lambda c: order(c.measured.case))  # scenario order, not run order
    ]
    headers = ["case", "measured", "predicted", "compute ms", "comm ms", "error"]
    title = f"predicted vs measured ({interconnect.name})"
    print_tables([TableData(title=title, headers=headers, rows=rows, numeric={1, 2, 3, 4, 5})], console)
    errors = [abs(c.error) for c in checks]
    console.print(
        f"median absolute error {statistics.median(errors):.0%} over {len(checks)} cases "
        f"(largest {max(errors):.0%}); compute from the cp 1 cases, threads and shared cores as each case ran"
    )
    return 0


def _template(runs: list, scenario: str | None) -> Case:
    """The case whose layer the table predicts: the runs' first cp 1 case, or `scenario`'s first."""
    if scenario is None:
        return next(r.case for run in runs for r in run.cases if r.status == "ok" and r.case.cp == 1)
    suite = load_suite()
    cases = load_scenario(find_scenario(suite, scenario)).cases(warmup=0, repeat=1)
    return cases[0]


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


def _why(best: Prediction, ranked: list[Prediction], error: float | None) -> str:
    """Why `best` is the pick: the runner-up's margin, or a tie when the margin is inside the model's own
    error (its median absolute error on the measured cases; None: not checked)."""
    if len(ranked) < 2:
        return ""
    second = ranked[1]
    margin = second.total_s / best.total_s - 1
    share = second.comm_s / second.total_s if second.total_s else 0.0
    comm = f" ({share:.0%} comm)" if share >= 0.2 else ""
    if error is None:
        return f"{second.case.mode} +{margin:.0%}{comm} (unchecked)"
    if margin <= error:
        return f"{second.case.mode} +{margin:.0%} (tie)"
    return f"{second.case.mode} +{margin:.0%}{comm}"


TableRow = tuple[int, int, list[Prediction], list[Prediction], dict[str, str]]
"""(seq_len, cp, every mode's prediction, those not excluded fastest first, mode -> why it is excluded)."""


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
) -> tuple[list[Prediction], dict[str, str], list[str]]:
    """(the predictions, mode -> why it is excluded, the predictions' notes) of every mode at one point."""
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
    return preds, excluded, notes


def _predict_rows(
    template: Case,
    compute: ComputeModel,
    interconnect: Interconnect,
    *,
    cps: Sequence[int],
    seq_lens: Sequence[int],
    pass_: str,
    threads: int,
    memory_gib: float | None,
) -> tuple[list[TableRow], set[str]]:
    """(one TableRow per sequence length and cp, in that order; every prediction's notes)."""
    rows, notes = [], set()
    for seq_len in seq_lens:
        for cp in cps:
            preds, excluded, point_notes = _predict_point(
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
            fits = sorted((p for p in preds if p.case.mode not in excluded), key=lambda p: p.total_s)
            rows.append((seq_len, cp, preds, fits, excluded))
    return rows, notes


def _table_cells(
    rows: list[TableRow], error: float | None
) -> tuple[list[list[str]], list[list[str]], dict[str, None]]:
    """(each row's time cells: T, cp, every mode's ms or "-", the pick and the runner-up; each row's peak
    cells: T, cp, every mode's peak per rank; the exclusions, "mode: reason", in order of first
    appearance)."""
    times, peaks, reasons = [], [], {}
    for seq_len, cp, preds, fits, excluded in rows:
        by_mode = {p.case.mode: p for p in preds}
        ms = [f"{by_mode[m].total_s * 1e3:,.0f}" if m in by_mode else "-" for m in MODES]
        peak = [human_bytes(by_mode[m].peak_bytes) if m in by_mode else "-" for m in MODES]
        pick = fits[0].case.mode if fits else "none fits"
        why = _why(fits[0], fits, error) if fits else ""
        for mode, reason in excluded.items():
            reasons.setdefault(f"{mode}: {reason}", None)
        times.append([format_tokens(seq_len), str(cp), *ms, pick, why])
        peaks.append([format_tokens(seq_len), str(cp), *peak])
    return times, peaks, reasons


def _markdown(pass_: str, assumptions: list[str], tables: Sequence[TableData]) -> str:
    """The tables as a Markdown document: a title, the assumptions as a list, then each table."""
    lines = [f"# Cost model: {pass_} of one GDN layer, by CP mode", "", *(f"- {a}" for a in assumptions)]
    for t in tables:
        lines += ["", f"## {t.title}", "", "| " + " | ".join(t.headers) + " |", "|" + "---|" * len(t.headers)]
        lines += ["| " + " | ".join(r) + " |" for r in t.rows]
    return "\n".join(lines) + "\n"


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
        _new_file(Path(markdown))
    runs, compute, interconnect = _inputs(results, links)
    template = _template(runs, scenario)
    threads = max(k[3] for k in compute.fits)
    rows, notes = _predict_rows(
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
    error = statistics.median(abs(c.error) for c in checks) if checks else None
    times, peaks, reasons = _table_cells(rows, error)
    numeric = set(range(2 + len(MODES)))
    tied = "" if error is None else f"; (tie): within the model's own error ({error:.0%})"
    tables = [
        TableData(
            title=f"predicted {pass_} per layer, ms - {interconnect.name}",
            headers=["T", "cp", *MODES, "pick", "next"],
            rows=times,
            numeric=numeric,
            notes=[f"next: the runner-up, how much slower the model predicts it{tied}"],
        ),
        TableData(
            title="predicted peak allocated per rank",
            headers=["T", "cp", *MODES],
            rows=peaks,
            numeric=numeric,
        ),
    ]
    print_tables(tables, console)
    assumptions = _assumptions(compute, interconnect, template, threads, results, sorted(notes))
    assumptions.append(_check_line(checks))
    if reasons:
        assumptions.append("not picked where shown '-' or over the memory: " + "; ".join(reasons))
    for line in assumptions:
        console.print(line, style="dim")
    if markdown is not None:
        _write_new(Path(markdown), _markdown(pass_, assumptions, tables))
        console.print(f"wrote {markdown}")
    return 0


def _check_line(checks: list) -> str:
    """The model's own error on the measured cp > 1 cases of the results it was fitted to."""
    if not checks:
        return "not checked: the results hold no ok case at cp > 1 on this layer"
    errors = [c.error for c in checks]
    return (
        f"checked against the {len(checks)} measured cp > 1 cases of the results (as they ran: threads, "
        f"shared cores): median absolute error {statistics.median(map(abs, errors)):.0%}, median error "
        f"{statistics.median(errors):+.0%} (bench model check)"
    )


def _assumptions(
    compute: ComputeModel,
    links: Interconnect,
    template: Case,
    threads: int,
    results: Sequence[str],
    notes: list[str],
) -> list[str]:
    c = template.layer
    out = [
        f"layer: hidden {c.hidden_size}, heads {c.num_k_heads}/{c.num_v_heads}, head dims "
        f"{c.head_k_dim}/{c.head_v_dim}, chunk {c.chunk_size}, {template.dtype}, batch {template.batch}; "
        "summary checkpoint on; contiguous layout",
        f"compute: fitted to the cp 1 cases of {', '.join(Path(r).name for r in results)} "
        f"({threads} threads per rank), one rank per device (no shared cores)",
        f"links: {links.name} ({links.source}): "
        + ", ".join(
            f"{k} {v.latency_s * 1e6:.0f} us + {v.bandwidth_bytes_s / 1e9:.2f} GB/s"
            for k, v in links.links.items()
        ),
        "communication on each mode's critical path (p2p: P - 1 relayed states; scan: ceil(log2 P) rounds; "
        "collectives joined at once); memory: the preflight estimate (bench/launch/estimate.py); no overlap",
    ]
    return out + notes
