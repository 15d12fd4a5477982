"""Rank-side checks of packed documents, uneven and zigzag shards, and initial/final states under CP
(issue 12). Spawned ranks import this module by name; every function returns plain picklable results.

Errors are relative: max |cp - reference| / max |reference| per tensor, in the reference's own scale.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from itertools import pairwise
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from gdn_cp import GatedDeltaNet, GatedDeltaNetConfig, LinearAttentionContextParallel
from gdn_cp.accuracy import Thresholds, compare_layer_under_cp
from gdn_cp.distributed import (
    MODES,
    SUMMARY_MODES,
    all_gather_stack,
    all_reduce_gradients,
    count_communication,
    cp_chunk_gated_delta_rule,
    gather_sequence,
    shard_sequence,
)
from gdn_cp.distributed.comm_model import layer_communication
from gdn_cp.models import Qwen35Hybrid, Qwen35HybridConfig, apply_context_parallel
from gdn_cp.ops import recurrent_gated_delta_rule
from tests.gdn_cp.ops.helpers import Shape, gdn_inputs

K_DIM, V_DIM, CHUNK = 8, 4, 4
"""Head dims and chunk size of the op checks: chunks of 4 so that every shard holds several."""

UNEVEN = {
    # world: (shard lengths, documents spanning every rank, documents with boundaries at shard edges and
    # one-token documents)
    2: ([1, 11], [0, 5, 12], [0, 1, 2, 3, 7, 12]),
    3: ([5, 1, 8], [0, 3, 12, 14], [0, 5, 6, 7, 8, 14]),
    4: ([3, 1, 6, 4], [0, 2, 13, 14], [0, 3, 4, 5, 10, 14]),
}


def _shape(world: int, batch: int, seq_len: int, dims: tuple[int, int] = (K_DIM, V_DIM)) -> Shape:
    """Heads divisible by the world size (ulysses runs too), two value heads per key head."""
    return Shape(batch, seq_len, world, 2 * world, *dims)


def _rel(actual: torch.Tensor, reference: torch.Tensor) -> float:
    scale = reference.detach().abs().max().item()
    return (actual.detach() - reference.detach()).abs().max().item() / max(scale, 1e-300)


def _local(x: torch.Tensor, layout: str, lengths: list[int] | None) -> torch.Tensor:
    return shard_sequence(x, layout=layout, lengths=lengths).detach().clone().requires_grad_(True)


def op_case(
    world: int,
    mode: str,
    *,
    layout: str = "contiguous",
    lengths: list[int] | None = None,
    documents: list[int] | None = None,
    batch: int = 1,
    checkpoint: bool = True,
    dtype: torch.dtype = torch.float64,
    states: bool = True,
    overlap: bool = False,
    backend: str = "gdn_cp",
    dims: tuple[int, int] = (K_DIM, V_DIM),
    chunk: int = CHUNK,
    tokens: int | None = None,
) -> dict[str, float]:
    """cp_chunk_gated_delta_rule vs the recurrent reference on the whole sequence (per document): outputs,
    final states (and that every rank holds the same), the gradients of q, k, v, g, beta and of the initial
    states. The loss reads every output and, on rank 0 only, the final states. states=False: no initial or
    final states (documents then share chunks: the masked path). `backend`: the local op; `dims` (K, V),
    `chunk` and `tokens` (T when neither lengths nor documents give it) size the problem."""
    T = sum(lengths) if lengths else (documents[-1] if documents else tokens or 8 * world)
    if layout == "zigzag" and not documents and tokens is None:
        T = 6 * world
    shape = _shape(world, batch, T, dims)
    x = gdn_inputs(shape, dtype=torch.float64, seed=1, unit_qk=True)
    n = 1 if documents is None else len(documents) - 1
    gen = torch.Generator().manual_seed(2)
    h0 = torch.randn(
        n if documents else batch, shape.Hv, shape.K, shape.V, generator=gen, dtype=torch.float64
    )
    w_o = torch.randn(batch, T, shape.Hv, shape.V, generator=gen, dtype=torch.float64)
    w_f = torch.randn(h0.shape, generator=gen, dtype=torch.float64)
    cu = None if documents is None else torch.tensor(documents)

    ref_in = [t.clone().requires_grad_(True) for t in x]
    ref_h0 = h0.clone().requires_grad_(True)
    o_ref, f_ref = recurrent_gated_delta_rule(
        *ref_in, initial_state=ref_h0 if states else None, output_final_state=True, cu_seqlens=cu
    )
    ((o_ref * w_o).sum() + ((f_ref * w_f).sum() if states else 0)).backward()

    local = [_local(t.to(dtype), layout, lengths) for t in x]
    h0_cp = h0.to(dtype).requires_grad_(True)
    o, final = cp_chunk_gated_delta_rule(
        *local,
        initial_state=h0_cp if states else None,
        output_final_state=states,
        cu_seqlens=cu,
        mode=mode,
        layout=layout,
        checkpoint_summary=checkpoint,
        overlap=overlap,
        backend=backend,
        chunk_size=chunk,
    )
    loss = (o * shard_sequence(w_o, layout=layout, lengths=lengths).to(dtype)).sum()
    if dist.get_rank() == 0 and states:
        loss = loss + (final * w_f.to(dtype)).sum()
    loss.backward()
    out = {"output": _rel(gather_sequence(o.detach(), layout=layout), o_ref)}
    if states:
        h0_grad = h0_cp.grad.clone()
        dist.all_reduce(h0_grad)  # partial on each rank, like a parameter's
        finals = all_gather_stack(final.detach())
        out["final"] = _rel(final, f_ref)
        out["final_same_on_every_rank"] = (finals - finals[0]).abs().max().item()
        out["initial_state_grad"] = _rel(h0_grad, ref_h0.grad)
    for name, t, r in zip(("q", "k", "v", "g", "beta"), local, ref_in, strict=True):
        out[f"d{name}"] = _rel(gather_sequence(t.grad, layout=layout), r.grad)
    return out


def op_cases(world: int, dtype: torch.dtype = torch.float64) -> dict[tuple, dict[str, float]]:
    lengths, spanning, edges = UNEVEN[world]
    T = 6 * world
    zigzag_docs = [0, 1, 3, 4, 5, T - 2, T]  # boundaries inside pieces, at a piece edge (3), one-token docs
    out: dict[tuple, dict[str, float]] = {}
    for mode in MODES:
        out[(mode, "batch")] = op_case(world, mode, batch=2, dtype=dtype)
        out[(mode, "uneven-spanning")] = op_case(
            world, mode, lengths=lengths, documents=spanning, dtype=dtype
        )
        out[(mode, "zigzag-packed")] = op_case(
            world, mode, layout="zigzag", documents=zigzag_docs, dtype=dtype
        )
        out[(mode, "zigzag")] = op_case(world, mode, layout="zigzag", dtype=dtype)
        out[(mode, "uneven-spanning-stateless")] = op_case(
            world, mode, lengths=lengths, documents=spanning, dtype=dtype, states=False
        )
        out[(mode, "uneven-edges-stateless")] = op_case(
            world, mode, lengths=lengths, documents=edges, dtype=dtype, states=False
        )
        out[(mode, "zigzag-packed-stateless")] = op_case(
            world, mode, layout="zigzag", documents=zigzag_docs, dtype=dtype, states=False
        )
        for checkpoint in (True, False) if mode != "ulysses" else (True,):
            out[(mode, f"uneven-edges-ckpt{int(checkpoint)}")] = op_case(
                world, mode, lengths=lengths, documents=edges, checkpoint=checkpoint, dtype=dtype
            )
        if mode in SUMMARY_MODES:  # the overlapped outputs (split by the entering state), states in and out
            out[(mode, "batch-overlap")] = op_case(world, mode, batch=2, dtype=dtype, overlap=True)
            out[(mode, "uneven-spanning-overlap")] = op_case(
                world, mode, lengths=lengths, documents=spanning, dtype=dtype, overlap=True
            )
            out[(mode, "zigzag-packed-overlap")] = op_case(
                world, mode, layout="zigzag", documents=zigzag_docs, dtype=dtype, overlap=True
            )
            out[(mode, "zigzag-packed-stateless-overlap")] = op_case(
                world, mode, layout="zigzag", documents=zigzag_docs, dtype=dtype, states=False, overlap=True
            )
    return out


LAYER = {
    "hidden_size": 16,
    "head_k_dim": 8,
    "head_v_dim": 4,
    "chunk_size": 4,
}


def layer_config(world: int, dtype: torch.dtype = torch.float64) -> GatedDeltaNetConfig:
    return GatedDeltaNetConfig(**LAYER, num_k_heads=world, num_v_heads=2 * world, dtype=dtype)


def layer_cases(world: int) -> dict[tuple, Any]:
    """The layer under CP (compare_layer_under_cp: per-document single-device reference) with packed
    documents, contiguous and zigzag. Contiguous, shards of 8: a document starting one token before rank 1's
    shard and continuing into it (its Conv1D halo holds one token of it and two of the previous document), a
    one-token document, boundaries at shard edges, a document spanning the later ranks. Zigzag, pieces of 4:
    the same around the edge of pieces 0 and 1, and a boundary at the edge of piece 2."""
    L = 8
    T = L * world
    documents = {
        "contiguous": sorted({0, L - 1, L + 1, L + 2, 2 * L, T - 3, T}),
        "contiguous-edges": [0, L, L + 1, T],
        "zigzag": [0, 3, 5, 6, 8, T - 1, T],
    }
    out = {}
    for mode in MODES:
        for name, docs in (*documents.items(), ("zigzag", None)):
            layout = name.split("-")[0]
            result = compare_layer_under_cp(
                layer_config(world), mode=mode, seq_len=T, layout=layout, documents=docs, seed=3
            )
            out[(mode, name, docs is not None)] = result
    return out


def bf16_layer_cases(world: int) -> dict[tuple, Any]:
    """bf16 with packed documents, contiguous and zigzag, a longer sequence (64 tokens per rank) so that
    documents span chunks: failures against the reference PR's bars (gdn_cp.accuracy.Thresholds())."""
    T = 64 * world
    documents = [0, 5, 40, 41, T - 70, T]
    return {
        (mode, layout): compare_layer_under_cp(
            layer_config(world, torch.bfloat16),
            mode=mode,
            seq_len=T,
            layout=layout,
            documents=documents,
            seed=6,
        ).failures(Thresholds())
        for mode in MODES
        for layout in ("contiguous", "zigzag")
    }


def uneven_layer(world: int, mode: str) -> dict[str, float]:
    """The layer on uneven shards with packed documents vs the single-device layer with cu_seqlens."""
    lengths, spanning, _ = UNEVEN[world]
    T = sum(lengths)
    torch.manual_seed(4)
    ref = GatedDeltaNet(layer_config(world))
    cp_layer = GatedDeltaNet(layer_config(world))
    cp_layer.load_state_dict(ref.state_dict())
    LinearAttentionContextParallel(mode=mode).apply(cp_layer)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, T, LAYER["hidden_size"], generator=gen, dtype=torch.float64)
    cu = torch.tensor(spanning)
    x_ref = x.clone().requires_grad_(True)
    y_ref = ref(x_ref, cu_seqlens=cu)
    y_ref.pow(2).sum().backward()
    x_local = _local(x, "contiguous", lengths)
    y = cp_layer(x_local, cu_seqlens=cu)
    y.pow(2).sum().backward()
    return {
        "output": _rel(gather_sequence(y.detach()), y_ref),
        "input_grad": _rel(gather_sequence(x_local.grad), x_ref.grad),
    }


def hybrid_documents(world: int, mode: str, layout: str) -> dict[str, float]:
    """The hybrid model (3 GDN : 1 full attention) under CP in `layout` with packed documents, against the
    single-device model run on every document alone: logits, loss and every parameter gradient (fp64)."""
    torch.manual_seed(0)
    config = Qwen35HybridConfig(dtype="fp64", chunk_size=4, vocab_size=64)
    ref = Qwen35Hybrid(config)
    model = copy.deepcopy(ref)
    T = 8 * world
    bounds = [0, 3, 5, T - 6, T - 5, T]  # a document spanning the middle ranks, one-token documents
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, config.vocab_size, (1, T + 1), generator=gen)
    inputs, labels = tokens[:, :-1], tokens[:, 1:]

    apply_context_parallel(model, mode=mode, layout=layout)
    cu = torch.tensor(bounds)
    out = model(shard_sequence(inputs, layout=layout), shard_sequence(labels, layout=layout), cu_seqlens=cu)
    out.loss.backward()
    all_reduce_gradients(model.parameters())
    loss = out.loss.detach().clone()
    dist.all_reduce(loss)
    logits = gather_sequence(out.logits.detach(), layout=layout)

    ref_logits = torch.cat([ref(inputs[:, a:b]).logits for a, b in pairwise(bounds)], dim=1)
    ref_loss = F.cross_entropy(ref_logits.flatten(0, 1), labels.flatten())
    ref_loss.backward()
    errors = {
        "loss": abs(loss.item() - ref_loss.item()) / abs(ref_loss.item()),
        "logits": _rel(logits, ref_logits),
    }
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        errors[name] = _rel(p.grad, ref_params[name].grad) if p.grad is not None else float("inf")
    return errors


def measured_communication(world: int) -> dict[str, tuple[dict, dict]]:
    """Bytes counted in a real fwd+bwd step with zigzag and with uneven shards, and the model's."""
    out = {}
    config = layer_config(world, torch.float32)
    T = 4 * world
    for mode in MODES:
        torch.manual_seed(0)
        layer = LinearAttentionContextParallel(mode=mode, layout="zigzag").apply(GatedDeltaNet(config))
        x = shard_sequence(torch.randn(1, T, LAYER["hidden_size"]), layout="zigzag").requires_grad_(True)
        with count_communication() as stats:
            layer(x).pow(2).sum().backward()
        model = layer_communication(
            mode, config, cp=world, rank=dist.get_rank(), seq_len=T, batch=1, layout="zigzag"
        )
        out[f"{mode}-zigzag"] = (stats.as_dict(), model)
    return out


def _message(fn) -> str:
    try:
        fn()
    except Exception as error:  # the tests read which error, on which rank
        return f"{type(error).__name__}: {error}"
    return "no error"


def error_messages() -> dict[str, str]:
    """Every bad input of issue 12 on 2 ranks: each must raise on every rank (this returns, so none hung)."""
    rank = dist.get_rank()
    shape = _shape(2, 1, 8)
    local = [t.chunk(2, dim=1)[rank] for t in gdn_inputs(shape, unit_qk=True)]
    h0 = torch.zeros(2, shape.Hv, K_DIM, V_DIM, dtype=torch.float64)

    def op(cu=None, inputs=local, **kw):
        return cp_chunk_gated_delta_rule(*inputs, cu_seqlens=cu, mode=kw.pop("mode", "p2p"), **kw)

    out = {
        "cu_start": _message(lambda: op(torch.tensor([1, 4, 8]))),
        "cu_increasing": _message(lambda: op(torch.tensor([0, 4, 4, 8]))),
        "cu_end": _message(lambda: op(torch.tensor([0, 4, 9]))),
        "cu_float": _message(lambda: op(torch.tensor([0.0, 4.0, 8.0]))),
        "state_shape": _message(lambda: op(torch.tensor([0, 4, 8]), initial_state=h0[:1])),
        "disagree": _message(lambda: op(torch.tensor([0, 4 + rank, 8]))),
        "batch_on_one_rank": _message(
            lambda: op(
                torch.tensor([0, 4, 8]),
                inputs=local if rank == 0 else [torch.cat([t, t]) for t in local],
            )
        ),
        "zigzag_split": _message(lambda: op(inputs=[t[:, :3] for t in local], layout="zigzag")),
        "ulysses_cu_end": _message(lambda: op(torch.tensor([0, 4, 9]), mode="ulysses")),
        "all_gather_disagree": _message(lambda: op(torch.tensor([0, 4 + rank, 8]), mode="all_gather")),
    }
    # Ranks that call differently (issue 21): every rank raises the same ValueError, naming the argument.
    x = torch.zeros(1, 4, LAYER["hidden_size"], dtype=torch.float64)
    theirs = {
        "num_v_heads": ({}, {"num_v_heads": 4 * (rank + 1)}, {}),
        "mode": ({}, {}, {"mode": "p2p" if rank == 0 else "scan"}),
        "ulysses_or_p2p": ({}, {}, {"mode": "ulysses" if rank == 0 else "p2p"}),
        "chunk_size": ({}, {"chunk_size": 4 * (rank + 1)}, {}),
        "checkpoint_summary": ({}, {}, {"mode": "p2p", "checkpoint_summary": rank == 0}),
        "overlap": ({}, {}, {"mode": "scan", "overlap": rank == 0}),
        "layout": ({}, {}, {"mode": "all_gather", "layout": ("contiguous", "zigzag")[rank]}),
        "dtype": ({"dtype": (torch.float64, torch.float32)[rank]}, {}, {}),
    }
    for name, (cast, config, style) in theirs.items():
        layer = GatedDeltaNet(replace(layer_config(2), **config))
        if "dtype" in cast:
            layer = layer.to(cast["dtype"])
        LinearAttentionContextParallel(**{"mode": "all_gather", **style}).apply(layer)
        out[f"ranks_differ_{name}"] = _message(lambda layer=layer, cast=cast: layer(x.to(**cast)))
    out["op_ranks_differ_chunk_size"] = _message(lambda: op(chunk_size=8 * (rank + 1)))
    out["op_ranks_differ_mode"] = _message(lambda: op(mode=("p2p", "ulysses")[rank]))
    out["op_ranks_differ_states"] = _message(lambda: op(output_final_state=rank == 0))
    for mode in MODES:
        layer = LinearAttentionContextParallel(mode=mode).apply(GatedDeltaNet(layer_config(2)))
        out[f"layer_{mode}_cu_end"] = _message(
            lambda layer=layer, x=x: layer(x, cu_seqlens=torch.tensor([0, 9]))
        )
        out[f"layer_{mode}_disagree"] = _message(
            lambda layer=layer, x=x: layer(x, cu_seqlens=torch.tensor([0, 3 + rank, 8]))
        )
    # After all of that, the group still works: every rank got out of every check together.
    out["still_in_step"] = _message(lambda: dist.barrier())
    return out


def run_world(world: int) -> dict[str, Any]:
    """Every check of issue 12 at one world size, in one launch."""
    out: dict[str, Any] = {
        "op_fp64": op_cases(world),
        "op_fp32": {
            mode: op_case(
                world, mode, lengths=UNEVEN[world][0], documents=UNEVEN[world][1], dtype=torch.float32
            )
            for mode in MODES
        },
        "op_fp32_overlap": {
            mode: op_case(
                world,
                mode,
                lengths=UNEVEN[world][0],
                documents=UNEVEN[world][1],
                dtype=torch.float32,
                overlap=True,
            )
            for mode in SUMMARY_MODES
        },
        "layer": layer_cases(world),
        "layer_bf16": bf16_layer_cases(world),
        "uneven_layer": {mode: uneven_layer(world, mode) for mode in MODES},
        "communication": measured_communication(world),
    }
    if world in (2, 4):  # the hybrid's 4 attention heads split over these
        out["hybrid"] = {
            (mode, layout): hybrid_documents(world, mode, layout)
            for mode in MODES
            for layout in ("contiguous", "zigzag")
        }
    if world == 2:
        out["errors"] = error_messages()
    return out
