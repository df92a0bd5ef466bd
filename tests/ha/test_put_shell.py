"""The put shell (``rocketray.ha.put_shell``) over fake ports: a manual clock with armed timers, a
replica port that records its calls, the gate over plain facts, and a real store. Its rules: an
admitted put is written, then answered only from its wait; a refusal writes nothing; one wait timer,
armed for the oldest deadline and again each time it fires; held puts written in arrival order when
the switch succeeds, refused when it fails or outlasts the hold."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from rocketray.wire.batch import encode_batch
from rocketray.wire.message import Message
from rocketray.broker.role import Role
from rocketray.ha.promotion_hold import PromotionHold
from rocketray.ha.put_gate import PutGate
from rocketray.ha.put_shell import PutShell
from rocketray.wire.put_result import PutStatus, Written
from ha_helpers import Roles, open_store


@dataclass
class Replication:
    acked_to: int = -1          # every batch ending at or below is acknowledged

    def put_admitted(self) -> bool:
        return True

    def batch_acked(self, end: int) -> bool:
        return end <= self.acked_to


class Timer:
    def __init__(self, at_ms: int, fn) -> None:
        self.at_ms, self.fn, self.cancelled = at_ms, fn, False

    def cancel(self) -> None:
        self.cancelled = True


class Clock:
    """``Timers``: time moves only by ``advance``, which fires the timers due, in time order."""

    def __init__(self) -> None:
        self.now = 0
        self.timers: list[Timer] = []

    def now_ms(self) -> int:
        return self.now

    def call_at(self, at_ms: int, fn) -> Timer:
        timer = Timer(at_ms, fn)
        self.timers.append(timer)
        return timer

    def armed(self) -> list[int]:
        return sorted(t.at_ms for t in self.timers if not t.cancelled)

    def advance(self, to_ms: int) -> None:
        while True:
            due = sorted((t for t in self.timers if not t.cancelled and t.at_ms <= to_ms), key=lambda t: t.at_ms)
            if not due:
                break
            timer = due[0]
            self.timers.remove(timer)
            self.now = max(self.now, timer.at_ms)
            timer.fn()
        self.now = to_ms


@dataclass
class Replica:
    """``ReplicaPort``: records each append it is told of."""

    up: bool = True
    appended_at: list = field(default_factory=list)
    store: object = None

    def endpoint_up(self) -> bool:
        return self.up

    def appended(self) -> None:
        self.appended_at.append(self.store.max_offset)


@pytest.fixture(autouse=True)
def stores():
    """Every store a test opened, closed after it."""
    opened.clear()
    yield
    for store in opened:
        store.close()


opened: list = []


def shell(tmp_path, timeout_ms: int = 100, hold: PromotionHold | None = None, **facts):
    clock, replica = Clock(), Replica()
    store = open_store(tmp_path / "store")
    opened.append(store)
    replica.store = store
    gate = PutGate(Roles(**facts), Replication(), timeout_ms, hold)  # type: ignore[arg-type]
    return PutShell(gate, store, clock, replica, lambda: 1_000), clock, replica, store


def batch(body: bytes):
    return encode_batch([Message("T", 0, body)])


def test_an_admitted_put_is_written_then_answered_only_from_its_wait(tmp_path):
    s, clock, replica, store = shell(tmp_path)
    answers: list = []
    assert s.put_start(batch(b"a"), 1_000, answers.append) is None
    end = store.max_offset
    assert end > 0 and replica.appended_at == [end] and answers == []    # written, told, not answered
    s.settle()
    assert answers == []                            # not acked, deadline not reached
    s.gate.replication.acked_to = end
    assert s.settle() is True
    assert [(a.status, a.written, a.end_offset) for a in answers] == [(PutStatus.PUT_OK, Written.YES, end)]
    s.settle()
    assert len(answers) == 1                        # answered once


def test_a_refusal_is_answered_at_once_and_writes_nothing(tmp_path):
    s, clock, replica, store = shell(tmp_path, writable=False, role=Role.SLAVE)
    answers: list = []
    refusal = s.put_start(batch(b"a"), 1_000, answers.append)
    assert refusal is not None and refusal.status is PutStatus.NOT_MASTER and refusal.written is Written.NO
    assert store.max_offset == 0 and replica.appended_at == [] and answers == [] and clock.armed() == []
    replica.up = False
    assert s.put_start(batch(b"a"), 1_000, answers.append).status is PutStatus.FENCED


def test_one_wait_timer_armed_for_the_oldest_deadline_and_again_each_time_it_fires(tmp_path):
    s, clock, replica, store = shell(tmp_path, timeout_ms=100)
    answers: list = []
    s.put_start(batch(b"a"), 1_000, lambda r: answers.append(("a", r.status)))
    assert clock.armed() == [100]
    clock.advance(50)
    s.put_start(batch(b"b"), 1_000, lambda r: answers.append(("b", r.status)))
    assert clock.armed() == [100]                   # one timer, for the oldest wait
    clock.advance(100)
    assert answers == [("a", PutStatus.FLUSH_SLAVE_TIMEOUT)] and clock.armed() == [150]   # armed again
    clock.advance(150)
    assert answers[1:] == [("b", PutStatus.FLUSH_SLAVE_TIMEOUT)] and clock.armed() == []
    s.put_start(batch(b"c"), 1_000, lambda r: answers.append(("c", r.status)))
    assert clock.armed() == [250]                   # the next write arms it again
    s.cancel_timers()
    clock.advance(1_000)
    assert [name for name, _ in answers] == ["a", "b"]


def test_held_puts_are_written_in_arrival_order_when_the_switch_succeeds(tmp_path):
    s, clock, replica, store = shell(tmp_path, hold=PromotionHold(max_ms=500), writable=False, promoting=True,
                                     role=Role.SLAVE)
    answers: list = []
    for body in (b"a", b"b"):
        assert s.put_start(batch(body), 1_000, lambda r, body=body: answers.append((body, r)), may_hold=True) is None
    assert store.max_offset == 0 and clock.armed() == [500]    # held; the hold timer for the oldest
    roles = s.gate.roles
    roles.promoting, roles.writable, roles.role = False, True, Role.MASTER
    s.gate.replication.acked_to = 1 << 30
    s.release_held()
    assert [(body, r.status) for body, r in answers] == [(b"a", PutStatus.PUT_OK), (b"b", PutStatus.PUT_OK)]
    assert answers[0][1].end_offset < answers[1][1].end_offset == store.max_offset


def test_held_puts_are_refused_with_nothing_written_when_the_switch_fails_or_outlasts_the_hold(tmp_path):
    s, clock, replica, store = shell(tmp_path, hold=PromotionHold(max_ms=500), writable=False, promoting=True,
                                     role=Role.SLAVE)
    answers: list = []
    s.put_start(batch(b"a"), 1_000, answers.append, may_hold=True)
    s.gate.roles.promoting = False                  # the switch failed: still not writable
    s.release_held()
    assert [(a.status, a.written) for a in answers] == [(PutStatus.NOT_MASTER, Written.NO)] and store.max_offset == 0
    s.gate.roles.promoting = True
    clock.advance(100)
    s.put_start(batch(b"b"), 1_000, answers.append, may_hold=True)
    clock.advance(600)                              # the first hold timer (500) finds nothing due: armed for 600
    assert [(a.status, a.written) for a in answers[1:]] == [(PutStatus.NOT_MASTER, Written.NO)]
    assert store.max_offset == 0 and s.gate.held == 0
