"""The summary modes' local work per path against ulysses' (issue 49), on gloo ranks at the reference PR's
per-rank shape (bf16, K/V heads 16/32, head dims 128, chunk 64, 2048 tokens per rank, cp 4), the op under CP
(gdn_cp.distributed.cp_chunk_gated_delta_rule, q and k L2-normalised in the op), forward+backward.

Two measures, each per rank position (p2p, contiguous: rank 0 starts the sequence, the middle ranks continue a
document and feed the next, the last feeds no one):
- on paper (`--flops`): the FLOPs of every matmul a rank runs (torch.utils.flop_counter.FlopCounterMode:
  deterministic, whatever the machine's load); the fla rows come from the project's FLOP formula
  (gdn_cp.ops.chunk_gdn_flops, backward 2x forward), since Triton's kernels are not visible to the counter;
- the CPU time (`--time`): each rank's process CPU time of a forward+backward, the paths interleaved round by
  round after a warm-up round; the busiest rank's median per path. Meaningful on an idle machine only:

    python -m tests.benchmarks.cp_local_paths --flops
    python -m tests.benchmarks.cp_local_paths --time --rounds 5 [--cp 4] [--tokens 2048]

Paths: ulysses ("whole"); backend gdn_cp: kcp (checkpoint on), kcp-kept (off), split (overlap); gdn_cp's op
registered as another backend, so that it takes the backend paths: with gdn_cp's summary hook
(recompute+hook) and without (recompute+seam: [S | M] from the op at V + K), and affine (checkpoint off).
Not part of the test suite (pyproject ignores tests/benchmarks).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from gdn_cp.distributed import cp_chunk_gated_delta_rule
from gdn_cp.ops import chunk_gated_delta_rule, chunk_gdn_flops, chunk_state_maps, register_backend

HK, HV, K, V, CHUNK = 16, 32, 128, 128, 64
PATHS: dict[str, dict[str, Any]] = {
    "whole (ulysses)": {"mode": "ulysses"},
    "kcp": {"mode": "p2p", "checkpoint_summary": True},
    "kcp-kept": {"mode": "p2p", "checkpoint_summary": False},
    "split": {"mode": "p2p", "checkpoint_summary": True, "overlap": True},
    "recompute+hook": {"mode": "p2p", "checkpoint_summary": True, "backend": "seam_hooked"},
    "recompute+seam": {"mode": "p2p", "checkpoint_summary": True, "backend": "seam_only"},
    "affine": {"mode": "p2p", "checkpoint_summary": False, "backend": "seam_only"},
}


def _register() -> None:
    """gdn_cp's op behind the seam, as a user would register it (with and without its summary hook)."""
    common = {
        "dtypes": (torch.bfloat16, torch.float32),
        "takes_chunk_size": True,
        "grouped_values": True,
        "varlen": True,
    }
    register_backend("seam_only", chunk_gated_delta_rule, **common)
    register_backend("seam_hooked", chunk_gated_delta_rule, summary=chunk_state_maps, **common)


def _inputs(tokens: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(1, tokens, HK, K, generator=gen) for _ in range(2))
    v = torch.randn(1, tokens, HV, V, generator=gen)
    g = F.logsigmoid(torch.randn(1, tokens, HV, generator=gen))
    beta = torch.sigmoid(torch.randn(1, tokens, HV, generator=gen))
    return [t.to(torch.bfloat16) for t in (q, k, v, g, beta)]


def _step(inputs: list[torch.Tensor], options: dict[str, Any]) -> None:
    """One forward+backward of the op under CP."""
    leaves = [t.detach().requires_grad_(True) for t in inputs]
    o, _ = cp_chunk_gated_delta_rule(*leaves, use_qk_l2norm_in_kernel=True, chunk_size=CHUNK, **options)
    o.float().square().sum().backward()


def rank_flops(tokens: int) -> dict[str, int]:
    """This rank's matmul FLOPs of one forward+backward per path."""
    _register()
    inputs = _inputs(tokens, seed=dist.get_rank())
    out = {}
    for name, options in PATHS.items():
        counter = FlopCounterMode(display=False)
        with counter:
            _step(inputs, options)
        out[name] = counter.get_total_flops()
    return out


def rank_times(tokens: int, rounds: int) -> dict[str, list[float]]:
    """This rank's process CPU seconds of one forward+backward per path and round (a warm-up round first),
    the paths interleaved."""
    _register()
    inputs = _inputs(tokens, seed=dist.get_rank())
    out: dict[str, list[float]] = {name: [] for name in PATHS}
    for round_ in range(rounds + 1):
        for name, options in PATHS.items():
            dist.barrier()
            start = time.process_time()
            _step(inputs, options)
            spent = time.process_time() - start
            if round_:
                out[name].append(spent)
    return out


def fla_on_paper(tokens: int) -> dict[str, float]:
    """fla's paths on paper for a middle rank (it continues a document and feeds the next), relative to
    ulysses, from the project's formula: a call of the op at value width W is chunk_gdn_flops with
    head_v_dim = W, backward 2x forward. Per chunk and value head: the intra pass (K K^T, the UT transform,
    W, U) is the op's own, shared by the pair; FLA's KCP kernel (chunk_cp_fwd_kernel_h) writes S with W h and
    Kt^T v_new (2 C K V each) and M with Kt^T W (2 C K^2) and the K x K product (2 K^3); the pre-pass is one
    more reverse state chain (chunk_gated_delta_rule_bwd_dhu: dv += Kt dh, dh += Q^T dO - W^T dv, 2 C K V
    each), its local dv reused by the one backward."""
    base = {
        "batch": 1,
        "seq_len": tokens,
        "num_k_heads": HK,
        "num_v_heads": HV,
        "head_k_dim": K,
        "chunk_size": CHUNK,
    }
    op_v = chunk_gdn_flops(**base, head_v_dim=V, backward=False)
    op_vk = chunk_gdn_flops(**base, head_v_dim=V + K, backward=False)
    per = -(-tokens // CHUNK) * HV  # chunks x value heads
    C = CHUNK
    intra = per * (2 * C * C * K * HK / HV + C**3 / 3 + 2 * C * C * (K + V))
    chain = per * (4 * C * K * V + 2 * C * K * K + 2 * K**3)
    prepass = per * 6 * C * K * V
    ulysses = 3 * op_v
    return {
        "affine (one call at V + K, its graph kept)": 3 * op_vk / ulysses,
        "recompute (hook, outputs at V, dS through one more call at V)": (intra + chain + 6 * op_v) / ulysses,
        "kcp (the pair: hook on the shared intra pass, outputs at V, pre-pass, one backward)": (
            3 * op_v + chain + prepass
        )
        / ulysses,
    }


def _table(title: str, rows: dict[str, list[float]], cp: int, unit: str) -> None:
    print(f"\n{title}")
    print(f"{'path':<20} " + " ".join(f"{f'rank {r}':>10}" for r in range(cp)) + f"   {unit}")
    for name, values in rows.items():
        print(f"{name:<20} " + " ".join(f"{v:>10.3g}" for v in values))


def main() -> None:
    from bench.launch.local import run_on_ranks

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flops", action="store_true", help="matmul FLOPs per rank and path")
    parser.add_argument("--time", action="store_true", help="CPU time per rank and path (idle machine)")
    parser.add_argument("--cp", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=2048, help="tokens per rank")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.flops:
        per_rank = run_on_ranks(rank_flops, args.cp, (args.tokens,), timeout_s=3600)
        ulysses = [r["whole (ulysses)"] for r in per_rank]
        _table(
            "matmul FLOPs of one forward+backward, relative to ulysses on the same rank",
            {name: [r[name] / u for r, u in zip(per_rank, ulysses, strict=True)] for name in PATHS},
            args.cp,
            "x ulysses",
        )
        print(f"(ulysses: {ulysses[0] / 1e9:.1f} GFLOP per rank)")
        print("\nfla on paper (project formula), a middle rank, relative to ulysses:")
        for name, ratio in fla_on_paper(args.tokens).items():
            print(f"  {name}: {ratio:.2f}x")
    if args.time:
        per_rank = run_on_ranks(rank_times, args.cp, (args.tokens, args.rounds), timeout_s=3600)
        medians = {name: [statistics.median(r[name]) for r in per_rank] for name in PATHS}
        _table("CPU seconds of one forward+backward (median over rounds)", medians, args.cp, "s")
        busiest = {name: max(values) for name, values in medians.items()}
        print("\nbusiest rank, relative to ulysses:")
        for name, seconds in busiest.items():
            print(f"  {name:<20} {seconds:8.3f} s  {seconds / busiest['whole (ulysses)']:.2f}x")


if __name__ == "__main__":
    main()
