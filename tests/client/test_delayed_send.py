"""Delayed delivery in the client, one layer: the in-memory cluster of
tests/support/fake_client_cluster.py, whose scheduler thread delivers with the brokers' rules
(rocketray.broker.schedule). A delayed send is stored in its queue's schedule queue of the same
broker group, reaches a consumer at or after its time with its msg_id and deliver_at_ms, and bad
times are refused at the call with nothing sent."""

from __future__ import annotations

import asyncio
import time

import pytest

from rocketray.wire.message import decode_record
from rocketray.wire.delayed import LEVELS_MS, MAX_DELAY_MS, P_DELIVER_AT
from rocketray.client import Consumer, InvalidMessage, Producer
from rocketray.client.aio import AsyncProducer
from rocketray.waiting import wait_for
from tests.support.fake_client_cluster import FakeCluster, FakeTransport


def setup() -> tuple[FakeCluster, FakeTransport]:
    c = FakeCluster()
    c.create_topic("t", 4)
    return c, FakeTransport(c)


def now_ms() -> int:
    return int(time.time() * 1000)


def test_a_delayed_message_arrives_at_or_after_its_time_and_an_undelayed_one_at_once():
    c, t = setup()
    with Producer(transport=t) as p:
        sent_at = now_ms()
        late = p.send("t", b"later", key="k", delay_s=0.6)
        at = now_ms() + 300
        soon = p.send("t", b"soon", key="k", deliver_at_ms=at)
        plain = p.send("t", b"now", key="k")
    assert (late.topic, late.queue_offset, soon.queue_offset) == ("t", -1, -1), "no place in its queue yet"
    assert late.queue_id == soon.queue_id == plain.queue_id and plain.queue_offset == 0
    stored = c.records[("%SCHEDULE%t", 0)]     # both wait in the 1 s level of the key's broker group
    assert [decode_record(r)[0].body for r in stored] == [b"later", b"soon"]
    got = []
    with Consumer(group="g", topics=["t"], transport=t, auto_offset_reset="earliest") as con:
        wait_for(lambda: got.extend((m, now_ms()) for m in con.poll(0.05)) or len(got) >= 3, 10, "3 messages")
    by_body = {m.body: (m, seen) for m, seen in got}
    assert [m.body for m, _ in got] == [b"now", b"later", b"soon"], "held behind the longer wait of its level"
    for body, wanted in ((b"later", sent_at + 600), (b"soon", at)):
        m, seen = by_body[body]
        assert m.deliver_at_ms >= wanted - 1 and m.store_timestamp_ms >= m.deliver_at_ms and seen >= m.deliver_at_ms
        assert P_DELIVER_AT not in m.properties
    assert by_body[b"later"][0].msg_id == late.msg_id and by_body[b"now"][0].deliver_at_ms == 0


@pytest.mark.parametrize("kwargs, problem", [
    ({"delay_s": -1}, "delay_s must be"), ({"delay_s": True}, "delay_s must be"),
    ({"delay_s": (MAX_DELAY_MS + 60_000) / 1000}, "over the maximum delay"),
    ({"deliver_at_ms": 1_000}, "in the past"), ({"deliver_at_ms": 1.5e12}, "must be an int"),
    ({"delay_s": 1, "deliver_at_ms": 1}, "not both"),
    ({"properties": {"TIMER_DELIVER_MS": "1"}}, "reserved"), ({"properties": {"REAL_QID": "1"}}, "reserved"),
])
def test_a_bad_delivery_time_or_a_reserved_property_is_refused_at_the_call(kwargs, problem):
    c, t = setup()
    with Producer(transport=t) as p:
        for send in (p.send, p.send_async):
            with pytest.raises(InvalidMessage, match=problem):
                send("t", b"x", **kwargs)
    assert c.puts == 0


def test_a_time_due_already_is_sent_to_its_queue_at_once_with_its_time():
    c, t = setup()
    at = now_ms() - 2000
    with Producer(transport=t) as p:
        r = p.send("t", b"x", deliver_at_ms=at)
    assert r.queue_offset == 0 and not any(topic.startswith("%SCHEDULE%") for topic, _ in c.records)
    with Consumer(group="g", topics=["t"], transport=t, auto_offset_reset="earliest") as con:
        got: list = []
        wait_for(lambda: got.extend(con.poll(0.05)) or got, 5, "the message")
    assert got[0].deliver_at_ms == at


def test_the_longest_delay_waits_in_the_last_level():
    c, t = setup()
    with Producer(transport=t) as p:
        f = p.send_async("t", b"x", key="k", delay_s=MAX_DELAY_MS / 1000 - 5)
        assert f.result(5).queue_offset == -1
    assert [k for k in c.records if k[0] == "%SCHEDULE%t"] == [("%SCHEDULE%t", len(LEVELS_MS) - 1)]


def test_the_async_producer_sends_delayed_messages_too():
    c, t = setup()

    async def main():
        async with AsyncProducer(transport=t) as p:
            return await p.send("t", b"x", delay_s=0.2)

    r = asyncio.run(main())
    assert r.queue_offset == -1
    wait_for(lambda: c.max_offset("t", r.queue_id) == 1, 5, "the delayed message in its queue")
