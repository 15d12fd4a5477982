"""The rough memory estimate used to refuse cases that cannot fit, and the available-memory readers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.launch import devices, estimate, launcher
from bench.launch.estimate import (
    OP_FACTOR,
    available_memory,
    estimate_peak_bytes,
    host_available_bytes,
    human_bytes,
    padded_tokens,
    parameter_count,
)
from bench.suite.config import Case, Scenario, Sweep
from gdn_cp import GatedDeltaNetConfig
from gdn_cp.distributed import DeviceInfo, Platform, resolve_platform
from gdn_cp.layers import GatedDeltaNet


def case(**kw) -> Case:
    base = {"cp": [2], "seq_len": [4096], "mode": ["p2p"], "checkpoint": [True], "pass_": ["forward"]}
    base |= {"layout": ["contiguous"], "documents": [None], "overlap": [False]}
    sweep = Sweep(**{**base, **{k: v for k, v in kw.items() if k in base}})
    model = {"hidden_size": 256, "num_k_heads": 2, "num_v_heads": 4, "head_k_dim": 32, "head_v_dim": 32}
    model.update({k: v for k, v in kw.items() if k not in base})
    (c,) = Scenario(name="s", layer=GatedDeltaNetConfig(**model), sweep=sweep).cases(warmup=1, repeat=1)
    return c


@pytest.mark.parametrize(
    "dims", [{}, {"num_k_heads": 4, "num_v_heads": 8, "head_v_dim": 16, "hidden_size": 96}]
)
def test_parameter_count_matches_the_layer(dims):
    c = case(**dims)
    layer = GatedDeltaNet(c.layer)
    assert parameter_count(c) == sum(p.numel() for p in layer.parameters())


def test_estimate_grows_with_tokens_and_shrinks_with_cp():
    small, large = estimate_peak_bytes(case(seq_len=[4096])), estimate_peak_bytes(case(seq_len=[8192]))
    assert large > 1.8 * small
    assert estimate_peak_bytes(case(cp=[4])) < estimate_peak_bytes(case(cp=[2]))


def test_estimate_orders_the_variants_as_measured():
    # checkpoint off keeps every prepared chunk; backward adds gradients; bf16 halves projections; ulysses'
    # whole-sequence op keeps more per token than the summary modes' kcp path; overlap's split scan keeps
    # every chunk at width V + K
    assert estimate_peak_bytes(case(checkpoint=[False])) > estimate_peak_bytes(case(checkpoint=[True]))
    assert estimate_peak_bytes(case(pass_=["forward_backward"])) > estimate_peak_bytes(case())
    assert estimate_peak_bytes(case(dtype="bf16")) < estimate_peak_bytes(case())
    assert estimate_peak_bytes(case(mode=["ulysses"])) > estimate_peak_bytes(case())
    assert estimate_peak_bytes(case(overlap=[True])) > estimate_peak_bytes(case(checkpoint=[False]))


# Peak allocated per rank (MiB), cpu-profiler meter, `bench run cpu-memory --set 'local_seq_len=[8192]'
# --filter cp=2` (cp 2, 8K tokens per rank at the reference PR's sizes, bf16; 2-core AMD EPYC, torch 2.13;
# issue 49's local paths: kcp with the checkpoint on, kcp-kept off): mode, checkpoint, pass.
MEASURED_AT_PR_SHAPE = {
    ("ulysses", True, "forward"): 2506.9,
    ("ulysses", True, "forward_backward"): 2506.9,
    ("p2p", True, "forward"): 2196.9,
    ("p2p", True, "forward_backward"): 2197.0,
    ("p2p", False, "forward"): 2963.0,
    ("p2p", False, "forward_backward"): 3530.5,
    ("all_gather", True, "forward_backward"): 2210.9,
    ("all_gather", False, "forward_backward"): 3535.9,
    ("scan", True, "forward_backward"): 2195.0,
    ("scan", False, "forward_backward"): 3524.0,
}


@pytest.mark.parametrize(("mode", "checkpoint", "pass_"), list(MEASURED_AT_PR_SHAPE))
def test_the_estimate_bounds_the_measured_peak_at_the_reference_shape(mode, checkpoint, pass_):
    """Issue 35: an upper bound within +25% of what was measured, every mode, checkpoint on and off (a low
    estimate lets an oversized case through; a high one refuses cases that fit)."""
    sizes = {"hidden_size": 2048, "num_k_heads": 16, "num_v_heads": 32, "head_k_dim": 128, "head_v_dim": 128}
    c = case(mode=[mode], checkpoint=[checkpoint], pass_=[pass_], seq_len=[16384], dtype="bf16", **sizes)
    ratio = estimate_peak_bytes(c) / (MEASURED_AT_PR_SHAPE[mode, checkpoint, pass_] * 2**20)
    assert 1.0 <= ratio <= 1.25, ratio


def test_estimate_of_a_calibration_point():
    # Measured with the cpu-profiler meter (gdn_cp eager ops, fp32, 2 threads): p2p checkpoint on, forward,
    # 2048 local tokens, hidden 256, Hk/Hv 2/4, K = V = 32: 19142 bytes per token above the baseline.
    c = case(cp=[1], seq_len=[2048])
    measured = 19142 * 2048 + parameter_count(c) * 4 + 2 * 4 * 2048 * 256
    assert 0.9 < estimate_peak_bytes(c) / measured < 1.1


def test_host_available_bytes(tmp_path: Path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:   100 kB\nMemAvailable:   2048 kB\n")
    assert host_available_bytes(meminfo) == 2048 * 1024
    assert host_available_bytes(tmp_path / "missing") > 0  # falls back to sysconf
    memory = available_memory(resolve_platform("cpu"))
    assert memory.host > 0 and memory.for_ranks(3) == (memory.host, 3)  # the local ranks share the host


def test_human_bytes():
    assert human_bytes(12 * 2**20) == "12.0 MiB" and human_bytes(1.5 * 2**30) == "1.5 GiB"


def test_estimate_counts_padding_to_whole_chunks_and_their_c_by_c_matrices():
    # 4096 tokens per rank in chunks of 64: no padding; one chunk of 10^6 pads the shard 244-fold, and each
    # of its 4 value heads holds 10^6 x 10^6 matrices (terabytes: the run would try to allocate them)
    fitted = estimate_peak_bytes(case())
    assert estimate_peak_bytes(case(chunk_size=1_000_000)) > 4 * 10**12 * 4 > 1000 * fitted

    # one token more than 64 whole chunks pads to a 65th: 64 tokens of chunk intermediates (fp32, Hv = 4,
    # K = V = 32, C = 64: 3K + V + C elements per head and token), times the path's fitted factor
    def local(n: int) -> int:
        return estimate_peak_bytes(case(seq_len=[2 * n]))

    assert local(4097) - local(4096) >= 64 * OP_FACTOR["recompute"] * 4 * 4 * (3 * 32 + 32 + 64)
    assert local(4096) - local(4095) < (local(4097) - local(4096)) / 10  # no new chunk: one token more


def test_zigzag_all_gather_holds_a_summary_per_piece():
    # pieces of 1024 tokens are whole chunks, so only the held summaries differ: cp more [S | M] of
    # Hv x K x (K + V) fp32 elements (zigzag holds 2 cp, contiguous cp)
    gathered = {
        layout: estimate_peak_bytes(case(mode=["all_gather"], layout=[layout]))
        for layout in ("contiguous", "zigzag")
    }
    assert gathered["zigzag"] - gathered["contiguous"] == 2 * 4 * (4 * 32 * 64)
    assert estimate_peak_bytes(case(layout=["zigzag"])) == estimate_peak_bytes(case())  # p2p holds none


def test_zigzag_pads_each_piece_and_documents_pad_nothing():
    # 100 tokens per rank in chunks of 64: contiguous pads to 128; zigzag's two pieces of 50 pad to 64 each
    assert padded_tokens(case(seq_len=[200])) == 128
    assert padded_tokens(case(seq_len=[200], layout=["zigzag"])) == 2 * 64
    # 132 tokens per rank: 3 chunks contiguous, but zigzag's pieces of 66 take 2 chunks each
    assert padded_tokens(case(seq_len=[264])) == 3 * 64
    assert padded_tokens(case(seq_len=[264], layout=["zigzag"])) == 4 * 64
    # documents without states share chunks (resets masked inside them): the same estimate as unpacked
    packed = case(documents=[{"count": 64, "lengths": "lognormal"}])
    assert padded_tokens(packed) == padded_tokens(case())
    assert estimate_peak_bytes(packed) == estimate_peak_bytes(case())


def test_the_launcher_reads_devices_without_a_context_of_its_own(monkeypatch):
    """Issue 20: the parent of the ranks never queries an accelerator itself (a context on GPU 0 of every
    node, and EXCLUSIVE_PROCESS keeping rank 0 out); memory, names and counts come from the probe process,
    and the least free device is the one checked (not device 0's alone)."""
    calls: list[str] = []

    class Recorder:
        def __getattr__(self, name):
            return lambda *a, **k: calls.append(name)

    monkeypatch.setattr(torch, "cuda", Recorder())
    found = (DeviceInfo(0, "H200", 90 * 2**30, 140 * 2**30), DeviceInfo(1, "H200", 7 * 2**30, 140 * 2**30))
    probed: list[str] = []
    monkeypatch.setattr(estimate, "probe_devices", lambda p: probed.append("estimate") or found)
    monkeypatch.setattr(devices, "probe_devices", lambda p: probed.append("devices") or found)
    monkeypatch.setattr(launcher, "probe_devices", lambda p: probed.append("launcher") or found)
    platform = Platform("cuda", "nccl")
    memory = estimate.available_memory(platform)
    assert memory.for_ranks(2) == (7 * 2**30, 1)  # the least free device of those the case takes
    assert memory.for_ranks(1) == (90 * 2**30, 1)  # another job on device 1: a one-rank case runs on 0
    assert devices.host_device_name(platform) == "H200"
    assert launcher._max_local_ranks(platform, None) == 2
    assert probed == ["estimate", "devices", "launcher"] and calls == []
