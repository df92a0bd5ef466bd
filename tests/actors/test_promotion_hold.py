"""Puts that reach a replica while it becomes master are held and answered when its switch ends.

``PromotionHold`` alone (tables), then ``BrokerService.put_start`` over a real HA service, store and
role machine (the gate's rules as tables are in tests/ha/test_put_gate.py); only the manager's broker
id and the metrics are stand-ins."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from ha_helpers import fast_config, node_links, open_store

from rocketray.actors.broker_service import BrokerService
from rocketray.broker import role as rm
from rocketray.wire.batch import encode_batch
from rocketray.wire.message import Message
from rocketray.broker.role import MasterInfo, Role, RoleMachine
from rocketray.ha.promotion_hold import PromotionHold
from rocketray.wire.put_result import PutResult, PutStatus, Written
from rocketray.ha.service import HAService


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


class Manager:
    """What ``BrokerService.put_start`` reads of its manager (the broker id); the role machine is real."""

    def __init__(self) -> None:
        self.broker_id = 2


class Metrics:
    def put(self, *args) -> None:
        pass


class Replica:
    """A ``BrokerService`` over a real HA service, store and role machine: a slave of broker 1 at
    epoch 1 that the controller names master of epoch 2 (``promote``), whose switch then ends."""

    def __init__(self, root: Path, max_ms: int = 1000, max_puts: int = 1024) -> None:
        self.machine = RoleMachine(broker_address="b2", broker_id=2, lifecycle=rm.Lifecycle.RUNNING,
                                   role=Role.SLAVE, master_broker_id=1, master_epoch=1)
        self.store = open_store(root / "store2")
        self.ha = HAService(self.store, 2, fast_config(all_ack_in_sync_state_set=True), links=node_links(2),
                            roles=self.machine, hold=PromotionHold(max_puts=max_puts, max_ms=max_ms))
        s = object.__new__(BrokerService)
        s.manager, s.ha, s._metrics = Manager(), self.ha, Metrics()
        s._group, s._replica = "g", 1
        self.service, self.manager = s, s.manager
        self.answers: list = []

    def promote(self) -> None:
        self.machine.step(rm.RoleChangeNotified(MasterInfo(2, "b2", 2, 1, frozenset({2}))))
        assert self.machine.promoting

    def switch_ends(self, ok: bool) -> None:
        self.machine.step(rm.SwitchDone(ok))
        self.service._answer_held()          # the manager's ``settled`` after every role input

    def put(self, data: bytes) -> PutResult | None:
        batch = encode_batch([Message("T", 0, data)])
        return self.service.put_start(batch, lambda result: self.answers.append((data, result)))


@pytest.fixture
def replica(tmp_path):
    """Opens ``Replica(tmp_path, **bounds)``; closes its HA service and store after the test (a store
    left open keeps flushing on its own thread for the rest of the session)."""
    opened: list[Replica] = []

    def make(**bounds) -> Replica:
        opened.append(Replica(tmp_path, **bounds))
        return opened[-1]
    yield make
    for r in opened:
        asyncio.run(r.ha.close())
        r.store.close()


def promotion(r: Replica) -> list:
    """Two puts while the replica is promoting, then its switch succeeds: (data, status, broker id)
    of the answers, in the order they came."""
    r.promote()
    for data in (b"a", b"b"):
        refusal = r.put(data)
        if refusal is not None:
            r.answers.append((data, refusal))
    r.switch_ends(ok=True)
    return [(d, res.status, res.broker_id) for d, res in r.answers]


def raw_log(r: Replica) -> int:
    return r.store.max_offset


def test_a_put_during_the_promotion_is_written_when_the_switch_succeeds(replica):
    async def go():
        r = replica()
        assert promotion(r) == [(b"a", PutStatus.PUT_OK, 2), (b"b", PutStatus.PUT_OK, 2)]
        assert r.ha.gate.hold is not None and r.ha.gate.hold.held_total == 2
        assert [res.offsets[0][0] for _d, res in r.answers] == [0, 1]     # written in arrival order
    asyncio.run(go())


def test_the_old_rule_refuses_during_the_promotion_and_the_test_sees_it(replica, monkeypatch):
    """The rule before: not writable means NOT_MASTER, promoting or not (no hold)."""
    async def go():
        r = replica()
        monkeypatch.setattr(r.ha.gate.hold, "hold", lambda *a: False)
        assert promotion(r) == [(b"a", PutStatus.NOT_MASTER, 2), (b"b", PutStatus.NOT_MASTER, 2)]
        assert raw_log(r) == 0
    asyncio.run(go())


def test_a_put_during_a_failed_promotion_is_refused_with_nothing_written(replica):
    async def go():
        r = replica()
        r.promote()
        assert r.put(b"a") is None
        r.switch_ends(ok=False)
        assert raw_log(r) == 0
        assert [(res.status, res.written) for _d, res in r.answers] == [(PutStatus.NOT_MASTER, Written.NO)]
    asyncio.run(go())


def test_held_puts_go_before_a_put_that_arrives_after_the_switch(replica):
    """The switch ended but its input's other actions still run: a new put does not overtake."""
    async def go():
        r = replica()
        r.promote()
        assert r.put(b"a") is None
        r.machine.step(rm.SwitchDone(True))      # settled() not called yet
        assert r.put(b"c") is None
        assert [(d, res.offsets[0][0]) for d, res in r.answers] == [(b"a", 0), (b"c", 1)]
    asyncio.run(go())


def test_a_slave_that_is_not_promoting_refuses_at_once(replica):
    async def go():
        r = replica()
        refusal = r.put(b"a")
        assert refusal is not None and refusal.status is PutStatus.NOT_MASTER and r.ha.gate.held == 0
    asyncio.run(go())


def test_a_switch_that_outlasts_the_hold_refuses_the_held_puts(replica):
    async def go():
        r = replica(max_ms=20)
        r.promote()
        assert r.put(b"a") is None
        deadline = asyncio.get_running_loop().time() + 5
        while not r.answers and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.005)
        assert [(d, res.status, res.written) for d, res in r.answers] == [(b"a", PutStatus.NOT_MASTER, Written.NO)]
        r.switch_ends(ok=True)           # nothing is left to answer twice
        assert raw_log(r) == 0 and len(r.answers) == 1
    asyncio.run(go())


def test_a_full_hold_refuses_at_once(replica):
    async def go():
        r = replica(max_puts=1)
        r.promote()
        assert r.put(b"a") is None
        refusal = r.put(b"b")
        assert refusal is not None and refusal.status is PutStatus.NOT_MASTER
        r.switch_ends(ok=True)
        assert [(d, res.status) for d, res in r.answers] == [(b"a", PutStatus.PUT_OK)]
    asyncio.run(go())


def test_held_put_answers_carry_no_stale_broker_id(replica):
    async def go():
        r = replica()
        r.promote()
        assert r.put(b"a") is None
        r.manager.broker_id = 3      # (a re-registration between: the answer names the id at answer time)
        r.switch_ends(ok=True)
        assert r.answers[0][1].status is PutStatus.PUT_OK and r.answers[0][1].broker_id == 3
    asyncio.run(go())
