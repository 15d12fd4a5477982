"""Loaded at start-up by every process of a test run that puts this folder on PYTHONPATH: replaces a
backend's op (BENCH_TEST_OP) with a broken one, so that the correctness gate (bench.measure.gate) is seen to
catch each kind of wrong program, or with one whose first call costs what a kernel's first use does. Kinds:

- nan: backend gdn_cp returns NaN outputs (a bad build), its op still gdn_cp's own by name;
- scaled: backend gdn_cp returns its outputs x 1.5 (finite, and wrong everywhere);
- cp_only: x 1.5 only under CP on more than 16 tokens per rank (passes the small check, not its cp 1 twin);
- swapped: backend transformers runs an op of FLA's module (what transformers' rebinding does);
- first_use: backend gdn_cp's first call in a process allocates 64 MiB for a while and sleeps 0.5 s, as a
  kernel's compile and autotuning do (its results are right);
- flaky: backend gdn_cp raises on 1 call in BENCH_TEST_FLAKY_EVERY (default 10), drawn from a generator
  seeded by BENCH_TEST_FLAKY_SEED and the process id (the soak, tests/bench/soak.py).

Independently, BENCH_TEST_READ_ONLY=<flag file>:<folder> makes the folder read-only while the flag file
exists, as a full or remounted disk would be: every file os.open would create in it is refused with EROFS
(the call tempfile.mkstemp, and so bench.results.store, makes; chmod does not stop root).
"""

import os

_read_only = os.environ.get("BENCH_TEST_READ_ONLY")
if _read_only:
    import errno as _errno

    _flag, _, _folder = _read_only.partition(":")
    _real_open = os.open

    def _refusing(path, flags, *args, **kwargs):
        if flags & os.O_CREAT and os.path.exists(_flag) and os.path.dirname(os.path.abspath(path)) == _folder:
            raise OSError(_errno.EROFS, os.strerror(_errno.EROFS), str(path))
        return _real_open(path, flags, *args, **kwargs)

    os.open = _refusing

_kind = os.environ.get("BENCH_TEST_OP")
if _kind:
    import random as _random
    import time as _time

    import torch as _torch
    import torch.distributed as _dist

    from gdn_cp.ops.backends import registry as _registry
    from gdn_cp.ops.chunk import chunk_gated_delta_rule as _real
    from gdn_cp.ops.chunk import summarise_chunks as _real_pair

    _first = [True]
    _draws: dict = {}  # one generator per process: ranks fork from a server that loaded this module

    def _before() -> None:
        """What a call does before computing: a first use's cost, or a flaky failure."""
        if _kind == "first_use" and _first[0]:
            _first[0] = False
            workspace = _torch.empty(64 * 2**20, dtype=_torch.uint8).fill_(1)  # autotune's buffers
            _time.sleep(0.5)
            del workspace
        if _kind == "flaky":
            seed = f"{os.environ.get('BENCH_TEST_FLAKY_SEED', '0')}:{os.getpid()}"
            every = int(os.environ.get("BENCH_TEST_FLAKY_EVERY", "10"))
            if _draws.setdefault(os.getpid(), _random.Random(seed)).randrange(every) == 0:
                raise RuntimeError("the flaky test op failed on purpose")

    def _after(o, tokens: int):
        """The outputs as the broken op returns them."""
        if _kind == "nan":
            return o * float("nan")
        under_cp = _dist.is_initialized() and _dist.get_world_size() > 1
        if _kind == "scaled" or (_kind == "cp_only" and under_cp and tokens > 16):
            return o * 1.5
        return o

    def _broken(q, k, v, g, beta, **kw):
        _before()
        o, final = _real(q, k, v, g, beta, **kw)
        return _after(o, q.shape[1]), final

    class _BrokenPair:
        """gdn_cp's summaries-then-outputs pair (Backend.kcp, what the summary modes call), its outputs
        broken as _broken's."""

        def __init__(self, pair, tokens: int) -> None:
            self._pair, self._tokens = pair, tokens
            self.summaries = pair.summaries

        def with_entering_states(self, entering, output_final_state=False):
            o, final = self._pair.with_entering_states(entering, output_final_state)
            return _after(o, self._tokens), final

    def _broken_pair(q, k, v, g, beta, **kw):
        _before()
        return _BrokenPair(_real_pair(q, k, v, g, beta, **kw), q.shape[1])

    if _kind == "swapped":
        _broken.__module__ = "fla.ops.gated_delta_rule.chunk"
        _broken.__qualname__ = "chunk_gated_delta_rule"
        _registry._LOADED["transformers"] = _broken
    else:
        # the names say gdn_cp's own: only the results can tell
        _broken.__module__, _broken_pair.__module__ = _real.__module__, _real_pair.__module__
        _broken_pair.__qualname__ = _real_pair.__qualname__
        _registry._LOADED["gdn_cp"] = _broken
        _registry._LOADED_KCP["gdn_cp"] = _broken_pair
