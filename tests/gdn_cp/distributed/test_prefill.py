"""The prefill under CP (issue 20): GatedDeltaNet.prefill through every mode, both layouts, a batch and
packed documents, on 2 and 4 ranks, against the single-device prefill of the whole sequence.

Bars: fp64 1e-9 of the reference's scale, as the packed-document checks (test_packed_documents): far above
the roundoff of these sizes (< 1e-13) on any CPU and far below a real error (a state from the wrong tokens
or rank is O(1)). The conv state is copied, not computed, so it must match to the projections' roundoff.
"""

from __future__ import annotations

import prefill_ranks
import pytest
from launches import per_world

from gdn_cp.distributed import MODES

pytestmark = pytest.mark.multirank

WORLDS = (2, 4)
FP64 = 1e-9
ERRORS = ("output", "conv_state", "recurrent_state", "decoded", "state_after_decode")


@pytest.fixture(scope="module")
def results():
    return per_world(prefill_ranks.run_world, timeout_s=300)


@pytest.mark.parametrize("world", WORLDS)
def test_prefill_matches_the_single_device_prefill(results, world) -> None:
    """Output, both final states, and a decoding step from the CP state, in every mode and layout."""
    cases = results(world)[0]["cases"]
    assert {mode for mode, _ in cases} == set(MODES)
    for key, found in cases.items():
        bad = {name: found[name] for name in ERRORS if not found[name] <= FP64}
        assert not bad, f"{key}: {bad}"


@pytest.mark.parametrize("world", WORLDS)
def test_every_rank_holds_the_same_states(results, world) -> None:
    for rank, rank_results in enumerate(results(world)):
        for key, found in rank_results["cases"].items():
            assert found["spread"] == 0, (rank, key)
            assert found["inference"], (rank, key)


@pytest.mark.parametrize("world", WORLDS)
def test_states_have_one_entry_per_sequence(results, world) -> None:
    """A batch of two: two states; packed: one per document (transformers' cache layout, N x D x W)."""
    cases = results(world)[0]["cases"]
    conv_dim = 2 * world * 8 + 2 * world * 4  # 2 Hk K + Hv V of prefill_ranks' layer
    for (_, name), found in cases.items():
        conv, recurrent = found["shapes"]
        n = found["sequences"]  # the batch, or the documents
        assert n == 2 if name.endswith("batch") else n >= 5
        assert conv == (n, conv_dim, 4) and recurrent == (n, 2 * world, 8, 4), (name, found["shapes"])


@pytest.mark.parametrize("world", WORLDS)
def test_prefill_bytes_equal_the_model(results, world) -> None:
    for rank, rank_results in enumerate(results(world)):
        for key, found in rank_results["cases"].items():
            counted, model = found["bytes"]
            assert counted == model, (rank, key)
