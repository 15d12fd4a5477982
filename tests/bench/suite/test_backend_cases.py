"""The `backend` scenario key (gdn_cp.ops.backends) in the suite: swept like any other list, case ids tagged
only for another backend than the default, recorded in each case's layer and the environment's kernel
versions, and refused before any rank starts where it cannot run here (one line naming the field and the
fix); `bench list` lists a GPU scenario's backends on any host."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from tiny import TINY_LAYER_YAML, tiny_scenario

from bench.cli import main
from bench.commands import run as run_command
from bench.errors import UserError
from bench.launch.preflight import check_cases
from bench.results.store import load_result
from bench.suite.config import Sweep
from bench.suite.loader import Locator
from gdn_cp.distributed import resolve_platform
from gdn_cp.ops import Backend, recurrent_gated_delta_rule, unregister_backend
from gdn_cp.ops.backends import add_backend


def test_the_backend_sweeps_and_tags_only_other_backends():
    scenario = tiny_scenario(
        sweep=Sweep(cp=[2], seq_len=[32], mode=["p2p"], backend=["gdn_cp", "transformers"])
    )
    cases = scenario.cases(warmup=0, repeat=1)
    ids = sorted(c.case_id for c in cases)
    assert "p2p-ckpt-cp2-T32-fwd" in ids and "p2p-ckpt-cp2-T32-fwd-transformers" in ids
    assert {c.backend for c in cases} == {"gdn_cp", "transformers"}
    assert all(c.layer.backend == c.backend for c in cases)


def test_an_unknown_backend_is_one_line_naming_the_field(suite_dir: Path, capsys):
    assert main(["run", "--set", "backend=[triton_ref]"]) == 1
    err = capsys.readouterr().err
    assert "backend: unknown backend 'triton_ref'" in err and "gdn_cp.ops.register_backend" in err
    assert "--backend-module MODULE or BENCH_BACKENDS=MODULE" in err
    assert err.count("\n") == 1


@pytest.mark.skipif(importlib.util.find_spec("fla") is not None, reason="fla is installed here")
def test_a_backend_whose_package_is_missing_is_refused_before_any_rank(suite_dir: Path, capsys):
    assert main(["run", "--set", "backend=[fla]", "--set", "chunk_size=16"]) == 1
    err = capsys.readouterr().err
    assert "backend: case " in err and "fla" in err and "--filter backend=gdn_cp" in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert (
        main(["list", "tiny", "--set", "backend=[fla]", "--set", "chunk_size=16"]) == 0
    )  # no kernels needed


def _interpreted(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, **kw):
    return recurrent_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state)


def test_interpreted_kernels_are_checked_but_never_timed():
    add_backend(
        Backend(name="interp", description="test", load=lambda: _interpreted, interpreted=lambda: True)
    )
    try:
        scenario = tiny_scenario(sweep=Sweep(cp=[2], seq_len=[32], mode=["p2p"], backend=["interp"]))
        cases = scenario.cases(warmup=0, repeat=1)
        locate = Locator(Path("scenarios/s.yaml"), {("backend",): 3}, ())
        kw = {"platform": resolve_platform("cpu"), "ranks_on_host": lambda c: c.cp, "max_local_ranks": None}
        check_cases(locate, scenario, cases, timed=False, **kw)  # bench verify
        with pytest.raises(UserError, match="would run in Triton's interpreter here"):
            check_cases(locate, scenario, cases, timed=True, **kw)
    finally:
        unregister_backend("interp")


def test_a_run_records_the_backend_and_the_kernel_versions(suite_dir: Path, write_scenario):
    write_scenario(
        "peer",
        TINY_LAYER_YAML + "cp: [2]\nseq_len: [32]\nmode: [scan]\npass: [forward_backward]\n"
        "backend: [transformers]\nwarmup: 0\nrepeat: 1\nrounds: 1\n",
    )
    pytest.importorskip("transformers", reason="backend transformers is transformers' torch fallback")
    out = suite_dir / "peer.json"
    assert run_command.run(["peer"], output=str(out)) == 0
    run = load_result(out)
    (case,) = run.cases
    assert case.status == "ok" and case.case.case_id == "scan-ckpt-cp2-T32-fwd_bwd-transformers"
    assert case.case.layer.backend == "transformers"
    versions = run.environment.kernel_versions
    assert versions["transformers"] not in ("", "absent") and set(versions) >= {"fla-core", "triton"}
