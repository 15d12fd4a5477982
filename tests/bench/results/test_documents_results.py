"""Results of cases in the zigzag layout or with packed documents: stored and validated (schema), exported,
shown in their own rows, set against the same tokens unpacked, and kept out of the charts' one-input views."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bench.errors import UserError
from bench.judge import analysis
from bench.judge.reference import reference_tables
from bench.render.tables import documents_table, reference_table_data
from bench.results.export import export_rows
from bench.results.schema import result_schema
from bench.results.store import CaseResult, RunResult, load_result, save_result
from bench.suite.documents import Documents

FIXTURES = Path(__file__).parents[1] / "fixtures"
PACKED = Documents(count=4, lengths="lognormal")


def _variant(result: CaseResult, factor: float, **case) -> CaseResult:
    """`result` as another case (layout, documents), its times (rounds, estimate, summary) scaled by
    `factor`."""
    assert result.timing is not None and result.estimate is not None
    rounds = [
        dataclasses.replace(r, samples_s=[[x * factor for x in rank] for rank in r.samples_s])
        for r in result.rounds
    ]
    return dataclasses.replace(
        result,
        case=dataclasses.replace(result.case, **case),
        rounds=rounds,
        estimate=dataclasses.replace(result.estimate, median_s=result.estimate.median_s * factor),
        timing=dataclasses.replace(result.timing, median_s=result.timing.median_s * factor),
    )


def packed_run() -> RunResult:
    """The ablation fixture plus, for p2p checkpoint on at cp 2: zigzag, packed (1.5x) and zigzag packed
    (2x the zigzag time)."""
    run = load_result(FIXTURES / "ablation.json")
    (base,) = [c for c in run.cases if c.case.case_id == "p2p-ckpt-cp2-T64-fwd_bwd"]
    zigzag = _variant(base, 1.25, layout="zigzag")
    extra = [
        zigzag,
        _variant(base, 1.5, documents=PACKED),
        _variant(zigzag, 2.0, documents=PACKED),
    ]
    return dataclasses.replace(run, cases=[*run.cases, *extra])


def test_a_run_with_packed_cases_round_trips_and_validates(tmp_path: Path):
    run = packed_run()
    path = tmp_path / "packed.json"
    save_result(run, path)
    data = json.loads(path.read_text())
    jsonschema = pytest.importorskip(
        "jsonschema", reason="jsonschema (an independent validator, the dev extra) is not installed"
    )
    jsonschema.validate(data, result_schema())
    case = data["cases"][-1]["case"]
    assert case["case_id"] == "p2p-ckpt-cp2-T64-zigzag-docs4-lognormal-fwd_bwd"
    assert case["layout"] == "zigzag" and case["documents"]["count"] == 4
    assert load_result(path).cases == run.cases
    # a wrong documents mapping is named
    path.write_text(path.read_text().replace('"lengths": "lognormal"', '"lengths": "zipf"'))
    with pytest.raises(UserError, match=r"cases\[\d+\]\.case\.documents\.lengths: input should be"):
        load_result(path)


def test_export_has_layout_and_the_documents_tag():
    rows = export_rows(packed_run())
    assert [(r["layout"], r["documents"]) for r in rows[-4:]] == [
        ("contiguous", "none"),
        ("zigzag", "none"),
        ("contiguous", "docs4-lognormal"),
        ("zigzag", "docs4-lognormal"),
    ]


def test_reference_tables_keep_every_input_in_its_own_row():
    run = packed_run()
    (cp2,) = [t for t in reference_tables(run) if t.cp == 2]
    p2p = [(r.layout, r.documents) for r in cp2.rows if r.mode == "p2p" and r.checkpoint]
    assert p2p == [
        ("contiguous", "none"),
        ("zigzag", "none"),
        ("contiguous", "docs4-lognormal"),
        ("zigzag", "docs4-lognormal"),
    ]
    data = reference_table_data(cp2, run)
    assert data.headers[2:5] == ["summary ckpt", "layout", "documents"]
    # a table of contiguous unpacked cases keeps its old columns
    (cp1,) = [t for t in reference_tables(run) if t.cp == 1]
    assert "layout" not in reference_table_data(cp1, run).headers


def test_documents_table_sets_packed_against_unpacked():
    table = documents_table(packed_run())
    assert table is not None
    ratios = [(row[3], row[8]) for row in table.rows]
    assert ratios == [("contiguous", "1.50x"), ("zigzag", "2.00x")]
    assert documents_table(load_result(FIXTURES / "ablation.json")) is None  # nothing packed


def test_charts_read_the_contiguous_unpacked_cases():
    run = packed_run()
    assert analysis.primary_input(run, "tiny-ablation") == ("contiguous", "none")
    found = analysis.find(run, "tiny-ablation", analysis.Variant("p2p", True), 2, 64, "forward_backward")
    assert found is not None and found.case.case_id == "p2p-ckpt-cp2-T64-fwd_bwd"
    # a scenario that ran zigzag only is charted in zigzag
    zigzag_only = dataclasses.replace(run, cases=[c for c in run.cases if c.case.layout == "zigzag"])
    assert analysis.primary_input(zigzag_only, "tiny-ablation") == ("zigzag", "none")
    assert analysis.find(
        zigzag_only, "tiny-ablation", analysis.Variant("p2p", True), 2, 64, "forward_backward"
    )
