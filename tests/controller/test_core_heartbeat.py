"""The heartbeat table (reference 5.2) driven by now_ms, with the Q7 fixes."""

from __future__ import annotations

from rocketray.controller.api import BrokerHeartbeatRequest
from rocketray.controller.codes import ResponseCode, is_retriable
from rocketray.controller.heartbeat import HeartbeatTable


def beat(bid: int = 1, addr: str = "a:1", epoch: int = -1, max_offset: int = -1, confirm: int = -1,
         timeout_ms: int = 3000, prio: int = 2**31 - 1, name: str = "b") -> BrokerHeartbeatRequest:
    return BrokerHeartbeatRequest("c", name, addr, bid, epoch, max_offset, confirm, timeout_ms, prio)


def test_alive_until_timeout_then_expired_once():
    """Alive while last + timeout >= now; expire removes it exactly once and reports (cluster, name, id)."""
    t = HeartbeatTable()
    assert t.on_heartbeat(beat(), 1000).ok
    assert t.is_alive("b", 1, 4000) and not t.is_alive("b", 1, 4001)
    assert t.expire(4000) == []
    assert t.expire(4001) == [("c", "b", 1)]
    assert t.expire(4001) == [] and t.live_info("b", 1) is None and not t.is_alive("b", 1, 4001)


def test_refresh_extends_liveness_and_takes_new_timeout():
    """A refresh moves last_update and takes the new timeout and priority."""
    t = HeartbeatTable()
    t.on_heartbeat(beat(timeout_ms=100), 0)
    t.on_heartbeat(beat(timeout_ms=5000, prio=3), 90)
    assert t.is_alive("b", 1, 5090) and t.live_info("b", 1).election_priority == 3


def test_progress_is_monotonic():
    """(epoch, max_offset, confirm) change only on higher epoch or same epoch with higher max offset."""
    t = HeartbeatTable()
    t.on_heartbeat(beat(epoch=2, max_offset=100, confirm=50), 0)
    t.on_heartbeat(beat(epoch=1, max_offset=900, confirm=900), 1)
    assert (t.live_info("b", 1).epoch, t.live_info("b", 1).max_offset) == (2, 100)
    t.on_heartbeat(beat(epoch=2, max_offset=100, confirm=99), 2)
    assert t.live_info("b", 1).confirm_offset == 50
    t.on_heartbeat(beat(epoch=2, max_offset=101, confirm=60), 3)
    assert (t.live_info("b", 1).max_offset, t.live_info("b", 1).confirm_offset) == (101, 60)
    t.on_heartbeat(beat(epoch=3, max_offset=5, confirm=5), 4)
    assert (t.live_info("b", 1).epoch, t.live_info("b", 1).max_offset) == (3, 5)


def test_quirk7_fixed_address_refreshed_and_confirm_offset_stored_on_insert():
    """Q7 FIXED: a known broker's new address is recorded; confirm offset kept from the first heartbeat."""
    t = HeartbeatTable()
    t.on_heartbeat(beat(addr="a:1", epoch=1, max_offset=10, confirm=7), 0)
    assert t.live_info("b", 1).confirm_offset == 7
    t.on_heartbeat(beat(addr="a:2", epoch=1, max_offset=10, confirm=7), 1)
    assert t.live_info("b", 1).broker_address == "a:2"


def test_heartbeat_without_broker_id_is_invalid_request():
    """A heartbeat with no usable broker id gets 2005 and changes nothing."""
    t = HeartbeatTable()
    assert t.on_heartbeat(beat(bid=-1), 0).code == ResponseCode.CONTROLLER_INVALID_REQUEST
    assert len(t) == 0


def test_negative_timeout_is_dead_and_counts_and_remove():
    """A negative timeout means dead at once (16.1 uses -10000); counts list only alive rows; remove drops."""
    t = HeartbeatTable()
    t.on_heartbeat(beat(bid=1, timeout_ms=-10000), 100)
    t.on_heartbeat(beat(bid=2), 100)
    assert not t.is_alive("b", 1, 100) and t.is_alive("b", 2, 100)
    assert t.active_counts(100) == {"c": {"b": 1}}
    assert t.alive_predicate(100)("b", 2) and not t.is_alive("b", None, 100)
    assert t.remove("b", 2) is not None and t.remove("b", 2) is None


def test_retriable_codes():
    """NOT_LEADER and 'nobody electable yet' are retriable; fencing and invalid ids are not."""
    assert is_retriable(2007) and is_retriable(ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE)
    assert not is_retriable(ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH) and not is_retriable(2014)
    assert not is_retriable(0) and not is_retriable(424242)
