"""The delayed-delivery scheduler over a real store and the real consumer endpoints (the HA service
is the store-backed stand-in of its port): a delayed message reaches its real queue at or after its
time, with its msg_id; the scheduler's offset is committed only after the real put is acknowledged,
so a master that fails between the two leaves the message to be put once more, never lost; a
replica that is not master does nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rocketray.actors.consumer_path import ConsumerPath
from rocketray.actors.delay_scheduler import STEP_MESSAGES, DelayScheduler
from rocketray.wire.batch import encode_batch
from rocketray.broker.config import StoreConfig
from rocketray.wire.message import Message
from rocketray.wire.delayed import SCHEDULER_GROUP, plan_delay
from rocketray.broker.store import MessageStore
from rocketray.wire.put_result import PutStatus
from rocketray.ha.ack import refused
from store_fakes import FakeHA

T0 = 1_700_000_000_000


class World:
    """One broker group's master: a real store and consumer endpoints, a clock the test moves."""

    def __init__(self, root: Path) -> None:
        self.store = MessageStore(root, StoreConfig(background_thread=False))
        self.ha = FakeHA(self.store)
        self.master = True
        self.now = T0
        self.offsets = ConsumerPath(self.store, lambda: self.master, lambda: self.master, lambda: self.ha,
                                    ready_timeout_ms=200)

    def scheduler(self, offsets=None) -> DelayScheduler:
        return DelayScheduler(self.store, offsets or self.offsets, lambda: self.ha, lambda: self.master,
                              lambda: self.now)

    def send(self, body: bytes, deliver_at: int, queue_id: int = 2, msg_id: str | None = None) -> None:
        plan = plan_delay("orders", queue_id, deliver_at, self.now)
        props = {"UNIQ_KEY": msg_id or body.decode(), **plan.system_properties}
        asyncio.run(self.ha.put(encode_batch([Message(plan.topic, plan.queue_id, body, props,
                                                      born_timestamp_ms=self.now)]), self.now))

    def real(self, queue_id: int = 2) -> list[Message]:
        return self.store.get_messages("orders", queue_id, 0, 1000)


@pytest.fixture
def world(tmp_path: Path):
    w = World(tmp_path)
    yield w
    w.store.close()


def step(scheduler: DelayScheduler) -> bool:
    return asyncio.run(scheduler.step())


def test_a_delayed_message_reaches_its_queue_at_or_after_its_time_with_its_id(world):
    world.send(b"a", T0 + 1500)
    world.send(b"b", T0 + 900)
    sched = world.scheduler()
    world.now = T0 + 899
    step(sched)
    assert world.real() == []
    world.now = T0 + 900
    step(sched)
    assert [m.body for m in world.real()] == [b"b"]
    world.now = T0 + 1600
    step(sched)
    got = world.real()
    assert [(m.body, m.properties["UNIQ_KEY"]) for m in got] == [(b"b", "b"), (b"a", "a")]
    assert [m.store_timestamp_ms >= int(m.properties["TIMER_DELIVER_MS"]) for m in got] == [True, True]
    step(sched)
    assert len(world.real()) == 2 and sched.delivered == 2, "a committed message is not put again"


def test_a_queue_is_held_at_its_first_message_not_due(world):
    # both wait in the 2 s level: the later, shorter one comes after the first, never before its time
    world.send(b"long", T0 + 2000)
    world.send(b"short", T0 + 1100)
    world.now = T0 + 1500
    step(world.scheduler())
    assert world.real() == []
    world.now = T0 + 2000
    step(world.scheduler())
    assert [m.body for m in world.real()] == [b"long", b"short"]


class LosesCommits:
    """The scheduler's offsets as a master sees them when it fails after its put: commits refused."""

    def __init__(self, offsets: ConsumerPath) -> None:
        self._offsets = offsets

    async def committed(self, group, topics=None):
        return await self._offsets.committed(group, topics)

    async def commit(self, group, entries):
        return refused(PutStatus.NOT_MASTER)


def test_a_failover_between_put_and_commit_puts_the_message_once_more_and_loses_none(world):
    for i in range(3):
        world.send(f"m{i}".encode(), T0 + 1000 + i)
    world.now = T0 + 1001
    step(world.scheduler(LosesCommits(world.offsets)))      # m0, m1 put; the commit is lost with the master
    assert [m.body for m in world.real()] == [b"m0", b"m1"]
    world.now = T0 + 1002
    successor = world.scheduler()                           # the next master: from the committed offset
    step(successor)
    bodies = [m.body for m in world.real()]
    assert bodies == [b"m0", b"m1", b"m0", b"m1", b"m2"], "m0 and m1 again (same msg_id), m2 once"
    assert [m.properties["UNIQ_KEY"] for m in world.real()][2:4] == ["m0", "m1"]
    step(successor)
    assert len(world.real()) == 5
    committed = asyncio.run(world.offsets.committed(SCHEDULER_GROUP)).committed
    assert [(q, o) for _t, q, o in committed] == [(0, 1), (1, 2)], "m0 waits in the 1 s level, m1 and m2 in 2 s"


def test_a_refused_put_commits_nothing_and_the_message_comes_later(world):
    world.send(b"x", T0 + 1000)
    world.now = T0 + 1000
    world.ha.auto_confirm = False                 # the replicas do not acknowledge
    step(world.scheduler())
    assert asyncio.run(world.offsets.committed(SCHEDULER_GROUP)).committed == ()
    world.ha.auto_confirm = True
    world.ha.confirm(world.store.max_offset)
    step(world.scheduler())
    assert [m.body for m in world.real()] == [b"x", b"x"], "put again: the first put was not acknowledged"


def test_a_replica_that_is_not_master_does_nothing(world):
    world.send(b"x", T0 + 1000)
    world.master = False
    world.now = T0 + 5000
    step(world.scheduler())
    assert world.real() == []
    world.master = True
    step(world.scheduler())
    assert [m.body for m in world.real()] == [b"x"]


def test_a_backlog_longer_than_a_step_is_taken_in_steps_in_order(world):
    n = STEP_MESSAGES + 10
    for i in range(n):
        world.send(f"{i:04d}".encode(), T0 + 1000)
    world.now = T0 + 1000
    sched = world.scheduler()
    assert step(sched) is True, "more to do: the loop steps again at once"
    assert step(sched) is False
    assert [m.body for m in world.real()] == [f"{i:04d}".encode() for i in range(n)]
