"""What every chart carries around its panels: the title (chart, scenario, device and commits, and the
MOSTLY CONTENDED warning), the legend outside the panels, and the footnote (each file's host, threads,
software, layer and repeats, its INCOMPLETE flag, and the chart's note), wrapped to the figure's width."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from bench.formats import contended_cases, incomplete_summary, mostly_contended
from bench.judge import analysis
from bench.judge.analysis import Variant
from bench.render.charts.sources import Source
from bench.render.charts.style import SOURCE_LINES, contended_handle, mode_style


def identity(sources: Sequence[Source], *, apart: bool = True) -> str:
    """Second title line: the device(s) and the commit(s): `a vs b` where the chart tells the files apart,
    `a, b` where their cases make one series (`apart` False)."""
    devices = list(
        dict.fromkeys(
            f"{s.run.environment.device_type} ({s.run.environment.device_name}, {s.run.environment.backend})"
            for s in sources
        )
    )
    return f"{' / '.join(devices)} · {(' vs ' if apart else ', ').join(s.label for s in sources)}"


def footer(sources: Sequence[Source], scenario: str, note: str) -> str:
    lines = []
    for s in sources:
        e = s.run.environment
        repeats = sorted({c.case.repeat for c in s.run.cases if c.case.scenario == scenario})
        prefix = f"{s.label}: " if len(sources) > 1 else ""
        lines.append(
            f"{prefix}host {e.hostname}: {e.cpu_model}, {e.cpu_count} cores; "
            f"threads per rank {analysis.threads_by_cp(s.run, scenario)}; torch {e.torch_version}"
            + (f", torch-npu {e.torch_npu_version}" if e.torch_npu_version else "")
            + f"; layer {analysis.describe_layer(s.run.scenarios.get(scenario, {}))}; "
            f"repeats {'/'.join(map(str, repeats))}"
        )
        short = incomplete_summary(s.run)
        if short is not None:  # the flag every view carries (bench.formats)
            lines.append(f"{prefix}INCOMPLETE: {short}")
    lines.append(note)
    return "\n".join(lines)


FOOTER_PT = 8.0
"""The footnote's size: as large as the legend's, readable in the PNG at its dpi (6.5 pt read as ~7 px)."""
FOOTER_CHARS_PER_INCH = 18
"""Characters of the FOOTER_PT footer per inch of figure width (DejaVu Sans: about half a point of width
per point of size a character)."""


def finish(
    fig: Figure,
    *,
    title: str,
    scenario: str,
    sources: Sequence[Source],
    variants: Sequence[Variant],
    note: str,
    extra: Sequence[Line2D | Patch] = (),
    bars: bool = False,
    timed: bool = True,
    files_apart: bool = True,
) -> None:
    """Title (chart, scenario, device and every file drawn; on a chart of times (`timed`), MOSTLY CONTENDED
    first when more than half of the scenario's cases were timed on a shared machine), legend outside the
    panels, footer under them. Bytes and peak memory do not depend on what else ran: their charts are not
    marked. `files_apart`: the series' line styles tell the files apart (the legend names each style);
    False where the panels' titles name the file, or the files' cases make one series."""
    cases = [c for s in sources for c in s.run.cases if c.case.scenario == scenario]
    shared, measured = contended_cases(cases) if timed else (0, 0)
    warning = "MOSTLY CONTENDED: timed on a shared machine\n" if timed and mostly_contended(cases) else ""
    fig.suptitle(f"{warning}{title} · {scenario}\n{identity(sources, apart=files_apart)}", fontsize=11)
    handles: list[Line2D | Patch] = []
    for v in variants:
        color = mode_style(v.mode)[0]
        if bars:
            handles.append(Patch(facecolor=color, label=v.label))
        else:
            handles.append(Line2D([], [], color=color, marker=mode_style(v.mode)[1], label=v.label))
    if len(sources) > 1 and files_apart:
        for i, s in enumerate(sources):
            handles.append(
                Line2D([], [], color="gray", linestyle=SOURCE_LINES[i % len(SOURCE_LINES)], label=s.label)
            )
    handles += extra
    if shared and not bars:
        handles.append(contended_handle(f"contended ({shared} of {measured})"))
    checkpointed = [v.mode for v in variants if v.checkpoint]
    if checkpointed and not bars:
        note += f"; {', '.join(checkpointed)}: summary checkpoint on"
    # centred on the right: the title spans the figure, and an upper legend would sit under its end
    fig.legend(handles=handles, loc="outside right center", fontsize=8, frameon=False)
    # Wrapped to the figure's width: saved with a tight box, a longer line would widen the image with
    # empty space beside the panels.
    width = max(60, int(fig.get_figwidth() * FOOTER_CHARS_PER_INCH))
    text = "\n".join(
        textwrap.fill(line, width, subsequent_indent="  ")
        for line in footer(sources, scenario, note).split("\n")
    )
    fig.text(0.0, 0.0, text, fontsize=FOOTER_PT, color="dimgray", va="top", ha="left")
