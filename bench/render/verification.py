"""Verification tables, built once as plain cells (bench.render.tables.TableData) and rendered twice: rich
(the terminal: `print_tables`) and report blocks (bench.render.document.document_blocks).

Per layer group (scenario, CP degree, dtype, sequence length, layout, documents): the PR's table, mode |
output max abs | input-grad max abs | input-grad rel-L2 | worst param (name) rel-L2 | grad-norm rel diff |
pass, each cell the maximum over the case's seeds, and the failing metrics by name. With several seeds also
the PR's sweep table, metric | N-seed maximum | threshold | margin, and which parameter had the smallest
reference gradient.
Per trajectory group: mode | max loss abs | max loss rel | max grad-norm abs | max grad-norm rel | error
growth | pass, whether the initial weights were identical, and per step (short runs) both models' numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.errors import first_line
from bench.judge.verification import (
    GroupKey,
    LayerGroup,
    TrainGroup,
    layer_groups,
    not_verified,
    smallest_reference_gradient,
    sweep_rows,
    train_groups,
)
from bench.render.formats import format_checkpoint, format_tokens
from bench.render.tables import TableData
from bench.results.verifications import (
    FLOOR_FACTOR,
    GROWTH_ALPHA,
    GROWTH_FACTOR,
    LayerVerification,
    TrainVerification,
    Verification,
)
from gdn_cp.accuracy import TrainThresholds
from gdn_cp.distributed import DEFAULT_LAYOUT

MAX_LISTED_FAILURES = 6
"""Failing metrics listed per case and seed; the rest are counted."""
PER_STEP_TABLE_STEPS = 10
"""Trajectories of at most this many steps also get a per-step table."""


def sci(x: float) -> str:
    """The reference PR's number format: 4.0091e-03."""
    return f"{x:.4e}"


def margin(x: float) -> str:
    return "inf" if x == float("inf") else f"{x:.1f}x"


def _dims(key: GroupKey, record: Verification) -> str:
    c = record.case.layer
    return (
        f"{_short(key)}, batch {key.batch} "
        f"(hidden {c.hidden_size}, K/V heads {c.num_k_heads}/{c.num_v_heads}, "
        f"head dims {c.head_k_dim}/{c.head_v_dim})"
    )


def _short(key: GroupKey) -> str:
    layout = "" if key.layout == DEFAULT_LAYOUT else f", {key.layout} layout"
    documents = "" if key.documents == "none" else f", {key.documents}"
    seq = format_tokens(key.seq_len)
    return f"{key.scenario}: CP{key.cp}, {key.dtype}, global seq {seq}{layout}{documents}"


def _verdict(passed: bool) -> str:
    return "pass" if passed else "FAIL"


def _failure_lines(record: LayerVerification) -> list[str]:
    lines = []
    for seed, failures in record.failures():
        shown = "; ".join(failures[:MAX_LISTED_FAILURES])
        more = len(failures) - MAX_LISTED_FAILURES
        lines.append(
            f"FAIL {record.case.case_id} seed {seed}: {shown}" + (f" (and {more} more)" if more > 0 else "")
        )
    return lines


def layer_table(group: LayerGroup) -> TableData:
    seeds = group.seeds
    seeds_text = f"seed {seeds[0]}" if len(seeds) == 1 else f"{len(seeds)} seeds, max over seeds"
    headers = ["mode"]
    if group.shows_checkpoint:
        headers.append("summary ckpt")
    headers += [
        "output max abs",
        "input-grad max abs",
        "input-grad rel-L2",
        "worst param (name) rel-L2",
        "grad-norm rel diff",
        "pass",
    ]
    table = TableData(
        title=f"{_dims(group.key, group.rows[0].record)}; {seeds_text}",
        headers=headers,
        numeric=set(range(len(headers) - 6, len(headers) - 1)),
        verdict_column=len(headers) - 1,
    )
    for row in group.rows:
        cells = [row.record.case.mode]
        if group.shows_checkpoint:
            cells.append(format_checkpoint(row.record.case.checkpoint))
        cells += [
            sci(row.output_max_abs),
            sci(row.input_grad_max_abs),
            sci(row.input_grad_rel_l2),
            f"{sci(row.worst_param_rel_l2)} ({row.worst_param})",
            sci(row.grad_norm_rel),
            _verdict(row.record.passed),
        ]
        table.rows.append(cells)
        table.notes += _failure_lines(row.record)
    t = group.thresholds
    table.notes.append(
        f"bars: output/input max abs <= {t.output_max_abs:g} / {t.input_grad_max_abs:g}, max/ref abs-max <= "
        f"{t.rel_max:g}, rel-L2 <= {t.rel_l2:g}; every param grad: max/ref abs-max <= {t.param_rel_max:g}, "
        f"rel-L2 <= {t.param_rel_l2:g}, present and finite; grad-norm rel diff <= {t.grad_norm_rel:g}"
    )
    return table


def sweep_table(group: LayerGroup) -> TableData:
    comparisons = group.comparisons
    n = len(group.seeds)
    modes = ", ".join(dict.fromkeys(r.record.case.mode for r in group.rows))
    failed = sum(len(r.record.failures()) for r in group.rows)
    table = TableData(
        title=f"{_short(group.key)}: {n}-seed sweep over {modes}",
        headers=["metric", f"{n}-seed maximum", "threshold", "margin"],
        numeric={1, 2, 3},
    )
    for row in sweep_rows(comparisons, group.thresholds):
        table.rows.append([row.metric, sci(row.maximum), f"{row.threshold:g}", margin(row.margin)])
    verdict = "all passed" if failed == 0 else f"{failed} failed"
    table.notes.append(
        f"{len(comparisons)} forward+backward comparisons ({n} seeds x {len(group.rows)} cases): {verdict}"
    )
    smallest = smallest_reference_gradient(comparisons)
    if smallest is not None:
        table.notes.append(
            f"smallest reference parameter gradient: min max-abs {sci(smallest.min_absmax)} "
            f"({smallest.min_absmax_param}), min L2 norm {sci(smallest.min_l2)} ({smallest.min_l2_param})"
        )
        table.notes.append(
            f"raw param-grad max-abs error (diagnostic, not a bar): {sci(smallest.max_param_abs_error)} "
            f"({smallest.max_param_abs_error_param})"
        )
    return table


def _growth(record: TrainVerification) -> str:
    loss, norm = record.loss_growth, record.grad_norm_growth
    if loss is None or norm is None:
        return "n/a (< 3 steps)"
    word = "grows" if record.grows else "no trend"
    return f"{word} (loss x{loss:.2f}, grad norm x{norm:.2f})"


def train_table(group: TrainGroup) -> TableData:
    first = group.records[0]
    s = first.settings
    reductions = "/".join(sorted({r.grad_reduction or "?" for r in group.records}))
    headers = ["mode"]
    if group.shows_checkpoint:
        headers.append("summary ckpt")
    headers += [
        "max loss abs",
        "max loss rel",
        "max grad-norm abs",
        "max grad-norm rel",
        "error trend (first to last step)",
        "pass",
    ]
    table = TableData(
        title=(
            f"{_dims(group.key, first)}: {group.steps}-step training, layers "
            f"{'/'.join(t.split('_')[0] for t in s.layer_types)}, AdamW lr {s.lr:g} "
            f"wd {s.weight_decay:g}, gradients summed by {reductions}, "
            f"{s.master_weights} master weights"
        ),
        headers=headers,
        numeric=set(range(len(headers) - 6, len(headers) - 2)),
        verdict_column=len(headers) - 1,
    )
    for r in group.records:
        cells = [r.case.mode]
        if group.shows_checkpoint:
            cells.append(format_checkpoint(r.case.checkpoint))
        cells += [
            sci(max(r.loss_abs, default=0.0)),
            sci(max(r.loss_rel, default=0.0)),
            sci(max(r.grad_norm_abs, default=0.0)),
            sci(max(r.grad_norm_rel, default=0.0)),
            _growth(r),
            _verdict(r.passed),
        ]
        table.rows.append(cells)
        table.notes += [f"FAIL {r.case.case_id}: {f}" for f in r.failures()]
    mismatched = [r for r in group.records if r.mismatched_params]
    if mismatched:
        table.notes += [
            f"initial weights DIFFER in {r.case.case_id}: {', '.join(r.mismatched_params)}"
            for r in mismatched
        ]
    else:
        checked = sorted({r.params_checked for r in group.records})
        table.notes.append(
            f"initial weights: all {'/'.join(map(str, checked))} parameter tensors bit-identical to the "
            "reference's before step 0, in every case"
        )
    bars = TrainThresholds(**first.thresholds)
    table.notes.append(_bars_note(group.records, bars))
    table.notes.append(
        "error trend: "
        "the relative error's growth from the first step to the last along its Theil-Sen line (log "
        f"errors); 'grows' when above x{GROWTH_FACTOR:g} and Kendall's one-sided test gives p < "
        f"{GROWTH_ALPHA:g} (reported, not a bar)"
    )
    return table


def _bars_note(records: Sequence[TrainVerification], bars: TrainThresholds) -> str:
    """The bars, and where the dtype's own spread (a second reference at another chunk size) raised them:
    FLOOR_FACTOR x its largest error, case by case."""
    text = f"bars: max loss rel <= {bars.loss_rel:g}, max grad-norm rel <= {bars.grad_norm_rel:g}"
    floors = [r for r in records if r.floor_grad_norm]
    if not floors:
        return text
    loss = max(max(r.floor_loss_rel, default=0.0) for r in floors)
    norm = max(max(r.floor_grad_norm_rel, default=0.0) for r in floors)
    return (
        f"{text}, or {FLOOR_FACTOR:g}x the dtype's own spread where larger (a second single-rank reference, "
        f"the same weights and batches at another chunk size, moved up to loss {loss:.1e}, grad norm "
        f"{norm:.1e} from the reference)"
    )


def per_step_table(group: TrainGroup) -> TableData:
    table = TableData(
        title=f"{_short(group.key)}: per step",
        headers=[
            "mode",
            "step",
            "ref loss",
            "cp loss",
            "loss rel",
            "ref grad norm",
            "cp grad norm",
            "grad-norm rel",
        ],
        numeric=set(range(1, 8)),
    )
    for r in group.records:
        for i, values in enumerate(
            zip(
                r.ref_loss,
                r.cp_loss,
                r.loss_rel,
                r.ref_grad_norm,
                r.cp_grad_norm,
                r.grad_norm_rel,
                strict=True,
            )
        ):
            mode = r.case.mode + ("" if r.case.checkpoint is not False else " (no ckpt)")
            table.rows.append([mode if i == 0 else "", str(i), *(sci(v) for v in values)])
    return table


def not_verified_table(records: Sequence[Verification]) -> TableData | None:
    failed = not_verified(records)
    if not failed:
        return None
    table = TableData(
        title="not verified (the case did not run)", headers=["check", "case", "status", "reason"]
    )
    for r in failed:
        reason = first_line(r.error)
        table.rows.append([r.kind, r.case.key(), r.status, reason])
    return table


def verification_tables(records: Sequence[Verification]) -> list[TableData]:
    """Every table for `records`, in order: per layer group its table (and sweep), trajectories, failures."""
    out: list[TableData] = []
    for group in layer_groups(records):
        out.append(layer_table(group))
        if len(group.seeds) > 1:
            out.append(sweep_table(group))
    for group in train_groups(records):
        out.append(train_table(group))
        if group.steps <= PER_STEP_TABLE_STEPS:
            out.append(per_step_table(group))
    missing = not_verified_table(records)
    if missing is not None:
        out.append(missing)
    return out
