"""The leader-change rule (issue 29): a new leader gives brokers a grace window to reopen their
sessions, then treats each master without one as dead, once per leadership. Pure, table-driven."""

from __future__ import annotations

import pytest

from rocketray.controller.session import LeaderSessionGrace, masters_without_session

GRACE = 400


def run(ticks: list[tuple[int, int | None]], *, started_ms: int = 0, warm_up_ms: int = 0) -> list[int]:
    """Feed (now_ms, leader_term) ticks; the times at which the rule said 'act now'."""
    rule = LeaderSessionGrace(GRACE, started_ms=started_ms, warm_up_ms=warm_up_ms)
    return [now for now, term in ticks if rule.due(now, term)]


@pytest.mark.parametrize("ticks,fired", [
    # never leader: never
    ([(0, None), (1000, None), (5000, None)], []),
    # leader from t=100: the first tick at or after 100 + grace, once
    ([(100, 3), (300, 3), (499, 3), (500, 3), (600, 3), (5000, 3)], [500]),
    # a late tick fires late, still once
    ([(100, 3), (2000, 3), (2001, 3)], [2000]),
    # leadership lost inside the window: nothing; regained later: a fresh window
    ([(100, 3), (300, None), (600, None), (700, 5), (1000, 5), (1100, 5), (1200, 5)], [1100]),
    # a new term without an observed gap restarts the window, and fires again after it
    ([(100, 3), (500, 3), (600, 4), (900, 4), (1000, 4)], [500, 1000]),
    # the same term after losing it is a new leadership (the window restarts)
    ([(0, 2), (400, 2), (450, None), (460, 2), (700, 2), (860, 2)], [400, 860]),
])
def test_the_rule_fires_once_per_leadership_after_the_grace(ticks, fired):
    assert run(ticks) == fired


def test_a_node_younger_than_its_warm_up_acts_on_none_for_that_leadership():
    """Its heartbeat table may not know the live replicas: an election could only depose the master."""
    assert run([(100, 1), (500, 1), (900, 1)], started_ms=0, warm_up_ms=1500) == []
    assert run([(1200, 1), (1600, 1)], started_ms=0, warm_up_ms=1500) == [1600]
    # the window ended before warm-up: that leadership is left to heartbeat expiry, the next one acts
    assert run([(100, 1), (500, 1), (1600, 1), (1700, 2), (2100, 2)], warm_up_ms=1500) == [2100]


def test_deadline_is_reported_while_the_window_runs():
    rule = LeaderSessionGrace(GRACE, started_ms=0)
    assert rule.deadline_ms() is None
    rule.due(100, 7)
    assert rule.deadline_ms() == 500
    assert rule.due(500, 7) and rule.deadline_ms() is None
    rule.due(600, None)
    assert rule.deadline_ms() is None


@pytest.mark.parametrize("grace,warm", [(-1, 0), (1.5, 0), (10, -5), ("400", 0)])
def test_bad_parameters_are_refused(grace, warm):
    with pytest.raises(ValueError):
        LeaderSessionGrace(grace, started_ms=0, warm_up_ms=warm)


@pytest.mark.parametrize("masters,sessions,dead", [
    ({}, set(), []),
    ({"a": 1, "b": 2}, {("a", 1), ("b", 2)}, []),
    ({"a": 1, "b": 2}, {("a", 1), ("b", 3)}, [("b", 2)]),
    ({"a": 1, "b": None}, {("a", 2), ("b", 1)}, [("a", 1)]),    # no master: nothing to depose
    ({"a": 1}, {("a", 2), ("a", 3)}, [("a", 1)]),               # slaves' sessions do not cover the master
    ({"b": 2, "a": 1}, {("a", 3), ("b", 1)}, [("a", 1), ("b", 2)]),  # sorted
    # no replica of the group reopened: brokers without sessions, a leader cut off from all of them,
    # a single-replica group: left to heartbeat expiry (an election could reach no one)
    ({"a": 1}, set(), []),
    ({"a": 1, "b": 2}, {("a", 2)}, [("a", 1)]),
])
def test_masters_without_session(masters, sessions, dead):
    assert masters_without_session(masters, sessions) == dead
