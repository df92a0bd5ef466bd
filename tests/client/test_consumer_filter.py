"""Tag filters and seek_to_time in the consumer, one layer: the in-memory cluster of
tests/support/fake_client_cluster.py, whose pulls filter by tag code and whose offset search goes by
store time as a broker's do."""

from __future__ import annotations

import asyncio
import zlib

import pytest

from rocketray.wire.message import Message, encode_record
from rocketray.wire.pull_result import PullResult
from rocketray.client import Consumer, InvalidRequest, Producer, TopicQueue
from rocketray.client.aio import AsyncConsumer
from rocketray.waiting import wait_for
from tests.support.fake_client_cluster import FakeCluster, FakeTransport

TAGS = ("paid", "created", None, "refunded")


class Recording(FakeTransport):
    """Keeps every pull's tag filter and answer."""

    def __init__(self, cluster: FakeCluster) -> None:
        super().__init__(cluster)
        self.filters: list = []
        self.answers: list[PullResult] = []

    def pull(self, *args, tag_filter=None, **kwargs):
        self.filters.append(tag_filter)
        fut = super().pull(*args, tag_filter=tag_filter, **kwargs)
        fut.add_done_callback(lambda f: self.answers.append(f.result()))
        return fut


def setup(queues: int = 2) -> tuple[FakeCluster, Recording]:
    c = FakeCluster()
    c.create_topic("t", queues)
    return c, Recording(c)


def produce_tagged(t: FakeTransport, n: int, tags=TAGS) -> None:
    with Producer(transport=t) as p:
        for i in range(n):
            p.send("t", f"m{i}".encode(), tags=tags[i % len(tags)])


def drain(consumer: Consumer, want: int) -> list:
    got: list = []
    wait_for(lambda: got.extend(consumer.poll(0.05)) or len(got) >= want, 10, f"{want} messages")
    return got


def test_a_consumer_receives_only_its_tags_and_its_commits_pass_the_rest():
    """Only 'paid' and 'refunded' arrive; the pulls carried the expression and brought no other
    body; after a commit the group's offsets are the queues' ends (its lag drains)."""
    c, t = setup(2)
    produce_tagged(t, 40)
    with Consumer(group="g", topics={"t": "paid || refunded"}, transport=t) as con:
        got = drain(con, 20)
        assert sorted(m.tags for m in got) == ["paid"] * 10 + ["refunded"] * 10
        wait_for(lambda: con.poll(0.05) == [] and con.metrics().lag == 0, 10, "the lag to drain")
        con.commit()
    assert {q: c.committed[("g", "t", q)] for q in (0, 1)} == {0: 20, 1: 20}
    assert set(t.filters) == {"paid || refunded"}
    assert sum(a.count for a in t.answers) == 20           # unwanted bodies never came


def test_a_list_of_topics_and_star_read_everything_without_a_filter():
    c, t = setup(1)
    produce_tagged(t, 8)
    for topics in (["t"], "t", {"t": "*"}):
        with Consumer(group=f"g{len(t.filters)}", topics=topics, transport=t) as con:
            assert len(drain(con, 8)) == 8
    assert set(t.filters) == {None}


def _colliding_tags() -> tuple[str, str]:
    """Two different tags with one CRC-32 (found once by brute force over 't<i>')."""
    pair = ("t928096", "t11200040")
    assert zlib.crc32(pair[0].encode()) == zlib.crc32(pair[1].encode())
    return pair


def test_a_message_whose_tag_only_shares_the_code_is_dropped_and_passed():
    """Two tags with one CRC: the broker passes both, the consumer keeps the subscribed one and
    still commits past the other."""
    wanted, other = _colliding_tags()
    c, t = setup(1)
    produce_tagged(t, 4, tags=(wanted, other))
    with Consumer(group="g", topics={"t": wanted}, transport=t) as con:
        got = drain(con, 2)
        assert [m.tags for m in got] == [wanted, wanted]
        assert sum(a.count for a in t.answers) == 4     # the broker cannot tell them apart
        con.commit()
    assert c.committed[("g", "t", 0)] == 4


@pytest.mark.parametrize("topics, says", [
    ({"t": "paid ||"}, "empty tag between"),
    ({"t": ""}, "empty tag expression"),
    ({"t": "paid | refunded"}, "not '|'"),
    ({"t": 5}, "not int"),
    ({"": "*"}, "non-empty str"),
    ({}, "at least one topic"),
    ([], "at least one topic"),
    (7, "not int"),
])
def test_a_bad_subscription_fails_at_construction(topics, says):
    c, t = setup(1)
    with pytest.raises(InvalidRequest, match=says):
        Consumer(group="g", topics=topics, transport=t)
    assert c.members == {}                              # it never joined


def stored_at(c: FakeCluster, queue_id: int, times_ms: list[int]) -> None:
    """Records in queue ``queue_id`` of 't' stored at the given times (a master's positions)."""
    records = c.records[("t", queue_id)]
    for ts in times_ms:
        msg = Message("t", queue_id, f"at{ts}".encode(), born_timestamp_ms=ts)
        records.append(encode_record(msg.with_position(len(records), 0, ts)))


def test_seek_to_time_reads_from_the_first_message_stored_at_or_after_it():
    """Each owned queue moves to its first offset stored at or after the time (its end when all
    are older); a commit then moves the group forward only."""
    c, t = setup(2)
    stored_at(c, 0, [1000, 2000, 3000, 4000])
    stored_at(c, 1, [1500, 2500])
    with Consumer(group="g", topics=["t"], transport=t) as con:
        drain(con, 6)
        con.commit()
        assert con.seek_to_time(2000) == {TopicQueue("t", 0): 1, TopicQueue("t", 1): 1}
        assert sorted(m.store_timestamp_ms for m in drain(con, 4)) == [2000, 2500, 3000, 4000]
        assert con.pending_commits() == {}                 # a replay never moves the commit back
        assert con.seek_to_time(3500, TopicQueue("t", 1)) == {TopicQueue("t", 1): 2}
        assert con.position("t", 1) == 2 and con.position("t", 0) == 4
        with pytest.raises(InvalidRequest):
            con.seek_to_time(-1)
        with pytest.raises(InvalidRequest):
            con.seek_to_time(1.5)
        with pytest.raises(InvalidRequest):
            con.seek_to_time(0, TopicQueue("t", 9))


def test_the_async_consumer_filters_and_seeks_to_a_time():
    c, t = setup(1)
    stored_at(c, 0, [1000, 2000, 3000])

    async def main():
        async with AsyncConsumer(group="g", topics={"t": "*"}, transport=t, poll_timeout_s=0.2) as con:
            assert len(await con.poll(1.0)) == 3
            await con.seek_to_time(2000)
            assert [m.queue_offset for m in await con.poll(1.0)] == [1, 2]

    asyncio.run(main())
