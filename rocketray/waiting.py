"""Wait for a condition with a deadline: the one poller (sync and asyncio) every part uses.

``wait_for(predicate, timeout_s, what, interval_s)`` calls ``predicate`` until it returns a truthy
value and returns that value. An exception raised by the predicate counts as "not yet" (a restarting
actor, a refused connection) and is shown on timeout. On timeout it raises ``error(message)``
(default ``WaitTimeout``, a ``TimeoutError``), the message naming ``what`` was awaited and the last
value or exception. ``wait_for_async`` is the same on an asyncio loop (it never blocks the loop).
A predicate can return ``NotYet(why)``, falsy, so a timeout says why the condition did not hold.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Generator

__all__ = ["NotYet", "WaitTimeout", "wait_for", "wait_for_async"]


class NotYet:
    """A falsy predicate result that says what is still missing (shown on timeout)."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"NotYet({self.why})"


class WaitTimeout(TimeoutError):
    """The awaited condition did not hold within the deadline."""


def _message(timeout_s: float, what: str, last: Any) -> str:
    return f"timed out after {timeout_s:g}s waiting for {what}; last: {last!r}"


def _polls(predicate: Callable[[], Any], timeout_s: float, what: str, interval_s: float,
           error: Callable[[str], BaseException]) -> Generator[float, None, Any]:
    """The polling loop without its sleep: yields how long to sleep, returns the truthy value."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            last = predicate()
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - "not yet"; reported on timeout
            last = exc
        if time.monotonic() >= deadline:
            raise error(_message(timeout_s, what, last))
        yield interval_s


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.1, *,
             error: Callable[[str], BaseException] = WaitTimeout) -> Any:
    """Poll ``predicate`` every ``interval_s`` until truthy (returned) or ``timeout_s`` passes."""
    polls = _polls(predicate, timeout_s, what, interval_s, error)
    try:
        while True:
            time.sleep(next(polls))
    except StopIteration as done:
        return done.value


async def wait_for_async(predicate: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.02, *,
                         error: Callable[[str], BaseException] = WaitTimeout) -> Any:
    """``wait_for`` on the running asyncio loop: sleeps with ``asyncio.sleep``."""
    polls = _polls(predicate, timeout_s, what, interval_s, error)
    try:
        while True:
            await asyncio.sleep(next(polls))
    except StopIteration as done:
        return done.value
