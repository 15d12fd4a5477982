"""What packing costs: the chunked op and the layer, forward+backward, on the same tokens unpacked and as 64
documents (log-normal lengths, bench.suite.documents), side by side in one run (issue 12's target: packed
<= 1.1x unpacked).

Three packings per T: `unpacked`; `packed` (no per-document states: documents share chunks, kept apart by
masks, the path of the layer and of training); `packed+states` (an initial and a final state per document:
every document in chunks of its own, FLA's layout, which pays up to one partly filled chunk per document).
B = 1, Hk/Hv = 4/8, K = V = 64, fp32, chunk 64. Not part of the test suite; run on purpose on an idle
machine:

    python -m pytest tests/benchmarks/test_packed_cost.py -p no:cacheprovider --benchmark-enable \\
        -o addopts="" --benchmark-columns=median,iqr,rounds --benchmark-group-by=group

Each case's extra_info holds the chunks the op runs (`chunks`) beside T / 64, so the padding is visible.
The CP modes' cost on packed input is the `cpu-documents` bench scenario (`bench run --scenario
cpu-documents`).
"""

from __future__ import annotations

import math
from itertools import pairwise

import pytest
import torch
import torch.nn.functional as F

from bench.suite.documents import Documents
from gdn_cp import GatedDeltaNet, GatedDeltaNetConfig
from gdn_cp.ops import chunk_gated_delta_rule

B, HK, HV, K, V, CHUNK = 1, 4, 8, 64, 64, 64
DOCUMENTS = Documents(count=64, lengths="lognormal", seed=0)
LENGTHS = (8192, 32768)
ROUNDS = {8192: 5, 32768: 2}
PACKINGS = ("unpacked", "packed", "packed+states")


def _inputs(T: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(B, T, HK, K, generator=gen) for _ in range(2))
    v = torch.randn(B, T, HV, V, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, HV, generator=gen))
    beta = torch.rand(B, T, HV, generator=gen)
    return [t.requires_grad_() for t in (q, k, v, g, beta)]


def _chunks(bounds: list[int] | None, T: int, own_chunks: bool) -> int:
    if bounds is None or not own_chunks:
        return math.ceil(T / CHUNK)
    return sum(math.ceil((b - a) / CHUNK) for a, b in pairwise(bounds))


@pytest.mark.parametrize("packing", PACKINGS)
@pytest.mark.parametrize("T", LENGTHS)
def test_op_fwd_bwd(benchmark, T: int, packing: str) -> None:
    benchmark.group = f"op fwd+bwd T={T}"
    x = _inputs(T)
    bounds = None if packing == "unpacked" else DOCUMENTS.bounds(T)
    cu = None if bounds is None else torch.tensor(bounds)
    states = packing == "packed+states"
    h0 = torch.zeros(len(bounds) - 1, HV, K, V) if states else None

    def step() -> None:
        o, h = chunk_gated_delta_rule(
            *x, initial_state=h0, output_final_state=states, use_qk_l2norm_in_kernel=True, cu_seqlens=cu
        )
        (o.sum() + (h.sum() if states else 0)).backward()

    benchmark.extra_info.update(chunks=_chunks(bounds, T, states), plain_chunks=math.ceil(T / CHUNK))
    benchmark.pedantic(step, rounds=ROUNDS[T], warmup_rounds=1)


@pytest.mark.parametrize("packing", PACKINGS[:2])
@pytest.mark.parametrize("T", LENGTHS[:1])
def test_layer_fwd_bwd(benchmark, T: int, packing: str) -> None:
    """The GatedDeltaNet layer (hidden 1024): projections, the Conv1D (masked per document when packed) and
    the core."""
    benchmark.group = f"layer fwd+bwd T={T}"
    torch.manual_seed(0)
    layer = GatedDeltaNet(
        GatedDeltaNetConfig(hidden_size=1024, num_k_heads=HK, num_v_heads=HV, head_k_dim=K, head_v_dim=V)
    )
    x = torch.randn(1, T, 1024, requires_grad=True)
    cu = None if packing == "unpacked" else torch.tensor(DOCUMENTS.bounds(T))

    def step() -> None:
        layer(x, cu_seqlens=cu).sum().backward()

    benchmark.pedantic(step, rounds=ROUNDS[T], warmup_rounds=1)
