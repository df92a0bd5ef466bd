"""A consumer's subscriptions: which topics it reads and, per topic, which tags (pure).

``Consumer(..., topics=...)`` takes a topic name, a list of names (every message of each), or a
mapping ``{topic: expression}`` with RocketMQ's subscription expressions (``"*"``, or tags
separated by ``||``: ``rocketray.broker.tag_filter``). :func:`subscriptions` checks them once, at
construction, and raises :class:`~rocketray.client.errors.InvalidRequest` for a bad one.

The broker skips the consume-queue entries whose tag code is not subscribed, so their bodies never
cross the wire; :func:`keep_subscribed` then drops what the broker passed on a shared code (two tags
with one CRC, or an untagged message against a tag whose CRC is 0), comparing the real tag.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from rocketray.broker.tag_filter import ALL, TagExpressionError, TagFilter, parse_expression
from rocketray.client.errors import InvalidRequest
from rocketray.client.types import ReceivedMessage

__all__ = ["Subscriptions", "subscriptions", "expression_of", "keep_subscribed"]

#: topic -> its filter (None: every message of the topic)
Subscriptions = dict[str, "TagFilter | None"]


def subscriptions(topics: str | Iterable[str] | Mapping[str, str]) -> Subscriptions:
    """The filters of ``topics`` (module docstring); InvalidRequest when a topic or expression is bad."""
    if isinstance(topics, str):
        pairs: list[tuple[object, object]] = [(topics, ALL)]
    elif isinstance(topics, Mapping):
        pairs = list(topics.items())
    else:
        try:
            pairs = [(t, ALL) for t in topics]
        except TypeError:
            raise InvalidRequest(f"topics is a topic, a list of topics or {{topic: tag expression}}, "
                                 f"not {type(topics).__name__}") from None
    out: Subscriptions = {}
    for topic, expression in pairs:
        if not isinstance(topic, str) or not topic:
            raise InvalidRequest(f"a topic is a non-empty str, not {topic!r}")
        try:
            out[topic] = parse_expression(expression)
        except TagExpressionError as exc:
            raise InvalidRequest(f"subscription of topic {topic!r}: {exc}") from None
    if not out:
        raise InvalidRequest("a consumer needs at least one topic")
    return out


def expression_of(tag_filter: TagFilter | None) -> str | None:
    """What a pull carries for ``tag_filter``: None for every message (a pull without a filter)."""
    return None if tag_filter is None else tag_filter.expression


def keep_subscribed(messages: list[ReceivedMessage], tag_filter: TagFilter | None) -> list[ReceivedMessage]:
    """The messages whose tag ``tag_filter`` subscribes (all of them without a filter)."""
    if tag_filter is None:
        return messages
    return [m for m in messages if tag_filter.matches_tag(m.tags)]
