"""A user's backend through `bench run`: modules named by --backend-module and BENCH_BACKENDS run 2-rank gloo
cases end to end (issue 50, item 7: unknown in the launcher before, and in the ranks), each
module recorded in the result; a backend registered under `if __name__ == "__main__":` of a script fails its
case with one line saying it is registered in the launcher only, and the fix."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tiny import TINY_LAYER_YAML
from user_module import (  # noqa: F401 (the fixtures `user_module`, `other_user_module`)
    UserModule,
    other_user_module_fixture,
    user_module_fixture,
)

from bench.cli import main
from bench.launch.user_backends import BACKENDS_ENV, launcher_only_message
from bench.results.store import load_result

pytestmark = pytest.mark.multirank

ONE_CASE = TINY_LAYER_YAML + "cp: [2]\nseq_len: [32]\nmode: [p2p]\npass: [forward]\nwarmup: 0\nrepeat: 1\n"
"""One cp 2 case of the tiny layer, one round of one pass (bench.yaml's rounds: 2, set to 1 below)."""


def test_backend_modules_run_on_every_rank_and_are_recorded(
    suite_dir: Path,
    write_scenario,
    user_module: UserModule,
    other_user_module: UserModule,
    monkeypatch: pytest.MonkeyPatch,
):
    """One module named by --backend-module, another by BENCH_BACKENDS, each from a folder of its own: both
    backends run on the ranks of one pool (before: unknown backends, before any rank started)."""
    flagged, from_env = user_module, other_user_module
    backends = f"[{flagged.backend}, {from_env.backend}]"
    write_scenario("mine", ONE_CASE + f"rounds: 1\nbackend: {backends}\n")
    out = suite_dir / "mine.json"
    monkeypatch.setenv(BACKENDS_ENV, from_env.name)
    assert main(["run", "mine", "--output", str(out), "--no-plots", "--backend-module", flagged.name]) == 0
    run = load_result(out)
    for module in (flagged, from_env):
        case = run.get(f"mine/p2p-ckpt-cp2-T32-fwd-{module.backend}")
        assert case.status == "ok", case.error
        assert {op.op for call in case.ran for op in call.ops} == {module.op}  # its op ran on the ranks
        assert run.environment.kernel_versions[module.name] == str(module.path)  # no distribution: its file
    # the command line that runs it again (and the resume command) names the flag's module
    assert run.command[run.command.index("--backend-module") + 1] == flagged.name
    assert from_env.name not in run.command


SCRIPT = """\
import sys

from bench import api
from gdn_cp.ops import chunk_gated_delta_rule, register_backend


def main_only_rule(*args, **kwargs):
    return chunk_gated_delta_rule(*args, **kwargs)


if __name__ == "__main__":
    register_backend("main_only", main_only_rule)
    run = api.run(sys.argv[1], output=sys.argv[2], quiet=True)
    print("error:", run.cases[0].error)
"""


def test_a_backend_registered_under_the_main_guard_is_named_as_the_launchers_only(
    suite_dir: Path, write_scenario
):
    """The ranks import the script again without its main block: before, the case failed with "rank 0
    failed: ValueError: unknown backend 'main_only'; ... register your op first"."""
    scenario = write_scenario("main_only", ONE_CASE + "rounds: 1\nbackend: [main_only]\n")
    script = suite_dir / "launch_it.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", BACKENDS_ENV)}
    done = subprocess.run(
        [sys.executable, str(script), str(scenario), str(suite_dir / "out.json")],
        cwd=suite_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == f"error: {launcher_only_message('main_only')}"
