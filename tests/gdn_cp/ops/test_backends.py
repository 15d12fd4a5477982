"""The backend registry (gdn_cp.ops.backends): what each entry declares and the one error that names the
option and the fix; `Backend.rule` adapting a call to an op that does less (key heads repeated, one call per
document); a user-registered op under the layer. FLA itself runs in its own environment
(tests/backends/test_fla.py, `.ci/run`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from helpers import Shape, assert_close_scaled, gdn_inputs, random_state, weighted_sum

from gdn_cp import GatedDeltaNet, GatedDeltaNetConfig
from gdn_cp.ops import (
    DEFAULT_BACKEND,
    backend_names,
    chunk_gated_delta_rule,
    get_backend,
    recurrent_gated_delta_rule,
    register_backend,
    unregister_backend,
)
from gdn_cp.ops.backends import names_unchecked

SHAPE = Shape(B=1, T=37, Hk=2, Hv=4, K=6, V=5)
DOCUMENTS = [0, 9, 10, 37]


@pytest.fixture
def user_op():
    """The recurrent reference behind FLA's signature, registered with the least a user op may declare (no
    chunk_size, no grouped value heads, no cu_seqlens), calls counted."""
    calls = []

    def op(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, **kw):
        assert "cu_seqlens" not in kw and "chunk_size" not in kw, kw
        assert q.shape[2] == v.shape[2], "the registry repeats key heads for an op without grouped values"
        calls.append(q.shape[1])
        return recurrent_gated_delta_rule(
            q, k, v, g, beta, scale, initial_state, output_final_state, kw["use_qk_l2norm_in_kernel"]
        )

    entry = register_backend("user_min", op, dtypes=(torch.float64, torch.float32))
    assert entry.checked.startswith("checked on cpu float32: op and seam within the bar"), entry.checked
    calls.clear()  # the registration's check called it
    yield calls
    unregister_backend("user_min")


def test_the_built_in_backends_are_registered_and_gdn_cp_is_the_default() -> None:
    assert backend_names()[:3] == ("gdn_cp", "fla", "transformers")
    assert DEFAULT_BACKEND == "gdn_cp"
    assert GatedDeltaNetConfig(
        hidden_size=8, num_k_heads=1, num_v_heads=1, head_k_dim=4, head_v_dim=4
    ).backend == ("gdn_cp")
    assert torch.float64 in get_backend("gdn_cp").dtypes
    assert torch.float64 not in get_backend("fla").dtypes  # FLA accumulates in fp32


@pytest.mark.parametrize(
    ("backend", "call", "message"),
    [
        ("fla", {"dtype": torch.float64}, "backend 'fla' does not compute in float64"),
        ("fla", {"chunk_size": 48}, "backend 'fla' takes chunk_size in [16, 32, 64], got 48"),
        ("fla", {"head_k_dim": 512}, "backend 'fla' holds key head dims up to 256"),
        ("fla", {"device": "cpu"}, "backend 'fla' runs on a CPU only under Triton's interpreter"),
        ("transformers", {"scale": 0.5}, "backend 'transformers' always scales q by K^-1/2"),
        ("transformers", {"dtype": torch.float64}, "backend 'transformers' does not compute in float64"),
    ],
)
def test_a_call_a_backend_cannot_run_is_refused_naming_the_option_and_the_fix(
    backend, call, message, monkeypatch
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    args = {"device": "cuda", "dtype": torch.bfloat16, "chunk_size": 64, "head_k_dim": 128, "scale": None}
    with pytest.raises(ValueError, match=r"(choose|use) backend='gdn_cp'") as error:
        get_backend(backend).check(**{**args, **call})
    assert message in str(error.value)


def test_an_unknown_backend_lists_the_registered_ones_and_how_to_register() -> None:
    with pytest.raises(ValueError, match="unknown backend 'nope'; use one of gdn_cp, fla, transformers"):
        get_backend("nope")
    with pytest.raises(ValueError, match="built in"):
        unregister_backend("gdn_cp")


def test_a_config_naming_an_unknown_backend_is_refused_at_construction() -> None:
    """Issue 49: GatedDeltaNetConfig(backend="fal") was accepted, and failed only when a layer was built
    (on every rank). It is refused where it is written, naming the registered backends and how to register;
    a stored record naming a backend registered elsewhere still reads (names_unchecked)."""
    sizes = {"hidden_size": 8, "num_k_heads": 1, "num_v_heads": 1, "head_k_dim": 4, "head_v_dim": 4}
    with pytest.raises(ValueError) as error:
        GatedDeltaNetConfig(**sizes, backend="fal")
    assert str(error.value) == (
        f"GatedDeltaNetConfig.backend: unknown backend 'fal'; use one of {', '.join(backend_names())}, or "
        "register your op first with gdn_cp.ops.register_backend(name, op, ...)"
    )
    with names_unchecked():
        stored = GatedDeltaNetConfig(**sizes, backend="registered_elsewhere")
    with pytest.raises(ValueError, match="unknown backend 'registered_elsewhere'"):
        GatedDeltaNet(stored)


@pytest.mark.parametrize("documents", [None, DOCUMENTS], ids=["one-sequence", "documents"])
def test_a_minimal_user_op_is_adapted_and_matches_gdn_cp(user_op, documents) -> None:
    """Key heads repeated for it, one call per document, chunk_size not passed: outputs, final states and
    every gradient equal gdn_cp's op to fp64 roundoff."""
    x = gdn_inputs(SHAPE, seed=1)
    n = 1 if documents is None else len(documents) - 1
    h0 = random_state(Shape(n, *[getattr(SHAPE, f) for f in ("T", "Hk", "Hv", "K", "V")]))
    results = {}
    for name in ("user_min", "gdn_cp"):
        inputs = [t.clone().requires_grad_(True) for t in x]
        state = h0.clone().requires_grad_(True)
        o, final = get_backend(name).rule(
            *inputs,
            initial_state=state,
            output_final_state=True,
            cu_seqlens=documents,
            use_qk_l2norm_in_kernel=True,
            chunk_size=8,
        )
        weighted_sum(o, final).backward()
        results[name] = [o, final, state.grad, *(t.grad for t in inputs)]
    assert user_op == ([SHAPE.T] if documents is None else [9, 1, 27])
    for got, want in zip(results["user_min"], results["gdn_cp"], strict=True):
        assert_close_scaled(got, want, torch.float64, terms=SHAPE.T * SHAPE.K)


def test_the_layer_runs_on_its_configured_backend(user_op) -> None:
    """GatedDeltaNetConfig.backend reaches the forward, the prefill and decode."""
    kw = {"hidden_size": 16, "num_k_heads": 2, "num_v_heads": 4, "head_k_dim": 4, "head_v_dim": 4}
    torch.manual_seed(0)
    ours = GatedDeltaNet(GatedDeltaNetConfig(**kw, dtype="fp64"))
    theirs = GatedDeltaNet(GatedDeltaNetConfig(**kw, dtype="fp64", backend="user_min"))
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 20, 16, dtype=torch.float64)
    (y_ours, s_ours), (y_theirs, s_theirs) = ours.prefill(x), theirs.prefill(x)
    assert user_op, "the user op was not called"
    assert_close_scaled(y_theirs, y_ours, torch.float64, terms=20 * 16)
    step = torch.randn(2, 1, 16, dtype=torch.float64)
    (d_ours, _), (d_theirs, _) = ours.decode(step, s_ours), theirs.decode(step, s_theirs)
    assert_close_scaled(d_theirs, d_ours, torch.float64, terms=20 * 16)


def test_the_gdn_cp_backend_is_the_chunk_op() -> None:
    x = gdn_inputs(SHAPE, seed=2)
    o, _ = get_backend("gdn_cp").rule(*x, chunk_size=8, cu_seqlens=DOCUMENTS)
    want, _ = chunk_gated_delta_rule(*x, chunk_size=8, cu_seqlens=torch.tensor(DOCUMENTS))
    assert torch.equal(o, want)


FAKE_FLA = """\
def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           cu_seqlens=None, use_qk_l2norm_in_kernel=False, **kw):
    raise RuntimeError("the fake FLA kernel ran")


fused_recurrent_gated_delta_rule = chunk_gated_delta_rule
"""

TRANSFORMERS_WITH_FLA = """\
import inspect

import fla.ops.gated_delta_rule as fake
import transformers.models.qwen3_5.modeling_qwen3_5 as module
from gdn_cp.ops.backends import get_backend
from gdn_cp.ops.ran import qualified_name


def cells(obj, depth=4):  # every callable behind transformers' wrappers
    found = [obj]
    holders = [obj, getattr(type(obj), "forward", None), getattr(obj, "__wrapped__", None)]
    for holder in holders:
        for cell in getattr(holder, "__closure__", None) or ():
            if depth and callable(cell.cell_contents):
                found += cells(cell.cell_contents, depth - 1)
    return found


# the premise: transformers bound FLA's name behind its own when fla imported
assert any(c is fake.chunk_gated_delta_rule for c in cells(module.torch_chunk_gated_delta_rule))
op = get_backend("transformers").op()
assert inspect.isfunction(op) and not hasattr(op, "__wrapped__"), op
print(qualified_name(op))
"""


def test_the_transformers_backend_is_its_torch_path_even_with_fla_importable(tmp_path) -> None:
    """Issue 44: with `fla` importable, transformers rebinds torch_chunk_gated_delta_rule to FLA's kernel
    (here a fake one on the path); backend "transformers" still resolves transformers' own torch function."""
    package = tmp_path / "fla" / "ops" / "gated_delta_rule"
    package.mkdir(parents=True)
    for folder in (tmp_path / "fla", tmp_path / "fla" / "ops"):
        (folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text(FAKE_FLA)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", TRANSFORMERS_WITH_FLA], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.split()[-1] == "transformers.models.qwen3_5.modeling_qwen3_5.torch_chunk_gated_delta_rule"
    )


def test_what_ran_names_an_op_from_elsewhere_behind_a_name() -> None:
    transformers = get_backend("transformers")
    assert (
        transformers.ran_as("transformers.models.qwen3_5.modeling_qwen3_5.torch_chunk_gated_delta_rule")
        is None
    )
    line = transformers.ran_as("fla.ops.gated_delta_rule.chunk.chunk_gated_delta_rule")
    assert line == (
        "asked backend transformers, ran fla.ops.gated_delta_rule.chunk.chunk_gated_delta_rule: transformers "
        "switches to FLA's kernel when fla imports; run without fla on the path, or use backend=fla"
    )
    assert get_backend("gdn_cp").ran_as("gdn_cp.ops.chunk.rule.chunk_gated_delta_rule") is None
    assert get_backend("gdn_cp").ran_as("my_kernels.rule") == "asked backend gdn_cp, ran my_kernels.rule"
