"""``Admin``: topics and consumer-group progress, as mqadmin offers them.

    >>> from rocketray.client import Admin
    >>> admin = Admin("demo")                                            # doctest: +SKIP
    >>> admin.create_topic("orders", queues=8)                           # idempotent
    >>> admin.topic_route("orders").queues[0].broker_group
    'broker-a'
    >>> [p.lag for p in admin.consumer_progress("billing")]

Topics live in the controller's replicated state (no nameserver): creating one is a Raft write
that every controller keeps through failovers and restarts, and no broker holds a private copy.
"""

from __future__ import annotations

from typing import Any

from rocketray.broker.pull import OffsetsResult, OffsetsStatus
from rocketray.client.errors import AdminError
from rocketray.client.routes import raise_for, route_from_header
from rocketray.client.transport import Transport, Unanswered, connect_transport
from rocketray.client.types import QueueProgress, TopicRoute
from rocketray.controller.api import (CreateTopicRequest, DeleteTopicRequest, GetTopicRouteRequest,
                                      ListTopicsRequest)

__all__ = ["Admin"]


class Admin:
    """Administration of the cluster named ``cluster``."""

    def __init__(self, cluster: str = "default", *, transport: Transport | None = None,
                 timeout_s: float = 10.0) -> None:
        self._owns_transport = transport is None
        self._transport = transport if transport is not None else connect_transport(cluster)
        self._timeout_s = timeout_s

    def close(self) -> None:
        """Close the connections ``consumer_progress`` opened. Idempotent."""
        if self._owns_transport:
            self._transport.close()

    def __enter__(self) -> "Admin":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, request: Any, what: str) -> Any:
        """The answer's typed header (``rocketray.controller.headers``), or the matching error."""
        try:
            response = self._transport.call_controller(request, timeout_s=self._timeout_s)
        except Exception as exc:  # noqa: BLE001 - no controller answered in time
            raise AdminError(f"{what}: no controller leader answered ({exc})", retriable=True,
                             code="CONTROLLER_UNAVAILABLE") from None
        return raise_for(response, what).header

    def create_topic(self, topic: str, queues: int = 8) -> TopicRoute:
        """Create ``topic`` with ``queues`` queues spread over the broker groups, or extend it to that
        many (idempotent; a topic never shrinks: asking for fewer queues is an error)."""
        return route_from_header(self._call(CreateTopicRequest(topic, queues), f"create topic {topic!r}"))

    def delete_topic(self, topic: str) -> None:
        """Forget ``topic`` (TopicNotFound if it does not exist). Stored messages stay until retention."""
        self._call(DeleteTopicRequest(topic), f"delete topic {topic!r}")

    def topic_route(self, topic: str) -> TopicRoute:
        """Which broker group holds each queue of ``topic`` (TopicNotFound if it does not exist)."""
        return route_from_header(self._call(GetTopicRouteRequest(topic), f"route of {topic!r}"))

    def list_topics(self) -> dict[str, int]:
        """Every topic and its number of queues."""
        return dict(sorted(self._call(ListTopicsRequest(), "list topics").counts().items()))

    def consumer_progress(self, group: str) -> list[QueueProgress]:
        """Per queue ``group`` has committed: committed offset, max offset and lag, asked of each
        broker group's master (AdminError if one does not answer)."""
        rows: list[QueueProgress] = []
        timeout_s = self._timeout_s
        for broker_group in self._transport.groups():
            reply = self._transport.committed(broker_group, group, None, timeout_s)
            if isinstance(reply, Unanswered) or not isinstance(reply, OffsetsResult) \
                    or reply.status is not OffsetsStatus.OK:
                self._transport.forget_master(broker_group)
                reply = self._transport.committed(broker_group, group, None, timeout_s)
            if not isinstance(reply, OffsetsResult) or reply.status is not OffsetsStatus.OK:
                detail = reply.error if isinstance(reply, Unanswered) else f"{reply.status.name} {reply.remark}"
                raise AdminError(f"consumer progress of {group!r}: {broker_group} did not answer ({detail})",
                                 retriable=True, code="BROKER_UNAVAILABLE")
            maxes = reply.max_map()
            for topic, queue_id, offset in reply.committed:
                rows.append(QueueProgress(topic, queue_id, broker_group, offset, maxes.get((topic, queue_id), offset)))
        return sorted(rows, key=lambda r: (r.topic, r.queue_id))
