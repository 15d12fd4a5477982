"""A folder made read-only for a while, as a full or remounted results disk is mid-run: by chmod where that
stops this user; as root, whom chmod does not stop, by refusing (EROFS) every file os.open would create in
it, the call that tempfile.mkstemp, and so bench.results.store, makes."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

CHMOD_STOPS_US = os.geteuid() != 0


@contextlib.contextmanager
def read_only(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`folder` read-only inside the block, writable again after it."""
    if CHMOD_STOPS_US:
        mode = folder.stat().st_mode
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(mode)
        return
    real_open, where = os.open, folder.resolve()

    def refusing(path, flags, *args, **kwargs):
        if flags & os.O_CREAT and Path(path).resolve().parent == where:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(os, "open", refusing)
        yield
