"""The checks of a backend's op on FLA's kernels, interpreted (issues 48 and 49): FLA's op registered as a
user would passes register_backend's check; each built-in mutant of it is caught by the op checks (what
`bench doctor` reports as the checks' power); and bf16 is refused under the interpreter, where FLA's bf16
kernels return garbage."""

from __future__ import annotations

import pytest
import torch

from bench.doctor.kernels import mutant_power
from gdn_cp.ops import get_backend, register_backend, unregister_backend
from tests.gdn_cp.ops.helpers import Shape, gdn_inputs

CPU = torch.device("cpu")


def test_flas_op_passes_the_registration_check():
    entry = register_backend(
        "fla_user",
        get_backend("fla").op(),
        dtypes=(torch.float32,),
        chunk_sizes=(16, 32, 64),
        takes_chunk_size=True,
        grouped_values=True,
        varlen=True,
    )
    try:
        assert entry.checked.startswith("checked on cpu float32: op and seam within the bar"), entry.checked
    finally:
        unregister_backend("fla_user")


def test_every_mutant_of_flas_op_is_caught():
    row = mutant_power(get_backend("fla"), CPU)
    assert row.status == "ok" and row.detail.startswith("4/4 caught"), row


def test_bf16_is_refused_under_the_interpreter():
    x = gdn_inputs(Shape(B=1, T=32, Hk=1, Hv=2, K=16, V=16), dtype=torch.bfloat16, seed=1)
    with pytest.raises(ValueError, match="returns garbage in bfloat16 under Triton's interpreter"):
        get_backend("fla").rule(*x, chunk_size=16)
