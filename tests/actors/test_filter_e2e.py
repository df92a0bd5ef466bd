"""Tag filters and offsets by time on real broker actors, through both client transports: the client
port (``SocketTransport``: PULL frames with the expression, SEARCH_OFFSET frames) and Ray actor calls
(``RayTransport``: ``BrokerService.pull(tag_filter=)``, ``search_offsets``)."""

from __future__ import annotations

import datetime

import pytest

from rocketray.client import Admin, Consumer, Producer, SendStatus, TopicQueue
from rocketray.client.ray_transport import RayTransport
from rocketray.client.socket_transport import SocketTransport
from rocketray.waiting import wait_for

pytestmark = pytest.mark.slow

TAGS = ("paid", "created", "refunded")      # three tags over four round-robin queues: every queue has each


def test_filtered_groups_and_seek_to_time_on_both_transports(make_cluster):
    """Each transport's group receives exactly the paid and refunded messages, and its commits reach
    every queue's end; seek_to_time and a reset by time land on the first message stored then."""
    cluster = make_cluster(controllers=1, replicas=2)
    port, ray_calls = SocketTransport(cluster), RayTransport(cluster)
    Admin(transport=port).create_topic("orders", queues=4)
    sent: dict[str, set[str]] = {}
    with Producer(transport=port) as producer:
        results = [producer.send("orders", f"order {i}".encode(), tags=TAGS[i % 3]) for i in range(80)]
    assert all(r.status is SendStatus.SEND_OK for r in results)
    for i, r in enumerate(results):
        sent.setdefault(TAGS[i % 3], set()).add(r.msg_id)
    wanted = sent["paid"] | sent["refunded"]
    ends = {TopicQueue("orders", q): 20 for q in range(4)}

    for name, transport in (("port", port), ("ray", ray_calls)):
        with Consumer(group=f"payments-{name}", topics={"orders": "paid || refunded"}, transport=transport) as c:
            got: list = []
            wait_for(lambda: got.extend(c.poll(0.2)) or len(got) >= len(wanted), 60, f"{name}: the wanted messages")
            assert {m.msg_id for m in got} == wanted and {m.tags for m in got} == {"paid", "refunded"}
            wait_for(lambda: c.poll(0.1) == [] and c.metrics().lag == 0, 30, f"{name}: the lag to drain")
            assert c.commit() == ends, name                         # past the unwanted messages too

            stamps = {m.msg_id: m.store_timestamp_ms for m in got}
            at_ms = min(ts for mid, ts in stamps.items() if mid in {r.msg_id for r in results[40:]})   # mid-run
            moved = c.seek_to_time(at_ms)
            assert set(moved) == set(ends) and all(0 < o <= 20 for o in moved.values()), (name, moved)
            again: list = []
            wait_for(lambda: again.extend(c.poll(0.2)) or {m.queue for m in again} == set(ends), 30,
                     f"{name}: messages again after seek_to_time")
            assert min(m.store_timestamp_ms for m in again) >= at_ms

    admin = Admin(transport=ray_calls)
    first = datetime.datetime.fromtimestamp(0, datetime.timezone.utc)
    assert [ch.after for ch in admin.reset_offsets("fresh", "orders", first)] == [0, 0, 0, 0]
    late = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
    assert [ch.after for ch in admin.reset_offsets("fresh", "orders", late)] == [20, 20, 20, 20]
    port.close()
    ray_calls.close()
