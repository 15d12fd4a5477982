"""Gate a change on speed and exactness together: the timing verdicts of a base-vs-head comparison
(bench.judge.comparison) and the accuracy checks of `bench verify` on head, judged at once. Pure.

Timing: a case whose verdict is in FAILING_VERDICTS ("worse"), or that is ok on base and failed on head
(Comparison.head_failures), makes head *slower*. A verdict in PASSING_VERDICTS ("better", "~") is a timing
that was judged and passed. Every other state ("not comparable", "contended", and whatever states the
comparison adds later, such as "too noisy") is neither a pass nor a failure: it is counted, never trusted.
Verdicts are matched by name only, so that the statistics behind them can change freely.

Accuracy: a head record of `bench verify` that is ok and failed a check, or that failed to run (a rank
raised, died or timed out), makes head *inexact*: exactness was not shown. A check that passed but let a
mutant through ("pass, no power against: ...": bench.results.verifications) showed nothing either way: it
is counted apart, never as a pass. Skipped records do not count.
Base records, when given, are shown beside head's, but only head is judged: exactness is not relative.

Outcome: "slower", "inexact" or "slower and inexact" when anything failed; else "nothing compared" when
no timing was judged or no head check ran (a gate that checked nothing must not pass); else "pass".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from bench.judge.comparison import JUDGED_VERDICTS, Comparison
from bench.results.verifications import Verification

FAILING_VERDICTS = frozenset({"worse"})
"""Timing verdicts that fail the gate: head is slower."""
PASSING_VERDICTS = JUDGED_VERDICTS - FAILING_VERDICTS
"""Timing verdicts that were judged and pass: head is not slower."""

Outcome = Literal["pass", "slower", "inexact", "slower and inexact", "nothing compared"]


@dataclass(frozen=True, slots=True)
class AccuracyPair:
    """One accuracy check on both sides (None: not in that side's verify files)."""

    key: str
    """The record's key, `layer/<case key>` or `train/<case key>`."""
    base: Verification | None
    head: Verification | None


def check_state(record: Verification | None) -> str:
    """How a record reads in a table: pass, FAIL, not run (failed to run), skipped, or - (absent)."""
    if record is None:
        return "-"
    if record.status == "failed":
        return "not run"
    if record.status == "skipped":
        return "skipped"
    if without_power(record):
        return "pass, no power"
    return "pass" if record.passed else "FAIL"


def without_power(record: Verification) -> bool:
    """A check that passed and let a mutant through: a pass that could not have failed."""
    return record.status == "ok" and record.passed and bool(record.no_power_against)


def is_inexact(record: Verification) -> bool:
    """A check that failed, or a case that failed to run: exactness not shown."""
    return record.status == "failed" or (record.status == "ok" and not record.passed)


@dataclass(kw_only=True, slots=True)
class GateResult:
    """The timing comparison and the accuracy checks of one change, and what they add up to."""

    comparison: Comparison
    accuracy: list[AccuracyPair] = field(default_factory=list)

    @property
    def slower(self) -> list[str]:
        """Keys of the cases that make head slower: failing verdicts, and ok on base but failed on head."""
        worse = [c.key for c in self.comparison.cases if c.verdict in FAILING_VERDICTS]
        return worse + [n.key for n in self.comparison.head_failures]

    @property
    def inexact(self) -> list[str]:
        """Keys of the head checks that failed or did not run."""
        return [p.key for p in self.accuracy if p.head is not None and is_inexact(p.head)]

    @property
    def judged(self) -> int:
        """Timing cases with a passing or failing verdict."""
        return sum(c.verdict in PASSING_VERDICTS | FAILING_VERDICTS for c in self.comparison.cases)

    @property
    def unjudged(self) -> dict[str, int]:
        """Timing cases whose state is neither a pass nor a failure, counted by state."""
        out: dict[str, int] = {}
        for c in self.comparison.cases:
            if c.verdict not in PASSING_VERDICTS | FAILING_VERDICTS:
                out[c.verdict] = out.get(c.verdict, 0) + 1
        return out

    @property
    def checked(self) -> int:
        """Head checks that ran (status ok) and showed something: failed, or passed with power."""
        return sum(
            p.head is not None and p.head.status == "ok" and not without_power(p.head) for p in self.accuracy
        )

    @property
    def powerless(self) -> list[str]:
        """Keys of the head checks that passed without power (counted apart: neither pass nor failure)."""
        return [p.key for p in self.accuracy if p.head is not None and without_power(p.head)]

    @property
    def outcome(self) -> Outcome:
        slower, inexact = bool(self.slower), bool(self.inexact)
        if slower and inexact:
            return "slower and inexact"
        if slower:
            return "slower"
        if inexact:
            return "inexact"
        if self.judged == 0 or self.checked == 0:
            return "nothing compared"
        return "pass"

    def summary(self) -> str:
        """One line: the outcome, then what it rests on."""
        unjudged = ", ".join(f"{n} {state}" for state, n in self.unjudged.items())
        timing = f"timing: {self.judged} judged, {len(self.slower)} slower" + (
            f" ({unjudged}: no verdict)" if unjudged else ""
        )
        accuracy = f"accuracy: {self.checked} checks on head, {len(self.inexact)} inexact" + (
            f" ({len(self.powerless)} passed without power: not counted)" if self.powerless else ""
        )
        return f"{self.outcome}; {timing}; {accuracy}"


def pair_records(base: Sequence[Verification], head: Sequence[Verification]) -> list[AccuracyPair]:
    """Both sides' records by key, in head order (then base-only keys); a later record of a key wins."""
    by_base = {r.key: r for r in base}
    by_head = {r.key: r for r in head}
    keys = list(dict.fromkeys([*by_head, *by_base]))
    return [AccuracyPair(key=k, base=by_base.get(k), head=by_head.get(k)) for k in keys]


def gate(
    comparison: Comparison, base_records: Sequence[Verification], head_records: Sequence[Verification]
) -> GateResult:
    """The gate of one change: its comparison and both sides' accuracy records."""
    return GateResult(comparison=comparison, accuracy=pair_records(base_records, head_records))
