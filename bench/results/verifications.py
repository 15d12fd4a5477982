"""What `bench verify` stores: one typed record per case, in the run's result file (RunResult.verifications).

- LayerVerification: the CP layer against the full-sequence single-device reference, one comparison per seed
  (gdn_cp.accuracy.LayerComparison), judged against the bars that applied (gdn_cp.accuracy.Thresholds).
- TrainVerification: the hybrid model trained under CP against the single-rank reference, per step: loss and
  global gradient norm of both, and whether every parameter was bit-identical before step 0.

Failures are computed from the stored numbers and bars (`failures()`), so a record cannot disagree with
itself; `passed` is also written out for people reading the file. Error growth over a trajectory is
`error_growth` (see its docstring for the criterion).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Literal

import numpy as np
import torch
from pydantic import Field, computed_field
from scipy import stats

from bench.records import DROP_DERIVED
from bench.results.env import now_iso
from bench.suite.config import Case, TrainSettings
from gdn_cp.accuracy import LayerComparison, Thresholds, TrainThresholds

VerifyStatus = Literal["ok", "failed", "skipped"]
"""ok: the case ran (whether it passed is `passed`); failed: a rank raised, died or timed out (`error`);
skipped: not run (under torchrun, a case of another cp; `error` says why)."""

GROWTH_FACTOR = 2.0
"""A trajectory's error "grows" when its fitted trend (`error_growth`) multiplies it by more than this from
the first step to the last, and the trend is significant (GROWTH_ALPHA)."""
FLOOR_FACTOR = 3.0
"""A trajectory's bar is at least this multiple of the dtype's own spread (`TrainVerification.bar`): in bf16
a model as small as cpu-verify's moves its gradient norm by 0.5-2.4% between two single-rank runs that
differ only in rounding order (AdamW turns near-zero gradients' rounding into whole steps), above the
reference PR's 1% bar; CP's difference is of that kind, and the largest of a few steps' errors varies by
about this factor between two such runs."""
GROWTH_ALPHA = 0.01
"""One-sided significance of Kendall's test for an upward trend of the log errors over the steps: flat
noise, however large, is not called growth (a ratio of two thirds' maxima was, at 30 steps)."""
GROWTH_FLOOR = 4 * torch.finfo(torch.float32).eps
"""Relative errors below this (about 4.8e-7) are fp32 rounding of the loss itself; growth compares
max(error, floor), so that exact agreement at the start (an error of 0) does not make noise look like
growth."""


@dataclass(kw_only=True, slots=True)
class LayerVerification:
    """One case of `bench verify`: the CP layer against the full-sequence reference, for every seed."""

    case: Case
    """The case (mode, checkpoint, cp, seq_len, dtype, layer dims); its pass is always forward_backward."""
    status: VerifyStatus
    """ok or failed (see VerifyStatus)."""
    seeds: list[int] = field(default_factory=list)
    """Seeds of weights, input and output gradient, one comparison each."""
    comparisons: list[LayerComparison] = field(default_factory=list)
    """Per seed, in the order of `seeds` (ok only)."""
    thresholds: dict[str, float] = field(default_factory=dict)
    """The bars that applied (the fields of gdn_cp.accuracy.Thresholds)."""
    error: str | None = None
    """failed: the first failing rank and its error; skipped: why."""
    wall_s: float = 0.0
    """Wall time of the launch."""
    finished_at: str = field(default_factory=now_iso)
    kind: Literal["layer"] = "layer"
    """The record's kind: a layer comparison."""

    _derived = DROP_DERIVED

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.case.key()}"

    def failures(self) -> list[tuple[int, list[str]]]:
        """(seed, the metrics above their bars) for every seed that failed; empty: all passed (or not run)."""
        if self.status != "ok":
            return []
        bars = Thresholds(**self.thresholds)
        out = [(seed, c.failures(bars)) for seed, c in zip(self.seeds, self.comparisons, strict=True)]
        return [(seed, f) for seed, f in out if f]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def passed(self) -> bool:
        """ok and no metric above its bar (derived)."""
        return self.status == "ok" and not self.failures()


def relative_errors(actual: Sequence[float], reference: Sequence[float]) -> list[float]:
    """|a - r| / |r| per step (inf where r is 0 and a is not; nan stays nan, and fails every bar)."""
    out = []
    for a, r in zip(actual, reference, strict=True):
        diff = abs(a - r)
        out.append(diff / abs(r) if r != 0 else (0.0 if diff == 0 else math.inf))
    return out


def _log_errors(errors: Sequence[float]) -> np.ndarray:
    return np.log(np.maximum(np.asarray(errors, dtype=float), GROWTH_FLOOR))


def error_growth(errors: Sequence[float]) -> float | None:
    """How much a per-step error grew over a trajectory along its trend: exp(the Theil-Sen slope of the log
    errors, each at least GROWTH_FLOOR, per step x the steps between the first and the last). None with
    fewer than 3 steps. Robust to single noisy steps (a median of pairwise slopes) and independent of the
    error's scale; `growth_p_value` says whether the trend is more than noise."""
    if len(errors) < 3:
        return None
    logs = _log_errors(errors)
    if np.ptp(logs) == 0:
        return 1.0
    slope = float(stats.theilslopes(logs, np.arange(logs.size)).slope)
    return math.exp(slope * (logs.size - 1))


def growth_p_value(errors: Sequence[float]) -> float | None:
    """The one-sided p-value of Kendall's test that the log errors rise with the steps; None with fewer than
    3 steps, 1.0 when they are all equal."""
    if len(errors) < 3:
        return None
    logs = _log_errors(errors)
    if np.ptp(logs) == 0:
        return 1.0
    return float(stats.kendalltau(np.arange(logs.size), logs, alternative="greater").pvalue)


def grows(errors: Sequence[float]) -> bool:
    """The error grows with the steps: its trend multiplies it by more than GROWTH_FACTOR and is
    significant at GROWTH_ALPHA."""
    factor, p = error_growth(errors), growth_p_value(errors)
    return factor is not None and p is not None and factor > GROWTH_FACTOR and p < GROWTH_ALPHA


@dataclass(kw_only=True, slots=True)
class Trajectory:
    """What one trajectory run measured, identical on every rank (bench.verification.train_rank returns
    it); a TrainVerification is one with the case and its outcome."""

    grad_reduction: str | None = None
    """How CP gradients were summed over the ranks: fsdp2 or all_reduce."""
    params_checked: int = 0
    """Parameter tensors compared before step 0."""
    mismatched_params: list[str] = field(default_factory=list)
    """Parameters whose CP copy was not bit-identical to the reference's before step 0 (empty: all equal)."""
    ref_loss: list[float] = field(default_factory=list)
    """Per step: the reference's loss (global mean cross-entropy)."""
    cp_loss: list[float] = field(default_factory=list)
    """Per step: the CP model's loss (the sum of the ranks' shares)."""
    ref_grad_norm: list[float] = field(default_factory=list)
    """Per step: the reference's global gradient L2 norm (computed in fp64)."""
    cp_grad_norm: list[float] = field(default_factory=list)
    """Per step: the CP model's global gradient L2 norm after the reduction over ranks (fp64)."""
    floor_loss: list[float] = field(default_factory=list)
    """Per step: the loss of a second single-rank reference, the same weights and batches at another chunk
    size (the same math in another rounding order): how far the dtype alone moves a trajectory. Empty in
    files written before it was measured."""
    floor_grad_norm: list[float] = field(default_factory=list)
    """Per step: that second reference's gradient norm."""


@dataclass(kw_only=True, slots=True)
class TrainVerification(Trajectory):
    """One case of `bench verify --train`: the hybrid model under CP against the single-rank reference
    (the measured fields are Trajectory's, empty unless the case ran)."""

    case: Case
    """The case (mode, checkpoint, cp, seq_len, dtype and the GDN dims of the model)."""
    status: VerifyStatus
    """ok or failed (see VerifyStatus)."""
    steps: int
    """Optimizer steps."""
    settings: TrainSettings = field(default_factory=TrainSettings)
    """The model and optimizer settings."""
    thresholds: dict[str, float] = field(default_factory=dict)
    """The bars that applied (the fields of gdn_cp.accuracy.TrainThresholds)."""
    error: str | None = None
    """failed: the first failing rank and its error; skipped: why."""
    wall_s: float = 0.0
    finished_at: str = field(default_factory=now_iso)
    kind: Literal["train"] = "train"
    """The record's kind: a training trajectory."""

    _derived = DROP_DERIVED

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.case.key()}"

    @property
    def loss_abs(self) -> list[float]:
        return [abs(a - r) for a, r in zip(self.cp_loss, self.ref_loss, strict=True)]

    @property
    def loss_rel(self) -> list[float]:
        return relative_errors(self.cp_loss, self.ref_loss)

    @property
    def grad_norm_abs(self) -> list[float]:
        return [abs(a - r) for a, r in zip(self.cp_grad_norm, self.ref_grad_norm, strict=True)]

    @property
    def grad_norm_rel(self) -> list[float]:
        return relative_errors(self.cp_grad_norm, self.ref_grad_norm)

    @property
    def floor_loss_rel(self) -> list[float]:
        """Per step: the second reference's loss against the reference's (the dtype's own spread)."""
        return relative_errors(self.floor_loss, self.ref_loss[: len(self.floor_loss)])

    @property
    def floor_grad_norm_rel(self) -> list[float]:
        return relative_errors(self.floor_grad_norm, self.ref_grad_norm[: len(self.floor_grad_norm)])

    def bar(self, configured: float, floor: Sequence[float]) -> float:
        """The bar a trajectory's error is held to: the configured one, or FLOOR_FACTOR x the dtype's own
        largest spread (`floor`) where that is larger: CP is not asked to agree with the reference better
        than the reference agrees with itself in another rounding order."""
        return max(configured, FLOOR_FACTOR * max(floor, default=0.0))

    @property
    def loss_growth(self) -> float | None:
        return error_growth(self.loss_rel)

    @property
    def grad_norm_growth(self) -> float | None:
        return error_growth(self.grad_norm_rel)

    @property
    def grows(self) -> bool:
        """Whether either relative error grows with the steps (`grows`; reported, not a failure)."""
        return grows(self.loss_rel) or grows(self.grad_norm_rel)

    def failures(self) -> list[str]:
        """Every failed check: unequal initial weights, non-finite values, errors above the bars."""
        if self.status != "ok":
            return []
        out = [
            f"param {name}: not identical to the reference before step 0" for name in self.mismatched_params
        ]
        bars = TrainThresholds(**self.thresholds)
        values = (*self.ref_loss, *self.cp_loss, *self.ref_grad_norm, *self.cp_grad_norm)
        if not all(math.isfinite(v) for v in values):
            out.append("loss or grad norm has non-finite values")
        for name, errors, configured, floor in (
            ("train_loss_rel", self.loss_rel, bars.loss_rel, self.floor_loss_rel),
            ("train_grad_norm_rel", self.grad_norm_rel, bars.grad_norm_rel, self.floor_grad_norm_rel),
        ):
            worst, bar = max(errors, default=0.0), self.bar(configured, floor)
            if not worst <= bar:  # NaN fails too
                step = errors.index(worst) if worst in errors else 0
                derived = f" ({FLOOR_FACTOR:g}x the dtype's own spread)" if bar > configured else ""
                out.append(f"{name} {worst:.3e} > {bar:.1e}{derived} (step {step})")
        return out

    @computed_field  # type: ignore[prop-decorator]
    @property
    def passed(self) -> bool:
        """ok and no failed check (derived)."""
        return self.status == "ok" and not self.failures()


Verification = Annotated[LayerVerification | TrainVerification, Field(discriminator="kind")]
"""Any record of `bench verify`, told apart by its `kind`."""


def run_name(scenarios: Sequence[str], *, train: bool) -> str:
    """The name of a verify run (RunResult.name, and the end of its default file name)."""
    return ("verify-train-" if train else "verify-") + "+".join(scenarios)
