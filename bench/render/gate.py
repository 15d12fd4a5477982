"""The gate's verdict as tables (bench.judge.gate decides it): timing base vs head with each case's
verdict, and the accuracy checks of `bench verify` on both sides."""

from __future__ import annotations

from collections.abc import Sequence

from bench.errors import first_line
from bench.formats import format_time
from bench.judge.gate import FAILING_VERDICTS, PASSING_VERDICTS, GateResult, check_state
from bench.render.tables import TableData


def _shared_prefix(keys: Sequence[str]) -> str:
    """The leading `part/` segments every key shares (`cpu-smoke/`, `layer/cpu-verify/`): said once in the
    title instead of on every row."""
    parts = [k.split("/")[:-1] for k in keys]
    common: list[str] = []
    for segment in zip(*parts, strict=False):
        if len(set(segment)) != 1:
            break
        common.append(segment[0])
    return "".join(f"{x}/" for x in common)


def timing_table(result: GateResult) -> TableData:
    """case | base | head | head/base | verdict, and the rule under it."""
    c = result.comparison
    prefix = _shared_prefix([case.key for case in c.cases] + [n.key for n in c.head_failures])
    rows = [
        [
            case.key.removeprefix(prefix),
            format_time(case.base),
            format_time(case.head),
            f"{case.ratio:.3f}",
            case.verdict,
        ]
        for case in c.cases
    ]
    rows += [
        [n.key.removeprefix(prefix), n.base_status, n.head_status, "", "failed on head"]
        for n in c.head_failures
    ]
    return TableData(
        title="timing: base vs head" + (f", {prefix.rstrip('/')}" if prefix else ""),
        headers=["case", "base", "head", "head/base", "verdict"],
        rows=rows,
        numeric={1, 2, 3},
        notes=[
            f"verdicts of bench compare (factor x{c.factor:g}, alpha {c.alpha:g}); slower: "
            f"{', '.join(sorted(FAILING_VERDICTS))} or failed on head; passing: "
            f"{', '.join(sorted(PASSING_VERDICTS))}; any other state is no verdict"
        ],
    )


def accuracy_table(result: GateResult) -> TableData:
    """check | base | head (pass, FAIL, not run, skipped, -), and the first failure of each failing check."""
    prefix = _shared_prefix([p.key for p in result.accuracy])
    rows = []
    for p in result.accuracy:
        failure = ""
        if p.head is not None and p.head.status == "ok" and not p.head.passed:
            failures = p.head.failures()
            first = failures[0]
            failure = first if isinstance(first, str) else f"seed {first[0]}: {', '.join(first[1])}"
        elif p.head is not None and p.head.status == "failed":
            failure = first_line(p.head.error)
        rows.append([p.key.removeprefix(prefix), check_state(p.base), check_state(p.head), failure])
    return TableData(
        title="accuracy: bench verify" + (f", {prefix.rstrip('/')}" if prefix else ""),
        headers=["check", "base", "head", "head's failure"],
        rows=rows,
        notes=["only head is judged: inexact = a check above its bar, or a case that did not run"],
    )
