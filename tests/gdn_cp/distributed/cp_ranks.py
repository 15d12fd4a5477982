"""Functions that run on every rank of a test process group (spawned ranks import them by name).

Each returns plain picklable results (errors, flags, comparisons); the tests assert on them in the parent.
"""

from __future__ import annotations

import copy
import gc
import itertools
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor.parallel import parallelize_module
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

from gdn_cp import GatedDeltaNet, GatedDeltaNetConfig, LinearAttentionContextParallel
from gdn_cp.accuracy import LayerComparison, compare_layer_under_cp, error_stats
from gdn_cp.distributed import (
    MODES,
    SUMMARY_MODES,
    all_gather_stack,
    all_reduce_gradients,
    all_to_all,
    all_to_all_single,
    count_communication,
    exchange_halo,
    gather_sequence,
    shard_sequence,
    state_chain,
)
from gdn_cp.distributed.comm_model import layer_communication
from gdn_cp.distributed.layout import LAYOUTS
from gdn_cp.models import Qwen35Hybrid, Qwen35HybridConfig, apply_context_parallel
from gdn_cp.models.qwen35_transformers import apply_context_parallel_to_qwen35, use_gdn_cp_layers
from gdn_cp.ops import fold_summaries

LAYER = {
    "hidden_size": 32,
    "num_k_heads": 4,
    "num_v_heads": 8,
    "head_k_dim": 8,
    "head_v_dim": 8,
    "chunk_size": 8,
}


def layer_config(dtype: str, **overrides) -> GatedDeltaNetConfig:
    return GatedDeltaNetConfig(**{**LAYER, "dtype": dtype, **overrides})


LayerCase = tuple[str, str, bool, int]
"""(mode, dtype, checkpoint_summary, global seq_len)"""


def ulysses_fits(world: int) -> bool:
    """ulysses needs the test layer's 4 key / 8 value heads to split over the ranks."""
    return LAYER["num_k_heads"] % world == 0


def modes_for(world: int) -> list[str]:
    return [m for m in MODES if m != "ulysses" or ulysses_fits(world)]


def layer_cases(world: int) -> list[LayerCase]:
    cases = []
    for mode in modes_for(world):
        for dtype in ("fp64", "fp32", "bf16"):
            for ckpt in (True, False) if mode != "ulysses" else (True,):
                # 6 tokens per rank cross the chunk boundaries (chunk 8) unevenly.
                cases.append((mode, dtype, ckpt, 6 * world))
        # 1 token per rank: the conv halo spans several earlier ranks.
        cases.append((mode, "fp64", True, world))
    return cases


def layer_comparisons(cases: list[LayerCase]) -> dict[LayerCase, LayerComparison]:
    return {
        case: compare_layer_under_cp(
            layer_config(case[1]), mode=case[0], checkpoint_summary=case[2], seq_len=case[3], batch=2, seed=1
        )
        for case in cases
    }


def measured_communication(world: int) -> dict[str, tuple[dict, dict]]:
    """Per mode and pass: (bytes counted during a real step, the analytic model) on this rank."""
    out = {}
    config, seq_len, batch = layer_config("bf16"), 6 * world, 2
    for mode in modes_for(world):
        for backward in (False, True):
            torch.manual_seed(0)
            layer = LinearAttentionContextParallel(mode=mode).apply(GatedDeltaNet(config))
            x = shard_sequence(torch.randn(batch, seq_len, LAYER["hidden_size"], dtype=torch.bfloat16))
            x.requires_grad_(True)
            with count_communication() as stats:
                y = layer(x)
                if backward:
                    y.float().pow(2).sum().backward()
            model = layer_communication(
                mode, config, cp=world, rank=dist.get_rank(), seq_len=seq_len, batch=batch, backward=backward
            )
            out[f"{mode}-{'fwd_bwd' if backward else 'fwd'}"] = (stats.as_dict(), model)
    return out


HYBRID_WORLDS = (2, 4)  # the hybrid model's 4 attention heads split over these


def run_world(world: int) -> dict[str, Any]:
    """Every multi-rank check for one world size, in one launch (a launch costs seconds)."""
    out: dict[str, Any] = {
        "a2a_single": check_all_to_all_single(),
        "ulysses_round_trip": {
            (1, 1): check_ulysses_round_trip(1, 1),
            (3, 2): check_ulysses_round_trip(3, 2),
        },
        "halo": {n: check_exchange_halo(n, 3) for n in (1, 2, 5)},
        "all_gather_stack": check_all_gather_stack(),
        "state_chain": check_state_chain(),
        "all_reduce_gradients": check_all_reduce_gradients(),
        "layer": layer_comparisons(layer_cases(world)),
        "checkpoint_on_off": {m: checkpoint_on_off(m, 3 * world) for m in SUMMARY_MODES},
        "overlap": overlap_comparisons(world),
        "communication": measured_communication(world),
        "tensors_left": tensors_left_by_steps(world),
    }
    if world in HYBRID_WORLDS:
        out["hybrid"] = {m: hybrid_comparison(m, 8 * world, "fp64") for m in MODES}
        out["transformers_qwen35"] = {m: transformers_qwen35_comparison(m, 8 * world) for m in MODES}
    if world == 2:
        out["errors"] = error_messages()
        out["parallel_style"] = parallel_style_checks()
    return out


def _live_tensors() -> int:
    return sum(issubclass(type(o), torch.Tensor) for o in gc.get_objects())


WARMUP_STEPS, WATCHED_STEPS = 3, 8
"""tensors_left_by_steps: steps that warm up anything cached on first use, then the steps counted."""


def tensors_left_by_steps(world: int) -> dict[str, int]:
    """Per mode, layout and pass: the least growth, over WATCHED_STEPS steps whose outputs were dropped, of
    the Python tensors alive after a step against after the step before. A leak grows the count on every
    step (by the L tensors of the graph it holds), so the least growth is L; gloo frees a finished
    collective's buffers only when its worker thread takes the next one (2 tensors a work, at most 4 a
    group, over 400 plain all_to_all_single calls), and something created once jumps once: the count
    then rises and falls, and some step grows it by 0 or less. A graph held in a reference cycle through
    autograd's C++ nodes is never freed, not even by the cycle collector: memory grows pass after pass (a
    p2p forward on a 2-core VM then ran 2x slower, in page faults)."""
    out = {}
    config, seq_len = layer_config("fp32"), 8 * world
    for mode in modes_for(world):
        for layout in LAYOUTS:
            for backward in (False, True):
                torch.manual_seed(0)
                layer = LinearAttentionContextParallel(mode=mode, layout=layout).apply(GatedDeltaNet(config))
                x = shard_sequence(torch.randn(2, seq_len, LAYER["hidden_size"]), layout=layout)
                x.requires_grad_(True)
                counts = []
                gc.freeze()  # what exists now is neither scanned nor counted: collections take ms, not 0.1 s
                for _ in range(WARMUP_STEPS + WATCHED_STEPS):
                    y = layer(x)
                    if backward:
                        y.pow(2).sum().backward()
                        layer.zero_grad(set_to_none=True)
                        x.grad = None
                    del y
                    gc.collect()
                    counts.append(_live_tensors())
                gc.unfreeze()
                watched = counts[WARMUP_STEPS - 1 :]  # the count before the first watched step, then each
                key = f"{mode}-{layout}-{'fwd_bwd' if backward else 'fwd'}"
                out[key] = min(b - a for a, b in itertools.pairwise(watched))
    return out


def overlap_comparisons(world: int) -> dict[LayerCase, LayerComparison]:
    """The layer with overlap on, in every summary mode, against the single-device layer: fp64 and fp32 at
    6 tokens per rank (checkpoint on and off), and 1 token per rank."""
    cases = [
        (mode, dtype, ckpt, 6 * world)
        for mode in SUMMARY_MODES
        for dtype in ("fp64", "fp32")
        for ckpt in (True, False)
    ] + [(mode, "fp64", True, world) for mode in SUMMARY_MODES]
    return {
        case: compare_layer_under_cp(
            layer_config(case[1]),
            mode=case[0],
            checkpoint_summary=case[2],
            seq_len=case[3],
            batch=2,
            seed=1,
            overlap=True,
        )
        for case in cases
    }


def checkpoint_on_off(mode: str, seq_len: int) -> float:
    """Largest difference between checkpoint on and off, relative to each tensor's scale, over the output and
    every gradient (fp64). The two settings take different local paths (SequenceShardMode.local_path)."""
    results = []
    for ckpt in (True, False):
        torch.manual_seed(3)
        layer = GatedDeltaNet(layer_config("fp64"))
        LinearAttentionContextParallel(mode=mode, checkpoint_summary=ckpt).apply(layer)
        x = shard_sequence(torch.randn(2, seq_len, LAYER["hidden_size"], dtype=torch.float64)).clone()
        x.requires_grad_(True)
        y = layer(x)
        y.pow(2).sum().backward()
        results.append([y.detach(), x.grad] + [p.grad for p in layer.parameters()])
    return max(_max_abs(a, b) / b.abs().max().item() for a, b in zip(*results, strict=True))


# --- collectives -------------------------------------------------------------------------------------------


def _split_sizes(src: int, dst: int) -> int:
    """Rows rank `src` sends to rank `dst`: uneven, and zero for some pairs (never for src == dst == 0)."""
    return (2 * src + dst + 1) % 3


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b|, 0 for empty tensors."""
    return (a - b).abs().max().item() if a.numel() else 0.0


def _rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (0 for empty tensors): the error on the reference's scale, as the tests' fp64
    bounds (tests.gdn_cp.ops.helpers.tolerance) are relative."""
    return error_stats(a, b).rel_max


def _rows(src: int, dst: int, n: int, width: int) -> torch.Tensor:
    """The rows src sends dst, and the weight dst applies to them, both known to every rank."""
    base = torch.arange(n * width, dtype=torch.float64).view(n, width)
    return base + 100 * src + 10 * dst


def check_all_to_all_single() -> dict[str, float]:
    rank, size = dist.get_rank(), dist.get_world_size()
    width = 3
    send_sizes = [_split_sizes(rank, j) for j in range(size)]
    recv_sizes = [_split_sizes(j, rank) for j in range(size)]
    x = torch.cat([_rows(rank, j, send_sizes[j], width) for j in range(size)]).requires_grad_(True)
    out = all_to_all_single(x, recv_sizes, send_sizes)
    expected = torch.cat([_rows(j, rank, recv_sizes[j], width) for j in range(size)])
    weight = expected.sin()  # a weight per received row
    (out * weight).sum().backward()
    # Rows I sent to j were weighted by j with sin(rows): the gradient comes back in the order sent.
    expected_grad = torch.cat([_rows(rank, j, send_sizes[j], width).sin() for j in range(size)])
    return {
        "forward": _rel_error(out, expected),
        "backward": _rel_error(x.grad, expected_grad),
    }


def check_ulysses_round_trip(local_seq: int, batch: int) -> dict[str, float]:
    """Shard(sequence) -> Shard(head) -> Shard(sequence), forward and backward (the PR's B=1, L=1 test)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    heads, dim = 2 * size, 3
    gen = torch.Generator().manual_seed(0)
    full = torch.randn(batch, local_seq * size, heads, dim, generator=gen, dtype=torch.float64)
    weight = torch.randn(full.shape, generator=gen, dtype=torch.float64)
    x = shard_sequence(full).clone().requires_grad_(True)
    head_shard = all_to_all(x, scatter_dim=2, gather_dim=1)
    back = all_to_all(head_shard * 2, scatter_dim=1, gather_dim=2)
    (back * shard_sequence(weight)).sum().backward()
    h = heads // size
    return {
        "head_shard": _rel_error(head_shard, full[:, :, rank * h : (rank + 1) * h]),
        "round_trip": _rel_error(back, 2 * x),
        "backward": _rel_error(x.grad, 2 * shard_sequence(weight)),
    }


def check_exchange_halo(local_seq: int, width: int) -> dict[str, float]:
    rank, size = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(0)
    full = torch.randn(2, local_seq * size, 5, generator=gen, dtype=torch.float64)
    weights = [torch.randn(2, width, 5, generator=gen, dtype=torch.float64) for _ in range(size)]
    x = shard_sequence(full).clone().requires_grad_(True)
    halo = exchange_halo(x, width)
    start = rank * local_seq
    lo = max(0, start - width)
    (halo * weights[rank][:, : halo.shape[1]]).sum().backward()
    # Reference: every rank's halo taken from the full sequence in one process.
    ref = full.clone().requires_grad_(True)
    loss = 0
    for r in range(size):
        s = r * local_seq
        piece = ref[:, max(0, s - width) : s]
        loss = loss + (piece * weights[r][:, : piece.shape[1]]).sum()
    loss.backward()
    return {
        "length": float(halo.shape[1] != start - lo),
        "forward": _rel_error(halo, full[:, lo:start]),
        "backward": _rel_error(x.grad, shard_sequence(ref.grad)),
    }


def check_all_gather_stack() -> dict[str, float]:
    rank, size = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(2, 3, generator=gen, dtype=torch.float64) for _ in range(size)]
    ws = [torch.randn(size, 2, 3, generator=gen, dtype=torch.float64) for _ in range(size)]
    x = xs[rank].clone().requires_grad_(True)
    gathered = all_gather_stack(x)
    (gathered * ws[rank]).sum().backward()
    expected_grad = sum(w[rank] for w in ws)  # every rank weighted my slot
    return {
        "forward": _rel_error(gathered, torch.stack(xs)),
        "backward": _rel_error(x.grad, expected_grad),
    }


STATE_K = 3
"""K of the state chain check: each fold step is a K-long dot product per entry."""


def check_state_chain() -> dict[str, float]:
    """H_in of every rank and dS, dM against a single-process fold of all summaries."""
    rank, size = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(0)
    K, V = STATE_K, 2
    Ss = [torch.randn(1, 2, K, V, generator=gen, dtype=torch.float64) for _ in range(size)]
    Ms = [torch.randn(1, 2, K, K, generator=gen, dtype=torch.float64) * 0.5 for _ in range(size)]
    ws = [torch.randn(1, 2, K, V, generator=gen, dtype=torch.float64) for _ in range(size)]
    S, M = Ss[rank].clone().requires_grad_(True), Ms[rank].clone().requires_grad_(True)
    h_in = state_chain(S[None], M[None])[0]  # one piece per rank
    if size > 1:
        (h_in * ws[rank]).sum().backward()

    rS = [s.clone().requires_grad_(True) for s in Ss]
    rM = [m.clone().requires_grad_(True) for m in Ms]
    loss = 0
    for r in range(1, size):
        loss = loss + (fold_summaries(list(zip(rS[:r], rM[:r], strict=True))) * ws[r]).sum()
    expected_h = fold_summaries(list(zip(Ss[:rank], Ms[:rank], strict=True))) if rank else torch.zeros_like(S)
    out = {"forward": _rel_error(h_in, expected_h)}
    if size > 1:  # on one rank the chain is a constant zero state: nothing to differentiate
        loss.backward()
        gS = rS[rank].grad if rS[rank].grad is not None else torch.zeros_like(S)
        gM = rM[rank].grad if rM[rank].grad is not None else torch.zeros_like(M)
        out["grad_S"] = _rel_error(S.grad, gS)
        out["grad_M"] = _rel_error(M.grad, gM)
    return out


def check_all_reduce_gradients() -> float:
    rank, size = dist.get_rank(), dist.get_world_size()
    p32 = torch.nn.Parameter(torch.zeros(3))
    p64 = torch.nn.Parameter(torch.zeros(2, 2, dtype=torch.float64))
    p32.grad = torch.full((3,), float(rank + 1))
    p64.grad = torch.full((2, 2), float(rank), dtype=torch.float64)
    no_grad = torch.nn.Parameter(torch.zeros(1))
    all_reduce_gradients([p32, p64, no_grad])
    expect32 = size * (size + 1) / 2
    expect64 = size * (size - 1) / 2
    return max(_max_abs(p32.grad, expect32), _max_abs(p64.grad, expect64))


# --- the hybrid model ---------------------------------------------------------------------------------------


def hybrid_comparison(mode: str, seq_len: int, dtype: str) -> dict[str, float]:
    """Loss and every gradient of the hybrid model under CP against the single-rank model."""
    torch.manual_seed(0)
    config = Qwen35HybridConfig(dtype=dtype, chunk_size=4, vocab_size=64)
    ref = Qwen35Hybrid(config)
    model = copy.deepcopy(ref)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, config.vocab_size, (2, seq_len + 1), generator=gen)
    inputs, labels = tokens[:, :-1], tokens[:, 1:]

    apply_context_parallel(model, mode=mode)
    out = model(shard_sequence(inputs), shard_sequence(labels))
    out.loss.backward()
    all_reduce_gradients(model.parameters())
    loss = out.loss.detach().clone()
    dist.all_reduce(loss)
    logits = gather_sequence(out.logits.detach())

    ref_out = ref(inputs, labels)
    ref_out.loss.backward()
    errors = {
        "loss": abs(loss.item() - ref_out.loss.item()) / abs(ref_out.loss.item()),
        "logits": error_stats(logits, ref_out.logits).rel_max,
    }
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        errors[name] = (
            error_stats(p.grad, ref_params[name].grad).rel_max if p.grad is not None else float("inf")
        )
    return errors


# --- transformers' Qwen3.5 under CP -------------------------------------------------------------------------

QWEN35_CONFIG = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 4,  # 3 linear : 1 full attention
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 64,
    "linear_num_key_heads": 4,
    "linear_num_value_heads": 8,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
}
"""A tiny Qwen3.5 text model whose heads split over 2 and 4 ranks."""


def transformers_qwen35_comparison(mode: str, seq_len: int) -> dict[str, float]:
    """transformers' Qwen3_5ForCausalLM under CP (apply_context_parallel_to_qwen35) against the same model on
    one rank with gdn_cp's GDN layers (use_gdn_cp_layers), in fp64: logits, a global loss, every gradient.
    Returns errors relative to the reference's scale, and "names" (1.0 when the state_dict's names and shapes
    are the original model's)."""
    torch.manual_seed(0)
    hf = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**QWEN35_CONFIG)).double()
    ref = use_gdn_cp_layers(copy.deepcopy(hf))
    model = apply_context_parallel_to_qwen35(copy.deepcopy(hf), mode=mode)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, QWEN35_CONFIG["vocab_size"], (2, seq_len), generator=gen)
    weights = torch.randn(2, seq_len, QWEN35_CONFIG["vocab_size"], generator=gen, dtype=torch.float64)
    positions = torch.arange(seq_len).expand(2, seq_len)

    logits = model(
        input_ids=shard_sequence(ids), position_ids=shard_sequence(positions), use_cache=False
    ).logits
    (logits * shard_sequence(weights)).sum().backward()
    all_reduce_gradients(model.parameters())
    ref_logits = ref(input_ids=ids, use_cache=False).logits
    (ref_logits * weights).sum().backward()
    errors = {"logits": error_stats(gather_sequence(logits.detach()), ref_logits).rel_max}
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        grad = ref_params[name].grad
        errors[name] = error_stats(p.grad, grad).rel_max if p.grad is not None else float("inf")
    shapes = {k: tuple(v.shape) for k, v in hf.state_dict().items()}
    errors["names"] = float({k: tuple(v.shape) for k, v in model.state_dict().items()} == shapes)
    return errors


# --- LinearAttentionContextParallel as a torch ParallelStyle ------------------------------------------------

STYLE_PLAN = {
    "layers.0.linear_attn": ("p2p", True),
    "layers.1.linear_attn": ("ulysses", True),
    "layers.2.linear_attn": ("all_gather", False),
}
"""parallelize_module's plan for parallel_style_checks: plan key -> (mode, checkpoint_summary)."""
STYLE_CONFIG = {"dtype": "fp64", "chunk_size": 4, "vocab_size": 64, "layer_types": ("linear_attention",) * 3}
"""A Qwen35Hybrid of GDN layers only: embedding, norms, MLPs and lm_head around the CP layers, and no full
attention (which parallelize_module's plan does not cover)."""
STYLE_BATCH = 2


def _style_plan() -> dict[str, LinearAttentionContextParallel]:
    return {
        key: LinearAttentionContextParallel(mode=mode, checkpoint_summary=ckpt)
        for key, (mode, ckpt) in STYLE_PLAN.items()
    }


def parallel_style_checks() -> dict[str, Any]:
    """parallelize_module over a 1-D mesh of every rank, against the single-device model, and src_data_rank.

    "errors": the model's logits and every parameter gradient (summed over ranks) relative to the
    reference's scale. Before parallelising, ranks other than 0 perturb their GDN weights: the default
    src_data_rank=0 must hand every rank rank 0's. "modes": the CP mode each planned layer got.
    """
    rank, size = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (size,), mesh_dim_names=("cp",))
    torch.manual_seed(0)
    config = Qwen35HybridConfig(**STYLE_CONFIG)
    ref = Qwen35Hybrid(config)
    model = copy.deepcopy(ref)
    if rank != 0:
        with torch.no_grad():
            for layer in model.layers:
                for p in layer.linear_attn.parameters():
                    p.add_(1.0)
    parallelize_module(model, mesh, _style_plan())

    seq_len = 8 * size
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, config.vocab_size, (STYLE_BATCH, seq_len), generator=gen)
    weight = torch.randn(STYLE_BATCH, seq_len, config.vocab_size, generator=gen, dtype=torch.float64)
    group = mesh.get_group()
    logits_local = model(shard_sequence(tokens, group)).logits
    (logits_local * shard_sequence(weight, group)).sum().backward()
    all_reduce_gradients(model.parameters(), group)
    ref_logits = ref(tokens).logits
    (ref_logits * weight).sum().backward()

    errors = {"logits": _rel_error(gather_sequence(logits_local.detach(), group), ref_logits)}
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        errors[name] = _rel_error(p.grad, ref_params[name].grad) if p.grad is not None else float("inf")
    executors = {key: model.get_submodule(key).context_parallel for key in STYLE_PLAN}
    modes = {
        key: (ex.name, ex.options.checkpoint_summary) if ex is not None else None
        for key, ex in executors.items()
    }
    return {"errors": errors, "modes": modes, **src_data_rank_checks(mesh), **style_error_messages(mesh)}


def _seeded_layer(seed: int) -> GatedDeltaNet:
    torch.manual_seed(seed)
    return GatedDeltaNet(layer_config("fp64"))


def _parameter_distance(layer: GatedDeltaNet, expected: GatedDeltaNet) -> float:
    """max |a - b| over every parameter of two layers of one config."""
    return max(
        _max_abs(a.detach(), b.detach())
        for a, b in zip(layer.parameters(), expected.parameters(), strict=True)
    )


def src_data_rank_checks(mesh: DeviceMesh) -> dict[str, float]:
    """Each rank builds a layer from its own seed; after parallelize_module every rank holds the source
    rank's parameters exactly (src_data_rank=1), or its own (None)."""
    rank = dist.get_rank()
    out = {}
    for src in (1, None):
        layer = parallelize_module(
            _seeded_layer(rank), mesh, LinearAttentionContextParallel(), src_data_rank=src
        )
        expected = _seeded_layer(rank if src is None else src)
        out[f"src_data_rank={src}"] = _parameter_distance(layer, expected)
    out["seeds_differ"] = _parameter_distance(_seeded_layer(0), _seeded_layer(1))
    return out


def style_error_messages(mesh: DeviceMesh) -> dict[str, str]:
    """What parallelize_module reports for a plan naming a module that is not a GatedDeltaNet, and for a
    src_data_rank outside the mesh (the latter before the layer is touched)."""
    model = Qwen35Hybrid(Qwen35HybridConfig(**STYLE_CONFIG))
    layer = GatedDeltaNet(layer_config("fp32"))
    bad_src = _message(
        lambda: parallelize_module(layer, mesh, LinearAttentionContextParallel(), src_data_rank=5)
    )
    return {
        "not_a_gdn_in_plan": _message(
            lambda: parallelize_module(model, mesh, {"layers.0.mlp": LinearAttentionContextParallel()})
        ),
        "bad_src_data_rank": bad_src,
        "untouched_after_bad_src": str(layer.context_parallel is None),
    }


# --- error paths --------------------------------------------------------------------------------------------


def _message(fn) -> str:
    try:
        fn()
    except (ValueError, NotImplementedError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def error_messages() -> dict[str, str]:
    """Every CP error path that needs a real group of 2 ranks; returns each path's exception."""
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    size = dist.get_world_size()
    out: dict[str, str] = {}
    odd_heads = layer_config("fp32", num_k_heads=3, num_v_heads=3)
    out["ulysses_heads"] = _message(
        lambda: LinearAttentionContextParallel(mode="ulysses").apply(GatedDeltaNet(odd_heads))
    )
    out["tp_group"] = _message(
        lambda: LinearAttentionContextParallel().apply(
            GatedDeltaNet(layer_config("fp32")), tp_group=dist.group.WORLD
        )
    )
    mesh = init_device_mesh("cpu", (size,), mesh_dim_names=("tp",))
    tp_layer = GatedDeltaNet(layer_config("fp32"))
    tp_layer.out_proj.weight = torch.nn.Parameter(
        distribute_tensor(tp_layer.out_proj.weight.data, mesh, [Shard(0)])
    )
    out["tp_dtensor"] = _message(lambda: LinearAttentionContextParallel().apply(tp_layer, mesh))
    out["not_a_gdn"] = _message(lambda: LinearAttentionContextParallel().apply(torch.nn.Linear(2, 2)))
    out["uneven_shard_sequence"] = _message(lambda: shard_sequence(torch.zeros(1, 2 * size + 1, 4)))

    # A DeviceMesh works as the CP group, and a DTensor input comes back as a DTensor of the same placement.
    cp_mesh = init_device_mesh("cpu", (size,), mesh_dim_names=("cp",))
    torch.manual_seed(0)
    dt_layer = LinearAttentionContextParallel(mode="all_gather").apply(
        GatedDeltaNet(layer_config("fp64")), cp_mesh
    )
    full = torch.randn(1, 4 * size, LAYER["hidden_size"], dtype=torch.float64)
    y = dt_layer(distribute_tensor(full, cp_mesh, [Shard(1)]))
    torch.manual_seed(0)
    plain = GatedDeltaNet(layer_config("fp64"))
    out["dtensor_output"] = (
        f"{type(y).__name__} {y.placements} "
        f"err={_rel_error(y.full_tensor(), plain(full)) if isinstance(y, DTensor) else 'n/a'}"
    )
    # Parameters keep names and full shapes: the CP layer's state_dict loads into a plain layer.
    fresh = GatedDeltaNet(layer_config("fp64"))
    out["state_dict"] = str(fresh.load_state_dict(dt_layer.state_dict(), strict=True))
    return out


def every_mode_then_delay(world: int, seed: int) -> int:
    """Every mode (summary modes with overlap off and on) forward and backward, then one rank, drawn from
    `seed`, waits a random while before returning (and tearing down): the rank that finishes first must not
    reset the connections its peers still read from."""
    rank = dist.get_rank()
    x = torch.randn(2, 6 * world, LAYER["hidden_size"], generator=torch.Generator().manual_seed(seed))
    for mode in modes_for(world):
        for overlap in (False, True) if mode in SUMMARY_MODES else (False,):
            torch.manual_seed(seed)
            layer = GatedDeltaNet(layer_config("fp32"))
            LinearAttentionContextParallel(mode=mode, overlap=overlap).apply(layer)
            layer(shard_sequence(x, dist.group.WORLD)).square().sum().backward()
    draw = torch.Generator().manual_seed(seed)
    late = int(torch.randint(world, (1,), generator=draw))
    if rank == late:
        time.sleep(0.3 * float(torch.rand((), generator=draw)))
    return rank
