"""The broker actor's consumer endpoints: held pulls, offset commits and committed offsets.

A shell over the store and the HA service of one replica, run on the broker actor's event loop.

- **pull** (RocketMQ's pull with a hold): the master answers at once when a confirmed message lies
  at the requested offset, else holds the request until its confirm offset moves past it (the HA
  service's confirm listener answers it in the step that moved the offset: no task, no loop pass
  between the slave's ack and the pull's answer) or the hold runs out. Only the master serves pulls, and
  never beyond its confirm offset (``MessageStore.read_queue``). A pull with a tag expression
  (``rocketray.broker.tag_filter``) reads only the records whose consume-queue tag code it wants
  (``read_queue_filtered``); the entries it passes move its position, which a held pull keeps, so
  the answer's ``next_offset`` is past every unwanted message looked at, also when none matched.
- **commit**: one record of the system topic ``__consumer_offsets`` appended through the master's
  ordinary put (``HAService.put``), so it is acknowledged exactly when a message would be: every
  SyncStateSet member has it (``rocketray.broker.offsets``). An admin's reset is the same with a
  reset record, which the fold applies as an assignment instead of a maximum.
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

from rocketray.wire.batch import EncodedBatch, encode_batch
from rocketray.wire.message import MessageCodecError, decode_record
from rocketray.wire.offset_records import (MAX_COMMITS_PER_RECORD, OFFSETS_QUEUE, OFFSETS_TOPIC, OffsetRecordError,
                                           commit_message, reset_message)
from rocketray.broker.offsets import OffsetTable
from rocketray.wire.pull_result import (OffsetsResult, OffsetsStatus, PullResult, PullStatus, check_pull)
from rocketray.broker.store import MessageStore
from rocketray.broker.store_read import FILTER_SCAN_ENTRIES
from rocketray.broker.tag_filter import TagExpressionError, parse_expression
from rocketray.wire.put_result import PutResult, PutStatus
from rocketray.ha.ack import refused

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


def _ignore(_answer: PullResult) -> None:
    pass


class _HeldPull:
    """One pull: what it asks, where it waits, and whom to answer."""

    __slots__ = ("topic", "queue_id", "offset", "max_count", "max_bytes", "deadline", "done", "timer", "codes")

    def __init__(self, topic: str, queue_id: int, offset: int, max_count: int, max_bytes: int, deadline: float,
                 done: Callable[[PullResult], object], codes: frozenset[int] | None = None) -> None:
        self.topic, self.queue_id, self.offset = topic, queue_id, offset
        self.max_count, self.max_bytes, self.deadline, self.done = max_count, max_bytes, deadline, done
        self.timer: asyncio.TimerHandle | None = None
        self.codes = codes    # the tag codes wanted (None: every message)


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
        self._held: dict[_HeldPull, None] = {}   # held pulls, oldest first
        self._tasks: set[asyncio.Task] = set()    # pulls waiting for a new master to be ready
        self._listening_to: HAPort | None = None
        self._ready_term: int | None = None   # the master epoch whose log was seen confirmed

    # --- held pulls -----------------------------------------------------------------------
    def _listen(self) -> None:
        ha = self._ha()
        if ha is not None and ha is not self._listening_to:
            ha.add_confirm_listener(lambda _offset: self.wake())
            self._listening_to = ha

    def wake(self) -> None:
        """The confirm offset moved: answer, in this step, the held pulls whose queue has an entry
        at or past the offset they wait at (the rest keep waiting: a put wakes the pull of its
        queue, not every held pull of every queue)."""
        for held in list(self._held):
            if self._store.queue_max_offset(held.topic, held.queue_id) > held.offset:
                del self._held[held]
                if held.timer is not None:
                    held.timer.cancel()
                self._serve(held)

    def pull_start(self, topic: str, queue_id: int, queue_offset: int, max_count: int, max_bytes: int,
                   hold_ms: int, group: str | None, done: Callable[[PullResult], object],
                   tag_filter: str | None = None) -> PullResult | None:
        """``pull`` without a task (the client port's path): the answer now (returned), or None and
        ``done(answer)`` later, on this loop: from the step that moves the confirm offset past the
        pull's position (``wake``), or from its hold timer. Only a new master's first pulls of a
        term, which wait until it confirmed the log it took over, run as a task."""
        started = self._begin(topic, queue_id, queue_offset, max_count, max_bytes, hold_ms, group, done, tag_filter)
        return started if isinstance(started, PullResult) else None

    def _begin(self, topic: str, queue_id: int, queue_offset: int, max_count: int, max_bytes: int, hold_ms: int,
               group: str | None, done: Callable[[PullResult], object],
               tag_filter: str | None) -> PullResult | _HeldPull:
        problem = check_pull(queue_offset, max_count, max_bytes, hold_ms)
        codes = None
        if problem is None and tag_filter is not None:
            try:
                wanted = parse_expression(tag_filter)
                codes = None if wanted is None else wanted.codes
            except TagExpressionError as exc:
                problem = f"tag_filter: {exc}"
        if problem is not None:
            return PullResult(PullStatus.ILLEGAL, offset=queue_offset, remark=problem)
        if group is not None and not self._is_master():
            return PullResult(PullStatus.NOT_MASTER, offset=queue_offset, next_offset=queue_offset)
        self._listen()
        loop = asyncio.get_running_loop()
        held = _HeldPull(topic, queue_id, queue_offset, max_count, max_bytes, loop.time() + hold_ms / 1000, done,
                         codes)
        if group is not None and not self._ready_now():
            task = loop.create_task(self._pull_once_ready(held, group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return held
        if group is not None:
            self._from_committed(held, group)
        return self._read_or_hold(held) or held

    async def pull(self, topic: str, queue_id: int, queue_offset: int, max_count: int, max_bytes: int,
                   hold_ms: int, group: str | None = None, tag_filter: str | None = None) -> PullResult:
        """Confirmed messages of a queue from ``queue_offset``, held up to ``hold_ms`` for the first.

        With ``group``, never below that group's committed offset of the queue: a member that
        still reads a queue another member has committed past (a rebalance in flight), or resumes
        from a position older than a commit, is moved up to the commit, so once a commit is
        acknowledged the group never reads below it again. With ``tag_filter`` (a subscription
        expression, ``"a || b"`` or ``"*"``), only the messages tagged so (an invalid one: ILLEGAL)."""
        fut: asyncio.Future[PullResult] = asyncio.get_running_loop().create_future()
        started = self._begin(topic, queue_id, queue_offset, max_count, max_bytes, hold_ms, group,
                              lambda result: fut.done() or fut.set_result(result), tag_filter)
        if isinstance(started, PullResult):
            return started
        try:
            return await fut
        finally:
            self._drop(started)

    def _drop(self, held: _HeldPull) -> None:
        """Forget ``held`` (its caller stopped waiting): nothing answers it any more."""
        self._held.pop(held, None)
        if held.timer is not None:
            held.timer.cancel()
            held.timer = None
        held.done = _ignore

    async def _pull_once_ready(self, held: _HeldPull, group: str) -> None:
        ready = await self._ready()
        if held.done is _ignore:        # its caller stopped waiting (``_drop``): hold nothing for it
            return
        if not ready:
            held.done(PullResult(PullStatus.NOT_MASTER, offset=held.offset, next_offset=held.offset,
                                 remark="new master not ready: its log is not confirmed yet"))
            return
        self._from_committed(held, group)
        self._serve(held)

    def _from_committed(self, held: _HeldPull, group: str) -> None:
        committed = self._fold().committed(group, held.topic, held.queue_id)
        if committed is not None and committed > held.offset:
            held.offset = committed

    def _read_or_hold(self, held: _HeldPull) -> PullResult | None:
        """The answer now, or None with ``held`` waiting (until ``wake`` or its recheck timer)."""
        if not self._is_master():
            return PullResult(PullStatus.NOT_MASTER, offset=held.offset, next_offset=held.offset)
        if held.codes is None:
            records, count, start, max_offset = self._store.read_queue(held.topic, held.queue_id, held.offset,
                                                                       held.max_count, held.max_bytes)
            passed = start + count
        else:
            records, count, start, passed, max_offset = self._store.read_queue_filtered(
                held.topic, held.queue_id, held.offset, held.max_count, held.max_bytes, held.codes)
        if count:
            return PullResult(PullStatus.FOUND, records, count, start, passed, max_offset)
        loop = asyncio.get_running_loop()
        left = held.deadline - loop.time()
        if left <= 0 or passed - start >= FILTER_SCAN_ENTRIES:   # out of time, or more to look at: ask again
            return PullResult(PullStatus.NO_NEW_MSG, b"", 0, start, passed, max_offset)
        held.offset = passed
        held.timer = loop.call_later(min(left, HOLD_RECHECK_S), self._recheck, held)
        self._held[held] = None
        return None

    def _recheck(self, held: _HeldPull) -> None:
        if self._held.pop(held, False) is None:
            self._serve(held)

    def _serve(self, held: _HeldPull) -> None:
        held.timer = None
        answer = self._read_or_hold(held)
        if answer is not None:
            try:
                held.done(answer)
            except Exception:  # noqa: BLE001 - one answer's failure must not stop the others
                log.exception("answering a held pull failed")

    # --- commits ----------------------------------------------------------------------------
    async def commit(self, group: str, entries: list[tuple[str, int, int]], reset: bool = False) -> PutResult:
        """Append ``group``'s ``(topic, queue_id, offset)`` commits as one record and wait for the
        ack policy, like a put. An offset past what the queue holds is refused (MESSAGE_ILLEGAL).
        With ``reset``, a reset record: the offsets are set, lower or not (the admin's reset)."""
        ha = self._ha()
        if ha is None or not self._writable():
            return refused(PutStatus.NOT_MASTER if ha is not None and not self._is_master() else PutStatus.FENCED)
        try:
            entries = [(str(t), int(q), int(o)) for t, q, o in entries]
            for topic, queue_id, offset in entries:
                if offset > self._store.next_queue_offset(topic, queue_id):
                    raise OffsetRecordError(f"offset {offset} of {topic}/{queue_id} is past its end "
                                            f"{self._store.next_queue_offset(topic, queue_id)}")
            batch = encode_batch([(reset_message if reset else commit_message)(group, entries, _now_ms())])
        except (OffsetRecordError, MessageCodecError, TypeError, ValueError) as exc:
            log.info("offset %s refused group=%r: %s", "reset" if reset else "commit", group, exc)
            return refused(PutStatus.MESSAGE_ILLEGAL)
        if reset:
            log.info("offset reset group=%r entries=%s", group, entries)
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

    def _ready_now(self) -> bool:
        """Whether ``_ready`` would answer True at once (confirmed in this master term)."""
        ha = self._ha()
        return ha is not None and ha.epoch == self._ready_term

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

    async def search_offsets(self, queues: list[tuple[str, int]],
                             timestamp_ms: int) -> tuple[tuple[str, int, int], ...]:
        """Per ``(topic, queue_id)``: the first queue offset whose record was stored at or after
        ``timestamp_ms`` (``MessageStore.search_offset``; the queue's end when all are older)."""
        return tuple((t, q, self._store.search_offset(t, q, timestamp_ms)) for t, q in queues)
