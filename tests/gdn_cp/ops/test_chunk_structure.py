"""The chunked GDN costs O(T) in forward and backward, checked by counting (never by timing): saved-tensor
bytes, autograd graph nodes, and the elements the backward's aten ops produce, at T and 4T."""

from __future__ import annotations

import torch
from helpers import Shape, backward_elements_written, gdn_inputs, saved_tensor_bytes

from gdn_cp.ops import chunk_gated_delta_rule

CHUNK = 16
T_SMALL, T_LARGE = 256, 1024  # 16 and 64 chunks: fixed overheads are small next to per-chunk work


def _shape(T: int) -> Shape:
    return Shape(1, T, 1, 2, 8, 4)


def _forward(T: int) -> tuple[torch.Tensor, int]:
    """Loss of a chunked forward at length T, and the bytes its graph saved."""
    x = gdn_inputs(_shape(T), dtype=torch.float32, requires_grad=True)
    with saved_tensor_bytes() as saved:
        o, h = chunk_gated_delta_rule(
            *x, output_final_state=True, use_qk_l2norm_in_kernel=True, chunk_size=CHUNK
        )
    return o.sum() + h.sum(), saved[0]


def _graph_nodes(root: torch.Tensor) -> int:
    seen: set[torch.autograd.graph.Node] = set()
    stack = [root.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(next_fn for next_fn, _ in node.next_functions)
    return len(seen)


def test_saved_bytes_and_graph_nodes_grow_linearly() -> None:
    loss_small, saved_small = _forward(T_SMALL)
    loss_large, saved_large = _forward(T_LARGE)
    assert saved_large / saved_small <= 4.5
    assert _graph_nodes(loss_large) / _graph_nodes(loss_small) <= 4.5


def test_backward_work_grows_linearly() -> None:
    loss_small, _ = _forward(T_SMALL)
    loss_large, _ = _forward(T_LARGE)
    ratio = backward_elements_written(loss_large) / backward_elements_written(loss_small)
    assert ratio <= 4.5, f"backward work grew {ratio:.1f}x for 4x tokens: not O(T)"


def test_backward_work_metric_detects_per_chunk_index_writes() -> None:
    """The metric is sensitive: a scan that writes each chunk's output into a preallocated whole-sequence
    tensor (transformers' pure-torch fallback does) is quadratic in backward, and the metric shows it."""

    def quadratic_scan(T: int) -> torch.Tensor:
        x = torch.randn(T // CHUNK, CHUNK, 4, requires_grad=True)
        out = torch.zeros(T // CHUNK, CHUNK, 4)
        h = torch.zeros(4)
        for i in range(T // CHUNK):
            h = 0.9 * h + x[i].sum(0)
            out[i] = x[i] * h  # each CopySlices backward clones the whole [T, 4] gradient
        return out.sum()

    ratio = backward_elements_written(quadratic_scan(T_LARGE)) / backward_elements_written(
        quadratic_scan(T_SMALL)
    )
    assert ratio > 8
