"""Issue 45: the launcher process never touches the accelerator. Importing a kernel package may query the
device (FLA's import asks for device 0 and Triton's driver): a context on GPU 0 in the launcher, against
gdn_cp.distributed.platform's rule. The preflight finds a backend's modules on the path without importing
them (gdn_cp.ops.Backend.unavailable); only the ranks import the op.

Here a fake kernel package stands in for FLA: its import is the device query, recorded with the process
that made it. A site folder registers a backend that loads it, in `bench run` and in every rank."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny import tiny_scenario

from bench.errors import UserError
from bench.launch.preflight import check_cases
from bench.results.store import load_result
from bench.suite.config import Sweep
from bench.suite.loader import Locator
from gdn_cp.distributed import resolve_platform
from gdn_cp.ops import Backend, get_backend, recurrent_gated_delta_rule, unregister_backend
from gdn_cp.ops.backends import add_backend

SITE = '''\
"""Every process of the test's `bench run` (the launcher and its ranks) registers backend fake_kernels."""
import importlib

from gdn_cp.ops.backends import Backend, add_backend

add_backend(
    Backend(
        name="fake_kernels",
        description="a kernel package whose import queries the device",
        load=lambda: importlib.import_module("fake_kernels").chunk_gated_delta_rule,
        modules=("fake_kernels",),
    )
)
'''
KERNELS = '''\
"""A kernel package whose import queries the device (as FLA's does): it records which process made the
query, in FAKE_DEVICE_LOG."""
import os

with open(os.environ["FAKE_DEVICE_LOG"], "a") as log:
    log.write(f"{os.getpid()}\\n")

from gdn_cp.ops import chunk_gated_delta_rule  # noqa: E402
'''


@pytest.mark.multirank
def test_only_the_ranks_import_a_backends_kernels(suite_dir: Path, tmp_path: Path):
    site = tmp_path / "site"
    (site / "fake_kernels").mkdir(parents=True)
    (site / "sitecustomize.py").write_text(SITE)
    (site / "fake_kernels" / "__init__.py").write_text(KERNELS)
    log = tmp_path / "device-queries.log"
    env = {**os.environ, "FAKE_DEVICE_LOG": str(log)}
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])
    out = suite_dir / "fake.json"
    command = [sys.executable, "-m", "bench", "run", "tiny", "--filter", "cp=2", "--filter", "mode=p2p"]
    command += ["--set", "backend=[fake_kernels]", "--set", "rounds=1", "--output", str(out)]
    launcher = subprocess.Popen(
        command, cwd=suite_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    output, _ = launcher.communicate(timeout=240)
    assert launcher.returncode == 0, output
    results = load_result(out).cases
    assert results and all(r.status == "ok" and r.case.backend == "fake_kernels" for r in results), output
    queried = [int(line) for line in log.read_text().split()]
    assert queried, "no rank imported the backend's kernels"
    assert launcher.pid not in queried, f"the launcher (pid {launcher.pid}) queried the device: {queried}"
    assert len(set(queried)) == len(queried)  # once per process: each rank imports the package once


def test_a_backend_whose_modules_are_missing_is_refused_without_loading_it():
    loaded: list[str] = []
    add_backend(
        Backend(
            name="absent_kernels",
            description="a kernel package that is not installed",
            load=lambda: loaded.append("load") or recurrent_gated_delta_rule,
            modules=("no_such_kernel_package.ops",),
            packages=("no-such-kernels",),
        )
    )
    try:
        scenario = tiny_scenario(sweep=Sweep(cp=[2], seq_len=[32], mode=["p2p"], backend=["absent_kernels"]))
        locate = Locator(Path("scenarios/s.yaml"), {("backend",): 3}, ())
        with pytest.raises(UserError) as refused:
            check_cases(
                locate,
                scenario,
                scenario.cases(warmup=0, repeat=1),
                platform=resolve_platform("cpu"),
                ranks_on_host=lambda c: c.cp,
                max_local_ranks=None,
            )
    finally:
        unregister_backend("absent_kernels")
    message = str(refused.value)
    assert (
        "backend 'absent_kernels' needs module no_such_kernel_package.ops, which is not installed" in message
    )
    assert "(its packages: no-such-kernels)" in message and "--filter backend=gdn_cp" in message
    assert loaded == []  # found missing on the path, never loaded
    assert "fla.ops.gated_delta_rule" in get_backend("fla").modules  # the built-in kernels are listed
