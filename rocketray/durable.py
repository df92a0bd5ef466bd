"""Durable file replacement, the one way every package writes a small file that must survive a crash.

``write_durably`` writes a temp file beside the target, fsyncs it, renames it over the target and
fsyncs the directory, so that after a crash (kill or power loss) the target holds either the old
or the new bytes, never a mix, and the rename itself is on disk.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir", "write_durably"]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so that creations, renames and deletions in it survive a crash."""
    fd = os.open(os.fspath(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: str | os.PathLike[str], data: bytes, tmp_name: str | None = None) -> None:
    """Replace ``path`` with ``data``: write a temp file, fsync it, rename over, fsync the directory.

    ``tmp_name`` names the temp file (in the target's directory); the default is ``<name>.tmp``.
    """
    target = Path(path)
    tmp = target.with_name(tmp_name or target.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, target)
    fsync_dir(target.parent)
