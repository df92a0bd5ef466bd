"""The async-flush loss oracle (rocketray.sim.loss): a power loss forgives exactly the records no other
SyncStateSet member holds, past the lost broker's durable end, acknowledged before the loss; an
election of a broker that lost power forgives exactly what it lost that no broker the controller
could have elected instead holds. One-layer unit tests with stand-in brokers (the oracle reads only
these attributes)."""

from __future__ import annotations

from types import SimpleNamespace

from rocketray.sim.loss import LossOracle


def _broker(bid: int, end: int, up: bool = True, flushed: int = 0, losses: int = 0):
    store = SimpleNamespace(max_offset=end) if up else None
    return SimpleNamespace(id=bid, name=f"g0-{bid}", up=up, store=store, flushed_end=flushed, power_losses=losses,
                           restarts=0, rewrites=0, end_before_power_loss=0)


def _lose_power(oracle: LossOracle, b, brokers, members, now_ms: int, durable: int):
    """``b`` loses power with its log at its end: it comes back (up) with ``durable`` bytes."""
    b.end_before_power_loss = b.store.max_offset
    b.up, b.store, b.power_losses = False, None, b.power_losses + 1
    f = oracle.power_lost("g0", b, brokers, members, now_ms, exempt=lambda x: x is b)
    b.up, b.store = True, SimpleNamespace(max_offset=durable)
    oracle.seen_up(b, lambda x: durable)
    return f


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


# -- elections of a broker that lost power (LossOracle.elected) -----------------------------------------


def _seed_24_shape():
    """Members 2 and 3 hold 1000; master 3 loses power with 800 flushed and comes back with 800."""
    oracle = LossOracle()
    two, three = _broker(2, 1000), _broker(3, 1000)
    _seen(oracle, two, three)
    f = _lose_power(oracle, three, [two, three], {2, 3}, 5000, durable=800)
    assert f is not None and f.end == 1000, "member 2 still holds everything: the loss alone forgives nothing"
    return oracle, two, three


def test_elected_after_losing_power_while_the_holder_is_cut_off_forgives_what_it_lost():
    """Seed 24's shape: member 2 holds [800, 1000) but is cut off from the controller, which elects the
    restarted 3, the only SyncStateSet member it hears from: [800, 1000) may be lost, nothing below
    800, nothing from 1000 (3 never held it), nothing acknowledged after the election."""
    oracle, two, three = _seed_24_shape()
    (f,) = oracle.elected("g0", three, electable=[], now_ms=6000)
    assert (f.end, f.below) == (800, 1000)
    assert oracle.forgiven("g0", 4000, 800) and oracle.forgiven("g0", 5500, 999)
    assert not oracle.forgiven("g0", 4000, 799)
    assert not oracle.forgiven("g0", 5500, 1000), "3 did not hold it when it lost power"
    assert not oracle.forgiven("g0", 6001, 900), "acknowledged after the election"


def test_elected_while_a_holder_is_electable_forgives_nothing():
    """The same loss, but member 2 is heard from and in the SyncStateSet: electing 3 over it is a bug
    (the ranking by progress), never a loss async flush allows."""
    oracle, two, three = _seed_24_shape()
    assert oracle.elected("g0", three, electable=[two], now_ms=6000) == []
    assert not oracle.forgiven("g0", 4000, 900)


def test_an_electable_replica_holding_part_of_the_tail_keeps_that_part():
    """An electable replica with 900: only [900, 1000) may be lost."""
    oracle, two, three = _seed_24_shape()
    two.store.max_offset = 900
    (f,) = oracle.elected("g0", three, electable=[two], now_ms=6000)
    assert (f.end, f.below) == (900, 1000) and not oracle.forgiven("g0", 4000, 850)


def test_a_tail_held_again_after_the_loss_is_never_forgiven():
    """3 caught up to 1000 after its restart and then lost it some other way (a truncation): an
    election of 3 forgives nothing; what it held since the loss must survive."""
    oracle, two, three = _seed_24_shape()
    three.store.max_offset = 1000
    oracle.seen_up(three, lambda b: 800)
    three.store.max_offset = 800
    oracle.seen_up(three, lambda b: 800)
    assert oracle.elected("g0", three, electable=[], now_ms=6000) == []


def test_a_broker_that_never_lost_power_forgives_nothing_when_elected():
    oracle = LossOracle()
    two, three = _broker(2, 1000), _broker(3, 800)
    _seen(oracle, two, three)
    assert oracle.elected("g0", three, electable=[], now_ms=6000) == []


def test_an_electable_holder_that_is_down_counts_with_what_it_keeps():
    """A killed holder keeps its page cache (1000); one that lost power keeps its durable end (900).
    Electable but down (its heartbeats not yet expired), each keeps what it would bring back."""
    for losses, kept in ((0, 1000), (1, 900)):
        oracle, two, three = _seed_24_shape()
        two.flushed_end = 900
        oracle.seen_up(two, lambda b: 0)
        two.up, two.store, two.power_losses = False, None, losses
        got = [(f.end, f.below) for f in oracle.elected("g0", three, electable=[two], now_ms=6000)]
        assert got == ([] if kept == 1000 else [(900, 1000)])


def test_a_second_power_loss_with_a_shorter_log_does_not_hide_the_first_ones_tail():
    """``async-overlap`` seed 394's shape: 3 loses power holding 1000 (800 flushed) while 2 holds
    1000; it comes back with 800, never catches up, and loses power again holding 800 (all flushed).
    Elected with 2 unelectable: [800, 1000), lost at the first loss and never held since, may be
    lost; the second loss lost nothing. The oracle once kept only the last loss and forgave nothing."""
    oracle, two, three = _seed_24_shape()
    three.flushed_end = 800
    oracle.seen_up(three, lambda b: 800)
    _lose_power(oracle, three, [two, three], {2, 3}, 5500, durable=800)
    assert [(f.end, f.below) for f in oracle.elected("g0", three, electable=[], now_ms=6000)] == [(800, 1000)]
    assert oracle.forgiven("g0", 4000, 900) and not oracle.forgiven("g0", 4000, 799)


def test_a_tail_held_between_two_losses_is_not_forgiven_by_the_first():
    """3 loses power at 1000 (back with 800), catches up to 1000 again, then is truncated to 850 and
    loses power at 850 (back with 850): the first loss's tail was held again, so only what the second
    loss took counts, and it took nothing."""
    oracle, two, three = _seed_24_shape()
    three.store.max_offset = 1000
    oracle.seen_up(three, lambda b: 800)
    three.store.max_offset = 850
    oracle.seen_up(three, lambda b: 800)
    _lose_power(oracle, three, [two, three], {2, 3}, 5500, durable=850)
    assert oracle.elected("g0", three, electable=[], now_ms=6000) == []


def test_async_overlap_seed_255_a_stand_in_elected_for_a_restarted_master_loses_only_what_it_lost():
    """``async-overlap`` seed 255: master g0-1, alone in the SyncStateSet {1}, lost power holding 7729
    and came back with 5537 (g0-3 had lost power before, back with 3861); restarted, it asked for a new
    term and the controller elected g0-2 (outside the set, log 6827 in the same epoch, so it contains
    g0-1's) in its stead. Electing g0-1 itself would have lost [5537, 7729); electing g0-2 loses
    [6827, 7729) of it, which the oracle forgives as g0-1's loss (the stand-in rule of
    ``loss_checks._elected``) and nothing else. Without the stand-in rule the seed reports
    invariant 1 (g0-2 ends at 6827, below what was acknowledged)."""
    forgiven = _election_forgiveness_of_async_overlap_seed(255)
    assert ("g0-1", 6827, 7729) in forgiven, forgiven


def test_async_overlap_seed_710_a_holder_cut_off_and_ranked_by_its_last_report_forgives_the_lost_tail():
    """``async-overlap`` seed 710: master g0-1 loses power holding 13981 (g0-2 killed, g0-3 holds it
    all but was cut off from the controller at 990 ms having reported 7731). The restarted g0-1
    reports 13720 and is elected 28 ms before g0-3's row would have expired: ranked by what it last
    reported, g0-3 was not the better choice, so [13720, 13981) is the loss async flush allows (the
    oracle counted g0-3 as an electable holder and reported a loss)."""
    forgiven = _election_forgiveness_of_async_overlap_seed(710)
    assert ("g0-1", 13720, 13981) in forgiven, forgiven


def test_async_overlap_seed_558_a_replica_down_at_the_election_serves_stale_copies_when_back():
    """``async-overlap`` seed 558: g0-2, killed holding 11374 (its page cache kept), was down when the
    restarted g0-1 was elected with 10591 ([10591, 11374) forgiven); back up, g0-2 served that range
    to a consumer before it followed g0-1 and truncated it. Those reads are stale copies, forgiven
    with the records, as a replica's that was up at the election (the oracle took only those and
    reported invariant 1: g0-2 ends at 10591 below what was read)."""
    from rocketray.sim.clients import Read
    from rocketray.sim.run import PROFILES, Sim

    sim = Sim(558, PROFILES["async-overlap"])
    r = sim.run()
    assert r.ok, r.violation
    inv = sim.invariants
    assert inv.oracle is not None
    after = [f.at_ms for f in inv.oracle.events["g0"] if (f.broker, f.end, f.below) == ("g0-1", 10591, 11374)]
    stale_reads = [x for c in inv._consumers_of["g0"] for x in c.read if isinstance(x, Read) and x.replica == "g0-2"
                   and 10591 <= x.physical_offset < 11374 and after and x.at_ms > min(after)]
    assert stale_reads and all((x.physical_offset, x.body) in inv._stale["g0"] for x in stale_reads)
    assert not any(inv.oracle.forgiven("g0", x.at_ms, x.physical_offset) for x in stale_reads), \
        "read after the election: only the stale rule forgives them"


def _election_forgiveness_of_async_overlap_seed(seed: int) -> list[tuple[str, int, int | None]]:
    """Run ``async-overlap`` ``seed`` (it must pass) and return the oracle's election forgiveness of
    g0 as ``(broker, end, below)``."""
    from rocketray.sim.run import PROFILES, Sim

    sim = Sim(seed, PROFILES["async-overlap"])
    r = sim.run()
    assert r.ok, r.violation
    assert sim.invariants.oracle is not None
    return [(f.broker, f.end, f.below) for f in sim.invariants.oracle.events["g0"] if f.below is not None]
