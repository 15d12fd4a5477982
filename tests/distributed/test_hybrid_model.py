"""The hybrid model (3 GDN : 1 full-attention layers) under CP: loss, logits and every gradient."""

from __future__ import annotations

import cp_ranks
import pytest

from gdn_cp.distributed import MODES

pytestmark = pytest.mark.multirank


@pytest.mark.parametrize("world", cp_ranks.HYBRID_WORLDS, ids=lambda w: f"cp{w}")
@pytest.mark.parametrize("mode", MODES)
def test_hybrid_model_under_cp_matches_single_rank(world_results, mode: str, world: int) -> None:
    errors = world_results(world)[0]["hybrid"][mode]
    worst = max(errors, key=errors.get)
    assert errors[worst] < 1e-10, (worst, errors[worst])
    assert len(errors) > 20  # loss, logits and every parameter
