"""bench.launch.job without ranks: the nodes' agreement, and which rank's error is the root cause."""

from __future__ import annotations

import dataclasses

import pytest

from bench.errors import UserError
from bench.launch import job
from bench.results.env import NodeEnvironment

NODE = NodeEnvironment(
    node=0,
    hostname="gpu-a",
    ranks=8,
    git_commit="a" * 40,
    git_dirty=False,
    python_version="3.11.7",
    torch_version="2.11.0+cu130",
    torch_npu_version=None,
    device_type="cuda",
    device_name="NVIDIA H200",
    cpu_model="Intel Xeon",
    cpu_count=96,
)


def gathered(monkeypatch, nodes: list[NodeEnvironment]) -> None:
    """dist.all_gather_object as it would fill on a job whose ranks are `nodes` (one entry per rank)."""
    monkeypatch.setattr(job.dist, "get_world_size", lambda: len(nodes))

    def all_gather_object(out: list, _mine: object) -> None:
        out[:] = nodes

    monkeypatch.setattr(job.dist, "all_gather_object", all_gather_object)


def test_nodes_that_agree_are_listed_once_each(monkeypatch):
    other = dataclasses.replace(NODE, node=1, hostname="gpu-b", cpu_model="AMD EPYC")  # CPUs may differ
    gathered(monkeypatch, [NODE] * 8 + [other] * 8)
    assert job.agree_on_nodes(NODE) == [NODE, other]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"git_commit": "b" * 40}, "git_commit: node 0 (gpu-a) 'aaaa"),
        ({"git_dirty": True}, "git_dirty: node 0 (gpu-a) False, node 1 (gpu-b) True"),
        ({"torch_version": "2.10.0+cu128"}, "torch_version: node 0 (gpu-a) '2.11.0+cu130', node 1 (gpu-b)"),
        (
            {"device_name": "NVIDIA H100"},
            "device_name: node 0 (gpu-a) 'NVIDIA H200', node 1 (gpu-b) 'NVIDIA H1",
        ),
    ],
)
def test_nodes_that_differ_are_refused_naming_them(monkeypatch, change, named):
    other = dataclasses.replace(NODE, node=1, hostname="gpu-b", **change)
    gathered(monkeypatch, [NODE, other])
    with pytest.raises(UserError, match="the job's nodes differ") as info:
        job.agree_on_nodes(NODE)
    assert named in str(info.value) and "run the same checkout (committed), torch and devices" in str(
        info.value
    )


def test_the_root_cause_is_the_first_error_that_is_not_an_echo():
    errors = {
        0: {"message": "RuntimeError: Connection closed by peer [127.0.0.1]:1234", "time": 1.0},
        1: {"message": "ValueError: broke on purpose", "time": 2.0},
        2: {"message": "RuntimeError: Timed out waiting 10000ms for recv operation to complete", "time": 0.5},
    }
    assert job.root_cause(errors) == "rank 1 failed: ValueError: broke on purpose"
    del errors[1]
    assert job.root_cause(errors).startswith(
        "rank 2 failed: RuntimeError: Timed out"
    )  # only echoes: earliest
