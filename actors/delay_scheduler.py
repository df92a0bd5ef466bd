"""The broker actor's delayed-delivery scheduler: puts each due message of this broker group's
``%SCHEDULE%<topic>`` queues into its real queue (``rocketray.broker.schedule`` has the rules).

A shell on the broker actor's event loop, run by every replica and acting only while that replica
is the group's writable master whose log is confirmed (``ConsumerPath.committed`` answers OK only
then): a new master's scheduler starts at its next step, a demoted one's puts and commits are
refused and its steps do nothing. Each step, per schedule queue: read from the scheduler group's
committed offset (the confirmed commit records: what any master before this one committed), put
the due prefix (``plan_queue``) into the real queues through the HA service's put (acknowledged
under the ack policy like a producer's), and, after every put of the step is acknowledged, commit
the new offsets as one record. A put or commit that fails leaves the offset where it was: the next
step (here, or on the next master) puts the same messages again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Protocol

from rocketray.wire.batch import EncodedBatch, encode_batch
from rocketray.wire.message import Message
from rocketray.wire.pull_result import OffsetsResult, OffsetsStatus
from rocketray.wire.delayed import SCHEDULE_PREFIX, SCHEDULER_GROUP, deliver_at_of
from rocketray.broker.schedule import delivered, plan_queue
from rocketray.wire.put_result import PutResult

__all__ = ["DelayScheduler", "STEP_S"]

log = logging.getLogger("rocketray.broker")

#: How often the scheduler looks at its queues (and so how late after its time a message may come).
STEP_S = 0.1
STEP_MESSAGES = 256


class Store(Protocol):
    def queues_of(self, prefix: str) -> list[tuple[str, int]]: ...

    def get_messages(self, topic: str, queue_id: int, queue_offset: int, max_count: int) -> list[Message]: ...


class Offsets(Protocol):
    """``ConsumerPath``'s commit endpoints."""

    async def committed(self, group: str, topics: list[str] | None = None) -> OffsetsResult: ...

    async def commit(self, group: str, entries: list[tuple[str, int, int]]) -> PutResult: ...


class Putter(Protocol):
    async def put(self, batch: EncodedBatch, now_ms: int) -> PutResult: ...


class DelayScheduler:
    """See the module docstring. ``ha()`` is the HA service (None until this replica has an id)."""

    def __init__(self, store: Store, offsets: Offsets, ha: Callable[[], Putter | None],
                 writable: Callable[[], bool], now_ms: Callable[[], int], group: str = "") -> None:
        self._store = store
        self._offsets = offsets
        self._ha = ha
        self._writable = writable
        self._now_ms = now_ms
        self._group = group          # the broker group, for the logs
        self.delivered = 0           # messages put into their real queues (re-puts after a failover too)
        self.undeliverable = 0       # schedule records naming no real queue (no client writes one)

    async def step(self) -> bool:
        """One pass over every schedule queue; True when a queue had more due than one step takes."""
        ha = self._ha()
        if ha is None or not self._writable() or not self._store.queues_of(SCHEDULE_PREFIX):
            return False
        answer = await self._offsets.committed(SCHEDULER_GROUP)
        if answer.status is not OffsetsStatus.OK:
            return False
        committed = {(t, q): o for t, q, o in answer.committed}
        commits: list[tuple[str, int, int]] = []
        more = False
        for topic, queue_id in self._store.queues_of(SCHEDULE_PREFIX):
            start = committed.get((topic, queue_id), 0)
            stored = self._store.get_messages(topic, queue_id, start, STEP_MESSAGES)
            now = self._now_ms()
            plan = plan_queue(start, [(m.queue_offset, deliver_at_of(m.properties)) for m in stored], now)
            if plan.commit_to == start:
                continue
            due = set(plan.due)
            real = [r for r in (delivered(m) for m in stored if m.queue_offset in due) if r is not None]
            self.undeliverable += len(due) - len(real)
            if real:
                result = await ha.put(encode_batch(real), now)
                if not result.ok:
                    log.info("delayed messages not delivered yet group=%s queue=%s/%d status=%s", self._group,
                             topic, queue_id, result.status.name)
                    break
                self.delivered += len(real)
            commits.append((topic, queue_id, plan.commit_to))
            more = more or len(stored) == STEP_MESSAGES and plan.next_due_ms is None
        if commits:
            result = await self._offsets.commit(SCHEDULER_GROUP, commits)
            if not result.ok:      # the next step (or master) puts them again: at least once
                log.info("scheduler offsets not committed group=%s status=%s", self._group, result.status.name)
                return False
        return more

    async def run_forever(self) -> None:
        while True:
            try:
                more = await self.step()
            except Exception:  # noqa: BLE001 - the next step tries again
                log.exception("delayed-delivery step failed group=%s", self._group)
                more = False
            await asyncio.sleep(0 if more else STEP_S)
