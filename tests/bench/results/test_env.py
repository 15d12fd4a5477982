"""The environment record stored with every result."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from bench.records import from_dict, to_dict
from bench.results import env
from bench.results.env import Environment, collect_environment, cpu_model, git_info
from gdn_cp.distributed import resolve_platform


def test_collect_environment_on_cpu():
    platform = resolve_platform("cpu")
    env = collect_environment(
        platform,
        device_name=platform.device_name(0),
        threads_per_rank=2,
        world_sizes=[2, 1, 2],
        launcher="local",
    )
    assert env.device_type == "cpu" and env.backend == "gloo"
    assert env.torch_version == torch.__version__ and env.cpu_count == (os.cpu_count() or 1)
    assert env.world_sizes == [1, 2] and env.threads_per_rank == 2 and env.launcher == "local"
    assert from_dict(Environment, to_dict(env)) == env


def test_git_info_of_this_checkout():
    git = git_info()
    assert len(git.commit) == 40 and git.short_commit == git.commit[:8] and git.branch


def test_cpu_model(tmp_path: Path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Example CPU @ 2.0GHz\nflags\t: fpu\n")
    assert cpu_model(info) == "Example CPU @ 2.0GHz"
    assert cpu_model(tmp_path / "missing")  # falls back to the platform's processor string


def test_a_detached_checkout_records_the_ref_it_was_checked_out_from(monkeypatch):
    """Issue 37: a `--commits` run recorded its branch as "HEAD" (git's answer in a detached worktree)."""
    answers = {("rev-parse", "--abbrev-ref", "HEAD"): "HEAD"}
    real = env._git
    monkeypatch.setattr(env, "_git", lambda *args: answers.get(args, real(*args)))
    monkeypatch.delenv(env.REF_ENV, raising=False)
    assert env.git_info().branch == "detached"
    monkeypatch.setenv(env.REF_ENV, "main~3")
    assert env.git_info().branch == "main~3"
