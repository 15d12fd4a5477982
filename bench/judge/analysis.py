"""What charts and reports derive from a run: scaling series and the ablations of a switch (the summary
checkpoint, overlap) on vs off. Pure.

Everything here reads the ok cases of one RunResult, addressed by their coordinates (scenario, mode,
summary checkpoint, CP degree, global sequence length, pass). Scaling and sequence-length views use one
*variant* per mode: summary checkpoint on where the run has it (the PR's default), else whatever ran;
checkpoint on vs off is its own view (`ablation(run, CHECKPOINT)`, overlap on vs off likewise). A scenario
that sweeps layouts or packed documents is read in one *input* (`primary_input`): the contiguous layout
unpacked where it ran, else its first case's; packed against unpacked is a table
(bench.render.tables.documents_table), not a chart.

- strong scaling: a fixed global sequence shared by more ranks; speedup(cp) = t(cp=1) / t(cp), efficiency
  = speedup / cp. Any global length measured at cp=1 and at least one larger cp qualifies.
- weak scaling: a fixed number of tokens per rank, the global sequence grows with cp; efficiency =
  t(cp=1) / t(cp) (1.0 is ideal: more ranks, same time). Only the local lengths a scenario declares as a
  weak-scaling sweep (`local_seq_len`) are used, so that lengths that merely happen to line up across a
  strong sweep do not pose as a weak-scaling experiment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from bench.measure.statistics import RatioInterval, ratio_interval
from bench.results.store import CaseResult, RunResult
from bench.suite.config import PASS_TAGS, Case
from bench.suite.documents import documents_tag
from gdn_cp.distributed import DEFAULT_LAYOUT, SUMMARY_MODES, mode_order
from gdn_cp.ops.backends import DEFAULT_BACKEND

PASSES: tuple[str, ...] = tuple(PASS_TAGS)
"""forward, forward_backward: the order passes are shown in."""
PASS_LABELS = {"forward": "forward", "forward_backward": "forward+backward", "prefill": "prefill"}
PREFERRED_PASSES: tuple[str, ...] = ("forward_backward", "forward", "prefill")
"""The pass a chart, an ablation or a table's memory takes of a point measured in several: training's
first (the reference PR's), then the forward, then the prefill."""
CHECKPOINT_MODES = SUMMARY_MODES
"""The modes that have a summary to checkpoint."""


@dataclass(frozen=True, slots=True)
class Variant:
    """One line of a scaling chart: a mode, with the summary checkpoint setting it ran with."""

    mode: str
    checkpoint: bool | None
    overlap: bool = False
    """Scaling and length views show the cases without overlap (its own view: `ablation(run, OVERLAP)`)."""
    backend: str = DEFAULT_BACKEND
    """The local op (a backend sweep draws a line per mode and backend)."""

    @property
    def label(self) -> str:
        return (
            self.mode
            + ("" if self.backend == DEFAULT_BACKEND else f" [{self.backend}]")
            + (" (ckpt off)" if self.checkpoint is False else "")
            + (" (overlap)" if self.overlap else "")
        )


@dataclass(frozen=True, slots=True)
class ScalingPoint:
    """One CP degree of a scaling series."""

    cp: int
    seq_len: int
    """Global sequence length at this cp."""
    result: CaseResult
    """The case at this cp (ok, so timing is set)."""
    base: CaseResult
    """The same variant and pass at cp=1."""

    @property
    def interval(self) -> RatioInterval:
        """t(cp=1) / t(cp) of the two estimates, with its 95% interval across rounds (low and high None
        with fewer than two rounds a side; bench.measure.statistics). Exactly 1 at cp=1, where both are
        the same case."""
        if self.result is self.base:
            rounds = len(self.base.estimate_medians)
            return RatioInterval(1.0, 1.0, 1.0, 1.0, (rounds, rounds))
        return ratio_interval(self.result.estimate_medians, self.base.estimate_medians)

    @property
    def ratio(self) -> float:
        """t(cp=1) / t(cp): strong-scaling speedup, or weak-scaling efficiency."""
        return self.interval.ratio

    @property
    def ratio_range(self) -> tuple[float, float]:
        """The ratio's spread: its interval where there are rounds enough, else from the IQRs of both times
        (q25 at cp=1 / q75 at cp, q75 / q25)."""
        i = self.interval
        if i.low is not None and i.high is not None:
            return i.low, i.high
        b, r = self.base.timing, self.result.timing
        assert b is not None and r is not None
        return b.q25_s / r.q75_s, b.q75_s / r.q25_s

    @property
    def within_noise(self) -> bool:
        """The interval holds 1: this run cannot tell t(cp) from t(cp=1) (False without an interval)."""
        i = self.interval
        return i.low is not None and i.high is not None and i.low <= 1.0 <= i.high

    @property
    def strong(self) -> bool:
        """A strong-scaling point (the same global sequence as at cp=1), else weak (the same per rank)."""
        return self.seq_len == self.base.case.seq_len

    @property
    def efficiency(self) -> float:
        """speedup / cp (strong), t(cp=1) / t(cp) (weak): 1.0 is ideal, above it is not what CP can do."""
        return self.ratio / self.cp if self.strong else self.ratio

    @property
    def contended(self) -> bool:
        """Either of its two cases was timed on a shared machine: no efficiency is drawn from it."""
        return self.result.contended or self.base.contended

    @property
    def caveat(self) -> str | None:
        """Why the figure must not be read as CP's: "contended" (a side timed on a shared machine),
        "implausible: above ideal" (efficiency over 100%: the ranks did not run alone, or the rounds
        drifted), "interval past ideal" (its interval holds efficiencies over 100%); None when none holds."""
        if self.cp == 1:
            return None
        if self.contended:
            return "contended"
        if self.efficiency > 1.0:
            return "implausible: above ideal"
        if self.ratio_range[1] / (self.cp if self.strong else 1) > 1.0:
            return "interval past ideal"
        return None


@dataclass(frozen=True, slots=True)
class Switch:
    """A setting an ablation turns on and off (a boolean case field), and how tables and charts name it."""

    field: str
    """The Case field: checkpoint or overlap."""
    title: str
    off_label: str
    on_label: str
    modes: tuple[str, ...]
    """The modes it applies to."""
    apart_from: tuple[str, ...] = ()
    """Switches whose cases it leaves out (they have an ablation of their own)."""


CHECKPOINT = Switch(
    "checkpoint", "Summary checkpoint on vs off", "graph kept", "checkpoint", CHECKPOINT_MODES, ("overlap",)
)
OVERLAP = Switch("overlap", "Overlap on vs off", "no overlap", "overlap", SUMMARY_MODES)


@dataclass(frozen=True, slots=True)
class AblationRow:
    """A switch off against on at one point (every other coordinate the same)."""

    switch: Switch
    pass_: str
    """The pass whose time is compared: forward_backward where it ran (the reference PR's), else forward."""
    off: CaseResult
    on: CaseResult

    # The point: the on case's coordinates (the off case's are the same, but for the switch).
    @property
    def scenario(self) -> str:
        return self.on.case.scenario

    @property
    def cp(self) -> int:
        return self.on.case.cp

    @property
    def seq_len(self) -> int:
        return self.on.case.seq_len

    @property
    def mode(self) -> str:
        return self.on.case.mode

    @property
    def _interval(self) -> RatioInterval:
        """on / off of the two estimates' round medians (bench.measure.statistics)."""
        return ratio_interval(self.off.estimate_medians, self.on.estimate_medians)

    @property
    def time_cost_pct(self) -> float:
        """How much longer the pass takes with the switch on, in % of the time with it off."""
        return 100.0 * (self._interval.ratio - 1.0)

    @property
    def time_cost_interval_pct(self) -> tuple[float, float] | None:
        """The cost's 95% interval across rounds, in %; None with fewer than two rounds a side."""
        i = self._interval
        if i.low is None or i.high is None:
            return None
        return 100.0 * (i.low - 1.0), 100.0 * (i.high - 1.0)

    @property
    def within_noise(self) -> bool:
        """The interval holds 0: this run cannot tell the cost from no cost (False without an interval)."""
        interval = self.time_cost_interval_pct
        return interval is not None and interval[0] <= 0.0 <= interval[1]

    @property
    def time_cost_range_pct(self) -> tuple[float, float]:
        """The cost's spread: its interval where there are rounds enough, else from both IQRs
        (q25 on / q75 off, q75 on / q25 off), in %."""
        interval = self.time_cost_interval_pct
        if interval is not None:
            return interval
        on, off = self.on.timing, self.off.timing
        assert on is not None and off is not None
        return 100.0 * (on.q25_s / off.q75_s - 1.0), 100.0 * (on.q75_s / off.q25_s - 1.0)

    @property
    def memory_saved_mib(self) -> float | None:
        """Peak allocated with the switch off minus on (positive: on saves memory)."""
        if self.on.memory is None or self.off.memory is None:
            return None
        return self.off.memory.peak_mib - self.on.memory.peak_mib


def source_label(run: RunResult) -> str:
    """How charts, reports and comparisons name a run: branch@commit (8 hex), "+dirty" for uncommitted
    changes; the branch is left out when detached (a worktree of a ref records "HEAD")."""
    e = run.environment
    branch = "" if e.git_branch in ("HEAD", "unknown") else f"{e.git_branch}@"
    return f"{branch}{e.git_commit[:8]}" + ("+dirty" if e.git_dirty else "")


def describe_layer(definition: dict[str, Any]) -> str:
    """A stored scenario definition's layer in one line, as the tables' titles spell it."""
    d = definition
    return (
        f"hidden {d.get('hidden_size')}, K/V heads {d.get('num_k_heads')}/{d.get('num_v_heads')}, "
        f"head dims {d.get('head_k_dim')}/{d.get('head_v_dim')}, {d.get('dtype')}, batch {d.get('batch')}"
    )


def threads_by_cp(run: RunResult, scenario: str | None = None) -> str:
    """torch threads per rank by CP degree ("cp1: 2, cp2: 1"), marking a degree whose ranks x threads
    exceed the cores of a local launch (its ranks then compete for cores, which shows in the times)."""
    by_cp: dict[int, set[int]] = {}
    for c in run.cases:
        if scenario in (None, c.case.scenario) and c.threads_per_rank is not None:
            by_cp.setdefault(c.case.cp, set()).add(c.threads_per_rank)
    if not by_cp:
        return "-"
    e = run.environment
    parts = []
    for cp, threads in sorted(by_cp.items()):
        over = cp * max(threads) > e.cpu_count and e.launcher == "local"
        parts.append(f"cp{cp}: {'/'.join(map(str, sorted(threads)))}" + (" (oversubscribed)" if over else ""))
    return ", ".join(parts)


def input_of(case: Case) -> tuple[str, str]:
    """(layout, documents tag) of a case: what its input is, beyond its length."""
    return case.layout, documents_tag(case.documents)


PLAIN_INPUT = (DEFAULT_LAYOUT, "none")
"""Contiguous shards of an unpacked sequence: what every scenario ran before layouts and documents."""


def primary_input(run: RunResult, scenario: str) -> tuple[str, str] | None:
    """The input the charts of `scenario` show: PLAIN_INPUT where an ok case has it, else the first ok
    case's (None: no ok case)."""
    found = [input_of(c.case) for c in run.cases if c.status == "ok" and c.case.scenario == scenario]
    return PLAIN_INPUT if PLAIN_INPUT in found else (found[0] if found else None)


def _ok(run: RunResult) -> Iterable[CaseResult]:
    """The ok cases with timing, each scenario's in its primary input only (so that one point is one case)."""
    done = [c for c in run.cases if c.status == "ok" and c.timing is not None]
    primary = {name: primary_input(run, name) for name in dict.fromkeys(c.case.scenario for c in done)}
    return (c for c in done if input_of(c.case) == primary[c.case.scenario])


def scenario_names(run: RunResult) -> list[str]:
    """Scenarios with ok cases, in the order their cases appear."""
    return list(dict.fromkeys(c.case.scenario for c in _ok(run)))


def find(
    run: RunResult, scenario: str, variant: Variant, cp: int, seq_len: int, pass_: str
) -> CaseResult | None:
    """The ok case at these coordinates, if it ran."""
    for c in _ok(run):
        k = c.case
        if (k.scenario, k.mode, k.checkpoint, k.overlap, k.backend, k.cp, k.seq_len, k.pass_) == (
            scenario,
            variant.mode,
            variant.checkpoint,
            variant.overlap,
            variant.backend,
            cp,
            seq_len,
            pass_,
        ):
            return c
    return None


def variants(run: RunResult, scenario: str) -> list[Variant]:
    """One variant per mode and backend, in the PR's mode order (then the backends' order of appearance):
    checkpoint on where it ran, else off (or None)."""
    seen: dict[tuple[str, str], set[bool | None]] = {}
    for c in _ok(run):
        if c.case.scenario == scenario:
            seen.setdefault((c.case.mode, c.case.backend), set()).add(c.case.checkpoint)
    out = []
    for mode, backend in sorted(seen, key=lambda key: mode_order(key[0])):
        settings = seen[(mode, backend)]
        checkpoint = True if True in settings else (False if False in settings else None)
        out.append(Variant(mode, checkpoint, backend=backend))
    return out


def passes(run: RunResult, scenario: str) -> list[str]:
    present = {c.case.pass_ for c in _ok(run) if c.case.scenario == scenario}
    return [p for p in PASSES if p in present]


def cps(run: RunResult, scenario: str) -> list[int]:
    return sorted({c.case.cp for c in _ok(run) if c.case.scenario == scenario})


def seq_lens(run: RunResult, scenario: str, cp: int | None = None) -> list[int]:
    return sorted(
        {c.case.seq_len for c in _ok(run) if c.case.scenario == scenario and cp in (None, c.case.cp)}
    )


def series(
    run: RunResult, scenario: str, variant: Variant, pass_: str, *, cp: int
) -> list[tuple[int, CaseResult]]:
    """(global sequence length, case) of one variant and pass at one CP degree, by length."""
    out = []
    for seq_len in seq_lens(run, scenario, cp):
        result = find(run, scenario, variant, cp, seq_len, pass_)
        if result is not None:
            out.append((seq_len, result))
    return out


def strong_lengths(run: RunResult, scenario: str) -> list[int]:
    """Global lengths measured at cp=1 and at least one larger CP degree (any variant, any pass)."""
    by_len: dict[int, set[int]] = {}
    for c in _ok(run):
        if c.case.scenario == scenario:
            by_len.setdefault(c.case.seq_len, set()).add(c.case.cp)
    return sorted(n for n, degrees in by_len.items() if 1 in degrees and len(degrees) > 1)


def declared_local_lengths(definition: dict[str, Any]) -> list[int]:
    """The local_seq_len values a stored scenario definition sweeps (top level and sub-sweeps)."""
    found: list[int] = list(definition.get("local_seq_len") or [])
    for sweep in definition.get("sweeps") or []:
        found += sweep.get("local_seq_len") or []
    return sorted(set(found))


def weak_lengths(run: RunResult, scenario: str) -> list[int]:
    """Declared weak-scaling local lengths measured at cp=1 and at least one larger CP degree."""
    out = []
    for local in declared_local_lengths(run.scenarios.get(scenario, {})):
        degrees = {
            c.case.cp for c in _ok(run) if c.case.scenario == scenario and c.case.local_seq_len == local
        }
        if 1 in degrees and len(degrees) > 1:
            out.append(local)
    return out


def strong_scaling(
    run: RunResult, scenario: str, variant: Variant, pass_: str, *, seq_len: int
) -> list[ScalingPoint]:
    """Speedup over cp=1 at a fixed global length; empty when cp=1 did not run for this variant."""
    base = find(run, scenario, variant, 1, seq_len, pass_)
    if base is None:
        return []
    out = []
    for cp in cps(run, scenario):
        result = find(run, scenario, variant, cp, seq_len, pass_)
        if result is not None:
            out.append(ScalingPoint(cp=cp, seq_len=seq_len, result=result, base=base))
    return out


def weak_scaling(
    run: RunResult, scenario: str, variant: Variant, pass_: str, *, local_seq_len: int
) -> list[ScalingPoint]:
    """Efficiency t(cp=1) / t(cp) at a fixed length per rank; empty when cp=1 did not run."""
    base = find(run, scenario, variant, 1, local_seq_len, pass_)
    if base is None:
        return []
    out = []
    for cp in cps(run, scenario):
        result = find(run, scenario, variant, cp, local_seq_len * cp, pass_)
        if result is not None:
            out.append(ScalingPoint(cp=cp, seq_len=local_seq_len * cp, result=result, base=base))
    return out


def ablation(run: RunResult, switch: Switch) -> list[AblationRow]:
    """Every point where a mode ran with `switch` both on and off, all else equal, in case order."""
    rows: dict[str, AblationRow] = {}
    for c in _ok(run):
        k = c.case
        if k.mode not in switch.modes or getattr(k, switch.field) is not True:
            continue
        if any(getattr(k, other) for other in switch.apart_from):
            continue
        key = dataclasses.replace(k, pass_="forward").key()  # the point, whichever pass
        if key in rows:
            continue
        for pass_ in PREFERRED_PASSES:  # the first pass measured both ways
            on = run.get(dataclasses.replace(k, pass_=pass_).key())
            off = run.get(dataclasses.replace(k, pass_=pass_, **{switch.field: False}).key())
            if on is not None and off is not None and on.status == off.status == "ok":
                rows[key] = AblationRow(switch=switch, pass_=pass_, off=off, on=on)
                break
    return sorted(
        rows.values(),
        key=lambda r: (scenario_names(run).index(r.scenario), r.cp, r.seq_len, mode_order(r.mode)),
    )
