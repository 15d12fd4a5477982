"""The environment of a run: what decides whether two results can be compared (code, machine, software).

Stored in every result file; `bench compare` flags results from different machines or devices.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform as _host
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from bench.records import RECORD_CONFIG
from gdn_cp.distributed import Platform
from gdn_cp.ops import backend_names, backend_sources, get_backend
from gdn_cp.ops.backends import BUILT_IN

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The checkout whose code is benchmarked (bench and gdn_cp live side by side)."""
CODE_PATHS = ("gdn_cp", "bench", "bench.yaml", "pyproject.toml")
"""Paths whose uncommitted changes make a run dirty (results/ and plots/ do not; the scenarios are in
bench/defaults)."""


@dataclass(kw_only=True, slots=True)
class GitInfo:
    commit: str
    """Full commit hash, or "unknown" outside a git checkout."""
    branch: str
    """Branch name; "HEAD" when detached; "unknown" outside a checkout."""
    dirty: bool
    """Uncommitted changes (untracked files included) to what decides a measurement: CODE_PATHS."""
    date: str | None = None
    """The commit's committer date (ISO 8601, with its offset); None outside a checkout."""
    subject: str | None = None
    """The first line of the commit's message; None outside a checkout."""

    @property
    def short_commit(self) -> str:
        return self.commit[:8]


@dataclass(kw_only=True, slots=True)
class HostEnvironment:
    """What one host runs: its code, software, devices and CPU."""

    git_commit: str
    git_dirty: bool
    python_version: str
    torch_version: str
    torch_npu_version: str | None
    """None when torch-npu is not installed."""
    device_type: str
    """cpu, cuda or npu."""
    device_name: str
    """Accelerator name, or the CPU architecture on cpu."""
    hostname: str
    cpu_model: str
    """From /proc/cpuinfo ("model name"), else the platform's processor string."""
    cpu_count: int
    kernel_versions: dict[str, str] = field(default_factory=dict)
    """Versions of the packages behind the local-op backends (gdn_cp.ops.backends: fla-core, triton,
    transformers, and those a registered backend names), "absent" where not installed; and each module or
    entry point imported for a user's backends (--backend-module, BENCH_BACKENDS, `gdn_cp.backends`) with
    its distribution's version, else its file; empty in files written before they were recorded."""


@dataclass(kw_only=True, slots=True)
class NodeEnvironment(HostEnvironment):
    """One node of a torchrun job, as its first rank saw it."""

    COMPARED: ClassVar[tuple[str, ...]] = (
        "git_commit",
        "git_dirty",
        "torch_version",
        "torch_npu_version",
        "kernel_versions",
        "device_type",
        "device_name",
    )
    """What must be the same on every node for the job's results to be comparable."""

    node: int
    """The node's index in the job (torchrun's GROUP_RANK)."""
    ranks: int
    """Ranks on the node (LOCAL_WORLD_SIZE)."""


@dataclass(kw_only=True, slots=True)
class Environment(HostEnvironment):
    """Identity of a run: the host that wrote it (global rank 0's under torchrun) and how it ran."""

    __pydantic_config__ = RECORD_CONFIG

    git_branch: str
    git_date: str | None
    """The commit's committer date (ISO 8601): where the run sits in a history (`bench history`)."""
    git_subject: str | None
    """The first line of the commit's message."""
    backend: str
    """Collective backend: gloo, nccl, hccl."""
    threads_per_rank: int | None
    """torch threads per rank as configured; None: cores // ranks of each case (each case records its own)."""
    world_sizes: list[int]
    """The CP degrees (ranks per launch) of the run's cases."""
    launcher: str
    """"local" (bench spawns the ranks of each case) or "torchrun"."""
    nodes: list[NodeEnvironment] | None = None
    """Under torchrun, every node's environment (each checked equal in NodeEnvironment.COMPARED before the
    first case); None for a local run, whose one host is the fields above."""


def run_git(repo: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`git ARGS` in `repo`, output captured as text; OSError or TimeoutExpired as subprocess raises them."""
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=timeout)


def _git(*args: str) -> str | None:
    """The output of `git ARGS` in the checkout the code runs from, or None when git fails."""
    try:
        out = run_git(REPO_ROOT, *args, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def commit_metadata(repo: Path, commit: str) -> tuple[str | None, str | None]:
    """(committer date ISO 8601, subject) of a commit of `repo`; (None, None) where git does not know it."""
    try:
        shown = run_git(repo, "show", "-s", "--format=%cI%x00%s", commit, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None, None
    date, _, subject = shown.stdout.strip().partition("\0") if shown.returncode == 0 else ("", "", "")
    return date or None, subject or None


def commit_info(repo: Path, commit: str) -> GitInfo:
    """A commit of `repo` as checked out on its own (detached, clean): the code a ref's run measures."""
    date, subject = commit_metadata(repo, commit)
    return GitInfo(commit=commit, branch="HEAD", dirty=False, date=date, subject=subject)


def now_iso() -> str:
    """The local time with its offset, to the second: how result files timestamp things."""
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


REF_ENV = "BENCH_GIT_REF"
"""The ref a worktree was checked out from (`bench compare` and `bench run --commits` set it for each
side): the branch a detached checkout records, instead of git's "HEAD"."""


def _branch(abbrev: str | None) -> str:
    if abbrev == "HEAD":  # detached: a worktree of bench compare or a backfill
        return os.environ.get(REF_ENV) or "detached"
    return abbrev or "unknown"


def git_info() -> GitInfo:
    """Commit, branch and dirty flag of the checkout the code runs from; a detached checkout's branch is
    the ref it was checked out from (REF_ENV), else "detached"."""
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return GitInfo(commit="unknown", branch="unknown", dirty=False)
    status = _git("status", "--porcelain", "--", *CODE_PATHS) or ""
    date, subject = commit_metadata(REPO_ROOT, commit)
    return GitInfo(
        commit=commit,
        branch=_branch(_git("rev-parse", "--abbrev-ref", "HEAD")),
        dirty=bool(status),
        date=date,
        subject=subject,
    )


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _host.processor() or _host.machine()


def torch_npu_version() -> str | None:
    try:
        return importlib.metadata.version("torch-npu")
    except importlib.metadata.PackageNotFoundError:
        return None


def host_environment(platform: Platform, device_name: str, git: GitInfo | None = None) -> dict[str, Any]:
    """This host's HostEnvironment fields (`device_name`: read as the caller may, bench.launch.devices.
    host_device_name; `git`: the checkout's, when the caller has read it already)."""
    git = git or git_info()
    return {
        "git_commit": git.commit,
        "git_dirty": git.dirty,
        "python_version": _host.python_version(),
        "torch_version": torch.__version__,
        "torch_npu_version": torch_npu_version(),
        "device_type": platform.device_type,
        "device_name": device_name,
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count() or 1,
        "kernel_versions": kernel_versions(),
    }


def kernel_versions() -> dict[str, str]:
    """The installed versions of the registered backends' packages, and where the modules and entry points
    imported for a user's backends came from (HostEnvironment.kernel_versions)."""
    versions = {package: version for b in BUILT_IN for package, version in b.versions().items()}
    for name in backend_names():
        versions.update(get_backend(name).versions())
    versions.update({source.target: source.origin for source in backend_sources()})
    return versions


def node_environment(platform: Platform, *, node: int, ranks: int, device_name: str) -> NodeEnvironment:
    """This node's environment, from one of its ranks (`device_name`: its device's, read after set_device)."""
    return NodeEnvironment(node=node, ranks=ranks, **host_environment(platform, device_name))


def collect_environment(
    platform: Platform,
    *,
    device_name: str,
    threads_per_rank: int | None,
    world_sizes: list[int],
    launcher: str,
    git: GitInfo | None = None,
) -> Environment:
    """This host's environment; `device_name`: its devices' (bench.launch.devices.host_device_name, read as
    this process may: a launcher from the probe, a torchrun rank from its own device); `git`: the code
    measured, when it is not this checkout's (a paired compare's refs; default git_info())."""
    git = git or git_info()
    return Environment(
        **host_environment(platform, device_name, git),
        git_branch=git.branch,
        git_date=git.date,
        git_subject=git.subject,
        backend=platform.backend,
        threads_per_rank=threads_per_rank,
        world_sizes=sorted(set(world_sizes)),
        launcher=launcher,
    )
