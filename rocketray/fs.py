"""The disk port of the store: every file operation of the broker's files goes through it.

Theory of operation
-------------------
The store (commit log, consume queues, checkpoint, epoch file) and ``rocketray.durable`` do no
file IO of their own: they call a :class:`Disk` and the :class:`DiskFile` handles it opens.  Two
implementations exist:

* :class:`OsDisk` (``OS_DISK``), the real one over ``os``: ``pread`` of a file opened with
  ``map_reads=True`` returns a zero-copy view of an ``mmap`` of the file (the commit log's
  segments), other files use ``os.pread``;
* ``rocketray.sim.disk.SimDisk``, a deterministic simulated disk with a page cache and a durable
  layer, crashes (kill, power loss) and a crash hook between any two IO calls.

The port promises what POSIX promises and nothing more, so code that is correct over the
simulated disk is correct over the real one: ``pwrite`` and ``truncate`` change only what the
process sees until ``fsync`` of that file; ``open(create=True)``, ``mkdir``, ``rename``,
``unlink`` and ``rmdir`` are durable only after ``fsync_dir`` of the directory holding the name;
``rename`` is atomic (after a crash the target names the old or the new file) and only renames
within one directory.  Paths are absolute or relative strings or ``os.PathLike``.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import posixpath
from typing import Protocol, runtime_checkable

__all__ = ["Disk", "DiskFile", "OS_DISK", "OsDisk", "OsFile", "cached", "ensure_dir", "read_file",
           "remove_tree"]


@runtime_checkable
class DiskFile(Protocol):
    """An open file (read/write).  Not thread-safe; the owner serialises calls."""

    def pread(self, offset: int, length: int) -> bytes | memoryview:
        """Up to ``length`` bytes at ``offset`` (fewer at the end of the file)."""
        ...

    def pwrite(self, data: bytes | memoryview, offset: int) -> None:
        """Write all of ``data`` at ``offset`` (page cache only until :meth:`fsync`)."""
        ...

    def truncate(self, size: int) -> None:
        """Set the file's length (extends with zeros, blocks reserved where the file system can);
        page cache only until :meth:`fsync`."""
        ...

    def size(self) -> int:
        """Current length as the process sees it."""
        ...

    def fsync(self) -> None:
        """Make this file's current content durable (not its name: see ``Disk.fsync_dir``)."""
        ...

    def dup(self) -> "DiskFile":
        """Another handle on the same file, valid after this one is closed (fsync outside a lock)."""
        ...

    def prefetch(self, offset: int, length: int) -> None:
        """Bring ``[offset, offset + length)`` into memory before it is read: blocks until it is
        there, without holding the GIL. A hint: a disk without a page cache does nothing."""
        ...

    def mtime_ns(self) -> int:
        """Time of the last modification, nanoseconds since the epoch."""
        ...

    def data_end(self, start: int, end: int) -> int:
        """A bound on where non-hole data ends in ``[start, end)``: every byte in
        ``[result, end)`` reads as zero.  ``end`` is always a correct (slow) answer."""
        ...

    def close(self) -> None:
        ...


@runtime_checkable
class Disk(Protocol):
    """A file system (see the module docstring for what is durable when)."""

    def open(self, path: "str | os.PathLike[str]", create: bool = False, truncate: bool = False,
             map_reads: bool = False) -> DiskFile:
        """Open read/write; ``create`` makes a missing file, ``truncate`` empties it;
        ``map_reads`` is a performance hint (an implementation may map the file for reads)."""
        ...

    def mkdir(self, path: "str | os.PathLike[str]") -> None:
        """Create one directory (its parent must exist; FileExistsError if it exists)."""
        ...

    def rmdir(self, path: "str | os.PathLike[str]") -> None:
        """Remove an empty directory."""
        ...

    def listdir(self, path: "str | os.PathLike[str]") -> list[str]:
        """Names in a directory, sorted."""
        ...

    def exists(self, path: "str | os.PathLike[str]") -> bool:
        ...

    def is_dir(self, path: "str | os.PathLike[str]") -> bool:
        ...

    def unlink(self, path: "str | os.PathLike[str]") -> None:
        """Remove a file name (FileNotFoundError if missing)."""
        ...

    def rename(self, src: "str | os.PathLike[str]", dst: "str | os.PathLike[str]") -> None:
        """Atomically replace ``dst`` with ``src`` (same directory)."""
        ...

    def fsync_dir(self, path: "str | os.PathLike[str]") -> None:
        """Make creations, renames and removals of names in this directory durable."""
        ...


# ---------------------------------------------------------------------- helpers over the port
def read_file(disk: Disk, path: "str | os.PathLike[str]") -> bytes | None:
    """The whole content of ``path``, or ``None`` if it does not exist."""
    try:
        f = disk.open(path)
    except FileNotFoundError:
        return None
    try:
        return bytes(f.pread(0, f.size()))
    finally:
        f.close()


def ensure_dir(disk: Disk, path: "str | os.PathLike[str]") -> None:
    """Create ``path`` and missing parents, durably (each new name's parent is fsynced)."""
    path = os.fspath(path)
    if disk.is_dir(path):
        return
    parent = posixpath.dirname(posixpath.normpath(path)) if path else ""
    if parent and parent != path:
        ensure_dir(disk, parent)
    try:
        disk.mkdir(path)
    except FileExistsError:
        return
    disk.fsync_dir(parent or ".")


def remove_tree(disk: Disk, path: "str | os.PathLike[str]") -> None:
    """Remove a directory tree (not durable until the parent is fsynced); missing is fine."""
    path = os.fspath(path)
    if not disk.is_dir(path):
        return
    for name in disk.listdir(path):
        child = posixpath.join(path, name)
        if disk.is_dir(child):
            remove_tree(disk, child)
        else:
            disk.unlink(child)
    disk.rmdir(path)


# ---------------------------------------------------------------------- the real disk
PREFETCH_CHUNK = 1 << 20     # ``OsFile.prefetch`` reads through a scratch buffer of this size

_LIBC = ctypes.CDLL(None, use_errno=True)
_FALLOCATE = getattr(_LIBC, "fallocate", None)
if _FALLOCATE is not None:
    _FALLOCATE.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    _FALLOCATE.restype = ctypes.c_int


def _allocate(fd: int, offset: int, length: int) -> bool:
    """Extend the file over ``[offset, offset + length)`` with blocks reserved (``fallocate``, mode
    0: the range reads as zeros, like a sparse extension). An append into reserved blocks skips
    the delayed-allocation work of a sparse range (ext4 writes it ~1.5x faster), and a full disk
    shows here rather than at a later write. False where the file system cannot (the caller then
    extends sparsely)."""
    if _FALLOCATE is None:
        return False
    if _FALLOCATE(fd, 0, offset, length) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        return False
    raise OSError(err, f"fallocate: {os.strerror(err)}")


class _CachestatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [("nr_cache", ctypes.c_uint64), ("nr_dirty", ctypes.c_uint64),
                ("nr_writeback", ctypes.c_uint64), ("nr_evicted", ctypes.c_uint64),
                ("nr_recently_evicted", ctypes.c_uint64)]


_SYS_CACHESTAT = 451        # Linux 6.5+, the same number on every architecture (>= 424 are shared)
_PAGE = mmap.PAGESIZE
_cachestat_works = hasattr(_LIBC, "syscall")


def cached(fd: int, offset: int, length: int) -> bool | None:
    """Whether every page of ``[offset, offset + length)`` (clamped to the file) is in the page
    cache, asked of the kernel without reading (``cachestat``); None where it cannot tell."""
    global _cachestat_works
    if not _cachestat_works:
        return None
    end = min(offset + length, os.fstat(fd).st_size)
    if end <= offset:
        return True
    first, last = offset // _PAGE, (end - 1) // _PAGE
    rng = _CachestatRange(first * _PAGE, (last - first + 1) * _PAGE)
    stat = _Cachestat()
    if _LIBC.syscall(_SYS_CACHESTAT, fd, ctypes.byref(rng), ctypes.byref(stat), 0) != 0:
        if ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):   # older kernel, or a seccomp filter
            _cachestat_works = False
        return None
    return stat.nr_cache >= last - first + 1


class OsFile:
    """A real file; with ``mapped`` reads are views of an ``mmap`` (remapped when the file grew)."""

    __slots__ = ("fd", "mapped", "_mm")

    def __init__(self, fd: int, mapped: bool) -> None:
        self.fd = fd
        self.mapped = mapped
        self._mm: mmap.mmap | None = None

    def pread(self, offset: int, length: int) -> bytes | memoryview:
        if not self.mapped:
            return os.pread(self.fd, length, offset)
        mm = self._mm
        if mm is None or offset + length > len(mm):
            size = os.fstat(self.fd).st_size
            if mm is None or size > len(mm):
                self._unmap()
                if size == 0:
                    return b""
                mm = self._mm = mmap.mmap(self.fd, size, access=mmap.ACCESS_READ)
        return memoryview(mm)[offset:offset + length]

    def pwrite(self, data: bytes | memoryview, offset: int) -> None:
        view = memoryview(data)
        while view:
            written = os.pwrite(self.fd, view, offset)
            view, offset = view[written:], offset + written

    def truncate(self, size: int) -> None:
        old = os.fstat(self.fd).st_size
        if size <= old or not _allocate(self.fd, old, size - old):
            os.ftruncate(self.fd, size)
        if self._mm is not None and size > len(self._mm):
            self._unmap()  # remapped lazily at the new size; readers keep their views

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def fsync(self) -> None:
        os.fsync(self.fd)

    def dup(self) -> "OsFile":
        return OsFile(os.dup(self.fd), False)

    def prefetch(self, offset: int, length: int) -> None:
        if cached(self.fd, offset, length):
            return          # a warm catch-up: copying it through the scratch buffer is wasted CPU
        scratch = memoryview(bytearray(min(length, PREFETCH_CHUNK)))
        end = offset + length
        while offset < end:
            # preadv releases the GIL while the page cache fills (a fault on a mapped page would not)
            n = os.preadv(self.fd, [scratch[:min(len(scratch), end - offset)]], offset)
            if n <= 0:
                return
            offset += n

    def mtime_ns(self) -> int:
        return os.fstat(self.fd).st_mtime_ns

    def data_end(self, start: int, end: int) -> int:
        """End of the last data extent in ``[start, end)`` (SEEK_DATA/SEEK_HOLE skip holes)."""
        pos, last = start, start
        try:
            while pos < end:
                data = os.lseek(self.fd, pos, os.SEEK_DATA)
                if data >= end:
                    break
                pos = os.lseek(self.fd, data, os.SEEK_HOLE)
                last = min(pos, end)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # SEEK_DATA unsupported here: search everything
                return end
        return last

    def _unmap(self) -> None:
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass  # a reader still holds a view; the map lives until it is released
            self._mm = None

    def close(self) -> None:
        self._unmap()
        os.close(self.fd)


class OsDisk:
    """The real file system through ``os``."""

    def open(self, path: "str | os.PathLike[str]", create: bool = False, truncate: bool = False,
             map_reads: bool = False) -> OsFile:
        flags = os.O_RDWR | (os.O_CREAT if create else 0) | (os.O_TRUNC if truncate else 0)
        return OsFile(os.open(path, flags, 0o644), map_reads)

    def mkdir(self, path: "str | os.PathLike[str]") -> None:
        os.mkdir(path)

    def rmdir(self, path: "str | os.PathLike[str]") -> None:
        os.rmdir(path)

    def listdir(self, path: "str | os.PathLike[str]") -> list[str]:
        return sorted(os.listdir(path))

    def exists(self, path: "str | os.PathLike[str]") -> bool:
        return os.path.exists(path)

    def is_dir(self, path: "str | os.PathLike[str]") -> bool:
        return os.path.isdir(path)

    def unlink(self, path: "str | os.PathLike[str]") -> None:
        os.unlink(path)

    def rename(self, src: "str | os.PathLike[str]", dst: "str | os.PathLike[str]") -> None:
        os.replace(src, dst)

    def fsync_dir(self, path: "str | os.PathLike[str]") -> None:
        fd = os.open(os.fspath(path), os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


OS_DISK: Disk = OsDisk()
