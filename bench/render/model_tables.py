"""`bench model`'s views: the fitted links (calibrate), predicted against measured case by case (check), and
the predictions over a grid of sequence lengths and cp with the mode to pick and why, what they assume, and
the same as Markdown (table)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from bench.formats import format_seconds, format_time, format_tokens
from bench.judge.reference import scenario_order
from bench.launch.estimate import human_bytes
from bench.model.grid import GridPoint
from bench.model.links import Interconnect, fit_quality
from bench.model.predict import Check, ComputeModel, Prediction
from bench.render.tables import TableData, print_tables
from bench.results.store import RunResult
from bench.suite.config import Case
from gdn_cp.distributed import MODES


def links_table(links: Interconnect) -> TableData:
    """Each kind's latency and bandwidth, and how well they fit the calibration's samples (the median
    error, the fastest call), with a note for each fit not to trust."""
    rows, notes = [], []
    for kind, link in links.links.items():
        cells = [kind, f"{link.latency_s * 1e6:.0f} us", f"{link.bandwidth_bytes_s / 1e9:.2f} GB/s"]
        samples = [(s["cp"], s["bytes"], s["seconds"]) for s in links.samples if s["kind"] == kind]
        if not samples:  # a typed links file: nothing measured to check the fit against
            cells += ["-", "-"]
        else:
            q = fit_quality(kind, link, samples)
            cells += [f"{100 * q.median_error:.0f}%", f"{q.smallest_s * 1e6:.0f} us"]
            if not q.trusted(link):
                notes.append(
                    f"{kind}: not a fit to trust (median error {q.median_error:.0%}, latency "
                    f"{link.latency_s * 1e6:.0f} us against a fastest call of {q.smallest_s * 1e6:.0f} us); "
                    "calibrate again on an idle machine, or with more --cp sizes"
                )
        rows.append(cells)
    headers = ["kind", "latency", "bandwidth", "fit error", "fastest call"]
    return TableData(
        title=f"{links.name} ({links.source})", headers=headers, rows=rows, numeric={1, 2, 3, 4}, notes=notes
    )


def _model_error(checks: Sequence[Check]) -> float | None:
    """The model's median absolute error on the measured cases; None when none was checked."""
    return statistics.median(abs(c.error) for c in checks) if checks else None


def print_checks(
    checks: Sequence[Check], runs: Sequence[RunResult], links_name: str, console: Console
) -> None:
    """Predicted against measured, case by case in the scenarios' order, then the model's error."""
    order = scenario_order(list(dict.fromkeys(s for run in runs for s in run.scenarios)))
    rows = [
        [
            c.measured.case.case_id,
            format_time(c.measured),
            format_seconds(c.predicted.total_s),
            f"{(c.predicted.compute_s + c.predicted.exchange_s) * 1e3:.1f}",
            f"{c.predicted.comm_s * 1e3:.1f}",
            f"{c.error:+.0%}",
        ]
        for c in sorted(checks, key=lambda c: order(c.measured.case))  # scenario order, not run order
    ]
    headers = ["case", "measured", "predicted", "compute ms", "comm ms", "error"]
    title = f"predicted vs measured ({links_name})"
    print_tables([TableData(title=title, headers=headers, rows=rows, numeric={1, 2, 3, 4, 5})], console)
    errors = [abs(c.error) for c in checks]
    console.print(
        f"median absolute error {_model_error(checks):.0%} over {len(checks)} cases "
        f"(largest {max(errors):.0%}); compute from the cp 1 cases, threads and shared cores as each case ran"
    )


def why(best: Prediction, ranked: Sequence[Prediction], error: float | None) -> str:
    """Why `best` is the pick: the runner-up's margin, or a tie when the margin is inside the model's own
    error (its median absolute error on the measured cases; None: not checked)."""
    if len(ranked) < 2:
        return ""
    second = ranked[1]
    margin = second.total_s / best.total_s - 1
    share = second.comm_s / second.total_s if second.total_s else 0.0
    comm = f" ({share:.0%} comm)" if share >= 0.2 else ""
    if error is None:
        return f"{second.case.mode} +{margin:.0%}{comm} (unchecked)"
    if margin <= error:
        return f"{second.case.mode} +{margin:.0%} (tie)"
    return f"{second.case.mode} +{margin:.0%}{comm}"


def prediction_tables(
    points: Sequence[GridPoint], checks: Sequence[Check], *, pass_: str, links_name: str
) -> tuple[list[TableData], list[str]]:
    """(the predicted time per mode with the pick and the runner-up, and the predicted peak per rank, a row
    per point; the exclusions, "mode: reason", in order of first appearance)."""
    error = _model_error(checks)
    times, peaks, reasons = [], [], {}
    for point in points:
        by_mode = {p.case.mode: p for p in point.predictions}
        ms = [f"{by_mode[m].total_s * 1e3:,.0f}" if m in by_mode else "-" for m in MODES]
        peak = [human_bytes(by_mode[m].peak_bytes) if m in by_mode else "-" for m in MODES]
        fits = point.fits
        pick = fits[0].case.mode if fits else "none fits"
        next_ = why(fits[0], fits, error) if fits else ""
        for mode, reason in point.excluded.items():
            reasons.setdefault(f"{mode}: {reason}", None)
        where = [format_tokens(point.seq_len), str(point.cp)]
        times.append([*where, *ms, pick, next_])
        peaks.append([*where, *peak])
    numeric = set(range(2 + len(MODES)))
    tied = "" if error is None else f"; (tie): within the model's own error ({error:.0%})"
    tables = [
        TableData(
            title=f"predicted {pass_} per layer, ms - {links_name}",
            headers=["T", "cp", *MODES, "pick", "next"],
            rows=times,
            numeric=numeric,
            notes=[f"next: the runner-up, how much slower the model predicts it{tied}"],
        ),
        TableData(
            title="predicted peak allocated per rank",
            headers=["T", "cp", *MODES],
            rows=peaks,
            numeric=numeric,
        ),
    ]
    return tables, list(reasons)


def _check_line(checks: Sequence[Check]) -> str:
    """The model's own error on the measured cp > 1 cases of the results it was fitted to."""
    if not checks:
        return "not checked: the results hold no ok case at cp > 1 on this layer"
    errors = [c.error for c in checks]
    return (
        f"checked against the {len(checks)} measured cp > 1 cases of the results (as they ran: threads, "
        f"shared cores): median absolute error {_model_error(checks):.0%}, median error "
        f"{statistics.median(errors):+.0%} (bench model check)"
    )


def assumptions(
    template: Case,
    compute: ComputeModel,
    links: Interconnect,
    *,
    threads: int,
    results: Sequence[str],
    notes: Sequence[str],
    checks: Sequence[Check],
    exclusions: Sequence[str],
) -> list[str]:
    """What the prediction tables assume (the layer, where compute and links come from, the model's
    terms), the predictions' own notes, the model's error on the measured cases, and what was not picked."""
    c = template.layer
    out = [
        f"layer: hidden {c.hidden_size}, heads {c.num_k_heads}/{c.num_v_heads}, head dims "
        f"{c.head_k_dim}/{c.head_v_dim}, chunk {c.chunk_size}, {template.dtype}, batch {template.batch}; "
        "summary checkpoint on; contiguous layout",
        f"compute: fitted to the cp 1 cases of {', '.join(Path(r).name for r in results)} "
        f"({threads} threads per rank), one rank per device (no shared cores)",
        f"links: {links.name} ({links.source}): "
        + ", ".join(
            f"{k} {v.latency_s * 1e6:.0f} us + {v.bandwidth_bytes_s / 1e9:.2f} GB/s"
            for k, v in links.links.items()
        ),
        "communication on each mode's critical path (p2p: P - 1 relayed states; scan: ceil(log2 P) rounds; "
        "collectives joined at once); memory: the preflight estimate (bench/launch/estimate.py); no overlap",
        *notes,
        _check_line(checks),
    ]
    if exclusions:
        out.append("not picked where shown '-' or over the memory: " + "; ".join(exclusions))
    return out


def model_markdown(pass_: str, assumptions: Sequence[str], tables: Sequence[TableData]) -> str:
    """The tables as a Markdown document: a title, the assumptions as a list, then each table."""
    lines = [f"# Cost model: {pass_} of one GDN layer, by CP mode", "", *(f"- {a}" for a in assumptions)]
    for t in tables:
        lines += ["", f"## {t.title}", "", "| " + " | ".join(t.headers) + " |", "|" + "---|" * len(t.headers)]
        lines += ["| " + " | ".join(r) + " |" for r in t.rows]
    return "\n".join(lines) + "\n"
