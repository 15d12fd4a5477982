"""Result files: the records read and write them (bench.records), docs/result-schema.json is generated from
the same records and never stale, every committed result file validates against it (older versions once
converted, as load_result reads them), and a bad value is refused naming its file, line and path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.errors import UserError
from bench.records import to_dict
from bench.results.migrate import ADDED_IN_2, SCHEMA_VERSION, STEPS, upgrade
from bench.results.schema import result_schema, schema_text
from bench.results.store import load_result, result_text, save_result
from gdn_cp.distributed import MODES

ROOT = Path(__file__).resolve().parents[3]
SCHEMA_FILE = ROOT / "docs" / "result-schema.json"
FIXTURES = ROOT / "tests" / "bench" / "fixtures"
RESULT_FILES = sorted([*(ROOT / "results").glob("*.json"), *FIXTURES.glob("*.json")])


def test_the_committed_schema_is_the_generated_one():
    assert SCHEMA_FILE.read_text() == schema_text(), (
        "docs/result-schema.json is stale: python -m bench.results.schema > docs/result-schema.json"
    )


@pytest.mark.parametrize("path", RESULT_FILES, ids=lambda p: p.name)
def test_every_result_file_loads_and_what_it_writes_validates(path: Path, tmp_path: Path):
    """Each committed file reads (converted from its version), and the file this bench writes of it is
    valid under the published schema (checked by jsonschema, not by the code that wrote it) and reads back
    the same."""
    run = load_result(path)
    again = tmp_path / "again.json"
    save_result(run, again)
    data = json.loads(again.read_text())
    jsonschema = pytest.importorskip(
        "jsonschema", reason="jsonschema (an independent validator, the dev extra) is not installed"
    )
    jsonschema.validate(data, result_schema())
    assert data["schema_version"] == SCHEMA_VERSION and load_result(again) == run


def test_the_schema_describes_fields_and_the_layout():
    schema = result_schema()
    defs = schema["$defs"]
    assert (
        schema["$schema"].endswith("2020-12/schema") and f"schema_version {SCHEMA_VERSION}" in schema["title"]
    )
    assert schema["properties"]["cases"]["items"] == {"$ref": "#/$defs/CaseResult"}
    assert "command" in schema["properties"] and "RunResult" not in defs  # the root is the file itself
    rounds = defs["CaseResult"]["properties"]["rounds"]
    assert (
        rounds["items"] == {"$ref": "#/$defs/RoundResult"} and "samples_s" in defs["RoundResult"]["required"]
    )
    assert defs["Estimate"]["properties"]["median_s"]["description"].startswith(
        "The estimate: geometric mean"
    )
    case = defs["Case"]["properties"]
    assert "pass" in case and "pass_" not in case and case["local_seq_len"]["type"] == "integer"
    assert case["case_id"]["readOnly"] and "case_id" in defs["Case"]["required"]  # derived, always written
    assert case["mode"]["enum"] == list(MODES)
    assert case["layer"] == {
        "$ref": "#/$defs/GatedDeltaNetConfig",
        "description": "The layer, in the case's dtype.",
    }
    layer = defs["GatedDeltaNetConfig"]["properties"]
    assert layer["hidden_size"]["description"].startswith("Model width")
    assert "bf16" in layer["dtype"]["anyOf"][0]["enum"]
    assert defs["TimingSummary"]["properties"]["median_s"]["description"].startswith("Median over repeats")
    assert defs["TrainVerification"]["properties"]["kind"]["const"] == "train"
    assert "cp_loss" in defs["TrainVerification"]["properties"]  # inherited from Trajectory
    assert defs["TrainVerification"]["properties"]["settings"] == {
        "$ref": "#/$defs/TrainSettings",
        "description": "The model and optimizer settings.",
    }


def _written(tmp_path: Path) -> tuple[Path, list[str]]:
    """A fixture converted to this version and written by this bench, and its lines."""
    path = tmp_path / "run.json"
    save_result(load_result(FIXTURES / "ablation.json"), path)
    return path, path.read_text().splitlines()


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            '"median_s": ',
            '"median_s": "fast", "x": ',
            'estimate.median_s: input should be a valid number, got "fast"',
        ),
        (
            '"mode": "p2p"',
            '"mode": "ring"',
            "case.mode: input should be 'ulysses', 'p2p', 'all_gather' or 'scan'",
        ),
        ('"repeat": 3', '"repeat": 3.5', "case.repeat: input should be a valid integer, got 3.5"),
        ('"status": "ok"', '"status": "ok", "colour": 1', "colour: unknown key"),
        (
            '"hidden_size": 32',
            '"hidden_size": "32"',
            "case.layer.hidden_size: input should be a valid integer",
        ),
    ],
)
def test_a_bad_value_is_refused_with_its_file_line_and_path(
    tmp_path: Path, old: str, new: str, expected: str
):
    path, lines = _written(tmp_path)
    number = next(i for i, line in enumerate(lines) if '"case": {' in line and old in line)
    index = number - lines.index(' "cases": [') - 1
    lines[number] = lines[number].replace(old, new, 1)
    path.write_text("\n".join(lines))
    with pytest.raises(UserError) as info:
        load_result(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{number + 1}: cases[{index}].{expected}"), message
    assert message.endswith("give a file that `bench run` wrote (or correct that value)")


def test_a_missing_key_names_the_record_that_lacks_it(tmp_path: Path):
    path, _ = _written(tmp_path)
    data = json.loads(path.read_text())
    del data["cases"][2]["case"]["cp"]
    del data["name"]
    path.write_text(result_text(data))
    with pytest.raises(UserError, match=r":1: name: field required"):
        load_result(path)
    data["name"] = "x"
    path.write_text(result_text(data))
    with pytest.raises(UserError, match=r":\d+: cases\[2\]\.case\.cp: field required"):
        load_result(path)


def test_version_2_files_mean_what_they_meant(tmp_path: Path):
    """A version-2 file written before overlap, layouts, documents, precision, throughput and contention
    existed reads with the values those runs had (ADDED_IN_2); the layer's keys nest as the case's layer,
    whose op was the project's own, on kernels of unknown version."""
    path, _ = _written(tmp_path)
    data = json.loads(path.read_text())
    v2 = {**data, "schema_version": 2}
    for key in ADDED_IN_2["run"]:
        del v2[key]
    v2["environment"] = {k: v for k, v in data["environment"].items() if k != "kernel_versions"}
    v2["cases"] = []
    for result in data["cases"]:
        case = result["case"]
        params = {k: v for k, v in case.items() if k not in (*ADDED_IN_2["case"], "layer")}
        params |= {k: v for k, v in case["layer"].items() if k not in ("rms_norm_eps", "backend")}
        old = {k: v for k, v in result.items() if k not in (*ADDED_IN_2["case result"], "case")}
        v2["cases"].append({**old, "params": params})
    upgraded = upgrade(v2)
    assert upgraded["schema_version"] == SCHEMA_VERSION and sorted(STEPS) == [1, 2, 3, 4, 5, 6]
    path.write_text(json.dumps(v2))
    run = load_result(path)
    first = run.cases[0]
    assert (first.case.overlap, first.case.layout, first.case.documents, first.case.precision) == (
        False,
        "contiguous",
        None,
        "fp32",
    )
    assert first.throughput is None and first.contention is None and run.command is None
    assert first.case.layer.backend == "gdn_cp" and run.environment.kernel_versions == {}
    assert first.case.layer.rms_norm_eps == 1e-6 and first.case.case_id == data["cases"][0]["case"]["case_id"]


def test_version_6_files_read_with_what_ran_not_recorded(tmp_path: Path):
    """Version 6 recorded neither what ran nor the gate's checks nor the first pass's time: they read as not
    recorded (None), and `bench show --case` says so."""
    path, _ = _written(tmp_path)
    data = json.loads(path.read_text())
    v6 = {**data, "schema_version": 6}
    v6["cases"] = [
        {k: v for k, v in c.items() if k not in ("ran", "check")}
        | {"rounds": [{k: v for k, v in r.items() if k != "first_use_s"} for r in c["rounds"]]}
        for c in data["cases"]
    ]
    path.write_text(json.dumps(v6))
    run = load_result(path)
    assert all(c.ran is None and c.check is None for c in run.cases)
    assert all(r.first_use_s is None for c in run.cases for r in c.rounds)


def test_version_4_files_read_without_lifetimes_or_harness(tmp_path: Path):
    """Version 4 had no round lifetimes and no `measured_by`: they read as unknown, so no round pairs."""
    path, _ = _written(tmp_path)
    data = json.loads(path.read_text())
    v4 = {k: v for k, v in data.items() if k != "measured_by"} | {"schema_version": 4}
    v4["cases"] = [
        {**c, "rounds": [{k: v for k, v in r.items() if k != "lifetime"} for r in c["rounds"]]}
        for c in data["cases"]
    ]
    path.write_text(json.dumps(v4))
    run = load_result(path)
    assert run.measured_by is None and run.schema_version == SCHEMA_VERSION
    assert all(r.lifetime is None for c in run.cases for r in c.rounds) and run.cases[0].rounds


def test_a_converted_file_that_is_wrong_says_it_was_converted(tmp_path: Path):
    path = tmp_path / "old.json"
    data = json.loads((FIXTURES / "ablation.json").read_text())
    assert data["schema_version"] < SCHEMA_VERSION and "command" not in data
    data["command"] = "bench run"
    path.write_text(json.dumps(data))
    with pytest.raises(
        UserError, match=r"old.json: command: input should be a valid array.*\(converted from schema 1\)"
    ):
        load_result(path)


def test_records_write_every_key_and_the_derived_ones(tmp_path: Path):
    run = load_result(FIXTURES / "ablation.json")
    case = to_dict(run.cases[0].case)
    assert (
        case["case_id"] == run.cases[0].case.case_id
        and case["local_seq_len"] == run.cases[0].case.local_seq_len
    )
    assert set(case) >= {*ADDED_IN_2["case"], "layer"}
