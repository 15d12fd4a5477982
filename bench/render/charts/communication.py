"""comm_vs_seq: the bytes the busiest rank sends and receives in one pass, per mode, against global sequence
length, a panel per (pass, CP degree > 1), from the communication model (bench.judge.traffic). Several
files make one series a mode (the model's bytes depend on the case alone); the title names each file."""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure

from bench.judge import analysis
from bench.judge.analysis import PASS_LABELS, Variant
from bench.judge.traffic import bytes_moved
from bench.render.charts.axes import dodge, log_values_axis, panel_figure, token_axis
from bench.render.charts.footnotes import finish
from bench.render.charts.sources import Source, lengths_at, passes, union
from bench.render.charts.style import series_style
from gdn_cp.distributed import mode_order


def _bytes_by_mode(
    sources: Sequence[Source], scenario: str, pass_: str, cp: int
) -> dict[str, dict[int, float]]:
    """mode -> {global length: MiB moved by the busiest rank}, over every source's cases (the model's
    bytes depend on the case, not on the run: equal cases of several files give one point)."""
    out: dict[str, dict[int, float]] = {}
    for s in sources:
        for v in analysis.variants(s.run, scenario):
            for n, r in analysis.series(s.run, scenario, v, pass_, cp=cp):
                out.setdefault(v.mode, {})[n] = bytes_moved(r.case) / 2**20
    return out


def comm_vs_seq(sources: Sequence[Source], scenario: str) -> Figure | str:
    degrees = [cp for cp in union(sources, lambda r: analysis.cps(r, scenario)) if cp > 1]
    if not degrees:
        return "no case ran on more than one rank (one rank moves nothing)"
    passes_ = passes(sources, scenario)
    fig, axes = panel_figure(len(passes_), len(degrees))
    modes: list[str] = []
    for row, pass_ in enumerate(passes_):
        for col, cp in enumerate(degrees):
            ax = axes[row][col]
            by_mode = _bytes_by_mode(sources, scenario, pass_, cp)
            modes += [m for m in by_mode if m not in modes]
            for k, (mode, points) in enumerate(by_mode.items()):
                lengths = sorted(points)
                shift = dodge(k, len(by_mode))
                ax.plot([n * shift for n in lengths], [points[n] for n in lengths], **series_style(0, mode))
            token_axis(ax, lengths_at(sources, scenario, cp))
            log_values_axis(ax)
            ax.set_title(f"{PASS_LABELS[pass_]}, CP{cp}", fontsize=9)
            ax.set_xlabel("global sequence length (tokens)")
            if col == 0:
                ax.set_ylabel("sent + received per rank (MiB)")
            ax.grid(True, alpha=0.3)
    finish(
        fig,
        title="Communication vs global sequence length",
        scenario=scenario,
        sources=[s for s in sources if any(cp > 1 for cp in analysis.cps(s.run, scenario))],
        variants=[Variant(m, None) for m in sorted(modes, key=mode_order)],
        note="bytes sent + received by the busiest rank in one pass, from gdn_cp.distributed.comm_model "
        "(equal to the bytes counted on the wire: `bench profile` checks them); one line per mode over "
        "every file's cases (a case's bytes do not depend on the run), the summary checkpoint moves no other "
        "bytes; series nudged sideways a few % so that equal lines show",
        timed=False,
        files_apart=False,
    )
    return fig
