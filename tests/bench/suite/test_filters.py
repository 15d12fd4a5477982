"""--filter: field=pattern terms ANDed by commas, repeated flags ORed, bare patterns on the case id."""

from __future__ import annotations

import pytest
from tiny import tiny_scenario

from bench.errors import UserError
from bench.suite.config import Sweep
from bench.suite.filters import parse_filters

CASES = tiny_scenario(
    sweep=Sweep(cp=[1, 2], seq_len=[64, 128], checkpoint=[True, False]),
).cases(warmup=1, repeat=1)


def chosen(*exprs: str) -> list[str]:
    return [c.case_id for c in parse_filters(list(exprs)).apply(CASES)]


def test_no_filter_keeps_everything():
    # 8 points x (ulysses, and p2p / all_gather / scan with checkpoint on and off)
    assert len(chosen()) == len(CASES) == 56


def test_fields_are_anded():
    assert chosen("mode=p2p,cp=2,seq_len=64,pass=forward") == [
        "p2p-ckpt-cp2-T64-fwd",
        "p2p-nockpt-cp2-T64-fwd",
    ]


def test_checkpoint_values_as_yaml_spells_them():
    assert {c.split("-")[0] for c in chosen("checkpoint=none")} == {"ulysses"}
    assert all("-nockpt-" in c for c in chosen("checkpoint=false"))


def test_wildcards_and_bare_case_id_patterns():
    assert chosen("*cp2-T128-fwd_bwd", "mode=ulysses,cp=1,seq_len=6*,pass=forward") == [
        "ulysses-cp1-T64-fwd",
        "ulysses-cp2-T128-fwd_bwd",
        "p2p-ckpt-cp2-T128-fwd_bwd",
        "p2p-nockpt-cp2-T128-fwd_bwd",
        "all_gather-ckpt-cp2-T128-fwd_bwd",
        "all_gather-nockpt-cp2-T128-fwd_bwd",
        "scan-ckpt-cp2-T128-fwd_bwd",
        "scan-nockpt-cp2-T128-fwd_bwd",
    ]


def test_local_seq_len_and_scenario_fields():
    assert set(chosen("local_seq_len=32")) == {c.case_id for c in CASES if c.seq_len // c.cp == 32}
    assert chosen("scenario=other") == []


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("mdoe=p2p", "--filter mdoe=p2p: unknown field 'mdoe'; did you mean 'mode'?"),
        ("mode=p2p,", "--filter mode=p2p,: empty term; write field=value terms separated by commas"),
        ("mode=", "--filter mode=: empty term"),
    ],
)
def test_errors(expr, message):
    with pytest.raises(UserError) as info:
        parse_filters([expr])
    assert str(info.value).startswith(message)
