"""bench's preflight and a backend whose kernels cannot run in Triton's interpreter here (issue 49): a Triton
without what gdn_cp.ops.backends.interpreter patches raised InterpreterSupportError in every rank, a
traceback each; the preflight refuses the case in one line naming the scenario's backend field, before any
rank starts. Interpreted kernels that can run are still checked (bench verify), never timed."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny import tiny_scenario

from bench.errors import UserError
from bench.launch.preflight import check_cases
from bench.suite.config import Sweep
from bench.suite.loader import Locator
from gdn_cp.distributed import resolve_platform
from gdn_cp.ops import Backend, recurrent_gated_delta_rule, unregister_backend
from gdn_cp.ops.backends import add_backend

PROBLEM = (
    "triton 9.9 has no triton.runtime.autotuner.Autotuner, which running FLA's kernels under "
    "TRITON_INTERPRET=1 replaces: pin the Triton the project tests with (see .ci/run)"
)


def _op(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, **kw):
    return recurrent_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state)


@pytest.fixture
def interpreted_backends():
    for name, problem in (("unpatchable", PROBLEM), ("patchable", None)):
        add_backend(
            Backend(
                name=name,
                description="test",
                load=lambda: _op,
                interpreted=lambda: True,
                interpreter_problem=lambda problem=problem: problem,
            )
        )
    yield
    for name in ("unpatchable", "patchable"):
        unregister_backend(name)


def _check(backend: str, *, timed: bool) -> None:
    scenario = tiny_scenario(sweep=Sweep(cp=[2], seq_len=[32], mode=["p2p"], backend=[backend]))
    locate = Locator(Path("scenarios/s.yaml"), {("backend",): 7}, ())
    platform = resolve_platform("cpu")
    cases = scenario.cases(warmup=0, repeat=1)
    check_cases(
        locate,
        scenario,
        cases,
        platform=platform,
        ranks_on_host=lambda c: c.cp,
        max_local_ranks=None,
        timed=timed,
    )


def test_an_interpreter_the_kernels_cannot_run_in_is_refused_in_one_line(interpreted_backends):
    with pytest.raises(UserError) as error:
        _check("unpatchable", timed=False)
    message = str(error.value)
    assert "\n" not in message and "scenarios/s.yaml:7" in message, message
    assert f": {PROBLEM}; or leave its cases out with --filter backend=gdn_cp" in message
    _check("patchable", timed=False)  # bench verify checks interpreted kernels that run
    with pytest.raises(UserError, match="would run in Triton's interpreter here"):
        _check("patchable", timed=True)  # and never times them
