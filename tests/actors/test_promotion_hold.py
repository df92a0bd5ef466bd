"""Puts that reach a replica while it becomes master are held and answered when its switch ends.

``PromotionHold`` alone (tables), then ``BrokerService.put_start`` with it: the service's manager
and HA service are small stand-ins (this tests the shell's gating of puts, one layer), the hold
and the put path are the real ones."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from rocketray.actors.broker_service import BrokerService
from rocketray.actors.promotion_hold import PromotionHold
from rocketray.broker.batch import EncodedBatch
from rocketray.ha.ack import PutResult, PutStatus, Written


# ------------------------------------------------------------------------------ the hold alone


def test_release_hands_back_everything_in_arrival_order():
    h: PromotionHold[str] = PromotionHold(max_puts=10, max_bytes=100, max_ms=50)
    assert h.hold("a", 10, 0) and h.hold("b", 20, 5)
    assert (len(h), h.held_bytes, h.next_expiry_ms()) == (2, 30, 50)
    assert h.release() == ["a", "b"]
    assert (len(h), h.held_bytes, h.next_expiry_ms(), h.release()) == (0, 0, None, [])


@pytest.mark.parametrize("held, size, ok", [
    ((), 100, True),               # exactly the byte bound
    ((), 101, False),              # over it
    ((10, 10), 10, False),         # the count bound (2)
    ((90,), 10, True),
    ((90,), 11, False),
])
def test_bounds_refuse_and_hold_nothing(held, size, ok):
    h: PromotionHold[int] = PromotionHold(max_puts=2, max_bytes=100, max_ms=50)
    for i, s in enumerate(held):
        assert h.hold(i, s, 0)
    before = (len(h), h.held_bytes)
    assert h.hold(99, size, 0) is ok
    assert (len(h), h.held_bytes) == ((before[0] + 1, before[1] + size) if ok else before)


def test_expired_takes_only_items_held_max_ms_or_longer():
    h: PromotionHold[str] = PromotionHold(max_puts=10, max_bytes=100, max_ms=50)
    h.hold("a", 1, 0)
    h.hold("b", 2, 30)
    assert h.expired(49) == []
    assert h.expired(50) == ["a"] and h.next_expiry_ms() == 80 and h.held_bytes == 2
    assert h.expired(200) == ["b"] and h.expired_total == 2 and h.held_total == 2


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError):
        PromotionHold(max_ms=0)


# ------------------------------------------------------------------------------ the broker's put path


OK = PutResult(PutStatus.PUT_OK, Written.YES, ((0, 0),), 10)


class Manager:
    """The role state ``put_start`` reads, set by the test."""

    def __init__(self) -> None:
        self.broker_id = 2
        self.fenced = False
        self.writable = False
        self.promoting = False
        self.settled = lambda: None

    def switch_ends(self, ok: bool) -> None:
        self.promoting, self.writable = False, ok
        self.settled()


class HA:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def put_start(self, batch, now, done):
        self.written.append(batch.data)
        done(OK)
        return None


class Metrics:
    def put(self, *args) -> None:
        pass


def service(max_ms: int = 1000) -> tuple[BrokerService, Manager, HA]:
    s = object.__new__(BrokerService)
    manager, ha = Manager(), HA()
    s.manager, s.ha, s._metrics = manager, ha, Metrics()
    s._group, s._replica = "g", 1
    s._hold, s._hold_timer = PromotionHold(max_ms=max_ms), None
    manager.settled = s._answer_held
    return s, manager, ha


def put(s: BrokerService, data: bytes, answers: list) -> PutResult | None:
    return s.put_start(EncodedBatch(data, 1), lambda result: answers.append((data, result)))


def held(*datas: bytes, max_ms: int = 1000) -> tuple[BrokerService, Manager, HA, list]:
    """A service whose replica is promoting, with a put of each of ``datas`` sent to it."""
    s, manager, ha = service(max_ms)
    manager.promoting = True
    answers: list = []
    for data in datas:
        put(s, data, answers)
    return s, manager, ha, answers


def promotion(s: BrokerService, manager: Manager, ha: HA) -> list:
    """Two puts while the replica is promoting, then its switch succeeds: (data, status, broker id)
    of the answers, in the order they came."""
    manager.promoting = True
    answers: list = []
    for data in (b"a", b"b"):
        refusal = put(s, data, answers)
        if refusal is not None:
            answers.append((data, refusal))
    manager.switch_ends(ok=True)
    return [(d, r.status, r.broker_id) for d, r in answers]


def test_a_put_during_the_promotion_is_written_when_the_switch_succeeds():
    async def go():
        s, manager, ha = service()
        assert promotion(s, manager, ha) == [(b"a", PutStatus.PUT_OK, 2), (b"b", PutStatus.PUT_OK, 2)]
        assert ha.written == [b"a", b"b"] and s._hold.held_total == 2
    asyncio.run(go())


def test_the_old_rule_refuses_during_the_promotion_and_the_test_sees_it(monkeypatch):
    """The rule before: not writable means NOT_MASTER, promoting or not (no hold)."""
    async def go():
        s, manager, ha = service()
        monkeypatch.setattr(s._hold, "hold", lambda *a: False)
        assert promotion(s, manager, ha) == [(b"a", PutStatus.NOT_MASTER, 2), (b"b", PutStatus.NOT_MASTER, 2)]
        assert ha.written == []
    asyncio.run(go())


def test_a_put_during_a_failed_promotion_is_refused_with_nothing_written():
    async def go():
        s, manager, ha, answers = held(b"a")
        manager.switch_ends(ok=False)
        assert ha.written == []
        assert [(r.status, r.written) for _d, r in answers] == [(PutStatus.NOT_MASTER, Written.NO)]
    asyncio.run(go())


def test_held_puts_go_before_a_put_that_arrives_after_the_switch():
    """The switch ended but its input's other actions still run: a new put does not overtake."""
    async def go():
        s, manager, ha, answers = held(b"a")
        manager.promoting, manager.writable = False, True     # settled() not called yet
        assert put(s, b"c", answers) is None
        assert ha.written == [b"a", b"c"]
    asyncio.run(go())


def test_a_slave_that_is_not_promoting_refuses_at_once():
    async def go():
        s, manager, ha = service()
        answers: list = []
        refusal = put(s, b"a", answers)
        assert refusal is not None and refusal.status is PutStatus.NOT_MASTER and len(s._hold) == 0
    asyncio.run(go())


def test_a_switch_that_outlasts_the_hold_refuses_the_held_puts():
    async def go():
        s, manager, ha, answers = held(b"a", max_ms=20)
        deadline = asyncio.get_running_loop().time() + 5
        while not answers and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.005)
        assert [(d, r.status, r.written) for d, r in answers] == [(b"a", PutStatus.NOT_MASTER, Written.NO)]
        manager.switch_ends(ok=True)           # nothing is left to answer twice
        assert ha.written == [] and len(answers) == 1
    asyncio.run(go())


def test_a_full_hold_refuses_at_once():
    async def go():
        s, manager, ha = service()
        s._hold = PromotionHold(max_puts=1)
        manager.promoting = True
        answers: list = []
        assert put(s, b"a", answers) is None
        refusal = put(s, b"b", answers)
        assert refusal is not None and refusal.status is PutStatus.NOT_MASTER
        manager.switch_ends(ok=True)
        assert ha.written == [b"a"]
    asyncio.run(go())


def test_held_put_answers_carry_no_stale_broker_id():
    async def go():
        s, manager, ha, answers = held(b"a")
        manager.broker_id = 3      # (a re-registration between: the answer names the id at write time)
        manager.switch_ends(ok=True)
        assert dataclasses.replace(answers[0][1], broker_id=None) == OK and answers[0][1].broker_id == 3
    asyncio.run(go())
