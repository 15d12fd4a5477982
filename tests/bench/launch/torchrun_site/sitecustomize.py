"""Loaded at start-up by every rank of tests/bench/launch/test_torchrun_faults.py's torchrun job: one case
raises on one rank, outside any collective (BENCH_TEST_FAIL="<case id>@<rank>"), its message carrying the
TORCH_NCCL_ASYNC_ERROR_HANDLING this rank runs with, so that the test sees the environment torchrun set."""

import os

_spec = os.environ.get("BENCH_TEST_FAIL")
if _spec:
    import bench.measure.rank as _rank

    _case_id, _, _bad_rank = _spec.partition("@")
    _real = _rank.measure_on_rank

    def measure_on_rank(case, device_kind, group=None):
        import torch.distributed as dist

        case_id = getattr(case, "case", case).case_id  # a Case, or a CaseRound holding one
        if case_id == _case_id and dist.get_rank() == int(_bad_rank):
            handling = os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "unset")
            raise ValueError(f"broke on purpose (TORCH_NCCL_ASYNC_ERROR_HANDLING={handling})")
        return _real(case, device_kind, group=group)

    _rank.measure_on_rank = measure_on_rank
