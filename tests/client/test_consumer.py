"""The consumer, one layer: an in-memory cluster behind the Transport protocol
(tests/support/fake_client_cluster.py), no Ray, no sockets.

Tests marked "(defect)" failed on the client before these rules: a running group never read queues
added to its topic; a pull refused as ILLEGAL made poll raise after other queues' messages were
taken, and the next commit skipped them; an out-of-range setting passed construction; commit tried
broker groups one after another under one deadline; close did not wait for a heartbeat in flight,
which then added the member back after it left."""

from __future__ import annotations

import threading
import time

import pytest

from rocketray.wire.pull_result import PullResult, PullStatus
from rocketray.client import (Admin, ClientClosed, CommitFailed, Consumer, InvalidRequest, Producer, TopicNotFound,
                              TopicQueue)
from rocketray.client.transport import Unanswered
from rocketray.waiting import wait_for
from tests.support.fake_client_cluster import FakeCluster, FakeTransport

FAST = {"consumer_heartbeat_interval_ms": 20, "route_refresh_ms": 50}


def cluster(queues: int = 2) -> tuple[FakeCluster, FakeTransport]:
    c = FakeCluster()
    c.create_topic("t", queues)
    return c, FakeTransport(c)


def produce(t: FakeTransport, n: int, **send) -> None:
    with Producer(transport=t) as p:
        for i in range(n):
            p.send("t", f"m{i}".encode(), **send)


def drain(consumer: Consumer, want: int, timeout_s: float = 10.0) -> list:
    got: list = []
    wait_for(lambda: got.extend(consumer.poll(0.05)) or len(got) >= want, timeout_s, f"{want} messages")
    return got


def test_a_running_group_reads_queues_added_to_its_topic():
    """(defect) A topic of 2 queues extended to 8 while a member reads it: the member owns and reads
    all 8 within its route refresh; it never rebalanced without a membership change."""
    c, t = cluster(2)
    with Consumer(group="g", topics=["t"], transport=t, **FAST) as con:
        drain_started = time.monotonic()
        con.poll(0.05)
        assert len(con.assignment()) == 2
        Admin(transport=t).create_topic("t", queues=8)
        produce(t, 8)                               # round robin: one message in every queue
        got = drain(con, 8)
        assert {m.queue_id for m in got} == set(range(8)) and len(con.assignment()) == 8
        assert time.monotonic() - drain_started < 5
        assert con.metrics().rebalances == 2


def test_two_members_split_the_new_queues_too():
    """Both members of a group pick the extension up and split all queues between them."""
    c, t = cluster(2)
    with Consumer(group="g", topics=["t"], transport=t, client_id="a", **FAST) as a, \
            Consumer(group="g", topics=["t"], transport=t, client_id="b", **FAST) as b:
        Admin(transport=t).create_topic("t", queues=6)

        def split() -> bool:
            a.poll(0.02), b.poll(0.02)
            return sorted(a.assignment() + b.assignment()) == [TopicQueue("t", q) for q in range(6)]

        wait_for(split, 10, "both members to own the 6 queues between them")
        assert len(a.assignment()) == len(b.assignment()) == 3


def test_a_new_queue_is_owned_within_a_route_refresh_and_a_heartbeat():
    """The pick-up takes at most route_refresh_ms + one heartbeat (+ a poll): with the defaults
    (5 s + 1 s; fast profile 1 s + 0.3 s) a new queue is read within 10 s."""
    from rocketray.client import ClientConfig
    from rocketray.config import profile_config

    c, t = cluster(2)
    settings = {"consumer_heartbeat_interval_ms": 50, "route_refresh_ms": 400}
    with Consumer(group="g", topics=["t"], transport=t, **settings) as con:
        con.poll(0.05)
        extended = time.monotonic()
        Admin(transport=t).create_topic("t", queues=3)
        wait_for(lambda: con.poll(0.01) is not None and len(con.assignment()) == 3, 10, "the new queue")
        assert time.monotonic() - extended <= (400 + 50) / 1000 + 2.0
    for cfg in (ClientConfig(), profile_config("fast").client):
        assert cfg.route_refresh_ms + cfg.consumer_heartbeat_interval_ms <= 6_000


def test_an_illegal_pull_never_loses_what_poll_took():
    """(defect) One queue's pull is refused as ILLEGAL while another's returns messages: poll returns
    those messages (the error comes with the next poll), and no commit ever covers a message poll
    did not return. Raising mid-poll dropped the taken messages, and the next commit skipped them."""
    for _ in range(10):                # which answer is handled first varies between rounds
        c, t = cluster(2)
        produce(t, 4, key="k")         # all on one queue
        full = next(q for q in range(2) if c.records[("t", q)])
        c.pull_hook = lambda g, topic, q, o, n: (PullResult(PullStatus.ILLEGAL, remark="scripted")
                                                 if q != full else None)
        with Consumer(group="g", topics=["t"], transport=t) as con:
            handed, errors = [], 0
            deadline = time.monotonic() + 10
            while (len(handed) < 4 or not errors) and time.monotonic() < deadline:
                try:
                    handed += con.poll(0.05)
                except InvalidRequest:
                    errors += 1
            con.commit()
        assert errors >= 1 and len(handed) == 4
        assert c.committed[("g", "t", full)] == 1 + max(m.queue_offset for m in handed)


@pytest.mark.parametrize("setting", [{"poll_max_messages": 5000}, {"poll_max_bytes": 0},
                                     {"consumer_heartbeat_interval_ms": 1}, {"max_poll_interval_ms": 5},
                                     {"route_refresh_ms": True}, {"poll_timeout": 3}])
def test_invalid_settings_fail_at_construction(setting):
    """(defect) A setting the broker would refuse (e.g. poll_max_messages above its 4096) is
    InvalidRequest naming it when the consumer is made, not an error in a later poll."""
    c, t = cluster()
    with pytest.raises(InvalidRequest, match=next(iter(setting))):
        Consumer(group="g", topics=["t"], transport=t, **setting)
    assert not c.heartbeats                           # nothing joined


def test_commit_commits_broker_groups_concurrently():
    """(defect) Queue 0 on broker-a (each commit attempt times out after 0.3 s), queue 1 on
    broker-b: a commit with a 1 s deadline gets broker-b acknowledged and says which failed; one
    after another, broker-a's attempts used the whole deadline first."""
    c, t = cluster(2)
    produce(t, 2)
    c.commit_hook = lambda group, cg, entries: ((time.sleep(0.3), Unanswered("TIMEOUT"))[1]
                                                if group == "broker-a" else None)
    with Consumer(group="g", topics=["t"], transport=t) as con:
        drain(con, 2)
        started = time.monotonic()
        with pytest.raises(CommitFailed) as exc:
            con.commit(timeout_s=1.0)
        assert time.monotonic() - started < 4.0
        c.commit_hook = None
    assert exc.value.retriable and exc.value.committed == {TopicQueue("t", 1): 1}
    assert exc.value.failed == {TopicQueue("t", 0): 1}
    assert c.committed == {("g", "t", 1): 1}


def test_close_waits_for_a_heartbeat_in_flight_before_leaving():
    """(defect) A heartbeat is in flight (the controller has not answered) when close() runs: the
    leave goes after it, so the member is gone. Before, the leave went first and the late
    heartbeat added the member back for a whole heartbeat timeout."""
    c, t = cluster(1)
    con = Consumer(group="g", topics=["t"], transport=t, client_id="m", **FAST)
    entered, release = threading.Event(), threading.Event()

    def slow(req):
        if not req.leaving and threading.current_thread().name == "rocketray-consumer-heartbeat":
            entered.set()
            release.wait(5)
        return None

    c.heartbeat_hook = slow
    assert entered.wait(5)
    threading.Timer(0.1, release.set).start()
    con.close()
    assert c.live_members("g") == ()
    assert c.heartbeats[-1].leaving and all(not h.leaving for h in c.heartbeats[:-1])


def test_commit_offsets_commits_exactly_those():
    """commit(offsets=...) commits the given offsets (typed keys or pairs), nothing else; a bad
    offset or queue is InvalidRequest before anything is sent; one past the end is refused by the
    broker: CommitFailed, not retriable."""
    c, t = cluster(2)
    produce(t, 6)
    with Consumer(group="g", topics=["t"], transport=t) as con:
        drain(con, 6)
        assert con.commit(offsets={TopicQueue("t", 0): 2}) == {TopicQueue("t", 0): 2}
        assert c.committed == {("g", "t", 0): 2}
        assert con.commit(offsets={("t", 1): 1}) == {TopicQueue("t", 1): 1}
        for bad in [{TopicQueue("t", 0): -1}, {TopicQueue("t", 9): 1}, {"t": 1}, {TopicQueue("t", 0): True}]:
            with pytest.raises(InvalidRequest):
                con.commit(offsets=bad)
        with pytest.raises(CommitFailed) as exc:
            con.commit(offsets={TopicQueue("t", 0): 99})
        assert not exc.value.retriable
        assert con.commit() == {TopicQueue("t", 0): 3, TopicQueue("t", 1): 3}


def test_commit_async_runs_in_order_and_calls_back_on_the_commit_thread():
    c, t = cluster(1)
    produce(t, 3)
    seen: list = []
    with Consumer(group="g", topics=["t"], transport=t) as con:
        drain(con, 3)
        first = con.commit_async(offsets={TopicQueue("t", 0): 1},
                                 callback=lambda offsets, error: seen.append((offsets, error,
                                                                              threading.current_thread().name)))
        second = con.commit_async(callback=lambda offsets, error: seen.append((offsets, error, None)))
        assert first.result(5) == {TopicQueue("t", 0): 1} and second.result(5) == {TopicQueue("t", 0): 3}
    assert seen[0][:2] == ({TopicQueue("t", 0): 1}, None) and seen[0][2].startswith("rocketray-commit-async")
    assert seen[1][:2] == ({TopicQueue("t", 0): 3}, None)
    assert c.committed == {("g", "t", 0): 3}


class Recorder:
    def __init__(self, consumer_box: list, commit_on_revoke: bool = True) -> None:
        self.events: list[tuple[str, list[TopicQueue]]] = []
        self.box = consumer_box
        self.commit_on_revoke = commit_on_revoke

    def on_revoked(self, queues):
        self.events.append(("revoked", list(queues)))
        if self.commit_on_revoke:
            self.box[0].commit()                 # the listener may call the consumer

    def on_assigned(self, queues):
        self.events.append(("assigned", list(queues)))


def test_rebalance_listener_hears_revocations_before_queues_leave():
    """on_assigned after queues arrive, on_revoked before they leave (a commit there is acknowledged
    before the other member reads them), and on_revoked of everything on close."""
    c, t = cluster(2)
    produce(t, 4)
    box: list = []
    rec = Recorder(box)
    a = Consumer(group="g", topics=["t"], transport=t, client_id="a", listener=rec, **FAST)
    box.append(a)
    drain(a, 4)
    assert rec.events == [("assigned", [TopicQueue("t", 0), TopicQueue("t", 1)])]
    with Consumer(group="g", topics=["t"], transport=t, client_id="b", **FAST) as b:
        wait_for(lambda: a.poll(0.02) is not None and len(a.assignment()) == 1, 10, "a to give a queue up")
        assert rec.events[1] == ("revoked", [TopicQueue("t", 1)])
        assert c.committed[("g", "t", 1)] == 2            # committed inside on_revoked
        wait_for(lambda: b.poll(0.02) is not None and b.assignment() == [TopicQueue("t", 1)], 10, "b's queue")
        assert b.poll(0.1) == []                         # nothing to read again: committed first
    a.close()
    assert rec.events[-1] == ("revoked", [TopicQueue("t", 0)])


def test_pause_and_resume():
    """A paused queue returns nothing and keeps its position; resumed, it is read from there."""
    c, t = cluster(2)
    with Consumer(group="g", topics=["t"], transport=t) as con:
        con.poll(0.05)
        with pytest.raises(InvalidRequest, match="not assigned"):
            con.pause(TopicQueue("t", 7))
        con.pause(TopicQueue("t", 0))
        assert con.paused() == [TopicQueue("t", 0)]
        produce(t, 4)
        got = drain(con, 2)
        time_left = con.poll(0.2)
        assert {m.queue_id for m in got + time_left} == {1} and len(got + time_left) == 2
        con.resume(TopicQueue("t", 0))
        assert sorted(m.queue_offset for m in drain(con, 2) if m.queue_id == 0) == [0, 1]


def test_seek_replays_and_skips():
    """seek below the committed offset replays (reading past the broker's committed floor);
    seek_to_end skips the backlog and commit stores it; seek_to_beginning reads from 0."""
    c, t = cluster(1)
    produce(t, 5)
    with Consumer(group="g", topics=["t"], transport=t) as con:
        assert [m.queue_offset for m in drain(con, 5)] == [0, 1, 2, 3, 4]
        con.commit()
        con.seek("t", 0, 2)
        assert [m.queue_offset for m in drain(con, 3)] == [2, 3, 4]
        assert con.pending_commits() == {}               # a replay never moves the commit back
        con.seek_to_beginning()
        assert [m.queue_offset for m in drain(con, 5)] == [0, 1, 2, 3, 4]
        produce(t, 3)
        con.seek_to_end()
        assert con.position("t", 0) == 8 and con.poll(0.1) == []
        assert con.commit() == {TopicQueue("t", 0): 8}
        with pytest.raises(InvalidRequest):
            con.seek("t", 3, 0)
        with pytest.raises(InvalidRequest):
            con.seek("t", 0, -1)


def test_a_member_that_stops_polling_leaves_and_rejoins_on_its_next_poll():
    """After max_poll_interval_ms without poll the member leaves (the other takes its queues); its
    next poll joins again and the split comes back."""
    c, t = cluster(2)
    with Consumer(group="g", topics=["t"], transport=t, client_id="a", max_poll_interval_ms=200, **FAST) as a, \
            Consumer(group="g", topics=["t"], transport=t, client_id="b", max_poll_interval_ms=60_000, **FAST) as b:
        wait_for(lambda: (a.poll(0.02), b.poll(0.02)) and len(a.assignment()) == 1 == len(b.assignment()), 10,
                 "the two members to split the queues")
        wait_for(lambda: b.poll(0.02) is not None and len(b.assignment()) == 2, 10, "b to take a's queue")
        assert c.live_members("g") == ("b",)
        wait_for(lambda: (a.poll(0.02), b.poll(0.02)) and len(a.assignment()) == 1 == len(b.assignment()), 10,
                 "a to be back")


def test_metrics_received_lag_and_rebalances():
    c, t = cluster(1)
    produce(t, 5)
    with Consumer(group="g", topics=["t"], transport=t, poll_max_messages=2) as con:
        got = con.poll(1.0)
        m = con.metrics()
        assert (m.received, m.assigned, m.rebalances, m.lag) == (len(got), 1, 1, 5 - len(got))
        assert m.lag_by_queue == {TopicQueue("t", 0): 5 - len(got)}
        drain(con, 5 - len(got))
        con.commit()
        m = con.metrics()
        assert (m.received, m.lag, m.committed) == (5, 0, 1)


def test_topic_not_found_names_the_topic_and_closed_consumers_refuse():
    c, t = cluster(1)
    with pytest.raises(TopicNotFound) as exc:
        Consumer(group="g", topics=["nope"], transport=t)
    assert exc.value.topic == "nope" and "'nope'" in str(exc.value)
    con = Consumer(group="g", topics=["t"], transport=t)
    con.close()
    con.close()
    for call in (lambda: con.poll(0), con.commit, lambda: con.commit_async()):
        with pytest.raises(ClientClosed):
            call()
