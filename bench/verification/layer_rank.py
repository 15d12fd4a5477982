"""What every rank of a `bench verify` case runs: gdn_cp.accuracy.compare_layer_under_cp, per seed, in the
case's layout and, with packed documents, against the single-device layer run on each document on its own
(outputs concatenated, gradients of the concatenation).

Per seed, three comparisons (LayerRuns):

- the check, on "state" inputs (gdn_cp.accuracy.state_inputs: decays under which the state entering a rank
  carries a share of its output, measured per rank) on the case's sequence;
- the same inputs packed in documents that cross every rank edge (gdn_cp.accuracy.edge_documents), for a
  case without documents of its own: the packed path, where a boundary can be moved;
- the reference PR's "random" inputs on the case's sequence: its table, reproduced beside the check.

Then the power of the check: each mutant that applies to the case (bench.verification.mutants: CP's on rank
1, gdn_cp.distributed.mutants; for a backend other than gdn_cp, its op's on every rank,
gdn_cp.ops.backends.mutants), one at a time, through the first seed's packed "state" comparison (or the
case's own sequence, when it cannot be packed).

Runs inside the case's process group (a pool of `cp` local ranks, bench.launch.pool, or a torchrun job of
cp ranks); every rank returns the same comparisons (rank 0 computes them against the full-sequence
reference it runs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch.distributed import ProcessGroup

from bench.results.verifications import LayerMutant, LayerRuns
from bench.suite.config import Case
from bench.verification.mutants import case_mutants, mutated
from gdn_cp.accuracy import LayerComparison, compare_layer_under_cp, edge_documents
from gdn_cp.distributed import local_rank, resolve_platform
from gdn_cp.distributed.collectives import group_rank_size
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
) -> LayerRuns:
    """The case's CP layer against the reference, per seed (forward and backward), and the check's power,
    on this rank (module docstring).

    Args:
        case: mode, checkpoint, cp (the group's size), seq_len, batch, dtype, layout, documents and the
            layer's dims
        device_kind: the launch's device (cpu, cuda, npu)
        seeds: seeds of weights, input and output gradient
        layer_hook: a test hook (see LayerHook)
        group: the case's process group (None: the default group, a launch of cp ranks)
    Returns:
        The comparisons, identical on every rank.
    """
    platform = resolve_platform(device_kind)
    device = platform.device(local_rank())
    _, cp = group_rank_size(group)

    def compare(seed: int, inputs: str, documents: Sequence[int] | None) -> LayerComparison:
        return compare_layer_under_cp(
            case.layer,
            case.options,
            seq_len=case.seq_len,
            batch=case.batch,
            seed=seed,
            device=device,
            layer_hook=layer_hook,
            documents=documents,
            precision=case.precision,
            group=group,
            inputs=inputs,
        )

    own = case.cu_seqlens()
    packed = None
    if own is None and case.batch == 1 and cp > 1:
        packed = edge_documents(case.seq_len, cp, case.layout)
    runs = LayerRuns(inputs="state")
    for seed in seeds:
        runs.comparisons.append(compare(seed, "state", own))
        if packed is not None:
            runs.packed.append(compare(seed, "state", packed))
        runs.reproduction.append(compare(seed, "random", own))
    documents = packed if packed is not None else own
    for name in case_mutants(case, cp, documents is not None):
        with mutated(case, name):
            comparison = compare(seeds[0], "state", documents)
        runs.mutants.append(LayerMutant(name=name, comparison=comparison))
    return runs
