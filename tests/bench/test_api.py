"""bench.api: `bench run` from Python (the command's own code path), and the rows as a DataFrame."""

from __future__ import annotations

import subprocess
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
    assert api.set_items("rounds=1") == ["rounds=1"]  # one item, not its characters
    with pytest.raises(UserError, match=r"expected a mapping or key=value strings, got \[3\]"):
        api.set_items([3])


UNGUARDED = """\
from bench import api
api.run("tiny", sets="rounds=1", quiet=True)
"""
GUARDED = """\
from bench import api

if __name__ == "__main__":
    run = api.run("tiny", sets="rounds=1", filters="mode=p2p,cp=2", quiet=True)
    print([c.status for c in run.cases])
"""


def test_a_script_without_a_main_guard_is_told_what_to_add(suite_dir: Path):
    """Ranks re-import the main script (multiprocessing's forkserver): an unguarded api.run would run again in
    every rank and fail every case with no Python error; it is refused at once, saying what to add."""
    for name, text in (("unguarded.py", UNGUARDED), ("guarded.py", GUARDED)):
        (suite_dir / name).write_text(text)
    done = subprocess.run(
        [sys.executable, "unguarded.py"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 1
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "unguarded.py:2 starts ranks from the top level of the script: every rank imports the script "
            "again before it runs (multiprocessing's forkserver), which would run this line again in each; "
            'put it under `if __name__ == "__main__":`'
        )
    ), done.stderr
    done = subprocess.run(
        [sys.executable, "guarded.py"], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['ok']"


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
