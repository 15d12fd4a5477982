"""Scenario expansion into cases, case ids and keys, and the config dataclasses' own checks."""

from __future__ import annotations

import pickle
from typing import get_args

import pytest

from bench.errors import FieldError
from bench.records import from_dict, to_dict
from bench.suite.config import Case, Device, Mode, Scenario, SuiteConfig, Sweep
from gdn_cp import GatedDeltaNetConfig
from gdn_cp.distributed import DEVICES, MODES
from gdn_cp.layers import GatedDeltaNet

LAYER = GatedDeltaNetConfig(hidden_size=64, num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16)


def scenario(**kw) -> Scenario:
    sweep_keys = {"cp", "seq_len", "local_seq_len", "mode", "checkpoint", "overlap", "pass_"}
    sweep = Sweep(**{k: v for k, v in kw.items() if k in sweep_keys})
    rest = {k: v for k, v in kw.items() if k not in sweep_keys}
    return Scenario(name="s", **{"layer": LAYER, **rest}, sweep=sweep)


def ids(s: Scenario) -> list[str]:
    return [c.case_id for c in s.cases(warmup=3, repeat=10)]


def test_literals_match_gdn_cp():
    assert get_args(Mode) == MODES
    assert get_args(Device) == DEVICES


def test_expansion_full_product_with_single_ulysses_case():
    s = scenario(cp=[1, 2], seq_len=[128], checkpoint=[True, False])
    got = ids(s)
    # ulysses has no summary: one case per point, not one per checkpoint value
    assert got == [
        "ulysses-cp1-T128-fwd",
        "ulysses-cp1-T128-fwd_bwd",
        "p2p-ckpt-cp1-T128-fwd",
        "p2p-ckpt-cp1-T128-fwd_bwd",
        "p2p-nockpt-cp1-T128-fwd",
        "p2p-nockpt-cp1-T128-fwd_bwd",
        "all_gather-ckpt-cp1-T128-fwd",
        "all_gather-ckpt-cp1-T128-fwd_bwd",
        "all_gather-nockpt-cp1-T128-fwd",
        "all_gather-nockpt-cp1-T128-fwd_bwd",
        "scan-ckpt-cp1-T128-fwd",
        "scan-ckpt-cp1-T128-fwd_bwd",
        "scan-nockpt-cp1-T128-fwd",
        "scan-nockpt-cp1-T128-fwd_bwd",
        *[i.replace("cp1", "cp2") for i in got[:14]],
    ]
    ulysses = [c for c in s.cases(warmup=3, repeat=10) if c.mode == "ulysses"]
    assert {c.checkpoint for c in ulysses} == {None}


def test_overlap_sweeps_the_summary_modes_where_there_is_an_exchange():
    s = scenario(cp=[1, 2], seq_len=[128], mode=["ulysses", "p2p"], overlap=[False, True], pass_=["forward"])
    assert ids(s) == [
        "ulysses-cp1-T128-fwd",
        "p2p-ckpt-cp1-T128-fwd",
        "ulysses-cp2-T128-fwd",
        "p2p-ckpt-cp2-T128-fwd",
        "p2p-ckpt-overlap-cp2-T128-fwd",
    ]
    (on,) = [c for c in s.cases(warmup=3, repeat=10) if c.overlap]
    assert from_dict(Case, to_dict(on)) == on


def test_defaults_every_mode_checkpoint_on_both_passes():
    assert ids(scenario(cp=[4], seq_len=[32768])) == [
        "ulysses-cp4-T32768-fwd",
        "ulysses-cp4-T32768-fwd_bwd",
        "p2p-ckpt-cp4-T32768-fwd",
        "p2p-ckpt-cp4-T32768-fwd_bwd",
        "all_gather-ckpt-cp4-T32768-fwd",
        "all_gather-ckpt-cp4-T32768-fwd_bwd",
        "scan-ckpt-cp4-T32768-fwd",
        "scan-ckpt-cp4-T32768-fwd_bwd",
    ]


def test_weak_scaling_multiplies_local_length_by_cp():
    cases = scenario(cp=[1, 2, 4], local_seq_len=[256], mode=["p2p"], pass_=["forward"]).cases(
        warmup=0, repeat=1
    )
    assert [(c.cp, c.seq_len, c.local_seq_len) for c in cases] == [
        (1, 256, 256),
        (2, 512, 256),
        (4, 1024, 256),
    ]


def test_sweeps_override_the_top_level_and_duplicates_collapse():
    s = Scenario(
        name="s",
        layer=LAYER,
        sweep=Sweep(cp=[1, 2], mode=["p2p"], pass_=["forward"]),
        sweeps=[Sweep(seq_len=[512]), Sweep(local_seq_len=[256], cp=[2, 4])],
    )
    # strong: cp 1, 2 at 512; weak: cp 2 (512: a duplicate of the strong one) and 4 (1024)
    assert ids(s) == ["p2p-ckpt-cp1-T512-fwd", "p2p-ckpt-cp2-T512-fwd", "p2p-ckpt-cp4-T1024-fwd"]


def test_a_sweep_setting_one_length_replaces_the_other():
    s = Scenario(
        name="s",
        layer=LAYER,
        sweep=Sweep(cp=[2], seq_len=[512], mode=["p2p"]),
        sweeps=[Sweep(local_seq_len=[64])],
    )
    assert {c.seq_len for c in s.cases(warmup=0, repeat=1)} == {128}


def test_scenario_warmup_repeat_override_the_suite():
    (case, *_) = scenario(cp=[1], seq_len=[64], warmup=0, repeat=4).cases(warmup=3, repeat=10)
    assert (case.warmup, case.repeat) == (0, 4)
    (case, *_) = scenario(cp=[1], seq_len=[64]).cases(warmup=3, repeat=10)
    assert (case.warmup, case.repeat) == (3, 10)


def test_case_key_dict_round_trip_and_pickle():
    (case, *_) = scenario(cp=[2], seq_len=[64], mode=["all_gather"], checkpoint=[False]).cases(
        warmup=1, repeat=2
    )
    assert case.key() == "s/all_gather-nockpt-cp2-T64-fwd"
    d = to_dict(case)
    assert d["pass"] == "forward" and d["local_seq_len"] == 32 and d["case_id"] == case.case_id
    assert d["layer"]["hidden_size"] == 64 and d["layer"]["dtype"] == "fp32"
    assert from_dict(Case, d) == case
    assert pickle.loads(pickle.dumps(case)) == case  # ranks receive it pickled


def test_layer_config_builds_the_layer():
    (case, *_) = scenario(cp=[1], seq_len=[64], dtype="bf16").cases(warmup=1, repeat=2)
    layer = GatedDeltaNet(case.layer)
    assert layer.config.hidden_size == 64 and str(layer.config.dtype) == "torch.bfloat16"


@pytest.mark.parametrize(
    ("kwargs", "key", "fragment"),
    [
        ({"warmup": -1}, "warmup", "must be >= 0"),
        ({"repeat": 0}, "repeat", "must be positive"),
        ({"timeout_s": 0}, "timeout_s", "must be > 0"),
        ({"device": "gpu"}, "device", "unknown device 'gpu'; use one of auto, cpu, cuda, npu"),
        ({"threads_per_rank": "2"}, "threads_per_rank", "expected an integer or null"),
        ({"timeout_s": float("nan")}, "timeout_s", "expected a finite number, got nan"),
        ({"timeout_s": float("inf")}, "timeout_s", "expected a finite number, got inf"),
    ],
)
def test_suite_config_checks(kwargs, key, fragment):
    with pytest.raises(FieldError) as info:
        SuiteConfig(**kwargs)
    assert info.value.key == key and fragment in str(info.value)


def test_suite_config_accepts_int_timeout_as_float():
    assert SuiteConfig(timeout_s=5).timeout_s == 5.0
