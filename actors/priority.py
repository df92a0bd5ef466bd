"""The CPU priority of rocketray's server actors.

Ray starts every worker process at nice 15 (its ``worker_niceness``), beneath its own daemons, the
driver and anything else on the node, and a worker process it is starting runs its imports at nice
0 until Ray lowers it. A broker or a controller is a server whose latency is the product: on a busy
node a failover is a chain of a dozen hand-offs between these processes (session close, election
commit, notification, role switch, epoch file, first write), and at nice 15 each hand-off waits
behind every nice-0 process that wants the CPU. On the 2-vCPU test machine the failover benchmark
measured p50s of 80-116 ms at nice 15 against 70-81 ms at nice 0 (three alternated runs each,
2026-11-27, docs/client-design.md).

So each broker and controller actor asks at start for ``broker.process_niceness`` /
``controller.process_niceness`` (default 0; ``none`` keeps Ray's) on every thread of its process
(Linux keeps a niceness per thread; a thread started later inherits its starter's). Raising one's
priority needs CAP_SYS_NICE (root has it) or an RLIMIT_NICE that allows it; where neither is given
the actor keeps Ray's niceness and logs once what to do instead: start Ray with
``RAY_worker_niceness=0`` (every worker of that Ray then starts at 0), or grant the limit.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

__all__ = ["NicenessResult", "set_process_niceness", "thread_niceness"]

log = logging.getLogger("rocketray.actors")


@dataclass(frozen=True, slots=True)
class NicenessResult:
    """What ``set_process_niceness`` did: the threads it moved, the threads it was refused."""

    changed: int
    refused: int


def thread_niceness(pid: int | None = None) -> dict[int, int]:
    """Each thread of process ``pid`` (this one by default) and its niceness."""
    base = f"/proc/{'self' if pid is None else pid}/task"
    out: dict[int, int] = {}
    for name in os.listdir(base):
        try:
            out[int(name)] = os.getpriority(os.PRIO_PROCESS, int(name))
        except ProcessLookupError:   # that thread ended meanwhile
            continue
    return out


def set_process_niceness(target: int | None, who: str) -> NicenessResult:
    """Give every thread of this process niceness ``target`` (None: leave Ray's; the configs keep it
    within -20..19); see the module docstring. A refusal is logged (once per call) with the remedy."""
    if target is None:
        return NicenessResult(0, 0)
    changed = refused = 0
    for tid, nice in thread_niceness().items():
        if nice == target:
            continue
        try:
            os.setpriority(os.PRIO_PROCESS, tid, target)
            changed += 1
        except ProcessLookupError:   # that thread ended meanwhile
            continue
        except PermissionError:
            refused += 1
    if refused:
        log.warning("%s runs at Ray's worker niceness %d: not permitted to set %d on %d threads (needs "
                    "CAP_SYS_NICE or RLIMIT_NICE); start Ray with RAY_worker_niceness=%d instead",
                    who, os.getpriority(os.PRIO_PROCESS, 0), target, refused, target)
    elif changed:
        log.info("%s threads=%d niceness=%d", who, changed, target)
    return NicenessResult(changed, refused)
