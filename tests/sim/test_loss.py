"""The async-flush loss oracle (rocketray.sim.loss): a power loss forgives exactly the records no other
SyncStateSet member holds, past the lost broker's durable end, acknowledged before the loss. One-layer
unit tests with stand-in brokers (the oracle reads only these attributes)."""

from __future__ import annotations

from types import SimpleNamespace

from rocketray.sim.loss import LossOracle


def _broker(bid: int, end: int, up: bool = True, flushed: int = 0, losses: int = 0):
    store = SimpleNamespace(max_offset=end) if up else None
    return SimpleNamespace(id=bid, name=f"g0-{bid}", up=up, store=store, flushed_end=flushed, power_losses=losses,
                           restarts=0, rewrites=0)


def _seen(oracle: LossOracle, *brokers) -> None:
    for b in brokers:
        oracle.seen_up(b, lambda b: 0)


def test_a_member_that_still_holds_the_records_forgives_nothing():
    """Three members hold everything acknowledged (end 500); member 2 loses power with 300 flushed:
    the others hold 500, so nothing acknowledged before may be lost."""
    oracle = LossOracle()
    one, two, three = _broker(1, 500), _broker(2, 500, flushed=300), _broker(3, 500)
    _seen(oracle, one, two, three)
    two.up, two.store, two.power_losses = False, None, 1
    f = oracle.power_lost("g0", two, [one, two, three], {1, 2, 3}, 1000, exempt=lambda b: False)
    assert f is not None and f.end == 500
    assert not oracle.forgiven("g0", 900, 400) and oracle.forgiven("g0", 900, 500) is True
    assert not oracle.forgiven("g0", 1001, 600), "a record acknowledged after the loss is never forgiven"


def test_the_last_holder_losing_power_forgives_its_unflushed_tail():
    """Seed 251's shape: the master (1) was killed, slave 2 was elected alone in the SyncStateSet and
    loses power with 300 of 500 flushed: records from 300 may be lost; below 300 may not. Had the
    killed master still been a member, its page cache (kept by a kill) would have held them."""
    oracle = LossOracle()
    one, two = _broker(1, 500), _broker(2, 500)
    # the flush made 300 durable after the log was first seen (its base durable end 0)
    oracle.seen_up(two, lambda b: 0)
    _seen(oracle, one)
    two.flushed_end = 300
    oracle.seen_up(two, lambda b: 0)
    one.up, one.store = False, None                      # killed: power_losses unchanged
    two.up, two.store, two.power_losses = False, None, 1
    f = oracle.power_lost("g0", two, [one, two], {2}, 1000, exempt=lambda b: False)
    assert f.end == 300 and oracle.forgiven("g0", 900, 300) and not oracle.forgiven("g0", 900, 250)
    kept = LossOracle()
    one.up, one.store = True, SimpleNamespace(max_offset=500)
    _seen(kept, one)
    one.up, one.store = False, None
    assert kept.power_lost("g0", two, [one, two], {1, 2}, 1000, exempt=lambda b: False).end == 500


def test_a_member_that_lost_power_earlier_holds_nothing_that_counts():
    """Every member loses power before its flush: the second loss finds the first member exempt (it
    has not caught up), so what neither flushed may be lost."""
    oracle = LossOracle()
    one, two = _broker(1, 500), _broker(2, 500)
    _seen(oracle, one, two)
    two.flushed_end = 350
    oracle.seen_up(two, lambda b: 0)
    one.flushed_end = 200
    oracle.seen_up(one, lambda b: 0)
    one.up, one.store, one.power_losses = False, None, 1
    assert oracle.power_lost("g0", one, [one, two], {1, 2}, 1000, exempt=lambda b: False).end == 500
    two.up, two.store, two.power_losses = False, None, 1
    one.up, one.store = True, SimpleNamespace(max_offset=200)
    f = oracle.power_lost("g0", two, [one, two], {1, 2}, 1100, exempt=lambda b: b is one)
    assert f.end == 350 and oracle.forgiven("g0", 1000, 400) and not oracle.forgiven("g0", 1000, 300)


def test_a_broker_outside_the_sync_state_set_forgives_nothing():
    oracle = LossOracle()
    lost = _broker(3, 100)
    assert oracle.power_lost("g0", lost, [lost], {1, 2}, 10, exempt=lambda b: False) is None
    assert not oracle.forgiven("g0", 0, 0)
