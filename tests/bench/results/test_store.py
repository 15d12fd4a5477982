"""Result files: round trip, atomic writes, replacing a case's result, refusing other schemas, file names."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest
from tiny import tiny_scenario

from bench.errors import UserError
from bench.launch.devices import host_device_name
from bench.measure.statistics import estimate
from bench.measure.timing import summarize
from bench.records import from_dict, to_dict
from bench.results import store
from bench.results.env import collect_environment
from bench.results.paths import free_path, new_folder, result_filename
from bench.results.store import (
    SCHEMA_VERSION,
    CaseResult,
    MemoryResult,
    ResultWriteError,
    ResultWriter,
    RoundResult,
    RunResult,
    load_result,
)
from bench.suite.config import SuiteConfig, Sweep
from gdn_cp.distributed import resolve_platform
from tests.bench.results.read_only import read_only

SCENARIO = tiny_scenario(
    sweep=Sweep(cp=[2], seq_len=[64]),
)
CASES = SCENARIO.cases(warmup=1, repeat=3)


def ok_result(i: int = 0) -> CaseResult:
    samples = [[0.010, 0.011, 0.012], [0.011, 0.013, 0.010]]
    return CaseResult(
        case=CASES[i],
        status="ok",
        rounds=[RoundResult(samples_s=samples, wall_s=1.2), RoundResult(samples_s=samples, position=3)],
        estimate=estimate([0.012, 0.012]),
        timing=summarize(samples),
        memory=MemoryResult(
            peak_bytes=3 * 2**20,
            per_rank_bytes=[3 * 2**20, 2 * 2**20],
            baseline_bytes=[1, 1],
            meter="cpu-profiler",
        ),
        wall_s=2.5,
    )


def new_run() -> RunResult:
    platform = resolve_platform("cpu")
    env = collect_environment(
        platform,
        device_name=host_device_name(platform),  # this host's, as a run here records it
        threads_per_rank=None,
        world_sizes=[2],
        launcher="local",
    )
    scenarios = {"s": SCENARIO.to_dict()}
    return RunResult(name="s", environment=env, suite=SuiteConfig(repeat=3), scenarios=scenarios)


def test_round_trip(tmp_path: Path):
    run = new_run()
    run.cases = [
        ok_result(0),
        CaseResult(case=CASES[1], status="failed", error="rank 1 failed: OOM", wall_s=1.0),
    ]
    path = tmp_path / "r.json"
    store.save_result(run, path)
    back = load_result(path)
    assert back == run
    assert back.cases[0].timing.median_s == pytest.approx(0.012)
    assert back.ok_keys() == {CASES[0].key()}
    assert back.get(CASES[1].key()).error == "rank 1 failed: OOM"
    data = json.loads(path.read_text())
    assert data["schema_version"] == SCHEMA_VERSION and data["cases"][0]["case"]["pass"] == "forward"


def test_writer_writes_after_every_case_and_replaces_a_retried_case(tmp_path: Path):
    path = tmp_path / "sub" / "r.json"
    writer = ResultWriter(path, new_run())
    assert load_result(path).cases == []
    writer.add(CaseResult(case=CASES[0], status="failed", error="boom"))
    assert [c.status for c in load_result(path).cases] == ["failed"]
    writer.add(ok_result(0))
    writer.add(ok_result(1))
    resumed = ResultWriter.resume(path)
    assert [c.status for c in resumed.run.cases] == ["ok", "ok"]
    assert resumed.run.ok_keys() == {CASES[0].key(), CASES[1].key()}


def test_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "r.json"
    writer = ResultWriter(path, new_run())
    writer.add(ok_result(0))
    before = path.read_text()

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # e.g. Ctrl-C in the middle of writing

    monkeypatch.setattr(store, "result_text", crash)  # raised while the temporary file is open
    with pytest.raises(KeyboardInterrupt):
        writer.add(ok_result(1))
    assert path.read_text() == before  # the old file is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]  # no temporary file left


def test_a_folder_turned_read_only_is_a_write_error_and_the_file_stays_whole(tmp_path: Path, monkeypatch):
    """The temporary file itself cannot be made (tempfile.mkstemp, before the write): a ResultWriteError
    naming the file (what `bench run` says in one line), never a bare OSError; the file keeps what it held,
    and once the folder is writable the writer goes on."""
    path = tmp_path / "r.json"
    writer = ResultWriter(path, new_run())
    writer.add(ok_result(0))
    before = path.read_text()
    with read_only(tmp_path, monkeypatch), pytest.raises(ResultWriteError) as info:
        writer.add(ok_result(1))
    assert info.value.strerror.startswith(f"cannot write {path}: ")
    assert path.read_text() == before and writer.saved == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
    writer.add(ok_result(1))
    assert [c.key for c in load_result(path).cases] == [CASES[0].key(), CASES[1].key()]


@pytest.mark.parametrize("version", [0, SCHEMA_VERSION + 1, None])
def test_other_schema_versions_are_refused_with_what_to_do(tmp_path: Path, version):
    path = tmp_path / "r.json"
    store.save_result(new_run(), path)
    data = json.loads(path.read_text())
    data["schema_version"] = version
    path.write_text(json.dumps(data))
    with pytest.raises(UserError) as info:
        load_result(path)
    readable = f"1, 2, 3, 4, 5, 6, {SCHEMA_VERSION}"
    assert f"schema_version {version!r} is not a version this bench reads ({readable}; it writes " in str(
        info.value
    )
    assert "re-run its scenarios with this bench" in str(info.value)


def test_schema_1_files_load_with_their_samples_as_one_round():
    """A file written before rounds (frozen fixture, schema_version 1): each ok case's samples become its one
    round, and its estimate is that round's median, with no interval."""
    path = Path(__file__).parents[1] / "fixtures" / "scaling.json"
    assert json.loads(path.read_text())["schema_version"] == 1
    data = json.loads(path.read_text())["cases"]
    run = load_result(path)
    assert run.schema_version == SCHEMA_VERSION and run.schedule_seed is None and run.session is None
    for stored, case in zip(data, run.cases, strict=True):
        assert case.status == stored["status"]
        if case.status != "ok":
            continue
        (only,) = case.rounds
        assert only.samples_s == stored["samples_s"] == case.samples_s
        assert case.estimate.median_s == pytest.approx(case.timing.median_s)
        assert case.estimate.rounds == 1 and case.estimate.low_s is None and case.estimate.high_s is None
    # and written back, it is a file of this version that reads the same
    again = from_dict(RunResult, to_dict(run))
    assert again.cases == run.cases


def test_unreadable_files(tmp_path: Path):
    with pytest.raises(UserError, match="no such result file"):
        load_result(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text('{\n  "schema_version": 1,\n')
    with pytest.raises(UserError, match=r"bad.json:3: not valid JSON"):
        load_result(tmp_path / "bad.json")
    (tmp_path / "odd.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION, "name": "x"}))
    with pytest.raises(UserError, match=r"odd.json:1: environment: field required; give a file"):
        load_result(tmp_path / "odd.json")


def test_result_filename_is_sanitised():
    when = datetime.datetime(2025, 7, 13, 9, 5, 1)
    assert result_filename(when, "feature/cp p2p", "0123456789abcdef", "cpu-smoke+npu cp4") == (
        "20250713-090501-feature-cp-p2p-01234567-cpu-smoke+npu-cp4.json"
    )


def test_files_that_are_not_result_files_are_one_clear_error(tmp_path: Path, monkeypatch):
    with pytest.raises(UserError, match=r"is a folder, not a result file; give one of the .json files"):
        load_result(tmp_path)
    (tmp_path / "binary.json").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    with pytest.raises(UserError, match=r"binary.json: not a text file \(byte 0 is not UTF-8\)"):
        load_result(tmp_path / "binary.json")
    store.save_result(new_run(), tmp_path / "locked.json")

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    with monkeypatch.context() as m:  # chmod 000 does not stop root, who runs some CI
        m.setattr(Path, "read_text", denied)
        with pytest.raises(UserError, match=r"locked.json: cannot read it \(Permission denied\)"):
            load_result(tmp_path / "locked.json")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "median_s",
            "fast",
            r"cases\[0\].timing.median_s: input should be a valid number, got \"fast\"; give a file",
        ),
        ("rank_medians_s", [1.0, None], r"cases\[0\].timing.rank_medians_s\[1\]: input should be a valid"),
        ("noisy", "no", r"cases\[0\].timing.noisy: input should be a valid boolean, got \"no\""),
    ],
)
def test_values_of_the_wrong_type_are_refused_on_reading(tmp_path: Path, field, value, message):
    run = new_run()
    run.cases = [ok_result(0)]
    path = tmp_path / "r.json"
    store.save_result(run, path)
    data = json.loads(path.read_text())
    data["cases"][0]["timing"][field] = value
    path.write_text(json.dumps(data))
    with pytest.raises(UserError, match=message):
        load_result(path)
    data["cases"][0]["timing"] = ["not", "a", "mapping"]
    path.write_text(json.dumps(data))
    with pytest.raises(UserError, match=r"r.json:\d+: cases\[0\]\.timing: input should be"):
        load_result(path)


def test_a_new_file_never_replaces_an_existing_one(tmp_path: Path):
    path = tmp_path / "r.json"
    first = ResultWriter(path, new_run())
    with pytest.raises(FileExistsError):
        ResultWriter(path, new_run())
    assert load_result(path) == first.run
    # default names (one-second resolution) are numbered instead
    second = ResultWriter(path, new_run(), numbered=True)
    third = ResultWriter(path, new_run(), numbered=True)
    assert (first.path, second.path, third.path) == (path, tmp_path / "r-2.json", tmp_path / "r-3.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r-2.json", "r-3.json", "r.json"]  # no temp files
    assert new_folder(tmp_path / "plots") == tmp_path / "plots"
    assert new_folder(tmp_path / "plots") == tmp_path / "plots-2"
    assert free_path(tmp_path / "plots") == tmp_path / "plots-3" and not (tmp_path / "plots-3").exists()


def test_a_result_file_has_a_line_per_case_and_reads_back_equal(tmp_path: Path):
    run = load_result(Path(__file__).parents[1] / "fixtures" / "ablation.json")
    path = tmp_path / "run.json"
    store.save_result(run, path)
    text = path.read_text()
    assert json.loads(text) == to_dict(run) and load_result(path) == run
    lines = text.splitlines()
    assert lines[0] == "{" and lines[-1] == "}"
    item_lines = [line for line in lines if line.startswith("  {")]
    assert len(item_lines) == len(run.cases) + len(run.verifications)  # one line per case
