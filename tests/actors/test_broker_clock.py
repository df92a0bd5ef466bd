"""A broker's wall clock jumped under libfaketime (``chaos/faketime.py``), as the broker chaos run's
``clock-broker`` nemesis does it: the jump is really applied to the running master (its own wall
clock and the store timestamps it writes are off by the jump, the slave's are not), and a jump
forward by an hour then back by ten minutes loses and reorders nothing: queue offsets, not
timestamps, order the queue; a delayed message comes early by the master's skew forward and late
by its skew back, never lost."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import ray

from rocketray.actors import pipeline
from rocketray.chaos.faketime import faketime_env, set_offset
from rocketray.client import Consumer, Producer, SendStatus
from rocketray.client.admin import Admin
from rocketray.client.socket_transport import SocketTransport
from rocketray.waiting import wait_for

pytestmark = pytest.mark.slow
GROUP = "broker-a"
TOPIC = "clocked"


def now_ms() -> int:
    return int(time.time() * 1000)


def clock_off_ms(cluster, replica: int) -> float:
    before = now_ms()
    theirs = ray.get(cluster.broker(GROUP, replica).wall_clock_ms.remote(), timeout=5)
    return theirs - (before + now_ms()) / 2


def jump(cluster, clocks: dict[int, Path], replica: int, offset_s: int) -> None:
    set_offset(clocks[replica], offset_s)
    wait_for(lambda: abs(clock_off_ms(cluster, replica) - offset_s * 1000) < 1500, 10,
             lambda: f"r{replica}'s clock to show {offset_s:+d} s (now {clock_off_ms(cluster, replica):+.0f} ms)")


def test_a_master_s_clock_jumped_forward_and_back_stamps_off_and_loses_nothing(make_cluster, tmp_path):
    clocks: dict[int, Path] = {}

    def under_faketime(b):
        clocks[b.replica] = tmp_path / f"clock-r{b.replica}"
        return faketime_env(clocks[b.replica])

    cluster = make_cluster(controllers=1, replicas=2, broker_env=under_faketime)
    port = SocketTransport(cluster)
    Admin(transport=port).create_topic(TOPIC, queues=1)
    pipeline.settle(cluster, in_sync=True)
    master = cluster.wait_for_master(GROUP)
    slave = 1 - master
    sent: list[tuple[str, int, int]] = []     # (msg id, queue offset, our clock when sent)
    delayed: dict[str, int] = {}
    with Producer(transport=port) as producer:
        def send(n: int, tag: str) -> None:
            for i in range(n):
                at = now_ms()
                r = producer.send(TOPIC, f"{tag}-{i}".encode(), key="k")
                assert r.status is SendStatus.SEND_OK, r
                sent.append((r.msg_id, r.queue_offset, at))

        send(5, "real")
        jump(cluster, clocks, master, 3600)
        assert abs(clock_off_ms(cluster, slave)) < 1500, "only the victim's clock moved"
        send(5, "ahead")
        ahead_due = now_ms() + 30_000               # due in 30 s of our clock: due now on the master's
        delayed[producer.send(TOPIC, b"due-in-30s", key="k", deliver_at_ms=ahead_due).msg_id] = ahead_due
        jump(cluster, clocks, master, -600)
        send(5, "behind")
        behind_due = now_ms() + 500                 # due in 0.5 s: 600.5 s away on the master's clock
        delayed[producer.send(TOPIC, b"due-in-0.5s", key="k", deliver_at_ms=behind_due).msg_id] = behind_due
        time.sleep(2)
        held_back = now_ms()
        jump(cluster, clocks, master, 0)
        send(5, "real-again")

    seen: dict[str, tuple] = {}
    with Consumer(group="clock-reader", topics=[TOPIC], transport=port) as consumer:
        def all_seen() -> bool:
            for m in consumer.poll(0.5):
                seen.setdefault(m.msg_id, (m, now_ms()))
            consumer.commit()
            return {s[0] for s in sent} | set(delayed) <= set(seen)
        wait_for(all_seen, 60, lambda: f"every message: {len({s[0] for s in sent} | set(delayed) - set(seen))} missing")
    port.close()

    offsets = [q for _m, q, _at in sent]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets), "stored in send order"
    skews = [(seen[m][0].store_timestamp_ms - at) / 1000 for m, _q, at in sent]
    for part, want in zip(range(0, 20, 5), (0, 3600, -600, 0)):
        assert all(abs(s - want) < 3 for s in skews[part:part + 5]), (want, skews[part:part + 5])
    early, early_polled = seen[next(m for m, due in delayed.items() if due == ahead_due)]
    assert early_polled < ahead_due - 20_000, "the master's clock an hour ahead put it in its queue at once"
    late, late_polled = seen[next(m for m, due in delayed.items() if due == behind_due)]
    assert late_polled >= held_back, "the master's clock ten minutes behind held it until its clock came back"
    assert late.deliver_at_ms == behind_due and early.deliver_at_ms == ahead_due
