"""Backend fla's entry where FLA is not installed (issue 49): TRITON_INTERPRET read exactly as Triton reads
it, bf16 refused under the interpreter (its bf16 kernels return garbage there), and a Triton the
interpreter support cannot patch named in one line (gdn_cp.ops.backends.interpreter.support_problem)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from gdn_cp.ops import get_backend
from gdn_cp.ops.backends import interpreter
from gdn_cp.ops.backends.fla import triton_interpreted

# triton 3.9 (knobs.runtime.interpret = env_bool("TRITON_INTERPRET"), libtriton's getenv_bool): the value,
# lower-cased and nothing stripped, in {"1", "y", "yes", "on", "true"}; unset is off. Measured with
# `TRITON_INTERPRET=<value> python -c "from triton._C.libtriton import getenv_bool; ..."`.
TRITON_READS = {
    "1": True,
    "y": True,
    "Y": True,
    "yes": True,
    "TRUE": True,
    "On": True,
    " 1": False,
    "1 ": False,
    "0": False,
    "2": False,
    "": False,
    "off": False,
}


@pytest.mark.parametrize(("value", "on"), list(TRITON_READS.items()), ids=repr)
def test_triton_interpret_is_read_as_triton_reads_it(monkeypatch, value, on):
    """ " 1" was read as on (stripped) while Triton compiles, and "y" as off while Triton interprets."""
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert triton_interpreted() is on
    assert get_backend("fla").interpreted() is on


def test_unset_is_not_interpreted(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not triton_interpreted()


def test_fla_under_the_interpreter_refuses_bf16(monkeypatch):
    """Interpreted, FLA's bf16 kernels return garbage (rel error 9e9 against the fp64 reference, measured with
    fla-core 0.6 and triton 3.9; fp16 stays within 1.4e-3, fp32 2e-7): bf16 is refused in one line, on the
    CPU and on a GPU with TRITON_INTERPRET set alike; fp32 and fp16 run."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    fla = get_backend("fla")
    call = {"chunk_size": 64, "head_k_dim": 64}
    for device in ("cpu", "cuda"):
        with pytest.raises(ValueError) as error:
            fla.check(device=device, dtype=torch.bfloat16, **call)
        assert str(error.value) == (
            "backend 'fla' returns garbage in bfloat16 under Triton's interpreter (TRITON_INTERPRET is on; "
            "rel error ~1e10): interpreted, it computes float32 or float16 only; choose backend='gdn_cp', "
            "which runs everywhere, or dtype float32 or float16 (or unset TRITON_INTERPRET on a GPU)"
        )
        for dtype in (torch.float32, torch.float16):
            fla.check(device=device, dtype=dtype, **call)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    fla.check(device="cuda", dtype=torch.bfloat16, **call)  # compiled, bf16 is FLA's own dtype


def _fake_triton(monkeypatch, **autotuner: object) -> None:
    """A Triton 9.9 in sys.modules whose autotuner module holds `autotuner` (the interpreter's holds all)."""
    modules = {name: types.ModuleType(name) for name in ("triton", "triton.runtime")}
    modules["triton"].__version__ = "9.9"
    tuned = types.ModuleType("triton.runtime.autotuner")
    for name, value in autotuner.items():
        setattr(tuned, name, value)
    interpreted = types.ModuleType("triton.runtime.interpreter")
    rewriter = type("FunctionRewriter", (), {"ast_transformer": None})
    for name, value in {
        "FunctionRewriter": rewriter,
        "ASTTransformer": object,
        "_patch_lang_tensor": print,
        "InterpretedFunction": object,
    }.items():
        setattr(interpreted, name, value)
    modules |= {tuned.__name__: tuned, interpreted.__name__: interpreted}
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)


def test_a_triton_the_interpreter_support_cannot_patch_is_named_in_one_line(monkeypatch):
    _fake_triton(monkeypatch)  # no Autotuner
    assert interpreter.support_problem() == (
        "triton 9.9 has no triton.runtime.autotuner.Autotuner, which running FLA's kernels under "
        "TRITON_INTERPRET=1 replaces: pin the Triton the project tests with (see .ci/run)"
    )
    assert get_backend("fla").interpreter_problem() == interpreter.support_problem()
    _fake_triton(monkeypatch, Autotuner=type("Autotuner", (), {"do_bench": None}))
    assert interpreter.support_problem() is None
