"""A disk port that can lose what was never fsynced: the lost-unsynced-writes nemesis on a real disk.

Theory of operation. :class:`UndoDisk` wraps the real disk (``rocketray.fs.OS_DISK``) and keeps, in
memory, an undo record of every change made since the file or directory it touches was last
fsynced: a ``pwrite`` keeps the old bytes of the range it overwrites (a run of zeros as its length)
and the file's old size, a ``truncate`` the old size and the bytes it cut, a created file or
directory its name, an unlinked or replaced file a hard link to its inode (in ``<root>/.undo``), a
rename its two names. ``fsync`` of a file drops that file's data records; ``fsync_dir`` drops the
name records of that directory. What is left at any moment is exactly what a power loss may take
(POSIX: data is durable after ``fsync`` of the file, a name after ``fsync`` of its directory).

:meth:`UndoDisk.lose_unsynced` takes the port's lock (no IO of the process can start after it),
undoes every record newest first, writes what it dropped to ``<root>/lost-unsynced.json`` and
SIGKILLs its own process: the files are then what a power loss would leave if the disk kept only
what was fsynced (LazyFS's ``clear-cache``), and whoever restarts the process (Ray) recovers from
them. A watcher thread calls it when ``<root>/LOSE_UNSYNCED`` appears (every ``POLL_S``), which is
how the chaos runner, outside the process, triggers it. ``MessageStore`` uses this port when
``store.track_unsynced`` is on; nothing else does.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rocketray.fs import OS_DISK, Disk, DiskFile

__all__ = ["LOST_REPORT", "TRIGGER", "UndoDisk"]

log = logging.getLogger(__name__)

TRIGGER = "LOSE_UNSYNCED"
LOST_REPORT = "lost-unsynced.json"
UNDO_DIR = ".undo"
POLL_S = 0.02


@dataclass(slots=True)
class _Record:
    seq: int
    kind: str            # data | size | create | mkdir | unlink | rename | rmdir
    scope: Any           # the inode (data, size) or the directory path (name records)
    path: str            # the file's path when the change was made (a rename: the destination)
    offset: int = 0
    old: bytes | int | None = None   # overwritten bytes, or the length of a zero run
    old_size: int = 0
    src: str = ""        # rename: the source name
    saved: str = ""      # unlink / rename over a file: a hard link to the inode that name held


def _keep(data: bytes | memoryview) -> bytes | int:
    raw = bytes(data)
    return len(raw) if raw.count(0) == len(raw) else raw


class _UndoFile:
    """A file of an :class:`UndoDisk`: every change first records how to undo it."""

    def __init__(self, disk: "UndoDisk", inner: DiskFile, path: str, ino: int) -> None:
        self._disk, self._inner, self.path, self.ino = disk, inner, path, ino

    def pread(self, offset: int, length: int) -> bytes | memoryview:
        return self._inner.pread(offset, length)

    def pwrite(self, data: bytes | memoryview, offset: int) -> None:
        with self._disk.lock:
            size = self._inner.size()
            n = max(0, min(len(memoryview(data)), size - offset))
            old = _keep(self._inner.pread(offset, n)) if n else 0
            self._disk.record("data", self.ino, self.path, offset=offset, old=old, old_size=size)
            self._inner.pwrite(data, offset)

    def truncate(self, size: int) -> None:
        with self._disk.lock:
            old_size = self._inner.size()
            cut = _keep(self._inner.pread(size, old_size - size)) if size < old_size else 0
            self._disk.record("size", self.ino, self.path, offset=size, old=cut, old_size=old_size)
            self._inner.truncate(size)

    def size(self) -> int:
        return self._inner.size()

    def fsync(self) -> None:
        with self._disk.lock:
            self._inner.fsync()
            self._disk.synced_file(self.ino)

    def dup(self) -> "_UndoFile":
        return _UndoFile(self._disk, self._inner.dup(), self.path, self.ino)

    def prefetch(self, offset: int, length: int) -> None:
        self._inner.prefetch(offset, length)

    def mtime_ns(self) -> int:
        return self._inner.mtime_ns()

    def data_end(self, start: int, end: int) -> int:
        return self._inner.data_end(start, end)

    def close(self) -> None:
        self._inner.close()


class UndoDisk:
    """The real disk, with an undo log of everything not fsynced yet (see the module docstring).
    ``root``: the directory whose ``TRIGGER`` file the watcher looks for (and where ``.undo`` and the
    report go); ``on_lost`` replaces the SIGKILL (tests)."""

    def __init__(self, root: str | os.PathLike[str], inner: Disk = OS_DISK, *, watch: bool = True,
                 on_lost: Callable[[], None] | None = None) -> None:
        self.root = Path(root)
        self.inner = inner
        self.lock = threading.RLock()
        self._records: list[_Record] = []
        self._seq = 0
        self._on_lost = on_lost or (lambda: os.kill(os.getpid(), signal.SIGKILL))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if watch:
            self._thread = threading.Thread(target=self._watch, name="undo-disk-watch", daemon=True)
            self._thread.start()

    # -- bookkeeping ------------------------------------------------------------------------------
    def record(self, kind: str, scope: Any, path: str, **fields: Any) -> None:
        self._seq += 1
        self._records.append(_Record(self._seq, kind, scope, path, **fields))

    def synced_file(self, ino: int) -> None:
        self._records = [r for r in self._records if not (r.kind in ("data", "size") and r.scope == ino)]

    @property
    def pending(self) -> int:
        """Undo records not made void by an fsync yet."""
        return len(self._records)

    def _save(self, path: str) -> str:
        """A hard link to the inode ``path`` names now, kept until the name change is durable."""
        keep = self.root / UNDO_DIR
        os.makedirs(keep, exist_ok=True)
        saved = str(keep / f"{self._seq + 1}")
        os.link(path, saved)
        return saved

    # -- the port ---------------------------------------------------------------------------------
    def open(self, path: str | os.PathLike[str], create: bool = False, truncate: bool = False,
             map_reads: bool = False) -> _UndoFile:
        path = os.fspath(path)
        with self.lock:
            existed = os.path.exists(path)
            old = self._whole(path) if truncate and existed else None
            inner = self.inner.open(path, create=create, truncate=truncate, map_reads=map_reads)
            ino = os.stat(path).st_ino
            if not existed:
                self.record("create", os.path.dirname(path), path)
            elif old is not None:
                self.record("size", ino, path, offset=0, old=old[1], old_size=old[0])
            return _UndoFile(self, inner, path, ino)

    def _whole(self, path: str) -> tuple[int, bytes | int]:
        with open(path, "rb") as fh:
            data = fh.read()
        return len(data), _keep(data)

    def mkdir(self, path: str | os.PathLike[str]) -> None:
        with self.lock:
            self.inner.mkdir(path)
            self.record("mkdir", os.path.dirname(os.fspath(path)), os.fspath(path))

    def rmdir(self, path: str | os.PathLike[str]) -> None:
        with self.lock:
            self.inner.rmdir(path)
            self.record("rmdir", os.path.dirname(os.fspath(path)), os.fspath(path))

    def listdir(self, path: str | os.PathLike[str]) -> list[str]:
        return self.inner.listdir(path)

    def exists(self, path: str | os.PathLike[str]) -> bool:
        return self.inner.exists(path)

    def is_dir(self, path: str | os.PathLike[str]) -> bool:
        return self.inner.is_dir(path)

    def unlink(self, path: str | os.PathLike[str]) -> None:
        path = os.fspath(path)
        with self.lock:
            saved = self._save(path)
            self.inner.unlink(path)
            self.record("unlink", os.path.dirname(path), path, saved=saved)

    def rename(self, src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        src, dst = os.fspath(src), os.fspath(dst)
        with self.lock:
            saved = self._save(dst) if os.path.exists(dst) else ""
            self.inner.rename(src, dst)
            self.record("rename", os.path.dirname(dst), dst, src=src, saved=saved)

    def fsync_dir(self, path: str | os.PathLike[str]) -> None:
        path = os.path.normpath(os.fspath(path))
        with self.lock:
            self.inner.fsync_dir(path)
            kept = []
            for r in self._records:
                if r.kind in ("data", "size") or os.path.normpath(r.scope) != path:
                    kept.append(r)
                elif r.saved:
                    _remove(r.saved)
            self._records = kept

    # -- the fault --------------------------------------------------------------------------------
    def lose_unsynced(self) -> dict[str, Any]:
        """Undo every change not fsynced, newest first, report it, then ``on_lost`` (SIGKILL). The
        lock is kept: no other IO of this process runs after the undo."""
        self.lock.acquire()
        report: dict[str, Any] = {"records": len(self._records), "bytes": 0, "files": {}, "names": []}
        for r in reversed(self._records):
            try:
                _undo(r, report)
            except OSError as exc:   # a file already gone by an earlier undo: nothing left to restore
                log.warning("undo of %s %s failed: %s", r.kind, r.path, exc)
        self._records = []
        (self.root / LOST_REPORT).write_text(json.dumps(report, indent=1))
        log.warning("lost unsynced writes: %s", {k: report[k] for k in ("records", "bytes")})
        self._on_lost()
        return report

    def _watch(self) -> None:
        trigger = self.root / TRIGGER
        while not self._stop.wait(POLL_S):
            if trigger.exists():
                trigger.unlink()
                self.lose_unsynced()
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _undo(r: _Record, report: dict[str, Any]) -> None:
    if r.kind in ("data", "size"):
        fd = os.open(r.path, os.O_RDWR)
        try:
            os.ftruncate(fd, r.old_size)
            if r.old:   # the overwritten (or cut) bytes; an int is a run of zeros
                os.pwrite(fd, r.old if isinstance(r.old, bytes) else bytes(r.old), r.offset)
        finally:
            os.close(fd)
        report["files"][r.path] = report["files"].get(r.path, 0) + 1
        report["bytes"] += len(r.old) if isinstance(r.old, bytes) else int(r.old or 0)
        return
    report["names"].append(f"{r.kind} {r.path}")
    if r.kind == "create":
        _remove(r.path)
    elif r.kind == "mkdir":
        _remove_tree(r.path)
    elif r.kind == "rmdir":
        os.makedirs(r.path, exist_ok=True)
    elif r.kind == "unlink":
        os.replace(r.saved, r.path)
    else:
        assert r.kind == "rename", r.kind
        os.replace(r.path, r.src)
        if r.saved:
            os.replace(r.saved, r.path)


def _remove_tree(path: str) -> None:
    if not os.path.isdir(path):
        return
    for name in os.listdir(path):
        child = os.path.join(path, name)
        _remove_tree(child) if os.path.isdir(child) else os.unlink(child)
    os.rmdir(path)
