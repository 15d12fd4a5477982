"""bench.formats, the one way every view prints a case, sits on the ground floor (issue 47): it reads what a
case gives through Protocols of its own, each standing for the record its docstring names on a floor
above, so launch's status lines and render's tables take it without an upward import."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path
from typing import Protocol

import pytest

from bench import formats
from bench.measure.contention import Contention
from bench.results.store import load_result
from tests.bench.multiround import saved_in_rounds

FIXTURES = Path(__file__).parent / "fixtures"
PROTOCOLS = [
    obj
    for obj in vars(formats).values()
    if inspect.isclass(obj) and Protocol in obj.__mro__[1:] and obj.__module__ == formats.__name__
]
RECORD = re.compile(r"\((bench\.[\w.]+)\)")


def _record(protocol: type) -> type:
    """The record a Protocol stands for: the dotted name in its docstring, `(bench.pkg.module.Class)`."""
    found = RECORD.search(protocol.__doc__ or "")
    assert found, f"{protocol.__name__}'s docstring names no record"
    module, _, name = found.group(1).rpartition(".")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.__name__)
def test_each_protocol_asks_only_what_its_record_has(protocol: type) -> None:
    members = {n for n in vars(protocol) if not n.startswith("_")}
    assert members, protocol
    record = _record(protocol)
    assert not sorted(members - set(dir(record))), f"{record.__name__} lacks these"


def test_a_stored_run_is_what_the_formatter_reads(tmp_path: Path) -> None:
    run = load_result(saved_in_rounds(FIXTURES / "scaling.json", tmp_path / "scaling.json"))
    assert isinstance(run, formats.MeasuredRun)
    ok = [c for c in run.cases if c.status == "ok"]
    assert ok
    for result in ok:
        assert isinstance(result, formats.MeasuredCase) and isinstance(result.case, formats.PlannedCase)
        assert isinstance(result.estimate, formats.Interval) and isinstance(result.timing, formats.Repeats)
        assert isinstance(result.memory, formats.PeakMemory)
        assert result.throughput is None or isinstance(result.throughput, formats.Throughput)
    assert isinstance(Contention(0.5, 0.0, 1.0, 2.0, True), formats.Sharing)
