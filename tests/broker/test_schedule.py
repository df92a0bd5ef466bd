"""Delayed delivery's pure rules (broker/schedule.py): levels, where a delayed send is stored, which
schedule entries are due, and the put-then-commit plan replayed after a failover."""

import pytest

from rocketray.wire.message import Message
from rocketray.wire.delayed import (LEVELS_MS, MAX_DELAY_MS, P_DELIVER_AT, P_REAL_QID, PAST_TOLERANCE_MS,
                                    deliver_at_of, level_of, plan_delay, real_topic, schedule_topic)
from rocketray.broker.schedule import delivered, plan_queue

NOW = 1_700_000_000_000


@pytest.mark.parametrize("delay_ms, level", [(1, 0), (1000, 0), (1001, 1), (2000, 1), (2001, 2), (59_999, 6),
                                             (60_000, 6), (MAX_DELAY_MS, len(LEVELS_MS) - 1)])
def test_a_delay_waits_in_the_shortest_level_at_least_as_long(delay_ms, level):
    assert level_of(delay_ms) == level
    assert LEVELS_MS[level] >= delay_ms and (level == 0 or LEVELS_MS[level - 1] < delay_ms)


def test_levels_grow_and_end_at_the_maximum():
    assert all(b > a for a, b in zip(LEVELS_MS, LEVELS_MS[1:])) and LEVELS_MS[-1] == MAX_DELAY_MS == 24 * 3600_000


@pytest.mark.parametrize("deliver_at, topic, queue_id, delayed", [
    (NOW + 1500, "%SCHEDULE%orders", 1, True),            # 1.5 s: level 1 (2 s)
    (NOW + MAX_DELAY_MS, "%SCHEDULE%orders", len(LEVELS_MS) - 1, True),
    (NOW, "orders", 3, False),                            # due now: sent to its queue at once
    (NOW - PAST_TOLERANCE_MS, "orders", 3, False),        # a little in the past: the same
])
def test_a_delayed_send_is_stored_in_its_levels_schedule_queue(deliver_at, topic, queue_id, delayed):
    plan = plan_delay("orders", 3, deliver_at, NOW)
    assert (plan.topic, plan.queue_id, plan.delayed) == (topic, queue_id, delayed)
    assert plan.system_properties[P_DELIVER_AT] == str(deliver_at)
    assert (plan.system_properties.get(P_REAL_QID) == "3") is delayed


@pytest.mark.parametrize("deliver_at, problem", [
    (NOW - PAST_TOLERANCE_MS - 1, "in the past"), (NOW + MAX_DELAY_MS + 1, "over the maximum delay"),
    (float(NOW + 5000), "must be an int"), (True, "must be an int")])
def test_a_delivery_time_out_of_range_is_refused(deliver_at, problem):
    with pytest.raises(ValueError, match=problem):
        plan_delay("orders", 0, deliver_at, NOW)


def test_a_topic_too_long_for_its_schedule_topic_is_refused_but_may_be_sent_due_now():
    long = "t" * 120
    with pytest.raises(ValueError, match="too long"):
        plan_delay(long, 0, NOW + 5000, NOW)
    assert plan_delay(long, 0, NOW, NOW).topic == long


@pytest.mark.parametrize("committed, entries, now, due, commit_to, next_due", [
    (0, [], NOW, (), 0, None),                                           # nothing stored
    (0, [(0, NOW - 5), (1, NOW), (2, NOW + 1)], NOW, (0, 1), 2, NOW + 1),  # due at now is due
    (4, [(4, NOW + 9), (5, NOW - 9)], NOW, (), 4, NOW + 9),              # held at the first not due
    (4, [(4, NOW - 9), (5, NOW - 1)], NOW, (4, 5), 6, None),             # all due
    (2, [(7, NOW - 1), (8, NOW + 5)], NOW, (7,), 8, NOW + 5),            # retention deleted 2..6
    (0, [(0, 0)], NOW, (0,), 1, None),                                   # no time: due now
])
def test_the_due_prefix_of_a_schedule_queue(committed, entries, now, due, commit_to, next_due):
    plan = plan_queue(committed, entries, now)
    assert (plan.due, plan.commit_to, plan.next_due_ms) == (due, commit_to, next_due)


def test_a_failover_between_put_and_commit_puts_the_same_messages_again_and_skips_none():
    entries = [(0, NOW - 3), (1, NOW - 2), (2, NOW + 100)]
    first = plan_queue(0, entries, NOW)
    # the master put 0 and 1, then died before its commit: the next master plans from offset 0 again
    again = plan_queue(0, entries, NOW + 50)
    assert first.due == again.due == (0, 1) and again.commit_to == 2
    # once the commit is acknowledged, nothing before it is put again; the held entry comes when due
    later = plan_queue(first.commit_to, entries[2:], NOW + 100)
    assert later.due == (2,) and later.commit_to == 3


def test_a_message_is_never_planned_before_its_time():
    entries = [(i, NOW + 10 * i) for i in range(20)]
    for now in range(NOW - 5, NOW + 200, 7):
        plan = plan_queue(0, entries, now)
        assert all(entries[o][1] <= now for o in plan.due)


def test_delivered_keeps_body_id_and_time_and_names_the_real_queue():
    props = {"UNIQ_KEY": "AB01", P_DELIVER_AT: str(NOW), P_REAL_QID: "5", "KEYS": "k"}
    scheduled = Message(schedule_topic("orders"), 3, b"body", props, born_timestamp_ms=NOW - 1000, queue_offset=9)
    real = delivered(scheduled)
    assert (real.topic, real.queue_id, real.body, real.born_timestamp_ms) == ("orders", 5, b"body", NOW - 1000)
    assert real.properties == props and real.queue_offset == -1
    assert real_topic("orders") is None and real_topic("%SCHEDULE%") is None


@pytest.mark.parametrize("props", [{}, {P_REAL_QID: "x"}, {P_REAL_QID: "-1"}, {P_REAL_QID: "1" * 10}])
def test_a_record_naming_no_real_queue_delivers_nothing(props):
    assert delivered(Message(schedule_topic("orders"), 0, b"", props)) is None


@pytest.mark.parametrize("text, at", [(None, 0), ("12", 12), ("-5", 0), ("1e9", 0), ("9" * 19, 0)])
def test_a_malformed_delivery_time_reads_as_due_now(text, at):
    assert deliver_at_of({} if text is None else {P_DELIVER_AT: text}) == at
