"""Launcher pieces that need no ranks: torchrun detection, threads per rank, warnings, quiet logs."""

from __future__ import annotations

import logging
import os

from bench.launch.launcher import (
    QUIET_LOGGERS,
    TorchrunEnv,
    oversubscription_warning,
    quiet_launcher_logs,
    threads_per_rank,
    torchrun_env,
)


def test_torchrun_env_detection():
    assert torchrun_env({}) is None
    assert torchrun_env({"RANK": "0"}) is None  # both RANK and WORLD_SIZE are needed
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h"}
    assert torchrun_env(env) == TorchrunEnv(rank=3, world_size=8, local_rank=1, local_world_size=2)
    # a single-node launcher that sets only RANK/WORLD_SIZE
    assert torchrun_env({"RANK": "1", "WORLD_SIZE": "2"}) == TorchrunEnv(1, 2, 1, 2)


def test_threads_per_rank():
    cores = os.cpu_count() or 1
    assert threads_per_rank(3, 2) == 3
    assert threads_per_rank(None, 1) == cores
    assert threads_per_rank(None, 4 * cores) == 1


def test_oversubscription_warning():
    cores = os.cpu_count() or 1
    assert oversubscription_warning(1, cores) is None
    warning = oversubscription_warning(cores + 1, 1)
    assert warning is not None and f"exceed this host's {cores} cores" in warning


def test_quiet_launcher_logs_restores_levels():
    logger = logging.getLogger(QUIET_LOGGERS[0])
    before = logger.level
    with quiet_launcher_logs():
        assert logger.level == logging.CRITICAL
    assert logger.level == before
