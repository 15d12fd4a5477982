"""Built-in mutants (gdn_cp.distributed.mutants): each is off unless `mutated` turns it on, reaches only the
modes whose data it breaks, and is caught by the layer check on "state" inputs in fp32 and bf16, in every
mode and local path, while the unbroken modes pass the same bars (issue 48).

Bars: fp32, c eps sqrt(terms) over the layer's tokens and hidden size (tests/gdn_cp/ops/helpers.tolerance),
far above the roundoff of this tiny layer (outputs 2e-7) and far below the smallest mutant's error (a state 1%
off: 2e-3); bf16, the reference PR's bars with the output's relative L2 held to 5e-4, as cpu-verify's (the
bf16 output agrees with the reference to 0-1e-4; a state 1% off moves it 2.6e-3).
"""

from __future__ import annotations

import mutant_ranks
import pytest
import torch
from launches import per_world

from gdn_cp.accuracy import Thresholds
from gdn_cp.distributed import MODES, mode_class, mutants
from gdn_cp.distributed.layout import ShardPlan
from tests.gdn_cp.ops.helpers import tolerance

WORLD = 2
FP32 = Thresholds.tight(tolerance(torch.float32, terms=mutant_ranks.TOKENS_PER_RANK * WORLD * 32))
BF16 = Thresholds(output_rel_l2=5e-4)
BARS = {"float32": FP32, "bfloat16": BF16}


@pytest.fixture(scope="module")
def results():
    return per_world(mutant_ranks.run_world, timeout_s=300)


@pytest.mark.multirank
def test_every_mutant_is_caught_by_the_layer_check_in_fp32_and_bf16(results) -> None:
    found = results(WORLD)[0]
    assert {(dtype, mode) for dtype, mode, _, _ in found} == {(d, m) for d in BARS for m in MODES}
    caught = set()
    for (dtype, mode, variant, name), comparison in found.items():
        failures = comparison.failures(BARS[dtype])
        if name is None:
            assert failures == [], (dtype, mode, variant, failures)
            # the inputs make the state matter: rank 1's entering state carries over 10% of its output
            assert comparison.state_share[1] > 0.1, comparison.state_share
        else:
            assert failures, f"{name} passed the {dtype} check of {mode} {variant}"
            caught.add(name)
    assert caught == {m.name for m in mutants.MUTANTS}


@pytest.mark.multirank
def test_a_state_one_percent_off_shows_in_the_bf16_output_alone(results) -> None:
    """The reference PR's bf16 bars let a state 1% off through; the output's own bar catches it."""
    comparison = results(WORLD)[0][("bfloat16", "p2p", "{}", "state_scaled")]
    assert comparison.failures(Thresholds()) == []
    assert [f.split()[0] for f in comparison.failures(BF16)] == ["output.rel_l2"]


def test_mutants_are_off_unless_turned_on() -> None:
    assert mutants.ACTIVE is None
    with mutants.mutated("state_dropped", ranks=(1, 3)) as mutant:
        assert mutant.description == "incoming state dropped"
        assert mutants.ACTIVE is not None and mutants.ACTIVE.ranks == {1, 3}
        with (
            pytest.raises(ValueError, match="already on; mutants do not nest"),
            mutants.mutated("halo_dropped"),
        ):
            pass
    assert mutants.ACTIVE is None
    with pytest.raises(RuntimeError), mutants.mutated("halo_dropped"):
        raise RuntimeError("a failing check")
    assert mutants.ACTIVE is None
    with (
        pytest.raises(ValueError, match="unknown mutant 'state'; use one of state_dropped, state_scaled"),
        mutants.mutated("state"),
    ):
        pass


def test_each_mutant_applies_where_its_data_moves() -> None:
    by_mode = {mode: [m.name for m in mutants.applicable(mode_class(mode), False)] for mode in MODES}
    state = ["state_dropped", "state_scaled", "state_grad_dropped", "halo_dropped"]
    assert by_mode == {
        "ulysses": ["heads_permuted"],
        "p2p": state,
        "all_gather": [*state, "summary_twice"],
        "scan": [*state, "summary_twice"],
    }
    with_documents = [m.name for m in mutants.applicable(mode_class("ulysses"), True)]
    assert with_documents == ["boundary_moved", "heads_permuted"]


def test_the_mutations_on_their_rank_only() -> None:
    h = torch.ones(2, 1, 1, 2, 2, requires_grad=True)
    with mutants.mutated("state_scaled"):
        assert torch.equal(mutants.entering_states(h, 0), h)
        assert torch.allclose(mutants.entering_states(h, 1), h * mutants.STATE_SCALE)
    with mutants.mutated("state_grad_dropped"):
        out = mutants.entering_states(h, 1)
        assert torch.equal(out, h)
        out.sum().backward()
        assert torch.equal(h.grad, torch.zeros_like(h))
    halos = [torch.ones(1, 3, 4)]
    with mutants.mutated("halo_dropped"):
        assert mutants.halos(halos, 1)[0].shape == (1, 0, 4) and mutants.halos(halos, 0) is halos
    plan = ShardPlan(layout="contiguous", rank=1, cp=2, lengths=(8, 8))
    with mutants.mutated("boundary_moved"):
        assert mutants.document_bounds([0, 5, 12, 13, 16], plan) == [0, 5, 11, 13, 16]  # inside rank 1's
        assert mutants.document_bounds([0, 5, 16], plan) == [0, 5, 16]  # none inside: unchanged
        assert mutants.document_bounds(None, plan) is None
    assert mutants.document_bounds([0, 12, 16], plan) == [0, 12, 16]  # off
    ordered = torch.arange(3.0).view(3, 1)
    with mutants.mutated("summary_twice"):
        assert mutants.ordered_summaries(ordered, 2, 1).flatten().tolist() == [0.0, 2.0, 2.0]
        assert mutants.ordered_summaries(ordered, 0, 1) is ordered
    o = torch.arange(8.0).view(1, 1, 4, 2)  # [B, L, cp * h, V] with cp 2, h 2
    with mutants.mutated("heads_permuted"):
        assert mutants.returned_outputs(o, 1, 2).flatten().tolist() == [4, 5, 6, 7, 0, 1, 2, 3]
