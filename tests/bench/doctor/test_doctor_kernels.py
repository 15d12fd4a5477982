"""`bench doctor`'s kernels group (bench.doctor.kernels), in one process: a registered op of RuleOp's
signature is checked (op with every gradient, and the summary modes' seam) against the fp64 reference; a
wrong op fails by name, saying what it got wrong; the checks' power against the op's built-in mutants; a
backend that cannot run here is one info line saying why."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from bench.doctor import kernels
from bench.doctor.checks import Check
from bench.doctor.kernels import kernel_checks, layer_backends
from gdn_cp.ops import get_backend, recurrent_gated_delta_rule, register_backend, unregister_backend
from gdn_cp.ops.backends import checks, mutants

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


@pytest.fixture(scope="module")
def registered() -> Iterator[None]:
    register_backend("user_ref", _recurrent)
    register_backend("user_bug", _ignores_initial_state, check=False)  # its registration would refuse it
    register_backend("user_npu", _recurrent, devices=("npu",))
    yield
    for name in ("user_ref", "user_bug", "user_npu"):
        unregister_backend(name)


@pytest.fixture(scope="module")
def rows(registered) -> dict[str, Check]:
    """The kernels group on the CPU, once for the module's tests (seconds)."""
    return {c.name: c for c in kernel_checks(CPU, lambda: None)}


def test_a_registered_op_is_checked_and_a_wrong_one_fails_by_name(rows):
    for name in ("user_ref op, batch 2", "user_ref op, packed documents", "user_ref seam"):
        assert rows[name].status == "ok" and "vs fp64 reference" in rows[name].detail, rows[name]
    assert rows["gdn_cp seam"].status == "ok"
    bad = [n for n, c in rows.items() if n.startswith("user_bug ") and c.status == "fail"]
    assert set(bad) == {"user_bug op, batch 2", "user_bug op, packed documents", "user_bug seam"}
    assert rows["user_bug op, batch 2"].detail.startswith("ignores initial_state: its outputs are the ")
    assert "registration: not checked: registered with check=False" in rows["user_bug"].detail
    assert "registration: checked on cpu float32" in rows["user_ref"].detail
    assert rows["user_npu"].status == "info" and "does not run on cpu" in rows["user_npu"].detail
    assert "user_npu op, batch 2" not in rows
    assert "user_ref" in layer_backends(CPU) and "user_npu" not in layer_backends(CPU)
    assert "gdn_cp" not in layer_backends(CPU)  # the layer group runs the default anyway


def test_no_time_is_taken_on_a_cpu(rows):
    """The timing line is for devices whose fused kernels replace per-chunk launches; a CPU has none."""
    assert not [name for name in rows if name.endswith(" time")]


def test_every_checked_backend_reports_the_power_of_its_checks_against_its_mutants(rows):
    """Issue 48: the op and seam checks run on each of the op's built-in mutants (initial_state ignored,
    detached, scaled by 0.99, the final state transposed); every one is caught, each by the check that sees
    it, for the built-in backends that run here and a registered op alike."""
    for name in ("gdn_cp", "recurrent", "user_ref"):
        row = rows[f"{name} mutants"]
        assert row.status == "ok" and row.detail.startswith("4/4 caught ("), row
        for mutant in mutants.MUTANTS:
            assert f"{mutant.name} by op, batch 2" in row.detail, row
    assert "user_npu mutants" not in rows  # not checked here, nor its mutants


def test_a_mutant_the_checks_pass_is_a_failure(registered, monkeypatch):
    """A check whose bar is too blunt to see a mutant has no power against it: that is a failed row naming
    the mutants it missed, never a pass."""
    blunt = checks.bar

    def only_gross_errors(backend, device, dtype, size):
        limit, kind = blunt(backend, device, dtype, size)
        return (0.5, "blunt") if size == checks.REGISTRATION else (limit, kind)

    monkeypatch.setattr(checks, "bar", only_gross_errors)
    row = kernels.mutant_power(get_backend("user_ref"), CPU)
    assert row.status == "fail"
    assert row.detail == (
        "3/4 caught; not caught: op scales initial_state x 0.99: the op checks have no power against it here"
    )


def test_a_mutant_under_the_tf32_bar_is_a_warning_naming_the_bar(registered, monkeypatch):
    """On a GPU a Triton backend's fp32 dots run in TF32, and its bar (~3e-2 at these sizes) sits above what
    a 1% scaled state moves: the miss is the precision's limit, said as a warning with the bar, so that the
    GPU check's first run does not fail on it; any other blunt bar stays a failure (above)."""
    tf32 = checks.ROUNDING_FACTOR * checks.TF32_UNIT * checks.REGISTRATION.K**0.5
    blunt = checks.bar
    monkeypatch.setattr(
        checks,
        "bar",
        lambda backend, device, dtype, size: (
            (tf32, "tf32") if size == checks.REGISTRATION else blunt(backend, device, dtype, size)
        ),
    )
    row = kernels.mutant_power(get_backend("user_ref"), CPU)
    assert row.status == "warn", row
    assert "not caught: op scales initial_state x 0.99" in row.detail
    assert f"(tf32 bar {tf32:.1e})" in row.detail
