"""COLUMNS=80 (issue 46): no line of any command's output or error over 80 columns, no cell cut mid-word.
Every command through the CLI with its output and errors at 80 columns (the consoles bench prints to, set to
COLUMNS' width as they are when a user sets it), and one bad input per command plus every error class the CLI
turns into a message: each is one message, wrapped at word boundaries, continued lines indented."""

from __future__ import annotations

import dataclasses
import errno
from pathlib import Path

import pytest
from rich.text import Text

from bench import console as console_module
from bench.cli import main
from bench.commands import run as run_command
from bench.commands import verify as verify_command
from bench.commands.session import CaseChoice
from bench.measure.contention import Window
from bench.results.store import ResultWriteError, ResultWriter, load_result
from tests.bench.multiround import saved_in_rounds

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).parents[1] / "fixtures"
RESULTS = ROOT / "results"
SCALING = [
    str(RESULTS / "20261201-150553-main-1a38a701-cpu-scaling.json"),
    str(RESULTS / "20261201-180404-main-e761a03b-cpu-scaling.json"),
]
LINKS = str(RESULTS / "links-gloo-amd-epyc-2core.yaml")
WIDTH = 80


@pytest.fixture
def narrow(monkeypatch, capsys, tmp_path):
    """bench's consoles at 80 columns, COLUMNS=80 in the environment, the working directory the repository
    (its bench.yaml and scenarios; every file a command writes goes under tmp_path, named)."""
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    monkeypatch.setattr(console_module.console, "width", WIDTH)
    monkeypatch.setattr(console_module.err_console, "width", WIDTH)
    monkeypatch.chdir(ROOT)
    return capsys


def _lines(text: str) -> list[str]:
    return text.splitlines()


def _fits(text: str, what: str) -> None:
    from rich.cells import cell_len

    long = [line for line in _lines(text) if cell_len(line) > WIDTH]
    assert not long, f"{what}: {len(long)} lines over {WIDTH}, e.g. {long[0]!r}"
    assert "…" not in text, f"{what}: a cell cut with an ellipsis"


def _ids(paths: list[str], smallest_cp: int = 1) -> set[str]:
    return {c.case.case_id for p in paths for c in load_result(p).cases if c.case.cp >= smallest_cp}


def test_every_command_fits_80_columns_with_every_id_whole(narrow, tmp_path):
    ablation = str(saved_in_rounds(FIXTURES / "ablation.json", tmp_path / "ablation.json"))
    verify = str(FIXTURES / "verify.json")
    commands = {
        "list": (["list"], []),
        "list SCENARIO": (["list", "cpu-scaling"], []),
        "show": (["show", SCALING[1]], SCALING[1:]),
        "show --case": (["show", SCALING[1], "--case", "all_gather-nockpt-cp4-T4096-fwd_bwd"], []),
        "show verify": (["show", verify], []),
        "hist": (["hist", SCALING[1], "--filter", "cp=4"], []),
        "export": (["export", ablation, "--out", str(tmp_path / "rows.csv")], []),
        "compare": (["compare", *SCALING], SCALING),
        "compare --force": (["compare", *SCALING, "--force"], SCALING),
        "gate": (["gate", ablation, ablation, "--verify", verify], []),
        "history": (["history", *SCALING, "--format", "table", "--force"], []),
        "history, not comparable": (["history", *SCALING, "--format", "table"], []),
        "plot": (["plot", ablation, "--out", str(tmp_path / "charts")], []),
        "report": (["report", ablation, "--out", str(tmp_path / "r.html")], []),
        "model check": (["model", "check", SCALING[1], "--links", LINKS], SCALING[1:]),  # its cp > 1
        "model table": (["model", "table", SCALING[1], "--links", LINKS], []),
        "init": (["init", str(tmp_path / "suite")], []),
    }
    for name, (argv, whole) in commands.items():
        main(argv)
        out = narrow.readouterr()
        _fits(out.out + out.err, name)
        text = out.out
        assert text.strip() or out.err.strip(), name
        missing = [i for i in _ids(whole, 2 if name == "model check" else 1) if i not in text]
        assert not missing, f"{name}: case ids cut or missing: {missing[:3]}"
    main(["history", *SCALING, "--format", "table", "--force"])
    text = narrow.readouterr().out
    assert "all_gather-nockpt-cp4-T4096-fwd_bwd" in text  # issue 46: cut "...-T40/96-fwd_bwd"
    main(["model", "table", SCALING[1], "--links", LINKS])
    groups = [line for line in _lines(narrow.readouterr().out) if line.startswith("┃") and " T ┃" in line]
    assert len(groups) > 2 and all(" cp ┃" in line for line in groups)  # every split-off part keeps cp


@pytest.mark.multirank
def test_doctor_fits_80_columns_with_op_names_whole(narrow):
    """`bench doctor` cut "torch_chunk_gated_delta_ru/le" and leaked transformers' "falling back" lines."""
    main(["doctor", "--device", "cpu"])
    out = narrow.readouterr()
    _fits(out.out + out.err, "doctor")
    assert "torch_chunk_gated_delta_rule" in out.out and "gdn_cp.ops.recurrent_gated_delta_rule" in out.out
    assert "falling back" not in out.out + out.err


def _one_message(err: str, what: str) -> str:
    """The error as one message: `error:` once, at the start, continued lines indented by two."""
    lines = _lines(err)
    assert lines and lines[0].startswith("error: "), f"{what}: {err!r}"
    assert all(line.startswith("  ") for line in lines[1:]), f"{what}: {lines}"
    assert err.count("error:") == 1, what
    return " ".join(line.strip() for line in lines)


BAD = {
    "list": ["list", "no-such-scenario"],
    "run (config)": ["run", "--set", "cp=[64]"],
    "run (usage)": ["run", "--output", "a.json", "--resume", "b.json"],
    "show": ["show", "no/such/result-file-with-a-long-name-20261201-180404-main-e761a03b.json"],
    "show --case": ["show", SCALING[1], "--case", "p2p-ckpt-cp9-T1-fwd"],
    "hist": ["hist", SCALING[1], "--case", "p2p-ckpt-cp9-T1-fwd"],
    "export": ["export", SCALING[1], "--out", SCALING[1]],
    "compare": ["compare", SCALING[1], "no-such-ref-or-file"],
    "gate": ["gate", SCALING[0], SCALING[1]],
    "history": ["history", "no/such/folder"],
    "plot": ["plot", SCALING[1], "--out", "bench.yaml"],
    "report": ["report", SCALING[1], "--out", "report.txt"],
    "verify": ["verify", "no-such-scenario"],
    "profile": ["profile", "cpu-smoke", "--case", "no-such-case"],
    "model": ["model", "check", SCALING[1], "--links", "no/such/links.yaml"],
    "init": ["init", "."],
    "an unknown flag": ["show", "--no-such-flag"],
    "a device that cannot be used": ["doctor", "--device", "npu"],
}


@pytest.mark.parametrize("what", sorted(BAD))
def test_every_error_is_one_message_within_80_columns(narrow, what):
    assert main(BAD[what]) == 1
    err = narrow.readouterr().err
    _fits(err, what)
    _one_message(err, what)


def test_a_result_that_cannot_be_written_and_a_busy_machine_fit(narrow, tmp_path, monkeypatch):
    """The two messages of `bench run` that no bad flag brings: a full disk (ResultWriteError) and the
    busy-machine warning (135 columns in issue 46)."""
    writer = ResultWriter(tmp_path / "a-result-file-with-a-rather-long-name.json", load_result(SCALING[1]))
    full = ResultWriteError(errno.ENOSPC, "No space left on device")
    assert run_command._stopped(full, writer, CaseChoice(["cpu-scaling"]), console_module.console) == 1
    message = _one_message(narrow.readouterr().err, "disk full")
    assert "No space left on device: the run stopped;" in message and "--resume" in message
    window = Window(busy_s=1.9, own_s=0.0, steal_s=0.0, total_s=2.0)
    monkeypatch.setattr(run_command, "probe", lambda: window)
    run_command._idle_check(require_idle=False, fresh=None)
    err = narrow.readouterr().err
    _fits(err, "busy machine")
    lines = _lines(err)
    assert lines[0].startswith("warning: busy machine: others took") and len(lines) > 1


def test_bench_verify_status_lines_break_between_parts_never_inside_one():
    """Issue 46: `bench verify`'s status line broke mid-phrase at 80 columns; it is fitted as `bench run`'s
    lines are, its parts whole (bench.formats.fit_parts)."""
    record = load_result(FIXTURES / "verify.json").verifications[0]
    failed = dataclasses.replace(
        record, status="failed", error="RuntimeError: rank 1 timed out after 600 s waiting for rank 0 to send"
    )
    for rec in (record, failed):
        plain = Text.from_markup(verify_command._line(rec, WIDTH)).plain.splitlines()
        assert all(len(line) <= WIDTH for line in plain) and record.case.case_id in plain[0], plain
    lines = [
        line.strip() for line in Text.from_markup(verify_command._line(record, WIDTH)).plain.splitlines()
    ]
    assert len(lines) > 1 and any(line.startswith("(no mutants run)") for line in lines), lines
    assert any("worst param rel-L2 " in line and line.endswith(".weight)") for line in lines), lines
