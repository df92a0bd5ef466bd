"""A producer's messages one at a time: made ready to queue, and settled (the per-message side of
``rocketray.client.producer``, which batches and sends them).

Theory of operation. :class:`Outgoing` turns one ``send`` call into a :class:`Pending` entry: the
queue (``queue_id``, else by key or round robin), a message id, the delivery plan of a delayed
message (its schedule queue in the same broker group: ``rocketray.broker.schedule``), the
properties, the record encoded once in the commit-log layout by the sending thread, its accounted
size, and the deadline ``send_timeout_ms`` after the call. Invalid input raises here, before
anything is queued. :func:`settle` gives one message's future its outcome once, and
:func:`per_message` words a batch's failure for each of its messages.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import time
from typing import Mapping

from rocketray.wire.batch import encode_new_record
from rocketray.wire.message import MessageCodecError, topic_bytes
from rocketray.wire.delayed import plan_delay
from rocketray.client.config import ClientConfig
from rocketray.client.core import select_queue
from rocketray.client.errors import AccessDenied, InvalidMessage, SendUnknown
from rocketray.client.futures import Dispatch, SendFuture
from rocketray.client.messages import message_properties, new_msg_id_prefix
from rocketray.client.types import SendResult, TopicRoute

__all__ = ["Pending", "Outgoing", "settle", "per_message", "pub_denied", "wall_ms"]


class Pending:
    """One queued message (made per ``send_async``: a plain slots class, about a third of a frozen
    dataclass's construction time; never changed after construction)."""

    __slots__ = ("topic", "queue_id", "msg_id", "future", "record", "deadline", "delayed")

    def __init__(self, topic: str, queue_id: int, msg_id: str, future: concurrent.futures.Future,
                 record: bytes, deadline: float, delayed: bool = False) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.msg_id = msg_id
        self.future = future
        self.record = record        # the message encoded once, in the commit-log layout, by the sending thread
        self.deadline = deadline    # monotonic s: the send ends by then (send_timeout_ms after its call)
        self.delayed = delayed      # stored in its schedule queue: no queue offset of its own yet


class Outgoing:
    """Makes the :class:`Pending` entries of one producer (module docstring); ``dispatch`` runs a
    future's done callbacks (the producer's callback thread)."""

    def __init__(self, config: ClientConfig, dispatch: Dispatch) -> None:
        self._config = config
        self._dispatch = dispatch
        self._counter = itertools.count()
        self._id_prefix = new_msg_id_prefix()
        self._ids = itertools.count()
        self._topics: dict[str, bytes] = {}

    def make(self, route: TopicRoute, topic: str, body: bytes, key: str | None, tags: str | None,
             properties: Mapping[str, str] | None, queue_id: int | None = None,
             system: Mapping[str, str] | None = None, deliver_at_ms: int | None = None) -> tuple[str, Pending, int]:
        """The broker group of the message's queue (what batches are keyed by), its pending entry
        and its accounted size; raises InvalidMessage on bad input."""
        if not isinstance(body, bytes):
            if not isinstance(body, (bytearray, memoryview)):
                raise InvalidMessage(f"a message body must be bytes, not {type(body).__name__}")
            body = bytes(body)
        if queue_id is None:
            queue_id = select_queue(key, len(route.queues), next(self._counter))
        msg_id = f"{self._id_prefix}{next(self._ids):012X}"
        stored_topic, stored_queue, delayed = topic, queue_id, False
        if deliver_at_ms is not None:
            try:
                plan = plan_delay(topic, queue_id, deliver_at_ms, wall_ms())
            except ValueError as exc:
                raise InvalidMessage(str(exc)) from None
            stored_topic, stored_queue, delayed = plan.topic, plan.queue_id, plan.delayed
            system = plan.system_properties
        props = message_properties(key, tags, properties, msg_id, system)
        size = len(body) + len(props)
        if size > self._config.max_message_bytes:
            raise InvalidMessage(f"message of {size} bytes is over max_message_bytes {self._config.max_message_bytes}")
        try:
            record = encode_new_record(self._topic_bytes(stored_topic), props, body, stored_queue,
                                       int(time.time() * 1000))
        except MessageCodecError as exc:
            raise InvalidMessage(str(exc)) from None
        deadline = time.monotonic() + self._config.send_timeout_ms / 1000
        pending = Pending(topic, queue_id, msg_id, SendFuture(self._dispatch), record, deadline, delayed)
        return route.group_of(queue_id), pending, len(record)

    def _topic_bytes(self, topic: str) -> bytes:
        encoded = self._topics.get(topic)
        if encoded is None:
            encoded = self._topics[topic] = topic_bytes(topic)
        return encoded


def settle(future: concurrent.futures.Future, result: SendResult | None, exc: BaseException | None) -> int:
    """Set the future's outcome unless it has one (1 if this call set it)."""
    try:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)
        return 1
    except concurrent.futures.InvalidStateError:
        return 0


def per_message(exc: BaseException, msg_id: str, topic: str) -> BaseException:
    """A batch's failure as one of its messages' (a SendUnknown names the message)."""
    if isinstance(exc, SendUnknown):
        return SendUnknown(str(exc), msg_id, exc.status)
    if isinstance(exc, AccessDenied) and exc.resource is None:
        return pub_denied(topic, exc)
    return exc


def pub_denied(topic: str, exc: AccessDenied) -> AccessDenied:
    """``exc`` as what the producer wanted: Pub on ``topic``."""
    return AccessDenied(f"the user may not Pub to topic {topic!r}: {exc}", resource=f"Topic:{topic}", action="Pub")


def wall_ms() -> int:
    """Delivery times are wall-clock ms: the broker's scheduler compares them with its own clock."""
    return int(time.time() * 1000)
