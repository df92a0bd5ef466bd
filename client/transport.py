"""How the client reaches the cluster: the one seam between the client's rules and the cluster.

Everything the producer, consumer and admin do to the cluster goes through :class:`Transport`:
controller requests, one put or commit to a broker group's master, a held pull, committed offsets,
master discovery. Two transports implement it:

- a Ray driver (an operator: Ray trusts every driver with the whole cluster) names the cluster:
  ``Producer("demo")`` gets ``rocketray.client.socket_transport.SocketTransport``, which finds
  masters through the controller actors and moves data on the brokers' client ports with the
  operator's user credential the cluster's registry hands its drivers;
- an application outside Ray gives a :class:`~rocketray.client.bootstrap.Bootstrap` (brokers'
  addresses, the cluster's CA, its own user credential): ``Producer(Bootstrap.from_file(...))``
  gets ``rocketray.client.port_transport.PortTransport``, which does everything on the client
  ports; neither Ray nor Spark need be installed.

Finding the master. A group's master is cached; a put learns of a new master as soon as the
controller elects it (a long poll per group, answered at the election); a put still waiting when
the watch names another master is abandoned as *unanswered* (it may have run) and the caller
decides what that means (the producer never resends a batch that may have been written).
This module imports neither Ray nor anything that does.
"""

from __future__ import annotations

import concurrent.futures
from typing import TYPE_CHECKING, Any, Callable, Protocol

from rocketray.wire.batch import EncodedBatch
from rocketray.wire.pull_result import OffsetsResult
from rocketray.wire.controller_api import Response
from rocketray.client.unanswered import Unanswered
from rocketray.wire.put_result import PutResult

if TYPE_CHECKING:
    from rocketray.client.bootstrap import Bootstrap

__all__ = ["Transport", "Unanswered", "connect_transport"]


class Transport(Protocol):
    """What the client needs from the cluster (see the module docstring)."""

    def groups(self) -> list[str]: ...
    def call_controller(self, request: Any, timeout_s: float = 10.0) -> Response: ...
    def master(self, group: str) -> int | None: ...
    def forget_master(self, group: str) -> None: ...
    def await_new_master(self, group: str, timeout_s: float) -> bool: ...
    def named_at(self, group: str) -> float: ...
    def put(self, group: str, batch: EncodedBatch, timeout_s: float) -> PutResult | Unanswered: ...
    def put_start(self, group: str, batch: EncodedBatch, timeout_s: float,
                  caller_waits: bool = False) -> Callable[[], PutResult | Unanswered]: ...
    def commit(self, group: str, consumer_group: str, entries: list[tuple[str, int, int]],
               timeout_s: float, reset: bool = False) -> PutResult | Unanswered: ...
    def committed(self, group: str, consumer_group: str, topics: list[str] | None,
                  timeout_s: float) -> OffsetsResult | Unanswered: ...
    def queue_max_offsets(self, group: str, queues: list[tuple[str, int]],
                          timeout_s: float) -> tuple[tuple[str, int, int], ...] | Unanswered: ...
    def search_offsets(self, group: str, queues: list[tuple[str, int]], timestamp_ms: int,
                       timeout_s: float) -> tuple[tuple[str, int, int], ...] | Unanswered: ...
    def pull(self, group: str, topic: str, queue_id: int, offset: int, max_count: int, max_bytes: int,
             hold_ms: int, consumer_group: str | None = None,
             tag_filter: str | None = None) -> concurrent.futures.Future: ...
    def config(self) -> Any: ...
    def close(self) -> None: ...


def connect_transport(target: "str | Bootstrap") -> Transport:
    """The transport to ``target``: a :class:`~rocketray.client.bootstrap.Bootstrap` (outside Ray),
    or the name of a cluster on the Ray this process is connected to (``ray.init`` first, or this
    joins the running Ray)."""
    from rocketray.client.bootstrap import Bootstrap

    if isinstance(target, Bootstrap):
        from rocketray.client.port_transport import PortTransport

        return PortTransport(target)
    from rocketray.client.socket_transport import connect_ray_driver

    return connect_ray_driver(target)
