"""The compute-precision policy: matmul_precision sets a device's TF32/HF32 flags for a block and restores
them; scenarios choose it, cases record it (in their ids too)."""

from __future__ import annotations

import pytest
import torch

from bench.suite.config import Scenario, Sweep
from bench.suite.fields import FieldError
from gdn_cp import GatedDeltaNetConfig
from gdn_cp.dtypes import matmul_precision


@pytest.fixture
def tf32_off():
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_tf32_is_on_inside_the_block_and_restored_after(tf32_off):
    with matmul_precision("tf32", "cuda"):
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        with matmul_precision("fp32", "cuda"):
            assert not torch.backends.cuda.matmul.allow_tf32
        assert torch.backends.cuda.matmul.allow_tf32  # the inner block restored the outer one's
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    with pytest.raises(RuntimeError), matmul_precision("tf32", "cuda"):
        raise RuntimeError("the pass failed")
    assert not torch.backends.cuda.matmul.allow_tf32  # restored on the way out of an error too


def test_cpu_has_no_such_mode(tf32_off):
    with matmul_precision("tf32", "cpu"):
        assert not torch.backends.cuda.matmul.allow_tf32
    with pytest.raises(ValueError, match="precision: unknown 'bf32'; use one of fp32, tf32"):
        matmul_precision("bf32", "cpu").__enter__()


def _scenario(**kw) -> Scenario:
    layer = GatedDeltaNetConfig(hidden_size=32, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=8)
    sweep = Sweep(cp=[1], seq_len=[64], mode=["p2p"], pass_=["forward"])
    return Scenario(name="s", layer=layer, sweep=sweep, **kw)


def test_a_scenario_chooses_it_and_its_cases_record_it():
    (fp32,) = _scenario().cases(warmup=1, repeat=1)
    (tf32,) = _scenario(precision="tf32").cases(warmup=1, repeat=1)
    assert fp32.precision == "fp32" and fp32.case_id == "p2p-ckpt-cp1-T64-fwd"
    assert tf32.precision == "tf32" and tf32.case_id == "p2p-ckpt-cp1-T64-fwd-tf32"
    with pytest.raises(FieldError, match="precision"):
        _scenario(precision="bf32")
