"""A run's results arranged like the reference PR's tables (section 3), as records, independent of how they
print (bench.render.tables turns them into cells).

One table per scenario and CP degree; one row per (global sequence length, mode, summary checkpoint, layout,
documents) with a result per pass. Peak allocated is that of the forward+backward pass (training), or of
the forward pass where only forward ran. A table whose rows mix layouts or documents gets a column for
each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from bench.judge.analysis import PASSES, PREFERRED_PASSES
from bench.results.store import CaseResult, MemoryResult, RunResult
from bench.suite.config import PASS_TAGS, Case
from bench.suite.documents import documents_tag
from gdn_cp.distributed import DEFAULT_LAYOUT, mode_order


def mixes_checkpoint(checkpoints: Iterable[bool | None]) -> bool:
    """Whether rows mix summary checkpoint on and off (None, a mode without a summary, does not count):
    then a table gets a column for it."""
    return len({c for c in checkpoints if c is not None}) > 1


@dataclass(kw_only=True, slots=True)
class ReferenceRow:
    seq_len: int
    mode: str
    checkpoint: bool | None
    layout: str = DEFAULT_LAYOUT
    documents: str = "none"
    """The documents' tag (`none`: unpacked)."""
    results: dict[str, CaseResult] = field(default_factory=dict)
    """By pass (forward, forward_backward, prefill), those that ran."""

    @property
    def memory_pass(self) -> str | None:
        """The pass whose peak memory the row shows: the first of PREFERRED_PASSES that ran with a memory."""
        return next(
            (p for p in PREFERRED_PASSES if p in self.results and self.results[p].memory is not None), None
        )

    @property
    def memory(self) -> MemoryResult | None:
        return None if self.memory_pass is None else self.results[self.memory_pass].memory


@dataclass(kw_only=True, slots=True)
class ReferenceTable:
    scenario: str
    cp: int
    rows: list[ReferenceRow] = field(default_factory=list)

    @property
    def shows_checkpoint(self) -> bool:
        """Whether the table mixes summary checkpoint on and off (then it gets a column for it)."""
        return mixes_checkpoint(r.checkpoint for r in self.rows)

    @property
    def shows_layout(self) -> bool:
        """Whether a row is in another layout than contiguous (then the table gets a column for it)."""
        return any(r.layout != DEFAULT_LAYOUT for r in self.rows)

    @property
    def shows_documents(self) -> bool:
        """Whether a row packs documents (then the table gets a column for them)."""
        return any(r.documents != "none" for r in self.rows)

    @property
    def passes(self) -> list[str]:
        """The passes a time column is shown for: those a row ran, in PASSES order."""
        ran = {p for r in self.rows for p in r.results}
        return [p for p in PASSES if p in ran]


def reference_tables(run: RunResult) -> list[ReferenceTable]:
    """Tables of the ok cases of `run`, by scenario (in file order) and cp (ascending)."""
    tables: dict[tuple[str, int], ReferenceTable] = {}
    rows: dict[tuple, ReferenceRow] = {}
    for result in run.cases:
        if result.status != "ok":
            continue
        c = result.case
        table = tables.setdefault((c.scenario, c.cp), ReferenceTable(scenario=c.scenario, cp=c.cp))
        documents = documents_tag(c.documents)
        key = (c.scenario, c.cp, c.seq_len, c.mode, c.checkpoint, c.layout, documents)
        if key not in rows:
            rows[key] = ReferenceRow(
                seq_len=c.seq_len, mode=c.mode, checkpoint=c.checkpoint, layout=c.layout, documents=documents
            )
            table.rows.append(rows[key])
        rows[key].results[c.pass_] = result
    order = list(dict.fromkeys(c.case.scenario for c in run.cases))
    out = sorted(tables.values(), key=lambda t: (order.index(t.scenario), t.cp))
    for t in out:  # stable: layouts and documents keep their order of first appearance
        t.rows.sort(key=lambda r: (r.seq_len, mode_order(r.mode), r.checkpoint is False))
    return out


def not_measured(run: RunResult) -> list[CaseResult]:
    """Failed and skipped cases, in run order."""
    return [c for c in run.cases if c.status != "ok"]


def scenario_order(scenarios: Sequence[str]) -> Callable[[Case], tuple]:
    """The sort key every table's rows follow: the scenarios in `scenarios`' order (a run's file order),
    then cp, sequence length, mode (the registry's order), summary checkpoint on before off, layout,
    documents and pass (PASS_TAGS' order); never the shuffled order the cases ran in."""
    position = {name: i for i, name in enumerate(scenarios)}
    passes = list(PASS_TAGS)

    def key(case: Case) -> tuple:
        return (
            position.get(case.scenario, len(position)),
            case.scenario,
            case.cp,
            case.seq_len,
            mode_order(case.mode),
            case.checkpoint is False,
            case.layout,
            documents_tag(case.documents),
            passes.index(case.pass_) if case.pass_ in passes else len(passes),
        )

    return key
