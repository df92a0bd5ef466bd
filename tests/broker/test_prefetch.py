"""``OsFile.prefetch``: a catch-up's read-ahead (``MessageStore.warm``) brings an evicted range into
the page cache, so the event loop that sends it next does not wait for the disk; a range already
cached (``fs.cached``, the kernel's ``cachestat``) is not read again."""

from __future__ import annotations

import os

from rocketray import fs
from rocketray.fs import OS_DISK

MiB = 1 << 20


def cached(fd: int, start: int, end: int) -> bool:
    """Every 64 KiB of ``[start, end)`` reads without waiting (``RWF_NOWAIT``)."""
    one = bytearray(1)
    try:
        return all(os.preadv(fd, [one], pos, os.RWF_NOWAIT) == 1 for pos in range(start, end, 64 << 10))
    except BlockingIOError:
        return False


def test_prefetch_brings_an_evicted_range_into_the_page_cache(tmp_path):
    path = tmp_path / "segment"
    path.write_bytes(os.urandom(8 * MiB))
    f = OS_DISK.open(path)
    os.fsync(f.fd)
    os.posix_fadvise(f.fd, 0, 0, os.POSIX_FADV_DONTNEED)
    assert not cached(f.fd, 0, 8 * MiB)                  # cold to begin with
    f.prefetch(1 * MiB, 4 * MiB)
    assert cached(f.fd, 1 * MiB, 5 * MiB)
    f.close()


def test_cached_tells_an_evicted_range_from_a_cached_one(tmp_path):
    path = tmp_path / "segment"
    path.write_bytes(os.urandom(8 * MiB))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert fs.cached(fd, 0, 8 * MiB) is False
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)      # no read-ahead beyond what is read
        os.pread(fd, 2 * MiB, 4 * MiB)
        assert fs.cached(fd, 4 * MiB, 2 * MiB) is True
        assert fs.cached(fd, 4 * MiB - 4096, 2 * MiB) is False   # one page before it is not
        assert fs.cached(fd, 7 * MiB, 4 * MiB) is False          # clamped to the file: 1 MiB cold
        assert fs.cached(fd, 8 * MiB, 4 * MiB) is True           # nothing of the file there
    finally:
        os.close(fd)


def test_prefetch_reads_nothing_when_the_range_is_cached(tmp_path, monkeypatch):
    path = tmp_path / "segment"
    path.write_bytes(os.urandom(4 * MiB))                    # just written: in the page cache
    f = OS_DISK.open(path)
    reads = []
    real = os.preadv
    monkeypatch.setattr(fs.os, "preadv", lambda *a: reads.append(a[2]) or real(*a))
    f.prefetch(0, 4 * MiB)
    assert reads == []
    os.fsync(f.fd)
    os.posix_fadvise(f.fd, 0, 0, os.POSIX_FADV_DONTNEED)
    f.prefetch(0, 4 * MiB)
    assert reads and reads[0] == 0
    f.close()
