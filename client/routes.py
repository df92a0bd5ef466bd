"""Topic routes (which broker group holds each queue of a topic), cached from the controller.

A route is asked of the controller again once it is older than the TTL (``client.route_refresh_ms``),
so a topic extended with more queues reaches producers and consumers by itself; while no controller
answers, the last known route keeps being used.
"""

from __future__ import annotations

import threading
import time

from rocketray.client.errors import AdminError, ClientError, TopicNotFound, access_denied
from rocketray.client.transport import Transport
from rocketray.client.types import QueueRoute, TopicRoute
from rocketray.wire.controller_api import GetTopicRouteRequest, Response
from rocketray.wire.controller_codes import ResponseCode, is_retriable
from rocketray.wire.controller_headers import CreateTopicResponseHeader, ResponseHeader, TopicRouteResponseHeader

__all__ = ["Routes", "raise_for", "route_from_header", "ROUTE_TTL_S"]

ROUTE_TTL_S = 5.0
ROUTE_REQUEST_TIMEOUT_S = 10.0


def raise_for(response: Response, what: str, topic: str | None = None) -> Response:
    """``response`` if it succeeded, else the matching client error (``TopicNotFound`` names
    ``topic``, the topic the request was about; ``AccessDenied`` the ACL's refusal)."""
    if response.ok:
        return response
    if response.code == ResponseCode.TOPIC_NOT_EXIST and topic is not None:
        raise TopicNotFound(topic)
    if response.code == ResponseCode.NO_PERMISSION:
        raise access_denied(response.remark, doing=what)
    raise AdminError(f"{what}: {response.code.name} ({int(response.code)}): {response.remark}",
                     retriable=is_retriable(response.code), code=response.code.name)


def route_from_header(header: ResponseHeader) -> TopicRoute:
    """The route a GetTopicRoute or CreateTopic answer names (ClientError for any other header)."""
    if not isinstance(header, (TopicRouteResponseHeader, CreateTopicResponseHeader)):
        raise ClientError(f"a topic route answer with a {type(header).__name__}", code="UNEXPECTED_ANSWER")
    return TopicRoute(header.topic, tuple(QueueRoute(int(q), str(g)) for q, g in sorted(header.queues)))


class Routes:
    """``get(topic)``: the topic's route, asked of the controller at most every ``ttl_s``. Thread-safe."""

    def __init__(self, transport: Transport, ttl_s: float = ROUTE_TTL_S) -> None:
        assert ttl_s > 0
        self._transport = transport
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, TopicRoute]] = {}

    def cached(self, topic: str) -> TopicRoute | None:
        """The route if it is known and fresh, without asking anyone."""
        with self._lock:
            hit = self._cache.get(topic)
        return hit[1] if hit is not None and time.monotonic() - hit[0] < self._ttl_s else None

    def get(self, topic: str) -> TopicRoute:
        """The fresh route (asked of the controller when stale); TopicNotFound, or ClientError
        (retriable) when no controller answers and no route was known."""
        fresh = self.cached(topic)
        return fresh if fresh is not None else self.refresh(topic)

    def refresh(self, topic: str) -> TopicRoute:
        """Ask the controller now (the last known route if it does not answer)."""
        with self._lock:
            hit = self._cache.get(topic)
        try:
            response = self._transport.call_controller(GetTopicRouteRequest(topic), timeout_s=ROUTE_REQUEST_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - no controller answered
            if hit is not None:
                return hit[1]          # keep using the last known route
            raise ClientError(f"no controller answered the route of {topic!r}: {exc}", retriable=True,
                              code="CONTROLLER_UNAVAILABLE") from None
        if response.code == ResponseCode.TOPIC_NOT_EXIST:
            with self._lock:
                self._cache.pop(topic, None)
            raise TopicNotFound(topic)
        if not response.ok and hit is not None and is_retriable(response.code):
            return hit[1]
        route = route_from_header(raise_for(response, f"route of {topic!r}", topic).header)
        with self._lock:
            self._cache[topic] = (time.monotonic(), route)
        return route

    def invalidate(self, topic: str) -> None:
        with self._lock:
            self._cache.pop(topic, None)
