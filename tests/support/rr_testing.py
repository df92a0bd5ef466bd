"""Test helpers shared by every layer: predicate waits with deadlines, free loopback ports.

On pytest's ``pythonpath`` (see pyproject.toml), so a test module imports them with
``from rr_testing import wait_until`` without touching ``sys.path``.
"""

from __future__ import annotations

import time
from typing import Callable

import pytest

from rocketray import ports


def wait_until(predicate: Callable[[], object], timeout_s: float = 10.0, interval_s: float = 0.02,
               what: str = "condition") -> object:
    """Poll ``predicate`` until it returns a truthy value or the deadline passes.

    Returns the truthy value. On timeout, fails the test naming what was awaited
    and the last value (or exception) the predicate produced.
    """
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            last = predicate()
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - reported on timeout
            last = exc
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}; last value: {last!r}")
        time.sleep(interval_s)


_handed_out: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, outside the ephemeral range, and never
    returned before in this process (two calls in a row cannot give the same port)."""
    port = ports.free_ports(1, avoid=_handed_out)[0]
    _handed_out.add(port)
    return port
