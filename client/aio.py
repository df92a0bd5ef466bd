"""``rocketray.client.aio``: the producer and consumer for asyncio programs.

    import asyncio
    from rocketray.client.aio import AsyncConsumer, AsyncProducer

    async def main():
        async with AsyncProducer("demo") as p:
            result = await p.send("orders", b"paid", key="order-17")      # acknowledged
        async with AsyncConsumer("demo", group="billing", topics=["orders"]) as c:
            async for m in c:
                handle(m)
                await c.commit()                                          # up to m, exactly

Same semantics as the synchronous classes (``Producer``, ``Consumer``), built over them: nothing
here blocks the event loop. A send that can queue at once is queued from the loop (microseconds)
and its future's answer comes back through ``call_soon_threadsafe``; one that would wait (the
topic's route not yet known, the buffer full) is handed to a thread of the producer's own, in call
order, so two sends of one key are stored in the order they were awaited. Every consumer call runs
on one thread of the consumer's own (the ``Consumer`` is used by one thread at a time), except
``nack``, which is thread-safe and so does not wait behind a poll in flight.

Cancelling an ``await send(...)`` does not unsend: the message may still be stored (the producer's
futures cannot be cancelled). Cancelling an ``await poll()`` (or an ``async for`` step) loses
nothing: the messages that poll took are returned by the next one. ``commit()`` commits, per queue,
one past the last message the application received (from ``poll`` or ``async for``), not what the
consumer fetched ahead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
import time
from typing import Any, Callable, Iterable, Mapping, TypeVar

from rocketray.client.consumer import CommitCallback, Consumer
from rocketray.client.core import Positions
from rocketray.client.errors import ClientClosed, ClientError, InvalidRequest
from rocketray.client.messages import deliver_time
from rocketray.client.metrics import ConsumerMetrics, ProducerMetrics
from rocketray.client.producer import Producer
from rocketray.client.types import ReceivedMessage, SendResult, TopicQueue

__all__ = ["AsyncProducer", "AsyncConsumer"]

T = TypeVar("T")


def _bridge(source: concurrent.futures.Future, loop: asyncio.AbstractEventLoop) -> asyncio.Future:
    """An asyncio future on ``loop`` that gets ``source``'s outcome; cancelling it leaves ``source`` alone."""
    target = loop.create_future()

    def copy() -> None:
        if target.cancelled():
            return
        exc = source.exception()
        if exc is not None:
            target.set_exception(exc)
        else:
            target.set_result(source.result())

    def done(_f: concurrent.futures.Future) -> None:
        try:
            loop.call_soon_threadsafe(copy)
        except RuntimeError:        # the loop closed meanwhile: nobody awaits the answer
            pass

    source.add_done_callback(done)
    return target


def _started(client: T | None, what: str) -> T:
    if client is None:
        raise ClientError(f"the {what} is not started: await start() or use `async with`", code="NOT_STARTED")
    return client


class _Worker:
    """One thread that runs a client's blocking calls for the event loop, in call order."""

    def __init__(self, name: str) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=name)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await _bridge(self._pool.submit(functools.partial(fn, *args, **kwargs)), loop)

    def submit(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future:
        return self._pool.submit(fn, *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False)


class AsyncProducer:
    """``Producer`` for asyncio (module docstring); the same arguments. ``await start()`` or
    ``async with`` connects it."""

    def __init__(self, cluster: str = "default", **kwargs: Any) -> None:
        self._args = (cluster, kwargs)
        self._producer: Producer | None = None
        self._worker = _Worker("rocketray-aio-producer")
        self._queued_slow = 0          # sends handed to the worker and not yet queued

    async def start(self) -> "AsyncProducer":
        if self._producer is None:
            cluster, kwargs = self._args
            self._producer = await self._worker.run(Producer, cluster, **kwargs)
        return self

    @property
    def producer(self) -> Producer:
        """The synchronous producer underneath (for ``metrics``, ``config``)."""
        return _started(self._producer, "producer")

    async def send(self, topic: str, body: bytes, *, key: str | None = None, tags: str | None = None,
                   properties: Mapping[str, str] | None = None, delay_s: float | None = None,
                   deliver_at_ms: int | None = None) -> SendResult:
        """Send one message and wait (without blocking the loop) until it is acknowledged; raises
        the same errors as ``Producer.send`` (``delay_s``, ``deliver_at_ms``: delayed delivery, as there)."""
        return await (await self.send_async(topic, body, key=key, tags=tags, properties=properties, delay_s=delay_s,
                                            deliver_at_ms=deliver_at_ms))

    async def send_async(self, topic: str, body: bytes, *, key: str | None = None, tags: str | None = None,
                         properties: Mapping[str, str] | None = None, delay_s: float | None = None,
                         deliver_at_ms: int | None = None) -> asyncio.Future:
        """Queue one message; the awaitable it returns gives its :class:`SendResult` (aiokafka's
        ``send``: ``fut = await p.send_async(...)`` then ``await fut``)."""
        producer, loop = self.producer, asyncio.get_running_loop()
        at = deliver_time(delay_s, deliver_at_ms, int(time.time() * 1000))   # a delay counts from this call
        source = None
        if not self._queued_slow:
            source = producer.send_nowait(topic, body, key=key, tags=tags, properties=properties, deliver_at_ms=at)
        if source is None:
            self._queued_slow += 1
            try:
                source = await self._worker.run(producer.send_async, topic, body, key=key, tags=tags,
                                                properties=properties, deliver_at_ms=at)
            finally:
                self._queued_slow -= 1
        return _bridge(source, loop)

    async def flush(self, timeout_s: float | None = None) -> None:
        await self._worker.run(self.producer.flush, timeout_s)

    def metrics(self) -> ProducerMetrics:
        return self.producer.metrics()

    async def close(self, timeout_s: float | None = None) -> None:
        """Flush and close (``Producer.close``), off the loop. Idempotent."""
        if self._producer is not None:
            await self._worker.run(self._producer.close, timeout_s)
        self._worker.shutdown()

    async def __aenter__(self) -> "AsyncProducer":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncConsumer:
    """``Consumer`` for asyncio (module docstring); the same arguments. ``await start()`` or
    ``async with`` joins the group. A ``listener`` runs on the consumer's thread, inside poll."""

    def __init__(self, cluster: str = "default", *, group: str, topics: Iterable[str] | Mapping[str, str],
                 poll_timeout_s: float = 1.0, **kwargs: Any) -> None:
        subscribed: Any = dict(topics) if isinstance(topics, Mapping) else \
            [topics] if isinstance(topics, str) else list(topics)
        self._args = (cluster, group, subscribed, kwargs)
        self._poll_timeout_s = poll_timeout_s
        self._consumer: Consumer | None = None
        self._worker = _Worker("rocketray-aio-consumer")
        self._job: concurrent.futures.Future | None = None   # a poll whose messages were not handed over yet
        self._buffer: list[ReceivedMessage] = []             # polled, not yet yielded by ``async for``
        self._lock = threading.Lock()
        self._positions: Positions[TopicQueue] = Positions()  # what the application received
        self._closed = False

    async def start(self) -> "AsyncConsumer":
        if self._consumer is None:
            cluster, group, topics, kwargs = self._args
            self._consumer = await self._worker.run(functools.partial(Consumer, cluster, group=group, topics=topics,
                                                                      **kwargs))
        return self

    @property
    def consumer(self) -> Consumer:
        """The synchronous consumer underneath (its ``assignment``, ``metrics``, ``config``)."""
        return _started(self._consumer, "consumer")

    # --- reading --------------------------------------------------------------------------------
    async def poll(self, timeout_s: float | None = None) -> list[ReceivedMessage]:
        """Messages of this member's queues (those ``async for`` took but did not yield come first)."""
        if self._buffer:
            out, self._buffer = self._buffer, []
        else:
            out = await self._fetch(self._poll_timeout_s if timeout_s is None else timeout_s)
        self._received(out)
        return out

    def __aiter__(self) -> "AsyncConsumer":
        return self

    async def __anext__(self) -> ReceivedMessage:
        while not self._buffer:
            if self._closed:
                raise StopAsyncIteration
            self._buffer = await self._fetch(self._poll_timeout_s)
        message = self._buffer.pop(0)
        self._received([message])
        return message

    async def _fetch(self, timeout_s: float) -> list[ReceivedMessage]:
        """One ``Consumer.poll`` on the worker; if this await is cancelled the poll's messages stay
        for the next call."""
        if self._closed:
            raise ClientClosed("consumer is closed")
        consumer = self.consumer
        if self._job is None:
            self._job = self._worker.submit(consumer.poll, timeout_s)
        job = self._job
        try:
            out = await asyncio.shield(_bridge(job, asyncio.get_running_loop()))
        except asyncio.CancelledError:
            raise                       # the job stays: the next poll takes its messages
        except BaseException:
            self._job = None
            raise
        self._job = None
        return out

    def _received(self, messages: list[ReceivedMessage]) -> None:
        with self._lock:
            for m in messages:
                self._positions.returned(TopicQueue(m.topic, m.queue_id), m.queue_offset + 1)

    # --- retries --------------------------------------------------------------------------------
    async def nack(self, message: ReceivedMessage, delay_s: float | None = None) -> SendResult:
        """``Consumer.nack`` off the loop (not behind a poll in flight: nack is thread-safe); until
        the copy is acknowledged, and for good if this raises, ``commit`` stops short of ``message``."""
        if not isinstance(message, ReceivedMessage):
            raise InvalidRequest(f"nack takes a message this consumer polled, not {message!r:.100}")
        key = TopicQueue(message.topic, message.queue_id)
        with self._lock:
            self._positions.hold(key, message.queue_offset)
        result = await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(self.consumer.nack, message, delay_s))
        with self._lock:
            self._positions.release(key, message.queue_offset)
        return result

    # --- committing -----------------------------------------------------------------------------
    def pending_commits(self) -> dict[TopicQueue, int]:
        """Per queue, one past the last message the application received, where that is past what
        was acknowledged (thread-safe: a rebalance listener may commit it from the consumer's thread
        with ``consumer.commit(offsets=...)``)."""
        with self._lock:
            return dict(self._positions.to_commit())

    async def commit(self, offsets: Mapping[TopicQueue, int] | None = None,
                     timeout_s: float | None = None) -> dict[TopicQueue, int]:
        """``Consumer.commit`` of ``offsets``, by default of what the application received."""
        todo = self.pending_commits() if offsets is None else dict(offsets)
        if not todo:
            return {}
        done = await self._worker.run(self.consumer.commit, todo, timeout_s)
        self._acknowledged(done)
        return done

    def commit_async(self, offsets: Mapping[TopicQueue, int] | None = None,
                     callback: CommitCallback | None = None) -> concurrent.futures.Future:
        """``Consumer.commit_async`` of ``offsets``, by default of what the application received."""
        todo = self.pending_commits() if offsets is None else dict(offsets)
        fut = self.consumer.commit_async(todo, callback)

        def done(f: concurrent.futures.Future) -> None:
            if f.exception() is None:
                self._acknowledged(f.result())

        fut.add_done_callback(done)
        return fut

    def _acknowledged(self, done: Mapping[TopicQueue, int]) -> None:
        with self._lock:
            for key, offset in done.items():
                self._positions.acknowledged(key, offset)

    # --- positions and control ------------------------------------------------------------------
    async def seek(self, topic: str, queue_id: int, offset: int) -> None:
        """``Consumer.seek``; messages ``async for`` held of that queue are dropped (read again)."""
        await self._seek(functools.partial(self.consumer.seek, topic, queue_id, offset), [TopicQueue(topic, queue_id)])

    async def seek_to_beginning(self, *queues: TopicQueue) -> None:
        await self._seek(functools.partial(self.consumer.seek_to_beginning, *queues), queues)

    async def seek_to_end(self, *queues: TopicQueue) -> None:
        await self._seek(functools.partial(self.consumer.seek_to_end, *queues), queues)

    async def seek_to_time(self, timestamp_ms: int, *queues: TopicQueue) -> None:
        """``Consumer.seek_to_time``: from the first message stored at or after ``timestamp_ms``."""
        await self._seek(functools.partial(self.consumer.seek_to_time, timestamp_ms, *queues), queues)

    async def _seek(self, seek: Callable[[], object], queues: Iterable[TopicQueue]) -> None:
        """Run ``seek`` on the consumer's thread; then the messages held of those queues (all if
        none named) are from before it, and the application's position of each is where the
        consumer now reads."""
        consumer = self.consumer

        def run() -> dict[TopicQueue, int | None]:
            seek()
            keys = [TopicQueue(*q) for q in queues] or consumer.assignment()
            return {k: consumer.position(k.topic, k.queue_id) for k in keys}

        positions = await self._worker.run(run)
        self._take_back(queues)
        with self._lock:
            for key, position in positions.items():
                if position is not None:
                    self._positions.sought(key, position)

    async def pause(self, *queues: TopicQueue) -> None:
        """``Consumer.pause``; messages ``async for`` held of those queues are read again after ``resume``."""
        held = self._take_back(queues)
        consumer = self.consumer

        def pause_and_rewind() -> None:
            consumer.pause(*queues)
            for key, offset in held.items():
                consumer.seek(key.topic, key.queue_id, offset)

        await self._worker.run(pause_and_rewind)

    async def resume(self, *queues: TopicQueue) -> None:
        await self._worker.run(self.consumer.resume, *queues)

    async def assignment(self) -> list[TopicQueue]:
        return await self._worker.run(self.consumer.assignment)

    def _take_back(self, queues: Iterable[TopicQueue]) -> dict[TopicQueue, int]:
        """Drop the messages of ``queues`` (all if empty) that were polled but not handed to the
        application (``async for``'s buffer, a finished poll nobody took); per queue, the first
        offset dropped."""
        if self._job is not None and self._job.done() and self._job.exception() is None:
            self._buffer += self._job.result()
            self._job = None
        wanted = {TopicQueue(*q) for q in queues}
        first: dict[TopicQueue, int] = {}
        kept = []
        for m in self._buffer:
            key = TopicQueue(m.topic, m.queue_id)
            if wanted and key not in wanted:
                kept.append(m)
            else:
                first[key] = min(first.get(key, m.queue_offset), m.queue_offset)
        self._buffer = kept
        return first

    def metrics(self) -> ConsumerMetrics:
        return self.consumer.metrics()

    async def close(self) -> None:
        """Leave the group (``Consumer.close``), off the loop, after a poll in flight. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._consumer is not None:
            await self._worker.run(self._consumer.close)
        self._worker.shutdown()

    async def __aenter__(self) -> "AsyncConsumer":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
