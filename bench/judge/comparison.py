"""Compare two runs case by case: the head/base ratio with its confidence interval, a verdict, peak memory.

Pure functions over RunResult (no files, no git): `bench compare` feeds it two result files, whether they
were given or just produced from two git refs. A case is compared only when it is ok on both sides and
the two measurements are comparable (`comparability`); the rest is listed with why.

The statistics are per round, not per repeat (bench.measure.statistics): the repeats of one round share a
process lifetime and are correlated, so each round counts once. The ratio is head/base of the geometric
means of the round medians with Welch's (1 - alpha) interval on their logarithms, or, for paired rounds,
exp of the mean of the lifetimes' differences with the paired interval (below). Verdict: "worse" when
the whole interval lies at or above the factor, "better" when at or below 1/factor, "~" when it lies
within [1/factor, factor]; else "too noisy" (also when a side has one round: no interval); every case
carries the smallest ratio its data could call worse (`detectable`). Rounds timed while the machine was
shared (bench.measure.contention) are left out per round; a side left with fewer than two clean rounds
gets "contended", no verdict.

Pairing: where base and head measured a case's rounds in shared lifetimes of the ranks (a paired `bench
compare REF REF`: RoundResult.lifetime), every clean round having its partner, the interval is the paired
one over the lifetimes' differences (bench.measure.statistics.paired_ratio_interval), in which what a
lifetime shares cancels; each difference comes from the lifetime's passes timed in turn
(statistics.turn_difference), not from its two round medians, so the ratio is close to but not exactly
the ratio of the two estimates. Otherwise Welch's over the two sides' rounds.

Drift: rounds of two refs interleaved in one session (`bench compare REF REF`: both files carry the same
`session`) share the machine's drift, which the interval then covers. Two files measured at different
times do not; `Comparison.interleaved` says which, and `bench compare` says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from bench.errors import first_line
from bench.judge.reference import scenario_order
from bench.measure.gate import fingerprint_difference
from bench.measure.statistics import (
    RatioInterval,
    classify,
    paired_ratio_interval,
    ratio_interval,
    smallest_detectable,
    turn_difference,
)
from bench.records import to_dict
from bench.results.store import NOT_COMPARABLE, CaseResult, RunResult
from bench.suite.config import Case

Verdict = Literal["better", "worse", "~", "too noisy", "contended", "not comparable"]
JUDGED_VERDICTS: frozenset[str] = frozenset({"better", "worse", "~"})
"""The verdicts the data decided; every other state is no verdict (too noisy, contended, not comparable)."""

DEFAULT_FACTOR = 1.05
"""A change smaller than 5% either way is never a verdict. Below the smallest change worth catching (10%),
so that one of 10% can be called: a change equal to the factor is called at most half the time, however
many rounds run (its interval straddles the factor)."""
DEFAULT_ALPHA = 0.05
"""1 - the confidence of the ratio's interval (0.05: 95%)."""
MIN_ROUNDS = 2
"""Clean rounds a side needs for an interval."""


def look_rounds(first: int, most: int) -> list[int]:
    """The rounds at which a comparison that adds rounds (`bench compare --budget`) judges its cases: after
    the planned `first`, then about 1.5x as many each time, up to `most` (5, 8, 12, 18, 27, 30). Few looks
    spend little of alpha each (`sequential_alpha`), and rounds between looks run in one go."""
    out = [first]
    while out[-1] < most:
        out.append(min(most, max(out[-1] + 1, math.ceil(out[-1] * 1.5))))
    return out


def sequential_alpha(alpha: float, looks: int) -> float:
    """The alpha of each of `looks` looks (`look_rounds`): alpha / looks. A case judged at the first look
    that decides it (better, worse or ~) gets a false verdict with probability at most the sum over looks,
    alpha (the union bound, Bonferroni over the planned looks), however the data fall: sequential testing
    by alpha spending, not repeated peeking at one alpha."""
    return alpha / looks


MACHINE_KEYS = ("cpu_model", "cpu_count")
"""What makes a machine's times comparable: its CPU model and core count (with the device, DEVICE_KEYS). Not
the hostname, a label that a CI runner changes every run: `bench history` and the charts group runs by the
same keys (bench.judge.history.machine_of), so compare and history agree on what is one machine."""
DEVICE_KEYS = ("device_type", "device_name", "backend")
SOFTWARE_KEYS = ("torch_version", "torch_npu_version")

SCENARIO_KEYS_IGNORED = frozenset(
    {"name", "description", "device", "warmup", "repeat", "rounds", "cp", "seq_len", "local_seq_len"}
    | {"mode", "checkpoint", "pass", "sweeps"}
)
"""Scenario keys that cannot change the numbers of a case present on both sides: the text (name,
description); device, whose effect is the environment's device (compared on its own); the sweep lists,
which decide *which* cases exist, while a case's own coordinates are in its key; warmup and repeat, which
may be null (the suite's value) in the definition, so their effective values are compared per case
instead (warmup), or not at all (repeat and rounds: more of them change the interval's width, not what is
measured)."""


@dataclass(kw_only=True, slots=True)
class CaseComparison:
    """One case that is ok on both sides."""

    key: str
    base: CaseResult
    head: CaseResult
    ratio: float
    """head / base: of the geometric means of the clean round medians, or paired, exp of the mean lifetime
    difference (bench.measure.statistics.turn_difference)."""
    p_value: float | None
    """Two-sided t test of no change, Welch's or paired (None: a side has one round)."""
    verdict: Verdict
    low: float | None = None
    """Lower end of the ratio's (1 - alpha) interval (None: a side has fewer than two clean rounds)."""
    high: float | None = None
    """Upper end."""
    detectable: float | None = None
    """The smallest head/base this data could call worse (its inverse: better): factor x the interval's
    half-width; None without an interval."""
    rounds: tuple[int, int] = (0, 0)
    """Clean rounds used, (base, head)."""
    contended_rounds: tuple[int, int] = (0, 0)
    """Rounds left out because the machine was shared, (base, head)."""
    not_comparable: str | None = None
    """Why the two measurements are not comparable (None: they are)."""
    forced: bool = False
    """Compared although not comparable (--force); the verdict stands, with the reason as a warning."""
    paired: bool = False
    """The interval is the paired one (both sides measured in shared lifetimes), not Welch's."""

    @property
    def interval(self) -> RatioInterval:
        """The ratio with its interval (low, high None where the case has none)."""
        return RatioInterval(self.ratio, self.low, self.high, self.p_value, self.rounds, paired=self.paired)

    @property
    def memory_delta_mib(self) -> float | None:
        if self.base.memory is None or self.head.memory is None:
            return None
        return self.head.memory.peak_mib - self.base.memory.peak_mib

    @property
    def memory_delta_pct(self) -> float | None:
        if self.base.memory is None or self.head.memory is None or self.base.memory.peak_bytes == 0:
            return None
        return 100.0 * (self.head.memory.peak_bytes / self.base.memory.peak_bytes - 1.0)


@dataclass(kw_only=True, slots=True)
class NotCompared:
    """A case missing on one side, or failed or skipped on either."""

    key: str
    base_status: str
    """ok, failed, skipped, or missing."""
    head_status: str
    reason: str
    not_comparable: bool = False
    """Skipped as not comparable (a ref cannot run the case as named: bench.launch.paired), counted with the
    not comparable cases."""


@dataclass(kw_only=True, slots=True)
class Comparison:
    base: RunResult
    head: RunResult
    factor: float
    alpha: float
    cases: list[CaseComparison] = field(default_factory=list)
    """Cases ok on both sides, in base order (then head-only order)."""
    not_compared: list[NotCompared] = field(default_factory=list)

    @property
    def interleaved(self) -> bool:
        """Both sides' rounds ran interleaved in one session (drift is shared, so the intervals cover it)."""
        return self.base.session is not None and self.base.session == self.head.session

    def count(self, verdict: Verdict) -> int:
        """Cases with `verdict`; "not comparable" also counts the cases a ref could not run as named."""
        skipped = sum(n.not_comparable for n in self.not_compared) if verdict == "not comparable" else 0
        return sum(c.verdict == verdict for c in self.cases) + skipped

    def not_comparable_reasons(self) -> dict[str, int]:
        """Each reason cases were not comparable for (`comparability`), with how many: one line each in
        every view (`not_comparable_note`)."""
        reasons: dict[str, int] = {}
        for c in self.cases:
            if c.not_comparable:
                reasons[c.not_comparable] = reasons.get(c.not_comparable, 0) + 1
        return reasons

    @property
    def head_failures(self) -> list[NotCompared]:
        """Cases ok on base that failed on head: a regression no timing can show."""
        return [n for n in self.not_compared if n.base_status == "ok" and n.head_status == "failed"]

    def summary(self) -> str:
        parts = [
            f"{self.count('better')} better",
            f"{self.count('worse')} worse",
            f"{self.count('~')} ~",
            f"{self.count('not comparable')} not comparable",
        ]
        if self.count("too noisy"):
            parts.append(f"{self.count('too noisy')} too noisy")
        if self.count("contended"):
            parts.append(f"{self.count('contended')} contended")
        others = sum(not n.not_comparable for n in self.not_compared)
        if others:
            parts.append(f"{others} not compared")
        return ", ".join(parts)


def _differences(base: dict[str, Any], head: dict[str, Any], keys: Sequence[str]) -> list[str]:
    return [f"{k} {base.get(k)!r} vs {head.get(k)!r}" for k in keys if base.get(k) != head.get(k)]


CASE_KEYS_IGNORED = frozenset({"repeat", "rounds", "case_id"})
"""A case's keys that do not change what is timed (more repeats and rounds narrow the interval)."""


def _case_fields(case: Case) -> dict[str, Any]:
    """A case's keys as its record writes them, the layer's among them (hidden_size, ..., dtype)."""
    fields = to_dict(case)
    fields.update(fields.pop("layer"))
    return {k: v for k, v in fields.items() if k not in CASE_KEYS_IGNORED}


def comparability(
    base_run: RunResult,
    base: CaseResult,
    head_run: RunResult,
    head: CaseResult,
    *,
    outputs: bool = True,
) -> str | None:
    """Why the timings of one case on two sides must not be compared, or None when they may be.

    Two measurements of a case are comparable only when they come from
      - the same machine: CPU model and core count (CPU-side overheads and rank threads depend on them; the
        hostname is a label, which a CI runner changes every run);
      - the same device: device type, device name, collective backend;
      - the same software below the code under test: torch (and torch-npu) version;
      - the same case as it ran (its layer, dtype, batch, seed, inputs and effective warmup; not its repeats
        and rounds, which change the interval's width, not what is timed), and the same scenario definition
        for the keys both definitions have, ignoring SCENARIO_KEYS_IGNORED (keys that cannot change this
        case's numbers; a key only one side's bench version writes is judged through the case);
      - the same torch threads per rank (recorded per case; on CPU it dominates the time);
      - the same outputs (`outputs`): where both sides' correctness gate fingerprinted the case's results
        (bench.measure.gate), they agree within the looser side's bar, so that a faster wrong program is
        never called better (`bench compare --allow-different-outputs` skips this one check: a kernel change
        that moves rounding stays under the bar anyway).
    The git commit, branch and dirty flag are *what* is compared, so they never make a pair incomparable;
    neither does the launcher or the Python version. The reason names every difference found, e.g.
    "different machine (cpu_count 2 vs 8)"; `not_comparable_note` adds the flag that compares them anyway.
    `bench compare` judges a pair of files by it, `bench history` every pair of adjacent runs of a case.
    """
    reasons = []
    env_b, env_h = to_dict(base_run.environment), to_dict(head_run.environment)
    for what, keys in (("machine", MACHINE_KEYS), ("device", DEVICE_KEYS), ("software", SOFTWARE_KEYS)):
        diff = _differences(env_b, env_h, keys)
        if diff:
            reasons.append(f"different {what} ({', '.join(diff)})")
    scenario = base.case.scenario
    def_b = base_run.scenarios.get(scenario, {})
    def_h = head_run.scenarios.get(scenario, {})
    common = sorted((def_b.keys() & def_h.keys()) - SCENARIO_KEYS_IGNORED)
    in_definition = [k for k in common if def_b[k] != def_h[k]]
    case_b, case_h = _case_fields(base.case), _case_fields(head.case)
    in_case = [k for k in case_b if case_b[k] != case_h.get(k) and k not in in_definition]
    diff = _differences(def_b, def_h, in_definition) + _differences(case_b, case_h, in_case)
    if diff:
        reasons.append(f"different scenario {scenario} ({', '.join(diff)})")
    if base.threads_per_rank != head.threads_per_rank:
        reasons.append(f"different threads per rank ({base.threads_per_rank} vs {head.threads_per_rank})")
    if outputs:
        reasons += different_outputs(base, head)
    return "; ".join(reasons) or None


DIFFERENT_OUTPUTS = "the refs compute different outputs"
"""How `comparability` names the one difference `--allow-different-outputs` lifts alone."""


def different_outputs(base: CaseResult, head: CaseResult) -> list[str]:
    """[the reason] where both sides' fingerprints exist and differ beyond the looser side's bar, else []."""
    if base.check is None or head.check is None:
        return []
    found = fingerprint_difference(head.check.fingerprints, base.check.fingerprints)
    bar = max(base.check.bar, head.check.bar)
    if found is None or found[1] <= bar:
        return []
    name, rel = found
    return [f"{DIFFERENT_OUTPUTS} (rel-L2 {rel:.1e} on {name}, bar {bar:.0e})"]


def override_flag(reason: str, command: str = "") -> str:
    """The flag that compares cases not comparable for `reason` anyway: --allow-different-outputs where the
    outputs are the only difference, else --force (which lifts every check); `command` (e.g. `bench
    compare`) prefixes it for a view that has no such flag of its own (a report)."""
    only_outputs = all(part.startswith(DIFFERENT_OUTPUTS) for part in reason.split("; "))
    flag = "--allow-different-outputs" if only_outputs else "--force"
    return f"`{command} {flag}`" if command else flag


def not_comparable_note(reason: str, cases: int, *, where: str = "", command: str = "") -> str:
    """The one line every view prints for a group of cases not comparable for the same `reason`: the count,
    the difference and the flag that compares them anyway (`override_flag`; `where`: e.g. " from e761a03b
    on"), e.g. `not comparable, 140 cases: different scenario cpu-scaling (warmup 3 vs 2); --force compares
    them anyway`."""
    return (
        f"not comparable{where}, {cases} case{'s' * (cases != 1)}: {reason}; "
        f"{override_flag(reason, command)} compares them anyway"
    )


def clean_medians(result: CaseResult) -> tuple[list[float], int]:
    """(the round medians of the rounds not contended, how many were contended)."""
    clean = [r.median_s for r in result.rounds if not r.contended]
    return clean, len(result.rounds) - len(clean)


def paired_differences(base: CaseResult, head: CaseResult) -> list[float] | None:
    """log(head / base) of each lifetime both sides measured the case in, neither round contended, from its
    passes timed in turn (statistics.turn_difference); None unless every clean round of either side has its
    partner with as many passes (rounds not measured in pairs)."""
    b = {r.lifetime: r.passes_s for r in base.rounds if not r.contended}
    h = {r.lifetime: r.passes_s for r in head.rounds if not r.contended}
    if None in b or None in h or b.keys() != h.keys() or len(b) != sum(not r.contended for r in base.rounds):
        return None
    if any(len(b[k]) != len(h[k]) for k in b):
        return None
    return [turn_difference(b[k], h[k]) for k in b]


def compare_case(
    base_run: RunResult,
    base: CaseResult,
    head_run: RunResult,
    head: CaseResult,
    *,
    factor: float,
    alpha: float,
    force: bool = False,
    allow_different_outputs: bool = False,
) -> CaseComparison:
    """Ratio, interval and verdict of one case that is ok on both sides."""
    (b, b_shared), (h, h_shared) = clean_medians(base), clean_medians(head)
    reason = comparability(base_run, base, head_run, head, outputs=not allow_different_outputs)
    differences = paired_differences(base, head)
    interval: RatioInterval | None = None
    if differences:
        interval = paired_ratio_interval(differences, 1.0 - alpha)
    elif b and h:
        interval = ratio_interval(b, h, 1.0 - alpha)
    else:  # every round of a side contended: the ratio of all rounds, for the record only
        interval = ratio_interval([r.median_s for r in base.rounds], [r.median_s for r in head.rounds])
    short = len(b) < MIN_ROUNDS or len(h) < MIN_ROUNDS
    if reason is not None and not force:
        result: Verdict = "not comparable"
    elif short and (b_shared or h_shared):
        result = "contended"  # a timing taken while the machine was shared says nothing about the code
    elif short:
        result = "too noisy"  # one round: no variance between process lifetimes seen, no interval
    else:
        result = classify(interval, factor)
    clean = bool(b and h) and not short
    return CaseComparison(
        key=base.key,
        base=base,
        head=head,
        ratio=interval.ratio,
        p_value=interval.p_value if clean else None,
        verdict=result,
        low=interval.low if clean else None,
        high=interval.high if clean else None,
        detectable=smallest_detectable(interval, factor) if clean else None,
        rounds=(len(b), len(h)),
        contended_rounds=(b_shared, h_shared),
        not_comparable=reason,
        forced=reason is not None and force,
        paired=interval.paired,
    )


def compare_runs(
    base: RunResult,
    head: RunResult,
    *,
    factor: float = DEFAULT_FACTOR,
    alpha: float = DEFAULT_ALPHA,
    force: bool = False,
    allow_different_outputs: bool = False,
) -> Comparison:
    """Compare every case of the two runs (see the module docstring)."""
    if factor <= 1.0:
        raise ValueError(f"factor must be > 1 (e.g. 1.10 for 10%), got {factor}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be between 0 and 1 (e.g. 0.05), got {alpha}")
    out = Comparison(base=base, head=head, factor=factor, alpha=alpha)
    cases = {c.key: c.case for c in [*head.cases, *base.cases]}
    order = scenario_order(list(dict.fromkeys([*base.scenarios, *head.scenarios])))
    for key in sorted(cases, key=lambda k: order(cases[k])):  # scenario order, not the order they ran
        b, h = base.get(key), head.get(key)
        if b is not None and h is not None and b.status == "ok" and h.status == "ok":
            out.cases.append(
                compare_case(
                    base,
                    b,
                    head,
                    h,
                    factor=factor,
                    alpha=alpha,
                    force=force,
                    allow_different_outputs=allow_different_outputs,
                )
            )
            continue
        b_status = b.status if b is not None else "missing"
        h_status = h.status if h is not None else "missing"
        if b is None or h is None:
            reason = f"only on {'head' if b is None else 'base'}"
        else:
            errors = [
                f"{side}: {first_line(r.error)}"
                for side, r in (("base", b), ("head", h))
                if r.status != "ok" and r.error
            ]
            reason = "; ".join(errors) or f"base {b_status}, head {h_status}"
        skipped = [r for r in (b, h) if r is not None and (r.error or "").startswith(NOT_COMPARABLE)]
        if skipped:
            reason = skipped[0].error or reason
        out.not_compared.append(
            NotCompared(
                key=key,
                base_status=b_status,
                head_status=h_status,
                reason=reason,
                not_comparable=bool(skipped),
            )
        )
    return out
