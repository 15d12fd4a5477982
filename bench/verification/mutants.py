"""Which mutants a `bench verify` case runs its check on, and turning one on by name (the power of the check):

- CP's (gdn_cp.distributed.mutants: what moves between ranks, broken on rank 1), those that apply to the
  case's mode;
- for a case whose backend is not gdn_cp, its op's (gdn_cp.ops.backends.mutants: initial_state ignored,
  detached, scaled, the final state transposed; on every rank, the op being wrong everywhere), those that
  show in the case's mode and checkpoint. gdn_cp's own op is left out: its summary modes run its chunk
  stages (Backend.kcp), not its op, so a stand-in for its op would check another path than the case's, at
  about a third more time per case of cpu-verify; bench doctor's kernels group and the tests check gdn_cp's
  op against the same mutants.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from bench.suite.config import Case
from gdn_cp.distributed import mode_class, mutants
from gdn_cp.ops.backends import DEFAULT_BACKEND, get_backend
from gdn_cp.ops.backends import mutants as backend_mutants


def case_mutants(case: Case, cp: int, documents: bool) -> list[str]:
    """The names of the mutants a check of `case` runs on at `cp` ranks, with packed `documents` or not, in
    report order: none at cp 1 (nothing crosses ranks)."""
    if cp < 2:
        return []
    mode = mode_class(case.mode)
    names = [m.name for m in mutants.applicable(mode, documents)]
    if case.backend != DEFAULT_BACKEND:
        names += [m.name for m in backend_mutants.applicable(mode, case.options, get_backend(case.backend))]
    return names


def mutated(case: Case, name: str) -> AbstractContextManager[object]:
    """Mutant `name` on inside the block: CP's on rank 1, or the case's backend's op on every rank."""
    if name in backend_mutants.BY_NAME:
        return backend_mutants.mutated(case.backend, name)
    return mutants.mutated(name)
