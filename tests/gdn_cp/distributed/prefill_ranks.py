"""Rank-side checks of the prefill under CP (GatedDeltaNet.prefill through every mode): spawned ranks import
this module by name and return plain picklable results.

Each case runs the CP prefill under torch.inference_mode() and the single-device prefill of the whole
sequence, and reports relative errors (max |cp - reference| / max |reference|) of the output and of both
final states, whether every rank holds the same states bit for bit, a decoding step from the CP state against
one from the reference's, and the bytes counted against the communication model.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from packed_ranks import LAYER, layer_config

from gdn_cp import LinearAttentionContextParallel
from gdn_cp.distributed import MODES, all_gather_stack, count_communication, gather_sequence, shard_sequence
from gdn_cp.distributed.comm_model import layer_communication
from gdn_cp.layers import GDNState, seeded_layer


def _rel(actual: torch.Tensor, reference: torch.Tensor) -> float:
    scale = reference.abs().max().item()
    return (actual - reference).abs().max().item() / max(scale, 1e-300)


def _spread(state: GDNState) -> float:
    """max |this rank's states - any rank's|: 0 when every rank holds the same."""
    return max(
        (all_gather_stack(t.contiguous()) - t).abs().max().item()
        for t in (state.conv_state, state.recurrent_state)
    )


def prefill_case(
    world: int, mode: str, *, layout: str, batch: int, documents: list[int] | None, seq_len: int
) -> dict[str, Any]:
    """One CP prefill against the single-device prefill, then one decoding step from each state."""
    config = layer_config(world)
    ref = seeded_layer(config, seed=7)
    cp_layer = LinearAttentionContextParallel(mode=mode, layout=layout).apply(copy.deepcopy(ref))
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(batch, seq_len, LAYER["hidden_size"], generator=gen, dtype=config.dtype)
    cu = None if documents is None else torch.tensor(documents)
    with torch.inference_mode():
        y_ref, state_ref = ref.prefill(x, cu)
        with count_communication() as stats:
            y_local, state = cp_layer.prefill(shard_sequence(x, layout=layout), cu)
        y = gather_sequence(y_local, layout=layout)
        # The next token of every sequence (a packed prefill's documents become rows), from each state.
        step = torch.randn(state.recurrent_state.shape[0], 1, LAYER["hidden_size"], generator=gen).to(x)
        next_ref, after_ref = ref.decode(step, state_ref)
        next_cp, after_cp = cp_layer.decode(step, state)
    counted = stats.as_dict()
    model = layer_communication(
        mode, config, cp=world, rank=dist.get_rank(), seq_len=seq_len, batch=batch, backward=False,
        layout=layout, final_states=batch if documents is None else len(documents) - 1,
    )  # fmt: skip
    return {
        "output": _rel(y, y_ref),
        "conv_state": _rel(state.conv_state, state_ref.conv_state),
        "recurrent_state": _rel(state.recurrent_state, state_ref.recurrent_state),
        "decoded": _rel(next_cp, next_ref),
        "state_after_decode": _rel(after_cp.recurrent_state, after_ref.recurrent_state),
        "spread": _spread(state),
        "shapes": (tuple(state.conv_state.shape), tuple(state.recurrent_state.shape)),
        "sequences": batch if documents is None else len(documents) - 1,
        "inference": not y_local.requires_grad and y_local.is_inference(),
        "bytes": (counted, model),
    }


def cases(world: int) -> dict[tuple[str, str], dict[str, Any]]:
    """Every mode in both layouts, unpacked (a batch of two) and packed: a document whose last W tokens
    straddle the first shard edge, a one-token document (its conv state mostly zeros), and documents ending
    at a shard edge or spanning several ranks."""
    L = 8
    T = L * world
    packed = {
        "contiguous": sorted({0, L - 1, L + 1, L + 2, 2 * L, T - 3, T}),
        "zigzag": [0, 3, 5, 6, 8, T - 1, T],
    }
    out = {}
    for mode in MODES:
        for layout in ("contiguous", "zigzag"):
            out[(mode, f"{layout}-batch")] = prefill_case(
                world, mode, layout=layout, batch=2, documents=None, seq_len=T
            )
            out[(mode, f"{layout}-packed")] = prefill_case(
                world, mode, layout=layout, batch=1, documents=packed[layout], seq_len=T
            )
    return out


def run_world(world: int) -> dict[str, Any]:
    return {"cases": cases(world)}
