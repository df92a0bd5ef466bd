"""The pure rules of retries and the dead-letter queue (rocketray.client.retry) and the commit holds
a nack sets (rocketray.client.core.Positions), as tables: no cluster, no clock."""

from __future__ import annotations

import pytest

from rocketray.wire.batch import encode_new_record
from rocketray.wire.message import topic_bytes
from rocketray.client.core import Positions
from rocketray.client.errors import InvalidMessage
from rocketray.client.messages import decode_messages, message_properties
from rocketray.client.retry import (DEFAULT_RETRY_DELAYS, RETRY_PROPERTIES, RetryHold, level_of, parse_delays,
                                    plan_nack, redelivery_fields)
from rocketray.client.types import ReceivedMessage, TopicQueue

NOW = 1_700_000_000_000
DELAYS = parse_delays(DEFAULT_RETRY_DELAYS)


def message(delivery_count: int = 1, topic: str = "orders", **origin) -> ReceivedMessage:
    return ReceivedMessage(topic, 3, 41, "ID41", "k", "paid", {"p": "v"}, b"body", NOW - 5, NOW - 4,
                           delivery_count=delivery_count, **origin)


@pytest.mark.parametrize("text,expected", [
    (DEFAULT_RETRY_DELAYS, (10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000, 420_000, 480_000,
                            540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000)),
    ("100ms 1s 1m 1h 1d", (100, 1000, 60_000, 3_600_000, 86_400_000)),
    ("  5s\t5s ", (5000, 5000)),
    ("0ms", (0,)),
])
def test_delay_schedules(text, expected):
    assert parse_delays(text) == expected


@pytest.mark.parametrize("text,says", [
    ("", "needs 1..64 delays"), ("1x", "'1x' is not a delay"), ("1.5s", "not a delay"), ("-1s", "not a delay"),
    ("5s 1s", "must not get shorter"), (" ".join(["1s"] * 65), "not 65"), (5, "must be a str"),
])
def test_bad_delay_schedules_say_why(text, says):
    with pytest.raises(ValueError, match=says):
        parse_delays(text)


@pytest.mark.parametrize("delay_ms,level", [(0, 0), (10_000, 0), (10_001, 1), (45_000, 2), (7_200_000, 15)])
def test_a_given_delay_goes_to_the_shortest_level_at_least_as_long(delay_ms, level):
    assert level_of(DELAYS, delay_ms) == level


# (name, delivery_count, max_deliveries, delay_ms, topic, queue_id, queues, dead, wait_ms)
PLANS = [
    ("first-failure-waits-the-first-level", 1, 16, None, "%RETRY%billing", 0, 16, False, 10_000),
    ("third-failure-waits-the-third-level", 3, 16, None, "%RETRY%billing", 2, 16, False, 60_000),
    ("past-the-schedule-the-last-level-repeats", 40, 100, None, "%RETRY%billing", 15, 16, False, 7_200_000),
    ("the-max-th-delivery-goes-to-the-dlq", 16, 16, None, "%DLQ%billing", 0, 1, True, 0),
    ("one-before-the-max-is-retried", 15, 16, None, "%RETRY%billing", 14, 16, False, 3_600_000),
    ("max-one-means-no-retry", 1, 1, None, "%DLQ%billing", 0, 1, True, 0),
    ("a-given-delay-is-kept-exactly", 1, 16, 15_000, "%RETRY%billing", 1, 16, False, 15_000),
    ("a-zero-delay-is-the-first-level", 5, 16, 0, "%RETRY%billing", 0, 16, False, 0),
    ("a-given-delay-does-not-postpone-the-dlq", 16, 16, 1000, "%DLQ%billing", 0, 1, True, 0),
]


@pytest.mark.parametrize("name,count,max_deliveries,delay_ms,topic,queue_id,queues,dead,wait_ms", PLANS,
                         ids=[p[0] for p in PLANS])
def test_retry_or_dead_letter(name, count, max_deliveries, delay_ms, topic, queue_id, queues, dead, wait_ms):
    plan = plan_nack(message(count), "billing", DELAYS, max_deliveries, delay_ms, NOW)
    assert (plan.topic, plan.queue_id, plan.queues, plan.dead) == (topic, queue_id, queues, dead)
    assert plan.not_before_ms == NOW + wait_ms
    assert plan.system_properties["RECONSUME_TIME"] == str(count)


@pytest.mark.parametrize("delay_ms,says", [(7_200_001, "over the longest retry delay"), (-1, "must be >= 0")])
def test_a_delay_out_of_range_is_refused(delay_ms, says):
    with pytest.raises(ValueError, match=says):
        plan_nack(message(), "billing", DELAYS, 16, delay_ms, NOW)


def test_a_group_too_long_for_a_retry_topic_is_refused():
    plan_nack(message(), "g" * 120, DELAYS, 16, None, NOW)              # %RETRY% + 120 = 127: fits
    with pytest.raises(ValueError, match="too long for a retry topic"):
        plan_nack(message(), "g" * 121, DELAYS, 16, None, NOW)


def test_a_copy_names_where_the_message_was_first_sent_and_a_copy_of_a_copy_keeps_it():
    first = plan_nack(message(), "billing", DELAYS, 16, None, NOW).system_properties
    assert dict(first) == {"RETRY_TOPIC": "orders", "ORIGIN_QUEUE_ID": "3", "ORIGIN_QUEUE_OFFSET": "41",
                           "ORIGIN_MESSAGE_ID": "ID41", "RECONSUME_TIME": "1", "RETRY_NOT_BEFORE_MS": str(NOW + 10_000)}
    copy = message(2, "%RETRY%billing", origin_topic="orders", origin_queue_id=3, origin_queue_offset=41,
                   origin_msg_id="ID41")
    again = plan_nack(copy, "billing", DELAYS, 16, None, NOW).system_properties
    assert {k: again[k] for k in ("RETRY_TOPIC", "ORIGIN_QUEUE_ID", "ORIGIN_QUEUE_OFFSET", "ORIGIN_MESSAGE_ID")} == {
        "RETRY_TOPIC": "orders", "ORIGIN_QUEUE_ID": "3", "ORIGIN_QUEUE_OFFSET": "41", "ORIGIN_MESSAGE_ID": "ID41"}
    assert again["RECONSUME_TIME"] == "2"


def stored(topic: str, props: dict[str, str], **send) -> ReceivedMessage:
    """A copy as a pull returns it: encoded as the producer does, decoded as the consumer does."""
    record = encode_new_record(topic_bytes(topic), message_properties(send.get("key"), send.get("tags"),
                                                                      send.get("properties"), "COPYID", props),
                               b"body", 0, NOW)
    (m,) = decode_messages(topic, record, 1)
    return m


def test_a_retry_copy_reads_back_as_the_next_delivery_with_its_origin():
    props = plan_nack(message(), "billing", DELAYS, 16, None, NOW).system_properties
    m = stored("%RETRY%billing", dict(props), key="k", tags="paid", properties={"p": "v"})
    assert (m.delivery_count, m.origin_topic, m.origin_queue_id, m.origin_queue_offset, m.origin_msg_id,
            m.not_before_ms) == (2, "orders", 3, 41, "ID41", NOW + 10_000)
    assert (m.msg_id, m.key, m.tags, m.properties) == ("COPYID", "k", "paid", {"p": "v"})   # retry props left out


def test_a_dead_letter_copy_is_a_first_delivery_to_whoever_reads_it():
    props = plan_nack(message(16), "billing", DELAYS, 16, None, NOW).system_properties
    m = stored("%DLQ%billing", dict(props))
    assert (m.delivery_count, m.origin_topic, m.origin_queue_offset, m.not_before_ms) == (1, "orders", 41, 0)


@pytest.mark.parametrize("props,fields", [
    ({}, {}),
    ({"p": "v"}, {}),
    ({"RETRY_TOPIC": "t", "RECONSUME_TIME": "x", "ORIGIN_QUEUE_ID": "-1", "RETRY_NOT_BEFORE_MS": "9" * 30},
     {"delivery_count": 1, "origin_topic": "t", "origin_queue_id": 0, "origin_queue_offset": 0, "origin_msg_id": "",
      "not_before_ms": 0}),
])
def test_malformed_copy_properties_read_as_zero_never_raise(props, fields):
    assert redelivery_fields("%RETRY%g", props) == fields


@pytest.mark.parametrize("name", sorted(RETRY_PROPERTIES))
def test_an_application_may_not_set_a_retry_property(name):
    with pytest.raises(InvalidMessage, match="reserved"):
        message_properties(None, None, {name: "1"}, "ID")


def copy_at(queue_id: int, offset: int, not_before_ms: int) -> ReceivedMessage:
    return ReceivedMessage("%RETRY%g", queue_id, offset, f"c{offset}", None, None, {}, b"", 0, 0, 2, "t", 0, 0, "o",
                           not_before_ms)


def test_the_hold_releases_copies_in_queue_order_when_due():
    hold = RetryHold()
    hold.add([copy_at(0, 0, 100), copy_at(0, 1, 300), copy_at(1, 0, 50), copy_at(0, 2, 200)])
    assert hold.next_due_ms() == 50 and hold.queues() == {TopicQueue("%RETRY%g", 0), TopicQueue("%RETRY%g", 1)}
    assert [(m.queue_id, m.queue_offset) for m in hold.release(99)] == [(1, 0)]
    # offset 2 is due at 200 but waits behind offset 1 (due 300): a queue is released in order
    assert [m.queue_offset for m in hold.release(250)] == [0]
    assert hold.queues() == {TopicQueue("%RETRY%g", 0)} and hold.next_due_ms() == 300 and len(hold) == 2
    assert hold.release(1000, skip={TopicQueue("%RETRY%g", 0)}) == []       # paused
    assert hold.next_due_ms(skip={TopicQueue("%RETRY%g", 0)}) is None
    assert [m.queue_offset for m in hold.release(1000)] == [1, 2] and not hold.queues()


def test_a_dropped_queue_forgets_its_held_copies():
    hold = RetryHold()
    hold.add([copy_at(0, 0, 100), copy_at(1, 0, 100)])
    hold.drop(TopicQueue("%RETRY%g", 0))
    assert [m.queue_id for m in hold.release(100)] == [1]


Q = TopicQueue("orders", 0)


def polled_to_10(*holds: int) -> Positions[TopicQueue]:
    p: Positions[TopicQueue] = Positions()
    p.returned(Q, 10)
    for offset in holds:
        p.hold(Q, offset)
    return p


def test_a_hold_keeps_commit_at_the_held_message_until_released():
    p = polled_to_10(4, 7)
    assert p.to_commit() == {Q: 4}
    p.release(Q, 4)
    assert p.to_commit() == {Q: 7}
    p.hold(Q, 7)                 # a nack retried after it failed holds once and releases once
    p.release(Q, 7)
    assert p.to_commit() == {Q: 10}


def test_a_held_queue_already_committed_up_to_the_hold_has_nothing_to_commit():
    p = polled_to_10(4)
    p.acknowledged(Q, 4)
    assert p.to_commit() == {}


def test_a_seek_or_a_forget_drops_the_holds():
    p = polled_to_10(3)
    p.sought(Q, 8)
    assert p.to_commit() == {Q: 8}
    p.hold(Q, 3)
    p.forget(Q)
    assert p.to_commit() == {} and not p.holds
