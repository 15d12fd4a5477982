"""A result file as the report holds it (ReportRun), named as the charts name it; what the report's section
builders take."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.render.charts import sources_for
from bench.render.document import Section
from bench.results.store import RunResult


@dataclass(frozen=True, slots=True)
class ReportRun:
    """One result file of the report."""

    label: str
    """branch@commit (as the charts' legends name it), made unique among the report's files."""
    path: Path
    run: RunResult
    number: int = 0
    """Its position among the report's files, from 1 (the overview's #; other tables refer to it)."""

    @property
    def kind(self) -> str:
        """timing (a `bench run` file), verify (`bench verify` checks) or empty."""
        return "timing" if self.run.cases else ("verify" if self.run.verifications else "empty")


SectionBuilder = Callable[[Sequence[ReportRun]], "Section | list[Section] | None"]


def report_runs(runs: Sequence[RunResult], paths: Sequence[Path]) -> list[ReportRun]:
    sources = sources_for(runs)
    return [
        ReportRun(label=s.label, path=p, run=s.run, number=i)
        for i, (s, p) in enumerate(zip(sources, paths, strict=True), start=1)
    ]
