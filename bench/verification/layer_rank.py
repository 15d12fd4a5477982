"""What every rank of a `bench verify` case runs: gdn_cp.accuracy.compare_layer_under_cp, once per seed, in
the case's layout and, with packed documents, against the single-device layer run on each document on its
own (outputs concatenated, gradients of the concatenation).

Runs inside the case's process group (a pool of `cp` local ranks, bench.launch.pool, or a torchrun job of
cp ranks); every rank returns the same comparisons (rank 0 computes them against the full-sequence
reference it runs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch.distributed import ProcessGroup

from bench.suite.config import Case
from gdn_cp.accuracy import LayerComparison, compare_layer_under_cp
from gdn_cp.distributed import local_rank, resolve_platform
from gdn_cp.layers import GatedDeltaNet

LayerHook = Callable[[GatedDeltaNet], None]
"""Applied to the CP layer after CP is applied (compare_layer_under_cp's `layer_hook`). A TEST HOOK: tests
pass a module-level function that breaks a mode on purpose, to prove that verify fails; `bench verify` on
the command line never sets it."""


def compare_on_rank(
    case: Case,
    device_kind: str,
    *,
    seeds: Sequence[int],
    layer_hook: LayerHook | None = None,
    group: ProcessGroup | None = None,
) -> list[LayerComparison]:
    """The case's CP layer against the reference, once per seed (forward and backward), on this rank.

    Args:
        case: mode, checkpoint, cp (the group's size), seq_len, batch, dtype, layout, documents and the
            layer's dims
        device_kind: the launch's device (cpu, cuda, npu)
        seeds: seeds of weights, input and output gradient
        layer_hook: a test hook (see LayerHook)
        group: the case's process group (None: the default group, a launch of cp ranks)
    Returns:
        One comparison per seed, identical on every rank.
    """
    platform = resolve_platform(device_kind)
    device = platform.device(local_rank())
    return [
        compare_layer_under_cp(
            case.layer,
            mode=case.mode,
            checkpoint_summary=bool(case.checkpoint),
            seq_len=case.seq_len,
            batch=case.batch,
            seed=seed,
            device=device,
            layer_hook=layer_hook,
            layout=case.layout,
            documents=case.cu_seqlens(),
            overlap=case.overlap,
            precision=case.precision,
            group=group,
        )
        for seed in seeds
    ]
