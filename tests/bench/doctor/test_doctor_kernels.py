"""`bench doctor`'s kernels group (bench.doctor.kernels), in one process: a registered op of FLA's signature
is checked (op with every gradient, and the summary modes' seam) against the fp64 reference; a wrong op
fails by name; a backend that cannot run here is one info line saying why."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from bench.doctor.kernels import kernel_checks, layer_backends
from gdn_cp.ops import recurrent_gated_delta_rule, register_backend, unregister_backend

CPU = torch.device("cpu")


def _recurrent(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, **kw):
    """The recurrent reference behind FLA's signature (no chunk_size, no cu_seqlens)."""
    return recurrent_gated_delta_rule(
        q,
        k,
        v,
        g,
        beta,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        use_qk_l2norm_in_kernel=kw.get("use_qk_l2norm_in_kernel", False),
    )


def _ignores_initial_state(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, **kw):
    """A plausible bug: the op drops the state it is given (every summary mode's M would be wrong)."""
    return _recurrent(q, k, v, g, beta, scale, None, output_final_state, **kw)


@pytest.fixture
def registered() -> Iterator[None]:
    register_backend("user_ref", _recurrent)
    register_backend("user_bug", _ignores_initial_state)
    register_backend("user_npu", _recurrent, devices=("npu",))
    yield
    for name in ("user_ref", "user_bug", "user_npu"):
        unregister_backend(name)


def test_a_registered_op_is_checked_and_a_wrong_one_fails_by_name(registered):
    checks = {c.name: c for c in kernel_checks(CPU, lambda: None)}
    for name in ("user_ref op, batch 2", "user_ref op, packed documents", "user_ref seam"):
        assert checks[name].status == "ok" and "vs fp64 reference" in checks[name].detail, checks[name]
    assert checks["gdn_cp seam"].status == "ok"
    bad = [n for n, c in checks.items() if n.startswith("user_bug ") and c.status == "fail"]
    assert set(bad) == {"user_bug op, batch 2", "user_bug op, packed documents", "user_bug seam"}
    assert checks["user_npu"].status == "info" and "does not run on cpu" in checks["user_npu"].detail
    assert "user_npu op, batch 2" not in checks
    assert "user_ref" in layer_backends(CPU) and "user_npu" not in layer_backends(CPU)
    assert "gdn_cp" not in layer_backends(CPU)  # the layer group runs the default anyway


def test_no_time_is_taken_on_a_cpu(registered):
    """The timing line is for devices whose fused kernels replace per-chunk launches; a CPU has none."""
    assert not [c for c in kernel_checks(CPU, lambda: None) if c.name.endswith(" time")]
