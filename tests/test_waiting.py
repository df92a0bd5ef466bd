"""rocketray.waiting: the one poller returns the truthy value, treats a raising predicate as 'not yet',
and names what it waited for on timeout (sync and asyncio)."""

from __future__ import annotations

import asyncio
import time

import pytest

from rocketray.waiting import WaitTimeout, wait_for, wait_for_async


def counter_predicate(ready_at: int, fail_first: int = 0):
    calls = {"n": 0}

    def predicate():
        calls["n"] += 1
        if calls["n"] <= fail_first:
            raise ConnectionRefusedError("not up yet")
        return calls["n"] if calls["n"] >= ready_at else 0

    return predicate, calls


def test_returns_the_truthy_value_after_exceptions_and_falsy_values():
    predicate, calls = counter_predicate(ready_at=5, fail_first=2)
    assert wait_for(predicate, 5, "the counter", interval_s=0.001) == 5
    assert calls["n"] == 5


def test_timeout_names_what_and_the_last_exception():
    def refused():
        raise ConnectionRefusedError("port 1")

    started = time.monotonic()
    with pytest.raises(WaitTimeout, match=r"waiting for the broker; last: ConnectionRefusedError\('port 1'\)"):
        wait_for(refused, 0.05, "the broker", interval_s=0.01)
    assert 0.05 <= time.monotonic() - started < 2
    assert issubclass(WaitTimeout, TimeoutError)


def test_the_caller_chooses_the_error_type():
    class ClusterError(RuntimeError):
        pass

    with pytest.raises(ClusterError, match="a leader; last: 0"):
        wait_for(lambda: 0, 0.01, "a leader", interval_s=0.005, error=ClusterError)


def test_async_version_does_not_block_the_loop():
    async def main():
        flag = {"set": False}

        async def setter():
            await asyncio.sleep(0.02)
            flag["set"] = True

        task = asyncio.create_task(setter())
        assert await wait_for_async(lambda: flag["set"], 5, "the flag") is True
        await task
        with pytest.raises(AssertionError, match="waiting for never"):
            await wait_for_async(lambda: None, 0.02, "never", error=AssertionError)

    asyncio.run(main())
