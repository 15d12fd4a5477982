"""Verification tables, built once as plain cells (bench.render.tables.TableData) and rendered twice: rich
(the terminal: `print_tables`) and report blocks (bench.render.document.document_blocks).

Per layer group (scenario, CP degree, dtype, sequence length, layout, documents): the check's table on
"state" inputs, mode | output max abs | input-grad max abs | input-grad rel-L2 | worst param (name) rel-L2 |
grad-norm rel diff | pass, each cell the maximum over the case's seeds and its packed inputs, the failing
metrics by name, the mutants each case caught, and the share of each rank's output its entering state
carries; the check's power, mutant x mode; and the reference PR's table on its own inputs beside it. With
several seeds also the PR's sweep table, metric | N-seed maximum | threshold | margin, for both inputs, and
which parameter had the smallest reference gradient.
Per trajectory group: mode | max loss abs | max loss rel | max grad-norm abs | max grad-norm rel | error
growth | first step loss / grad-norm rel | pass, whether the initial weights were identical, the mutants
each case caught, the power (which bar caught each mutant), and per step (short runs) both models' numbers.

A check that passed but missed a mutant reads "no power" (NO_POWER), never "pass".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from bench.errors import first_line
from bench.formats import format_checkpoint, format_tokens
from bench.judge.verification import (
    GroupKey,
    LayerGroup,
    LayerRow,
    TrainGroup,
    layer_groups,
    not_verified,
    smallest_reference_gradient,
    sweep_rows,
    train_groups,
)
from bench.render.tables import TableData
from bench.results.verifications import (
    FLOOR_FACTOR,
    GROWTH_ALPHA,
    GROWTH_FACTOR,
    LayerVerification,
    MutantVerdict,
    TrainVerification,
    Verification,
)
from gdn_cp.accuracy import LayerComparison, TrainThresholds
from gdn_cp.distributed import DEFAULT_LAYOUT
from gdn_cp.distributed.layout import piece_owners
from gdn_cp.distributed.mutants import MUTANTS
from gdn_cp.ops.backends.mutants import MUTANTS as BACKEND_MUTANTS

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


NO_POWER = "no power"
"""The verdict cell of a check that passed but let a mutant through (its notes say which, and the status
line "pass, no power against: ...")."""
VERDICT_STYLES = {"pass": "green", NO_POWER: "bold yellow", "FAIL": "bold red"}


def _verdict(record: Verification) -> str:
    if not record.passed:
        return "FAIL"
    return NO_POWER if record.no_power_against else "pass"


def power_cell(power: Sequence[MutantVerdict]) -> str:
    """caught / run, e.g. "5/5"; "-" when no mutant ran."""
    return f"{sum(v.caught for v in power)}/{len(power)}" if power else "-"


def power_text(record: Verification) -> str:
    """How a passing record's power reads on one line: "caught 5/5 mutants", "no power against: ...", or
    "no mutants run"."""
    if record.no_power_against:
        return "no power against: " + ", ".join(record.no_power_against)
    if not record.power:
        return "no mutants run"
    return f"caught {len(record.power)}/{len(record.power)} mutants"


def _power_note(records: Sequence[Verification]) -> str:
    """Each case's mutants caught out of those run, e.g. "mutants caught (...): p2p 5/5"."""
    cells = [f"{_row_label(r)} {power_cell(r.power)}" for r in records]
    ops = {m.name for m in BACKEND_MUTANTS}
    where = "CP broken on rank 1" + (
        ", or the case's op on every rank" if any(v.mutant in ops for r in records for v in r.power) else ""
    )
    return f"mutants caught ({where}, the first seed): " + ", ".join(cells)


def _row_label(record: Verification) -> str:
    return record.case.mode + ("" if record.case.checkpoint is not False else " (no ckpt)")


def _no_power_lines(records: Sequence[Verification]) -> list[str]:
    return [
        f"NO POWER {r.case.case_id}: passed, and passes with CP broken: {', '.join(r.no_power_against)}"
        for r in records
        if r.no_power_against
    ]


def _receiving_ranks(record: Verification) -> list[int]:
    """The ranks holding a piece after the first: those a state enters (rank 0 of a contiguous split starts
    the sequence)."""
    owners = piece_owners(record.case.layout, record.case.cp)
    return sorted({owner for owner in owners[1:]})


def _shares(comparison: LayerComparison, ranks: Sequence[int]) -> str:
    return ", ".join(
        f"rank {r} {comparison.state_share[r]:.1%}" for r in ranks if r < len(comparison.state_share)
    )


def share_note(record: LayerVerification) -> str | None:
    """What the entering state carries per rank in the first seed's inputs (the same for every mode of a
    group): rel-L2 of the reference's GDN output with the entering states zeroed."""
    ranks = _receiving_ranks(record)
    parts = []
    for label, comparisons in (
        ("state inputs", record.comparisons),
        ("packed across rank edges", record.packed),
        ("the reference PR's inputs", record.reproduction),
    ):
        if comparisons and comparisons[0].state_share:
            parts.append(f"{label}: {_shares(comparisons[0], ranks)}")
    if not parts:
        return None
    return (
        f"share of each rank's GDN output its entering state carries (seed {record.seeds[0]}; rel-L2 with it "
        f"zeroed): " + "; ".join(parts)
    )


def _failure_lines(record: LayerVerification) -> list[str]:
    lines = []
    for seed, failures in record.failures():
        shown = "; ".join(failures[:MAX_LISTED_FAILURES])
        more = len(failures) - MAX_LISTED_FAILURES
        lines.append(
            f"FAIL {record.case.case_id} seed {seed}: {shown}" + (f" (and {more} more)" if more > 0 else "")
        )
    return lines


def _check_row(row: LayerRow) -> LayerRow:
    """The row of the check: each metric's maximum over the case's comparisons and its packed ones."""
    record = row.record
    if not record.packed:
        return row
    merged = dataclasses.replace(record, comparisons=record.comparisons + record.packed, seeds=[])
    return dataclasses.replace(LayerRow.of(merged), record=record)


def _inputs_text(group: LayerGroup) -> str:
    first = group.rows[0].record
    if first.inputs != "state":
        return f"{first.inputs} inputs"
    packed = ", also packed across rank edges" if any(r.record.packed for r in group.rows) else ""
    return f'"state" inputs{packed}'


def _leading_headers(shows_checkpoint: bool) -> list[str]:
    """A check table's first columns: the mode, and the summary checkpoint where the group varies it."""
    return ["mode", "summary ckpt"] if shows_checkpoint else ["mode"]


def layer_table(group: LayerGroup, *, reproduction: bool = False) -> TableData:
    """The group's table: the check's (its comparisons and packed ones, power, verdict), or with
    `reproduction` the reference PR's, on its own inputs (its rows' comparisons are the reproduction's)."""
    seeds = group.seeds
    seeds_text = f"seed {seeds[0]}" if len(seeds) == 1 else f"{len(seeds)} seeds, max over seeds"
    headers = [
        *_leading_headers(group.shows_checkpoint),
        "output max abs",
        "input-grad max abs",
        "input-grad rel-L2",
        "worst param (name) rel-L2",
        "grad-norm rel diff",
    ]
    headers.append("pass")
    what = "the reference PR's inputs" if reproduction else _inputs_text(group)
    table = TableData(
        title=f"{_dims(group.key, group.rows[0].record)}; {seeds_text}; {what}",
        headers=headers,
        numeric=set(range(len(headers) - 6, len(headers) - 1)),
        verdict_column=len(headers) - 1,
        verdict_styles=VERDICT_STYLES,
    )
    for row in group.rows:
        record = row.record
        if not reproduction:
            row = _check_row(row)
        cells = [record.case.mode]
        if group.shows_checkpoint:
            cells.append(format_checkpoint(record.case.checkpoint))
        cells += [
            sci(row.output_max_abs),
            sci(row.input_grad_max_abs),
            sci(row.input_grad_rel_l2),
            f"{sci(row.worst_param_rel_l2)} ({row.worst_param})",
            sci(row.grad_norm_rel),
        ]
        if reproduction:
            failed = any(f.startswith("PR inputs: ") for _, fs in record.failures() for f in fs)
            cells.append("FAIL" if failed else "pass")
        else:
            cells.append(_verdict(record))
            table.notes += _failure_lines(record)
        table.rows.append(cells)
    if not reproduction:
        table.notes.append(_power_note([r.record for r in group.rows]))
        table.notes += _no_power_lines([r.record for r in group.rows])
        share = share_note(group.rows[0].record)
        if share is not None:
            table.notes.append(share)
    t = group.thresholds
    output = "" if t.output_rel_l2 is None else f", output rel-L2 <= {t.output_rel_l2:g}"
    table.notes.append(
        f"bars: output/input max abs <= {t.output_max_abs:g} / {t.input_grad_max_abs:g}, max/ref abs-max <= "
        f"{t.rel_max:g}, rel-L2 <= {t.rel_l2:g}{output}; every param grad: max/ref abs-max <= "
        f"{t.param_rel_max:g}, rel-L2 <= {t.param_rel_l2:g}, present and finite; grad-norm rel diff <= "
        f"{t.grad_norm_rel:g}"
    )
    return table


def reproduction_group(group: LayerGroup) -> LayerGroup | None:
    """The group with each row over its record's reference-PR comparisons (None: none were run)."""
    rows = [r for r in group.rows if r.record.reproduction]
    if not rows:
        return None
    out = []
    for row in rows:
        as_pr = dataclasses.replace(row.record, comparisons=row.record.reproduction, seeds=[])
        out.append(dataclasses.replace(LayerRow.of(as_pr), record=row.record))
    return LayerGroup(key=group.key, rows=out)


def power_table(records: Sequence[Verification], title: str) -> TableData | None:
    """Mutant x case: whether each case's check caught each mutant that applies to it (None: no mutant
    ran). Training cells say which bars caught it (first step, trajectory)."""
    ran = [r for r in records if r.status == "ok" and r.power]
    if not ran:
        return None
    known = [m.name for m in (*MUTANTS, *BACKEND_MUTANTS)]
    names = [n for n in known if any(v.mutant == n for r in ran for v in r.power)]
    columns = [_row_label(r) for r in ran]
    # every column after the first is a value (a case's verdict): continued groups repeat the mutant alone
    table = TableData(title=title, headers=["mutant", *columns], numeric=set(range(1, len(ran) + 1)))
    if any(isinstance(r, TrainVerification) for r in ran):
        table.notes.append(
            'first: caught by the first-step bars (the "state" model); traj: by the trajectory\'s bars at '
            "step 0 (its own model, the reference PR's initialisation)"
        )
    ops = {m.name for m in BACKEND_MUTANTS}
    table.notes.append(
        "CP's mutants break rank 1 (the first rank a state enters)"
        + ("; the op's (op_*) break the case's backend on every rank" if ops & set(names) else "")
    )
    for name in names:
        cells = [next(v.description for r in ran for v in r.power if v.mutant == name)]
        for r in ran:
            verdict = next((v for v in r.power if v.mutant == name), None)
            cells.append("" if verdict is None else _caught_cell(r, verdict))
        table.rows.append(cells)
    return table


def _caught_cell(record: Verification, verdict: MutantVerdict) -> str:
    if not verdict.caught:
        return "MISSED"
    if isinstance(record, TrainVerification):
        mutant = next(m for m in record.mutants if m.name == verdict.mutant)
        first, trajectory = record.mutant_bars(mutant)
        return "+".join(label for label, hit in (("first", first), ("traj", trajectory)) if hit)
    return "caught"


def sweep_table(group: LayerGroup, *, reproduction: bool = False) -> TableData:
    """The group's sweep over its seeds: the check's comparisons (with the packed ones), or with
    `reproduction` those on the reference PR's inputs."""
    records = [r.record for r in group.rows]
    if reproduction:
        comparisons = [c for r in records for c in r.reproduction]
        prefix, what = "PR inputs: ", "the reference PR's inputs"
    else:
        comparisons = [c for r in records for c in (*r.comparisons, *r.packed)]
        prefix, what = None, "state inputs" if records[0].inputs == "state" else f"{records[0].inputs} inputs"
    n = len(group.seeds)
    modes = ", ".join(dict.fromkeys(r.case.mode for r in records))
    failed = sum(
        any(f.startswith(prefix) if prefix else not f.startswith("PR inputs: ") for f in fs)
        for r in records
        for _, fs in r.failures()
    )
    table = TableData(
        title=f"{_short(group.key)}: {n}-seed sweep over {modes}, {what}",
        headers=["metric", f"{n}-seed maximum", "threshold", "margin"],
        numeric={1, 2, 3},
    )
    t = group.thresholds
    for row in sweep_rows(comparisons, t):
        table.rows.append([row.metric, sci(row.maximum), f"{row.threshold:g}", margin(row.margin)])
    if t.output_rel_l2 is not None:
        worst = max((c.output.rel_l2 for c in comparisons), default=0.0)
        ratio = t.output_rel_l2 / worst if worst > 0 else float("inf")
        table.rows.append(["output relative-L2", sci(worst), f"{t.output_rel_l2:g}", margin(ratio)])
    verdict = "all passed" if failed == 0 else f"{failed} seed(s) failed"
    packed = ", each also packed" if not reproduction and any(r.packed for r in records) else ""
    count = f"{len(comparisons)} forward+backward comparisons ({n} seeds x {len(records)} cases{packed})"
    table.notes.append(f"{count}: {verdict}")
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


def _first_cell(record: TrainVerification) -> str:
    loss, norm = record.first_loss_rel, record.first_grad_norm_rel
    return "-" if loss is None or norm is None else f"{sci(loss)} / {sci(norm)}"


def train_table(group: TrainGroup) -> TableData:
    first = group.records[0]
    s = first.settings
    reductions = "/".join(sorted({r.grad_reduction or "?" for r in group.records}))
    headers = [
        *_leading_headers(group.shows_checkpoint),
        "max loss abs",
        "max loss rel",
        "max grad-norm abs",
        "max grad-norm rel",
        "error trend (first to last step)",
        "first step, state inputs: loss / grad-norm rel",
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
        numeric={*range(len(headers) - 7, len(headers) - 3), len(headers) - 2},
        verdict_column=len(headers) - 1,
        verdict_styles=VERDICT_STYLES,
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
            _first_cell(r),
            _verdict(r),
        ]
        table.rows.append(cells)
        table.notes += [f"FAIL {r.case.case_id}: {f}" for f in r.failures()]
    table.notes.append(_power_note(group.records))
    table.notes += _no_power_lines(group.records)
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
    if floors:
        loss = max(max(r.floor_loss_rel, default=0.0) for r in floors)
        norm = max(max(r.floor_grad_norm_rel, default=0.0) for r in floors)
        text += (
            f", or {FLOOR_FACTOR:g}x the dtype's own spread where larger (a second single-rank reference, "
            f"the same weights and batches at another chunk size, moved up to loss {loss:.1e}, grad norm "
            f"{norm:.1e} from the reference)"
        )
    if any(r.first is not None for r in records):
        text += (
            f'; first step on models whose GDN layers draw "state" decays: loss rel <= '
            f"{bars.first_loss_rel:g}, grad-norm rel <= {bars.first_grad_norm_rel:g}, first GDN layer's "
            f"output rel-L2 <= {bars.first_gdn_output_rel_l2:g}"
        )
    return text


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
        power = power_table([r.record for r in group.rows], f"{_short(group.key)}: mutants the check caught")
        if power is not None:
            out.append(power)
        if len(group.seeds) > 1:
            out.append(sweep_table(group))
        pr = reproduction_group(group)
        if pr is not None:
            out.append(layer_table(pr, reproduction=True))
            if len(group.seeds) > 1:
                out.append(sweep_table(group, reproduction=True))
    for group in train_groups(records):
        out.append(train_table(group))
        power = power_table(group.records, f"{_short(group.key)}: mutants the training check caught (bars)")
        if power is not None:
            out.append(power)
        if group.steps <= PER_STEP_TABLE_STEPS:
            out.append(per_step_table(group))
    missing = not_verified_table(records)
    if missing is not None:
        out.append(missing)
    return out
