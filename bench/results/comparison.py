"""Compare two runs case by case: ratio of rank-max medians, Mann-Whitney U, a verdict, peak-memory deltas.

Pure functions over RunResult (no files, no git): `bench compare` feeds it two result files, whether they
were given or just produced from two git refs. A case is compared only when it is ok on both sides and
the two measurements are comparable (`comparability`); the rest is listed with why.

Verdict (asv's rule): "worse" when head/base >= factor and the two-sided Mann-Whitney U test on the
per-repeat rank-max samples gives p < alpha; "better" when head/base <= 1/factor and p < alpha; else "~".
A large ratio from few or noisy repeats is "~": the test is what says the difference is not chance. A
case timed while the machine was shared on either side (bench.measure.contention) gets "contended", no
verdict. With n repeats per side the smallest possible p is 2 / C(2n, n): 0.33 for 2 repeats, 0.10 for 3,
0.029 for 4, so at least 4 repeats per side are needed for any verdict at alpha = 0.05.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from bench.errors import first_line
from bench.measure.timing import rank_max
from bench.results.store import CaseResult, RunResult

Verdict = Literal["better", "worse", "~", "contended", "not comparable"]

DEFAULT_FACTOR = 1.10
"""A change smaller than 10% either way is "~" however significant."""
DEFAULT_ALPHA = 0.05
"""Significance level of the Mann-Whitney U test."""

MACHINE_KEYS = ("hostname", "cpu_model", "cpu_count")
DEVICE_KEYS = ("device_type", "device_name", "backend")
SOFTWARE_KEYS = ("torch_version", "torch_npu_version")

SCENARIO_KEYS_IGNORED = frozenset(
    {"name", "description", "device", "warmup", "repeat", "cp", "seq_len", "local_seq_len", "mode"}
    | {"checkpoint", "pass", "sweeps"}
)
"""Scenario keys that cannot change the numbers of a case present on both sides: the text (name,
description); device, whose effect is the environment's device (compared on its own); the sweep lists,
which decide *which* cases exist, while a case's own coordinates are in its key; warmup and repeat, which
may be null (the suite's value) in the definition, so their effective values are compared per case
instead (warmup), or not at all (repeat: more repeats change the test's power, not what is measured)."""


@dataclass(kw_only=True, slots=True)
class CaseComparison:
    """One case that is ok on both sides."""

    key: str
    base: CaseResult
    head: CaseResult
    ratio: float
    """head / base of the rank-max median."""
    p_value: float
    """Two-sided Mann-Whitney U on the per-repeat rank-max samples."""
    verdict: Verdict
    not_comparable: str | None = None
    """Why the two measurements are not comparable (None: they are)."""
    forced: bool = False
    """Compared although not comparable (--force); the verdict stands, with the reason as a warning."""

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


@dataclass(kw_only=True, slots=True)
class Comparison:
    base: RunResult
    head: RunResult
    factor: float
    alpha: float
    cases: list[CaseComparison] = field(default_factory=list)
    """Cases ok on both sides, in base order (then head-only order)."""
    not_compared: list[NotCompared] = field(default_factory=list)

    def count(self, verdict: Verdict) -> int:
        return sum(c.verdict == verdict for c in self.cases)

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
        if self.count("contended"):
            parts.append(f"{self.count('contended')} contended")
        if self.not_compared:
            parts.append(f"{len(self.not_compared)} not compared")
        return ", ".join(parts)


def min_p_value(n_base: int, n_head: int) -> float:
    """The smallest two-sided Mann-Whitney U p-value that n_base vs n_head samples can reach (exact test,
    no ties): 2 / C(n_base + n_head, n_base). Below alpha no verdict but "~" is possible."""
    return min(1.0, 2.0 / math.comb(n_base + n_head, n_base))


def _differences(base: dict[str, Any], head: dict[str, Any], keys: Sequence[str]) -> list[str]:
    return [f"{k} {base.get(k)!r} vs {head.get(k)!r}" for k in keys if base.get(k) != head.get(k)]


def comparability(base_run: RunResult, base: CaseResult, head_run: RunResult, head: CaseResult) -> str | None:
    """Why the timings of one case on two sides must not be compared, or None when they may be.

    Two measurements of a case are comparable only when they come from
      - the same machine: hostname, CPU model, core count (CPU-side overheads and rank threads depend on it);
      - the same device: device type, device name, collective backend;
      - the same software below the code under test: torch (and torch-npu) version;
      - the same scenario definition for the case's scenario, ignoring SCENARIO_KEYS_IGNORED (keys that
        cannot change this case's numbers), and the same effective warmup;
      - the same torch threads per rank (recorded per case; on CPU it dominates the time).
    The git commit, branch and dirty flag are *what* is compared, so they never make a pair incomparable;
    neither does the launcher or the Python version. The reason names every difference found, e.g.
    "different machine (hostname 'vm' vs 'ci-3')".
    """
    reasons = []
    env_b, env_h = base_run.environment.to_dict(), head_run.environment.to_dict()
    for what, keys in (("machine", MACHINE_KEYS), ("device", DEVICE_KEYS), ("software", SOFTWARE_KEYS)):
        diff = _differences(env_b, env_h, keys)
        if diff:
            reasons.append(f"different {what} ({', '.join(diff)})")
    scenario = base.case.scenario
    def_b = base_run.scenarios.get(scenario, {})
    def_h = head_run.scenarios.get(scenario, {})
    keys = sorted((def_b.keys() | def_h.keys()) - SCENARIO_KEYS_IGNORED)
    diff = _differences(def_b, def_h, keys)
    if base.case.warmup != head.case.warmup:
        diff.append(f"warmup {base.case.warmup} vs {head.case.warmup}")
    if diff:
        reasons.append(f"different scenario {scenario} ({', '.join(diff)})")
    if base.threads_per_rank != head.threads_per_rank:
        reasons.append(f"different threads per rank ({base.threads_per_rank} vs {head.threads_per_rank})")
    return "; ".join(reasons) or None


def verdict(ratio: float, p_value: float, *, factor: float, alpha: float) -> Verdict:
    """better / worse only when the ratio passes the factor and the test is significant; else "~"."""
    if p_value < alpha and ratio >= factor:
        return "worse"
    if p_value < alpha and ratio <= 1.0 / factor:
        return "better"
    return "~"


def compare_case(
    base_run: RunResult,
    base: CaseResult,
    head_run: RunResult,
    head: CaseResult,
    *,
    factor: float,
    alpha: float,
    force: bool = False,
) -> CaseComparison:
    """Ratio, test and verdict of one case that is ok on both sides."""
    assert base.timing is not None and head.timing is not None and base.samples_s and head.samples_s
    ratio = head.timing.median_s / base.timing.median_s
    base_samples, head_samples = rank_max(base.samples_s), rank_max(head.samples_s)
    from scipy.stats import mannwhitneyu  # here, not at the top: scipy.stats takes ~1 s to import

    # Identical samples on both sides (e.g. one repeat each, equal): the test is undefined; nothing differs.
    p_value = (
        1.0
        if base_samples == head_samples
        else float(mannwhitneyu(head_samples, base_samples, alternative="two-sided").pvalue)
    )
    reason = comparability(base_run, base, head_run, head)
    shared = [r for r in (base, head) if r.contention is not None and r.contention.contended]
    if reason is not None and not force:
        result: Verdict = "not comparable"
    elif shared:
        result = "contended"  # a timing taken while the machine was shared says nothing about the code
    else:
        result = verdict(ratio, p_value, factor=factor, alpha=alpha)
    return CaseComparison(
        key=base.key,
        base=base,
        head=head,
        ratio=ratio,
        p_value=p_value,
        verdict=result,
        not_comparable=reason,
        forced=reason is not None and force,
    )


def compare_runs(
    base: RunResult,
    head: RunResult,
    *,
    factor: float = DEFAULT_FACTOR,
    alpha: float = DEFAULT_ALPHA,
    force: bool = False,
) -> Comparison:
    """Compare every case of the two runs (see the module docstring)."""
    if factor <= 1.0:
        raise ValueError(f"factor must be > 1 (e.g. 1.10 for 10%), got {factor}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be between 0 and 1 (e.g. 0.05), got {alpha}")
    out = Comparison(base=base, head=head, factor=factor, alpha=alpha)
    keys = list(dict.fromkeys([c.key for c in base.cases] + [c.key for c in head.cases]))
    for key in keys:
        b, h = base.get(key), head.get(key)
        if b is not None and h is not None and b.status == "ok" and h.status == "ok":
            out.cases.append(compare_case(base, b, head, h, factor=factor, alpha=alpha, force=force))
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
        out.not_compared.append(
            NotCompared(key=key, base_status=b_status, head_status=h_status, reason=reason)
        )
    return out
