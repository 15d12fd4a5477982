"""Packed documents of a scenario (bench.suite.documents): the boundaries they turn into, their checks and
tags; and how layouts and documents sweep into cases whose ids, for the cases that existed before, do not
change."""

from __future__ import annotations

import dataclasses
import pickle
from itertools import pairwise
from typing import get_args

import pytest

from bench.errors import FieldError
from bench.records import from_dict, to_dict
from bench.suite.config import Case, Layout, Scenario, Sweep
from bench.suite.documents import Documents, documents_tag, parse_documents
from bench.suite.filters import parse_filters
from gdn_cp import GatedDeltaNetConfig
from gdn_cp.distributed import LAYOUTS, MODES, SUMMARY_MODES
from gdn_cp.ops import document_bounds

LAYER = GatedDeltaNetConfig(hidden_size=64, num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16)


def scenario(batch: int = 1, **sweep) -> Scenario:
    return Scenario(name="s", layer=LAYER, batch=batch, sweep=Sweep(**sweep))


def ids(s: Scenario) -> list[str]:
    return [c.case_id for c in s.cases(warmup=1, repeat=1)]


# -- boundaries ---------------------------------------------------------------------------------------------


def test_fixed_lengths_are_as_equal_as_possible():
    assert Documents(count=3).bounds(10) == [0, 4, 7, 10]
    assert Documents(count=4, lengths="fixed").document_lengths(4096) == [1024] * 4
    assert Documents(count=1).bounds(7) == [0, 7]


@pytest.mark.parametrize("lengths", ["fixed", "uniform", "lognormal"])
@pytest.mark.parametrize(("count", "seq_len"), [(1, 1), (1, 64), (5, 5), (7, 64), (64, 4096), (100, 101)])
@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_bounds_cover_the_sequence_with_documents_of_at_least_one_token(lengths, count, seq_len, seed):
    bounds = Documents(count=count, lengths=lengths, seed=seed).bounds(seq_len)
    assert len(bounds) == count + 1 and bounds[0] == 0 and bounds[-1] == seq_len
    assert all(b - a >= 1 for a, b in pairwise(bounds))
    assert document_bounds(bounds, seq_len) == bounds  # what the layer accepts as cu_seqlens


def test_random_lengths_are_deterministic_per_seed_and_differ_between_seeds():
    for lengths in ("uniform", "lognormal"):
        one = Documents(count=64, lengths=lengths, seed=3)
        assert one.bounds(4096) == Documents(count=64, lengths=lengths, seed=3).bounds(4096)
        assert one.bounds(4096) != Documents(count=64, lengths=lengths, seed=4).bounds(4096)
        assert one.bounds(4096) != Documents(count=64, lengths="fixed").bounds(4096)
    # fixed draws nothing: the seed does not matter
    assert Documents(count=5, seed=1).bounds(64) == Documents(count=5, seed=2).bounds(64)


def test_lognormal_boundaries_are_pinned():
    # Committed results name their packing by tag only: the boundaries behind a tag must never change.
    assert Documents(count=8, lengths="lognormal").bounds(128) == [0, 10, 23, 46, 58, 105, 108, 124, 128]
    lengths = Documents(count=64, lengths="lognormal").document_lengths(4096)
    assert (min(lengths), max(lengths), lengths[:4]) == (5, 461, [34, 41, 81, 36])


def test_sigma_spreads_the_lognormal_lengths():
    def spread(sigma: float) -> float:
        lengths = Documents(count=64, lengths="lognormal", sigma=sigma).document_lengths(1 << 16)
        return max(lengths) / min(lengths)

    assert spread(0.1) < spread(1.0) < spread(2.0)
    assert spread(0.1) < 2  # nearly equal documents


def test_more_documents_than_tokens_names_count():
    with pytest.raises(FieldError) as info:
        Documents(count=65).bounds(64)
    assert info.value.key == "count" and "use count <= 64" in info.value.message


@pytest.mark.parametrize(
    ("kwargs", "key", "fragment"),
    [
        ({"count": 0}, "count", "must be >= 1, got 0"),
        ({"count": "8"}, "count", "expected an integer, got '8'"),
        (
            {"count": 8, "lengths": "zipf"},
            "lengths",
            "unknown lengths 'zipf'; use one of fixed, uniform, lognormal",
        ),
        ({"count": 8, "sigma": 0}, "sigma", "must be > 0"),
        ({"count": 8, "seed": 1.5}, "seed", "expected an integer"),
    ],
)
def test_documents_field_checks(kwargs, key, fragment):
    with pytest.raises(FieldError) as info:
        Documents(**kwargs)
    assert info.value.key == key and fragment in info.value.message


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ({"count": 8, "lenghts": "fixed"}, "lenghts: unknown key; did you mean 'lengths'?"),
        ({"lengths": "fixed"}, "count: required but missing"),
        ({"count": -1}, "count: must be >= 1, got -1"),
        (64, "expected a mapping such as {count: 64, lengths: lognormal, seed: 0}, or null"),
    ],
)
def test_a_documents_entry_names_the_inner_key(value, fragment):
    with pytest.raises(FieldError) as info:
        parse_documents(value)
    assert info.value.key == "documents" and fragment in info.value.message


def test_tags_tell_packings_apart():
    assert Documents(count=64, lengths="lognormal").tag == "docs64-lognormal"
    assert Documents(count=64, lengths="lognormal", seed=2).tag == "docs64-lognormal-seed2"
    assert Documents(count=64, lengths="lognormal", sigma=0.5).tag == "docs64-lognormal-sigma0.5"
    assert Documents(count=8, lengths="uniform", seed=1, sigma=3.0).tag == "docs8-uniform-seed1"
    assert Documents(count=8, seed=9).tag == "docs8-fixed"  # nothing is drawn: the same boundaries
    assert documents_tag(None) == "none"


# -- cases --------------------------------------------------------------------------------------------------


def test_layout_literal_matches_gdn_cp():
    assert get_args(Layout) == LAYOUTS


def test_ids_of_contiguous_unpacked_cases_do_not_change():
    # the spelling before layouts and documents: <mode>[-ckpt]-cp<cp>-T<seq>-<pass>, every mode
    before = [f"{m}{'-ckpt' if m in SUMMARY_MODES else ''}-cp2-T128-fwd" for m in MODES]
    assert "p2p-ckpt-cp2-T128-fwd" in before
    assert ids(scenario(cp=[2], seq_len=[128], pass_=["forward"])) == before
    explicit = scenario(cp=[2], seq_len=[128], pass_=["forward"], layout=["contiguous"], documents=[None])
    assert ids(explicit) == before


def test_layout_and_documents_sweep_with_tags_after_the_length():
    s = scenario(
        cp=[1, 2],
        seq_len=[128],
        mode=["p2p"],
        pass_=["forward_backward"],
        layout=["contiguous", "zigzag"],
        documents=[None, {"count": 8, "lengths": "lognormal"}],
    )
    assert ids(s) == [
        # at cp 1 one rank holds zigzag's two pieces in order: the contiguous case, once
        "p2p-ckpt-cp1-T128-fwd_bwd",
        "p2p-ckpt-cp1-T128-docs8-lognormal-fwd_bwd",
        "p2p-ckpt-cp2-T128-fwd_bwd",
        "p2p-ckpt-cp2-T128-docs8-lognormal-fwd_bwd",
        "p2p-ckpt-cp2-T128-zigzag-fwd_bwd",
        "p2p-ckpt-cp2-T128-zigzag-docs8-lognormal-fwd_bwd",
    ]
    packed = s.cases(warmup=1, repeat=1)[-1]
    assert packed.layout == "zigzag" and packed.documents == Documents(count=8, lengths="lognormal")
    assert packed.cu_seqlens() == [0, 10, 23, 46, 58, 105, 108, 124, 128]
    assert s.cases(warmup=1, repeat=1)[0].cu_seqlens() is None


def test_a_single_documents_mapping_is_a_list_of_it():
    sweep = Sweep(documents={"count": 4})
    assert sweep.documents == [Documents(count=4)]


def test_documents_need_batch_one():
    with pytest.raises(FieldError) as info:
        scenario(batch=2, cp=[1], seq_len=[64], documents=[None, {"count": 4}])
    assert info.value.key == "batch" and "cu_seqlens needs batch 1" in info.value.message
    # unpacked cases may have a batch, in any layout
    assert ids(scenario(batch=2, cp=[2], seq_len=[64], mode=["p2p"], pass_=["forward"], layout=["zigzag"]))


def test_more_documents_than_the_shortest_sequence_names_documents():
    with pytest.raises(FieldError) as info:
        scenario(cp=[1, 2], local_seq_len=[32], documents=[{"count": 40}])  # T = 32 at cp 1
    assert info.value.key == "documents" and "count: 40 documents do not fit in a sequence of 32" in str(
        info.value
    )
    with pytest.raises(FieldError) as info:
        dataclasses.replace(_case(), documents=Documents(count=65))
    assert info.value.key == "documents"


@pytest.mark.parametrize(
    ("sweep", "key", "fragment"),
    [
        ({"layout": ["ring"]}, "layout", "unknown layout 'ring'; use one of contiguous, zigzag"),
        ({"layout": []}, "layout", "the list is empty"),
        ({"documents": []}, "documents", "the list is empty"),
        ({"documents": ["docs64"]}, "documents", "expected a mapping such as"),
    ],
)
def test_sweep_checks(sweep, key, fragment):
    with pytest.raises(FieldError) as info:
        Sweep(**sweep)
    assert info.value.key == key and fragment in info.value.message


def _case() -> Case:
    (case,) = scenario(cp=[2], seq_len=[64], mode=["p2p"], pass_=["forward"]).cases(warmup=1, repeat=1)
    return case


def test_case_round_trips_with_documents():
    (case,) = scenario(
        cp=[2],
        seq_len=[64],
        mode=["all_gather"],
        pass_=["forward"],
        layout=["zigzag"],
        documents=[{"count": 3, "lengths": "uniform"}],
    ).cases(warmup=1, repeat=1)
    d = to_dict(case)
    assert d["layout"] == "zigzag"
    assert d["documents"] == {"count": 3, "lengths": "uniform", "seed": 0, "sigma": 1.0}
    assert from_dict(Case, d) == case and hash(from_dict(Case, d)) == hash(case)
    assert pickle.loads(pickle.dumps(case)) == case  # ranks receive it pickled


def test_filters_select_layout_and_documents():
    cases = scenario(
        cp=[2],
        seq_len=[64],
        mode=["p2p"],
        pass_=["forward"],
        layout=["contiguous", "zigzag"],
        documents=[None, {"count": 4}],
    ).cases(warmup=1, repeat=1)

    def chosen(*exprs: str) -> list[str]:
        return [c.case_id for c in parse_filters(list(exprs)).apply(cases)]

    assert chosen("layout=zigzag") == [
        "p2p-ckpt-cp2-T64-zigzag-fwd",
        "p2p-ckpt-cp2-T64-zigzag-docs4-fixed-fwd",
    ]
    assert chosen("documents=none") == ["p2p-ckpt-cp2-T64-fwd", "p2p-ckpt-cp2-T64-zigzag-fwd"]
    assert chosen("documents=docs*,layout=contiguous") == ["p2p-ckpt-cp2-T64-docs4-fixed-fwd"]


def test_scenario_definition_keeps_the_lists_and_omits_them_when_unset():
    s = scenario(cp=[2], seq_len=[64], layout=["zigzag"], documents=[None, {"count": 4}])
    d = s.to_dict()
    assert d["layout"] == ["zigzag"]
    assert d["documents"] == [None, {"count": 4, "lengths": "fixed", "seed": 0, "sigma": 1.0}]
    # scenarios that do not sweep them store the definition they always did (resume, compare)
    assert "layout" not in scenario(cp=[2], seq_len=[64]).to_dict()
    assert "documents" not in scenario(cp=[2], seq_len=[64]).to_dict()
