"""The shared pipeline of the sequence-shard modes (p2p, all_gather, scan): full heads, local tokens.

    project -> Conv1D with the left halo of each piece -> prepare chunks -> one summary (S, M) per piece
            -> H_in of each piece (the mode's exchange) -> outputs from the same prepared chunks
            -> norm, gate, out-proj

Every rank summarises its pieces in parallel; only summaries or states cross ranks. The chunk preparation
(UT transform, W, U, masked QK^T) is done once and serves both the summaries and the outputs. Every call
starts with the header (gdn_cp.distributed.header), from which the ranks agree on every piece's length.

Packed documents: the Conv1D halo is cut at the document start. Without states per document (the layer, and
training), each piece is one run of chunks in which the documents starting inside it are resets (they share
chunks, kept apart by masks: gdn_cp.ops.documents), so a piece's summary is its chunks' map, with M = 0
wherever a document starts. With initial or final states, a rank's tokens are cut into segments
(gdn_cp.distributed.layout.LocalSegment), each in chunks of its own: a segment that continues a document
from an earlier piece enters with the piece's H_in, one that starts a document with that document's initial
state (or zeros); a piece's summary is the map of its last segment from the piece's entering state (M = 0
once a document starts inside it, S including the starting document's initial state).
"""

from __future__ import annotations

import itertools
from abc import abstractmethod
from typing import TYPE_CHECKING

import torch

from gdn_cp.distributed.collectives import exchange_halos, wants_tail
from gdn_cp.distributed.comm_stats import Volume, add_volume
from gdn_cp.distributed.layout import LocalSegment, ShardPlan, piece_owners
from gdn_cp.distributed.modes.base import CommCase, CPMode
from gdn_cp.distributed.transfers import InFlight
from gdn_cp.dtypes import accumulation_dtype
from gdn_cp.layers import GatedDeltaNet
from gdn_cp.ops import (
    affine_rule,
    apply_summary,
    causal_conv1d,
    conv_state,
    gdn_state_summary,
    prepare_chunks,
    segment_maps,
    segments_rule,
    split_chunk_outputs,
    unpack_summary,
)
from gdn_cp.ops.backends import DEFAULT_BACKEND, Backend

if TYPE_CHECKING:
    from gdn_cp.distributed.modes import CPOptions


def state_bytes(config) -> int:
    """Bytes per element of the states and summaries that cross ranks: the accumulation dtype's."""
    return torch.empty((), dtype=accumulation_dtype(config.dtype)).element_size()


def halo_tails(owners: tuple[int, ...], rank: int, width: int) -> tuple[int, int]:
    """(tails sent, tails received) by `rank` in the halo exchange: a piece's tail goes to every other rank
    holding one of the next `width` pieces (gdn_cp.distributed.collectives.exchange_halos)."""
    cp = max(owners) + 1
    sent = sum(
        wants_tail(owners, width, peer, j) for j, o in enumerate(owners) if o == rank for peer in range(cp)
    )
    received = sum(wants_tail(owners, width, rank, j) for j, o in enumerate(owners) if o != rank)
    return sent, received


class SequenceShardMode(CPMode):
    has_summary = True

    @classmethod
    def communication(cls, case: CommCase) -> Volume:
        """The header (`header_volume`) and a prefill's state sum (`final_state_volume`); the halo exchange
        (w = conv_kernel_size - 1, D = 2 Hk K + Hv V, e the dtype's bytes): B w D elements per tail, a
        piece's tail going to every other rank holding one of the next w pieces; the backward sends the same
        volume back. Then the mode's own exchange (`state_exchange`)."""
        config, cp, rank = case.config, case.cp, case.rank
        e = torch.empty((), dtype=config.dtype).element_size()
        width = config.conv_kernel_size - 1
        tail = case.batch * width * config.conv_dim * e
        tails_sent, tails_received = halo_tails(piece_owners(case.layout, cp), rank, width)
        sent, received = tail * tails_sent, tail * tails_received
        volume: Volume = {}
        cls.header_volume(volume, case)
        cls.final_state_volume(volume, case)
        add_volume(volume, "halo", sent, received)
        if case.backward:
            add_volume(volume, "halo", received, sent)
        cls.state_exchange(volume, case, state_bytes(config))
        return volume

    @classmethod
    @abstractmethod
    def state_exchange(cls, volume: Volume, case: CommCase, state_bytes: int) -> None:
        """Add to `volume` what `begin_entering_states` moves (states in the accumulation dtype:
        `state_bytes`)."""

    @abstractmethod
    def begin_entering_states(self, S: torch.Tensor, M: torch.Tensor, plan: ShardPlan) -> InFlight:
        """The state entering each of this rank's pieces, from every piece's summary: the exchange posted, its
        wait() returning H_in (gdn_cp.distributed.transfers).

        S [P, B, Hv, K, V] and M [P, B, Hv, K, K] are this rank's P pieces' (in increasing global order);
        H_in is [P, B, Hv, K, V]. Every rank's result must depend on the exchange, so that its backward
        (itself a collective) runs on every rank.
        """

    # -- the layer ------------------------------------------------------------------------------------------

    def layer_shard(
        self, layer: GatedDeltaNet, x: torch.Tensor, cu_seqlens: torch.Tensor | None, final_state: bool
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        c = layer.config
        signature = self.layer_signature(c, x, final_state)
        plan, bounds = self.plan_by_header(
            signature, x.shape[1], cu_seqlens, x.device, self.layer_check(layer, x)
        )
        p = layer.project(x)
        pieces = p.mixed_qkv.split(plan.local_lengths, dim=1)
        halos = exchange_halos(pieces, c.conv_kernel_size - 1, plan.lengths, self.group, plan.owners)
        segments = plan.segments(bounds)
        mixed = torch.cat(
            [
                _convolve_piece(piece, halo, [s for s in segments if s.piece == at], plan, bounds, layer)
                for at, (piece, halo) in enumerate(zip(pieces, halos, strict=True))
            ],
            dim=1,
        )
        q, k, v = layer.split_qkv(mixed)
        g, beta = layer.gates(p.a, p.b)
        o, state = self.sharded_rule(
            plan,
            (q, k, v, g, beta),
            scale=None,
            initial_state=None,
            output_final_state=final_state,
            use_qk_l2norm_in_kernel=True,
            documents=bounds,
            chunk_size=c.chunk_size,
            backend=self.backend(c.backend),
        )
        out = layer.output(o, p.z)
        if state is None:
            return out, None
        positions = plan.global_positions(x.device)
        conv = conv_state(p.mixed_qkv, c.conv_kernel_size, bounds, positions=positions, seq_len=plan.total)
        return out, (conv, state)

    # -- the op ---------------------------------------------------------------------------------------------

    @classmethod
    def local_path(cls, options: CPOptions, backend: Backend) -> str:
        """How this rank computes its pieces' summaries and outputs (the trade `checkpoint_summary` names):

        - "recompute" (checkpoint_summary on, the least memory): `segment_maps` (the backend op at value width
          V + K from [0 | I], its outputs dropped, recomputed in backward), the exchange, then `segments_rule`
          (the op at width V from H_in): what stays for backward is what one call at width V keeps;
        - "affine" (checkpoint off): `affine_rule`, one call at width V + K whose outputs are affine in H_in,
          before the exchange, its graph kept: no call is repeated in backward;
        - "split" (backend gdn_cp with overlap on): gdn_cp's chunk stages apart, prepared once
          (`prepare_chunks`, the summaries, `split_chunk_outputs` while the exchange is in flight), every
          prepared chunk kept; with checkpoint_summary the summaries' reduction alone is recomputed.

        Measured at the reference PR's per-rank shape (2K tokens per rank, bf16, 2 gloo ranks, 2-core AMD
        EPYC; README "Memory"): peak allocated per rank recompute ~730 MiB (ulysses ~710-740), affine ~947,
        split ~1200; forward+backward time recompute and affine 0.73-0.80x split's, the two within 3% of each
        other on a CPU (where a fused kernel's extra forward costs more, checkpoint off saves it).
        """
        if backend.name == DEFAULT_BACKEND and options.overlap:
            return "split"
        return "recompute" if options.checkpoint_summary else "affine"

    def check_backend(self, backend, device, dtype, chunk_size, head_k_dim, scale=None) -> None:
        super().check_backend(backend, device, dtype, chunk_size, head_k_dim, scale)
        if self.options.overlap and self.local_path(self.options, backend) != "split":
            raise ValueError(
                "overlap=True applies to backend 'gdn_cp' only (its chunk scan runs while the exchange is "
                f"in flight); backend {backend.name!r} computes the outputs in calls of its op on either "
                "side of the exchange: use overlap=False"
            )

    def sharded_rule(
        self,
        plan: ShardPlan,
        inputs: tuple[torch.Tensor, ...],
        *,
        scale: float | None,
        initial_state: torch.Tensor | None,
        output_final_state: bool,
        use_qk_l2norm_in_kernel: bool,
        documents: list[int] | None,
        chunk_size: int,
        backend: Backend,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        segments = plan.segments(documents)
        kw = {"scale": scale, "use_qk_l2norm_in_kernel": use_qk_l2norm_in_kernel, "chunk_size": chunk_size}
        # Initial states per document, [B, n, Hv, K, V] (cu_seqlens: B = 1 and n documents; else n = 1).
        starts = None
        if initial_state is not None:
            starts = initial_state.unsqueeze(0) if documents is not None else initial_state.unsqueeze(1)
        path = self.local_path(self.options, backend)
        if path != "split":
            o, finals = self._backend_rule(
                plan, inputs, segments, starts, output_final_state, backend, path, kw
            )
        elif initial_state is None and not output_final_state:
            return self._split_rule(plan, inputs, segments, kw), None
        else:
            o, finals = self._rule_with_states(plan, inputs, segments, starts, output_final_state, kw)
        if not output_final_state:
            return o, None
        # Each document's final state is on the rank holding its last token (the caller sums the shares).
        n_docs = 1 if documents is None else len(documents) - 1
        ending = [i for i, s in enumerate(segments) if s.ends_document]
        index = torch.tensor([segments[i].document for i in ending], dtype=torch.long, device=finals.device)
        share = finals.new_zeros(finals.shape[0], n_docs, *finals.shape[2:]).index_copy(
            1, index, finals[:, ending]
        )
        return o, (share[0] if documents is not None else share[:, 0])

    def _backend_rule(
        self,
        plan: ShardPlan,
        inputs: tuple[torch.Tensor, ...],
        segments: list[LocalSegment],
        starts: torch.Tensor | None,
        output_final_state: bool,
        backend: Backend,
        path: str,
        kw: dict,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The "affine" and "recompute" paths (`local_path`): every segment (a document inside a piece) a
        sequence of the backend's op; (o, every segment's final state [B, n, Hv, K, V] or None).

        Every piece's first segment reads H_in (where it starts a document, through exact zeros: q_eff = 0
        on the affine path, `where` on the other), so that the exchange's backward runs on every rank."""
        pieces = sorted({s.piece for s in segments})
        first = [min(i for i, s in enumerate(segments) if s.piece == p) for p in pieces]
        last = [max(i for i, s in enumerate(segments) if s.piece == p) for p in pieces]
        fresh = None
        if starts is not None:
            documents = torch.tensor([s.document for s in segments], device=starts.device)
            fresh = starts.index_select(1, documents)
        shard = {
            "bounds": [s.start for s in segments] + [sum(plan.local_lengths)],
            "carried": [s.carried for s in segments],
            "fresh_states": fresh,
            **kw,
        }
        if path == "affine":
            return self._affine_rule(plan, inputs, first, last, output_final_state, backend, shard)
        return self._recompute_rule(
            plan, inputs, segments, first, last, output_final_state, backend, shard, kw
        )

    def _affine_rule(
        self,
        plan: ShardPlan,
        inputs: tuple[torch.Tensor, ...],
        first: list[int],
        last: list[int],
        output_final_state: bool,
        backend: Backend,
        shard: dict,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The "affine" path: (o, every segment's final state [B, n, Hv, K, V] or None)."""
        affine = affine_rule(
            backend,
            *inputs,
            reading=first,
            finals=output_final_state or any(j not in first for j in last),
            **shard,
        )
        S, M = unpack_summary(torch.stack([affine.summary(j) for j in last]), inputs[2].shape[-1])
        entering = self.begin_entering_states(S, M, plan).wait()  # [P, B, Hv, K, V]
        return affine.with_entering_states(entering.transpose(0, 1), output_final_state)

    def _recompute_rule(
        self,
        plan: ShardPlan,
        inputs: tuple[torch.Tensor, ...],
        segments: list[LocalSegment],
        first: list[int],
        last: list[int],
        output_final_state: bool,
        backend: Backend,
        shard: dict,
        kw: dict,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The "recompute" path: (o, every segment's final state [B, n, Hv, K, V] or None)."""
        fresh = shard["fresh_states"]
        packed = _piece_maps(plan, inputs, last, fresh, backend, shard)
        S, M = unpack_summary(packed, inputs[2].shape[-1])
        entering = self.begin_entering_states(S, M, plan).wait()  # [P, B, Hv, K, V]
        # Each piece's first segment enters with H_in where it continues a document, through `where` always.
        carried = torch.tensor([segments[j].carried for j in first], device=S.device).view(-1, 1, 1, 1, 1)
        given = torch.zeros_like(entering) if fresh is None else fresh[:, first].transpose(0, 1).to(S.dtype)
        return segments_rule(
            backend,
            *inputs,
            bounds=shard["bounds"],
            reading=first,
            entering=torch.where(carried, entering, given).transpose(0, 1),
            fresh_states=fresh,
            output_final_state=output_final_state,
            **kw,
        )

    def _split_rule(
        self, plan: ShardPlan, inputs: tuple[torch.Tensor, ...], segments: list[LocalSegment], kw: dict
    ) -> torch.Tensor:
        """The split path (overlap) without states in or out: chunks are cut at the pieces' edges only, and
        the documents inside a piece share chunks (resets), with no padding."""
        at = [0, *itertools.accumulate(plan.local_lengths)]
        resets = [s.start for s in segments if not s.carried]
        chunks = prepare_chunks(*inputs, cu_seqlens=at, resets=resets, **kw)
        summaries = [
            gdn_state_summary(chunks, checkpoint_summary=self.options.checkpoint_summary, segment=piece)
            for piece in range(len(plan.local_pieces))
        ]
        S, M = torch.stack([S for S, _ in summaries]), torch.stack([M for _, M in summaries])
        pending = self.begin_entering_states(S, M, plan)
        split = split_chunk_outputs(chunks)  # while the exchange is in flight
        o, _ = split.with_entering_states(pending.wait().transpose(0, 1))
        return o

    def _rule_with_states(
        self,
        plan: ShardPlan,
        inputs: tuple[torch.Tensor, ...],
        segments: list[LocalSegment],
        starts: torch.Tensor | None,
        output_final_state: bool,
        kw: dict,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The split path (overlap) with states in or out: every segment (a document inside a piece) in
        chunks of its own, entering with H_in (it continues a document) or its document's initial state,
        leaving with its final state: (o, every segment's final state [B, n, Hv, K, V] or None)."""
        local_bounds = [s.start for s in segments] + [sum(plan.local_lengths)]
        chunks = prepare_chunks(*inputs, cu_seqlens=local_bounds, **kw)
        S, M = self._piece_summaries(chunks, segments, starts)
        pending = self.begin_entering_states(S, M, plan)

        device = S.device
        piece_of = torch.tensor([s.piece for s in segments], device=device)
        carried = torch.tensor([s.carried for s in segments], device=device)
        documents = torch.tensor([s.document for s in segments], device=device)
        fresh = None if starts is None else starts.index_select(1, documents).to(S.dtype)
        split = split_chunk_outputs(chunks, fresh, carried)  # while the exchange is in flight
        entering = pending.wait().index_select(0, piece_of).transpose(0, 1)  # [B, n_segments, Hv, K, V]
        return split.with_entering_states(entering, output_final_state)

    def _piece_summaries(
        self, chunks, segments: list[LocalSegment], starts: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(S [P, ...], M [P, ...]): each piece's map from its entering state to the state leaving it."""
        S_all, M_all = [], []
        for piece in sorted({s.piece for s in segments}):
            ids = [i for i, s in enumerate(segments) if s.piece == piece]
            first, last = ids[0], ids[-1]
            S, M = gdn_state_summary(chunks, checkpoint_summary=self.options.checkpoint_summary, segment=last)
            if not (segments[first].carried and first == last):
                # A document starts in this piece: the entering state is forgotten by the piece's end.
                if starts is not None:
                    S = apply_summary((S, M), starts[:, segments[last].document])
                M = torch.zeros_like(M)
            S_all.append(S)
            M_all.append(M)
        return torch.stack(S_all), torch.stack(M_all)


def _piece_maps(
    plan: ShardPlan,
    inputs: tuple[torch.Tensor, ...],
    last: list[int],
    fresh: torch.Tensor | None,
    backend: Backend,
    shard: dict,
) -> torch.Tensor:
    """Each piece's packed map [P, B, Hv, K, V + K] (`segment_maps` of its last segment, recomputed)."""
    # The global last piece's map reaches no other piece: zeros stand in for it (no call, no recompute).
    needed = [j for p, j in zip(plan.local_pieces, last, strict=True) if p < len(plan.owners) - 1]
    maps = segment_maps(backend, *inputs, segments=needed, recompute=True, **shard) if needed else None
    (B, _, Hv, V), K = inputs[2].shape, inputs[0].shape[-1]
    skipped = inputs[2].new_zeros(B, Hv, K, V + K, dtype=accumulation_dtype(inputs[2].dtype))
    # A leaf that asks for its gradient, as the maps it stands in for would: the exchange's output then
    # needs one too, so that its backward (a collective) runs on this rank as on the others.
    tracked = (*inputs, fresh) if fresh is not None else inputs
    skipped.requires_grad_(torch.is_grad_enabled() and any(t.requires_grad for t in tracked))
    return torch.stack([maps[:, needed.index(j)] if j in needed else skipped for j in last])


def _convolve_piece(
    piece: torch.Tensor,
    halo: torch.Tensor,
    segments: list[LocalSegment],
    plan: ShardPlan,
    bounds: list[int] | None,
    layer: GatedDeltaNet,
) -> torch.Tensor:
    """The Conv1D of one piece [B, L_p, D]: its halo cut at the document start, documents kept apart."""
    first = segments[0]
    if not first.carried:
        halo = halo[:, :0]  # a view still, so that the halo exchange's backward runs here too
    elif bounds is not None:
        start = plan.starts[plan.local_pieces[first.piece]]
        inside = start - max(b for b in bounds if b <= start)  # earlier tokens of the same document
        halo = halo[:, halo.shape[1] - min(halo.shape[1], inside) :]
    offset = first.start
    local = [s.start - offset for s in segments] + [piece.shape[1]]
    return causal_conv1d(piece, layer.conv1d.weight, halo, cu_seqlens=local if len(segments) > 1 else None)
