"""Delayed delivery on real broker actors through a master kill: delayed messages sent through the
client port wait in the broker group's schedule queues; the master is killed while most are pending;
the new master's scheduler delivers every one at or after its time, none lost (a message put but not
yet committed by the old master's scheduler may come twice, with its msg_id)."""

from __future__ import annotations

import time

import pytest

from rocketray.actors import pipeline
from rocketray.client import Consumer, Producer, SendStatus
from rocketray.client.admin import Admin
from rocketray.client.socket_transport import SocketTransport
from rocketray.waiting import wait_for

pytestmark = pytest.mark.slow
GROUP = "broker-a"


def test_delayed_messages_pending_when_the_master_dies_all_arrive_at_or_after_their_time(make_cluster):
    cluster = make_cluster(controllers=1, replicas=3)
    port = SocketTransport(cluster)
    Admin(transport=port).create_topic("reminders", queues=4)
    pipeline.settle(cluster, in_sync=True)          # a master lost now leaves an electable replica
    due: dict[str, int] = {}
    with Producer(transport=port) as producer:
        start_ms = int(time.time() * 1000)
        for i in range(60):                         # due over 1..12 s, spread over levels and queues
            r = producer.send("reminders", f"r{i}".encode(), deliver_at_ms=start_ms + 1000 + (i * 7919) % 11_000)
            assert r.status is SendStatus.SEND_OK and r.queue_offset == -1
            due[r.msg_id] = start_ms + 1000 + (i * 7919) % 11_000
    old = cluster.wait_for_master(GROUP)
    wait_for(lambda: min(due.values()) <= time.time() * 1000, 10, "the first reminder to fall due")
    kill_ms = int(time.time() * 1000)
    cluster.kill_broker(GROUP, old, wait_restart=False)
    assert sum(at > kill_ms + 1000 for at in due.values()) > len(due) // 2, "most still pending: the new master's"

    seen: dict[str, list] = {}
    with Consumer(group="nagging", topics=["reminders"], transport=port) as consumer:
        def all_seen() -> bool:
            for m in consumer.poll(0.5):
                seen.setdefault(m.msg_id, []).append((m, int(time.time() * 1000)))
            consumer.commit()
            return set(due) <= set(seen)
        wait_for(all_seen, 120, lambda: f"every reminder: {len(set(due) - set(seen))} of {len(due)} missing")
    assert cluster.wait_for_master(GROUP) != old
    for msg_id, copies in seen.items():
        assert msg_id in due, f"an unknown message {msg_id}"
        for m, polled_ms in copies:
            assert m.deliver_at_ms == due[msg_id] and m.store_timestamp_ms >= due[msg_id], (m, due[msg_id])
            assert polled_ms >= due[msg_id]
    late = [copies[0][0].store_timestamp_ms - due[msg_id] for msg_id, copies in seen.items()]
    twice = sum(len(c) > 1 for c in seen.values())
    print(f"delivered {len(seen)} of {len(due)}, {twice} twice; store time after due: max {max(late)} ms")
    port.close()
