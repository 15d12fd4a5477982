"""A run as `bench show` prints it: the header (name, commit, machine, command), the reference PR's
tables, the flags a reader must see (contended, incomplete), the notes that say what the numbers are,
throughput, packed documents, the cases not measured and the `bench verify` tables; for the terminal
(`render`) and as a markdown document (`markdown`). `bench run` prints the same at its end."""

from __future__ import annotations

import shlex

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench.errors import first_line
from bench.formats import (
    CASE_LINE_LEGEND,
    contention_label,
    contention_summary,
    incomplete_summary,
    mostly_contended,
)
from bench.judge.reference import not_measured, reference_tables
from bench.render.document import Paragraph, Section, document_blocks, render_markdown
from bench.render.tables import (
    TableData,
    documents_table,
    print_tables,
    reference_table_data,
    throughput_table,
)
from bench.render.verification import verification_tables
from bench.results.store import RunResult


def header_lines(run: RunResult) -> list[str]:
    """The run in plain text: name, date, branch and commit; device, host and software; the command."""
    e = run.environment
    commit = e.git_commit[:8] + (" (dirty)" if e.git_dirty else "")
    npu = f", torch-npu {e.torch_npu_version}" if e.torch_npu_version else ""
    threads = sorted({c.threads_per_rank for c in run.cases if c.threads_per_rank is not None})
    configured = "" if e.threads_per_rank is None else " (configured)"
    used = "/".join(map(str, threads)) + configured if threads else "-"
    lines = [
        f"{run.name}  {run.created_at}  {e.git_branch} @ {commit}",
        f"{e.device_type} ({e.device_name}, {e.backend}) on {e.hostname}: {e.cpu_model}, {e.cpu_count} "
        f"cores; threads per rank {used}; launcher {e.launcher}; torch {e.torch_version}{npu}, python "
        f"{e.python_version}",
    ]
    if run.command is not None:
        lines.append(f"command: {shlex.join(run.command)}")
    return lines


def notes(run: RunResult) -> list[str]:
    """The lines under the reference tables: what the numbers are."""
    meters = sorted({c.memory.meter for c in run.cases if c.memory is not None})
    out = [
        "a round's time: the median over repeats of the rank-max elapsed time; a case's: the estimate above"
    ]
    if any(c.timing is not None and c.timing.noisy for c in run.cases):
        out.append("* noisy: IQR/median > 10%")
    if meters:
        out.append(
            "peak allocated: rank-max of one forward+backward pass (a peak tagged fwd or prefill: of that "
            f"pass), parameters and input included; meter {', '.join(meters)}"
        )
    if any(c.timing is not None and len(c.timing.rank_medians_s) > 1 for c in run.cases):
        out.append(CASE_LINE_LEGEND)  # `bench run` prints its status lines just above these tables
    return out


def render(run: RunResult, console: Console) -> None:
    """Print the header, the reference-shaped tables and the not-measured cases."""
    first, *rest = header_lines(run)
    console.print(
        "\n".join([f"[bold]{escape(run.name)}[/]{escape(first[len(run.name) :])}", *map(escape, rest)])
    )
    print_tables([reference_table_data(t, run) for t in reference_tables(run)], console)
    shared = contention_summary(run)
    if shared is not None:
        console.print(f"[bold yellow]{contention_label(run)}[/]: {escape(shared)}")
    short = incomplete_summary(run)
    if short is not None:
        console.print(f"[bold yellow]incomplete[/]: {escape(short)}")
    for note in notes(run):
        console.print(note, style="dim")
    extra = [throughput_table(run), documents_table(run)]
    print_tables([t for t in extra if t is not None], console)
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


def markdown(run: RunResult) -> str:
    """The same tables as `render`, as a markdown document (bench.render.document)."""
    reference = [reference_table_data(t, run) for t in reference_tables(run)]
    if reference:
        reference[-1].notes += notes(run)
    extra = [throughput_table(run), documents_table(run)]
    missing = [[r.key, r.status, first_line(r.error)] for r in not_measured(run)]
    tables = [
        *reference,
        *(t for t in extra if t is not None),
        *(
            [TableData(title="not measured", headers=["case", "status", "reason"], rows=missing)]
            if missing
            else []
        ),
        *verification_tables(run.verifications),
    ]
    shared = contention_summary(run)
    blocks = [Paragraph(text=line) for line in header_lines(run)[1:]]
    blocks += [Paragraph(text=f"{contention_label(run).upper()}: {shared}")] if shared else []
    short = incomplete_summary(run)
    blocks += [Paragraph(text=f"INCOMPLETE: {short}")] if short else []
    blocks += document_blocks(tables)
    title = header_lines(run)[0] + (" (mostly contended)" if mostly_contended(run.cases) else "")
    return render_markdown(title, [Section(title="results", blocks=blocks)], charts=None)
