"""Wait for a condition with a deadline: the one poller (sync and asyncio) every part uses.

``wait_for(predicate, timeout_s, what, interval_s)`` calls ``predicate`` until it returns a truthy
value and returns that value. An exception raised by the predicate counts as "not yet" (a restarting
actor, a refused connection) and is shown on timeout. On timeout it raises ``error(message)``
(default ``WaitTimeout``, a ``TimeoutError``), the message naming ``what`` was awaited and the last
value or exception. ``wait_for_async`` is the same on an asyncio loop (it never blocks the loop).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

__all__ = ["WaitTimeout", "wait_for", "wait_for_async"]


class WaitTimeout(TimeoutError):
    """The awaited condition did not hold within the deadline."""


def _message(timeout_s: float, what: str, last: Any) -> str:
    return f"timed out after {timeout_s:g}s waiting for {what}; last: {last!r}"


def _poll(predicate: Callable[[], Any]) -> tuple[bool, Any]:
    try:
        value = predicate()
    except Exception as exc:  # noqa: BLE001 - "not yet"; reported on timeout
        return False, exc
    return bool(value), value


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.1, *,
             error: Callable[[str], BaseException] = WaitTimeout) -> Any:
    """Poll ``predicate`` every ``interval_s`` until truthy (returned) or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        done, last = _poll(predicate)
        if done:
            return last
        if time.monotonic() >= deadline:
            raise error(_message(timeout_s, what, last))
        time.sleep(interval_s)


async def wait_for_async(predicate: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.02, *,
                         error: Callable[[str], BaseException] = WaitTimeout) -> Any:
    """``wait_for`` on the running asyncio loop: sleeps with ``asyncio.sleep``."""
    deadline = time.monotonic() + timeout_s
    while True:
        done, last = _poll(predicate)
        if done:
            return last
        if time.monotonic() >= deadline:
            raise error(_message(timeout_s, what, last))
        await asyncio.sleep(interval_s)
