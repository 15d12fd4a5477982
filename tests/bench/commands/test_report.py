"""`bench report` on frozen result files: markdown content (reference-shaped tables, ablation deltas, scaling
efficiency, environment, chart links) and a self-contained HTML file; sections are extensible."""

from __future__ import annotations

import dataclasses
import io
import os
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from rich.console import Console

from bench.cli import main
from bench.commands import report as report_command
from bench.formats import format_mib, format_ms, format_time
from bench.judge import analysis
from bench.judge.analysis import Variant
from bench.measure.statistics import estimate, format_ratio
from bench.render import report
from bench.render.charts import BUILDERS
from bench.render.document import (
    Folded,
    Image,
    MarkdownCharts,
    Paragraph,
    Section,
    Table,
    markdown_table,
    markdown_text,
    render_html,
    render_markdown,
)
from bench.render.report_run import report_runs
from bench.results.store import load_result
from tests.bench.multiround import in_rounds

FIXTURES = Path(__file__).parents[1] / "fixtures"
QUIET = Console(file=open(os.devnull, "w"))  # noqa: SIM115


@pytest.fixture(scope="module")
def markdown(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("report") / "baseline.md"
    assert report_command.run([str(FIXTURES / "scaling.json")], out=str(out), console=QUIET) == 0
    return out, out.read_text()


def test_markdown_has_the_seed_shaped_tables(markdown):
    _, text = markdown
    run = load_result(FIXTURES / "scaling.json")
    assert text.startswith(f"# gdn-cp-bench: tiny-scaling ({analysis.source_label(run)})\n")
    headings = ["## Overview", "## Scenario tiny-scaling", "### Results", "### Ablations"]
    for heading in [*headings, "### Scaling efficiency", "### Charts", "## Environment"]:
        assert f"\n{heading}\n" in text
    assert "**tiny-scaling: CP2 (hidden 32, K/V heads 2/4, head dims 8/8, fp32, batch 1)**" in text
    header = "| global seq | mode | summary ckpt | forward | forward+backward | peak allocated |"
    assert text.count(header) == 2  # CP1 and CP2
    fwd = run.get("tiny-scaling/p2p-ckpt-cp2-T128-fwd")
    fwd_bwd = run.get("tiny-scaling/p2p-ckpt-cp2-T128-fwd_bwd")
    cells = ["128", "p2p", "on", format_time(fwd), format_time(fwd_bwd), format_mib(fwd_bwd.memory)]
    assert "| " + " | ".join(markdown_text(c) for c in cells) + " |" in text


def test_markdown_ablation_rows_carry_the_deltas(markdown):
    _, text = markdown
    run = load_result(FIXTURES / "scaling.json")
    off = run.get("tiny-scaling/p2p-nockpt-cp2-T128-fwd_bwd")
    on = run.get("tiny-scaling/p2p-ckpt-cp2-T128-fwd_bwd")
    cost = 100 * (on.timing.median_s / off.timing.median_s - 1)
    delta = on.memory.peak_mib - off.memory.peak_mib
    columns = "cp | global seq | mode | implementation | forward+backward | peak allocated | time | memory"
    assert f"| {columns} |" in text
    off_ms = markdown_text(format_time(off))
    assert f"| 2 | 128 | p2p | graph kept | {off_ms} | {format_mib(off.memory)} |  |  |" in text
    checkpoint_row = (
        f"| 2 | 128 | p2p | checkpoint | {markdown_text(format_time(on))} | {format_mib(on.memory)} "
        f"| {cost:+.1f}% | {delta:+.1f} MiB |"
    )
    assert checkpoint_row in text


def test_markdown_scaling_efficiency(markdown):
    _, text = markdown
    run = load_result(FIXTURES / "scaling.json")
    title = (
        "tiny-scaling, forward+backward: strong scaling, speedup t(cp=1)/t(cp) [95% interval] (efficiency = "
        "speedup / cp)"
    )
    assert f"**{title}**" in text
    (_, two) = analysis.strong_scaling(
        run, "tiny-scaling", Variant("ulysses", None), "forward_backward", seq_len=128
    )
    assert f"| {two.ratio:.2f}x ({100 * two.ratio / 2:.0f}%) |" in text
    (_, weak) = analysis.weak_scaling(run, "tiny-scaling", Variant("p2p", True), "forward", local_seq_len=32)
    assert f"| {100 * weak.ratio:.0f}% |" in text  # one round a side: no interval
    assert "| per rank | mode | t(cp=1) | CP2 |" in text


def test_markdown_environment_and_chart_links(markdown):
    out, text = markdown
    assert "| files | device | host | threads per rank | launcher | software |" in text
    assert (
        "| #1 | cpu (x86_64, gloo) | vm: Intel(R) Xeon(R) Processor, 2 cores | cp1: 2, cp2: 1 (cores // "
        in text
    )
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert links == [f"baseline-charts/{name}.png" for name in BUILDERS if name != "overlap_ablation"]
    for link in links:
        png = out.parent / link
        assert png.read_bytes()[:4] == b"\x89PNG" and png.with_suffix(".svg").is_file()


class _Refs(HTMLParser):
    """Every src/href of a page, and whether it has <link>/<script src> (external resources)."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.refs += [v or "" for k, v in attrs if k in ("src", "href")]


def test_html_is_one_self_contained_file(tmp_path, capsys):
    out = tmp_path / "report.html"
    assert main(["report", str(FIXTURES / "ablation.json"), "--out", str(out)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]  # no chart files beside it
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    parser = _Refs()
    parser.feed(page)
    assert parser.refs and all(r.startswith("data:image/png;base64,") for r in parser.refs)
    assert "link" not in parser.tags and "script" not in parser.tags
    assert "<h3>Ablations</h3>" in page and '<th class="left">implementation</th>' in page
    assert "graph kept" in page and "<h2>Not measured</h2>" in page  # the fixture's failed case
    assert "MemoryError: injected: out of memory on rank" in page


def test_report_to_stdout_and_format_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    buf = io.StringIO()
    assert report_command.run([str(FIXTURES / "ablation.json")], stdout=buf, charts="c", console=QUIET) == 0
    assert (
        buf.getvalue().startswith("# gdn-cp-bench: tiny-ablation")
        and "](c/strong_scaling.png)" in buf.getvalue()
    )
    assert main(["report", str(FIXTURES / "ablation.json"), "--out", "r.txt"]) == 1
    assert main(["report", str(FIXTURES / "ablation.json"), "--format", "html", "--charts", "c"]) == 1


def test_a_section_is_added_by_one_builder():
    paths = [FIXTURES / "ablation.json"]
    runs = report_runs([load_result(p) for p in paths], paths)

    def accuracy(rs):
        return Section(title="Accuracy", blocks=[Paragraph(text=f"{len(rs)} run checked")])

    without_charts = [b for b in report.SECTIONS if b is not report.scenarios]
    _, sections = report.build_report(runs, sections=[*without_charts, accuracy])
    assert [s.title for s in sections][-1] == "Accuracy"
    text = render_markdown("t", sections, charts=None)  # no image block: no chart folder needed
    assert "## Accuracy\n\n1 run checked" in text


def test_markdown_escaping():
    assert markdown_text("all_gather _x_ a|b 1.2 ms * <0.001 ~ `a_b|c`") == (
        "all_gather \\_x\\_ a\\|b 1.2 ms \\* \\<0.001 \\~ `a_b|c`"
    )
    assert (
        markdown_table(Table(columns=["a", "b"], rows=[["x", "1"]]))
        == "| a | b |\n| :--- | ---: |\n| x | 1 |"
    )


def test_markdown_without_out_puts_its_charts_in_a_new_folder(suite_dir: Path, capsys):
    (suite_dir / "plots").mkdir()  # the committed charts: written only when named
    assert main(["report", str(FIXTURES / "ablation.json")]) == 0
    captured = capsys.readouterr()
    (folder,) = (suite_dir / "runs").iterdir()
    assert folder.name.startswith("plots-") and (folder / "strong_scaling.png").is_file()
    assert f"](runs/{folder.name}/strong_scaling.png)" in captured.out
    assert list((suite_dir / "plots").iterdir()) == []
    assert main(["report", str(FIXTURES / "ablation.json"), "--charts", "plots"]) == 0
    assert (suite_dir / "plots" / "strong_scaling.png").is_file()
    # bad paths: one line, before anything is drawn
    assert main(["report", str(FIXTURES / "ablation.json"), "--out", "runs"]) == 1
    assert "--out runs: is a folder; give the report's file name" in capsys.readouterr().err
    assert main(["report", str(FIXTURES / "ablation.json"), "--charts", "bench.yaml"]) == 1
    assert "--charts bench.yaml: is a file; give a folder for the charts" in capsys.readouterr().err


def _built(paths: list[Path]) -> tuple[str, list[Section]]:
    return report.build_report(report_runs([load_result(p) for p in paths], paths))


def _titles(sections: list[Section]) -> list[str]:
    return [s.title for s in sections]


def test_many_files_read_well(tmp_path):
    """Timing runs of two scenarios and a verify file: a short title, one section per scenario whose charts
    hold only its own runs, the verify file in the accuracy section (not as a run of 0 cases), one
    environment row per distinct machine."""
    paths = [FIXTURES / "scaling.json", FIXTURES / "ablation.json", FIXTURES / "verify.json"]
    title, sections = _built(paths)
    labels = list(dict.fromkeys(analysis.source_label(load_result(p)) for p in paths))
    commits = ", ".join(labels[:2]) + (f" +{len(labels) - 2} more" if len(labels) > 2 else "")
    assert title == f"gdn-cp-bench: tiny-scaling, tiny-ablation; verify tiny-ablation ({commits})"
    assert _titles(sections) == [
        "Overview",
        "Scenario tiny-scaling",
        "Scenario tiny-ablation",
        "Accuracy (bench verify)",
        "Not measured",
        "Environment",
    ]
    overview = sections[0].blocks[0]
    assert [row[2] for row in overview.rows] == ["timing", "timing", "verify"]
    assert overview.rows[2][-1] == "3 checks: 3 pass" and "cases" not in overview.rows[2][-1]
    scaling = sections[1]
    charts = next(s for s in scaling.subsections if s.title == "Charts")
    images = [b for b in charts.blocks if isinstance(b, Image)]
    assert images and all(i.chart.name.startswith("tiny-scaling-") for i in images)
    # one series source per chart: the ablation run measured another scenario, so it is not in the legend
    legend = [t.get_text() for t in images[0].chart.figure.legends[0].get_texts()]
    assert not any("tiny-ablation" in t for t in legend)
    (accuracy,) = sections[3].subsections
    assert accuracy.title.startswith("#3 ") and accuracy.title.endswith(": tiny-ablation")
    environment = sections[-1].blocks[0]
    assert len(environment.rows) == 2 and environment.rows[1][0] == "#3"  # both runs share threads: one row
    text = render_markdown(title, sections, MarkdownCharts(folder=tmp_path / "c", relative_to=tmp_path))
    assert text.count("\n## ") == 6 and "### Charts" in text


def test_base_vs_head_sets_verdicts_beside_the_accuracy_checks():
    """Two timing runs sharing cases: the timing verdicts and the checks of the head commit's verify file,
    judged as `bench gate` judges them."""
    paths = [FIXTURES / "ablation.json", FIXTURES / "ablation.json", FIXTURES / "verify.json"]
    runs = [in_rounds(load_result(p)) for p in paths]
    head_env = dataclasses.replace(runs[1].environment, git_commit="b" * 40, git_dirty=False)
    runs[1] = dataclasses.replace(runs[1], environment=head_env)
    runs[2] = dataclasses.replace(runs[2], environment=head_env)  # head's checks
    _, sections = report.build_report(report_runs(runs, paths))
    section = next(s for s in sections if s.title == "Base vs head")
    tables = [b for b in section.blocks if isinstance(b, Table)]
    titles = ["timing: base vs head, tiny-ablation", "accuracy: bench verify, layer/tiny-ablation"]
    assert [t.title for t in tables] == titles
    assert {row[-1] for row in tables[0].rows} == {"~"}  # the same times on both sides, in 3 rounds
    assert [row[1:3] for row in tables[1].rows] == [["-", "pass"]] * 3  # no check of base's commit
    verdict = section.blocks[-1].text
    assert (
        verdict.startswith("As `bench gate` would judge it: pass; timing: ") and "3 checks on head" in verdict
    )


def test_no_base_vs_head_without_shared_cases():
    _, sections = _built([FIXTURES / "scaling.json", FIXTURES / "ablation.json"])
    assert "Base vs head" not in _titles(sections)


def _timed(result, factors: list[float]):
    """`result` measured in one round per factor, each its times scaled by that factor (estimate redone)."""
    first = result.rounds[0]
    rounds = [
        dataclasses.replace(first, samples_s=[[x * f for x in rank] for rank in first.samples_s])
        for f in factors
    ]
    return dataclasses.replace(result, rounds=rounds, estimate=estimate([r.median_s for r in rounds]))


def test_scaling_points_and_times_carry_their_interval_across_rounds():
    """A cp 2 case at half the cp 1 time, steady over rounds: speedup 2.00x with a tight interval, not
    within noise; the same case at the cp 1 time give or take 25% a round: within noise. Times print as the
    estimate +- its interval's half-width."""
    run = load_result(FIXTURES / "scaling.json")
    base = _timed(run.get("tiny-scaling/ulysses-cp1-T128-fwd_bwd"), [1.0, 1.001, 0.999])
    steady = _timed(base, [0.5, 0.5005, 0.4995])
    point = analysis.ScalingPoint(cp=2, seq_len=128, result=steady, base=base)
    assert point.ratio == pytest.approx(2.0, rel=1e-3)
    assert point.interval.low < 2.0 < point.interval.high and point.interval.high / point.interval.low < 1.01
    assert not point.within_noise and point.ratio_range == (point.interval.low, point.interval.high)
    noisy = analysis.ScalingPoint(cp=2, seq_len=128, result=_timed(base, [0.8, 1.0, 1.25]), base=base)
    assert noisy.within_noise and noisy.interval.low < 1.0 < noisy.interval.high
    one_round = analysis.ScalingPoint(
        cp=2,
        seq_len=128,
        result=run.get("tiny-scaling/ulysses-cp2-T128-fwd_bwd"),
        base=run.get("tiny-scaling/ulysses-cp1-T128-fwd_bwd"),
    )
    assert one_round.interval.low is None and not one_round.within_noise
    width = steady.estimate.relative_half_width
    assert format_time(steady) == f"{steady.estimate.median_s * 1e3:.3f} ms ±{100 * width:.1f}%"
    assert format_time(run.get("tiny-scaling/ulysses-cp1-T128-fwd_bwd")) == format_ms(
        run.get("tiny-scaling/ulysses-cp1-T128-fwd_bwd").timing
    )  # one round: the median over repeats
    assert format_ratio(point.interval).startswith("2.00x [")
    itself = analysis.ScalingPoint(cp=1, seq_len=128, result=base, base=base)  # the cp=1 point: exact
    assert (itself.interval.low, itself.interval.ratio, itself.interval.high) == (1.0, 1.0, 1.0)


def test_several_runs_of_a_scenario_are_one_side_by_side_table():
    """Three runs of one scenario: one table (a row per case, a time column per run, the ratio of each later
    run to the first), not three stacked; a run from another machine gets no ratio: its column, n/c
    throughout, is left out, and one line says why."""
    paths = [FIXTURES / "ablation.json"] * 3
    runs = [in_rounds(load_result(p)) for p in paths]
    other = dataclasses.replace(runs[2].environment, hostname="elsewhere", cpu_model="Intel Xeon")
    runs[2] = dataclasses.replace(runs[2], environment=other)
    _, sections = report.build_report(report_runs(runs, paths))
    scenario = next(s for s in sections if s.title == "Scenario tiny-ablation")
    results = next(s for s in scenario.subsections if s.title == "Results")
    (table,) = [b for b in results.blocks if isinstance(b, Table)]
    assert table.columns[3].startswith("#3 ") and table.columns[4:] == ["#2 / #1"]
    ok = [c for c in runs[0].cases if c.status == "ok"]
    assert [row[0] for row in table.rows] == [c.case.case_id for c in ok]
    for row, case in zip(table.rows, ok, strict=True):
        assert row[1] == row[2] == format_time(case)  # the same file twice: the same times
        assert row[4].startswith("1.00x") and "n/c" not in row  # #3 / #1: all n/c, so left out
    (why,) = [b.text for b in results.blocks if isinstance(b, Paragraph) and b.text.startswith("#3 / #1")]
    assert why.startswith(f"#3 / #1 not shown: not comparable, {len(ok)} cases: different machine (cpu_model")


def test_cases_not_comparable_are_one_line_of_reason_each_with_their_rows_folded(tmp_path, monkeypatch):
    """Issue 46: the report of the two committed cpu-scaling runs printed a 140-row base vs head table of
    "not comparable" and a 140-row side-by-side table of "n/c", never saying why. Now one line per reason
    (what differs, and the flag that compares them anyway), the not comparable rows folded under it, a
    ratio column of nothing but n/c left out, and a long table folded: <details> in HTML and markdown."""
    paths = [FIXTURES / "ablation.json", FIXTURES / "ablation.json"]
    runs = [in_rounds(load_result(p)) for p in paths]
    head_env = dataclasses.replace(runs[1].environment, git_commit="b" * 40)
    warmer = [dataclasses.replace(c, case=dataclasses.replace(c.case, warmup=3)) for c in runs[1].cases]
    runs[1] = dataclasses.replace(runs[1], environment=head_env, cases=warmer)
    monkeypatch.setattr(report, "FOLD_ROWS", 4)
    title, sections = report.build_report(report_runs(runs, paths))
    ok = sum(c.status == "ok" for c in runs[0].cases)
    line = (
        f"not comparable, {ok} cases: different scenario tiny-ablation (warmup 1 vs 3); "
        "`bench compare --force`"
    )
    base_vs_head = next(s for s in sections if s.title == "Base vs head")
    (folded,) = [b for b in base_vs_head.blocks if isinstance(b, Folded)]
    assert folded.summary.startswith(line) and len(folded.blocks[0].rows) == ok
    assert not [b for b in base_vs_head.blocks if isinstance(b, Table)]  # no table of not comparable rows
    results = next(sub for s in sections if s.title == "Scenario tiny-ablation" for sub in s.subsections)
    notes = [b.text for b in results.blocks if isinstance(b, Paragraph)]
    assert any(n.startswith(f"#2 / #1 not shown: {line}") for n in notes), notes
    (times,) = [b for b in results.blocks if isinstance(b, Folded)]
    (table,) = times.blocks
    assert table.columns[3:] == [] and all("n/c" not in row for row in table.rows)
    page = render_html(title, sections)
    assert (
        page.count("<details><summary>not comparable, ") == 1 and "<details><summary>tiny-ablation: " in page
    )
    text = render_markdown(title, sections, MarkdownCharts(folder=tmp_path / "c", relative_to=tmp_path))
    assert "<details><summary>not comparable, " in text and "\n\n| case | base | head |" in text
