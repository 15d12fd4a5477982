"""The cost model (bench.model, `bench model`): the alpha-beta fit and file, the per-mode critical paths and
their scaling shapes, the compute fit on a frozen run, a real calibration on 2 ranks, and the command."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import yaml

from bench.cli import main
from bench.errors import UserError
from bench.model.calibrate import calibrate
from bench.model.links import (
    LINK_KINDS,
    Interconnect,
    Link,
    fit_link,
    fit_quality,
    interconnect_from_dict,
    steps,
    wire_bytes,
)
from bench.model.predict import (
    ComputeModel,
    LineFit,
    Prediction,
    check_runs,
    comm_seconds,
    fit_compute,
    predict,
    scaled,
)
from bench.render import model_tables
from bench.results.store import load_result
from bench.suite.config import Case
from gdn_cp.layers import GatedDeltaNetConfig

FIXTURES = Path(__file__).parents[1] / "fixtures"
SCALING = FIXTURES / "scaling.json"

LINKS = {
    "name": "test links",
    "source": "typed for the test",
    "links": {k: {"latency_us": 100, "bandwidth_gb_s": 1.0} for k in LINK_KINDS},
}


def _links(latency_s: float = 1e-4, bandwidth: float = 1e9) -> Interconnect:
    return Interconnect("t", "test", {k: Link(latency_s, bandwidth) for k in LINK_KINDS})


@pytest.mark.parametrize("kind", LINK_KINDS)
def test_fit_recovers_latency_and_bandwidth(kind: str) -> None:
    alpha, beta = 3e-5, 2e9
    samples = [
        (cp, n, steps(kind, cp) * alpha + wire_bytes(kind, cp, n) / beta)
        for cp in (2, 4)
        for n in (1 << 10, 1 << 16, 1 << 22)
    ]
    link = fit_link(kind, samples)
    assert link.latency_s == pytest.approx(alpha, rel=1e-6)
    assert link.bandwidth_bytes_s == pytest.approx(beta, rel=1e-6)


def test_interconnect_file_round_trips_and_bad_fields_are_named() -> None:
    links = interconnect_from_dict(LINKS, "t.yaml")
    assert links.link("halo") is links.links["all_to_all"]  # the halo is an all-to-all-v
    again = interconnect_from_dict(links.to_dict(), "again")
    assert (again.name, again.source) == (links.name, links.source)
    for kind, link in links.links.items():
        assert again.links[kind].latency_s == pytest.approx(link.latency_s)
        assert again.links[kind].bandwidth_bytes_s == pytest.approx(link.bandwidth_bytes_s)
    with pytest.raises(UserError, match="missing all_reduce"):
        interconnect_from_dict(
            {**LINKS, "links": {k: v for k, v in LINKS["links"].items() if k != "all_reduce"}}, "f"
        )
    bad = {**LINKS, "links": {**LINKS["links"], "p2p": {"latency_us": -1, "bandwidth_gb_s": 1}}}
    with pytest.raises(UserError, match=r"links\.p2p\.latency_us must be a positive number"):
        interconnect_from_dict(bad, "f")
    with pytest.raises(UserError, match="is a mapping"):
        interconnect_from_dict([1], "f")


def _case(mode: str, cp: int, seq_len: int, **kw) -> Case:
    template = next(r.case for r in load_result(SCALING).cases if r.case.cp == 1)
    checkpoint = None if mode == "ulysses" else True
    return scaled(
        template, mode=mode, cp=cp, seq_len=seq_len, pass_="forward_backward", checkpoint=checkpoint, **kw
    )


def test_critical_paths_scale_as_each_mode_relays() -> None:
    """With latency only, p2p's communication grows like cp - 1 hops, scan's like ceil(log2 cp) rounds; the
    header (an all-gather) and the halo (an all-to-all-v) are in every summary mode; all_gather's collective
    grows like cp - 1 ring steps."""
    links = _links(latency_s=1e-3, bandwidth=1e30)
    shared = {cp: comm_seconds(_case("p2p", cp, 1024), links) - 2 * (cp - 1) * 1e-3 for cp in (2, 4, 8, 16)}
    for cp in (2, 4, 8, 16):
        # the header's all-gather and the halo's two all-to-alls (forward, backward), cp - 1 steps each
        assert shared[cp] == pytest.approx(3 * (cp - 1) * 1e-3)
        scan = comm_seconds(_case("scan", cp, 1024), links) - shared[cp]
        assert scan == pytest.approx(2 * math.ceil(math.log2(cp)) * 1e-3)
        gather = comm_seconds(_case("all_gather", cp, 1024), links) - shared[cp]
        assert gather == pytest.approx(2 * (cp - 1) * 1e-3)
    zigzag = comm_seconds(_case("p2p", 4, 1024, layout="zigzag"), links)
    assert zigzag > comm_seconds(_case("p2p", 4, 1024), links)  # 2 cp pieces: 2 cp - 1 hops


def _compute(slope_s: float = 1e-6) -> ComputeModel:
    config = _case("p2p", 1, 64).layer
    fits = {
        (pipe, ckpt, "forward_backward", 2): LineFit(0.0, slope_s, 2)
        for pipe, ckpt in (("ulysses", None), ("sequence-shard", True))
    }
    return ComputeModel(config, fits, matmul_gflops=100.0, cores=64)


def test_weak_scaling_shapes() -> None:
    """Fixed tokens per rank: compute stays, so the sequence-shard modes' step grows only by their
    relays (scan by far the least at large cp), and all_gather's by the cp summaries it moves and folds."""
    compute, links = _compute(), _links(latency_s=2e-5, bandwidth=2e10)
    local = 8192

    def step(mode: str, cp: int) -> float:
        return predict(_case(mode, cp, local * cp), compute, links, threads=2).total_s

    assert step("p2p", 8) / step("p2p", 2) < 1.1  # nearly flat at small cp, as in the reference tables
    assert step("scan", 128) < step("p2p", 128) < step("all_gather", 128)
    assert predict(_case("all_gather", 64, local * 64), compute, links, threads=2).exchange_s > 0


def test_compute_is_scaled_for_threads_shared_cores_and_another_layer() -> None:
    compute = _compute()
    case = _case("p2p", 4, 4096)
    alone = predict(case, compute, _links(), threads=2)
    half = predict(case, compute, _links(), threads=1)
    assert half.compute_s == pytest.approx(2 * alone.compute_s) and half.notes
    crowded = predict(
        case,
        ComputeModel(compute.config, compute.fits, 100.0, cores=4),
        _links(),
        threads=2,
        ranks_per_host=4,
    )
    assert crowded.compute_s == pytest.approx(2 * alone.compute_s)
    wider = scaled(case, layer=dataclasses.replace(case.layer, hidden_size=2 * case.layer.hidden_size))
    config = wider.layer
    assert config != compute.config
    ratio = (config.flops(batch=1, seq_len=1 << 16, backward=True)) / compute.config.flops(
        batch=1, seq_len=1 << 16, backward=True
    )
    assert predict(wider, compute, _links(), threads=2).compute_s == pytest.approx(alone.compute_s * ratio)


def test_fit_and_check_on_a_frozen_run() -> None:
    run = load_result(SCALING)
    compute = fit_compute([run])
    assert {k[0] for k in compute.fits} == {"ulysses", "sequence-shard"} and compute.cores == 2
    # every summary mode reads the pooled fit: p2p's cp 1 cases price scan and all_gather too
    assert compute.seconds(_case("scan", 2, 64), 1) == compute.seconds(_case("p2p", 2, 64), 1)
    checks = check_runs([run], compute, interconnect_from_dict(LINKS, "t"))
    assert {c.measured.case.cp for c in checks} == {2}
    assert len(checks) == sum(r.status == "ok" and r.case.cp == 2 for r in run.cases)
    assert all(math.isfinite(c.error) and c.predicted.total_s > 0 for c in checks)
    with pytest.raises(ValueError, match="no measured cp 1 case"):
        fit_compute(
            [run],
            config=GatedDeltaNetConfig(
                hidden_size=8, num_k_heads=1, num_v_heads=1, head_k_dim=4, head_v_dim=4
            ),
        )


@pytest.mark.multirank
def test_calibration_on_two_ranks_fits_every_kind() -> None:
    links = calibrate((2,), sizes=(1 << 10, 1 << 16), repeats=2, timeout_s=60)
    assert set(links.links) == set(LINK_KINDS)
    assert all(link.latency_s >= 0 and link.bandwidth_bytes_s > 0 for link in links.links.values())
    assert len(links.samples) == 2 * len(LINK_KINDS) and links.source.startswith("measured")


def test_bench_model_check_and_table(tmp_path: Path, capsys) -> None:
    links = tmp_path / "links.yaml"
    links.write_text(yaml.safe_dump(LINKS), encoding="utf-8")
    assert main(["model", "check", str(SCALING), "--links", str(links)]) == 0
    assert "median absolute error" in capsys.readouterr().out
    md = tmp_path / "table.md"
    argv = ["model", "table", str(SCALING), "--links", str(links), "--cp", "2", "128", "--seq-len", "1048576"]
    assert main([*argv, "--markdown", str(md), "--memory-gib", "1"]) == 0
    out = capsys.readouterr().out
    assert "pick" in out and "heads 2/4 do not split over cp" in out
    text = md.read_text(encoding="utf-8")
    assert text.startswith("# Cost model") and "| 1024K | 128 |" in text and "typed for the test" in text
    assert main([*argv, "--markdown", str(md)]) == 1  # never overwritten
    assert "exists" in capsys.readouterr().err
    assert main(["model", "calibrate", "--cp", "1", "--output", str(tmp_path / "x.yaml")]) == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["calibrate", "--cp", "64", "--output", "x.yaml"], "--cp 64: more local ranks than the"),
        (["calibrate", "--cp", "1", "--output", "x.yaml"], "argument --cp: 1 is below 2"),
        (["table", "r.json", "--links", "l.yaml", "--cp", "0"], "argument --cp: 0 is below 1"),
        (["table", "r.json", "--links", "l.yaml", "--cp", "-3"], "argument --cp: -3 is below 1"),
        (["table", "r.json", "--links", "l.yaml", "--seq-len", "0"], "argument --seq-len: 0 is below 1"),
        (["table", "r.json", "--links", "l.yaml", "--memory-gib", "-1"], "--memory-gib: -1 must be a finite"),
        (
            ["table", "r.json", "--links", "l.yaml", "--cp", "two"],
            "argument --cp: 'two' is not a whole number",
        ),
    ],
)
def test_bad_model_arguments_are_one_line_before_anything_runs(argv, message, tmp_path, capsys, monkeypatch):
    """Issue 21: calibrate refuses more ranks than the host runs (it started 64 ranks on 2 cores), and the
    table refuses a cp, length or memory that cannot be (a ZeroDivisionError, or a table of nonsense)."""
    monkeypatch.chdir(tmp_path)
    assert main(["model", *argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err


def test_the_table_calls_a_tie_within_its_own_error() -> None:
    """Issue 20: two modes whose predicted steps differ by less than the model's error on the measured
    cases are a tie, not a pick by +0%; without a check the margin is given as unchecked."""
    best = Prediction(_case("p2p", 64, 1 << 20), compute_s=1.0, exchange_s=0.0, comm_s=0.0, peak_bytes=1)
    close = Prediction(_case("scan", 64, 1 << 20), compute_s=1.05, exchange_s=0.0, comm_s=0.0, peak_bytes=1)
    far = Prediction(_case("scan", 64, 1 << 20), compute_s=1.5, exchange_s=0.0, comm_s=0.0, peak_bytes=1)
    assert model_tables.why(best, [best, close], 0.11) == "scan +5% (tie)"
    assert model_tables.why(best, [best, far], 0.11) == "scan +50%"
    assert model_tables.why(best, [best, far], None) == "scan +50% (unchecked)"
    assert model_tables.why(best, [best], 0.11) == ""


def test_compute_of_another_device_is_refused(tmp_path: Path, capsys) -> None:
    """Issue 20: CPU cp 1 times say nothing of a GPU's step: links of cuda with a CPU run are refused,
    naming what to run."""
    links = tmp_path / "links.yaml"
    links.write_text(yaml.safe_dump({**LINKS, "device": "cuda"}), encoding="utf-8")
    assert main(["model", "table", str(SCALING), "--links", str(links)]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert (
        "measured on cpu, but" in err and "holds cuda links: compute must come from the target device" in err
    )
    assert "bench run gpu-smoke --filter cp=1" in err


def test_a_fit_says_how_well_it_fits_its_samples() -> None:
    """Issue 37: calibrate said nothing of the fit's quality (a p2p latency of 1104 us fitted against a
    whole 128 KiB call of 167 us). A latency above the fastest call, or a median error over 25%, is
    flagged."""
    link = Link(latency_s=100e-6, bandwidth_bytes_s=1e9)
    exact = [(2, n, link.time_s(steps("p2p", 2), wire_bytes("p2p", 2, n))) for n in (1 << 10, 1 << 17)]
    quality = fit_quality("p2p", link, exact)
    assert quality.median_error < 1e-12 and quality.trusted(link)
    wild = Link(latency_s=1104e-6, bandwidth_bytes_s=1e9)
    quality = fit_quality("p2p", wild, [(2, 1 << 17, 167e-6), (2, 1 << 10, 150e-6)])
    assert quality.smallest_s == 150e-6 and not quality.trusted(wild)
    samples = [{"kind": "p2p", "cp": 2, "bytes": 1 << 17, "seconds": 167e-6}]
    table = model_tables.links_table(Interconnect("gloo", "measured", {"p2p": wild}, samples=samples))
    assert table.rows[0][3:] == [
        f"{100 * fit_quality('p2p', wild, [(2, 1 << 17, 167e-6)]).median_error:.0f}%",
        "167 us",
    ]
    assert table.notes and table.notes[0].startswith("p2p: not a fit to trust")
