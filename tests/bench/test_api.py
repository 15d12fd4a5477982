"""bench.api: `bench run` from Python (the command's own code path), and the rows as a DataFrame."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench import api
from bench.errors import UserError
from bench.results.export import COLUMNS
from bench.results.store import load_result


@pytest.mark.multirank
def test_run_returns_the_run_it_wrote(suite_dir: Path):
    out = suite_dir / "api.json"
    run = api.run("tiny", sets={"mode": ["p2p"]}, filters=["cp=1"], output=str(out), quiet=True)
    assert [c.case.case_id for c in run.cases] == ["p2p-ckpt-cp1-T64-fwd_bwd"] and run.cases[0].status == "ok"
    assert load_result(out) == run
    assert run.command == [
        "bench",
        "run",
        "tiny",
        "--set",
        'mode=["p2p"]',
        "--filter",
        "cp=1",
        "--output",
        str(out),
    ]


def test_mistakes_raise_the_commands_user_error(suite_dir: Path):
    with pytest.raises(UserError, match=r"scenario 'tinny': no scenarios/tinny\.yaml; did you mean 'tiny'"):
        api.run("tinny", quiet=True)
    with pytest.raises(UserError, match="unknown key 'repeats'"):
        api.run("tiny", sets={"repeats": 3}, quiet=True)


def test_set_items():
    assert api.set_items({"repeat": 3, "cp": [1, 2], "checkpoint": [True]}) == [
        "repeat=3",
        "cp=[1, 2]",
        "checkpoint=[true]",
    ]
    assert api.set_items(["repeat=3"]) == ["repeat=3"]


def test_dataframe_without_pandas_says_what_to_do(monkeypatch):
    run = load_result(Path(__file__).parent / "fixtures" / "ablation.json")
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas raises ImportError
    with pytest.raises(
        ImportError, match=r"needs pandas, which bench does not install; `pip install pandas`"
    ):
        api.dataframe(run)


def test_dataframe_with_pandas():
    pandas = pytest.importorskip("pandas")
    run = load_result(Path(__file__).parent / "fixtures" / "ablation.json")
    df = api.dataframe(run)
    assert isinstance(df, pandas.DataFrame) and tuple(df.columns) == COLUMNS and len(df) == len(run.cases)
