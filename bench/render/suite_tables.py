"""`bench list`'s views of the suite: its scenarios with their case counts (or why a file cannot be read),
and the cases a scenario expands to, with each one's memory estimate."""

from __future__ import annotations

from collections.abc import Sequence

from rich.markup import escape
from rich.table import Table

from bench.errors import UserError
from bench.formats import format_checkpoint, format_tokens
from bench.launch.estimate import estimate_peak_bytes
from bench.render.tables import TableData
from bench.suite.loader import Suite, display
from bench.suite.selection import Selection


def scenarios_table(suite: Suite, expanded: Sequence[tuple[str, Selection | UserError]]) -> Table:
    """A row per scenario (name, expanded or the error reading it): its case count, device and
    description; the suite's default marked, a broken file's error in the description's place."""
    t = Table(title=f"scenarios ({escape(display(suite.scenarios_dir))})", title_justify="left")
    t.add_column("name")
    t.add_column("cases", justify="right")
    t.add_column("device")
    t.add_column("description", overflow="fold")
    for name, sel in expanded:
        label = escape(name + (" (default)" if name == suite.config.default_scenario else ""))
        if isinstance(sel, UserError):
            t.add_row(label, "-", "-", f"[red]{escape(str(sel))}[/]")
            continue
        device = sel.scenario.device or f"{suite.config.device} (suite)"
        t.add_row(label, str(len(sel.cases)), device, escape(sel.scenario.description))
    return t


def cases_table(sel: Selection, *, filtered: bool) -> TableData:
    """The cases of one scenario (`filtered`: those --filter kept, of how many): summary checkpoint, cp,
    global and per-rank tokens, and the preflight's peak memory estimate per rank."""
    s = sel.scenario
    title = f"{s.name}: {len(sel.cases)} of {sel.total} cases" if filtered else f"{s.name}: {sel.total} cases"
    rows = [
        [
            c.case_id,
            format_checkpoint(c.checkpoint),
            str(c.cp),
            format_tokens(c.seq_len),
            format_tokens(c.local_seq_len),
            f"{estimate_peak_bytes(c) / 2**20:.0f} MiB",
        ]
        for c in sel.cases
    ]
    headers = ["case", "summary ckpt", "cp", "global seq", "per rank", "est. peak/rank"]
    return TableData(title=title, headers=headers, rows=rows, numeric={2, 3, 4, 5}, notes=[s.description])
