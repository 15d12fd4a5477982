"""FLA's Triton kernels, interpreted on the CPU (gdn_cp.ops.backends.fla): these tests run in an environment
of their own, with triton and fla-core and without transformers (transformers switches to FLA's kernels
whenever fla imports), under TRITON_INTERPRET=1; `.ci/run` builds it. Elsewhere they skip, saying why."""

from __future__ import annotations

import importlib.util
import os

import pytest

from gdn_cp.ops.backends import InterpreterSupportError, support_interpreter
from gdn_cp.ops.backends.fla import triton_interpreted


def _why_not() -> str | None:
    if importlib.util.find_spec("fla") is None:
        return "fla-core is not installed here: these run in .ci/run's FLA environment (.venv-fla)"
    if not triton_interpreted():
        return "TRITON_INTERPRET=1 is not set: FLA's kernels run on a CPU only under Triton's interpreter"
    try:
        support_interpreter()
    except InterpreterSupportError as error:
        return str(error)
    return None


def pytest_collection_modifyitems(config, items) -> None:
    reason = _why_not()
    if reason is None:
        return
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.skip(reason=reason))
