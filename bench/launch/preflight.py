"""The checks of a command's cases against this host, before any rank starts: shapes the mode cannot split
(gdn_cp.distributed.check_cp_shapes, in the case's layout), document boundaries the layer would refuse
(gdn_cp.ops.document_bounds on the case's cu_seqlens), fp64 on an NPU (no fp64 matmul on Ascend), more
local ranks than the host can run, and a rough memory estimate above what is available
(bench.launch.estimate; when chunk_size exceeds the shard, it is named as the cause: the chunked op pads the
shard to whole chunks, each with C x C matrices), a backend that cannot run the case here (device, dtype,
chunk size, head dim, its package missing: found on the path, never imported, since this process holds no
device context) or, for a command that times, would run interpreted (for another: in an interpreter its
kernels cannot run in). Each error names the scenario file, line and fix, through the Locator the scenario
was read with (the file is not read again)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from bench.launch.estimate import available_memory, estimate_peak_bytes, human_bytes
from bench.suite.config import Case, Scenario
from bench.suite.loader import Locator
from gdn_cp.distributed import Platform, check_cp_shapes
from gdn_cp.ops import DEFAULT_BACKEND, check_packed_batch, document_bounds, get_backend


def check_cases(
    locate: Locator,
    scenario: Scenario,
    cases: Iterable[Case],
    *,
    platform: Platform | None,
    ranks_on_host: Callable[[Case], int],
    max_local_ranks: int | None,
    local_rank: int | None = None,
    timed: bool = True,
) -> None:
    """Refuse cases that cannot run here (see the module docstring); the memory check is skipped when
    `platform` is None or cannot tell what is available, the rank check when `max_local_ranks` is None.
    `local_rank`: this process is that rank of a torchrun job (its own device is the one checked); `timed`:
    the command times the cases (an interpreted kernel is refused then)."""
    length_key = "local_seq_len" if any(s.local_seq_len for s in scenario.effective_sweeps()) else "seq_len"
    cases = list(cases)
    # Every case's dtype first: fp64 on an NPU is refused before the memory is read.
    for case in cases:
        _check_dtype(locate, case, platform)
    memory = available_memory(platform, local_rank) if platform is not None else None
    for case in cases:
        # what the host can run first: a fix for the shapes (another cp, another mode) must be runnable here
        _check_ranks(locate, case, max_local_ranks)
        _check_shapes(locate, case, length_key)
        _check_documents(locate, case)
        _check_backend(locate, case, platform, timed)
        if memory is not None:
            _check_memory(locate, case, memory.for_ranks(ranks_on_host(case)), length_key)


def _check_dtype(locate: Locator, case: Case, platform: Platform | None) -> None:
    """Nothing; a ConfigError for fp64 on an NPU (Ascend has no fp64 matrix units)."""
    if platform is not None and platform.device_type == "npu" and case.layer.dtype == torch.float64:
        raise locate.error(
            ("dtype",),
            "dtype",
            f"case {case.case_id}: fp64 on npu: Ascend NPUs have no fp64 matrix units; use fp32 or bf16 "
            "there (bench verify's metrics are computed in fp64 on the host), or fp64 with --device cpu",
        )


def _check_shapes(locate: Locator, case: Case, length_key: str) -> None:
    """Nothing; a ConfigError for heads the mode cannot split over cp, then for a sequence it cannot split."""
    config = case.layer
    try:
        check_cp_shapes(case.mode, config, case.cp)
    except ValueError as exc:
        raise locate.error(("cp",), "cp", f"case {case.case_id}: {exc}") from None
    try:
        check_cp_shapes(case.mode, config, case.cp, case.seq_len, case.layout)
    except ValueError as exc:  # zigzag's message names its pieces and the contiguous alternative
        raise locate.error((length_key,), length_key, f"case {case.case_id}: {exc}") from None


def _check_ranks(locate: Locator, case: Case, max_local_ranks: int | None) -> None:
    """Nothing; a ConfigError for more ranks on this host than `max_local_ranks` (None: no limit)."""
    if max_local_ranks is not None and case.cp > max_local_ranks:
        raise locate.error(
            ("cp",),
            "cp",
            f"case {case.case_id} needs {case.cp} ranks on this host, more than the {max_local_ranks} it "
            f"can run usefully; use a cp of at most {max_local_ranks}, or launch across hosts with torchrun "
            "(docs/clusters.md)",
        )


def _check_memory(locate: Locator, case: Case, share: tuple[int | None, int], length_key: str) -> None:
    """Nothing; a ConfigError when the rough peak estimate exceeds `share` (AvailableMemory.for_ranks: bytes
    available, None: unknown, and the ranks drawing on them), naming chunk_size when it pads the shard."""
    available, ranks = share
    if available is None:
        return
    per_rank = estimate_peak_bytes(case)
    if per_rank * ranks <= available:
        return
    host = f" x {ranks} ranks on this host = {human_bytes(per_rank * ranks)}" if ranks > 1 else ""
    needs = (
        f"case {case.case_id} needs about {human_bytes(per_rank)} per rank by a rough estimate "
        f"(bench/launch/estimate.py){host}, but {human_bytes(available)} is available"
    )
    chunk = case.layer.chunk_size
    if chunk > case.local_seq_len:
        raise locate.error(
            ("chunk_size",),
            "chunk_size",
            f"{needs}: chunk_size {chunk} pads each rank's {case.local_seq_len} "
            f"tokens to a whole chunk, with {chunk} x {chunk} matrices per "
            f"head; use a chunk_size of at most {case.local_seq_len}",
        )
    raise locate.error(
        (length_key,),
        length_key,
        f"{needs}; use a shorter {length_key}, a smaller batch or a larger cp, or leave the case "
        "out with --filter",
    )


def _check_backend(locate: Locator, case: Case, platform: Platform | None, timed: bool) -> None:
    """The case's backend supports it (gdn_cp.ops.backends.Backend.check), and where it runs here (a
    platform given; `bench list` gives none) its modules are installed and, for a timed command, its kernels
    would not run in an interpreter. The modules are found, never imported (Backend.unavailable): importing
    a kernel package may query the device, and this process (the launcher) must hold no device context;
    the ranks import it."""
    backend = get_backend(case.backend)
    config = case.layer
    try:
        backend.check(
            device=None if platform is None else platform.device_type,
            dtype=config.dtype,
            chunk_size=config.chunk_size,
            head_k_dim=config.head_k_dim,
        )
        missing = None if platform is None else backend.unavailable()
        if missing is not None:
            raise ImportError(missing)
    except (ValueError, ImportError) as exc:
        raise locate.error(
            ("backend",),
            "backend",
            f"case {case.case_id}: {exc}; or leave its cases out with --filter backend={DEFAULT_BACKEND}",
        ) from None
    if platform is not None and timed and backend.interpreted():
        raise locate.error(
            ("backend",),
            "backend",
            f"case {case.case_id}: backend {backend.name!r} would run in Triton's interpreter here "
            "(TRITON_INTERPRET=1): its times would measure the interpreter, not the kernels; unset "
            "TRITON_INTERPRET on a GPU, or check the backend's numbers with `bench verify`",
        )
    # an interpreter its kernels cannot run in (a Triton without what gdn_cp patches): one line here, not
    # InterpreterSupportError's traceback from every rank
    problem = backend.interpreter_problem() if platform is not None and backend.interpreted() else None
    if problem is not None:
        raise locate.error(
            ("backend",),
            "backend",
            f"case {case.case_id}: {problem}; or leave its cases out with --filter backend={DEFAULT_BACKEND}",
        )


def _check_documents(locate: Locator, case: Case) -> None:
    """The layer's own checks of the case's cu_seqlens (the config has checked count and batch; this holds
    the boundaries it derived to the rules the ranks apply)."""
    bounds = case.cu_seqlens()
    if bounds is None:
        return
    try:
        check_packed_batch(case.batch)
    except ValueError as exc:
        raise locate.error(("batch",), "batch", f"case {case.case_id}: {exc}") from None
    try:
        document_bounds(bounds, case.seq_len)
    except ValueError as exc:
        raise locate.error(("documents",), "documents", f"case {case.case_id}: {exc}") from None
