"""Issue 29 on real actors: a node loss that takes the controller leader with the master. The new
leader holds no sessions; the surviving replicas reopen theirs at once (their controller clients
follow the leader), and the master, which cannot, is treated as dead after the grace window
(``LeaderSessionGrace``) instead of a heartbeat timeout later. The heartbeat timeout is 60 s here, so
the failover can only come from the new rule; the master is killed for good (no Ray restart can
reopen its session), and the driver's calls must not wait for the killed controller's restart."""

from __future__ import annotations

import time

import psutil
import pytest
import ray

from rocketray.actors import pipeline
from rocketray.actors.pipeline import Workload
from rocketray.wire.controller_api import ApplyBrokerIdRequest, GetReplicaInfoRequest
from rr_testing import wait_until

pytestmark = pytest.mark.slow
GROUP = "broker-a"
SLOW_EXPIRY = {"broker.controller_heartbeat_timeout_ms": "60000", "ha.all_ack_in_sync_state_set": "true"}


def test_master_lost_with_the_controller_leader_is_replaced_without_heartbeat_expiry(make_cluster):
    cluster = make_cluster(overrides=SLOW_EXPIRY)
    w = Workload(cluster)
    w.produce(200)
    pipeline.settle(cluster, in_sync=True)
    before = cluster.call_controller(GetReplicaInfoRequest(broker_name=GROUP))
    epoch, master_address = before.header.master_epoch, before.header.master_address
    leader, old = cluster.wait_for_leader(), cluster.wait_for_master(GROUP)
    time.sleep(1.2)   # every controller past its warm-up (5 heartbeat intervals of the fast profile)
    leader_pid = ray.get(cluster.controller(leader).pid.remote(), timeout=10)
    ray.kill(cluster.broker(GROUP, old), no_restart=True)
    cluster.kill_controller(leader, wait_restart=False)
    t0 = time.monotonic()
    # ray.kill returns before the process is gone: a write sent at once could still reach the old leader
    wait_until(lambda: _gone(leader_pid), 10, what="the killed controller leader's process to exit")
    # a write through the driver's client: answered by the new leader, not after the killed one's restart
    assert cluster.call_controller(ApplyBrokerIdRequest("c", "probe-group", 1, "h:1;1"), timeout_s=20).ok
    assert cluster.controller_client.leader.index != leader

    def replaced():
        h = cluster.call_controller(GetReplicaInfoRequest(broker_name=GROUP)).header
        return h.master_epoch > epoch and h.master_address not in (None, master_address)
    wait_until(replaced, 20, what="a new master elected by the new controller leader")
    elapsed_s = time.monotonic() - t0
    assert elapsed_s < 30, f"the master was replaced after {elapsed_s:.1f} s: heartbeat expiry, not the grace rule"
    md = [m for m in cluster.controller_metadata() if m is not None and m.is_leader]
    assert md and md[0].session_grace_deaths >= 1
    assert w.send_batch(GROUP).outcome == "ok", "writes resume on the new master"
    w.produce(100)
    delivered = w.consume_all()        # a fresh consumer group reads every acknowledged message
    assert sum(len(acked - delivered.keys()) for acked in w.acked.values()) == 0
    w.close()


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
