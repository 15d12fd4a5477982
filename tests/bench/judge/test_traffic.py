"""bench.judge.traffic: the bytes a case moves are the communication model's, for its busiest rank."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from bench.judge.traffic import bytes_moved
from bench.results.store import load_result
from gdn_cp.distributed.comm_model import layer_communication

FIXTURES = Path(__file__).parents[1] / "fixtures"


def _total(volume: dict) -> int:
    return sum(v["sent"] + v["received"] for v in volume.values())


def test_bytes_moved_is_the_busiest_ranks_sent_plus_received():
    run = load_result(FIXTURES / "scaling.json")
    for result in run.cases:
        c = result.case
        per_rank = [
            _total(
                layer_communication(
                    c.mode,
                    c.layer,
                    cp=c.cp,
                    rank=r,
                    seq_len=c.seq_len,
                    batch=c.batch,
                    backward=c.pass_ == "forward_backward",
                    layout=c.layout,
                )
            )
            for r in range(c.cp)
        ]
        assert bytes_moved(c) == max(per_rank)
        assert (bytes_moved(c) == 0) == (c.cp == 1)


def test_backward_moves_more_and_ulysses_moves_the_sequence():
    case = next(r.case for r in load_result(FIXTURES / "scaling.json").cases if r.case.cp == 2)
    forward = dataclasses.replace(case, pass_="forward")
    both = dataclasses.replace(case, pass_="forward_backward")
    assert bytes_moved(both) > bytes_moved(forward) > 0
    ulysses, p2p = (dataclasses.replace(both, mode=m, seq_len=128) for m in ("ulysses", "p2p"))
    at = {n: bytes_moved(dataclasses.replace(ulysses, seq_len=n)) for n in (128, 256, 512)}
    # all-to-all of the activations: grows with T (plus a few bytes that do not: the length exchange)
    assert at[512] - at[256] == 2 * (at[256] - at[128]) > 0
    assert bytes_moved(dataclasses.replace(p2p, seq_len=256)) == bytes_moved(p2p)  # a state: independent of T
