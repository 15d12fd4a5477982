"""How many bytes each CP mode moves per rank and step: the analytic model that measured counts
(gdn_cp.distributed.comm_stats) are checked against."""

from __future__ import annotations

import torch

from gdn_cp.dtypes import accumulation_dtype
from gdn_cp.layers import GatedDeltaNetConfig

Volume = dict[str, dict[str, int]]
"""kind -> {"sent": bytes, "received": bytes, "calls": n}, the layout of CommStats.as_dict()."""


def _add(volume: Volume, kind: str, sent: int, received: int, calls: int = 1) -> None:
    v = volume.setdefault(kind, {"sent": 0, "received": 0, "calls": 0})
    v["sent"] += sent
    v["received"] += received
    v["calls"] += calls


def _halo_tokens(rank: int, cp: int, local: int, width: int) -> tuple[int, int]:
    """(tokens this rank sends, tokens it receives) in the halo exchange of equal shards of `local`."""
    received = min(width, rank * local)
    lo, hi = rank * local, (rank + 1) * local
    sent = sum(max(0, min(hi, d * local) - max(lo, d * local - width)) for d in range(rank + 1, cp))
    return sent, received


def layer_communication(
    mode: str,
    config: GatedDeltaNetConfig,
    *,
    cp: int,
    rank: int,
    seq_len: int,
    batch: int = 1,
    backward: bool = True,
) -> Volume:
    """Bytes rank `rank` sends and receives in one forward (and backward) of a GatedDeltaNet under CP.

    Notation: B batch, L = T / cp local tokens, e the parameter dtype's bytes, s the state dtype's bytes
    (fp32, or fp64 for fp64 layers), D = 2 Hk K + Hv V the conv channels, w = conv_kernel_size - 1.
    Every mode starts with the shard-length check (an all-gather of one int64: 8 (cp - 1) bytes each way).

    ulysses, per all-to-all, each way (forward: 2, backward: 2 more):
        Q/K/V/B/A out:  B L (cp - 1) (2 Hk K + Hv V + 2 Hv) / cp * e
        outputs back:   B L (cp - 1) Hv V / cp * e                     -> O(T / cp x channels)
    p2p:
        halo (forward; backward reverses it): receive min(w, r L) tokens of D channels, send the tokens of
            this shard that later ranks need: B tokens D e
        state chain: one state B Hv K V s from rank r-1 and one to rank r+1 (backward: the other way)
    all_gather:
        the same halo, and one all-gather of the packed [S | M]: (cp - 1) B Hv K (V + K) s each way
        (backward: the same volume back, to sum each slot at its owner)
    On one rank nothing is exchanged.
    """
    if cp == 1:
        return {}
    e = torch.empty((), dtype=config.dtype).element_size()
    s = torch.empty((), dtype=accumulation_dtype(config.dtype)).element_size()
    B, L = batch, seq_len // cp
    Hk, Hv, K, V = config.num_k_heads, config.num_v_heads, config.head_k_dim, config.head_v_dim
    passes = 2 if backward else 1
    volume: Volume = {}
    _add(volume, "all_gather", 8 * (cp - 1), 8 * (cp - 1))
    if mode == "ulysses":
        packed = B * L * (cp - 1) * (2 * Hk * K + Hv * V + 2 * Hv) // cp * e
        outputs = B * L * (cp - 1) * Hv * V // cp * e
        _add(volume, "all_to_all", passes * (packed + outputs), passes * (packed + outputs), 2 * passes)
        return volume

    width = config.conv_kernel_size - 1
    if width:
        sent, received = _halo_tokens(rank, cp, L, width)
        row = B * config.conv_dim * e
        _add(volume, "halo", sent * row, received * row)
        if backward:
            _add(volume, "halo", received * row, sent * row)
    if mode == "p2p":
        state = B * Hv * K * V * s
        first, last = rank == 0, rank == cp - 1
        # forward: receive from r-1, send to r+1; backward: receive from r+1, send to r-1
        _add(volume, "p2p", 0 if last else state, 0 if first else state, int(not first) + int(not last))
        if backward:
            _add(volume, "p2p", 0 if first else state, 0 if last else state, int(not first) + int(not last))
    elif mode == "all_gather":
        packed = (cp - 1) * B * Hv * K * (V + K) * s
        _add(volume, "all_gather", passes * packed, passes * packed, passes)
    else:
        raise ValueError(f"unknown CP mode {mode!r}")
    return volume
