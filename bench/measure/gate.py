"""The correctness gate of every timed case: what ran is what was asked, and it computes the right thing.

A benchmark never reports a figure for a program other than the one it names, nor a speedup of a wrong
output (FLA's benchmarks/ops/verify.py holds itself to the same). So the first pass of every case, untimed,
is checked before any timed pass runs, and a case that fails is recorded as failed with one line
(`CaseCheckError`), never timed, compared or drawn:

- what ran (`ran_problems`): the ops the backend seam called, the mode, its options as applied and the local
  path, recorded by gdn_cp itself (gdn_cp.ops.ran), against the case: another backend's op behind the name
  (transformers rebinding its fallback to FLA's kernel), another mode or option;
- finite (`finite_problems`, every round): the outputs, the input gradient (backward passes) and the final
  states (prefill) of every rank;
- right (the case's first round in a run): on a small input cut as the case's (a chunk a piece, a document
  boundary inside when the case packs documents), the case's own CP layer against the single-device layer
  in fp64 with the same weights on the token-by-token reference op (`small_check`; the recurrent backend,
  which shares nothing with the case's), within the precision's bar
  (`gate_bar`); and a fingerprint of the real outputs (`fingerprint`): a few random projections of o, of
  the input gradient and of the final states, summed over the ranks, which the sweep compares with the
  same case at cp 1 where the run has one (bench.launch.sweep) and `bench compare` between two refs
  (bench.judge.comparison).

The bars are for gross errors (a wrong op, CP broken outright, garbage from a bad build): each sits 10x or
more above what a correct case shows in its precision (fp32 CP vs one device: rel-L2 ~5e-7; bf16 ~2-4e-3,
shared/design.md section 5). Subtler breakage is `bench verify`'s to find, with its mutants.

Fingerprints: a tensor seen as rows [N, D] (tokens x hidden, or states' rows x V) maps to R_N^T X R_D, with
R_N [N, 8] and R_D [D, 4] standard normal, drawn from fixed seeds for the global row index, so that every
rank's rows add up to the whole tensor's 32 numbers whatever the cp and layout. For standard normal R,
E|R_N^T X R_D|^2 = 32 |X|^2 entry by entry on average, so the relative L2 difference of two fingerprints
estimates the relative L2 difference of the tensors (32 numbers: within about 2x).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from bench.suite.config import Case
from gdn_cp import GatedDeltaNet
from gdn_cp.distributed import Platform, gather_sequence, shard_sequence
from gdn_cp.distributed.collectives import group_rank_size
from gdn_cp.dtypes import accumulation_dtype, dtype_name
from gdn_cp.ops.backends import get_backend
from gdn_cp.ops.ran import Ran, Recording

GATE_REL_L2: dict[str, float] = {"fp64": 1e-8, "fp32": 1e-3, "tf32": 2e-2, "fp16": 2e-2, "bf16": 5e-2}
"""The gate's bar on relative L2 error, by the precision a case computes in (`gate_bar`)."""
SKETCH_ROWS, SKETCH_COLUMNS = 8, 4
"""A fingerprint's projections: 8 x 4 = 32 numbers per tensor."""
SKETCH_SEED = 0x5EED
"""Seeds of the projections (fixed: fingerprints of two runs, or two refs, compare)."""
REFERENCE_BACKEND = "recurrent"
"""The op of the small check's reference layer (gdn_cp.ops.recurrent_gated_delta_rule)."""
SMALL_PIECE_CHUNKS = 1
"""The small check's tokens per piece, in chunks: one chunk a piece, cp pieces (zigzag: 2 cp)."""


class CaseCheckError(RuntimeError):
    """The case failed the gate: one line naming what was asked and what ran, or what differs."""


def gate_bar(case: Case) -> float:
    """The relative L2 bar of `case`: its dtype's, tf32 for fp32 matmuls on the matrix units."""
    name = case.dtype
    if name == "fp32" and case.precision == "tf32":
        name = "tf32"
    return GATE_REL_L2[name]


# -- what ran -------------------------------------------------------------------------------------------


def ran_problems(case: Case, recording: Recording | None, device_type: str) -> list[str]:
    """What of the recorded run differs from the case (each one line); [] when it matches, or when the
    library recorded nothing (an older gdn_cp: "ran: not recorded")."""
    if recording is None or not recording.calls:
        return []
    problems = []
    for op in recording.all_ops():
        if op.backend != case.backend:
            problems.append(f"asked backend {case.backend}, ran backend {op.backend} ({op.op})")
            continue
        swapped = get_backend(op.backend).ran_as(op.op)
        if swapped is not None:
            problems.append(swapped)
    if not recording.all_ops():
        problems.append(f"asked backend {case.backend}, but no op was called through the backend seam")
    for call in recording.calls:
        problems += _call_problems(case, call, device_type)
    return list(dict.fromkeys(problems))


def _call_problems(case: Case, call: Ran, device_type: str) -> list[str]:
    options = case.options
    asked: dict[str, object] = {
        "mode": options.mode,
        "layout": options.layout,
        "overlap": options.overlap,
        "chunk_size": case.layer.chunk_size,
        "dtype": case.dtype,
        # the CPU has no TF32 mode: there both precisions are fp32 (gdn_cp.dtypes.Precision)
        "precision": case.precision if device_type != "cpu" else "fp32",
    }
    if case.checkpoint is not None:
        asked["checkpoint_summary"] = options.checkpoint_summary
    return [
        f"asked {name} {value}, ran {name} {getattr(call, name)}"
        for name, value in asked.items()
        if getattr(call, name) is not None and getattr(call, name) != value
    ]


# -- finite ---------------------------------------------------------------------------------------------


def finite_problems(tensors: dict[str, torch.Tensor | None], group: ProcessGroup | None) -> list[str]:
    """One line per named tensor with a non-finite element on any rank of `group`, naming the ranks (every
    rank returns the same)."""
    names = list(tensors)
    bad = torch.tensor(
        [0 if t is None else int((~torch.isfinite(t.detach())).sum().item()) for t in tensors.values()],
        dtype=torch.long,
    )
    _, size = group_rank_size(group)
    everyone = [torch.zeros_like(bad) for _ in range(size)]
    if size > 1:
        dist.all_gather(everyone, bad, group=group)
    else:
        everyone = [bad]
    out = []
    for i, name in enumerate(names):
        ranks = [r for r in range(size) if everyone[r][i] > 0]
        if ranks:
            count = sum(int(everyone[r][i]) for r in ranks)
            out.append(
                f"{name} is not finite on rank{'s' if len(ranks) > 1 else ''} "
                f"{', '.join(map(str, ranks))} ({count} elements)"
            )
    return out


# -- fingerprints ---------------------------------------------------------------------------------------


def _projection(rows: Sequence[int] | torch.Tensor, count: int, stream: int) -> torch.Tensor:
    """[len(rows), count] standard normal, one seeded draw per global row index (fp64, on the CPU)."""
    index = torch.as_tensor(rows, dtype=torch.long)
    if index.numel() == 0:
        return torch.zeros(0, count, dtype=torch.float64)
    top = int(index.max()) + 1
    generator = torch.Generator().manual_seed(SKETCH_SEED * 7919 + stream)
    return torch.randn(top, count, generator=generator, dtype=torch.float64)[index]


def sketch(x: torch.Tensor, rows: torch.Tensor, stream: int) -> torch.Tensor:
    """This rank's part of the fingerprint of a tensor seen as rows [N, D] (x), whose global row indices are
    `rows` [N]: R_rows^T x R_D, [SKETCH_ROWS * SKETCH_COLUMNS] in x's accumulation dtype on x's device."""
    dtype = accumulation_dtype(x.dtype)
    x = x.detach().reshape(rows.numel(), -1).to(dtype)
    r_rows = _projection(rows, SKETCH_ROWS, stream).to(x.device, dtype)
    r_cols = _projection(range(x.shape[1]), SKETCH_COLUMNS, stream + 1).to(x.device, dtype)
    return (r_rows.T @ x @ r_cols).flatten()


def token_rows(positions: Sequence[tuple[int, int]], batch: int, seq_len: int) -> torch.Tensor:
    """Global row indices b * T + t of a shard [B, L, ...] holding positions `positions` (in order)."""
    local = torch.cat([torch.arange(lo, hi) for lo, hi in positions])
    return (torch.arange(batch).unsqueeze(1) * seq_len + local.unsqueeze(0)).flatten()


@dataclass(kw_only=True, slots=True)
class Fingerprints:
    """The fingerprints of one pass's results (module docstring), the same on every rank."""

    o: list[float] | None = None
    """The layer's output [B, T, hidden]."""
    input_grad: list[float] | None = None
    """The input's gradient [B, T, hidden] (backward passes)."""
    state: list[float] | None = None
    """The final recurrent states [N, Hv, K, V] (prefill)."""


def summed(parts: dict[str, torch.Tensor], group: ProcessGroup | None) -> Fingerprints:
    """Sum every rank's sketches over `group` (one all-reduce) into Fingerprints."""
    if not parts:
        return Fingerprints()
    names = list(parts)
    dtype = torch.float64 if any(parts[n].dtype == torch.float64 for n in names) else torch.float32
    flat = torch.stack([parts[n].to(dtype) for n in names])
    if group_rank_size(group)[1] > 1:
        dist.all_reduce(flat, group=group)
    return Fingerprints(**{n: flat[i].cpu().tolist() for i, n in enumerate(names)})


def fingerprint_difference(a: Fingerprints, b: Fingerprints) -> tuple[str, float] | None:
    """The tensor whose fingerprints differ most, and by how much (relative L2, against b's); None when no
    tensor has both."""
    worst: tuple[str, float] | None = None
    for f in dataclasses.fields(Fingerprints):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if x is None or y is None or len(x) != len(y):
            continue
        norm = math.sqrt(sum(v * v for v in y))
        diff = math.sqrt(sum((u - v) ** 2 for u, v in zip(x, y, strict=True)))
        rel = diff / norm if norm > 0 else (0.0 if diff == 0 else math.inf)
        if not math.isfinite(rel):
            rel = math.inf
        if worst is None or rel > worst[1]:
            worst = (f.name, rel)
    return worst


# -- the small check ------------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class SmallCheck:
    """The case's CP layer on a small input against the fp64 single-device layer (module docstring)."""

    seq_len: int
    """Tokens of the small input."""
    rel_l2: dict[str, float] = field(default_factory=dict)
    """Relative L2 error per tensor (o, input_grad, state)."""

    def worst(self) -> tuple[str, float]:
        return max(self.rel_l2.items(), key=lambda kv: kv[1]) if self.rel_l2 else ("o", 0.0)


@dataclass(kw_only=True, slots=True)
class CaseCheck:
    """The gate's reference checks of a case's first round in a run (module docstring)."""

    bar: float
    """The relative L2 bar they were held to (`gate_bar`)."""
    fingerprints: Fingerprints
    """Of the real pass's results."""
    small: SmallCheck | None = None
    """The small check (None: not run)."""
    reference: str | None = None
    """The id of the cp 1 case of the same run whose fingerprints these were compared with (the sweep)."""
    reference_rel_l2: float | None = None
    """How far they were from it, on the tensor that differed most."""


def small_cut(case: Case) -> tuple[int, list[int] | None]:
    """(tokens, document boundaries or None) of the small check's input: one chunk a piece, and where the
    case packs documents, a boundary inside a piece."""
    pieces = case.cp * (2 if case.layout == "zigzag" else 1)
    tokens = pieces * case.layer.chunk_size * SMALL_PIECE_CHUNKS
    documents = None if case.documents is None else [0, tokens // 3 + 1, tokens]
    return tokens, documents


def small_check(
    case: Case, layer: GatedDeltaNet, platform: Platform, group: ProcessGroup | None, device: torch.device
) -> SmallCheck:
    """Run the case's CP `layer` (its pass: forward, forward and backward, or prefill) on a small input and
    compare it on rank 0 with the single-device layer in fp64 holding the same weights (on the CPU); every
    rank returns rank 0's SmallCheck. Leaves the layer's gradients cleared."""
    rank, _ = group_rank_size(group)
    tokens, documents = small_cut(case)
    generator = torch.Generator().manual_seed(case.seed * 31 + 7)
    shape = (case.batch, tokens, case.layer.hidden_size)
    x = torch.randn(*shape, generator=generator).to(case.layer.dtype)
    grad = torch.randn(*shape, generator=generator).to(case.layer.dtype)
    cu = None if documents is None else torch.tensor(documents, dtype=torch.long)
    local = shard_sequence(x, group, layout=case.layout).to(device).requires_grad_(case.pass_ != "prefill")
    found: dict[str, torch.Tensor] = {}
    if case.pass_ == "prefill":
        with torch.inference_mode():
            y, state = layer.prefill(local, cu_seqlens=cu)
            found["state"] = state.recurrent_state.detach().cpu()
    else:
        y = layer(local, cu_seqlens=cu)
        if case.pass_ == "forward_backward":
            y.backward(shard_sequence(grad, group, layout=case.layout).to(device))
            found["input_grad"] = gather_sequence(local.grad.detach(), group, layout=case.layout).cpu()
    found["o"] = gather_sequence(y.detach(), group, layout=case.layout).cpu()
    layer.zero_grad(set_to_none=True)
    result = [None]
    if rank == 0:
        result[0] = _against_reference(case, layer, x, grad, cu, found, tokens)
    if group_rank_size(group)[1] > 1:
        dist.broadcast_object_list(result, group_src=0, group=group)
    return result[0]


def _against_reference(
    case: Case,
    layer: GatedDeltaNet,
    x: torch.Tensor,
    grad: torch.Tensor,
    cu: torch.Tensor | None,
    found: dict[str, torch.Tensor],
    tokens: int,
) -> SmallCheck:
    """The fp64 single-device layer with `layer`'s weights on the same input, on the token-by-token
    reference op (backend recurrent: no chunking, no kernel, nothing the case's backend shares)."""
    config = dataclasses.replace(case.layer, dtype=torch.float64, backend=REFERENCE_BACKEND)
    reference = GatedDeltaNet(config)
    weights = {k: v.detach().to("cpu", torch.float64) for k, v in layer.state_dict().items()}
    reference.load_state_dict(weights, strict=True)
    x64 = x.to(torch.float64).requires_grad_(case.pass_ == "forward_backward")
    expected: dict[str, torch.Tensor] = {}
    if case.pass_ == "prefill":
        with torch.no_grad():
            y, state = reference.prefill(x64, cu_seqlens=cu)
        expected["state"] = state.recurrent_state
    else:
        y = reference(x64, cu_seqlens=cu)
        if case.pass_ == "forward_backward":
            y.backward(grad.to(torch.float64))
            expected["input_grad"] = x64.grad
    expected["o"] = y.detach()
    rel = {}
    for name, want in expected.items():
        got = found[name].to(torch.float64)
        norm = want.norm().item()
        rel[name] = (got - want).norm().item() / norm if norm > 0 else float((got - want).norm().item() > 0)
        if not math.isfinite(rel[name]):
            rel[name] = math.inf
    return SmallCheck(seq_len=tokens, rel_l2=rel)


def describe_small(check: SmallCheck, bar: float, case: Case) -> str | None:
    """The gate's line for a small check above the bar, else None."""
    name, worst = check.worst()
    if worst <= bar:
        return None
    what = {"o": "o", "input_grad": "the input gradient", "state": "the final state"}[name]
    return (
        f"outputs differ from the reference: rel-L2 {worst:.1e} on {what} (bar {bar:.0e} for "
        f"{dtype_name(case.layer.dtype)}{'/tf32' if case.precision == 'tf32' else ''}; the case's CP layer "
        f"on {check.seq_len} tokens against the fp64 single-device layer)"
    )
