"""``rocketray.client.aio``, one layer (the in-memory cluster of tests/support/fake_client_cluster.py):
the same semantics as the synchronous client, the event loop never blocked, nothing a cancelled
poll took is lost, and closing leaves no thread behind."""

from __future__ import annotations

import asyncio
import threading
import time

from rocketray.client import SendStatus, TopicQueue
from rocketray.client.aio import AsyncConsumer, AsyncProducer
from rocketray.wire.controller_api import GetTopicRouteRequest
from rocketray.waiting import wait_for, wait_for_async
from tests.support.fake_client_cluster import FakeCluster, FakeTransport


class SlowRoutes(FakeTransport):
    """Route answers take 1 s (a controller far away): a send that must ask blocks its thread."""

    def call_controller(self, request, timeout_s=10.0):
        if isinstance(request, GetTopicRouteRequest):
            time.sleep(1.0)
        return super().call_controller(request, timeout_s)


class Ticker:
    """Measures the event loop's longest stall: a task that wakes every 5 ms."""

    def __init__(self) -> None:
        self.worst_s = 0.0
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.005)
            now = time.monotonic()
            self.worst_s = max(self.worst_s, now - last - 0.005)
            last = now

    def __enter__(self) -> "Ticker":
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


def aio_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("rocketray-aio")]


def cluster(queues: int = 2, slow_routes: bool = False) -> tuple[FakeCluster, FakeTransport]:
    c = FakeCluster()
    c.create_topic("t", queues)
    return c, (SlowRoutes(c) if slow_routes else FakeTransport(c))


def test_await_send_never_blocks_the_loop_and_keeps_key_order():
    """The first send must ask for the route (1 s): it waits on the producer's thread while the
    loop keeps ticking; 200 concurrent sends of one key are stored in the order they were made;
    with a full buffer the sends still never block the loop."""
    c, t = cluster(slow_routes=True)
    gate = threading.Event()

    async def main():
        with Ticker() as ticker:
            async with AsyncProducer(transport=t, buffer_bytes=16 * 1024, max_message_bytes=4096) as p:
                first = await p.send("t", b"first", key="k")
                assert first.status is SendStatus.SEND_OK
                results = await asyncio.gather(*(p.send("t", f"{i}".encode(), key="k") for i in range(200)))
                offsets = [r.queue_offset for r in results]
                assert offsets == sorted(offsets) and offsets[0] == first.queue_offset + 1
                c.put_hook = lambda group, batch: (gate.wait(10), None)[1]
                blocked = [asyncio.ensure_future(p.send("t", b"x" * 1000, key="k")) for _ in range(40)]
                await wait_for_async(lambda: p.metrics().buffered_bytes > 16 * 1024 - 1100, 5,
                                     "the buffer to fill (the rest of the sends wait off the loop)")
                assert not any(f.done() for f in blocked)
                gate.set()
                assert all(r.status is SendStatus.SEND_OK for r in await asyncio.gather(*blocked))
                assert p.metrics().sent == 241
        return ticker.worst_s

    worst = asyncio.run(main())
    assert worst < 0.5, f"the loop stalled {worst:.3f} s"     # a lookup on the loop stalls it 1 s
    wait_for(lambda: not aio_threads(), 10, "the aio threads to end")


def test_async_for_and_commit_up_to_what_the_application_received():
    """async for yields every message; commit() commits one past the last one received, not the
    rest of the batch the consumer fetched ahead."""
    c, t = cluster(1)

    async def main():
        async with AsyncProducer(transport=t) as p:
            await asyncio.gather(*(p.send("t", f"{i}".encode()) for i in range(10)))
        async with AsyncConsumer(group="g", topics=["t"], transport=t, poll_timeout_s=0.2) as con:
            got = []
            async for m in con:
                got.append(m.queue_offset)
                if len(got) == 3:
                    assert await con.commit() == {TopicQueue("t", 0): 3}
                if len(got) == 10:
                    break
            assert got == list(range(10)) and c.committed[("g", "t", 0)] == 3
            assert await con.commit() == {TopicQueue("t", 0): 10}
            assert await con.assignment() == [TopicQueue("t", 0)]

    asyncio.run(main())
    wait_for(lambda: not aio_threads(), 10, "the aio threads to end")


def test_a_cancelled_poll_loses_nothing():
    """A poll cancelled while its thread waits in Consumer.poll: the messages that poll then takes
    are returned by the next poll, none lost, none twice."""
    c, t = cluster(1)

    async def main():
        async with AsyncConsumer(group="g", topics=["t"], transport=t) as con:
            waiting = asyncio.ensure_future(con.poll(timeout_s=2.0))
            await wait_for_async(lambda: c._held, 5, "the poll's held pull")
            waiting.cancel()
            async with AsyncProducer(transport=t) as p:
                await asyncio.gather(*(p.send("t", f"{i}".encode()) for i in range(5)))
            got: list[int] = []
            while len(got) < 5:
                got += [m.queue_offset for m in await con.poll(timeout_s=0.5)]
            assert got == [0, 1, 2, 3, 4]

    asyncio.run(main())


def test_seek_and_pause_drop_what_async_for_held():
    """Messages held for async for are from before a seek or pause: a seek reads from its offset,
    a paused queue's held messages are read again after resume."""
    c, t = cluster(1)

    async def main():
        async with AsyncProducer(transport=t) as p:
            await asyncio.gather(*(p.send("t", f"{i}".encode()) for i in range(6)))
        async with AsyncConsumer(group="g", topics=["t"], transport=t, poll_timeout_s=0.2) as con:
            it = con.__aiter__()
            assert (await it.__anext__()).queue_offset == 0      # 1..5 are held
            await con.pause(TopicQueue("t", 0))
            assert await con.poll(0.1) == []
            await con.resume(TopicQueue("t", 0))
            assert [m.queue_offset for m in await con.poll(1.0)] == [1, 2, 3, 4, 5]
            await con.seek("t", 0, 4)
            assert [m.queue_offset for m in await con.poll(1.0)] == [4, 5]
            await con.seek_to_end()
            assert con.pending_commits() == {TopicQueue("t", 0): 6}

    asyncio.run(main())


def test_nack_redelivers_and_commit_waits_for_the_copy():
    """``AsyncConsumer.nack``: the copy comes back as delivery 2; while its put is held, commit (of
    what the application received) stays short of the nacked message, then moves past it."""
    c, t = cluster(1)
    gate = threading.Event()

    def hold_retry_puts(group, batch):
        from rocketray.wire.message import decode_record

        if decode_record(batch.data, 0)[0].topic.startswith("%RETRY%"):
            gate.wait(10)
        return None

    async def run() -> None:
        async with AsyncProducer(transport=t) as p:
            await p.send("t", b"a")
            await p.send("t", b"b")
        async with AsyncConsumer(group="g", topics=["t"], transport=t, consumer_heartbeat_interval_ms=20,
                                 retry_delays="100ms", poll_timeout_s=0.05) as con:
            first = await con.__anext__()
            await con.__anext__()
            c.put_hook = hold_retry_puts
            nack = asyncio.ensure_future(con.nack(first))
            await wait_for_async(lambda: "%RETRY%g" in c.topics, 10, "the retry topic")
            assert await con.commit() == {TopicQueue("t", 0): 0}   # held at the nacked offset 0
            gate.set()
            result = await nack
            assert result.topic == "%RETRY%g" and await con.commit() == {TopicQueue("t", 0): 2}
            again = await asyncio.wait_for(con.__anext__(), 10)
            assert (again.delivery_count, again.body, again.origin_queue_offset) == (2, b"a", 0)

    asyncio.run(run())
