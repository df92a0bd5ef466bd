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

Failures (typed, with ``retriable``): a refused attempt (no master during a failover, not enough
in-sync replicas) is retried with backoff until ``send_timeout_ms``, then :class:`SendFailed`
(nothing was written). An answer saying the batch was written but not acknowledged raises
:class:`SendUnknown` at once and is never resent by the producer, so a message is stored at most
once per send, except when a call was never answered (the master died mid call): that call is
resent, the only case where a message may be stored twice (consumers de-duplicate by ``msg_id``).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import threading
import time
import uuid
from dataclasses import replace
from typing import Any, Callable, Mapping

from rocketray.broker.batch import EncodedBatch, encode_new_record
from rocketray.broker.message import MessageCodecError, encode_properties, topic_bytes
from rocketray.client.config import ClientConfig
from rocketray.client.core import Accumulator, Batch, select_queue
from rocketray.client.errors import ClientClosed, InvalidMessage, InvalidRequest, SendFailed, SendUnknown
from rocketray.client.futures import SendFuture
from rocketray.client.routes import Routes
from rocketray.client.transport import Transport, Unanswered, connect_transport
from rocketray.client.types import SendResult, SendStatus, send_ok
from rocketray.ha.ack import PutResult, PutStatus

__all__ = ["Producer", "RESERVED_PROPERTIES"]

log = logging.getLogger("rocketray.client")

#: Properties the client sets itself (RocketMQ's names): a user property may not use them.
RESERVED_PROPERTIES = frozenset({"KEYS", "TAGS", "UNIQ_KEY"})
BACKOFF_MIN_S = 0.02
BACKOFF_MAX_S = 1.0
#: The first wait after a watch named a new master: that master refuses (NOT_MASTER) only for the
#: moment it takes its role (its notification trails the watch: a role switch of 8-35 ms measured
#: on 2 cores), so it is asked again soon, then at doubling waits up to the usual backoff.
BACKOFF_AFTER_ELECTION_S = 0.002
#: For this long after a watch (or a lookup) named a new master, its NOT_MASTER refusals mean it is
#: still taking its role (or its notification has not reached it yet): it is asked again after
#: BACKOFF_AFTER_ELECTION_S each time, without doubling and without looking the master up again.
#: The replica holds a put that arrives during its switch and answers it when the switch ends
#: (``actors/promotion_hold.py``), so that second attempt is usually the one answered.
PROMOTION_WINDOW_S = 0.2


class _Pending:
    """One queued message (made per ``send_async``: a plain slots class, about a third of a frozen
    dataclass's construction time; never changed after construction)."""

    __slots__ = ("topic", "queue_id", "msg_id", "future", "record")

    def __init__(self, topic: str, queue_id: int, msg_id: str, future: concurrent.futures.Future,
                 record: bytes) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.msg_id = msg_id
        self.future = future
        self.record = record    # the message encoded once, in the commit-log layout, by the sending thread


def new_msg_id_prefix() -> str:
    return uuid.uuid4().hex[:20].upper()


def message_properties(key: str | None, tags: str | None, properties: Mapping[str, str] | None,
                       msg_id: str) -> bytes:
    """The stored properties (RocketMQ's KEYS, TAGS and UNIQ_KEY, then the user's), encoded;
    InvalidMessage if a property is reserved, not a string or holds a separator."""
    if key is None and tags is None and not properties:
        return b"UNIQ_KEY\x01" + msg_id.encode("ascii") + b"\x02"     # msg_id is hex: nothing to check
    props: dict[str, str] = {}
    for name, value in (properties or {}).items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise InvalidMessage(f"properties must map str to str: {name!r}: {value!r}")
        if name in RESERVED_PROPERTIES:
            raise InvalidMessage(f"property {name!r} is reserved (use key=, tags=; msg_id is assigned)")
        props[name] = value
    for reserved, given in (("KEYS", key), ("TAGS", tags)):
        if given is not None:
            if not isinstance(given, str) or not given:
                raise InvalidMessage(f"{reserved.lower()} must be a non-empty str: {given!r}")
            props[reserved] = given
    props["UNIQ_KEY"] = msg_id
    try:
        return encode_properties(props)
    except MessageCodecError as exc:
        raise InvalidMessage(str(exc)) from None


class Producer:
    """Sends messages to topics of the cluster ``cluster`` (see the module docstring).

    Keyword arguments override the cluster's ``client`` configuration (``linger_ms``,
    ``batch_bytes``, ``max_batch_messages``, ``max_message_bytes``, ``send_timeout_ms``,
    ``request_timeout_ms``, ``sender_threads``)."""

    def __init__(self, cluster: str = "default", *, transport: Transport | None = None, **settings: Any) -> None:
        self._owns_transport = transport is None
        self._transport = transport if transport is not None else connect_transport(cluster)
        self.config: ClientConfig = _client_config(self._transport, settings)
        self._routes = Routes(self._transport)
        self._lock = threading.Condition()
        self._acc: Accumulator[str, _Pending] = Accumulator(
            self.config.linger_ms, self.config.batch_bytes, self.config.max_batch_messages)
        self._counter = itertools.count()
        self._id_prefix = new_msg_id_prefix()
        self._ids = itertools.count()
        self._topics: dict[str, bytes] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(self.config.sender_threads,
                                                           thread_name_prefix="rocketray-send")
        self._closed = False
        self._flush_waiters = 0     # threads in flush(), woken when the last send finishes
        self.sender_passes = 0      # the sender thread's passes (woken or timed out)
        self._sender = threading.Thread(target=self._sender_loop, name="rocketray-producer", daemon=True)
        self._sender.start()

    # --- public API -----------------------------------------------------------------------------
    def send(self, topic: str, body: bytes, *, key: str | None = None, tags: str | None = None,
             properties: Mapping[str, str] | None = None) -> SendResult:
        """Send one message and wait until it is acknowledged; raises a :class:`ClientError`.
        When its broker group is idle the calling thread sends it itself (no hand-off to the sender)."""
        queue, pending, size = self._prepare(topic, body, key, tags, properties)
        with self._lock:
            if self._closed:
                raise ClientClosed("producer is closed")
            claimed = self._acc.try_claim(queue)
            if not claimed:
                self._acc.add(queue, pending, size, _now_ms(), urgent=True)
                self._lock.notify_all()
        if claimed:
            self._send_batch(Batch(queue, [pending], [size], size, _now_ms(), True), chain=False)
        return pending.future.result()

    def send_async(self, topic: str, body: bytes, *, key: str | None = None, tags: str | None = None,
                   properties: Mapping[str, str] | None = None) -> concurrent.futures.Future:
        """Queue one message for a batched send; the future gives its :class:`SendResult` or raises.
        Invalid input and unknown topics raise here, at once."""
        return self._enqueue(topic, body, key, tags, properties, urgent=False)

    def flush(self, timeout_s: float | None = None) -> None:
        """Send every queued message now and wait until each send finished (acknowledged or failed)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            self._acc.flush_all()
            self._lock.notify_all()
            self._flush_waiters += 1
            try:
                while self._acc.pending():
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise TimeoutError(f"flush: {self._acc.pending()} sends still pending after {timeout_s} s")
                    self._lock.wait(left)
            finally:
                self._flush_waiters -= 1

    def close(self, timeout_s: float | None = None) -> None:
        """Flush, then stop the background threads. Idempotent."""
        if self._closed:
            return
        try:
            self.flush(timeout_s)
        finally:
            with self._lock:
                self._closed = True
                for batch in self._acc.drain():
                    for p in batch.items:
                        p.future.set_exception(ClientClosed("producer closed before this message was sent"))
                self._lock.notify_all()
            self._pool.shutdown(wait=True)
            if self._owns_transport:
                self._transport.close()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- queueing ---------------------------------------------------------------------------------
    def _enqueue(self, topic: str, body: bytes, key: str | None, tags: str | None,
                 properties: Mapping[str, str] | None, urgent: bool) -> concurrent.futures.Future:
        queue, pending, size = self._prepare(topic, body, key, tags, properties)
        with self._lock:
            if self._closed:
                raise ClientClosed("producer is closed")
            if self._acc.add(queue, pending, size, _now_ms(), urgent):
                self._lock.notify_all()
        return pending.future

    def _prepare(self, topic: str, body: bytes, key: str | None, tags: str | None,
                 properties: Mapping[str, str] | None) -> tuple[str, _Pending, int]:
        """The broker group of the message's queue (what batches are keyed by), its pending entry and
        its accounted size (raises on bad input)."""
        if self._closed:
            raise ClientClosed("producer is closed")
        route = self._routes.get(topic)
        if not isinstance(body, bytes):
            if not isinstance(body, (bytearray, memoryview)):
                raise InvalidMessage(f"a message body must be bytes, not {type(body).__name__}")
            body = bytes(body)
        queue_id = select_queue(key, len(route.queues), next(self._counter))
        msg_id = f"{self._id_prefix}{next(self._ids):012X}"
        props = message_properties(key, tags, properties, msg_id)
        size = len(body) + len(props)
        if size > self.config.max_message_bytes:
            raise InvalidMessage(f"message of {size} bytes is over max_message_bytes {self.config.max_message_bytes}")
        try:
            record = encode_new_record(self._topic_bytes(topic), props, body, queue_id, int(time.time() * 1000))
        except MessageCodecError as exc:
            raise InvalidMessage(str(exc)) from None
        future: concurrent.futures.Future = SendFuture()
        return route.group_of(queue_id), _Pending(topic, queue_id, msg_id, future, record), len(record)

    def _topic_bytes(self, topic: str) -> bytes:
        encoded = self._topics.get(topic)
        if encoded is None:
            encoded = self._topics[topic] = topic_bytes(topic)
        return encoded

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
                self._pool.submit(self._send_batch, batch)

    def _send_batch(self, batch: Batch[str, _Pending], chain: bool = True) -> None:
        """Send ``batch`` and then, with ``chain``, each next ready batch of its broker group from this
        thread: the next put goes out as soon as one is answered, before that one's futures are
        resolved (no hand-off to the sender thread between two puts of a busy group)."""
        current: Batch[str, _Pending] | None = batch
        started = self._start(batch, caller_waits=not chain)
        while current is not None:
            outcome: tuple[tuple[int, int], ...] | BaseException
            try:
                outcome = self._send_with_retries(current.queue, *started)
            except Exception as exc:  # noqa: BLE001 - every outcome reaches the futures
                outcome = exc
            with self._lock:
                if chain:
                    nxt = self._acc.take_next(current.queue, _now_ms())
                else:
                    self._acc.done(current.queue)
                    nxt = None
                # the sender thread has work only if a batch is open or in flight, and flush()
                # waits for the last one: a synchronous send of an idle producer wakes nobody
                if self._acc.pending() or self._flush_waiters:
                    self._lock.notify_all()
            if nxt is not None:
                started = self._start(nxt)
            _resolve(current, outcome)
            current = nxt

    def _start(self, batch: Batch[str, _Pending],
               caller_waits: bool = False) -> tuple[EncodedBatch, Callable[[], Any] | BaseException | None]:
        """The batch's bytes and its first attempt, sent now when the transport can send without
        waiting (``put_start``); None: the first attempt is a plain ``put``. ``caller_waits``: this
        thread waits for the answer (a synchronous send; the transport may let it read it itself)."""
        encoded = EncodedBatch(b"".join(p.record for p in batch.items), len(batch.items))
        put_start = getattr(self._transport, "put_start", None)
        if put_start is None:
            return encoded, None
        try:
            timeout_s = self.config.request_timeout_ms / 1000
            if caller_waits:
                return encoded, put_start(batch.queue, encoded, timeout_s, caller_waits=True)
            return encoded, put_start(batch.queue, encoded, timeout_s)
        except Exception as exc:  # noqa: BLE001 - raised again by the send loop
            return encoded, exc

    def _send_with_retries(self, group: str, encoded: EncodedBatch,
                           first: Callable[[], Any] | BaseException | None = None) -> tuple[tuple[int, int], ...]:
        """Put one batch (messages of ``group``'s queues) until acknowledged; returns its
        (queue_offset, physical_offset) pairs in batch order. ``first``: the first attempt, already
        sent (``_start``)."""
        if isinstance(first, BaseException):
            raise first
        timeout_s = self.config.request_timeout_ms / 1000
        deadline = time.monotonic() + self.config.send_timeout_ms / 1000
        backoff_s, maybe_written, last = BACKOFF_MIN_S, False, "no attempt"
        elected_at = -PROMOTION_WINDOW_S     # when a watch last named a new master (monotonic s)
        # ... or a lookup did (a transport that knows: the master an attempt found may be one the
        # controller just elected, whose notification has not reached it yet)
        named_at: Callable[[str], float] = getattr(self._transport, "named_at", lambda g: float("-inf"))
        while time.monotonic() < deadline:
            reply = first() if first is not None else self._transport.put(group, encoded, timeout_s)
            first = None
            promoting = False
            if isinstance(reply, PutResult):
                if reply.ok:
                    if len(reply.offsets) != encoded.count:   # a broker answer that does not match the batch
                        raise SendUnknown(f"{group} acknowledged {len(reply.offsets)} offsets for "
                                          f"{encoded.count} messages", "")
                    return reply.offsets
                last = reply.status.name
                if reply.status is PutStatus.MESSAGE_ILLEGAL:
                    raise InvalidMessage(f"the broker refused the batch as malformed or oversized ({last})")
                if not reply.retriable:
                    status = SendStatus.FLUSH_SLAVE_TIMEOUT if reply.status is PutStatus.FLUSH_SLAVE_TIMEOUT else None
                    raise SendUnknown(f"written to {group} but not acknowledged ({last}); not resent", "", status)
                promoting = (reply.status is PutStatus.NOT_MASTER
                             and time.monotonic() - max(elected_at, named_at(group)) < PROMOTION_WINDOW_S)
            else:
                maybe_written, last = True, reply.error
                if reply.master_moved:
                    continue  # the watch named the new master: send there at once
            if promoting:
                backoff_s = BACKOFF_AFTER_ELECTION_S
            else:
                self._transport.forget_master(group)
            if self._transport.await_new_master(group, backoff_s):   # an election ends the wait
                # and the backoff: the new master may refuse for the moment it takes its role (its
                # notification trails the watch), so the next wait is the shortest, not the doubled
                # wait of the outage before (issue 29: 320 ms lost after a leader-lost node loss),
                # nor a whole BACKOFF_MIN_S when the switch takes a few ms (issue 27)
                backoff_s, elected_at = BACKOFF_AFTER_ELECTION_S, time.monotonic()
            elif not promoting:
                backoff_s = min(backoff_s * 2, BACKOFF_MAX_S)
        if maybe_written:
            raise SendUnknown(f"no answer from {group}'s master before the send timeout ({last})", "")
        raise SendFailed(f"every attempt to send to {group} was refused before writing ({last})")


def _resolve(batch: Batch[str, _Pending], outcome: tuple[tuple[int, int], ...] | BaseException) -> None:
    if isinstance(outcome, BaseException):
        for p in batch.items:
            p.future.set_exception(_per_message(outcome, p.msg_id))
        return
    for p, (queue_offset, _physical) in zip(batch.items, outcome):
        p.future.set_result(send_ok(p.msg_id, p.topic, p.queue_id, queue_offset))


def _per_message(exc: BaseException, msg_id: str) -> BaseException:
    if isinstance(exc, SendUnknown):
        return SendUnknown(str(exc), msg_id, exc.status)
    return exc


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def _client_config(transport: Transport, settings: dict[str, Any]) -> ClientConfig:
    try:
        base = transport.config().client
    except Exception:  # noqa: BLE001 - a transport without the cluster's config: the defaults
        base = ClientConfig()
    unknown = set(settings) - set(ClientConfig.__dataclass_fields__)
    if unknown:
        raise InvalidRequest(f"unknown client setting(s): {', '.join(sorted(unknown))}")
    return replace(base, **settings)
