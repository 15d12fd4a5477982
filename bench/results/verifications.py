"""What `bench verify` stores: one typed record per case, in the run's result file (RunResult.verifications).

- LayerVerification: the CP layer against the full-sequence single-device reference, one comparison per seed
  (gdn_cp.accuracy.LayerComparison), judged against the bars that applied (gdn_cp.accuracy.Thresholds).
- TrainVerification: the hybrid model trained under CP against the single-rank reference, per step: loss and
  global gradient norm of both, and whether every parameter was bit-identical before step 0; and the first
  step on "state" inputs (`FirstStep`), against its own bar.

Power: every record also holds the runs of its check with CP broken on purpose (gdn_cp.distributed.mutants,
one mutant at a time on rank 1: `LayerMutant`, `TrainMutant`); `power()` says which the check caught
(`MutantVerdict`), and `no_power_against` which it passed: such a check is reported "pass, no power against:
...", never a plain pass.

Failures and power are computed from the stored numbers and bars (`failures()`, `power()`), so a record
cannot disagree with itself; `passed` and `power` are also written out for people reading the file. Error
growth over a trajectory is `error_growth` (see its docstring for the criterion).
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
from gdn_cp.distributed.mutants import BY_NAME
from gdn_cp.ops.backends.mutants import BY_NAME as BACKEND_MUTANTS
from gdn_cp.ops.ran import Ran

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


@dataclass(frozen=True, slots=True)
class MutantVerdict:
    """Whether a check caught one mutant (derived from the stored numbers and bars)."""

    mutant: str
    """The mutant's name (gdn_cp.distributed.mutants.MUTANTS, or a backend's: gdn_cp.ops.backends.mutants)."""
    description: str
    caught: bool
    by: str | None = None
    """The first failing metric that caught it (None: it passed the check)."""


def _description(name: str) -> str:
    mutant = BY_NAME.get(name) or BACKEND_MUTANTS.get(name)
    return mutant.description if mutant is not None else name


@dataclass(kw_only=True, slots=True)
class LayerMutant:
    """One mutant (gdn_cp.distributed.mutants) through a layer check: the first seed's comparison on the
    "state" inputs packed in documents (LayerVerification.packed's, or the case's own documents), with the
    mutant on rank 1."""

    name: str
    comparison: LayerComparison


@dataclass(kw_only=True, slots=True)
class LayerRuns:
    """What one layer check measured, identical on every rank (bench.verification.layer_rank returns it);
    a LayerVerification is one with the case and its outcome."""

    inputs: str = "state"
    """How `comparisons` drew their weights (gdn_cp.accuracy.INPUT_KINDS): "state", decays that make the
    state entering a rank matter; "random" (the reference PR's) in files before inputs were chosen."""
    comparisons: list[LayerComparison] = field(default_factory=list)
    """Per seed, in the order of `seeds` (ok only): the case's sequence (unpacked, or its documents)."""
    packed: list[LayerComparison] = field(default_factory=list)
    """Per seed, for a case without documents of its own: the same inputs packed in documents that cross
    every rank edge (gdn_cp.accuracy.edge_documents), so that a boundary can be moved; else empty."""
    reproduction: list[LayerComparison] = field(default_factory=list)
    """Per seed: the reference PR's "random" inputs on the case's sequence, judged by the same bars (its
    table); empty in files before inputs were chosen."""
    mutants: list[LayerMutant] = field(default_factory=list)
    """The check's runs with CP broken on purpose, one per mutant that applies to the case (empty: none
    ran, at cp 1 or in older files)."""


@dataclass(kw_only=True, slots=True)
class LayerVerification(LayerRuns):
    """One case of `bench verify`: the CP layer against the full-sequence reference, for every seed (the
    measured fields are LayerRuns', empty unless the case ran)."""

    case: Case
    """The case (mode, checkpoint, cp, seq_len, dtype, layer dims); its pass is always forward_backward."""
    status: VerifyStatus
    """ok or failed (see VerifyStatus)."""
    seeds: list[int] = field(default_factory=list)
    """Seeds of weights, input and output gradient, one comparison each."""
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
        """(seed, the metrics above their bars) for every seed that failed; empty: all passed (or not run).
        A metric of the packed inputs is prefixed "packed: ", of the reference PR's "PR inputs: "."""
        if self.status != "ok":
            return []
        bars = Thresholds(**self.thresholds)
        out = []
        for i, (seed, c) in enumerate(zip(self.seeds, self.comparisons, strict=True)):
            failures = c.failures(bars)
            for prefix, extra in (("packed: ", self.packed), ("PR inputs: ", self.reproduction)):
                if i < len(extra):
                    failures += [prefix + f for f in extra[i].failures(bars)]
            out.append((seed, failures))
        return [(seed, f) for seed, f in out if f]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def passed(self) -> bool:
        """ok and no metric above its bar (derived)."""
        return self.status == "ok" and not self.failures()

    @computed_field  # type: ignore[prop-decorator]
    @property
    def power(self) -> list[MutantVerdict]:
        """Per mutant run, whether the check caught it: a metric of its comparison above the bars
        (derived)."""
        bars = Thresholds(**self.thresholds)
        out = []
        for m in self.mutants:
            failures = m.comparison.failures(bars)
            out.append(MutantVerdict(m.name, _description(m.name), bool(failures), (failures or [None])[0]))
        return out

    @property
    def no_power_against(self) -> list[str]:
        """The mutants a passing check did not catch, by description (empty when it failed or did not run)."""
        return no_power_against(self)


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
class FirstStep:
    """One step of the reference (rank 0) and the CP model from identical weights whose GDN layers draw
    "state" decays (gdn_cp.accuracy.state_inputs over the ranks' shards), before any optimizer step: where
    the state entering a rank carries a share of every GDN layer's output, and nothing has yet amplified
    rounding. Judged by TrainThresholds.first_loss_rel, first_grad_norm_rel and first_gdn_output_rel_l2, set
    per dtype."""

    ref_loss: float
    cp_loss: float
    ref_grad_norm: float
    cp_grad_norm: float
    gdn_output_rel_l2: float
    """The first GDN layer's output over the whole sequence (the one nearest the input, whose input is still
    the reference's): ||cp - ref|| / ||ref||. The layer check's output bar inside the model: in bf16 the
    loss and the gradient norm carry the rounding of every layer, which hides a state 1% off on one rank;
    this output does not."""


@dataclass(kw_only=True, slots=True)
class TrainMutant:
    """One mutant (gdn_cp.distributed.mutants, on rank 1) through the training check: the CP model's first
    step on the "state" model (against FirstStep's reference) and on the trajectory's model (against its
    step 0, at the trajectory's bar)."""

    name: str
    first_loss: float
    """The "state" model's loss with the mutant on."""
    first_grad_norm: float
    first_gdn_output_rel_l2: float
    """Its first GDN layer's output rel-L2 against FirstStep's reference."""
    loss: float
    """The trajectory's model: its step-0 loss with the mutant on."""
    grad_norm: float


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
    ran: list[Ran] | None = None
    """What the CP model's first step ran on rank 0, a call per GDN layer (gdn_cp.ops.ran), checked against
    the case before the trajectory counted (bench.measure.gate); None in files before version 7."""
    first: FirstStep | None = None
    """The first step of a second pair of models whose GDN layers draw "state" decays (the check with power:
    `FirstStep`); None in files before it was measured."""
    mutants: list[TrainMutant] = field(default_factory=list)
    """The first steps with CP broken on purpose, one per mutant that applies to the case."""


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

    @property
    def loss_bar(self) -> float:
        """The trajectory's loss bar: configured, or FLOOR_FACTOR x the dtype's own spread (`bar`)."""
        return self.bar(TrainThresholds(**self.thresholds).loss_rel, self.floor_loss_rel)

    @property
    def grad_norm_bar(self) -> float:
        return self.bar(TrainThresholds(**self.thresholds).grad_norm_rel, self.floor_grad_norm_rel)

    @property
    def first_loss_rel(self) -> float | None:
        """The first step's loss error on the "state" model (None: not measured)."""
        if self.first is None:
            return None
        return relative_errors([self.first.cp_loss], [self.first.ref_loss])[0]

    @property
    def first_grad_norm_rel(self) -> float | None:
        if self.first is None:
            return None
        return relative_errors([self.first.cp_grad_norm], [self.first.ref_grad_norm])[0]

    def _over_first(self, loss: float, grad_norm: float, gdn_output_rel_l2: float) -> list[str]:
        """The first-step bars a "state" model's (loss, grad norm, first GDN layer's output rel-L2) breaks,
        against FirstStep's reference."""
        assert self.first is not None
        bars = TrainThresholds(**self.thresholds)
        errors = (
            ("train_first_loss_rel", relative_errors([loss], [self.first.ref_loss])[0], bars.first_loss_rel),
            (
                "train_first_grad_norm_rel",
                relative_errors([grad_norm], [self.first.ref_grad_norm])[0],
                bars.first_grad_norm_rel,
            ),
            ("train_first_gdn_output_rel_l2", gdn_output_rel_l2, bars.first_gdn_output_rel_l2),
        )
        return [
            f"{name} {error:.3e} > {bar:.1e} (first step, state inputs)"
            for name, error, bar in errors
            if not error <= bar  # NaN fails too
        ]

    def _over_trajectory(self, loss: float, grad_norm: float) -> list[str]:
        """The trajectory bars a step-0 (loss, grad norm) of its model breaks, against its reference."""
        out = []
        for name, (value, ref), bar in (
            ("train_loss_rel", (loss, self.ref_loss[0]), self.loss_bar),
            ("train_grad_norm_rel", (grad_norm, self.ref_grad_norm[0]), self.grad_norm_bar),
        ):
            error = relative_errors([value], [ref])[0]
            if not error <= bar:
                out.append(f"{name} {error:.3e} > {bar:.1e} (step 0)")
        return out

    def failures(self) -> list[str]:
        """Every failed check: unequal initial weights, non-finite values, errors above the bars (the
        trajectory's, and the first step's on the "state" model)."""
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
        if self.first is not None:
            out += self._over_first(self.first.cp_loss, self.first.cp_grad_norm, self.first.gdn_output_rel_l2)
        return out

    @computed_field  # type: ignore[prop-decorator]
    @property
    def passed(self) -> bool:
        """ok and no failed check (derived)."""
        return self.status == "ok" and not self.failures()

    def mutant_bars(self, mutant: TrainMutant) -> tuple[list[str], list[str]]:
        """(the first-step bars, the trajectory's bars at step 0) that `mutant`'s runs break."""
        first = []
        if self.first is not None:
            m = mutant
            first = self._over_first(m.first_loss, m.first_grad_norm, m.first_gdn_output_rel_l2)
        trajectory = self._over_trajectory(mutant.loss, mutant.grad_norm) if self.ref_loss else []
        return first, trajectory

    @computed_field  # type: ignore[prop-decorator]
    @property
    def power(self) -> list[MutantVerdict]:
        """Per mutant run, whether the check caught it: its first step on the "state" model above the
        first-step bars, or its step 0 on the trajectory's model above the trajectory's bars (derived)."""
        out = []
        for m in self.mutants:
            first, trajectory = self.mutant_bars(m)
            caught = first + trajectory
            out.append(MutantVerdict(m.name, _description(m.name), bool(caught), (caught or [None])[0]))
        return out

    @property
    def no_power_against(self) -> list[str]:
        """The mutants a passing check did not catch, by description (empty when it failed or did not run)."""
        return no_power_against(self)


def no_power_against(record: LayerVerification | TrainVerification) -> list[str]:
    """The descriptions of the mutants `record`'s check passed, when the check itself passed; empty
    otherwise (a failing check's verdict is its failure)."""
    if not record.passed:
        return []
    return [v.description for v in record.power if not v.caught]


Verification = Annotated[LayerVerification | TrainVerification, Field(discriminator="kind")]
"""Any record of `bench verify`, told apart by its `kind`."""


def run_name(scenarios: Sequence[str], *, train: bool) -> str:
    """The name of a verify run (RunResult.name, and the end of its default file name)."""
    return ("verify-train-" if train else "verify-") + "+".join(scenarios)
