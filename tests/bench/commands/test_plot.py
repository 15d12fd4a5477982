"""`bench plot` on frozen result files: every chart renders to a valid PNG and SVG, series derive from the
right cases, charts the results cannot support are skipped with a note, several files overlay."""

from __future__ import annotations

import dataclasses
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from rich.console import Console

from bench.cli import main
from bench.commands import plot
from bench.judge import analysis
from bench.judge.analysis import Variant
from bench.judge.traffic import bytes_moved
from bench.render import charts
from bench.render.charts import BUILDERS, build_charts, sources_for
from bench.results.store import load_result, save_result
from gdn_cp.distributed import MODES
from tests.bench.multiround import in_rounds

FIXTURES = Path(__file__).parents[1] / "fixtures"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def plotted(tmp_path_factory) -> tuple[Path, str]:
    """`bench plot` of the scaling fixture, once for the module: (output folder, what it printed)."""
    out = tmp_path_factory.mktemp("plots")
    console = Console(width=200, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    assert plot.run([str(FIXTURES / "scaling.json")], out=str(out), console=console) == 0
    return out, console.export_text()


DRAWN = [name for name in BUILDERS if name != "overlap_ablation"]  # the fixture has no overlap cases


def test_every_chart_is_a_valid_png_and_svg(plotted):
    out, printed = plotted
    assert (
        "overlap_ablation: skipped, no p2p/all_gather/scan case ran with overlap both on and off" in printed
    )
    for name in DRAWN:
        png, svg = out / f"{name}.png", out / f"{name}.svg"
        assert png.read_bytes()[:8] == PNG_SIGNATURE, name
        root = ET.parse(svg).getroot()
        assert root.tag == "{http://www.w3.org/2000/svg}svg", name
        assert name in printed or str(png) in printed
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{n}.{x}" for n in DRAWN for x in ("png", "svg"))


def test_the_overlap_ablation_reads_pairs_that_differ_only_in_overlap(tmp_path):
    """p2p at cp 2 given overlap-on twins 10% slower in three rounds: the chart draws, each row pairs a case
    with its twin, the cost is +10% with an interval, and the scaling views keep the cases without it."""
    run = in_rounds(load_result(FIXTURES / "scaling.json"))
    twins = []
    for r in run.cases:
        if r.status == "ok" and r.case.mode == "p2p" and r.case.cp == 2:
            slower = [
                dataclasses.replace(g, samples_s=[[x * 1.1 for x in rank] for rank in g.samples_s])
                for g in r.rounds
            ]
            twins.append(
                dataclasses.replace(r, case=dataclasses.replace(r.case, overlap=True), rounds=slower)
            )
    run = dataclasses.replace(run, cases=[*run.cases, *twins])
    rows = analysis.ablation(run, analysis.OVERLAP)
    assert len(rows) == 4 and all(r.on.case == dataclasses.replace(r.off.case, overlap=True) for r in rows)
    assert all(r.time_cost_pct == pytest.approx(10.0) and not r.within_noise for r in rows)
    assert all(r.time_cost_interval_pct is not None for r in rows)
    assert len(analysis.ablation(run, analysis.CHECKPOINT)) == 5  # the overlap twins are not checkpoint rows
    found = analysis.find(run, "tiny-scaling", Variant("p2p", True), 2, 128, "forward")
    assert found is not None and not found.case.overlap
    charts, notes = build_charts(sources_for([run]))
    assert "overlap_ablation" in {c.name for c in charts} and not any("overlap" in n for n in notes)


def test_charts_are_titled_with_device_and_commit(plotted):
    out, _ = plotted
    run = load_result(FIXTURES / "scaling.json")
    svg = (out / "time_vs_seq.svg").read_text()
    # matplotlib writes text as paths, with the string in a comment above each
    assert "Time vs global sequence length · tiny-scaling" in svg
    assert f"cpu (x86_64, gloo) · {analysis.source_label(run)}" in svg
    assert "threads per rank cp1: 2, cp2: 1" in svg


def test_series_come_from_the_right_cases():
    run = load_result(FIXTURES / "scaling.json")
    assert analysis.variants(run, "tiny-scaling") == [Variant("ulysses", None), Variant("p2p", True)]
    assert analysis.strong_lengths(run, "tiny-scaling") == [64, 128]
    assert analysis.weak_lengths(run, "tiny-scaling") == [32, 64]  # declared local_seq_len, at cp 1 and 2
    (one, two) = analysis.weak_scaling(run, "tiny-scaling", Variant("p2p", True), "forward", local_seq_len=32)
    assert (one.seq_len, two.seq_len) == (32, 64)
    expected = run.get("tiny-scaling/p2p-ckpt-cp1-T32-fwd").timing.median_s / (
        run.get("tiny-scaling/p2p-ckpt-cp2-T64-fwd").timing.median_s
    )
    assert two.ratio == pytest.approx(expected)
    rows = analysis.ablation(run, analysis.CHECKPOINT)
    assert [(r.cp, r.seq_len, r.mode, r.pass_) for r in rows] == [
        (1, 32, "p2p", "forward_backward"),
        (1, 64, "p2p", "forward_backward"),
        (1, 128, "p2p", "forward_backward"),
        (2, 64, "p2p", "forward_backward"),
        (2, 128, "p2p", "forward_backward"),
    ]
    off = run.get("tiny-scaling/p2p-nockpt-cp2-T128-fwd_bwd")
    on = run.get("tiny-scaling/p2p-ckpt-cp2-T128-fwd_bwd")
    assert rows[-1].memory_saved_mib == pytest.approx(off.memory.peak_mib - on.memory.peak_mib)
    assert rows[-1].time_cost_pct == pytest.approx(100 * (on.timing.median_s / off.timing.median_s - 1))


def test_charts_the_results_cannot_support_are_skipped_with_a_note(tmp_path, capsys):
    # ablation.json: one sequence length (no time/memory vs length), no weak-scaling sweep
    assert main(["plot", str(FIXTURES / "ablation.json"), "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    drawn = sorted(p.stem for p in tmp_path.glob("*.png"))
    assert drawn == ["checkpoint_summary", "comm_vs_seq", "strong_scaling"]
    assert "time_vs_seq: skipped, needs at least two global sequence lengths at one CP degree" in printed
    assert "weak_scaling: skipped, no weak-scaling sweep (local_seq_len)" in printed
    assert "memory_vs_seq: skipped" in printed


def test_several_files_overlay_as_labelled_series(tmp_path):
    runs = [load_result(FIXTURES / "scaling.json"), load_result(FIXTURES / "ablation.json")]
    sources = sources_for(runs)
    assert [s.label for s in sources] == [analysis.source_label(r) for r in runs]
    label = analysis.source_label(runs[0])
    twice = [s.label for s in sources_for([runs[0], runs[0]])]
    assert twice == [f"{label} (tiny-scaling, 1)", f"{label} (tiny-scaling, 2)"]
    charts, notes = build_charts(sources)  # two scenarios: charts are named per scenario
    names = {c.name for c in charts}
    assert "tiny-scaling-time_vs_seq" in names and "tiny-ablation-strong_scaling" in names
    assert any(n.startswith("tiny-ablation-weak_scaling: skipped") for n in notes)
    legend = charts[0].figure.legends[0]
    assert [t.get_text() for t in legend.get_texts()][:2] == ["ulysses", "p2p"]


def test_nothing_to_plot_is_a_user_error(tmp_path, capsys):
    broken = load_result(FIXTURES / "ablation.json")
    for c in broken.cases:
        c.status = "failed"
    save_result(broken, tmp_path / "failed.json")
    assert main(["plot", str(tmp_path / "failed.json"), "--out", str(tmp_path / "p")]) == 1
    assert "no case is ok, nothing to plot" in capsys.readouterr().err


def test_without_out_the_charts_go_to_a_new_folder_never_the_committed_one(suite_dir: Path, capsys):
    (suite_dir / "plots").mkdir()
    (suite_dir / "plots" / "time_vs_seq.png").write_bytes(b"committed")
    result = str(FIXTURES / "ablation.json")
    assert main(["plot", result]) == 0 and main(["plot", result]) == 0  # twice, within a second or not
    folders = sorted(p.name for p in (suite_dir / "runs").iterdir())
    assert len(folders) == 2 and all(f.startswith("plots-") for f in folders), folders
    for folder in folders:
        assert sorted(p.stem for p in (suite_dir / "runs" / folder).glob("*.png")) == [
            "checkpoint_summary",
            "comm_vs_seq",
            "strong_scaling",
        ]
    assert f"runs/{folders[0]}/strong_scaling.png" in capsys.readouterr().out
    assert sorted(p.name for p in (suite_dir / "plots").iterdir()) == ["time_vs_seq.png"]  # untouched
    # named, the committed folder is written (how the README's charts are regenerated)
    assert main(["plot", result, "--out", "plots"]) == 0
    assert (suite_dir / "plots" / "strong_scaling.svg").is_file()


def test_out_an_existing_file_is_refused_before_drawing(suite_dir: Path, capsys):
    (suite_dir / "charts.png").write_bytes(b"not a folder")
    assert main(["plot", str(FIXTURES / "ablation.json"), "--out", "charts.png"]) == 1
    err = capsys.readouterr().err
    assert (
        err == "error: --out charts.png: is a file; give a folder for the charts (it is created if missing)\n"
    )
    assert (suite_dir / "charts.png").read_bytes() == b"not a folder"


def test_memory_series_that_coincide_stay_apart():
    """Equal peaks (the modes with a summary peak alike) are nudged sideways, centred on the true length,
    so that no series hides another; the values themselves are untouched."""
    run = load_result(FIXTURES / "scaling.json")
    fig = BUILDERS["memory_vs_seq"](sources_for([run]), "tiny-scaling")
    lines = [line for line in fig.axes[0].get_lines() if len(line.get_xdata())]
    assert len(lines) == 2
    (x_a, y_a), (x_b, _) = ((list(line.get_xdata()), list(line.get_ydata())) for line in lines)
    lengths = analysis.seq_lens(run, "tiny-scaling", 1)
    for a, b, n in zip(x_a, x_b, lengths, strict=True):
        assert a < n < b and a * b == pytest.approx(n * n)  # apart, and centred on the true length
    expected = [
        analysis.find(run, "tiny-scaling", Variant("ulysses", None), 1, n, "forward_backward")
        for n in lengths
    ]
    assert y_a == [r.memory.peak_mib for r in expected]


def test_throughput_is_tokens_per_second_of_the_median():
    run = load_result(FIXTURES / "scaling.json")
    fig = BUILDERS["throughput_vs_seq"](sources_for([run]), "tiny-scaling")
    assert fig.axes[0].get_ylabel() == "thousand tokens/s (all ranks)"
    lengths = analysis.seq_lens(run, "tiny-scaling", 1)
    ulysses = [analysis.find(run, "tiny-scaling", Variant("ulysses", None), 1, n, "forward") for n in lengths]
    line = next(line for line in fig.axes[0].get_lines() if len(line.get_xdata()) == len(lengths))
    expected = [r.case.seq_len * r.case.batch / r.timing.median_s / 1e3 for r in ulysses]
    assert list(line.get_ydata()) == pytest.approx(expected)
    assert fig.axes[0].get_ylim()[0] == 0  # rates: a linear axis from 0


def test_communication_chart_shows_each_modes_bytes_per_rank():
    """One line per mode at every CP degree > 1 (one rank moves nothing), from the communication model."""
    run = load_result(FIXTURES / "scaling.json")
    fig = BUILDERS["comm_vs_seq"](sources_for([run, run]), "tiny-scaling")  # a file twice: one line each
    assert [ax.get_title() for ax in fig.axes] == ["forward, CP2", "forward+backward, CP2"]
    lines = [line for line in fig.axes[1].get_lines() if len(line.get_xdata())]
    assert len(lines) == 2  # ulysses, p2p: not once per file
    p2p = analysis.find(run, "tiny-scaling", Variant("p2p", True), 2, 128, "forward_backward")
    assert bytes_moved(p2p.case) / 2**20 in list(lines[1].get_ydata())
    single = load_result(FIXTURES / "ablation.json")
    one_rank = dataclasses.replace(single, cases=[c for c in single.cases if c.case.cp == 1])
    assert BUILDERS["comm_vs_seq"](sources_for([one_rank]), "tiny-ablation").startswith("no case ran on more")


def test_every_registered_mode_has_a_style_of_its_own():
    """Issue 24: how a chart draws a mode is bench's (the library knows nothing of matplotlib)."""
    styles = [charts.mode_style(m) for m in MODES]
    assert len(charts.MODE_STYLES) == len(MODES) and len(set(styles)) == len(MODES)
    assert charts.mode_style("ring") == charts.UNKNOWN_MODE_STYLE


def test_runs_of_different_machines_never_share_an_axis():
    """Two runs, one from another machine: each machine gets its charts (the second's named -machine2), one
    note says so; --force overlays them on one axis."""
    run = load_result(FIXTURES / "scaling.json")
    other = dataclasses.replace(run, environment=dataclasses.replace(run.environment, hostname="elsewhere"))
    charts, notes = build_charts(sources_for([run, other]))
    names = [c.name for c in charts]
    assert "strong_scaling" in names and "strong_scaling-machine2" in names
    assert any("charts drawn per machine" in n and "elsewhere" in n for n in notes)
    assert len(charts) == 2 * len(build_charts(sources_for([run]))[0])

    def source_entries(chart) -> list[str]:  # a legend names the sources only when it overlays several
        return [t.get_text() for t in chart.figure.legends[0].get_texts() if "main@" in t.get_text()]

    assert source_entries(next(c for c in charts if c.name == "strong_scaling")) == []
    forced, _ = build_charts(sources_for([run, other]), force=True)
    assert not any(c.name.endswith("-machine2") for c in forced)
    assert len(source_entries(next(c for c in forced if c.name == "strong_scaling"))) == 2


def test_overlays_are_small_multiples_a_panel_per_mode():
    """Two files: time vs length is a row per pass and CP degree and a panel per mode, each panel holding
    one mode's series of both files (never modes x files series on one axis)."""
    run = load_result(FIXTURES / "scaling.json")
    other = dataclasses.replace(run, environment=dataclasses.replace(run.environment, git_commit="b" * 40))
    figure = charts.time_vs_seq(sources_for([run, other]), "tiny-scaling")
    variants = analysis.variants(run, "tiny-scaling")
    rows = len(analysis.passes(run, "tiny-scaling")) * len(analysis.cps(run, "tiny-scaling"))
    assert len(figure.axes) == rows * len(variants)
    for ax in figure.axes:
        mode = ax.get_title().split(",")[0]  # "p2p, forward, CP1" (or over two lines)
        assert mode in {v.label for v in variants}
        series = [line for line in ax.get_lines() if line.get_linestyle() not in ("None", "")]  # not caps
        assert len(series) == 2  # one series a file
