"""Launcher pieces that need no ranks: torchrun detection, threads per rank, warnings, SIGTERM."""

from __future__ import annotations

import os
import signal

import pytest

from bench.launch.launcher import (
    TorchrunEnv,
    oversubscription_warning,
    sigterm_as_interrupt,
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


def test_sigterm_stops_a_sweep_like_ctrl_c_and_the_handler_is_restored():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"), sigterm_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before the next statement
    assert signal.getsignal(signal.SIGTERM) is before
