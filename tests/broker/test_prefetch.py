"""``OsFile.prefetch``: a catch-up's read-ahead (``MessageStore.warm``) brings an evicted range into
the page cache, so the event loop that sends it next does not wait for the disk."""

from __future__ import annotations

import os

from rocketray.broker.fs import OS_DISK

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
