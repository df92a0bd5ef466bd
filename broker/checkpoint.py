"""Store checkpoint and the durable-write helpers of the broker's files.

Theory of operation
-------------------
The store checkpoint (``<root>/storeCheckpoint``) remembers three offsets of the commit log:

* ``verified_offset``: every byte before it was fsynced and verified when the checkpoint was
  written, so recovery only scans from there;
* ``confirm_offset``: the replicated (committed) end of log, persisted as the reference's store
  checkpoint does (section 13.2);
* ``dispatched_offset``: every record that ends at or before it is in the consume queues, whose
  files were fsynced before this checkpoint was written.

The file is 40 bytes: magic, version, the three offsets as signed 64-bit big-endian integers, and
a CRC32 of the preceding bytes.  It is replaced atomically (temp file, fsync, rename, fsync of the
directory), so it is either the old or the new checkpoint, never a torn one; an invalid or missing
file loads as ``None`` and the store recovers from the start of the log.

``sync_files`` and ``nonzero_end`` are the file helpers of the commit log; durable replacement of
small files is ``rocketray.durable``.  All IO goes through the disk port (``rocketray.fs``).
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from rocketray.fs import OS_DISK, Disk, DiskFile, read_file
from rocketray.durable import write_durably

_CHUNK = 1 << 20

__all__ = ["StoreCheckpoint", "load_checkpoint", "nonzero_end", "save_checkpoint", "sync_files"]

CHECKPOINT_FILE = "storeCheckpoint"
_MAGIC = 0x52524350  # "RRCP"
_VERSION = 1
_BODY = struct.Struct(">IIqqq")
_CRC = struct.Struct(">I")


def sync_files(files: list[DiskFile], disk: Disk, directory: str | os.PathLike[str] | None) -> None:
    """fsync and close duplicated handles, then the directory if given."""
    try:
        for f in files:
            f.fsync()
    finally:
        for f in files:
            f.close()
    if directory is not None:
        disk.fsync_dir(directory)


def nonzero_end(view: bytes | memoryview, start: int, end: int) -> int:
    """One past the last non-zero byte of ``view[start:end]``, or ``start`` if it is all zeros."""
    pos = end
    while pos > start:
        lo = max(start, pos - _CHUNK)
        chunk = bytes(view[lo:pos])
        stripped = chunk.rstrip(b"\x00")
        if stripped:
            return lo + len(stripped)
        pos = lo
    return start


@dataclass(frozen=True, slots=True)
class StoreCheckpoint:
    """The three persisted offsets of the store."""

    verified_offset: int
    confirm_offset: int
    dispatched_offset: int

    def encode(self) -> bytes:
        body = _BODY.pack(_MAGIC, _VERSION, self.verified_offset, self.confirm_offset, self.dispatched_offset)
        return body + _CRC.pack(zlib.crc32(body))

    @classmethod
    def decode(cls, data: bytes) -> "StoreCheckpoint | None":
        """The checkpoint in ``data`` or ``None`` if it is not a valid one."""
        if len(data) != _BODY.size + _CRC.size:
            return None
        body = data[:_BODY.size]
        if _CRC.unpack_from(data, _BODY.size)[0] != zlib.crc32(body):
            return None
        magic, version, verified, confirm, dispatched = _BODY.unpack(body)
        if magic != _MAGIC or version != _VERSION or min(verified, confirm, dispatched) < 0:
            return None
        return cls(verified, confirm, dispatched)


def load_checkpoint(root_dir: str | os.PathLike[str], disk: Disk = OS_DISK) -> StoreCheckpoint | None:
    """The checkpoint of the store at ``root_dir``, or ``None`` if missing or invalid."""
    data = read_file(disk, Path(root_dir) / CHECKPOINT_FILE)
    return None if data is None else StoreCheckpoint.decode(data)


def save_checkpoint(root_dir: str | os.PathLike[str], checkpoint: StoreCheckpoint, disk: Disk = OS_DISK) -> None:
    """Persist ``checkpoint`` atomically and durably."""
    write_durably(Path(root_dir) / CHECKPOINT_FILE, checkpoint.encode(), disk=disk)
