"""Every chart by its stable name (BUILDERS, TITLES), and the charts of a scenario, or of every scenario the
sources hold: each drawn from the sources that measured it, per machine unless forced."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from matplotlib.figure import Figure

from bench.judge import analysis
from bench.render.charts.ablation import checkpoint_summary, overlap_ablation
from bench.render.charts.chart import Chart
from bench.render.charts.communication import comm_vs_seq
from bench.render.charts.per_length import memory_vs_seq, throughput_vs_seq, time_vs_seq
from bench.render.charts.scaling import strong_scaling, weak_scaling
from bench.render.charts.sources import Source
from bench.results.store import RunResult

BUILDERS: dict[str, Callable[[Sequence[Source], str], Figure | str]] = {
    "time_vs_seq": time_vs_seq,
    "throughput_vs_seq": throughput_vs_seq,
    "weak_scaling": weak_scaling,
    "strong_scaling": strong_scaling,
    "memory_vs_seq": memory_vs_seq,
    "comm_vs_seq": comm_vs_seq,
    "checkpoint_summary": checkpoint_summary,
    "overlap_ablation": overlap_ablation,
}
"""Each chart's builder: (sources, scenario) -> its Figure, or the reason the results cannot support it."""
TITLES = {
    "time_vs_seq": "Time vs global sequence length",
    "throughput_vs_seq": "Throughput (tokens/s) vs global sequence length",
    "weak_scaling": "Weak scaling",
    "strong_scaling": "Strong scaling",
    "memory_vs_seq": "Peak memory vs global sequence length",
    "comm_vs_seq": "Communication (bytes per rank) vs global sequence length",
    "checkpoint_summary": analysis.CHECKPOINT.title,
    "overlap_ablation": analysis.OVERLAP.title,
}


def machine_of(run: RunResult) -> str:
    """The machine a run was timed on, as charts tell runs apart: host, CPU, device."""
    e = run.environment
    return f"{e.hostname} ({e.cpu_model}, {e.device_type} {e.device_name})"


def by_machine(sources: Sequence[Source]) -> list[list[Source]]:
    """The sources grouped by machine, in order of first appearance."""
    groups: dict[str, list[Source]] = {}
    for s in sources:
        groups.setdefault(machine_of(s.run), []).append(s)
    return list(groups.values())


def scenario_charts(
    sources: Sequence[Source], scenario: str, *, prefixed: bool = False, force: bool = False
) -> tuple[list[Chart], list[str]]:
    """Every chart of one scenario, drawn from the sources that measured it (others would only crowd the
    legend), and one note per chart skipped. `prefixed`: names start with `<scenario>-` (several
    scenarios share a folder). Runs of different machines never share an axis: each machine gets its own
    charts (named `-machine2`, ... after the first machine's), unless `force` overlays them."""
    present = [s for s in sources if scenario in analysis.scenario_names(s.run)]
    groups = [present] if force else by_machine(present)
    prefix = f"{scenario}-" if prefixed else ""
    charts, notes = [], []
    if len(groups) > 1:
        machines = "; ".join(f"{machine_of(g[0].run)}: {', '.join(s.label for s in g)}" for g in groups)
        notes.append(f"{scenario}: charts drawn per machine ({machines}); --force overlays them")
    for k, group in enumerate(groups):
        suffix = f"-machine{k + 1}" if k else ""
        for name, build in BUILDERS.items():
            figure = build(group, scenario)
            if isinstance(figure, str):
                notes.append(f"{prefix}{name}{suffix}: skipped, {figure} in {scenario}")
            else:
                title = f"{TITLES[name]} ({scenario}{', ' + machine_of(group[0].run) if suffix else ''})"
                charts.append(Chart(name=prefix + name + suffix, title=title, figure=figure))
    return charts, notes


def build_charts(sources: Sequence[Source], *, force: bool = False) -> tuple[list[Chart], list[str]]:
    """Every chart the sources support, per scenario (and machine, unless `force`), and one note per chart
    skipped (`name: reason`)."""
    scenarios = list(dict.fromkeys(n for s in sources for n in analysis.scenario_names(s.run)))
    charts, notes = [], []
    for scenario in scenarios:
        built, skipped = scenario_charts(sources, scenario, prefixed=len(scenarios) > 1, force=force)
        charts += built
        notes += skipped
    return charts, notes
