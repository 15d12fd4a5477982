"""A comparison of two runs (bench.judge.comparison) as `bench compare` prints it: a table for the terminal
(`render_table`), a PR comment (`render_markdown`) and data for CI bots and dashboards (`comparison_json`),
each with the same cells, notes (why cases were not compared) and the rule the verdicts follow."""

from __future__ import annotations

import dataclasses
from typing import Any, get_args

from rich.console import Console
from rich.markup import escape

from bench.console import print_warning
from bench.formats import format_time
from bench.judge.analysis import source_label
from bench.judge.comparison import JUDGED_VERDICTS, CaseComparison, Comparison, Verdict, not_comparable_note
from bench.launch.gitrefs import RefSide, Side
from bench.render.document import Table as DocTable
from bench.render.document import markdown_table, markdown_text
from bench.render.tables import TableData, print_tables
from bench.results.export import measure_cells
from bench.results.store import RunResult

VERDICT_STYLES = {
    "better": "green",
    "worse": "bold red",
    "~": "dim",
    "too noisy": "yellow",
    "contended": "yellow",
    "not comparable": "yellow",
}


def side_label(side: Side, run: RunResult) -> str:
    """A side as the title names it: a ref's label, or a file's name and where it was measured."""
    if isinstance(side, RefSide):
        return side.label
    return f"{side.path.name} ({source_label(run)})"


def _case_name(c: CaseComparison | str, single_scenario: bool) -> str:
    key = c if isinstance(c, str) else c.key
    return key.split("/", 1)[1] if single_scenario else key


def _ratio(c: CaseComparison) -> str:
    """`1.032 [0.981, 1.086]`: head/base and its interval."""
    if c.low is None or c.high is None:
        return f"{c.ratio:.3f}"
    return f"{c.ratio:.3f} [{c.low:.3f}, {c.high:.3f}]"


def _verdict(c: CaseComparison) -> str:
    text = c.verdict + (" (forced)" if c.forced else "")
    if c.verdict == "too noisy" and c.detectable is None:
        rounds = min(c.rounds)
        return f"{text} ({rounds} round{'s' * (rounds != 1)}: no interval)"
    if c.verdict == "contended":
        return f"{text} ({sum(c.contended_rounds)} rounds shared)"
    return text


def _memory(c: CaseComparison) -> str:
    if c.memory_delta_mib is None:
        return "-"
    pct = c.memory_delta_pct
    return f"{c.memory_delta_mib:+.1f} MiB" + ("" if pct is None else f" ({pct:+.1f}%)")


def _detects(c: CaseComparison) -> str:
    """`x1.13`: the smallest head/base this case's data could have called worse (its inverse better)."""
    return "-" if c.detectable is None else f"x{c.detectable:.2f}"


def _cells(c: CaseComparison, single: bool) -> list[str]:
    """A case's row, in COLUMNS' order."""
    return [
        _case_name(c, single),
        _verdict(c),
        _ratio(c),
        format_time(c.base),
        format_time(c.head),
        _detects(c),
        _memory(c),
    ]


COLUMNS = ["case", "verdict", "head/base", "base", "head", "detects", "mem delta"]
"""The verdict first, beside the ratio it was judged from: on a narrow terminal, where the table splits into
column groups, the decision stays in the first."""
ALIGN: list = ["left", "left", "right", "right", "right", "right", "right"]
FORMATS = ("table", "markdown", "json")
MAX_LISTED = 8
"""Cases named per reason in the not-compared notes; the rest are counted."""


def _notes(comparison: Comparison, single: bool) -> list[str]:
    """Why cases were not comparable or not compared, and when no verdict was possible."""
    notes = []
    forced = any(c.forced for c in comparison.cases)
    for reason, n in comparison.not_comparable_reasons().items():
        notes.append(
            f"compared anyway (--force), {n} case{'s' * (n != 1)}: {reason}"
            if forced
            else not_comparable_note(reason, n)
        )
    by_reason: dict[str, list[str]] = {}
    for n in comparison.not_compared:
        by_reason.setdefault(n.reason, []).append(_case_name(n.key, single))
    for reason, keys in by_reason.items():
        shown = ", ".join(keys[:MAX_LISTED]) + (
            f" and {len(keys) - MAX_LISTED} more" if len(keys) > MAX_LISTED else ""
        )
        notes.append(f"not compared ({reason}): {shown}")
    if comparison.cases and not comparison.interleaved:
        b, h = comparison.base.created_at, comparison.head.created_at
        notes.append(
            f"drift between the two runs is not controlled: they were measured separately (base {b}, head "
            f"{h}), so a change of the machine between them looks like a change of the code; compare git "
            "refs (`bench compare BASE_REF HEAD_REF`) to run both in one session, rounds interleaved"
        )
    single_round = [c for c in comparison.cases if c.verdict == "too noisy" and c.detectable is None]
    if single_round:
        notes.append(
            f"{len(single_round)} case{'s' * (len(single_round) != 1)} with one round on a side (e.g. a "
            "schema 1 file): no interval between process lifetimes; rerun with --set rounds=3 or more"
        )
    return notes


def _rule(comparison: Comparison) -> str:
    confidence = f"{100 * (1 - comparison.alpha):g}%"
    judged = [c for c in comparison.cases if c.low is not None]  # the cases with an interval
    paired = sum(c.paired for c in judged)
    geomeans = "head/base of the geometric means of the round medians"
    turns = "head/base of the passes timed in turn, both sides in each lifetime"
    if not judged:
        how = f"{geomeans}, [{confidence} interval]"
    elif paired == len(judged):
        how = f"{turns}, [{confidence} paired interval over the lifetimes]"
    elif paired:
        how = (
            f"{turns} for the {paired} cases measured in shared lifetimes [{confidence} paired interval], "
            f"else {geomeans} [{confidence} Welch interval]"
        )
    else:
        how = f"{geomeans}, [{confidence} Welch interval]"
    return (
        f"{how}; "
        f"better/worse: the whole interval past x{comparison.factor:g} (or 1/{comparison.factor:g}); ~: "
        f"within 1/{comparison.factor:g} .. x{comparison.factor:g}; too noisy: neither; detects: the "
        "smallest head/base the case's data could call worse (its inverse: better); "
        "ratio < 1: head faster"
    )


def render_table(comparison: Comparison, labels: tuple[str, str], console: Console) -> None:
    single = len({c.key.split("/")[0] for c in comparison.cases}) <= 1
    table = TableData(
        title=f"base {labels[0]}  vs  head {labels[1]}",
        headers=COLUMNS,
        rows=[_cells(c, single) for c in comparison.cases],
        numeric={i for i, align in enumerate(ALIGN) if align == "right"},
        verdict_column=COLUMNS.index("verdict"),
        verdict_styles=VERDICT_STYLES,
    )
    print_tables([table], console)  # fitted to the width, in column groups where it is too wide
    console.print(escape(comparison.summary()))
    for note in _notes(comparison, single):
        if note.startswith("compared anyway"):
            print_warning(note)
        else:
            console.print(escape(note), style="yellow" if note.startswith("not comparable") else "dim")
    console.print(escape(_rule(comparison)), style="dim")


def render_markdown(comparison: Comparison, labels: tuple[str, str]) -> str:
    """A PR comment: who is compared with what, the table, the summary, the notes."""
    single = len({c.key.split("/")[0] for c in comparison.cases}) <= 1
    e = comparison.head.environment
    parts = [
        f"**bench compare**: base `{labels[0]}` vs head `{labels[1]}` on {e.device_type} ({e.device_name}, "
        f"{e.backend}), {e.hostname}",
        markdown_table(
            DocTable(columns=COLUMNS, rows=[_cells(c, single) for c in comparison.cases], align=ALIGN)
        ),
        f"**{markdown_text(comparison.summary())}**",
    ]
    notes = [*_notes(comparison, single), _rule(comparison)]
    parts.append("\n".join(f"- {markdown_text(n)}" for n in notes))
    return "\n\n".join(parts) + "\n"


def comparison_json(comparison: Comparison, labels: tuple[str, str]) -> dict[str, Any]:
    """The comparison as data for CI bots and dashboards: both sides, the rule, and per case its verdict,
    head/base with its interval, the smallest change it could have detected, and both sides' measurements
    (bench export's columns: estimate and interval, rounds, contended rounds, peak bytes, ...)."""
    return {
        "base": labels[0],
        "head": labels[1],
        "factor": comparison.factor,
        "alpha": comparison.alpha,
        "interleaved": comparison.interleaved,
        "summary": comparison.summary(),
        "counts": {v: comparison.count(v) for v in get_args(Verdict)},
        "cases": [
            {
                "key": c.key,
                "verdict": c.verdict,
                "judged": c.verdict in JUDGED_VERDICTS,
                "ratio": c.ratio,
                "low": c.low,
                "high": c.high,
                "p_value": c.p_value,
                "detectable": c.detectable,
                "rounds": list(c.rounds),
                "paired": c.paired,
                "contended_rounds": list(c.contended_rounds),
                "memory_delta_bytes": None
                if c.base.memory is None or c.head.memory is None
                else c.head.memory.peak_bytes - c.base.memory.peak_bytes,
                "not_comparable": c.not_comparable,
                "forced": c.forced,
                "base": measure_cells(c.base),  # bench export's measurement columns
                "head": measure_cells(c.head),
            }
            for c in comparison.cases
        ],
        "not_compared": [dataclasses.asdict(n) for n in comparison.not_compared],
    }
