"""``Producer``: send messages to a topic, synchronously or batched in the background.

    >>> from rocketray.client import Producer, SendStatus
    >>> with Producer("demo") as p:                                       # doctest: +SKIP
    ...     r = p.send("orders", b"paid", key="order-17", tags="paid")
    ...     assert r.status is SendStatus.SEND_OK
    ...     futures = [p.send_async("orders", b"x") for _ in range(1000)]
    ...     p.flush()

A send is acknowledged (``SEND_OK``) only when every in-sync replica of the queue's broker group
has the message, so an acknowledged message survives any failover the cluster survives. Messages go
to a queue chosen by ``key`` (one key, one queue, in order) or round robin. ``send_async`` batches
per broker group, as Kafka's producer sends one request per broker for many partitions: the messages
of every queue a broker group holds travel in one put (``batch_bytes``, ``max_batch_messages``,
``linger_ms``), and one put per broker group is in flight, so every queue's messages are stored in
the order they were sent.

Bounds. Messages queued or in flight hold at most ``buffer_bytes``; ``send_async`` waits up to
``max_block_ms`` for room, then raises :class:`BufferFull` (Kafka's ``buffer.memory`` and
``max.block.ms``). Each send ends within ``send_timeout_ms`` of its call, however long it queued.

Threads. Batches go out from the producer's sender threads; the futures' done callbacks run on one
callback thread of the producer, in the order the sends finished (``rocketray.client.futures``), so
a callback may call ``send`` itself.

Failures (typed, with ``retriable``): ``rocketray.client.sending`` says what each broker answer
means; a message is stored at most once per send except when a call was never answered.

Each message is made ready (queue, id, delivery plan, encoded record, deadline) and settled by
``rocketray.client.outgoing``; this module queues, batches, bounds and sends them.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from typing import Any, Callable, Mapping

from rocketray.wire.batch import EncodedBatch
from rocketray.client.config import ClientConfig, client_config
from rocketray.client.core import Accumulator, Batch
from rocketray.client.errors import AccessDenied, BufferFull, ClientClosed, FlushTimeout, InvalidRequest, SendUnknown
from rocketray.client.futures import CallbackThread
from rocketray.client.messages import RESERVED_PROPERTIES, deliver_time, new_client_id
from rocketray.client.metrics import ProducerMetrics, Tally
from rocketray.client.outgoing import Outgoing, Pending, per_message, pub_denied, settle, wall_ms
from rocketray.client.routes import Routes
from rocketray.client.sending import send_with_retries
from rocketray.client.transport import Transport, connect_transport
from rocketray.client.types import SendResult, TopicRoute, send_ok

__all__ = ["Producer", "RESERVED_PROPERTIES"]

log = logging.getLogger("rocketray.client")


class Producer:
    """Sends messages to topics of the cluster ``cluster`` (see the module docstring).

    Keyword arguments override the cluster's ``client`` configuration (``linger_ms``,
    ``batch_bytes``, ``max_batch_messages``, ``max_message_bytes``, ``send_timeout_ms``,
    ``request_timeout_ms``, ``sender_threads``, ``buffer_bytes``, ``max_block_ms``,
    ``route_refresh_ms``); an unknown or out-of-range one raises :class:`InvalidRequest` here.
    ``client_id`` names the producer in its metrics (``host@pid@random`` when None)."""

    def __init__(self, cluster: str = "default", *, transport: Transport | None = None, client_id: str | None = None,
                 **settings: Any) -> None:
        self.client_id = client_id or new_client_id()
        self._owns_transport = transport is None
        self._transport = transport if transport is not None else connect_transport(cluster)
        try:
            self.config: ClientConfig = client_config(self._transport, settings)
        except InvalidRequest:
            if self._owns_transport:
                self._transport.close()
            raise
        self._routes = Routes(self._transport, self.config.route_refresh_ms / 1000)
        self._lock = threading.Condition()
        self._acc: Accumulator[str, Pending] = Accumulator(
            self.config.linger_ms, self.config.batch_bytes, self.config.max_batch_messages)
        self._pool = concurrent.futures.ThreadPoolExecutor(self.config.sender_threads,
                                                           thread_name_prefix="rocketray-send")
        self._callbacks = CallbackThread()
        self._outgoing = Outgoing(self.config, self._callbacks.dispatch)
        self._closed = False        # no new sends; the sender thread stops
        self._closing = False       # close() began (it runs once)
        self._abort = threading.Event()     # close() timed out: sends in flight stop retrying
        self._flush_waiters = 0     # threads in flush(), woken when the last send finishes
        self._space_waiters = 0     # threads in send_async waiting for room in the buffer
        self._buffered_bytes = 0    # bytes of messages queued or in flight
        self._pending_messages = 0
        self._in_flight: dict[int, Batch[str, Pending]] = {}   # id -> batch taken for sending
        self._started: set[int] = set()                          # ids of those whose first put went out
        self._tally = Tally("sent", "failed", "unknown", "puts", "retries")
        self.sender_passes = 0      # the sender thread's passes (woken or timed out)
        self._sender = threading.Thread(target=self._sender_loop, name="rocketray-producer", daemon=True)
        self._sender.start()

    # --- public API -----------------------------------------------------------------------------
    def send(self, topic: str, body: bytes, *, key: str | None = None, tags: str | None = None,
             properties: Mapping[str, str] | None = None, delay_s: float | None = None,
             deliver_at_ms: int | None = None) -> SendResult:
        """Send one message and wait until it is acknowledged; raises a :class:`ClientError`.
        When its broker group is idle the calling thread sends it itself (no hand-off to the sender).
        ``delay_s`` or ``deliver_at_ms`` (wall-clock ms since the epoch; at most 24 h ahead): consumers
        get the message at or after that time (``rocketray.broker.schedule``); its result's
        ``queue_offset`` is then -1 (its place in the queue is taken when it falls due)."""
        return self._send_now(*self._prepare(self._route(topic), topic, body, key, tags, properties,
                                             deliver_at_ms=deliver_time(delay_s, deliver_at_ms, wall_ms())))

    def send_copy(self, route: TopicRoute, queue_id: int, body: bytes, key: str | None, tags: str | None,
                  properties: Mapping[str, str], system_properties: Mapping[str, str]) -> SendResult:
        """``send`` to queue ``queue_id`` of ``route``'s topic, with reserved properties the client
        sets itself: how ``Consumer.nack`` stores a retry or dead-letter copy
        (``rocketray.client.redelivery``). Not for applications."""
        return self._send_now(*self._prepare(route, route.topic, body, key, tags, properties,
                                             queue_id, system_properties))

    def _send_now(self, queue: str, pending: Pending, size: int) -> SendResult:
        with self._lock:
            self._reserve(size)
            claimed = self._acc.try_claim(queue)
            if claimed:
                batch: Batch[str, Pending] = Batch(queue, [pending], [size], size, _now_ms(), True)
                self._in_flight[id(batch)] = batch
            else:
                self._acc.add(queue, pending, size, _now_ms(), urgent=True)
                self._lock.notify_all()
        if claimed:
            self._send_batch(batch, chain=False)
        return pending.future.result()

    def send_async(self, topic: str, body: bytes, *, key: str | None = None, tags: str | None = None,
                   properties: Mapping[str, str] | None = None, delay_s: float | None = None,
                   deliver_at_ms: int | None = None) -> concurrent.futures.Future:
        """Queue one message for a batched send; the future gives its :class:`SendResult` or raises.
        Invalid input and unknown topics raise here, at once; a full buffer makes this wait up to
        ``max_block_ms`` (then :class:`BufferFull`). ``delay_s``, ``deliver_at_ms``: as ``send``."""
        queue, pending, size = self._prepare(self._route(topic), topic, body, key, tags, properties,
                                             deliver_at_ms=deliver_time(delay_s, deliver_at_ms, wall_ms()))
        with self._lock:
            self._reserve(size)
            if self._acc.add(queue, pending, size, _now_ms(), False):
                self._lock.notify_all()
        return pending.future

    def send_nowait(self, topic: str, body: bytes, *, key: str | None = None, tags: str | None = None,
                    properties: Mapping[str, str] | None = None, delay_s: float | None = None,
                    deliver_at_ms: int | None = None) -> concurrent.futures.Future | None:
        """``send_async`` if it can queue without waiting, else None (the topic's route must be asked
        of the controller first, or the buffer is full): an event loop's way to send without blocking
        (``rocketray.client.aio``). Invalid input raises as in ``send_async``."""
        at = deliver_time(delay_s, deliver_at_ms, wall_ms())
        route = self._routes.cached(topic)
        if route is None:
            return None
        queue, pending, size = self._prepare(route, topic, body, key, tags, properties, deliver_at_ms=at)
        with self._lock:
            if not self._closed and self._buffered_bytes + size > self.config.buffer_bytes:
                return None
            self._reserve(size)
            if self._acc.add(queue, pending, size, _now_ms(), False):
                self._lock.notify_all()
        return pending.future

    def flush(self, timeout_s: float | None = None) -> None:
        """Send every queued message now and wait until each send finished (acknowledged or failed)
        and the done callbacks of those sends ran (not waited for from a callback itself: it would
        wait for itself); :class:`FlushTimeout` if ``timeout_s`` passed first (the sends go on)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._wait_sends(deadline, timeout_s)
        if not self._callbacks.current() and not self._closing and not self._callbacks.wait_idle(deadline):
            raise FlushTimeout(f"flush: callbacks still running after {timeout_s} s")

    def _wait_sends(self, deadline: float | None, timeout_s: float | None) -> None:
        """Wait until nothing is queued or in flight (FlushTimeout at ``deadline``)."""
        with self._lock:
            self._acc.flush_all()
            self._lock.notify_all()
            self._flush_waiters += 1
            try:
                while self._pending_messages:      # counted down once a batch's futures are resolved
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise FlushTimeout(f"flush: {self._pending_messages} sends still pending after {timeout_s} s")
                    self._lock.wait(left)
            finally:
                self._flush_waiters -= 1

    def close(self, timeout_s: float | None = None) -> None:
        """Flush, then stop the background threads; returns within ``timeout_s`` (None: when every
        send finished). Sends still unfinished then end at once: those queued with
        :class:`ClientClosed` (not written), those in flight with :class:`SendUnknown`. Idempotent."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            self.flush(timeout_s)
            timed_out = False
        except FlushTimeout:
            timed_out = True
            log.warning("producer closed with sends unfinished after %s s: they end as unknown", timeout_s)
        if timed_out:
            self._abort.set()
        with self._lock:
            self._closed = True
            unsent = self._acc.drain()
            cut = list(self._in_flight.values()) if timed_out else []
            started = set(self._started)
            self._lock.notify_all()
        for batch in unsent:
            self._finish(batch, ClientClosed("producer closed before this message was sent"))
        for batch in cut:
            self._finish(batch, SendUnknown("producer closed before the answer came", "") if id(batch) in started
                         else ClientClosed("producer closed before this message was sent"))
        self._pool.shutdown(wait=not timed_out, cancel_futures=True)
        self._callbacks.close(deadline)
        if self._owns_transport:
            self._transport.close()

    def metrics(self) -> ProducerMetrics:
        """The producer's counters now (``rocketray.client.metrics``)."""
        counts = self._tally.snapshot()
        with self._lock:
            pending, buffered = self._pending_messages, self._buffered_bytes
        return ProducerMetrics(counts["sent"], counts["failed"], counts["unknown"], counts["puts"], counts["retries"],
                               pending, buffered)

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- queueing ---------------------------------------------------------------------------------
    def _reserve(self, size: int) -> None:
        """Count ``size`` bytes into the buffer, waiting up to ``max_block_ms`` for room (the lock
        held). Raises ClientClosed or BufferFull."""
        if self._closed:
            raise ClientClosed("producer is closed")
        if self._buffered_bytes + size > self.config.buffer_bytes:
            deadline = time.monotonic() + self.config.max_block_ms / 1000
            self._space_waiters += 1
            try:
                while self._buffered_bytes + size > self.config.buffer_bytes:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise BufferFull(f"no room for {size} bytes in the producer's buffer ({self._buffered_bytes} "
                                         f"of {self.config.buffer_bytes} bytes queued or in flight) after "
                                         f"{self.config.max_block_ms} ms")
                    self._lock.wait(left)
                    if self._closed:
                        raise ClientClosed("producer is closed")
            finally:
                self._space_waiters -= 1
        self._buffered_bytes += size
        self._pending_messages += 1

    def _prepare(self, route: TopicRoute, topic: str, body: bytes, key: str | None, tags: str | None,
                 properties: Mapping[str, str] | None, queue_id: int | None = None,
                 system: Mapping[str, str] | None = None,
                 deliver_at_ms: int | None = None) -> tuple[str, Pending, int]:
        """The message's broker group, pending entry and size (``Outgoing.make``); raises on bad input
        or a closed producer."""
        if self._closed:
            raise ClientClosed("producer is closed")
        return self._outgoing.make(route, topic, body, key, tags, properties, queue_id, system, deliver_at_ms)

    def _route(self, topic: str) -> TopicRoute:
        """The topic's route; a route the ACL hides is refused as what the producer wanted: Pub."""
        try:
            return self._routes.get(topic)
        except AccessDenied as exc:
            raise pub_denied(topic, exc) from None

    # --- sending ----------------------------------------------------------------------------------
    def _sender_loop(self) -> None:
        while True:
            with self._lock:
                self.sender_passes += 1
                if self._closed:
                    return
                ready = self._acc.take_ready(_now_ms())
                if not ready:
                    due = self._acc.next_due_ms()
                    self._lock.wait(None if due is None else max(0.0, (due - _now_ms()) / 1000))
                    continue
                for batch in ready:
                    self._in_flight[id(batch)] = batch
            for batch in ready:
                try:
                    self._pool.submit(self._send_batch, batch)
                except RuntimeError:        # closed meanwhile: close() ended the batch
                    return

    def _send_batch(self, batch: Batch[str, Pending], chain: bool = True) -> None:
        """Send ``batch`` and then, with ``chain``, each next ready batch of its broker group from this
        thread: the next put goes out as soon as one is answered, before that one's futures are
        resolved (no hand-off to the sender thread between two puts of a busy group)."""
        current: Batch[str, Pending] | None = batch
        started = self._start(batch, caller_waits=not chain)
        while current is not None:
            outcome: tuple[tuple[int, int], ...] | BaseException
            try:
                outcome = send_with_retries(self._transport, current.queue, *started,
                                            self.config.request_timeout_ms / 1000, current.items[0].deadline,
                                            self._tally, self._abort)
            except Exception as exc:  # noqa: BLE001 - every outcome reaches the futures
                outcome = exc
            with self._lock:
                if chain and not self._closed:
                    nxt = self._acc.take_next(current.queue, _now_ms())
                    if nxt is not None:
                        self._in_flight[id(nxt)] = nxt
                else:
                    self._acc.done(current.queue)
                    nxt = None
            if nxt is not None:
                started = self._start(nxt)
            self._finish(current, outcome)
            current = nxt

    def _start(self, batch: Batch[str, Pending],
               caller_waits: bool = False) -> tuple[EncodedBatch, Callable[[], Any] | BaseException | None]:
        """The batch's bytes and its first attempt, sent now when the transport can send without
        waiting (``put_start``); None: the first attempt is a plain ``put`` (or none: the batch's
        deadline passed while it queued). ``caller_waits``: this thread waits for the answer (a
        synchronous send; the transport may let it read it itself)."""
        encoded = EncodedBatch(b"".join(p.record for p in batch.items), len(batch.items))
        with self._lock:
            self._started.add(id(batch))
        left = batch.items[0].deadline - time.monotonic()
        if left <= 0:
            return encoded, None
        try:
            put_start = self._transport.put_start
            timeout_s = min(self.config.request_timeout_ms / 1000, left)
            if caller_waits:
                return encoded, put_start(batch.queue, encoded, timeout_s, caller_waits=True)
            return encoded, put_start(batch.queue, encoded, timeout_s)
        except Exception as exc:  # noqa: BLE001 - raised again by the send loop
            return encoded, exc

    def _finish(self, batch: Batch[str, Pending], outcome: tuple[tuple[int, int], ...] | BaseException) -> None:
        """Resolve the batch's futures (each once: a close that timed out may have ended them) and
        give its bytes back to the buffer."""
        settled = 0
        if isinstance(outcome, BaseException):
            for p in batch.items:
                settled += settle(p.future, None, per_message(outcome, p.msg_id, p.topic))
            self._tally.add("unknown" if isinstance(outcome, SendUnknown) else "failed", settled)
        else:
            for p, (queue_offset, _physical) in zip(batch.items, outcome):
                settled += settle(p.future, send_ok(p.msg_id, p.topic, p.queue_id, -1 if p.delayed else queue_offset),
                                   None)
            self._tally.add("sent", settled)
        with self._lock:
            if self._in_flight.pop(id(batch), None) is not None or settled:
                self._buffered_bytes -= batch.size_bytes
                self._pending_messages -= len(batch.items)
            self._started.discard(id(batch))
            # the sender thread has work only if a batch is open or in flight, flush() waits for the
            # last one, and a full buffer has waiters: a synchronous send of an idle producer wakes nobody
            if self._acc.pending() or self._flush_waiters or self._space_waiters:
                self._lock.notify_all()


def _now_ms() -> int:
    return int(time.monotonic() * 1000)

