"""Event-loop stall monitor and the broker's ordered IO thread (asyncio shells).

Theory of operation. ``LoopStallMonitor`` runs a task that asks to wake every ``interval_ms``;
how late it wakes is how long something held the loop (a blocking call, a long computation). The
worst lateness seen is ``max_stall_ms``: benchmarks print it, and the broker's rule is that no
stall exceeds 50 ms.

``OrderedIO`` is one broker's IO thread: a single-worker executor, so jobs run one at a time in
the order they were submitted. Moving a store write, fsync, truncation or epoch-file sync there
keeps the store's durability order (each job still runs the store's own synchronous, durable
method) while the event loop keeps serving sockets and timers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Callable, TypeVar

__all__ = ["LoopStallMonitor", "OrderedIO"]

T = TypeVar("T")


class LoopStallMonitor:
    """Worst lateness of a periodic wake-up on the running loop, in ms."""

    def __init__(self, interval_ms: float = 5.0) -> None:
        assert interval_ms > 0
        self.interval_s = interval_ms / 1000
        self.max_stall_ms = 0.0
        self.samples = 0
        self._task: asyncio.Task | None = None

    def start(self) -> "LoopStallMonitor":
        """Start sampling on the running loop (idempotent)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-stall")
        return self

    def reset(self) -> None:
        self.max_stall_ms = 0.0
        self.samples = 0

    async def stop(self) -> float:
        """Stop sampling; returns the worst stall seen."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return self.max_stall_ms

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            expected = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            late_ms = (loop.time() - expected) * 1000
            self.samples += 1
            if late_ms > self.max_stall_ms:
                self.max_stall_ms = late_ms


class OrderedIO:
    """One thread running blocking store work in submission order."""

    def __init__(self, name: str) -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                               thread_name_prefix=f"io-{name}")
        self.closed = False

    def submit(self, fn: Callable[..., T], *args: object) -> "asyncio.Future[T]":
        """Queue ``fn(*args)`` after every job submitted before it; await the result."""
        return asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        return await self.submit(fn, *args)

    def close(self) -> None:
        """Let queued jobs finish (in the background); accept no more."""
        self.closed = True
        self._executor.shutdown(wait=False)
