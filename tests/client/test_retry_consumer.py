"""``Consumer.nack``, the group's retry topic and its dead-letter topic, one layer: the in-memory
cluster of tests/support/fake_client_cluster.py behind the Transport protocol, no Ray.

The fast schedule (``client.retry_delays`` "100ms 200ms 500ms 1s 2s 5s") keeps the waits short;
every wait is for a predicate with a deadline."""

from __future__ import annotations

import threading
import time

import pytest

from rocketray.wire.message import decode_record
from rocketray.client import Consumer, InvalidRequest, Producer, SendFailed, TopicQueue
from rocketray.client.retry import FAST_RETRY_DELAYS
from rocketray.wire.put_result import PutStatus
from rocketray.ha.ack import refused
from rocketray.waiting import wait_for
from tests.support.fake_client_cluster import FakeCluster, FakeTransport

FAST = {"consumer_heartbeat_interval_ms": 20, "route_refresh_ms": 50, "retry_delays": FAST_RETRY_DELAYS}
RETRY, DLQ = "%RETRY%g", "%DLQ%g"


def cluster(queues: int = 2) -> tuple[FakeCluster, FakeTransport]:
    c = FakeCluster()
    c.create_topic("t", queues)
    return c, FakeTransport(c)


def send(t: FakeTransport, n: int = 1, **kw) -> None:
    with Producer(transport=t) as p:
        for i in range(n):
            p.send("t", f"m{i}".encode(), **kw)


def next_messages(con: Consumer, want: int = 1, timeout_s: float = 10.0) -> list:
    got: list = []
    wait_for(lambda: got.extend(con.poll(0.05)) or len(got) >= want, timeout_s, f"{want} message(s)")
    return got


def committed(c: FakeCluster, topic: str, queue_id: int) -> int | None:
    return c.committed.get(("g", topic, queue_id))


def test_a_nacked_message_comes_back_after_its_delay_as_delivery_2():
    c, t = cluster(1)
    send(t, key="k", tags="paid", properties={"p": "v"})
    with Consumer(group="g", topics=["t"], transport=t, **FAST) as con:
        (m,) = next_messages(con)
        assert m.delivery_count == 1 and m.origin_topic is None
        nacked_ms = time.time() * 1000
        result = con.nack(m, delay_s=0.3)
        assert (result.topic, result.queue_id) == (RETRY, 2)        # the 200ms level is too short: 500ms
        assert len(c.topics[RETRY]) == 6                           # one queue per level of the schedule
        con.commit()
        assert committed(c, "t", 0) == 1                           # the copy is stored: the original is done
        (again,) = next_messages(con)
        received_ms = time.time() * 1000
        assert again.delivery_count == 2 and again.queue == TopicQueue(RETRY, 2)
        assert (again.origin_topic, again.origin_queue_id, again.origin_queue_offset, again.origin_msg_id) == (
            "t", 0, 0, m.msg_id)
        assert (again.body, again.key, again.tags, again.properties) == (m.body, "k", "paid", {"p": "v"})
        assert again.not_before_ms == pytest.approx(nacked_ms + 300, abs=50) and received_ms >= again.not_before_ms
        assert again.msg_id != m.msg_id                             # a copy is a stored message of its own
        con.commit()
        assert committed(c, RETRY, 2) == 1
        assert con.metrics().nacked == 1


def test_after_max_deliveries_it_is_in_the_dead_letter_topic_and_not_delivered_again():
    c, t = cluster(1)
    send(t)
    with Consumer(group="g", topics=["t"], transport=t, max_deliveries=3, **FAST) as con:
        counts = []
        for _ in range(3):
            (m,) = next_messages(con)
            counts.append(m.delivery_count)
            result = con.nack(m, delay_s=0)
            con.commit()
        assert counts == [1, 2, 3] and result.topic == DLQ and len(c.records[(DLQ, 0)]) == 1
        deadline = time.monotonic() + 1.0                          # two levels' worth: nothing comes back
        while time.monotonic() < deadline:
            assert con.poll(0.1) == []
        assert con.metrics().dead_lettered == 1 and con.metrics().nacked == 2
        assert TopicQueue(DLQ, 0) not in con.assignment()          # nobody reads a dead-letter topic by itself

    # an operator reads it like any topic, sees where it came from, and replays it there
    with Consumer(group="ops", topics=[DLQ], transport=t, **FAST) as ops, Producer(transport=t) as p:
        (dead,) = next_messages(ops)
        assert (dead.delivery_count, dead.origin_topic, dead.origin_queue_offset, dead.body) == (1, "t", 0, b"m0")
        p.send(dead.origin_topic, dead.body, key=dead.key, tags=dead.tags, properties=dead.properties)
        ops.commit()
    assert len(c.records[("t", 0)]) == 2


def test_a_new_consumer_of_the_group_gets_the_pending_retry():
    """Durability is the topic's: a member that nacked and left (a restart) leaves the copy to the next."""
    c, t = cluster(1)
    send(t)
    with Consumer(group="g", topics=["t"], transport=t, **FAST) as first:
        (m,) = next_messages(first)
        first.nack(m, delay_s=0.4)
        first.commit()
    with Consumer(group="g", topics=["t"], transport=t, **FAST) as second:
        (again,) = next_messages(second)
        assert (again.delivery_count, again.origin_msg_id, again.body) == (2, m.msg_id, b"m0")
        assert time.time() * 1000 >= again.not_before_ms


def failing_retry_puts(c: FakeCluster, gate: threading.Event | None = None) -> list[str]:
    """Refuse (or, with ``gate``, hold until it is set) every put to the retry topic."""
    seen: list[str] = []

    def hook(group, batch):
        topic = decode_record(batch.data, 0)[0].topic
        if topic != RETRY:
            return None
        seen.append(topic)
        if gate is None:
            return refused(PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH)
        gate.wait(10)
        return None

    c.put_hook = hook
    return seen


def test_a_failed_nack_raises_and_commit_stops_short_of_the_message():
    """The rule that keeps a nack from losing a message: the original counts as processed only once
    its copy is acknowledged. Commit after a failed nack leaves the message's offset uncommitted,
    so the group reads it again from its own queue (a new member here)."""
    c, t = cluster(1)
    send(t, 3)
    with Consumer(group="g", topics=["t"], transport=t, send_timeout_ms=300, **FAST) as con:
        got = next_messages(con, 3)
        c.create_topic(RETRY, 6)
        failing_retry_puts(c)
        with pytest.raises(SendFailed):
            con.nack(got[1], delay_s=0)
        con.commit()
        assert committed(c, "t", 0) == 1                           # up to, not past, the message nacked
        assert con.commit() == {} and con.pending_commits() == {}  # still held
    with Consumer(group="g", topics=["t"], transport=t, **FAST) as again:
        assert [m.body for m in next_messages(again, 2)] == [b"m1", b"m2"]


def test_a_commit_while_the_copy_is_in_flight_does_not_pass_the_message():
    c, t = cluster(1)
    send(t, 2)
    gate = threading.Event()
    with Consumer(group="g", topics=["t"], transport=t, **FAST) as con:
        got = next_messages(con, 2)
        c.create_topic(RETRY, 6)
        seen = failing_retry_puts(c, gate)
        nacking = threading.Thread(target=con.nack, args=(got[0],), kwargs={"delay_s": 0})
        nacking.start()
        wait_for(lambda: seen, 10, "the copy's put to start")
        con.commit_async().result(10)                             # another thread commits meanwhile
        assert committed(c, "t", 0) == 0                           # the nacked message is offset 0
        gate.set()
        nacking.join(10)
        con.commit()
        assert committed(c, "t", 0) == 2


def test_a_retry_nacked_again_succeeds_and_releases_the_hold():
    c, t = cluster(1)
    send(t)
    with Consumer(group="g", topics=["t"], transport=t, send_timeout_ms=300, **FAST) as con:
        (m,) = next_messages(con)
        c.create_topic(RETRY, 6)
        failing_retry_puts(c)
        with pytest.raises(SendFailed):
            con.nack(m)
        c.put_hook = None
        con.nack(m)
        assert con.commit() == {TopicQueue("t", 0): 1}


def test_a_held_copy_blocks_neither_other_queues_nor_shorter_delays():
    c, t = cluster(1)
    send(t, 2)
    with Consumer(group="g", topics=["t"], transport=t, **FAST) as con:
        first, second = next_messages(con, 2)
        con.nack(first, delay_s=5)                                 # the 5s level
        con.nack(second, delay_s=0.1)                              # the 100ms level
        con.commit()
        send(t)
        got = next_messages(con, 2, timeout_s=3)                   # well before the 5 s copy
        assert sorted(m.body for m in got) == [b"m0", b"m1"]       # the new m0 and m1's copy
        assert con.metrics().held == 1
        con.commit()
        assert committed(c, RETRY, 5) is None                      # nothing of the held queue is committed


def test_a_retry_topic_made_by_another_member_is_read_without_a_restart():
    c, t = cluster(2)
    with Consumer(group="g", topics=["t"], transport=t, client_id="a", **FAST) as a, \
            Consumer(group="g", topics=["t"], transport=t, client_id="b", **FAST) as b:
        wait_for(lambda: (a.poll(0.02), b.poll(0.02)) and len(a.assignment()) == len(b.assignment()) == 1, 10,
                 "the split of 2 queues")
        send(t, 2)
        got = next_messages(a) + next_messages(b)
        for m in got:
            (a if m.queue in a.assignment() else b).nack(m, delay_s=0)

        def both_read_retries() -> bool:
            a.poll(0.02), b.poll(0.02)
            return all(any(q.topic == RETRY for q in x.assignment()) for x in (a, b))

        wait_for(both_read_retries, 10, "both members to own retry queues")
        assert len(a.assignment()) + len(b.assignment()) == 2 + 6


@pytest.mark.parametrize("delay_s,says", [(-1, "delay_s must be"), ("1", "delay_s must be"),
                                          (6, "over the longest retry delay")])
def test_a_bad_delay_is_refused_and_changes_nothing(delay_s, says):
    c, t = cluster(1)
    send(t)
    with Consumer(group="g", topics=["t"], transport=t, **FAST) as con:
        (m,) = next_messages(con)
        with pytest.raises(InvalidRequest, match=says):
            con.nack(m, delay_s=delay_s)
        assert RETRY not in c.topics and con.commit() == {TopicQueue("t", 0): 1}


def test_a_message_of_another_topic_is_refused():
    c, t = cluster(1)
    c.create_topic("other", 1)
    send(t)
    with Consumer(group="g", topics=["t"], transport=t, **FAST) as con, \
            Consumer(group="h", topics=["other", "t"], transport=t, **FAST) as other:
        (m,) = next_messages(other)
        assert m.topic == "t"
        with Producer(transport=t) as p:
            p.send("other", b"x")
        foreign = [x for x in next_messages(other) if x.topic == "other"]
        with pytest.raises(InvalidRequest, match="a message this consumer polled"):
            con.nack(foreign[0])
        with pytest.raises(InvalidRequest):
            con.nack("not a message")


def test_bad_retry_settings_fail_at_construction():
    _, t = cluster(1)
    with pytest.raises(InvalidRequest, match="retry_delays"):
        Consumer(group="g", topics=["t"], transport=t, retry_delays="soon")
    with pytest.raises(InvalidRequest, match="max_deliveries"):
        Consumer(group="g", topics=["t"], transport=t, max_deliveries=0)
