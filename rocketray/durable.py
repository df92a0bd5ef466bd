"""Durable file replacement, the one way every package writes a small file that must survive a crash.

``write_durably`` writes a temp file beside the target, fsyncs it, renames it over the target and
fsyncs the directory, so that after a crash (kill or power loss) the target holds either the old
or the new bytes, never a mix, and the rename itself is on disk.

Both helpers run over a disk port (``rocketray.fs.Disk``, default the real one), so the
files written through them (store checkpoint, epoch file, identity files) run over the simulated
disk too.
"""

from __future__ import annotations

import os
import posixpath

from rocketray.fs import OS_DISK, Disk

__all__ = ["fsync_dir", "write_durably"]


def fsync_dir(path: str | os.PathLike[str], disk: Disk = OS_DISK) -> None:
    """fsync a directory so that creations, renames and deletions in it survive a crash."""
    disk.fsync_dir(path)


def write_durably(path: str | os.PathLike[str], data: bytes, tmp_name: str | None = None,
                  disk: Disk = OS_DISK) -> None:
    """Replace ``path`` with ``data``: write a temp file, fsync it, rename over, fsync the directory.

    ``tmp_name`` names the temp file (in the target's directory); the default is ``<name>.tmp``.
    """
    target = os.fspath(path)
    parent, name = posixpath.split(target)
    tmp = posixpath.join(parent, tmp_name or name + ".tmp")
    f = disk.open(tmp, create=True, truncate=True)
    try:
        f.pwrite(data, 0)
        f.fsync()
    finally:
        f.close()
    disk.rename(tmp, target)
    disk.fsync_dir(parent or ".")
