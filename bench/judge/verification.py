"""Verification records arranged like the reference PR's accuracy tables (sections 1 and 2), as numbers.

- `layer_groups`: one group per scenario, CP degree, dtype, sequence length, batch, layout and documents;
  one `LayerRow` per case with each metric's maximum over the case's seeds (the reference PR's per-mode
  table).
- `sweep_rows`: over every case and seed of a group, each metric's maximum against its bar, with the margin
  bar / maximum (the PR's 100-seed table), and `smallest_reference_gradient`: which parameter had the
  smallest reference gradient (max-abs and L2 norm), the denominators of the relative errors.
- `train_groups`: the trajectory records by scenario, CP degree, dtype, sequence length and steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from bench.judge.reference import mixes_checkpoint
from bench.results.verifications import LayerVerification, TrainVerification, Verification
from bench.suite.documents import documents_tag
from gdn_cp.accuracy import LayerComparison, Thresholds
from gdn_cp.distributed import DEFAULT_LAYOUT, mode_order


def _case_order(record: Verification) -> tuple:
    c = record.case
    return (mode_order(c.mode), c.checkpoint is False)


@dataclass(frozen=True, slots=True)
class GroupKey:
    """What the cases of one table share."""

    scenario: str
    cp: int
    dtype: str
    seq_len: int
    batch: int
    layout: str = DEFAULT_LAYOUT
    documents: str = "none"
    """The documents' tag (bench.suite.documents.documents_tag): `none`, or e.g. `docs64-lognormal`."""


def _key(record: Verification) -> GroupKey:
    c = record.case
    return GroupKey(
        scenario=c.scenario,
        cp=c.cp,
        dtype=c.dtype,
        seq_len=c.seq_len,
        batch=c.batch,
        layout=c.layout,
        documents=documents_tag(c.documents),
    )


@dataclass(kw_only=True, slots=True)
class LayerRow:
    """One case: each metric's maximum over its seeds."""

    record: LayerVerification
    output_max_abs: float
    input_grad_max_abs: float
    input_grad_rel_l2: float
    worst_param: str
    """The parameter with the largest gradient relative L2 error over the seeds."""
    worst_param_rel_l2: float
    grad_norm_rel: float

    @classmethod
    def of(cls, record: LayerVerification) -> LayerRow:
        cs = record.comparisons
        name, stats = max((c.worst_param for c in cs), key=lambda kv: kv[1].rel_l2)
        return cls(
            record=record,
            output_max_abs=max(c.output.max_abs for c in cs),
            input_grad_max_abs=max(c.input_grad.max_abs for c in cs),
            input_grad_rel_l2=max(c.input_grad.rel_l2 for c in cs),
            worst_param=name,
            worst_param_rel_l2=stats.rel_l2,
            grad_norm_rel=max(c.grad_norm_rel for c in cs),
        )


@dataclass(kw_only=True, slots=True)
class LayerGroup:
    key: GroupKey
    rows: list[LayerRow] = field(default_factory=list)

    @property
    def seeds(self) -> list[int]:
        return sorted({s for r in self.rows for s in r.record.seeds})

    @property
    def comparisons(self) -> list[LayerComparison]:
        return [c for r in self.rows for c in r.record.comparisons]

    @property
    def thresholds(self) -> Thresholds:
        """The bars of the group's cases (one dtype, one scenario: the same for every case)."""
        return Thresholds(**self.rows[0].record.thresholds)

    @property
    def shows_checkpoint(self) -> bool:
        return mixes_checkpoint(r.record.case.checkpoint for r in self.rows)


def layer_groups(records: Iterable[Verification]) -> list[LayerGroup]:
    """The layer records that ran (status ok), grouped in first-seen order, rows in mode order."""
    groups: dict[GroupKey, LayerGroup] = {}
    for r in records:
        if isinstance(r, LayerVerification) and r.status == "ok" and r.comparisons:
            groups.setdefault(_key(r), LayerGroup(key=_key(r))).rows.append(LayerRow.of(r))
    for g in groups.values():
        g.rows.sort(key=lambda row: _case_order(row.record))
    return list(groups.values())


@dataclass(frozen=True, slots=True)
class SweepRow:
    """One metric over every case and seed of a group."""

    metric: str
    maximum: float
    threshold: float

    @property
    def margin(self) -> float:
        """threshold / maximum (inf when the maximum is 0): how far below its bar the metric stayed."""
        return self.threshold / self.maximum if self.maximum > 0 else float("inf")


def sweep_rows(comparisons: Sequence[LayerComparison], bars: Thresholds) -> list[SweepRow]:
    """The reference PR's sweep table: each metric's maximum over `comparisons`, its bar, the margin."""

    def most(values: Iterable[float]) -> float:
        return max(values, default=0.0)

    io = [s for c in comparisons for s in (c.output, c.input_grad)]
    params = [s for c in comparisons for s in c.params.values()]
    return [
        SweepRow("output max abs", most(c.output.max_abs for c in comparisons), bars.output_max_abs),
        SweepRow(
            "input-grad max abs", most(c.input_grad.max_abs for c in comparisons), bars.input_grad_max_abs
        ),
        SweepRow("output/input max relative to reference scale", most(s.rel_max for s in io), bars.rel_max),
        SweepRow("output/input relative-L2", most(s.rel_l2 for s in io), bars.rel_l2),
        SweepRow(
            "per-param grad max relative to reference scale",
            most(s.rel_max for s in params),
            bars.param_rel_max,
        ),
        SweepRow("worst per-param grad relative-L2", most(s.rel_l2 for s in params), bars.param_rel_l2),
        SweepRow("grad-norm relative diff", most(c.grad_norm_rel for c in comparisons), bars.grad_norm_rel),
    ]


@dataclass(frozen=True, slots=True)
class SmallestGradient:
    """Which parameter had the smallest reference gradient over a sweep (the denominators of the relative
    errors)."""

    min_absmax: float
    """Smallest reference max-abs of any parameter gradient, over every comparison."""
    min_absmax_param: str
    min_l2: float
    """Smallest reference L2 norm of any parameter gradient."""
    min_l2_param: str
    max_param_abs_error: float
    """Largest raw parameter-gradient max-abs error: printed for diagnosis, not a bar (as in the PR)."""
    max_param_abs_error_param: str


def smallest_reference_gradient(comparisons: Sequence[LayerComparison]) -> SmallestGradient | None:
    params = [(name, s) for c in comparisons for name, s in c.params.items()]
    if not params:
        return None
    absmax_name, absmax = min(params, key=lambda kv: kv[1].ref_absmax)
    l2_name, l2 = min(params, key=lambda kv: kv[1].ref_l2)
    err_name, err = max(params, key=lambda kv: kv[1].max_abs)
    return SmallestGradient(
        min_absmax=absmax.ref_absmax,
        min_absmax_param=absmax_name,
        min_l2=l2.ref_l2,
        min_l2_param=l2_name,
        max_param_abs_error=err.max_abs,
        max_param_abs_error_param=err_name,
    )


@dataclass(kw_only=True, slots=True)
class TrainGroup:
    key: GroupKey
    steps: int
    records: list[TrainVerification] = field(default_factory=list)

    @property
    def shows_checkpoint(self) -> bool:
        return mixes_checkpoint(r.case.checkpoint for r in self.records)


def train_groups(records: Iterable[Verification]) -> list[TrainGroup]:
    """The trajectory records that ran (status ok), grouped in first-seen order, in mode order."""
    groups: dict[tuple[GroupKey, int], TrainGroup] = {}
    for r in records:
        if isinstance(r, TrainVerification) and r.status == "ok":
            k = (_key(r), r.steps)
            groups.setdefault(k, TrainGroup(key=_key(r), steps=r.steps)).records.append(r)
    for g in groups.values():
        g.records.sort(key=_case_order)
    return list(groups.values())


def not_verified(records: Iterable[Verification]) -> list[Verification]:
    """Records of cases that did not run (failed or skipped), in run order."""
    return [r for r in records if r.status != "ok"]
