"""An admin's reset of a stopped consumer group's offsets on real broker actors: the group's
committed offsets go back (a reset record the brokers fold as an assignment), a new member of the
group reads every message again, and the reset holds on the master elected after the old one is
killed (the record is replicated and acknowledged like a commit)."""

from __future__ import annotations

import pytest
import ray

from rocketray.actors import pipeline
from rocketray.client import Admin, ClientError, Consumer, Producer, SendStatus, TopicQueue
from rocketray.client.socket_transport import SocketTransport
from rocketray.waiting import wait_for

pytestmark = pytest.mark.slow
GROUP = "broker-a"
QUEUES = 2
SENT = 40


def read_all(transport, group: str, expected: set[str], what: str) -> None:
    """A new member of ``group`` receives every message of ``expected`` (and nothing else), commits, closes."""
    with Consumer(group=group, topics=["events"], transport=transport) as c:
        got: list = []
        wait_for(lambda: got.extend(c.poll(0.2)) or {m.msg_id for m in got} >= expected, 60, what)
        assert {m.msg_id for m in got} == expected, what
        assert c.commit() == {TopicQueue("events", q): SENT // QUEUES for q in range(QUEUES)}, what


def committed(admin, group: str) -> list[int] | None:
    """The group's committed offsets per queue, None while a broker group does not answer (a failover)."""
    try:
        return [p.committed_offset for p in admin.consumer_progress(group)]
    except ClientError:
        return None


def test_reset_to_earliest_replays_a_stopped_group_and_survives_a_master_kill(make_cluster):
    """Consume everything, stop the group, reset to earliest: the offsets go from the end to 0 and a
    new member reads all 40 messages again; reset again, kill the master: the new master answers 0
    and a new member reads everything a third time."""
    cluster = make_cluster(controllers=1, replicas=2)
    port = SocketTransport(cluster)
    admin = Admin(transport=port)
    admin.create_topic("events", queues=QUEUES)
    with Producer(transport=port) as producer:
        results = [producer.send("events", f"event {i}".encode()) for i in range(SENT)]
    assert all(r.status is SendStatus.SEND_OK for r in results)
    sent = {r.msg_id for r in results}
    ends = [SENT // QUEUES] * QUEUES

    read_all(port, "audit", sent, "the first read")
    wait_for(lambda: admin.group_members("audit") == [], 30, "the closed member to leave the group")
    changes = admin.reset_offsets("audit", "events", "earliest")
    assert [(ch.before, ch.after) for ch in changes] == [(e, 0) for e in ends]
    assert committed(admin, "audit") == [0] * QUEUES
    read_all(port, "audit", sent, "everything again after the reset")

    wait_for(lambda: admin.group_members("audit") == [], 30, "the second member to leave the group")
    assert [ch.after for ch in admin.reset_offsets("audit", "events", "earliest")] == [0] * QUEUES
    pipeline.settle(cluster, in_sync=True)            # the other replica is electable
    old = cluster.wait_for_master(GROUP)
    ray.kill(cluster.broker(GROUP, old), no_restart=True)
    wait_for(lambda: cluster.master_of(GROUP) not in (None, old), 60, "a new master")
    wait_for(lambda: committed(admin, "audit") == [0] * QUEUES, 60,
             "the new master to answer the reset offsets")
    read_all(port, "audit", sent, "everything again from the new master")
    port.close()
