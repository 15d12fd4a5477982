"""Predicted step time and peak memory of a case under CP, from measured compute and an alpha-beta links.

    step = compute + exchange + communication

- compute: the mode's own pipeline on one rank's L = T / cp tokens, from the cp 1 cases of bench results
  (a straight line t = a + b tokens per pipeline, summary checkpoint, pass and thread count: scipy's
  linregress). The sequence-shard modes share one pipeline (`pipeline`: their cp 1 cases are pooled, since
  they differ only in the exchange); ulysses has its own. A layer other than the measured one is scaled by
  the ratio of model FLOPs per token (GatedDeltaNetConfig.flops); a thread count not measured, by the
  thread ratio (linear speed-up; both stated in the prediction's notes). Ranks sharing a host's cores
  (cp x threads > cores) slow by that factor.
- exchange: the mode's combining work that grows with cp (CPMode.exchange_flops: all_gather's fold of cp
  summaries, scan's compositions per round) at the measured matmul throughput.
- communication: the transfers on the rank's critical path (CPMode.critical_path: p2p relays P - 1 states
  one after the other, scan sends one summary per round, collectives join at once), each priced by the
  interconnect (bench.model.links); the slowest rank's sum.
- peak memory: bench.launch.estimate's formula (the same one that refuses a case that cannot fit).
Overlap is not modelled: it trades about one chunk scan of compute for hiding communication, which this
model keeps apart.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from scipy.stats import linregress

from bench.launch.estimate import estimate_peak_bytes
from bench.model.links import Interconnect, steps
from bench.results.store import CaseResult, RunResult
from bench.suite.config import Case
from gdn_cp.distributed import mode_class
from gdn_cp.layers import GatedDeltaNetConfig

FitKey = tuple[str, bool | None, str, int]
"""(pipeline, checkpoint, pass, threads per rank)."""


def pipeline(mode: str) -> str:
    """Which local pipeline a mode runs: the modes with a summary share one (they differ only in the
    exchange, which at cp 1 does nothing), so their cp 1 cases are pooled and a pick between them is never
    cp 1 noise."""
    return "sequence-shard" if mode_class(mode).has_summary else mode


def measured_s(result: CaseResult) -> float:
    """A measured case's time, the one every view prints (CaseResult.seconds)."""
    seconds = result.seconds
    assert seconds is not None, f"{result.key} has no timing"
    return seconds


def _flops_per_token(config: GatedDeltaNetConfig, backward: bool) -> float:
    tokens = 1 << 16  # long enough that the chunk padding is negligible
    return config.flops(batch=1, seq_len=tokens, backward=backward) / tokens


@dataclass(frozen=True, slots=True)
class LineFit:
    """t = intercept + slope * tokens, over `points` measured cases."""

    intercept_s: float
    slope_s: float
    points: int

    def at(self, tokens: float) -> float:
        return max(0.0, self.intercept_s + self.slope_s * tokens)


@dataclass(frozen=True, slots=True)
class ComputeModel:
    """The measured local compute of each mode's pipeline on one rank (module docstring)."""

    config: GatedDeltaNetConfig
    """The layer the cases measured."""
    fits: dict[FitKey, LineFit]
    matmul_gflops: float | None
    """The measured cases' batched-matmul throughput (the slowest), for the exchange's FLOPs."""
    cores: int
    """CPU cores of the host the cases ran on."""

    def seconds(self, case: Case, threads: int) -> tuple[float, list[str]]:
        """(seconds of `case`'s local compute on one rank of `threads` threads, the assumptions it took)."""
        notes: list[str] = []
        same = [k for k in self.fits if k[:3] == (pipeline(case.mode), case.checkpoint, case.pass_)]
        if not same:
            raise ValueError(
                f"no cp 1 measurement of {case.mode} (checkpoint {case.checkpoint}, {case.pass_}) to fit: "
                "run "
                "the scenario's cp 1 cases of that mode first"
            )
        key = min(same, key=lambda k: (abs(k[3] - threads), -k[3]))
        seconds = self.fits[key].at(case.batch * case.local_seq_len) * key[3] / threads
        if key[3] != threads:
            notes.append(f"compute scaled from {key[3]} threads to {threads} (linear speed-up assumed)")
        config = case.layer
        if config != self.config:
            backward = case.pass_ == "forward_backward"
            seconds *= _flops_per_token(config, backward) / _flops_per_token(self.config, backward)
            notes.append("compute scaled from the measured layer by model FLOPs per token")
        return seconds, notes


def fit_compute(runs: Iterable[RunResult], config: GatedDeltaNetConfig | None = None) -> ComputeModel:
    """Fit the cp 1 cases of `runs` (of one layer: `config`, default the first cp 1 case's)."""
    points: dict[FitKey, list[tuple[int, float]]] = defaultdict(list)
    gflops, cores = [], []
    for run in runs:
        for r in run.cases:
            if r.status != "ok" or r.case.cp != 1 or r.threads_per_rank is None:
                continue
            if config is None:
                config = r.case.layer
            if r.case.layer != config or r.case.documents is not None:
                continue
            key = (pipeline(r.case.mode), r.case.checkpoint, r.case.pass_, r.threads_per_rank)
            points[key].append((r.case.batch * r.case.seq_len, measured_s(r)))
            if r.throughput is not None:
                gflops.append(r.throughput.matmul_gflops)
            cores.append(run.environment.cpu_count or 1)
    if config is None or not points:
        raise ValueError("no measured cp 1 case to fit the compute to: run a scenario with cp 1 cases first")
    fits = {}
    for key, xy in points.items():
        tokens = [x for x, _ in xy]
        if len(set(tokens)) >= 2:
            line = linregress(tokens, [y for _, y in xy])
            fits[key] = LineFit(float(line.intercept), float(line.slope), len(xy))
        else:  # one length: proportional to the tokens
            fits[key] = LineFit(0.0, sum(y for _, y in xy) / sum(tokens), len(xy))
    return ComputeModel(config, fits, min(gflops) if gflops else None, max(cores) if cores else 1)


@dataclass(frozen=True, slots=True)
class Prediction:
    """One case's predicted step, per rank, in seconds, and its peak memory."""

    case: Case
    compute_s: float
    exchange_s: float
    comm_s: float
    peak_bytes: int
    notes: tuple[str, ...] = ()

    @property
    def total_s(self) -> float:
        return self.compute_s + self.exchange_s + self.comm_s


def comm_seconds(case: Case, links: Interconnect) -> float:
    """The slowest rank's critical-path communication of one pass (module docstring)."""
    if case.cp == 1:
        return 0.0
    cls = mode_class(case.mode)
    worst = 0.0
    for rank in range(case.cp):
        total = 0.0
        for kind, (calls, wire) in cls.critical_path(case.comm_case(rank)).items():
            total += links.link(kind).time_s(calls * steps(kind, case.cp), calls * wire)
        worst = max(worst, total)
    return worst


def predict(
    case: Case, compute: ComputeModel, links: Interconnect, *, threads: int, ranks_per_host: int = 1
) -> Prediction:
    """`case`'s predicted step with `threads` threads per rank and `ranks_per_host` ranks sharing a host of
    compute.cores cores (1: a device per rank)."""
    seconds, notes = compute.seconds(case, threads)
    share = max(1.0, ranks_per_host * threads / compute.cores)
    if share > 1:
        notes.append(
            f"{ranks_per_host} ranks x {threads} threads share {compute.cores} cores: compute x{share:g}"
        )
    flops = mode_class(case.mode).exchange_flops(case.comm_case(case.cp - 1))
    exchange = 0.0
    if flops:
        if compute.matmul_gflops is None:
            notes.append("no measured matmul throughput: the exchange's FLOPs are not priced")
        else:
            exchange = flops / (compute.matmul_gflops * 1e9) * share
    return Prediction(
        case=case,
        compute_s=seconds * share,
        exchange_s=exchange,
        comm_s=comm_seconds(case, links),
        peak_bytes=estimate_peak_bytes(case),
        notes=tuple(notes),
    )


@dataclass(frozen=True, slots=True)
class Check:
    """A measured case against its prediction."""

    measured: CaseResult
    predicted: Prediction

    @property
    def error(self) -> float:
        """predicted / measured - 1."""
        return self.predicted.total_s / measured_s(self.measured) - 1


def check_runs(runs: Sequence[RunResult], compute: ComputeModel, links: Interconnect) -> list[Check]:
    """Every ok case at cp > 1 of `runs` (on the compute's layer, unpacked) against its prediction, with the
    threads and ranks per host it ran with."""
    out = []
    for run in runs:
        local = run.environment.launcher != "torchrun"
        for r in run.cases:
            ok = r.status == "ok" and r.threads_per_rank is not None and r.case.documents is None
            if not ok or r.case.cp == 1 or r.case.layer != compute.config:
                continue
            p = predict(
                r.case, compute, links, threads=r.threads_per_rank, ranks_per_host=r.case.cp if local else 1
            )
            out.append(Check(r, p))
    return out


def scaled(template: Case, **changes) -> Case:
    """`template` with other coordinates (cp, seq_len, mode, checkpoint, ...)."""
    return dataclasses.replace(template, **changes)
