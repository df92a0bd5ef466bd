"""The heartbeat table (reference 5.2) driven by now_ms, with the Q7 fixes."""

from __future__ import annotations

import pytest

from rocketray.wire.controller_api import BrokerHeartbeatRequest
from rocketray.wire.controller_codes import ResponseCode, is_retriable
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


OLD_RULE_MAX_SEEN = staticmethod(lambda old, req: req.epoch > old.epoch or
                                  (req.epoch == old.epoch and req.max_offset > old.max_offset))

PROGRESS_ROWS = [
    # (reports in order as (epoch, max_offset, confirm), expected row (epoch, max_offset, confirm), why)
    ([(2, 100, 50), (1, 900, 900)], (1, 900, 900), "an older epoch reported last is what the broker holds now"),
    ([(2, 100, 50), (2, 100, 99)], (2, 100, 99), "the confirm offset follows the last report"),
    ([(2, 100, 50), (2, 101, 60)], (2, 101, 60), "growth is taken"),
    ([(2, 100, 50), (3, 5, 5)], (3, 5, 5), "a new epoch is taken"),
    # fix 6: a master restarted with less data (power loss, torn tail) is ranked by what it has now
    ([(1, 500, 400), (1, 100, 100)], (1, 100, 100), "restart with a lost tail lowers the row"),
    ([(3, 700, 700), (2, 300, 300)], (2, 300, 300), "a truncated epoch lowers the row"),
]


@pytest.mark.parametrize("reports,expected,why", PROGRESS_ROWS, ids=[r[2] for r in PROGRESS_ROWS])
def test_progress_is_the_last_report(reports, expected, why):
    """Issue 15 fix 6: the row ranks a broker by its current progress, not the best ever seen."""
    t = HeartbeatTable()
    for i, (epoch, max_offset, confirm) in enumerate(reports):
        t.on_heartbeat(beat(epoch=epoch, max_offset=max_offset, confirm=confirm), i)
    row = t.live_info("b", 1)
    assert (row.epoch, row.max_offset, row.confirm_offset) == expected, why


def test_restarted_master_with_less_data_loses_the_election_rank(monkeypatch):
    """Fix 6 end to end at the core: after broker 1 restarts with 100 bytes (it had 500), broker 2
    holding 300 ranks first. Under the old max-seen rule broker 1 would still rank first."""
    from rocketray.controller import heartbeat as hb
    from rocketray.controller.election import elect

    def winner() -> int | None:
        t = HeartbeatTable()
        t.on_heartbeat(beat(bid=1, epoch=1, max_offset=500), 0)
        t.on_heartbeat(beat(bid=2, epoch=1, max_offset=300), 0)
        t.on_heartbeat(beat(bid=1, epoch=1, max_offset=100), 1)  # restarted, its tail lost
        return elect({1, 2}, None, None, None, lambda i: t.is_alive("b", i, 1), lambda i: t.live_info("b", i))

    assert winner() == 2
    monkeypatch.setattr(hb, "_takes_report", OLD_RULE_MAX_SEEN)
    assert winner() == 1  # the old rule: ranked by data it no longer has


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
