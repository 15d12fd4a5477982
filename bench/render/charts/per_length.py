"""The charts against global sequence length: time_vs_seq, throughput_vs_seq and memory_vs_seq (log length
axis; one panel per CP degree, or small multiples for several files)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from matplotlib.figure import Figure

from bench.judge import analysis
from bench.judge.analysis import PASS_LABELS, Variant
from bench.render.charts.axes import (
    BAR_CLIP,
    dodge,
    from_zero,
    log_values_axis,
    panel_figure,
    panel_grid,
    panel_title,
    token_axis,
)
from bench.render.charts.footnotes import finish
from bench.render.charts.sources import TIME_NOTE, Source, all_variants, lengths_at, ms, union
from bench.render.charts.style import mark_contended, off_scale_handles, series_style
from bench.results.store import CaseResult, RunResult


def _per_length(
    sources: Sequence[Source],
    scenario: str,
    *,
    value: Callable[[CaseResult], tuple[float, float, float]],
    ylabel: str,
    title: str,
    note: str,
    log_y: bool = True,
) -> Figure | str:
    """A value of every case vs global sequence length, log length axis (and log values, unless `log_y` is
    False: then linear from 0); `value` gives (y, distance down, distance up) of a case's bar. One file: rows
    = passes, a panel per CP degree, a series per mode. Several files: small multiples, a row per pass and CP
    degree and a panel per mode, whose series are the files (so no panel holds modes x files series)."""
    degrees = union(sources, lambda r: analysis.cps(r, scenario))
    if max((len(lengths_at(sources, scenario, cp)) for cp in degrees), default=0) < 2:
        return "needs at least two global sequence lengths at one CP degree"
    grid = panel_grid(sources, scenario, degrees)
    fig, axes = panel_figure(len(grid), len(grid[0]))
    for row, panels in enumerate(grid):
        for col, (pass_, cp, shown) in enumerate(panels):
            ax = axes[row][col]
            for i, s in enumerate(sources):
                for v in shown:
                    points = analysis.series(s.run, scenario, v, pass_, cp=cp)
                    if points:
                        ys = [value(r) for _, r in points]
                        xs = [n for n, _ in points]
                        style = series_style(i, v.mode)
                        ax.errorbar(
                            xs,
                            [y for y, _, _ in ys],
                            yerr=[[lo for _, lo, _ in ys], [hi for _, _, hi in ys]],
                            capsize=2,
                            **style,
                        )
                        mark_contended(
                            ax, xs, [y for y, _, _ in ys], [r for _, r in points], style["markersize"]
                        )
            token_axis(ax, lengths_at(sources, scenario, cp))
            if log_y:
                log_values_axis(ax)
            ax.set_title(panel_title(sources, shown, f"{PASS_LABELS[pass_]}, CP{cp}", ax), fontsize=9)
            ax.set_xlabel("global sequence length (tokens)")
            if col == 0:
                ax.set_ylabel(ylabel)
            ax.grid(True, which="major", alpha=0.3)
    marks = set() if log_y else from_zero(axes)
    finish(
        fig,
        title=title,
        scenario=scenario,
        sources=sources,
        variants=all_variants(sources, scenario),
        note=note + (f"; bars past {BAR_CLIP}x a row's largest point are cut at its top" if marks else ""),
        extra=off_scale_handles(marks),
    )
    return fig


def time_vs_seq(sources: Sequence[Source], scenario: str) -> Figure | str:
    return _per_length(
        sources,
        scenario,
        value=ms,
        ylabel="time (ms)",
        title="Time vs global sequence length",
        note=TIME_NOTE,
    )


def _tokens_per_s(result: CaseResult) -> tuple[float, float, float]:
    """Thousands of global tokens per second at the time `ms` gives, and the distances down and up to the
    rates at the ends of its bars."""
    ms_, down, up = ms(result)
    tokens = result.case.seq_len * result.case.batch  # per ms: thousands per second
    rate = tokens / ms_
    return rate, rate - tokens / (ms_ + up), tokens / (ms_ - down) - rate


def throughput_vs_seq(sources: Sequence[Source], scenario: str) -> Figure | str:
    return _per_length(
        sources,
        scenario,
        value=_tokens_per_s,
        ylabel="thousand tokens/s (all ranks)",
        title="Throughput vs global sequence length",
        note="throughput: global tokens (sequence x batch) / the time of the pass (as the time charts: the "
        "estimate; bars from its 95% interval across rounds); higher is better",
        log_y=False,
    )


def _memory_points(run: RunResult, scenario: str, v: Variant, cp: int) -> list[tuple[int, float]]:
    """(global length, peak MiB) of a variant: of the first of PREFERRED_PASSES that ran (training's)."""
    out = []
    for seq_len in analysis.seq_lens(run, scenario, cp):
        for pass_ in analysis.PREFERRED_PASSES:
            r = analysis.find(run, scenario, v, cp, seq_len, pass_)
            if r is not None and r.memory is not None:
                out.append((seq_len, r.memory.peak_mib))
                break
    return out


def memory_vs_seq(sources: Sequence[Source], scenario: str) -> Figure | str:
    """Peak memory vs global sequence length. One file: a panel per CP degree, a series per mode. Several
    files: small multiples, a row per CP degree and a panel per mode, whose series are the files."""
    degrees = union(sources, lambda r: analysis.cps(r, scenario))
    if not any(c.memory for s in sources for c in s.run.cases if c.case.scenario == scenario):
        return "no peak memory was measured"
    if max((len(lengths_at(sources, scenario, cp)) for cp in degrees), default=0) < 2:
        return "needs at least two global sequence lengths at one CP degree"
    variants = all_variants(sources, scenario)
    if len(sources) == 1:
        grid = [[(cp, variants) for cp in degrees]]
    else:
        grid = [[(cp, [v]) for v in variants] for cp in degrees]
    fig, axes = panel_figure(len(grid), len(grid[0]))
    for row, panels in enumerate(grid):
        for col, (cp, shown) in enumerate(panels):
            ax = axes[row][col]
            series = [
                (i, v)
                for i, s in enumerate(sources)
                for v in analysis.variants(s.run, scenario)
                if v in shown
            ]
            for k, (i, v) in enumerate(series):
                points = _memory_points(sources[i].run, scenario, v, cp)
                if points:
                    shift = dodge(k, len(series))
                    ax.plot([n * shift for n, _ in points], [m for _, m in points], **series_style(i, v.mode))
            token_axis(ax, lengths_at(sources, scenario, cp))
            log_values_axis(ax)
            ax.set_title(panel_title(sources, shown, f"CP{cp}", ax), fontsize=9)
            ax.set_xlabel("global sequence length (tokens)")
            if col == 0:
                ax.set_ylabel("peak allocated per rank (MiB)")
            ax.grid(True, alpha=0.3)
    meters = sorted({c.memory.meter for s in sources for c in s.run.cases if c.memory is not None})
    finish(
        fig,
        title="Peak memory vs global sequence length",
        scenario=scenario,
        sources=sources,
        variants=variants,
        note="peak allocated: rank-max of one forward+backward pass (forward where only forward ran), "
        f"parameters and input included; meter {', '.join(meters)}; series are nudged sideways (a few % of "
        "the length) so that equal peaks stay visible",
        timed=False,
    )
    return fig
