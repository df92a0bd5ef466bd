"""apache/rocketmq#1094, #7790, #9711: acknowledged consumer offsets survive a failover and the old master's return.

Upstream synced consumer offsets master -> slave by polling (every few seconds), so a slave that
became master, or an old master that restarted and took the role back, served a group's progress
from a stale copy: the group rolled back and re-consumed (#1094: offsets lost on a master switch;
#7790 and #9711: an old master's offsets overwrite the new ones). Here a commit is a record of the
log acknowledged only when every in-sync replica has it (``broker/offsets.py``), so on a real
fast-profile cluster (1 broker group of 3 replicas, all-ack on):

1. a consumer commits offsets ``o1`` (acknowledged); the master ``A`` is killed and a new master
   ``B`` is elected; ``Admin.consumer_progress`` on ``B`` shows committed >= ``o1`` and a new member
   of the group starts at >= ``o1``; it consumes new messages and commits ``o2`` while ``A`` is
   still restarting;
2. ``A`` rejoins as a slave; the third replica is paused until it leaves the SyncStateSet and ``B``
   is killed, so the old master ``A`` is the only electable replica and takes the role back (the
   exact shape of the upstream rollbacks); committed is still >= ``o2`` and a new member starts at >= ``o2``.
"""

from __future__ import annotations

import os

import pytest

from rocketray.waiting import NotYet, wait_for
from rocketray.actors.views import Role

pytestmark = pytest.mark.slow

GROUP = "broker-a"
TOPIC = "orders"
CONSUMER_GROUP = "billing"
ALL_ACK = {"ha.all_ack_in_sync_state_set": "true"}


@pytest.fixture(scope="module")
def ray_here():
    import ray

    started = not ray.is_initialized()
    if started:
        # address="local": a Ray of its own, never one a concurrent `ray start --head` left running
        ray.init(address="local", include_dashboard=False, logging_level="ERROR", log_to_driver=False,
                 object_store_memory=300 * 1024 * 1024, namespace="rocketray-tests")
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture
def cluster(ray_here, tmp_path):
    from rocketray.actors.cluster import start_cluster

    c = start_cluster(f"offsets-{os.getpid()}", controllers=3, groups=1, replicas=3, data_dir=str(tmp_path),
                      profile="fast", overrides=ALL_ACK)
    yield c
    c.stop(delete_data=True)


def produce(name: str, first: int, n: int) -> None:
    from rocketray.client import Producer

    with Producer(name) as p:
        for i in range(first, first + n):
            p.send(TOPIC, f"order {i}".encode(), key=f"account-{i}")


def consume(name: str, want: int, what: str) -> tuple[list, dict[tuple[str, int], int]]:
    """A new member of the group polls until it received ``want`` messages and commits them (retried
    until acknowledged); (the messages, the offsets it committed), then it leaves."""
    from rocketray.client import CommitFailed, Consumer

    got: list = []
    with Consumer(name, group=CONSUMER_GROUP, topics=[TOPIC]) as c:
        def polled():
            got.extend(c.poll(timeout_s=0.5))
            return len(got) >= want or NotYet(f"{len(got)} of {want} messages")

        wait_for(polled, 60, f"{what}: the new member to receive {want} messages", interval_s=0)
        committed = {(m.topic, m.queue_id): 0 for m in got}
        for m in got:
            committed[(m.topic, m.queue_id)] = max(committed[(m.topic, m.queue_id)], m.queue_offset + 1)

        def acked():
            try:
                c.commit(timeout_s=5)
                return True
            except CommitFailed as exc:
                return NotYet(str(exc))

        wait_for(acked, 60, f"{what}: the commit to be acknowledged", interval_s=0.2)
    return got, committed


def progress_at_least(name: str, offsets: dict[tuple[str, int], int], what: str) -> None:
    """Wait until the cluster answers the group's progress, then require it at or past ``offsets``
    (the first answer decides: a rollback may not be waited away)."""
    from rocketray.client import Admin

    (rows,) = wait_for(lambda: (Admin(name, timeout_s=3).consumer_progress(CONSUMER_GROUP),), 60,
                       f"{what}: the new master to answer the group's progress")
    shown = {(r.topic, r.queue_id): r.committed_offset for r in rows}
    behind = {q: (o, shown.get(q)) for q, o in offsets.items() if shown.get(q, -1) < o}
    assert not behind, f"{what}: committed offsets rolled back ((topic, queue) -> (acked, shown)): {behind}"


def starts_at_or_past(messages: list, offsets: dict[tuple[str, int], int], what: str) -> None:
    below = [(m.queue_id, m.queue_offset) for m in messages if m.queue_offset < offsets.get((m.topic, m.queue_id), 0)]
    assert not below, f"{what}: a new member read below the acknowledged commit: {below[:10]}"


def new_master(cluster, old: set[int], what: str) -> int:
    """The replica index of a running master not in ``old`` (wrapped: replica 0 is falsy)."""
    def found():
        m = cluster.master_of(GROUP)
        return (m,) if m is not None and m not in old else NotYet(f"master is r{m}")

    return wait_for(found, 60, f"{what}: a master other than replica(s) {sorted(old)}", interval_s=0.1)[0]


def test_acknowledged_offsets_survive_failover_and_the_old_masters_return(cluster):
    """The upstream offset rollbacks (#1094, #7790, #9711) do not happen: committed never goes back."""
    from rocketray.actors.pipeline import settle
    from rocketray.client import Admin

    name = cluster.spec.name
    Admin(name).create_topic(TOPIC, queues=2)
    produce(name, 0, 100)
    _, o1 = consume(name, 100, "before any failover")
    settle(cluster, in_sync=True)

    a = cluster.wait_for_master(GROUP)
    cluster.kill_broker(GROUP, a, wait_restart=False)
    b = new_master(cluster, {a}, "after killing the master")
    progress_at_least(name, o1, f"new master r{b}")
    produce(name, 100, 50)
    got, o2 = consume(name, 50, f"new master r{b}")
    starts_at_or_past(got, o1, f"new master r{b}")
    assert {m.body for m in got} == {f"order {i}".encode() for i in range(100, 150)}, "exactly the new messages"

    wait_for(lambda: getattr(cluster.broker_status(GROUP, a), "role", None) == Role.SLAVE, 60,
             f"the old master r{a} to rejoin as a slave")
    settle(cluster, in_sync=True)           # r{a} holds the log, o2's commit record included
    third = next(x.replica for x in cluster.spec.brokers_of(GROUP) if x.replica not in (a, b))
    # The third replica first leaves the SyncStateSet (paused: it stops acking), then the new master
    # is killed, so the old master is the only electable replica. Killing the two together is a
    # race, not this shape: the controller may elect the third between the kills (CI, 2026-11-25),
    # and an election's SyncStateSet is its new master alone, so r{a} would stay a slave.
    third_id = cluster.broker_status(GROUP, third).broker_id
    paused = cluster.pause(cluster.broker(GROUP, third))
    try:
        wait_for(lambda: third_id not in cluster.broker_status(GROUP, b).sync_state_set, 60,
                 f"the paused r{third} to leave r{b}'s SyncStateSet")
        cluster.kill_broker(GROUP, b, wait_restart=False)
        back = new_master(cluster, {b, third}, "after pausing the third replica and killing the new master")
    finally:
        cluster.resume_pid(paused)
    assert back == a, "the old master is the only live in-sync replica"
    progress_at_least(name, {q: max(o1.get(q, 0), o) for q, o in o2.items()}, f"old master r{a} back")
    produce(name, 150, 10)
    got, _ = consume(name, 10, f"old master r{a} back")
    starts_at_or_past(got, o2, f"old master r{a} back")
    assert {m.body for m in got} == {f"order {i}".encode() for i in range(150, 160)}, "exactly the new messages"
