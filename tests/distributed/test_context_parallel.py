"""LinearAttentionContextParallel in every mode against the single-device layer with identical weights.

Each (mode, world size) test checks every case of that mode: fp64, fp32 and bf16, summary checkpoint on and
off, 6 tokens per rank and 1 token per rank: output, input gradient, every parameter gradient and the global
grad norm. fp64 and fp32 are held to tight bars, bf16 to the seed's scale-aware bars.
"""

from __future__ import annotations

import cp_ranks
import pytest

from gdn_cp.accuracy import Thresholds

pytestmark = pytest.mark.multirank

# fp32: relative L2 within 1e-5 everywhere; the max-abs ratio gets 5e-5 because the small A_log / dt_bias
# gradients are sums over every token, whose order differs between the sharded and the full computation.
FP32 = Thresholds(
    output_max_abs=1e-5,
    input_grad_max_abs=1e-4,
    rel_max=5e-5,
    rel_l2=1e-5,
    param_rel_max=5e-5,
    param_rel_l2=1e-5,
    grad_norm_rel=1e-5,
)
BARS = {"fp64": Thresholds.tight(1e-10), "fp32": FP32, "bf16": Thresholds()}
MODE_WORLDS = [
    pytest.param(mode, world, id=f"{mode}-cp{world}")
    for world in (1, 2, 3, 4)
    for mode in cp_ranks.modes_for(world)
]


def _case_id(case: cp_ranks.LayerCase) -> str:
    mode, dtype, ckpt, seq = case
    return f"{mode}-{dtype}-{'ckpt' if ckpt else 'graph'}-T{seq}"


@pytest.mark.parametrize(("mode", "world"), MODE_WORLDS)
def test_mode_matches_the_reference(world_results, mode: str, world: int) -> None:
    results = world_results(world)[0]["layer"]
    cases = [c for c in results if c[0] == mode]
    assert len(cases) == (4 if mode == "ulysses" else 7)
    failures = {_case_id(c): results[c].failures(BARS[c[1]]) for c in cases}
    assert not any(failures.values()), {k: v for k, v in failures.items() if v}
    for case in cases:
        assert not results[case].missing_grads and len(results[case].params) == 9, _case_id(case)


def test_ulysses_is_exercised_where_heads_split() -> None:
    assert [w for w in (1, 2, 3, 4) if "ulysses" in cp_ranks.modes_for(w)] == [1, 2, 4]


@pytest.mark.parametrize("world", [2, 3, 4], ids=lambda w: f"cp{w}")
@pytest.mark.parametrize("mode", ["p2p", "all_gather"])
def test_checkpoint_summary_on_equals_off(world_results, mode: str, world: int) -> None:
    for rank in world_results(world):
        assert rank["checkpoint_on_off"][mode] == 0.0
