"""docs/result-schema.json: generated from the result dataclasses, never stale, and every committed result
file validates against it (older schema versions once converted, as load_result reads them)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from bench.results.migrate import upgrade
from bench.results.schema import result_schema, schema_text, validate
from bench.results.store import SCHEMA_VERSION, load_result
from gdn_cp.distributed import MODES

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILE = ROOT / "docs" / "result-schema.json"
RESULT_FILES = sorted(
    [*(ROOT / "results").glob("*.json"), *(ROOT / "tests" / "bench" / "fixtures").glob("*.json")]
)


def test_the_committed_schema_is_the_generated_one():
    assert SCHEMA_FILE.read_text() == schema_text(), (
        "docs/result-schema.json is stale: python -m bench.results.schema > docs/result-schema.json"
    )


@pytest.mark.parametrize("path", RESULT_FILES, ids=lambda p: p.name)
def test_every_result_file_validates(path: Path):
    assert validate(upgrade(json.loads(path.read_text())), result_schema()) == []


def test_the_schema_describes_fields_and_the_layout():
    schema = result_schema()
    defs = schema["$defs"]
    assert schema["$ref"] == "#/$defs/RunResult" and schema["$schema"].endswith("2020-12/schema")
    run = defs["RunResult"]
    assert "command" in run["properties"] and "command" not in run["required"]  # older files lack it
    assert run["properties"]["schema_version"]["const"] == SCHEMA_VERSION == 2
    rounds = defs["CaseResult"]["properties"]["rounds"]
    assert (
        rounds["items"] == {"$ref": "#/$defs/RoundResult"} and "samples_s" in defs["RoundResult"]["required"]
    )
    assert defs["Estimate"]["properties"]["median_s"]["description"].startswith(
        "The estimate: geometric mean"
    )
    case = defs["Case"]["properties"]
    assert "pass" in case and "pass_" not in case and case["local_seq_len"]["type"] == "integer"
    assert case["mode"]["enum"] == list(MODES)
    assert defs["CaseResult"]["properties"]["params"] == {
        "description": "The case as it ran (its full configuration; `params` in the file).",
        "$ref": "#/$defs/Case",
    }
    assert defs["TimingSummary"]["properties"]["median_s"]["description"].startswith("Median over repeats")
    assert defs["TrainVerification"]["properties"]["kind"]["const"] == "train"
    assert "cp_loss" in defs["TrainVerification"]["properties"]  # inherited from Trajectory


def test_the_validator_names_what_is_wrong():
    schema = result_schema()
    data = upgrade(json.loads((ROOT / "tests" / "bench" / "fixtures" / "ablation.json").read_text()))
    bad = copy.deepcopy(data)
    bad["cases"][0]["timing"]["median_s"] = "fast"
    bad["cases"][1]["params"]["mode"] = "ring"
    bad["environment"]["extra"] = 1
    del bad["name"]
    bad["command"] = "bench run"
    errors = validate(bad, schema)
    assert "$: missing key 'name'" in errors
    assert "$.environment: unknown key 'extra'" in errors
    assert any(e.startswith("$.cases[0].timing.median_s: expected number") for e in errors)
    assert any(e.startswith("$.cases[1].params.mode: expected one of") for e in errors)
    assert any(e.startswith("$.command: expected array") for e in errors)
    assert len(errors) == 5


def test_files_without_a_command_still_load(tmp_path: Path):
    path = tmp_path / "old.json"
    data = json.loads((ROOT / "tests" / "bench" / "fixtures" / "ablation.json").read_text())
    assert "command" not in data
    path.write_text(json.dumps(data))
    assert load_result(path).command is None
    data["command"] = ["bench", "run", "tiny-ablation"]
    path.write_text(json.dumps(data))
    assert load_result(path).command == ["bench", "run", "tiny-ablation"]
    data["command"] = "bench run"
    path.write_text(json.dumps(data))
    with pytest.raises(Exception, match="command: expected a list of strings"):
        load_result(path)
