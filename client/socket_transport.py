"""The Ray driver's transport: masters found through the controller actors, data on client ports.

:class:`SocketTransport` is a :class:`~rocketray.client.ray_transport.RayTransport` (controller
requests, master lookups and watches as Ray calls) whose data calls go to the masters' client ports
(:class:`~rocketray.client.port_data.PortData`). A Ray driver is an operator (Ray trusts every driver
with the whole cluster): it authenticates on the client ports with the operator user's credential
the cluster's registry hands its drivers, never with a member's. A broker without a client port (an
older cluster spec) is reached through Ray.
"""

from __future__ import annotations

import concurrent.futures
import logging
from typing import Any

import ray

from rocketray.client.connections import Dialer, user_login
from rocketray.client.errors import ClusterNotFound
from rocketray.client.port_data import PortData
from rocketray.client.ray_transport import RayTransport

__all__ = ["SocketTransport", "connect_ray_driver"]


class SocketTransport(PortData, RayTransport):
    """See the module docstring."""

    def __init__(self, cluster: Any) -> None:
        RayTransport.__init__(self, cluster)
        access = cluster.access
        self._init_ports(Dialer(access.trust, user_login(access.user, access.secret)))

    def _client_address(self, group: str, replica: int) -> tuple[str, int] | None:
        b = next((x for x in self.cluster.spec.brokers_of(group) if x.replica == replica), None)
        return None if b is None else b.client_address

    def _master_moved(self, group: str, replica: int) -> bool:
        ready, _ = ray.wait(self._watches_of(group), num_returns=1, timeout=0)
        return bool(ready) and (new := self._take_watch(group, ready[0])) is not None and new != replica

    def _without_port(self, group: str, method: str, args: tuple, timeout_s: float) -> Any:
        return self._call_master(group, method, args, timeout_s)

    def _pull_without_port(self, group: str, topic: str, queue_id: int, offset: int, max_count: int,
                           max_bytes: int, hold_ms: int, consumer_group: str | None,
                           tag_filter: str | None = None) -> concurrent.futures.Future:
        return RayTransport.pull(self, group, topic, queue_id, offset, max_count, max_bytes, hold_ms, consumer_group,
                                 tag_filter)


def connect_ray_driver(cluster: str) -> SocketTransport:
    """The transport of a Ray driver to the cluster named ``cluster`` on the Ray this process is
    connected to (``ray.init`` first, or this joins the running Ray)."""
    from rocketray.actors.cluster import ClusterError, connect

    if not ray.is_initialized():
        ray.init(address="auto", logging_level=logging.ERROR, log_to_driver=False)
    try:
        return SocketTransport(connect(cluster))
    except ClusterError as exc:
        raise ClusterNotFound(str(exc)) from None
