"""Loaded at start-up by every rank of a test job that puts this folder on PYTHONPATH: makes one case fail
on one rank, outside any collective, to test that the case fails alone (BENCH_TEST_FAIL="<case id>@<rank>").
"""

import os

_spec = os.environ.get("BENCH_TEST_FAIL")
if _spec:
    import bench.measure.rank as _rank

    _case_id, _, _bad_rank = _spec.partition("@")
    _real = _rank.measure_on_rank

    def measure_on_rank(case, device_kind, group=None):
        import torch.distributed as dist

        case_id = getattr(case, "case", case).case_id  # a CaseRound, or a Case
        if case_id == _case_id and dist.get_rank() == int(_bad_rank):
            raise ValueError(f"{case_id} broke on purpose on rank {_bad_rank}")
        return _real(case, device_kind, group=group)

    _rank.measure_on_rank = measure_on_rank
