"""Issue 34 under CP: the local op behind the backend seam, in every mode, layout, batch and packed documents,
with states in and out or none, checkpoint on and off (the recompute, affine and split paths), on 2 and 3
ranks, against the single-device fp64 reference (backend_ranks says which ops and why).

Bar: 1e-10 of the reference's scale in fp64, far above the roundoff of these sizes (eps sqrt(terms) < 1e-13
for ~50 tokens x 16 channels) and far below any real error (a wrong entering state is O(1)).
"""

from __future__ import annotations

import backend_ranks
import pytest
from launches import per_world

from gdn_cp.distributed import MODES, mode_class
from gdn_cp.distributed.modes import CPOptions
from gdn_cp.distributed.modes.sequence_shard import SequenceShardMode
from gdn_cp.ops import get_backend

pytestmark = pytest.mark.multirank

WORLDS = (2, 3)
FP64 = 1e-10


@pytest.fixture(scope="module")
def results():
    return per_world(backend_ranks.run_world, timeout_s=600)


@pytest.mark.parametrize("world", WORLDS)
def test_every_mode_through_a_registered_op_matches_the_reference(results, world) -> None:
    """Outputs, final states (the same on every rank), gradients of q, k, v, g, beta and of the initial
    states, for both registered ops, every mode, contiguous and zigzag, batch 2 and packed documents across
    ranks, states or none, checkpoint on and off."""
    cases = results(world)[0]["op"]
    assert {key[:2] for key in cases} == {(b, m) for b in backend_ranks.BACKENDS for m in MODES}
    assert len(cases) == 2 * (8 + 3 * 16)
    for key, errors in cases.items():
        bad = {name: e for name, e in errors.items() if not e <= FP64}
        assert not bad, f"{key}: {bad}"
    for rank_results in results(world):
        assert all(e.get("final_same_on_every_rank", 0) == 0 for e in rank_results["op"].values())


@pytest.mark.parametrize("world", WORLDS)
def test_the_layer_runs_every_mode_on_a_registered_op(results, world) -> None:
    for key, comparison in results(world)[0]["layer"].items():
        assert not comparison.missing_grads, key
        worst = {
            "output": comparison.output.rel_max,
            "input_grad": comparison.input_grad.rel_max,
            **{name: p.rel_max for name, p in comparison.params.items()},
        }
        bad = {name: e for name, e in worst.items() if not e <= FP64}
        assert not bad, f"{key}: {bad}"


ERRORS = {
    "ranks_differ_backend": "backend: rank 0 'gdn_cp', rank 1 'gdn_cp_seam'",
    "overlap_on_a_backend": "overlap=True applies to backend 'gdn_cp' only",
    "fla_on_cpu": "backend 'fla' runs on a CPU only under Triton's interpreter",
    "unknown_backend": "unknown backend 'nope'; use one of gdn_cp, fla, transformers",
    "still_in_step": "no error",
}


def test_backend_errors_name_the_option_on_every_rank(results) -> None:
    for rank_results in results(2):
        for check, expected in ERRORS.items():
            assert expected in rank_results["errors"][check], (check, rank_results["errors"][check])


def test_checkpoint_summary_chooses_the_local_path_on_every_backend() -> None:
    """On: recompute (the least memory); off: the one call at width V + K, kept; overlap: gdn_cp's split
    chunk scan, refused on another backend (its call is not split). ulysses calls the op on its head shard."""
    for name in ("gdn_cp", "transformers"):
        backend = get_backend(name)
        for mode in ("p2p", "all_gather", "scan"):
            cls = mode_class(mode)
            assert issubclass(cls, SequenceShardMode)
            paths = {
                ckpt: cls.local_path(CPOptions(mode=mode, checkpoint_summary=ckpt), backend)
                for ckpt in (True, False)
            }
            assert paths == {True: "recompute", False: "affine"}
        assert mode_class("ulysses").local_path(CPOptions(), backend) == "whole"
    overlap = CPOptions(mode="p2p", overlap=True)
    assert mode_class("p2p").local_path(overlap, get_backend("gdn_cp")) == "split"
