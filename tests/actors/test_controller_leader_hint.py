"""A driver's controller calls (``call_leader_sync``) start at the controller that last answered as
leader: losing controller 0's node must not make every later call wait for it to time out (the
failover benchmark's producer took 1.5-2.1 s to find the new master in such rounds, not 70 ms).
Checked without Ray: the module's ``ray`` is replaced by a fake whose calls are instant, and a
dead controller's call times out."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import ray

from rocketray.actors import controller_client
from rocketray.actors.cluster import Cluster
from rocketray.controller.api import GetReplicaInfoRequest, Response
from rocketray.controller.codes import ResponseCode
from rocketray.spec import ClusterSpec, ControllerSpec


class FakeControllers:
    """Three controllers: ``dead`` ones time out, ``leader`` answers, the rest redirect to it."""

    def __init__(self, spec: ClusterSpec, leader: int, dead: set[int]) -> None:
        self.spec, self.leader, self.dead = spec, leader, dead
        self.calls: list[int] = []
        self.timeouts = 0

    def handle(self, index: int):
        return SimpleNamespace(handle=SimpleNamespace(remote=lambda request: index))

    def get(self, index: int, timeout: float):
        self.calls.append(index)
        if index in self.dead:
            self.timeouts += 1
            raise ray.exceptions.GetTimeoutError(f"controller {index} did not answer in {timeout} s")
        if index == self.leader:
            return Response(ResponseCode.SUCCESS, {"master_address": "x"})
        return Response.error(ResponseCode.CONTROLLER_NOT_LEADER, "not leader",
                              {"leader_address": self.spec.controllers[self.leader].raft_address})


@pytest.fixture
def cluster(monkeypatch):
    spec = ClusterSpec("t", "c", "/tmp/t", "fast",
                       tuple(ControllerSpec(i, "127.0.0.1", 7000 + i, f"/tmp/t/c{i}") for i in range(3)), ())
    fake = FakeControllers(spec, leader=1, dead={0})
    monkeypatch.setattr(controller_client, "ray", SimpleNamespace(get=fake.get, exceptions=ray.exceptions))
    c = Cluster(spec)
    monkeypatch.setattr(c, "controller", fake.handle)
    return c, fake


def test_calls_start_at_the_last_leader_not_at_a_dead_controller_0(cluster):
    c, fake = cluster
    request = GetReplicaInfoRequest(broker_name="g")
    assert controller_client.call_leader_sync(c, request, timeout_s=5, call_timeout_s=1).ok
    assert (fake.calls, fake.timeouts, c.leader_hint) == ([0, 1], 1, 1)
    fake.calls.clear()
    for _ in range(3):
        assert controller_client.call_leader_sync(c, request, timeout_s=5, call_timeout_s=1).ok
    assert fake.calls == [1, 1, 1] and fake.timeouts == 1      # no more waits on controller 0


def test_a_moved_leader_is_followed_and_remembered(cluster):
    c, fake = cluster
    request = GetReplicaInfoRequest(broker_name="g")
    controller_client.call_leader_sync(c, request, timeout_s=5, call_timeout_s=1)
    fake.leader = 2                                     # the leader moved: 1 redirects to 2
    fake.calls.clear()
    assert controller_client.call_leader_sync(c, request, timeout_s=5, call_timeout_s=1).ok
    assert fake.calls == [1, 2] and c.leader_hint == 2
