"""register_backend's check (issue 49): a new op is run against the recurrent reference in fp64 before it is
registered (gdn_cp.ops.backends.checks, milliseconds), and an op that is wrong in a way CP would hide is
refused with one line saying what it got wrong: each of the built-in mutants of a correct op
(gdn_cp.ops.backends.mutants) is named; another error is the worst tensor against the bar. What the check
found is recorded on the entry (Backend.checked)."""

from __future__ import annotations

import pytest
import torch

from gdn_cp.ops import get_backend, recurrent_gated_delta_rule, register_backend, unregister_backend
from gdn_cp.ops.backends import backend_names, checks, mutants


def _reference(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, **kw):
    """A correct op of RuleOp's signature (no cu_seqlens, no chunk_size, no grouped values)."""
    return recurrent_gated_delta_rule(
        q, k, v, g, beta, scale, initial_state, output_final_state, kw["use_qk_l2norm_in_kernel"]
    )


def _one_percent_off(*args, **kw):
    o, final = _reference(*args, **kw)
    return o * 1.01, final


def _without_scale(
    q, k, v, g, beta, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False
):
    """An op that takes no scale= (it applies K^-1/2 itself): TypeError when given one."""
    kw = {"use_qk_l2norm_in_kernel": use_qk_l2norm_in_kernel}
    return _reference(q, k, v, g, beta, None, initial_state, output_final_state, **kw)


@pytest.fixture
def cleanup():
    yield
    for name in ("mine",):
        if name in backend_names():
            unregister_backend(name)


DIAGNOSES = {
    "op_state_ignored": "ignores initial_state: its outputs are the reference's from a zero state",
    "op_state_detached": "detaches initial_state: outputs and final state right, initial_state gets a zero "
    "gradient",
    "op_state_scaled": "scales initial_state by 0.99: its outputs are the reference's from that multiple",
    "op_final_transposed": "returns the final state transposed: [N, Hv, V, K] order where [N, Hv, K, V] is "
    "declared",
}


@pytest.mark.parametrize("mutant", [m.name for m in mutants.MUTANTS])
def test_an_op_wrong_under_cp_is_refused_naming_what_it_got_wrong(cleanup, mutant):
    """Each is silently wrong under CP (outputs 51-87% off, initial-state gradients 100% off) and passed
    register_backend before; now it is refused and not registered. (A detached state's gradient is zeros,
    not none: the seam keeps the state in the graph, so that under CP it is wrong, never a hang.)"""
    with pytest.raises(ValueError) as error:
        register_backend("mine", mutants.wrap(_reference, mutant))
    assert str(error.value) == (
        f"backend 'mine' {DIAGNOSES[mutant]} (register_backend's check, op, batch 2, cpu float32)"
    )
    assert "mine" not in backend_names()


def test_another_error_names_the_worst_tensor_and_the_bar(cleanup):
    with pytest.raises(ValueError) as error:
        register_backend("mine", _one_percent_off)
    limit, _ = checks.bar(get_backend("gdn_cp"), torch.device("cpu"), torch.float32, checks.REGISTRATION)
    assert str(error.value) == (
        f"backend 'mine' o is off the fp64 reference by rel error 1.0e-02, above the bar {limit:.1e} "
        "(float32) (register_backend's check, op, batch 2, cpu float32)"
    )


def test_an_op_that_raises_is_refused_in_one_line(cleanup):
    with pytest.raises(ValueError) as error:
        register_backend("mine", _without_scale)
    line = str(error.value)
    assert "\n" not in line
    assert (
        line.startswith("backend 'mine''s op raised TypeError: ")
        and "unexpected keyword argument 'scale'" in line
    )
    assert line.endswith(
        "(op, batch 2, cpu float32): an op of gdn_cp.ops.backends.RuleOp's signature, or say "
        "what it takes (devices, dtypes, chunk_sizes, ...)"
    )
    entry = register_backend("mine", _without_scale, takes_scale=False)  # said: K^-1/2 applied by the op
    assert entry.checked.startswith("checked on cpu float32: op and seam within the bar")


def test_what_the_check_found_is_recorded_on_the_entry(cleanup):
    entry = register_backend("mine", _reference)
    assert entry.checked.startswith(
        "checked on cpu float32: op and seam within the bar of the fp64 reference"
    )
    assert get_backend("mine").checked == entry.checked
    assert register_backend("mine", _one_percent_off, check=False).checked == (
        "not checked: registered with check=False"
    )
    elsewhere = register_backend("mine", _reference, devices=("cuda", "npu"))
    assert elsewhere.checked == (
        "not checked: it runs on cuda or npu, which this process has not initialised (the check creates no "
        "device context: register it after the process first uses the device, or let bench doctor check it)"
    )
    fp64 = register_backend("mine", _reference, dtypes=(torch.float64,))
    assert fp64.checked.startswith("checked on cpu float64:")


def test_a_name_registered_again_checks_the_new_op_and_keeps_the_old_one_when_refused(cleanup):
    """The loaded op is cached by name: the check must run the new op, not the one registered before it,
    and a refused op must not stay behind the name."""
    register_backend("mine", _reference)
    get_backend("mine").op()  # loaded
    with pytest.raises(ValueError, match="ignores initial_state"):
        register_backend("mine", mutants.wrap(_reference, "op_state_ignored"))
    assert get_backend("mine").op() is _reference
