"""The client's pure rules: queue selection, rebalance, send batching and the commit position.

Theory of operation. Nothing here does IO or reads a clock: the producer and consumer shells pass
``now_ms`` and act on what these return.

- **Queue selection** (:func:`select_queue`): a message with a key goes to ``crc32(key) mod N``, so
  every message of one key lands in one queue and stays ordered; without a key, round robin.
- **Rebalance** (:func:`allocate_averagely`): RocketMQ's AllocateMessageQueueAveragely. Every member
  of a group computes the same split from the same sorted member list, so each queue has exactly
  one owner once the members agree on the list; members beyond the number of queues get none.
- **Batching** (:class:`Accumulator`): Kafka's producer batching, by key (the producer keys by
  broker group, as Kafka sends one request per broker). ``send_async`` appends to its key's open
  batch; a batch is ready when it holds ``batch_bytes`` or ``max_batch_count``, when its first message
  waited ``linger_ms``, or when someone waits for it (``flush``, a synchronous ``send``). At most one
  batch per key is in flight, so the messages of every queue behind a key are stored in send order.
- **Positions** (:class:`Positions`): what ``commit`` commits is, per queue, one past the last
  message ``poll`` returned (or where a ``seek`` moved it since); a queue's commit is pending until
  acknowledged.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Generic, Hashable, Sequence, TypeVar

__all__ = ["select_queue", "key_queue", "allocate_averagely", "Accumulator", "Batch", "Positions"]

Q = TypeVar("Q", bound=Hashable)
T = TypeVar("T")


def key_queue(key: str, queues: int) -> int:
    """The queue every message with ``key`` goes to (stable across processes and restarts)."""
    assert queues > 0
    return zlib.crc32(key.encode("utf-8")) % queues


def select_queue(key: str | None, queues: int, counter: int) -> int:
    """``key``'s queue, or round robin by ``counter`` (the caller's running send count)."""
    assert queues > 0
    return key_queue(key, queues) if key is not None else counter % queues


def allocate_averagely(queues: Sequence[Q], members: Sequence[str], me: str) -> list[Q]:
    """The queues ``me`` owns among ``members`` (RocketMQ's AllocateMessageQueueAveragely): sorted
    members take contiguous, near-equal slices of ``queues`` in order; a non-member owns nothing."""
    ordered = sorted(set(members))
    if me not in ordered or not queues:
        return []
    n, m, index = len(queues), len(ordered), ordered.index(me)
    mod = n % m
    if n <= m:
        size = 1
    else:
        size = n // m + 1 if mod > 0 and index < mod else n // m
    start = index * size if mod > 0 and index < mod else index * size + mod
    return [queues[(start + i) % n] for i in range(max(0, min(size, n - start)))]


@dataclass(slots=True)
class Batch(Generic[Q, T]):
    queue: Q
    items: list[T] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    size_bytes: int = 0
    first_ms: int = 0
    urgent: bool = False


class Accumulator(Generic[Q, T]):
    """Open batches per queue (see the module docstring). Not thread-safe: the shell holds a lock."""

    def __init__(self, linger_ms: int, batch_bytes: int, max_batch_count: int) -> None:
        assert linger_ms >= 0 and batch_bytes > 0 and max_batch_count > 0
        self.linger_ms = linger_ms
        self.batch_bytes = batch_bytes
        self.max_batch_count = max_batch_count
        self._open: dict[Q, Batch[Q, T]] = {}
        self._in_flight: set[Q] = set()

    def add(self, queue: Q, item: T, size_bytes: int, now_ms: int, urgent: bool = False) -> bool:
        """Append to ``queue``'s open batch; True when the sender has something new to look at (the
        queue has nothing in flight, so the batch may be ready now or has a new linger deadline).
        While a batch is in flight its ``done`` is the next event, so no wake-up is needed."""
        batch = self._open.get(queue)
        if batch is None:
            batch = self._open[queue] = Batch(queue, first_ms=now_ms)
        batch.items.append(item)
        batch.sizes.append(size_bytes)
        batch.size_bytes += size_bytes
        batch.urgent = batch.urgent or urgent
        return queue not in self._in_flight

    def try_claim(self, queue: Q) -> bool:
        """Mark an idle queue (nothing open, nothing in flight) in flight for a batch the caller sends
        itself (a synchronous send skips the sender thread); False if the queue is busy."""
        if queue in self._open or queue in self._in_flight:
            return False
        self._in_flight.add(queue)
        return True

    def flush_all(self) -> None:
        """Make every open batch ready now (``Producer.flush``)."""
        for batch in self._open.values():
            batch.urgent = True

    def _ready(self, batch: Batch[Q, T], now_ms: int) -> bool:
        return (batch.urgent or batch.size_bytes >= self.batch_bytes or len(batch.items) >= self.max_batch_count
                or now_ms - batch.first_ms >= self.linger_ms)

    def take_ready(self, now_ms: int) -> list[Batch[Q, T]]:
        """Ready batches of queues with nothing in flight, now marked in flight. A batch over the
        byte or count bound is split: what fits is taken, the rest stays open (still urgent)."""
        out = []
        for queue in list(self._open):
            if queue not in self._in_flight:
                batch = self._take(queue, now_ms)
                if batch is not None:
                    out.append(batch)
        return out

    def take_next(self, queue: Q, now_ms: int) -> Batch[Q, T] | None:
        """``queue``'s batch in flight finished: its next batch if one is ready (then in flight, for
        the caller to send at once), else None (the queue is idle)."""
        self._in_flight.discard(queue)
        return self._take(queue, now_ms) if queue in self._open else None

    def _take(self, queue: Q, now_ms: int) -> Batch[Q, T] | None:
        batch = self._open[queue]
        if not self._ready(batch, now_ms):
            return None
        take, size = self._fitting(batch)
        if take == len(batch.items):
            del self._open[queue]
            out = batch
        else:
            out = Batch(queue, batch.items[:take], batch.sizes[:take], size, batch.first_ms, batch.urgent)
            del batch.items[:take]
            del batch.sizes[:take]
            batch.size_bytes -= size
            batch.urgent = True  # the rest was due too
        self._in_flight.add(queue)
        return out

    def _fitting(self, batch: Batch[Q, T]) -> tuple[int, int]:
        """How many of the batch's first items fit the bounds (at least one), and their bytes."""
        take, size = 0, 0
        for item_size in batch.sizes[: self.max_batch_count]:
            if take and size + item_size > self.batch_bytes:
                break
            take, size = take + 1, size + item_size
        return take, size

    def done(self, queue: Q) -> None:
        """The queue's batch in flight finished (acknowledged or not)."""
        self._in_flight.discard(queue)

    def next_due_ms(self) -> int | None:
        """When the earliest open batch of an idle queue becomes ready by linger (None: none open)."""
        due = [b.first_ms + self.linger_ms for q, b in self._open.items() if q not in self._in_flight]
        return min(due) if due else None

    def pending(self) -> int:
        return sum(len(b.items) for b in self._open.values()) + len(self._in_flight)

    def drain(self) -> list[Batch[Q, T]]:
        """Every open batch, removed (closing: the shell fails them)."""
        out, self._open = list(self._open.values()), {}
        return out


class Positions(Generic[Q]):
    """Per queue: the offset ``commit`` would commit (one past the last message ``poll`` returned,
    or where a ``seek`` moved the queue since) and the offset last acknowledged as committed.

    A **hold** keeps ``commit`` at or below one message's offset while that message is not safe
    elsewhere: ``Consumer.nack`` holds it from before its copy is published until the copy is
    acknowledged, and a nack that failed leaves it held, so no commit passes a message whose copy
    is not stored (a crash then delivers it again from its own queue)."""

    def __init__(self) -> None:
        self.polled: dict[Q, int] = {}
        self.committed: dict[Q, int] = {}
        self.holds: dict[Q, set[int]] = {}

    def returned(self, key: Q, next_offset: int) -> None:
        """``poll`` returned the queue's messages up to ``next_offset`` (exclusive)."""
        if next_offset > self.polled.get(key, -1):
            self.polled[key] = next_offset

    def sought(self, key: Q, offset: int) -> None:
        """The application moved the queue to ``offset`` (either way): its holds go (the
        application chose what is read and committed next)."""
        self.polled[key] = offset
        self.holds.pop(key, None)

    def hold(self, key: Q, offset: int) -> None:
        """Commit nothing of ``key`` past ``offset`` (the message there) until :meth:`release`
        (holding an offset twice holds it once: a nack retried after a failure releases it)."""
        self.holds.setdefault(key, set()).add(offset)

    def release(self, key: Q, offset: int) -> None:
        held = self.holds.get(key)
        if held is not None:
            held.discard(offset)
            if not held:
                del self.holds[key]

    def to_commit(self) -> dict[Q, int]:
        """Queues whose polled position, capped at their lowest hold, is past what was acknowledged."""
        out = {}
        for key, offset in self.polled.items():
            held = self.holds.get(key)
            if held:
                offset = min(offset, min(held))
            if offset > self.committed.get(key, -1):
                out[key] = offset
        return out

    def acknowledged(self, key: Q, offset: int) -> None:
        if offset > self.committed.get(key, -1):
            self.committed[key] = offset

    def forget(self, key: Q) -> None:
        self.polled.pop(key, None)
        self.committed.pop(key, None)
        self.holds.pop(key, None)
