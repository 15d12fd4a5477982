"""bench.results.paths: `bench profile`'s folder, named and claimed here (issue 47) rather than in the
command."""

from __future__ import annotations

import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.errors import UserError
from bench.results import paths
from bench.results.paths import create_folder, profile_folder


class _Noon(datetime.datetime):
    @classmethod
    def now(cls, tz=None) -> _Noon:
        return cls(2026, 12, 4, 12, 0, 0)


def test_a_profile_folder_is_named_from_the_time_the_checkout_and_the_case(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(paths, "datetime", SimpleNamespace(datetime=_Noon))
    name = {"branch": "feature/cp", "commit": "0123456789abcdef"}
    folder = profile_folder(tmp_path, "p2p-cp2 T64", **name)
    assert folder == tmp_path / "profiles" / "20261204-120000-feature-cp-01234567-p2p-cp2-T64"
    create_folder(folder, claim=True)
    # the same second: the next free name, never the taken one
    assert profile_folder(tmp_path, "p2p-cp2 T64", **name) == folder.with_name(f"{folder.name}-2")


def test_under_torchrun_every_rank_names_the_same_folder(tmp_path: Path) -> None:
    """The job's run id replaces the time (each rank has its own clock), and the name is not numbered:
    the ranks would number it apart."""
    kwargs = {"branch": "main", "commit": "abcdef0123", "run_id": "job-7"}
    folder = profile_folder(tmp_path, "case", **kwargs)
    assert folder == tmp_path / "profiles" / "job-7-main-abcdef01-case"
    create_folder(folder, claim=False)
    assert profile_folder(tmp_path, "case", **kwargs) == folder
    create_folder(folder, claim=False)  # every rank creates it: the later ones find it made


def test_a_folder_that_cannot_be_made_or_was_taken_is_one_line_with_the_fix(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    with pytest.raises(UserError, match=r"taken: another command took this folder meanwhile; run the"):
        create_folder(tmp_path / "taken", claim=True)
    (tmp_path / "file").write_text("")
    for claim in (True, False):
        with pytest.raises(UserError, match=r"file: cannot create the folder \(a file is in the way\); give"):
            create_folder(tmp_path / "file", claim=claim)
    with pytest.raises(UserError, match=r"cannot create the folder \(Not a directory\); give --output DIR"):
        create_folder(tmp_path / "file" / "below", claim=False)
