"""A user's backends in every process bench uses (bench.launch.user_backends): what the launcher tells its
ranks and what a rank does with it (the modules imported, from the launcher's folders; a backend the launcher
alone has named as such, not "register your op first"), and both sides of a compare: a paired one imports the
modules into each ref's gdn_cp (bench.measure.library), an unpaired one hands them to each ref's bench."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
import user_backend_ranks
from gitrepo import git
from rich.console import Console
from tiny import TINY_LAYER, TINY_LAYER_YAML
from user_module import UserModule, user_module_fixture  # noqa: F401 (the fixture `user_module`)

from bench.cli import main
from bench.commands import compare
from bench.commands.session import CaseChoice
from bench.errors import UserError
from bench.launch import interleave
from bench.launch.local import RankFailure, run_on_ranks
from bench.launch.paired import check_libraries
from bench.launch.user_backends import (
    BACKENDS_ENV,
    LAUNCHER_NAMES_ENV,
    SEARCH_PATH_ENV,
    launcher_only_message,
    load,
    prepare_rank,
    rank_env,
)
from bench.measure.library import load_library
from bench.results.store import load_result
from gdn_cp.ops import register_backend, unregister_backend
from gdn_cp.ops.backends import BUILT_IN, BackendModuleError

REPO = Path(__file__).resolve().parents[3]


def test_the_ranks_are_told_the_modules_where_they_were_found_and_the_launchers_backends(
    user_module: UserModule, monkeypatch: pytest.MonkeyPatch
):
    load([user_module.name])
    env = rank_env()
    assert env[BACKENDS_ENV] == user_module.name
    assert env[SEARCH_PATH_ENV] == str(user_module.folder.resolve())
    assert set(env[LAUNCHER_NAMES_ENV].split(",")) >= {b.name for b in BUILT_IN} | {user_module.backend}

    # a rank whose sys.path lacks the folder (forked from a server started before it was added) finds it
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(user_module.folder)])
    sys.modules.pop(user_module.name)
    assert prepare_rank(env).launcher_only == ()
    assert sys.modules[user_module.name].__file__ == str(user_module.path)
    assert str(user_module.folder.resolve()) in sys.path

    # a module the rank cannot import: one line, naming it, said as the rank's
    with pytest.raises(BackendModuleError) as caught:
        prepare_rank({BACKENDS_ENV: "gone_kernels_xyz"})
    assert str(caught.value) == (
        "in a rank: backend module gone_kernels_xyz cannot be imported: ModuleNotFoundError: No module named "
        "'gone_kernels_xyz' (put its folder on PYTHONPATH, or install its package) (the launcher imported it)"
    )


def test_a_backend_module_that_does_not_import_is_one_line_naming_the_flag(user_module, monkeypatch, capsys):
    assert main(["list", "--backend-module", "gone_kernels_xyz"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "--backend-module gone_kernels_xyz: backend module gone_kernels_xyz cannot be imported" in err
    monkeypatch.setenv(BACKENDS_ENV, f"{user_module.name}, gone_kernels_xyz")
    assert main(["list"]) == 1
    err = capsys.readouterr().err
    assert f"{BACKENDS_ENV}={user_module.name}, gone_kernels_xyz: backend module gone_kernels_xyz" in err


@pytest.mark.multirank
def test_local_ranks_import_the_modules_and_name_a_backend_only_the_launcher_has(user_module: UserModule):
    """run_on_ranks (bench doctor, the cost model's calibration): every rank has the module's backend; a
    backend registered in this process alone (as under `if __name__ == "__main__":`) fails naming itself and
    the fix, where it said "unknown backend ...; register your op first"."""
    load([user_module.name])
    for names, modules in run_on_ranks(user_backend_ranks.registered, 2, timeout_s=60):
        assert user_module.backend in names and modules == [user_module.name]

    register_backend(
        "launcher_only_op", sys.modules[user_module.name].__dict__[f"{user_module.backend}_rule"]
    )
    try:
        with pytest.raises(RankFailure) as caught:
            run_on_ranks(user_backend_ranks.look_up, 2, ("launcher_only_op",), timeout_s=60)
    finally:
        unregister_backend("launcher_only_op")
    assert caught.value.message == f"BackendOnlyInLauncher: {launcher_only_message('launcher_only_op')}"


def checkout_copy(root: Path, *, append: str = "", module: str = "ops/__init__.py") -> str:
    """A folder holding a copy of this checkout's gdn_cp (a ref's worktree), `append` added to `module`."""
    shutil.copytree(REPO / "gdn_cp", root / "gdn_cp", ignore=shutil.ignore_patterns("__pycache__"))
    path = root / "gdn_cp" / module
    path.write_text(path.read_text() + append)
    return str(root)


def test_both_sides_of_a_paired_compare_register_the_modules_backends(
    user_module: UserModule, tmp_path: Path
):
    """Each ref's gdn_cp has a registry of its own: the module is imported again into each as it loads, so
    that the case's backend is the module's op on both sides (it was unknown to both)."""
    load([user_module.name])
    ours = sys.modules[user_module.name]
    roots = [checkout_copy(tmp_path / side) for side in ("base", "head")]
    check_libraries(roots, ["base v1", "head v2"])
    assert sys.modules[user_module.name] is ours  # this process's module is put back
    config = dataclasses.replace(TINY_LAYER, backend=user_module.backend)
    x = torch.randn(1, 16, TINY_LAYER.hidden_size, generator=torch.Generator().manual_seed(0))
    for root in roots:
        library = load_library(root)
        layer = library.seeded_layer(library.config(config), 0)
        with library.recording() as recorded:
            layer(x)
        assert {op.op for call in recorded.calls for op in call.ops} == {user_module.op}
        assert layer.forward.__globals__["__file__"].startswith(root)  # the ref's own layer


@pytest.mark.multirank
def test_a_paired_compare_of_two_refs_runs_the_modules_backend_on_both_sides(
    user_module: UserModule, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """`bench compare REF REF` end to end (paired: each rank loads both refs' gdn_cp): the case on the
    module's backend runs on both sides, its op recorded by each ref's own gdn_cp."""
    load([user_module.name])  # what bench.cli does for --backend-module
    repo = tmp_path / "repo"
    checkout_copy(repo)
    git(repo, "init", "--quiet", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "--quiet", "-m", "base")
    git(repo, "commit", "--quiet", "--allow-empty", "-m", "head")
    scenario = tmp_path / "mine.yaml"
    scenario.write_text(
        TINY_LAYER_YAML + "cp: [2]\nseq_len: [32]\nmode: [p2p]\npass: [forward]\nwarmup: 0\nrepeat: 1\n"
        f"backend: [{user_module.backend}]\n"
    )
    monkeypatch.chdir(repo)
    console = Console(width=200, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    choice = CaseChoice([str(scenario)], ["rounds=2"])
    code = compare.run("HEAD~1", "HEAD", choice, save_dir=str(tmp_path / "out"), console=console)
    assert code == 0, console.export_text()
    for side in ("base", "head"):
        (path,) = (tmp_path / "out").glob(f"{side}-*.json")
        (case,) = load_result(path).cases
        assert case.status == "ok", case.error
        assert {op.op for call in case.ran for op in call.ops} == {user_module.op}


def test_a_side_the_module_does_not_import_with_is_one_line_naming_it(
    user_module: UserModule, tmp_path: Path
):
    load([user_module.name])
    old = checkout_copy(tmp_path / "old", append="\ndel register_backend\n")
    with pytest.raises(UserError) as caught:
        check_libraries([old], ["base v1"])
    message = str(caught.value)
    assert message.startswith(
        f"base v1: backend module {user_module.name} does not import with this ref's gdn_cp (ImportError: "
        "cannot import name 'register_backend' from 'gdn_cp.ops'"
    )
    assert message.endswith("a module named for its backends must import on both sides of a compare")
    assert "\n" not in message


def test_an_unpaired_compare_hands_the_modules_to_each_refs_bench(user_module: UserModule, tmp_path: Path):
    load([user_module.name])
    env = interleave.side_env(tmp_path / "worktree", "session", "v1")
    assert env["PYTHONPATH"] == os.pathsep.join(
        [str(tmp_path / "worktree"), str(user_module.folder.resolve())]
    )
    assert env[BACKENDS_ENV] == user_module.name
