"""Nemesis topologies have the shapes their names promise; schedules are seeded and well formed."""

from __future__ import annotations

import random

import pytest

from rocketray.verify.nemesis import (
    LEADER,
    CONTROLLER_NEMESES as NEMESES,
    NemesisSpecError,
    bridge,
    isolate_node,
    majority,
    majorities_ring,
    make_controller_schedule as make_schedule,
    parse_nemeses,
    random_halves,
)


def views_of(grudge, n: int) -> dict[int, frozenset[int]]:
    """Which nodes each node hears (itself included) under ``grudge``."""
    return {dst: frozenset(src for src in range(n) if src == dst or (src, dst) not in grudge) for dst in range(n)}



SIZES = [3, 4, 5, 7]
SEEDS = range(25)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("seed", SEEDS)
def test_isolate_node_cuts_one_node_off_both_ways(n, seed):
    grudge, (target,) = isolate_node(n, random.Random(seed))
    views = views_of(grudge, n)
    assert views[target] == {target}
    for i in range(n):
        if i != target:
            assert views[i] == set(range(n)) - {target}


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("seed", SEEDS)
def test_random_halves_are_two_symmetric_components(n, seed):
    grudge, small = random_halves(n, random.Random(seed))
    views = views_of(grudge, n)
    assert len(small) == n // 2
    big = set(range(n)) - set(small)
    for i in small:
        assert views[i] == set(small)
    for i in big:
        assert views[i] == big
    assert all((b, a) in grudge for a, b in grudge)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("seed", SEEDS)
def test_majorities_ring_every_node_sees_a_distinct_majority(n, seed):
    grudge, ring = majorities_ring(n, random.Random(seed))
    views = views_of(grudge, n)
    assert sorted(ring) == list(range(n))
    assert all(len(v) == majority(n) and i in v for i, v in views.items())
    assert len(set(views.values())) == n  # no two nodes see the same majority
    if n == 5:
        assert all((b, a) in grudge for a, b in grudge)  # 5 nodes: a symmetric ring of neighbours


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("seed", SEEDS)
def test_bridge_one_node_sees_both_halves_that_cannot_see_each_other(n, seed):
    grudge, (hub,) = bridge(n, random.Random(seed))
    views = views_of(grudge, n)
    assert views[hub] == set(range(n))
    others = [i for i in range(n) if i != hub]
    left = views[others[0]] - {hub}
    right = set(others) - left
    assert len(left) >= 1 and len(right) >= 1 and abs(len(left) - len(right)) <= 1
    for i in left:
        assert views[i] == left | {hub}
    for i in right:
        assert views[i] == right | {hub}


def test_parse_nemeses_expands_all_and_rejects_unknown():
    assert parse_nemeses("all") == NEMESES
    assert parse_nemeses("kill, bridge,kill") == ("kill", "bridge")
    assert parse_nemeses("none") == ()
    with pytest.raises(NemesisSpecError, match="unknown nemesis 'reboot'"):
        parse_nemeses("kill,reboot")


@pytest.mark.parametrize("seed", SEEDS)
def test_schedule_is_seeded_alternating_and_within_the_duration(seed):
    kinds = parse_nemeses("all")
    plan = make_schedule(kinds, 5, 60.0, random.Random(seed))
    assert plan == make_schedule(kinds, 5, 60.0, random.Random(seed))
    assert plan, "60 s always holds at least one fault"
    assert [s.phase for s in plan] == ["start", "end"] * (len(plan) // 2)
    times = [s.at_s for s in plan]
    assert times == sorted(times) and times[0] > 0 and times[-1] <= 59.0
    for start, end in zip(plan[::2], plan[1::2]):
        assert start.fault_id == end.fault_id and start.kind == end.kind and start.targets == end.targets
        if start.kind in ("kill", "pause"):
            assert start.targets == (LEADER,) or 0 <= start.targets[0] < 5
            assert start.grudge == ()
        else:
            assert start.grudge
    assert {s.kind for s in make_schedule(kinds, 5, 600.0, random.Random(seed))} == set(NEMESES)


def test_different_seeds_give_different_schedules():
    kinds = parse_nemeses("all")
    assert make_schedule(kinds, 5, 60.0, random.Random(1)) != make_schedule(kinds, 5, 60.0, random.Random(2))


def test_no_nemeses_no_schedule():
    assert make_schedule((), 5, 60.0, random.Random(0)) == []


@pytest.mark.parametrize("seed", SEEDS)
def test_swapping_in_the_leader_keeps_the_partition_shape(seed):
    # The runner relabels a planned partition so the current leader is the isolated node.
    from rocketray.verify.nemesis import swap_nodes

    grudge, targets = isolate_node(5, random.Random(seed))
    leader = (targets[0] + 1 + seed % 4) % 5
    new_grudge, new_targets = swap_nodes(grudge, targets, targets[0], leader)
    assert new_targets == (leader,)
    assert views_of(frozenset(new_grudge), 5)[leader] == {leader}
    assert len(new_grudge) == len(grudge)


def test_only_isolation_and_halves_plan_a_leader_swap():
    plan = make_schedule(NEMESES, 5, 600.0, random.Random(3))
    assert {s.kind for s in plan if s.leader_swap} == {"partition-random-node", "partition-random-halves"}
