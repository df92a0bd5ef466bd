"""Wall-clock faults for one process: libfaketime with a timestamp file the runner rewrites.

Theory of operation. A process started with :func:`faketime_env` loads libfaketime
(``LD_PRELOAD``) and reads its wall-clock offset from its own timestamp file (``+0`` at first:
real time), re-read at most once a second (``FAKETIME_CACHE_DURATION``), so the runner jumps the
clock of a running process by rewriting the file (:func:`set_offset`). The monotonic clock is left
alone (``FAKETIME_DONT_FAKE_MONOTONIC``): a real clock jump moves only ``CLOCK_REALTIME``.

libfaketime 0.9.10 (Debian's) answers an absolute-time ``clock_nanosleep`` on the monotonic clock
with ``EINVAL`` when the monotonic clock is not faked: it converts the deadline with the faked
*real* time. CPython's ``time.sleep`` sleeps exactly that way, so every ``time.sleep`` of a process
under it raised. A small preload library compiled here on first use (``cc``; cached under the
temporary directory by the source's hash) comes first in ``LD_PRELOAD`` and sends every
``clock_nanosleep`` on a clock other than ``CLOCK_REALTIME`` straight to the kernel.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")

__all__ = ["FAKETIME_LIB", "faketime_env", "read_offset", "set_offset", "sleep_fix_library"]

_SLEEP_FIX_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int clock_nanosleep(clockid_t clock, int flags, const struct timespec *req, struct timespec *rem) {
    if (clock != CLOCK_REALTIME) {
        return syscall(SYS_clock_nanosleep, clock, flags, req, rem) == 0 ? 0 : errno;
    }
    static int (*next)(clockid_t, int, const struct timespec *, struct timespec *);
    if (next == NULL) {
        next = dlsym(RTLD_NEXT, "clock_nanosleep");
    }
    return next(clock, flags, req, rem);
}
"""


def sleep_fix_library() -> Path:
    """The preload library that keeps monotonic sleeps away from libfaketime (built once)."""
    digest = hashlib.sha256(_SLEEP_FIX_C.encode()).hexdigest()[:16]
    lib = Path(tempfile.gettempdir()) / f"rocketray-faketime-sleepfix-{digest}.so"
    if lib.exists():
        return lib
    source = lib.with_suffix(".c")
    source.write_text(_SLEEP_FIX_C)
    partial = lib.with_name(f"{lib.name}.{os.getpid()}")
    try:
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(partial), str(source), "-ldl"],
                       check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"cannot build the faketime sleep fix with cc: {exc}") from exc
    os.replace(partial, lib)      # atomic: a concurrent builder's copy is identical
    return lib


def faketime_env(clock_file: Path) -> dict[str, str]:
    """The environment that runs a process under libfaketime, its offset read from ``clock_file``
    (written ``+0`` here)."""
    if not FAKETIME_LIB.exists():
        raise FileNotFoundError(f"{FAKETIME_LIB} is missing: apt-get install faketime")
    set_offset(clock_file, 0)
    return {"LD_PRELOAD": f"{sleep_fix_library()}:{FAKETIME_LIB}", "FAKETIME_TIMESTAMP_FILE": str(clock_file),
            "FAKETIME_DONT_FAKE_MONOTONIC": "1", "FAKETIME_CACHE_DURATION": "1"}


def set_offset(clock_file: Path, offset_s: int) -> None:
    """Jump the wall clock of the processes reading ``clock_file`` to real time + ``offset_s``
    (they see it within a second). Written whole by a rename: a reader never sees half a line."""
    partial = clock_file.with_name(f"{clock_file.name}.partial")
    partial.write_text(f"{offset_s:+d}\n")
    os.replace(partial, clock_file)


def read_offset(clock_file: Path) -> int:
    return int(clock_file.read_text().strip())
