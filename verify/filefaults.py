"""File faults as data: which file of a replica's store to damage, where and how.

Pure: no IO, no clock. ``chaos/file_nemesis.py`` lists the store, asks :func:`plan_file_fault`
for the damage, applies it with :func:`apply_fault` to the bytes it read and writes them back.

Theory of operation. A store's files are classified by their path (:func:`classify`): commit-log
segments, consume queues, the epoch file (and its ``.bak``), the store checkpoint, a controller's
Raft journal and its snapshots. A fault picks one file of the requested class and one of three
actions: flip one bit of its data (``flip-bit``: a byte offset below the file's data end, a bit
0-7), cut its tail (``truncate``: a new length inside the last ``TRUNCATE_WINDOW`` bytes of data,
never 0 unless the data is a single byte), or delete it (``delete``: consume queues only; a deleted
segment or epoch file is a lost disk, not a file fault). Offsets fall in the file's *data*: a
preallocated segment's zero tail is no record, and flipping it only tests the zeroing rule.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["BROKER_FILE_CLASSES", "CONTROLLER_FILE_CLASSES", "FILE_ACTIONS", "FILE_KINDS", "FileFault",
           "StoredFile", "apply_fault", "classify", "plan_file_fault"]

#: The broker run's file nemeses, one per action (the action's target class is drawn per step).
FILE_KINDS = ("corrupt-file", "truncate-file", "delete-queue")
FILE_ACTIONS = {"corrupt-file": "flip-bit", "truncate-file": "truncate", "delete-queue": "delete"}
BROKER_FILE_CLASSES = ("segment", "consume-queue", "epoch-file", "checkpoint")
CONTROLLER_FILE_CLASSES = ("journal", "snapshot")
#: ``truncate`` cuts at most this many bytes from the end of a file's data.
TRUNCATE_WINDOW = 64 * 1024


@dataclass(frozen=True, slots=True)
class StoredFile:
    """One file of a store: path relative to the store root, length, and the end of its data (one
    past the last non-zero byte for a preallocated segment, the length otherwise)."""

    path: str
    size: int
    data_end: int


@dataclass(frozen=True, slots=True)
class FileFault:
    """``action`` on ``path``: ``flip-bit`` at ``offset``/``bit``, ``truncate`` to ``new_size``, or
    ``delete``."""

    path: str
    file_class: str
    action: str
    offset: int | None = None
    bit: int | None = None
    new_size: int | None = None

    def describe(self) -> str:
        if self.action == "flip-bit":
            return f"{self.path} bit {self.bit} of byte {self.offset}"
        if self.action == "truncate":
            return f"{self.path} truncated to {self.new_size} bytes"
        return f"{self.path} deleted"

    def to_json(self) -> dict:
        return {"path": self.path, "class": self.file_class, "action": self.action, "offset": self.offset,
                "bit": self.bit, "new_size": self.new_size}


def classify(path: str) -> str | None:
    """The file class of a store-relative path, or None for a file no fault targets."""
    parts = path.split("/")
    name = parts[-1]
    if len(parts) == 2 and parts[0] == "commitlog" and name.isdigit() and len(name) == 20:
        return "segment"
    if len(parts) == 4 and parts[0] == "consumequeue" and name.isdigit() and len(name) == 20:
        return "consume-queue"
    if len(parts) == 1 and name in ("epochFileCheckpoint", "epochFileCheckpoint.bak"):
        return "epoch-file"
    if len(parts) == 1 and name == "storeCheckpoint":
        return "checkpoint"
    if name == "raft.wal":
        return "journal"
    if name.startswith("snapshot_") and name.endswith(".snap"):
        return "snapshot"
    return None


def plan_file_fault(rng: random.Random, action: str, file_class: str, files: Sequence[StoredFile]
                    ) -> FileFault | None:
    """The damage: one file of ``file_class`` with data (weighted by its data length for a flip),
    and where. None when the store has no such file with data (the runner skips the step)."""
    assert action in ("flip-bit", "truncate", "delete"), action
    assert action != "delete" or file_class == "consume-queue", "only consume queues are deleted"
    candidates = sorted((f for f in files if classify(f.path) == file_class and f.data_end > 0),
                        key=lambda f: f.path)
    if file_class == "epoch-file":   # the main file: its .bak is the recovery, damaging both is a lost disk
        candidates = [f for f in candidates if not f.path.endswith(".bak")]
    if not candidates:
        return None
    if action == "delete":
        return FileFault(rng.choice(candidates).path, file_class, "delete")
    if action == "flip-bit":
        total = sum(f.data_end for f in candidates)
        at = rng.randrange(total)
        for f in candidates:
            if at < f.data_end:
                return FileFault(f.path, file_class, "flip-bit", offset=at, bit=rng.randrange(8))
            at -= f.data_end
        raise AssertionError("unreachable")
    f = rng.choice(candidates)
    low = max(1, f.data_end - TRUNCATE_WINDOW) if f.data_end > 1 else 0
    return FileFault(f.path, file_class, "truncate", new_size=rng.randint(low, f.data_end - 1) if f.data_end > 1 else 0)


def apply_fault(fault: FileFault, data: bytes) -> bytes | None:
    """The file's new content (None: delete it). ``data`` is its content before."""
    if fault.action == "delete":
        return None
    if fault.action == "truncate":
        assert fault.new_size is not None and fault.new_size < len(data), (fault, len(data))
        return data[:fault.new_size]
    assert fault.offset is not None and fault.bit is not None and 0 <= fault.offset < len(data), fault
    out = bytearray(data)
    out[fault.offset] ^= 1 << fault.bit
    return bytes(out)
