"""Test hooks for `bench verify` (test code only): break a CP mode on purpose, to prove that verify fails.

Spawned ranks import this module by name (as bench_ranks), so the hooks are module-level functions.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from gdn_cp.layers import GatedDeltaNet

SKEW = 1.05
"""How much the broken mode scales the output shards of ranks after the first."""


def _skew_later_ranks(module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    return output * SKEW if dist.get_rank() > 0 else output


def skew_later_ranks(layer: GatedDeltaNet) -> None:
    """Ranks after the first return outputs 5% too large, as a mode whose hand-off of the state were wrong
    would: the gathered output, the input gradient and the parameter gradients all disagree with the
    reference."""
    layer.register_forward_hook(_skew_later_ranks)


def _without_documents(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    return args, {**kwargs, "cu_seqlens": None}


def ignore_documents(layer: GatedDeltaNet) -> None:
    """The CP layer runs packed documents as one sequence (the state and the Conv1D flow across every
    boundary), as a mode that dropped cu_seqlens would: only a per-document reference can tell."""
    layer.register_forward_pre_hook(_without_documents, with_kwargs=True)


def ignore_layout(layer: GatedDeltaNet) -> None:
    """The CP layer reads its zigzag shard as a contiguous one (its two pieces as one slice), as a mode that
    ignored its layout would."""
    executor = layer.context_parallel
    options = dataclasses.replace(executor.options, layout="contiguous")
    layer.context_parallel = type(executor)(executor.group, options)
