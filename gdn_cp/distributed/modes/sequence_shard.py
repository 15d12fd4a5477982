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
    outputs_in_order,
    prepare_chunks,
    ran,
    segment_outputs,
    segment_summaries,
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
        """How this rank computes its pieces' summaries and outputs (the trade `checkpoint_summary` names,
        as `checkpoint_for` resolves it). On every path a rank none of whose segments reads H_in (its pieces
        start documents) runs at width V and takes each piece's map from its outputs' final states, and a
        summary is taken only where a later piece reads it: at cp 2 no rank builds M, from cp 3 the middle
        ranks do.

        A backend with a summaries-then-outputs pair (Backend.kcp: gdn_cp's chunk stages,
        gdn_cp.ops.summarise_chunks; fla's kernels, gdn_cp.ops.backends.fla_kcp), FLA's KCP:
        - "kcp" (checkpoint on, the default there): [S | M] of the pieces that feed a later one without
          outputs (the chunk chain of the state), the exchange, then the outputs at width V from H_in, on one
          intra-chunk pass; one backward at width V after KCP's pre-pass (the exchange's backward folds dS
          from the later pieces into the leaving state's gradient). It keeps what the op alone keeps
          (inputs, UT transforms, a state per block of chunks): ulysses' memory; the backward recomputes.
        - "kcp-kept" (off): the same, the intermediates and chunk states kept, nothing recomputed.
        - "split" (gdn_cp, overlap on): the chunk stages apart, `split_chunk_outputs` (a scan at width V + K)
          while the exchange is in flight, every prepared chunk kept; with checkpoint_summary the summaries'
          reduction alone is recomputed.
        Another backend, through its op (gdn_cp.ops.affine):
        - "recompute" (checkpoint on): [S | M] from its summary hook or the seam's call at V + K without a
          graph (Backend.summarise), the exchange, the outputs in one call at width V; the summary's backward
          is one more call at width V from H_in with dS (KCP's fold through the op's own autograd): the
          memory of one call at width V, nothing differentiated at V + K.
        - "affine" (off, the default there): one call at width V + K for the segments that read H_in, before
          the exchange, its outputs affine in H_in, its graph kept: no call repeated in backward.

        Which, per mode: p2p, all_gather and scan differ only in how they form H_in from the maps (each
        uses (S, M) only as M H_in + S), so each takes the same path. A backend with a pair computes the
        outputs at width V after the exchange (KCP): never wider than ulysses' call, with one backward.
        Without one, the seam's call at V + K kept (affine) costs less than the hook and two calls at V
        (recompute), which holds less memory, and it runs before the exchange, filling the wait (p2p's last
        rank waits cp - 1 hops), where recompute's outputs wait for it. On paper (matmul FLOPs
        of a forward+backward, FlopCounterMode, the reference PR's per-rank shape, bf16, cp 4; first / middle
        / last rank vs ulysses'; tests/benchmarks/cp_local_paths.py): kcp 1.01 / 1.50 / 1.01, kcp-kept 0.91 /
        1.32 / 0.91, recompute 1.01 / 2.27 (gdn_cp's hook) or 2.45 (the seam) / 1.01, affine 1.01 / 1.94 /
        1.94, split 2.82; fla's pair on the project's formula 1.53 for a middle rank (KCP: about 1.66).
        """
        if backend.name == DEFAULT_BACKEND and options.overlap:
            return "split"
        checkpoint = cls.checkpoint_for(options, backend)
        if backend.kcp is not None:
            return "kcp" if checkpoint else "kcp-kept"
        return "recompute" if checkpoint else "affine"

    @classmethod
    def checkpoint_for(cls, options: CPOptions, backend: Backend) -> bool:
        """checkpoint_summary as it applies on `backend`: the option, or where it is None (the default) the
        backend's choice, made here only. With a summaries-then-outputs pair (Backend.kcp: gdn_cp, fla) on:
        it keeps what the op alone keeps (ulysses' memory) for a little more work (a middle rank at cp 4 on
        paper: 1.50x ulysses, 1.32x off, which holds 1.4x the memory). Without one off: one call at width
        V + K kept (1.94x) costs less than the hook's summary and two calls at width V (2.27-2.45x), and
        holds about ulysses' memory from 8K tokens per rank."""
        if options.checkpoint_summary is not None:
            return options.checkpoint_summary
        return backend.kcp is not None

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
        ran.note(local_path=path, checkpoint_summary=self.checkpoint_for(self.options, backend))
        if path in ("kcp", "kcp-kept"):
            o, finals = self._kcp_rule(plan, inputs, segments, starts, output_final_state, backend, path, kw)
        elif path in ("recompute", "affine"):
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

    def _exchange(
        self, plan: ShardPlan, maps: list[torch.Tensor | None], inputs: tuple[torch.Tensor, ...], fresh
    ) -> torch.Tensor:
        """H_in [P, B, Hv, K, V] of this rank's pieces, from each piece's packed map [B, Hv, K, V + K] (None
        for the global last piece, whose map reaches no other piece: zeros stand in for it)."""
        (B, _, Hv, V), K = inputs[2].shape, inputs[0].shape[-1]
        skipped = inputs[2].new_zeros(B, Hv, K, V + K, dtype=accumulation_dtype(inputs[2].dtype))
        # A leaf that asks for its gradient, as the maps it stands in for would: the exchange's output then
        # needs one too, so that its backward (a collective) runs on this rank as on the others.
        tracked = (*inputs, fresh) if fresh is not None else inputs
        skipped.requires_grad_(torch.is_grad_enabled() and any(t.requires_grad for t in tracked))
        S, M = unpack_summary(torch.stack([skipped if m is None else m for m in maps]), V)
        return self.begin_entering_states(S, M, plan).wait()

    def _kcp_rule(
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
        """The "kcp" paths (`local_path`): the rank's tokens in one pass of the backend's pair (Backend.kcp:
        gdn_cp.ops.summarise_chunks, gdn_cp.ops.backends.fla_kcp), the summaries of the pieces that feed a
        later one before the exchange, the outputs after it; (o, every segment's final state
        [B, n, Hv, K, V] or None). Where no segment reads H_in (the rank's pieces start documents), the
        outputs come first and the maps from their final states: no summary is taken."""
        first, last = _piece_ends(segments)
        feeds = _feeds(plan)
        if starts is None and not output_final_state and backend.name == DEFAULT_BACKEND:
            # No states per document: each piece one run of chunks, the documents starting inside it resets
            # (no padding); its M is wanted only where no document starts in it. (gdn_cp's chunk grid only.)
            carried = [segments[f].carried for f in first]
            bounds = [0, *itertools.accumulate(plan.local_lengths)]
            resets = {"resets": [s.start for s in segments if not s.carried]}
            wanted = [carried[p] and first[p] == last[p] for p in range(len(first))]
            fresh, ends, piece_of = None, list(range(len(first))), list(range(len(first)))
        else:
            # Every segment in chunks of its own, entering with H_in (it continues a document) or its
            # document's initial state; a piece's map is its last segment's (M = 0 where it is not carried).
            carried = [s.carried for s in segments]
            bounds = [s.start for s in segments] + [sum(plan.local_lengths)]
            resets = {}
            wanted = [carried[j] for j in range(len(segments))]
            fresh, ends, piece_of = _fresh_states(segments, starts), last, [s.piece for s in segments]
        reads = any(carried)
        summarised = [ends[p] for p, f in enumerate(feeds) if f] if reads else []
        rule = backend.kcp_rule()
        ran.op_called(backend.name, rule)
        part = rule(
            *inputs,
            cu_seqlens=bounds,
            carried=carried,
            summarised=summarised,
            maps=[wanted[j] for j in summarised],
            fresh_state=fresh,
            recompute=path == "kcp",
            **resets,
            **kw,
        )
        if not reads:  # the outputs now, at width V; each piece's map [its final state | 0]
            B, _, Hv, V = inputs[2].shape
            none = inputs[2].new_zeros(
                B, len(carried), Hv, inputs[0].shape[-1], V, dtype=part.summaries.dtype
            )
            o, finals = part.with_entering_states(none, output_final_state=True)
            maps = [_fresh_map(finals[:, ends[p]]) if f else None for p, f in enumerate(feeds)]
            entering = self._exchange(plan, maps, inputs, fresh)
            return _reads(o, entering), (finals if output_final_state else None)
        at = iter(part.summaries.unbind(1))
        entering = self._exchange(plan, [next(at) if f else None for f in feeds], inputs, fresh)
        index = torch.tensor(piece_of, dtype=torch.long, device=entering.device)
        return part.with_entering_states(entering.index_select(0, index).transpose(0, 1), output_final_state)

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
        sequence of the backend's op; (o, every segment's final state [B, n, Hv, K, V] or None). The segments
        that start a document run at width V before the exchange; where none reads H_in (or the initial
        states), the outputs depend on it through exact zeros (`_reads`)."""
        _, last = _piece_ends(segments)
        feeds = _feeds(plan)
        carried = [s.carried for s in segments]
        fresh = _fresh_states(segments, starts)
        reading = [j for j, c in enumerate(carried) if c]
        others = [j for j, c in enumerate(carried) if not c]
        # The fresh segments' final states: asked for, or the map of a piece in which a document starts.
        fresh_finals = output_final_state or any(f and not carried[last[p]] for p, f in enumerate(feeds))
        shard = {"bounds": [s.start for s in segments] + [sum(plan.local_lengths)], **kw}

        def piece_states(entering: torch.Tensor, ids: list[int]) -> torch.Tensor:
            """[B, len(ids), Hv, K, V]: H_in of the piece of each segment of ids."""
            index = torch.tensor([segments[j].piece for j in ids], dtype=torch.long, device=entering.device)
            return entering.index_select(0, index).transpose(0, 1)

        if path == "affine":
            affine = affine_rule(
                backend, *inputs, carried=carried, fresh_states=fresh, finals=fresh_finals, **shard
            )
            maps = [affine.summary(last[p]) if f else None for p, f in enumerate(feeds)]
            entering = self._exchange(plan, maps, inputs, fresh)
            o, finals = affine.with_entering_states(piece_states(entering, reading), output_final_state)
            return _reads(o, None if reading else entering, None if others else fresh), finals

        rest = (None, None)
        if others:  # before the exchange: they need nothing of it
            states = None if fresh is None else fresh[:, others]
            rest = segment_outputs(
                backend, *inputs, segments=others, states=states, output_final_state=fresh_finals, **shard
            )
        hooked = [last[p] for p, f in enumerate(feeds) if f and carried[last[p]]]
        pending = segment_summaries(backend, *inputs, segments=hooked, **shard) if hooked else None
        maps = []
        for p, f in enumerate(feeds):
            j = last[p]
            if not f:
                maps.append(None)
            elif carried[j]:
                maps.append(pending.maps[:, hooked.index(j)])
            else:  # a document starts in the piece: its map is [its last segment's final state | 0]
                maps.append(_fresh_map(rest[1][:, others.index(j)]))
        entering = self._exchange(plan, maps, inputs, fresh)
        if pending is not None:
            pending.set_entering(piece_states(entering, hooked))
        read = (None, None)
        if reading:
            read = segment_outputs(
                backend,
                *inputs,
                segments=reading,
                states=piece_states(entering, reading),
                output_final_state=output_final_state,
                **shard,
            )
        o, finals = outputs_in_order(tuple(shard["bounds"]), reading, read, rest, output_final_state)
        return _reads(o, None if reading else entering, None if others else fresh), finals

    def _split_rule(
        self, plan: ShardPlan, inputs: tuple[torch.Tensor, ...], segments: list[LocalSegment], kw: dict
    ) -> torch.Tensor:
        """The split path (overlap) without states in or out: chunks are cut at the pieces' edges only, and
        the documents inside a piece share chunks (resets), with no padding."""
        at = [0, *itertools.accumulate(plan.local_lengths)]
        resets = [s.start for s in segments if not s.carried]
        ran.op_called(DEFAULT_BACKEND, prepare_chunks)  # gdn_cp's stages, not the seam's one call
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
        ran.op_called(DEFAULT_BACKEND, prepare_chunks)
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


def _piece_ends(segments: list[LocalSegment]) -> tuple[list[int], list[int]]:
    """(the first segment, the last segment) of each of this rank's pieces, in the pieces' order."""
    pieces = sorted({s.piece for s in segments})
    first = [min(i for i, s in enumerate(segments) if s.piece == p) for p in pieces]
    last = [max(i for i, s in enumerate(segments) if s.piece == p) for p in pieces]
    return first, last


def _feeds(plan: ShardPlan) -> list[bool]:
    """Per piece of this rank: whether a later piece reads its map (every piece but the global last)."""
    return [p < len(plan.owners) - 1 for p in plan.local_pieces]


def _fresh_map(final: torch.Tensor) -> torch.Tensor:
    """[B, Hv, K, V + K] the packed map [S | 0] of a piece in which a document starts: S its final state."""
    return torch.cat([final, final.new_zeros(*final.shape[:-1], final.shape[-2])], dim=-1)


def _fresh_states(segments: list[LocalSegment], starts: torch.Tensor | None) -> torch.Tensor | None:
    """[B, n, Hv, K, V]: the initial state of each segment's document (what a segment that starts it enters
    with), from the documents' [B, n_docs, Hv, K, V]; None without initial states."""
    if starts is None:
        return None
    return starts.index_select(1, torch.tensor([s.document for s in segments], device=starts.device))


class _Reads(torch.autograd.Function):
    """o unchanged, with more tensors in its graph: their gradients are exact zeros (o does not read them)."""

    @staticmethod
    def forward(ctx, o, *tensors):
        ctx.shapes = [(t.shape, t.dtype, t.device) for t in tensors]
        return o.view_as(o)

    @staticmethod
    def backward(ctx, d_o):
        return d_o, *(torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in ctx.shapes)


def _reads(o: torch.Tensor, *tensors: torch.Tensor | None) -> torch.Tensor:
    """o, made to depend through exact zeros on tensors the rank's segments do not read: the exchange's H_in
    (a collective's backward is a collective, so the exchange's must run here as on the other ranks), the
    documents' initial states (whose gradient is then zeros here, not None: partial on each rank, like a
    parameter's)."""
    tracked = [t for t in tensors if t is not None and t.requires_grad]
    return _Reads.apply(o, *tracked) if tracked else o


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
