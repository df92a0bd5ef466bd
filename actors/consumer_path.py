"""The broker actor's consumer endpoints: held pulls, offset commits and committed offsets.

A shell over the store and the HA service of one replica, run on the broker actor's event loop.

- **pull** (RocketMQ's pull with a hold): the master answers at once when a confirmed message lies
  at the requested offset, else holds the request until its confirm offset moves (the HA service's
  confirm listener wakes every held pull) or the hold runs out. Only the master serves pulls, and
  never beyond its confirm offset (``MessageStore.read_queue``).
- **commit**: one record of the system topic ``__consumer_offsets`` appended through the master's
  ordinary put (``HAService.put``), so it is acknowledged exactly when a message would be: every
  SyncStateSet member has it (``rocketray.broker.offsets``).
- **committed**: the group's offsets folded from the *confirmed* system-queue records of this
  replica's log. A master first waits until its confirm offset reaches the log end it had when
  asked: a new master holds every acknowledged commit in its log, but may not have confirmed it yet,
  and answering from less would move a group back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Protocol

from rocketray.broker.batch import EncodedBatch, encode_batch
from rocketray.broker.message import MessageCodecError, decode_record
from rocketray.broker.offsets import (MAX_COMMITS_PER_RECORD, OFFSETS_QUEUE, OFFSETS_TOPIC, OffsetRecordError,
                                      OffsetTable, commit_message)
from rocketray.broker.pull import (OffsetsResult, OffsetsStatus, PullResult, PullStatus, check_pull)
from rocketray.broker.store import MessageStore
from rocketray.ha.ack import PutResult, PutStatus, refused

log = logging.getLogger("rocketray.broker")

FOLD_BATCH = 1024
FOLD_BYTES = 4 << 20
#: A held pull also looks again this often, in case a confirm-offset move was not signalled.
HOLD_RECHECK_S = 0.25
READY_POLL_S = 0.005


def _now_ms() -> int:
    return int(time.time() * 1000)


class HAPort(Protocol):
    """What the consumer endpoints need of the HA service (``rocketray.ha.service.HAService``)."""

    epoch: int

    def add_confirm_listener(self, cb: Callable[[int], object]) -> None: ...

    async def put(self, batch: EncodedBatch, now_ms: int) -> PutResult: ...


class ConsumerPath:
    """Pull, commit and committed offsets of one replica (see the module docstring).

    ``is_master()`` says whether this replica is the group's running master, ``writable()`` whether
    it may write (unfenced), ``ha()`` the HA service (None until the broker has an id)."""

    def __init__(self, store: MessageStore, is_master: Callable[[], bool], writable: Callable[[], bool],
                 ha: Callable[[], HAPort | None], ready_timeout_ms: int = 3000) -> None:
        self._store = store
        self._is_master = is_master
        self._writable = writable
        self._ha = ha
        self._ready_timeout_ms = ready_timeout_ms
        self._table = OffsetTable()
        self._waiters: dict[asyncio.Future, tuple[str, int, int]] = {}   # held pull -> (topic, queue id, offset)
        self._listening_to: HAPort | None = None
        self._ready_term: int | None = None   # the master epoch whose log was seen confirmed

    # --- held pulls -----------------------------------------------------------------------
    def _listen(self) -> None:
        ha = self._ha()
        if ha is not None and ha is not self._listening_to:
            ha.add_confirm_listener(lambda _offset: self.wake())
            self._listening_to = ha

    def wake(self) -> None:
        """The confirm offset moved: wake the held pulls whose queue has an entry at or past the
        offset they wait at (the rest keep waiting: a put wakes the pull of its queue, not every
        held pull of every queue)."""
        for fut, (topic, queue_id, offset) in list(self._waiters.items()):
            if self._store.queue_max_offset(topic, queue_id) > offset:
                del self._waiters[fut]
                if not fut.done():
                    fut.set_result(None)

    async def pull(self, topic: str, queue_id: int, queue_offset: int, max_count: int, max_bytes: int,
                   hold_ms: int, group: str | None = None) -> PullResult:
        """Confirmed messages of a queue from ``queue_offset``, held up to ``hold_ms`` for the first.

        With ``group``, never below that group's committed offset of the queue: a member that
        still reads a queue another member has committed past (a rebalance in flight), or resumes
        from a position older than a commit, is moved up to the commit, so once a commit is
        acknowledged the group never reads below it again."""
        problem = check_pull(queue_offset, max_count, max_bytes, hold_ms)
        if problem is not None:
            return PullResult(PullStatus.ILLEGAL, offset=queue_offset, remark=problem)
        self._listen()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + hold_ms / 1000
        if group is not None:
            if not self._is_master():
                return PullResult(PullStatus.NOT_MASTER, offset=queue_offset, next_offset=queue_offset)
            if not await self._ready():
                return PullResult(PullStatus.NOT_MASTER, offset=queue_offset, next_offset=queue_offset,
                                  remark="new master not ready: its log is not confirmed yet")
            committed = self._fold().committed(group, topic, queue_id)
            if committed is not None and committed > queue_offset:
                queue_offset = committed
        while True:
            if not self._is_master():
                return PullResult(PullStatus.NOT_MASTER, offset=queue_offset, next_offset=queue_offset)
            records, count, start, max_offset = self._store.read_queue(topic, queue_id, queue_offset,
                                                                       max_count, max_bytes)
            if count:
                return PullResult(PullStatus.FOUND, records, count, start, start + count, max_offset)
            left = deadline - loop.time()
            if left <= 0:
                return PullResult(PullStatus.NO_NEW_MSG, b"", 0, start, start, max_offset)
            fut = loop.create_future()
            self._waiters[fut] = (topic, queue_id, start)
            try:
                await asyncio.wait([fut], timeout=min(left, HOLD_RECHECK_S))
            finally:
                self._waiters.pop(fut, None)

    # --- commits ----------------------------------------------------------------------------
    async def commit(self, group: str, entries: list[tuple[str, int, int]]) -> PutResult:
        """Append ``group``'s ``(topic, queue_id, offset)`` commits as one record and wait for the
        ack policy, like a put. An offset past what the queue holds is refused (MESSAGE_ILLEGAL)."""
        ha = self._ha()
        if ha is None or not self._writable():
            return refused(PutStatus.NOT_MASTER if ha is not None and not self._is_master() else PutStatus.FENCED)
        try:
            entries = [(str(t), int(q), int(o)) for t, q, o in entries]
            for topic, queue_id, offset in entries:
                if offset > self._store.next_queue_offset(topic, queue_id):
                    raise OffsetRecordError(f"offset {offset} of {topic}/{queue_id} is past its end "
                                            f"{self._store.next_queue_offset(topic, queue_id)}")
            batch = encode_batch([commit_message(group, entries, _now_ms())])
        except (OffsetRecordError, MessageCodecError, TypeError, ValueError) as exc:
            log.info("offset commit refused group=%r: %s", group, exc)
            return refused(PutStatus.MESSAGE_ILLEGAL)
        return await ha.put(batch, _now_ms())

    # --- committed offsets --------------------------------------------------------------------
    def _fold(self) -> OffsetTable:
        """Fold the confirmed commit records not folded yet (all of them again if the system queue
        is shorter than what was folded, which only a truncation of confirmed data could cause)."""
        store = self._store
        if store.queue_max_offset(OFFSETS_TOPIC, OFFSETS_QUEUE) < self._table.position:
            log.warning("offset table rebuilt: the system queue is shorter than what was folded")
            self._table = OffsetTable()
        while True:
            records, count, start, _ = store.read_queue(OFFSETS_TOPIC, OFFSETS_QUEUE, self._table.position,
                                                        FOLD_BATCH, FOLD_BYTES)
            if count == 0:
                return self._table
            self._table.position = max(self._table.position, start)  # retention may have moved it
            pos = 0
            for _ in range(count):
                msg, size = decode_record(records, pos)
                self._table.fold(msg.queue_offset, msg.body, msg.store_timestamp_ms)
                pos += size

    async def _ready(self) -> bool:
        """Whether this master has confirmed the log it had when it took the role (every commit
        acknowledged before the failover is then in the folded table). Waits up to the ready timeout
        the first time in a master term; answered from memory afterwards."""
        ha = self._ha()
        term = None if ha is None else ha.epoch
        if term is not None and term == self._ready_term:
            return True
        target = self._store.max_offset
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._ready_timeout_ms / 1000
        while self._store.confirm_offset < target:
            if loop.time() >= deadline or not self._is_master():
                return False
            await asyncio.sleep(READY_POLL_S)
        self._ready_term = term
        return True

    async def committed(self, group: str, topics: list[str] | None = None) -> OffsetsResult:
        """``group``'s committed offsets here (and the max offsets of those queues), from the master."""
        if not isinstance(group, str) or not group:
            return OffsetsResult(OffsetsStatus.ILLEGAL, remark="a consumer group name is required")
        if not self._is_master():
            return OffsetsResult(OffsetsStatus.NOT_MASTER)
        if not await self._ready():
            return OffsetsResult(OffsetsStatus.NOT_READY, remark="new master: its log is not confirmed yet")
        table = self._fold()
        wanted = None if topics is None else set(topics)
        committed = tuple(sorted((t, q, o) for (t, q), o in table.of_group(group).items()
                                 if wanted is None or t in wanted))
        maxes = tuple((t, q, self._store.queue_max_offset(t, q)) for t, q, _ in committed)
        return OffsetsResult(OffsetsStatus.OK, committed, maxes)

    async def refresh_idle_groups(self, max_age_ms: int) -> list[str]:
        """As master, append again the offsets of every group whose newest commit record is older
        than ``max_age_ms`` (half the retention), so retention never deletes a group's only record of
        its offsets. Returns the groups refreshed (acknowledged)."""
        if not self._writable() or not await self._ready():
            return []
        table = self._fold()
        refreshed = []
        for group in table.stale_groups(_now_ms(), max_age_ms):
            entries = [(t, q, o) for (t, q), o in sorted(table.of_group(group).items())]
            ok = True
            for start in range(0, len(entries), MAX_COMMITS_PER_RECORD):
                result = await self.commit(group, entries[start:start + MAX_COMMITS_PER_RECORD])
                ok = ok and result.ok
            if ok:
                refreshed.append(group)
        return refreshed

    async def queue_max_offsets(self, queues: list[tuple[str, int]]) -> tuple[tuple[str, int, int], ...]:
        """One past the last confirmed entry of each ``(topic, queue_id)`` on this replica."""
        return tuple((t, q, self._store.queue_max_offset(t, q)) for t, q in queues)
