"""`bench show` on frozen result files (fixtures/README.md says how they were made)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from bench.cli import main
from bench.commands import show
from bench.formats import format_time, format_tokens
from bench.judge.reference import not_measured, reference_tables
from bench.results.store import load_result, save_result

FIXTURES = Path(__file__).parents[1] / "fixtures"


def rendered(name: str) -> str:
    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    assert show.run(str(FIXTURES / name), console=console) == 0
    return console.export_text()


def test_seed_tables_group_by_cp_and_merge_passes():
    run = load_result(FIXTURES / "ablation.json")
    tables = reference_tables(run)
    assert [(t.scenario, t.cp) for t in tables] == [("tiny-ablation", 1), ("tiny-ablation", 2)]
    cp1 = tables[0]
    assert cp1.shows_checkpoint
    assert [(r.seq_len, r.mode, r.checkpoint) for r in cp1.rows] == [
        (64, "ulysses", None),
        (64, "p2p", True),
        (64, "p2p", False),
    ]
    for row in cp1.rows:  # both passes in one row; peak memory from the forward+backward pass
        assert set(row.results) == {"forward", "forward_backward"}
        assert row.memory_pass == "forward_backward"
    failed_row = tables[1].rows[2]  # p2p-nockpt-cp2 forward failed
    assert set(failed_row.results) == {"forward_backward"}
    (failed,) = not_measured(run)
    assert failed.case.case_id == "p2p-nockpt-cp2-T64-fwd" and failed.status == "failed"


def test_show_prints_seed_shaped_tables_and_failures():
    text = rendered("ablation.json")
    assert "tiny-ablation: CP1 (hidden 32, K/V heads 2/4, head dims 8/8, fp32, batch 1)" in text
    header = next(line for line in text.splitlines() if "forward+backward" in line)
    for column in ("global seq", "mode", "summary ckpt", "forward", "forward+backward", "peak allocated"):
        assert column in header
    run = load_result(FIXTURES / "ablation.json")
    ulysses_fwd = run.get("tiny-ablation/ulysses-cp1-T64-fwd")
    assert format_time(ulysses_fwd) in text  # the stored time, as the table spells it
    assert "meter cpu-profiler" in text
    assert "tiny-ablation/p2p-nockpt-cp2-T64-fwd" in text
    assert "MemoryError: injected: out of memory on rank" in text


def test_show_lists_skipped_cases_with_the_reason():
    text = rendered("torchrun.json")
    assert "launcher torchrun" in text
    assert "skipped" in text and "this torchrun job has 2" in text
    assert "summary ckpt" not in text  # only checkpoint on: no column for it


def test_show_through_the_cli(capsys):
    assert main(["show", str(FIXTURES / "ablation.json")]) == 0
    assert "forward+backward" in capsys.readouterr().out


def test_format_tokens():
    assert [format_tokens(n) for n in (64, 1024, 32768, 131072, 1000)] == ["64", "1K", "32K", "128K", "1000"]


def test_a_folder_or_a_binary_file_is_one_red_line(tmp_path: Path, capsys):
    (tmp_path / "image.json").write_bytes(b"\x89PNG\r\n\x1a\n")
    for argv, message in [
        (["show", str(tmp_path)], f"error: {tmp_path}: is a folder, not a result file"),
        (["show", str(tmp_path / "image.json")], f"error: {tmp_path / 'image.json'}: not a text file"),
        (["plot", str(tmp_path)], f"error: {tmp_path}: is a folder, not a result file"),
        (
            ["compare", str(tmp_path / "image.json"), str(FIXTURES / "ablation.json")],
            f"error: {tmp_path / 'image.json'}: not a text file",
        ),
    ]:
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err, err


def test_show_markdown_renders_the_same_tables(capsys):
    assert main(["show", str(FIXTURES / "ablation.json"), "--format", "markdown"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# tiny-ablation  ")
    assert "**tiny-ablation: CP1 (hidden 32, K/V heads 2/4, head dims 8/8, fp32, batch 1)**" in text
    assert "| global seq | mode | summary ckpt | forward | forward+backward | peak allocated |" in text
    assert "**not measured**" in text and "| tiny-ablation/p2p-nockpt-cp2-T64-fwd | failed |" in text
    assert "meter cpu-profiler" in text and "[" not in text.split("\n", 1)[0]  # no rich markup


def test_show_prints_the_recorded_command(tmp_path: Path):
    run = load_result(FIXTURES / "ablation.json")
    run.command = ["bench", "run", "tiny-ablation", "--set", "mode=[p2p]"]
    path = tmp_path / "with-command.json"
    save_result(run, path)
    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    assert show.run(str(path), console=console) == 0
    assert "command: bench run tiny-ablation --set 'mode=[p2p]'" in console.export_text()
