"""A user's backend module in a temporary folder, what --backend-module and BENCH_BACKENDS name
(bench.launch.user_backends), and the state it leaves in this process undone after the test: the module
imported, its backend registered, bench's and gdn_cp's records of both."""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.launch import user_backends
from gdn_cp.ops import backend_names, unregister_backend
from gdn_cp.ops.backends import plugins

KERNEL = '''\
"""A user's kernel module: gdn_cp's chunked op behind another name, registered as the module imports."""

from gdn_cp.ops import chunk_gated_delta_rule, register_backend


def {backend}_rule(*args, **kwargs):
    return chunk_gated_delta_rule(*args, **kwargs)


register_backend("{backend}", {backend}_rule)
'''


@dataclass(frozen=True)
class UserModule:
    """A module `name` in `folder` that registers backend `backend` (its op `<backend>_rule`)."""

    name: str
    backend: str
    folder: Path

    @property
    def path(self) -> Path:
        return self.folder / f"{self.name}.py"

    @property
    def op(self) -> str:
        """The op's `module.qualname`, as what ran records it (gdn_cp.ops.ran)."""
        return f"{self.name}.{self.backend}_rule"


def _user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, folder: str):
    """A UserModule in tmp_path/folder, on sys.path (as PYTHONPATH would put it), not imported yet; removed
    from this process afterwards."""
    tag = uuid.uuid4().hex[:8]
    module = UserModule(name=f"user_kernels_{tag}", backend=f"user_{tag}", folder=tmp_path / folder)
    module.folder.mkdir()
    module.path.write_text(KERNEL.format(backend=module.backend))
    monkeypatch.syspath_prepend(str(module.folder))
    yield module
    if module.backend in backend_names():
        unregister_backend(module.backend)
    sys.modules.pop(module.name, None)


@pytest.fixture(name="user_module")
def user_module_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A UserModule (`_user_module`), with a fresh record of what this process imported for its backends."""
    monkeypatch.setattr(user_backends, "_FLAGGED", [])
    monkeypatch.setattr(plugins, "_SOURCES", {})
    yield from _user_module(tmp_path, monkeypatch, "user_modules")


@pytest.fixture(name="other_user_module")
def other_user_module_fixture(user_module: UserModule, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A second UserModule, in a folder of its own."""
    yield from _user_module(tmp_path, monkeypatch, "other_user_modules")
