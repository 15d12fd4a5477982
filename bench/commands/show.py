"""`bench show RESULT`: a result file as the PR's tables (mode | forward median | forward+backward median |
peak allocated, per CP degree and sequence length), then the cases that failed or were skipped, with why,
then the accuracy checks of `bench verify`, if the file holds any."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench.console import console as default_console
from bench.results.store import RunResult, load_result
from bench.results.tables import (
    not_measured,
    print_tables,
    reference_table_data,
    reference_tables,
    throughput_table,
)
from bench.verification.tables import verification_tables

NAME = "show"
HELP = "Show a result file as tables shaped like the reference PR's (per CP degree and sequence length)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("result", metavar="RESULT", help="a result file written by `bench run`")


def main(args: argparse.Namespace) -> int:
    return run(args.result)


def _header(run: RunResult) -> str:
    e = run.environment
    commit = e.git_commit[:8] + (" (dirty)" if e.git_dirty else "")
    npu = f", torch-npu {e.torch_npu_version}" if e.torch_npu_version else ""
    threads = sorted({c.threads_per_rank for c in run.cases if c.threads_per_rank is not None})
    configured = "" if e.threads_per_rank is None else " (configured)"
    used = "/".join(map(str, threads)) + configured if threads else "-"
    return (
        f"[bold]{escape(run.name)}[/]  {escape(run.created_at)}  {escape(e.git_branch)} @ {escape(commit)}\n"
        f"{escape(e.device_type)} ({escape(e.device_name)}, {escape(e.backend)}) on {escape(e.hostname)}: "
        f"{escape(e.cpu_model)}, {e.cpu_count} cores; threads per rank {used}; launcher {e.launcher}; "
        f"torch {escape(e.torch_version)}{escape(npu)}, python {e.python_version}"
    )


def render(run: RunResult, console: Console) -> None:
    """Print the header, the reference-shaped tables and the not-measured cases."""
    console.print(_header(run))
    meters = sorted({c.memory.meter for c in run.cases if c.memory is not None})
    noisy = any(c.timing is not None and c.timing.noisy for c in run.cases)
    print_tables([reference_table_data(t, run) for t in reference_tables(run)], console)
    notes = ["medians over repeats of the rank-max elapsed time"]
    if noisy:
        notes.append("* noisy: IQR/median > 10%")
    if meters:
        notes.append(
            "peak allocated: rank-max of one forward+backward pass ((fwd): forward only), parameters and "
            f"input included; meter {', '.join(meters)}"
        )
    for note in notes:
        console.print(note, style="dim")
    throughput = throughput_table(run)
    if throughput is not None:
        print_tables([throughput], console)
    missing = not_measured(run)
    if missing:
        t = Table(title="not measured", title_justify="left")
        t.add_column("case")
        t.add_column("status")
        t.add_column("reason", overflow="fold")
        for r in missing:
            style = "red" if r.status == "failed" else "yellow"
            t.add_row(escape(r.key), f"[{style}]{r.status}[/]", escape(r.error or ""))
        console.print(t)
    print_tables(verification_tables(run.verifications), console)


def run(result: str, *, console: Console | None = None) -> int:
    """Print `result`; UserError if it cannot be read."""
    render(load_result(result), console or default_console)
    return 0
