"""The consumer's side of retries (``rocketray.client.retry`` has the rules): publishing a nacked
message's copy, creating the group's retry and dead-letter topics on demand, and holding the
copies read from the retry topic until they are due.

Publishing. A copy goes out through a producer of the consumer's own (made on the first nack, on
the consumer's transport) as a synchronous send to the queue the plan names, so ``nack`` returns
only once the copy is acknowledged (``SEND_OK``: on every in-sync replica) or raises. The topic is
created (or extended to the plan's queue count) when its route is missing or short; that needs
Admin on the topic where the cluster has ACLs, so an operator may create both topics beforehand.

Holding. Copies read from retry queues go to a :class:`~rocketray.client.retry.RetryHold`; the
consumer hands over those due, does not pull a queue that holds one not yet due, and waits no
longer than the next one's time.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Callable, Collection, Sequence

from rocketray.client.config import ClientConfig
from rocketray.client.errors import AccessDenied, ClientClosed, ClientError, InvalidRequest, TopicNotFound
from rocketray.client.producer import Producer
from rocketray.client.retry import RetryHold, RetryPlan, is_retry_topic, parse_delays, plan_nack, retry_topic
from rocketray.client.routes import Routes, raise_for, route_from_header
from rocketray.client.transport import Transport
from rocketray.client.types import ReceivedMessage, SendResult, TopicQueue, TopicRoute
from rocketray.wire.controller_api import CreateTopicRequest

__all__ = ["Redelivery", "wall_ms"]

log = logging.getLogger("rocketray.client")

CREATE_TIMEOUT_S = 10.0


def wall_ms() -> int:
    """Retry times are wall-clock ms: they must mean the same to another member after a restart."""
    return int(time.time() * 1000)


class Redelivery:
    """Copies out (``publish``) and in (``arrived``, ``release``) for one consumer (module docstring).
    ``publish`` may run on any thread; the rest on the polling thread."""

    def __init__(self, transport: Transport, routes: Routes, config: ClientConfig, group: str,
                 on_retry_topic: Callable[[], None]) -> None:
        self._transport = transport
        self._routes = routes
        self._config = config
        self._group = group
        self._on_retry_topic = on_retry_topic       # the retry topic was created or extended: read it
        self._lock = threading.Lock()
        self._producer: Producer | None = None
        self._closed = False
        self._delays_ms = parse_delays(config.retry_delays)
        self.hold = RetryHold()

    def learn_retry_topic(self) -> None:
        """Learn the group's retry topic's route if it exists (it is read like a subscribed topic)."""
        try:
            self._routes.get(retry_topic(self._group))
        except ClientError:            # not created yet (no nack so far), or hidden from this user
            pass

    # --- copies out -------------------------------------------------------------------------------
    def plan(self, message: ReceivedMessage, readable: Sequence[str], delay_s: float | None) -> RetryPlan:
        """Where ``message``'s copy goes (``retry.plan_nack`` now); InvalidRequest for a message not
        of a ``readable`` topic or a bad delay."""
        if not isinstance(message, ReceivedMessage) or message.topic not in readable:
            raise InvalidRequest(f"nack takes a message this consumer polled, not {message!r:.100}")
        if delay_s is not None and (isinstance(delay_s, bool) or not isinstance(delay_s, (int, float))
                                    or not 0 <= delay_s < 10**9):
            raise InvalidRequest(f"delay_s must be a number of seconds >= 0, not {delay_s!r}")
        try:
            return plan_nack(message, self._group, self._delays_ms, self._config.max_deliveries,
                             None if delay_s is None else round(delay_s * 1000), wall_ms())
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None

    def publish(self, message: ReceivedMessage, plan: RetryPlan) -> SendResult:
        """Store ``message``'s copy as ``plan`` says; the acknowledged send, else a ClientError."""
        route = self._route(plan.topic, plan.queues)
        return self._sender().send_copy(route, plan.queue_id, message.body, message.key, message.tags,
                                        message.properties, plan.system_properties)

    def _sender(self) -> Producer:
        with self._lock:
            if self._closed:
                raise ClientClosed("consumer is closed")
            if self._producer is None:
                settings = {f.name: getattr(self._config, f.name) for f in dataclasses.fields(self._config)}
                self._producer = Producer(transport=self._transport, **{**settings, "sender_threads": 1})
            return self._producer

    def _route(self, topic: str, queues: int) -> TopicRoute:
        """``topic``'s route with at least ``queues`` queues, creating or extending it if needed."""
        try:
            route: TopicRoute | None = self._routes.get(topic)
        except (TopicNotFound, AccessDenied):     # a route the ACL hides: creating it says what is missing
            route = None
        if route is not None and len(route.queues) >= queues:
            return route
        try:
            response = self._transport.call_controller(CreateTopicRequest(topic, queues), timeout_s=CREATE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - no controller answered
            raise ClientError(f"no controller answered the creation of {topic!r}: {exc}", retriable=True,
                              code="CONTROLLER_UNAVAILABLE") from None
        if not response.ok:                        # another member may have made it (longer) meanwhile
            try:
                route = self._routes.refresh(topic)
            except (TopicNotFound, AccessDenied):
                route = None
            if route is not None and len(route.queues) >= queues:
                return route
            try:
                raise_for(response, f"create topic {topic!r} for group {self._group!r}'s nacks", topic)
            except AccessDenied as exc:
                raise AccessDenied(f"{exc}; an operator can create it instead: rocketray admin update-topic -t "
                                   f"{topic} -q {queues}", resource=exc.resource, action=exc.action) from None
        created = route_from_header(response.header)
        log.info("group %s: created %s with %d queues", self._group, topic, len(created.queues))
        self._routes.invalidate(topic)
        if is_retry_topic(topic):
            self._on_retry_topic()
        return created

    # --- copies in --------------------------------------------------------------------------------
    def arrived(self, messages: list[ReceivedMessage], paused: Collection[TopicQueue]) -> list[ReceivedMessage]:
        """What a pull returned, minus the retry copies (held), plus every held copy now due."""
        if not any(is_retry_topic(m.topic) for m in messages) and not self.hold.queues():
            return messages
        self.hold.add([m for m in messages if is_retry_topic(m.topic)])
        return [m for m in messages if not is_retry_topic(m.topic)] + self.release(paused)

    def release(self, paused: Collection[TopicQueue]) -> list[ReceivedMessage]:
        return self.hold.release(wall_ms(), paused)

    def wait_s(self, left_s: float, paused: Collection[TopicQueue]) -> float:
        """How long a poll may wait for pulls: ``left_s``, or less when a held copy is due sooner."""
        due = self.hold.next_due_ms(paused)
        return max(0.0, left_s if due is None else min(left_s, (due - wall_ms()) / 1000))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            producer, self._producer = self._producer, None
        if producer is not None:
            producer.close()
