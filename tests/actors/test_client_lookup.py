"""The client's master lookup races its master watches (``RayTransport._lookup_master``): a lookup
that begins just before an election answers with the master the watch names, not with the deposed
master the controllers' slow ``applied_master`` answers would name a moment later.

A unit test of the transport's one layer: the controllers are stand-in actors (one slow lookup
answer, one watch that fires), the cluster a stand-in with the three things the lookup reads."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import ray

from rocketray.actors.views import MasterView
from rocketray.client.ray_transport import RayTransport

OLD, NEW = ("10.0.0.1:1", 0), ("10.0.0.2:1", 1)


@ray.remote(num_cpus=0, max_concurrency=4)
class StandInController:
    """``applied_master`` names the old master after ``lookup_s``; ``watch_master`` names the new
    one (epoch 2) after ``watch_s``."""

    def __init__(self, lookup_s: float, watch_s: float) -> None:
        self.lookup_s, self.watch_s = lookup_s, watch_s

    def applied_master(self, group: str) -> MasterView:
        time.sleep(self.lookup_s)
        return MasterView(1, OLD[1], OLD[0])

    def watch_master(self, group: str, known_epoch: int) -> MasterView:
        time.sleep(self.watch_s)
        return MasterView(2, NEW[1], NEW[0])


def stand_in_cluster(controllers: list) -> SimpleNamespace:
    by_address = {OLD[0]: SimpleNamespace(replica=OLD[1]), NEW[0]: SimpleNamespace(replica=NEW[1])}
    spec = SimpleNamespace(controllers=[SimpleNamespace(index=i) for i in range(len(controllers))],
                           broker_by_ha_address=by_address.get)
    return SimpleNamespace(spec=spec, controller=lambda i: controllers[i],
                           master_of=lambda group: pytest.fail("the lookup asked the brokers"))


@pytest.mark.parametrize("watch_fires", [True, False])
@pytest.mark.slow
def test_a_lookup_answers_with_the_master_a_watch_names_while_it_waits(ray_local, watch_fires):
    lookup_s, watch_s = (3.0, 0.2) if watch_fires else (1.0, 60.0)   # 3 s: the lookup's own timeout
    controllers = [StandInController.remote(lookup_s, watch_s) for _ in range(3)]
    transport = RayTransport(stand_in_cluster(controllers))
    started = time.monotonic()
    named = transport._lookup_master("g")
    took_s = time.monotonic() - started
    if watch_fires:
        # the old rule waited for the lookup answers (3 s) and named the deposed master
        assert named == NEW[1], "the lookup named the deposed master although a watch had named its successor"
        assert took_s < lookup_s, f"the lookup waited {took_s:.2f} s for the controllers' answers"
        assert transport.master("g") == NEW[1], "the watch's master is not cached"
    else:
        assert named == OLD[1], "with no watch answer the controllers' applied master is the answer"
        assert took_s >= lookup_s
    for c in controllers:
        ray.kill(c)
