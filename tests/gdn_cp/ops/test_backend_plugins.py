"""Backends from other packages (gdn_cp.ops.backends.plugins): the `gdn_cp.backends` entry points of an
installed distribution (a dist-info folder on sys.path, as pip leaves one), a plugin that fails to load (one
line, the other backends kept), and modules imported by name, each failure one line naming the module."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch

from gdn_cp.ops import (
    backend_names,
    backend_sources,
    chunk_gated_delta_rule,
    get_backend,
    import_backend_module,
    load_backend_plugins,
    unregister_backend,
)
from gdn_cp.ops.backends import BUILT_IN, BackendModuleError, plugins
from gdn_cp.ops.backends.plugins import ENTRY_POINT_GROUP

KERNEL = '''\
from gdn_cp.ops import chunk_gated_delta_rule, register_backend


def {name}_rule(*args, **kwargs):
    """gdn_cp's chunked op behind another name: a stand-in for a vendor kernel."""
    return chunk_gated_delta_rule(*args, **kwargs)


def register():
    register_backend("{name}", {name}_rule)
'''


def install(
    site: Path, dist: str, version: str, entry_points: dict[str, str], modules: dict[str, str]
) -> None:
    """A distribution as pip installs one into `site`: its modules, and a dist-info folder whose
    entry_points.txt declares `entry_points` in the gdn_cp.backends group."""
    for name, text in modules.items():
        (site / f"{name}.py").write_text(text)
    info = site / f"{dist}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{lines}")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A folder on sys.path for fake distributions; this process's plugins not yet loaded, and everything
    the test registers or imports from the folder gone afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "_SOURCES", {})
    monkeypatch.setattr(plugins, "_PLUGINS_LOADED", False)
    before = set(backend_names())
    yield tmp_path
    for name in set(backend_names()) - before:
        unregister_backend(name)
    for module in [p.stem for p in tmp_path.glob("*.py")]:
        sys.modules.pop(module, None)


def _inputs() -> tuple[torch.Tensor, ...]:
    """q, k, v [1, 16, 2, 8], g, beta [1, 16, 2], fp32 (as many key heads as value heads: the op is called
    as it is, without repeated heads)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 16, 2, 8, generator=g) for _ in range(3))
    return q, k, v, -torch.rand(1, 16, 2, generator=g), torch.rand(1, 16, 2, generator=g)


def test_an_installed_entry_point_registers_its_backends(site: Path):
    """Before: no gdn_cp.backends group was read at all, so a package's kernel was unknown until its code
    ran register_backend itself. Now looking its name up runs the entry point's callable, once per
    process."""
    install(
        site,
        "fake_kernels",
        "1.2",
        {"ep_loop": "fake_kernels:register"},
        {"fake_kernels": KERNEL.format(name="ep_loop")},
    )
    assert "ep_loop" not in backend_names()
    backend = get_backend("ep_loop")  # a name no one registered: the installed plugins load, then it is found
    (source,) = backend_sources()
    assert source.entry_point == "ep_loop" and source.target == "fake_kernels:register"
    assert source.origin == "fake_kernels 1.2" and source.module == "fake_kernels"
    assert load_backend_plugins() == (source,)  # once per process: nothing loads again
    o, _ = backend.rule(*_inputs())
    expected, _ = chunk_gated_delta_rule(*_inputs())
    assert torch.equal(o, expected)  # its op: gdn_cp's, called with the same arguments


def test_a_plugin_that_fails_to_load_is_one_line_and_the_others_stay(site: Path, caplog):
    install(
        site,
        "broken_kernels",
        "0.1",
        {"broken": "broken_kernels"},
        {"broken_kernels": "raise ImportError('libvendor.so.3: cannot open shared object file')\n"},
    )
    good = KERNEL.format(name="good_loop") + "\nregister()\n"
    install(site, "good_kernels", "2.0", {"good": "good_kernels"}, {"good_kernels": good})
    with caplog.at_level(logging.WARNING, logger=plugins.__name__):
        loaded = load_backend_plugins()
    (record,) = caplog.records
    line = record.getMessage()
    assert "\n" not in line
    assert line == (
        f"{ENTRY_POINT_GROUP} entry point broken = broken_kernels of broken_kernels 0.1 failed to load, its "
        "backends are not registered: ImportError: libvendor.so.3: cannot open shared object file"
    )
    assert [s.entry_point for s in loaded] == ["good"]
    assert "good_loop" in backend_names()
    assert set(backend_names()) >= {b.name for b in BUILT_IN}

    reported: list[str] = []
    plugins._PLUGINS_LOADED = False  # a caller with its own way to say it (bench: a warning line)
    load_backend_plugins(report=reported.append)
    assert reported == [line]


def test_a_module_imported_for_its_backends_and_its_one_line_failures(site: Path):
    (site / "by_name.py").write_text(KERNEL.format(name="by_name") + "\nregister()\n")
    source = import_backend_module("by_name")
    assert "by_name" in backend_names() and source.entry_point is None
    assert source.origin == str(site / "by_name.py")  # no distribution holds it: its file
    assert import_backend_module("by_name") == source and backend_sources() == (source,)

    (site / "needs_vendor.py").write_text("import vendor_runtime_xyz\n")
    (site / "half_written.py").write_text("raise RuntimeError('half written\\nsecond line')\n")
    cases = {
        "no_such_module_xyz": "backend module no_such_module_xyz cannot be imported: ModuleNotFoundError: No "
        "module named 'no_such_module_xyz' (put its folder on PYTHONPATH, or install its package)",
        "needs_vendor": "backend module needs_vendor cannot be imported: ModuleNotFoundError: No module "
        "named 'vendor_runtime_xyz'",
        "half_written": "backend module half_written cannot be imported: RuntimeError: half written",
        "my_kernels.py": "backend module 'my_kernels.py' is not a module name: give a dotted name such as "
        "my_kernels or my_pkg.kernels (importable from sys.path), not a file path",
    }
    for name, message in cases.items():
        with pytest.raises(BackendModuleError) as caught:
            import_backend_module(name)
        assert str(caught.value) == message
    assert backend_sources() == (source,)
