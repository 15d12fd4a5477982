"""Rank-side checks of the local-op backends under CP (issue 34): every mode, layout, batch or packed
documents, with states or without, checkpoint on and off, through two ops registered as a user would:

- "gdn_cp_seam": this package's chunk op under another name, declared with everything it supports and with
  gdn_cp's summary hook, so that the summary modes take the backend paths with it (checkpoint off: the affine
  path, one call at V + K; on: the recompute path, [S | M] from the hook), in fp64;
- "user_min": the recurrent reference behind FLA's signature declared with the least (no chunk_size, no
  grouped value heads, no cu_seqlens, no summary hook): key heads repeated for it, one call per document,
  [S | M] from the seam's call at width V + K.

Every function returns plain picklable results; errors are relative (packed_ranks._rel).
"""

from __future__ import annotations

from typing import Any

import packed_ranks
import torch
import torch.distributed as dist
from torch.utils.flop_counter import FlopCounterMode

from gdn_cp import GatedDeltaNet, LinearAttentionContextParallel
from gdn_cp.accuracy import compare_layer_under_cp
from gdn_cp.distributed import MODES, SUMMARY_MODES, cp_chunk_gated_delta_rule
from gdn_cp.ops import (
    chunk_gated_delta_rule,
    chunk_state_maps,
    ran,
    recurrent_gated_delta_rule,
    register_backend,
)
from tests.gdn_cp.ops.helpers import Shape, gdn_inputs

BACKENDS = ("gdn_cp_seam", "user_min")
ALL_DTYPES = (torch.float64, torch.float32, torch.bfloat16)


def _minimal_op(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, **kw):
    if "cu_seqlens" in kw or "chunk_size" in kw or q.shape[2] != v.shape[2]:
        raise AssertionError(f"the registry passed a minimal op what it does not take: {sorted(kw)}")
    use_l2 = kw.pop("use_qk_l2norm_in_kernel")
    return recurrent_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state, use_l2)


def register_test_backends() -> None:
    """Registration is per process: every rank registers them."""
    register_backend(
        "gdn_cp_seam",
        chunk_gated_delta_rule,
        description="gdn_cp's chunk op, registered as a user op",
        dtypes=ALL_DTYPES,
        takes_chunk_size=True,
        grouped_values=True,
        varlen=True,
        summary=chunk_state_maps,
    )
    register_backend("user_min", _minimal_op, dtypes=ALL_DTYPES)


def op_cases(world: int) -> dict[tuple, dict[str, float]]:
    lengths, spanning, _ = packed_ranks.UNEVEN[world]
    T = 6 * world
    zigzag_docs = [0, 1, 3, 4, 5, T - 2, T]
    problems = {
        ("contiguous", "batch"): {"batch": 2},
        ("contiguous", "documents"): {"lengths": lengths, "documents": spanning},
        ("zigzag", "batch"): {"batch": 2},
        ("zigzag", "documents"): {"documents": zigzag_docs},
    }
    out = {}
    for backend in BACKENDS:
        for mode in MODES:
            for (layout, kind), problem in problems.items():
                for states in (True, False):
                    for checkpoint in (True, False) if mode in SUMMARY_MODES else (True,):
                        key = (backend, mode, layout, kind, states, checkpoint)
                        out[key] = packed_ranks.op_case(
                            world,
                            mode,
                            layout=layout,
                            states=states,
                            checkpoint=checkpoint,
                            backend=backend,
                            **problem,
                        )
    return out


def layer_cases(world: int) -> dict[tuple, Any]:
    """The layer with packed documents on each backend (the style's backend, then the config's)."""
    T = 8 * world
    documents = sorted({0, 7, 9, 10, 2 * 8, T - 3, T})
    out = {}
    for backend in BACKENDS:
        for mode in MODES:
            for checkpoint in (True, False):
                result = compare_layer_under_cp(
                    packed_ranks.layer_config(world),
                    mode=mode,
                    seq_len=T,
                    documents=documents,
                    checkpoint_summary=checkpoint,
                    backend=backend,
                    seed=3,
                )
                out[(backend, mode, checkpoint)] = result
    return out


def _message(fn) -> str:
    try:
        fn()
    except Exception as error:  # the tests read which error
        return f"{type(error).__name__}: {error}"
    return "no error"


def error_messages() -> dict[str, str]:
    """Backend refusals on 2 ranks, raised on every rank together."""
    rank = dist.get_rank()
    x = torch.zeros(1, 4, packed_ranks.LAYER["hidden_size"], dtype=torch.float64)
    out = {}
    layer = GatedDeltaNet(packed_ranks.layer_config(2))
    style = LinearAttentionContextParallel(mode="p2p", backend=("gdn_cp", "gdn_cp_seam")[rank])
    style.apply(layer)
    out["ranks_differ_backend"] = _message(lambda: layer(x))
    out["overlap_on_a_backend"] = _message(
        lambda: LinearAttentionContextParallel(mode="scan", backend="gdn_cp_seam", overlap=True).apply(
            GatedDeltaNet(packed_ranks.layer_config(2))
        )
    )
    out["fla_on_cpu"] = _message(
        lambda: LinearAttentionContextParallel(mode="p2p", backend="fla").apply(
            GatedDeltaNet(packed_ranks.layer_config(2, torch.float32))
        )
    )
    out["unknown_backend"] = _message(lambda: LinearAttentionContextParallel(mode="p2p", backend="nope"))
    out["still_in_step"] = _message(lambda: dist.barrier())
    return out


CALLS: list[tuple[int, bool]] = []
"""The spy's calls in this process: (v's last dim, whether autograd records the call)."""


def _spy(q, k, v, g, beta, **kw):
    CALLS.append((v.shape[-1], torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, g, beta))))
    return chunk_gated_delta_rule(q, k, v, g, beta, **kw)


def local_work(world: int) -> dict[str, Any]:
    """Per summary path, on this rank: every call of the op (value width, recorded by autograd or not), the
    matmul FLOPs of a forward+backward (FlopCounterMode) beside those of the single-device op on the rank's
    tokens (ulysses' local work), and what ran (gdn_cp.ops.ran) with the options' default. The op behind the
    seam is gdn_cp's, spied on ("spy": no summary hook; "spy_hooked": gdn_cp's hook)."""
    spied = {"takes_chunk_size": True, "grouped_values": True, "varlen": True, "dtypes": (torch.float64,)}
    register_backend("spy", _spy, **spied)
    register_backend("spy_hooked", _spy, summary=chunk_state_maps, **spied)
    shape = Shape(1, 32 * world, 2, 4, 32, 32)
    x = [t.chunk(world, dim=1)[dist.get_rank()] for t in gdn_inputs(shape, seed=1, unit_qk=True)]
    kw = {"chunk_size": 16, "mode": "p2p"}
    paths = {
        "kcp": {"backend": "gdn_cp", "checkpoint_summary": True},
        "kcp-kept": {"backend": "gdn_cp", "checkpoint_summary": False},
        "recompute+hook": {"backend": "spy_hooked", "checkpoint_summary": True},
        "recompute+seam": {"backend": "spy", "checkpoint_summary": True},
        "affine": {"backend": "spy", "checkpoint_summary": False},
        "default-gdn_cp": {"backend": "gdn_cp"},
        "default-spy": {"backend": "spy"},
    }
    out: dict[str, Any] = {}
    for name, options in paths.items():
        leaves = [t.detach().clone().requires_grad_(True) for t in x]
        CALLS.clear()
        counter = FlopCounterMode(display=False)
        with counter, ran.recording() as record:
            o, _ = cp_chunk_gated_delta_rule(*leaves, **kw, **options)
            o.square().sum().backward()
        call = record.calls[0]
        out[name] = {
            "calls": list(CALLS),
            "flops": counter.get_total_flops(),
            "ran": (call.local_path, call.checkpoint_summary),
        }
    leaves = [t.detach().clone().requires_grad_(True) for t in x]
    counter = FlopCounterMode(display=False)
    with counter:
        o, _ = chunk_gated_delta_rule(*leaves, chunk_size=16)
        o.square().sum().backward()
    out["ulysses_flops"] = counter.get_total_flops()
    return out


def run_world(world: int) -> dict[str, Any]:
    register_test_backends()
    out: dict[str, Any] = {"op": op_cases(world), "layer": layer_cases(world), "local": local_work(world)}
    if world == 2:
        out["errors"] = error_messages()
    return out
