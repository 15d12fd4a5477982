"""bench.judge.history judges records, as the rest of judge: histories are built from runs in memory
(bench.results.history loads them), and no module of bench.judge reads a file (asv: results.py loads,
step_detect.py judges)."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

from histories import commit_runs

from bench.judge.history import build_histories, regressions_at_newest
from bench.results.history import load_runs

JUDGE = Path(__file__).resolve().parents[3] / "bench" / "judge"
FILE_MODULES = {"os", "io", "json", "pathlib", "shutil", "subprocess", "tempfile", "glob"}
LOADERS = {"load_result", "read_result_text", "parse_result", "load_runs", "find_files", "read_run"}


def test_no_judge_module_reads_files():
    """judge imports no module that reads files or starts processes, and none of bench.results' loaders."""
    found = []
    for path in sorted(JUDGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found += [(path.name, a.name) for a in node.names if a.name.split(".")[0] in FILE_MODULES]
            elif isinstance(node, ast.ImportFrom) and node.module:
                if node.module.split(".")[0] in FILE_MODULES:
                    found.append((path.name, node.module))
                found += [(path.name, a.name) for a in node.names if a.name in LOADERS]
    assert found == []


def test_histories_are_judged_from_runs_in_memory(tmp_path: Path):
    """The files loaded, then removed: the histories, the failed commit's place and the regression at the
    newest commit come from the records alone."""
    folder = commit_runs(tmp_path, [1.0] * 5 + [1.3], failed=2)
    runs = load_runs([folder]).runs
    shutil.rmtree(folder)
    (h,) = build_histories(runs)
    assert h.scenario == "tiny-ablation" and len(h.runs) == 6
    assert [r.run is None for r in h.runs] == [False, False, True, False, False, False]
    assert h.runs[2].error.startswith("its bench cannot run") and all(c.results[2] is None for c in h.cases)
    worse = regressions_at_newest([h])
    assert worse and all(change.index == 5 and change.verdict == "worse" for _, _, change in worse)
    # a failed commit alone has no machine, so no history; and no run at all, none
    assert build_histories([r for r in runs if r.run is None]) == [] and build_histories([]) == []
