"""Tag filters: RocketMQ's subscription expression, and the consume-queue entry test (pure).

Theory of operation. A consumer subscribes to a topic with an expression: ``*`` (every message) or
tags separated by ``||`` (``"paid || refunded"``), as RocketMQ's ``SubscriptionData``. A message
carries at most one tag (its ``TAGS`` property); every consume-queue entry keeps that tag's code,
``crc32(tag)`` (0 for a message without a tag: ``rocketray.wire.message.tag_hash``). A filtered
pull is decided in two places, as in RocketMQ:

- the broker keeps an entry only when its code is one of the subscribed tags' codes
  (:meth:`TagFilter.matches_code`), so the body of an unwanted message is never read nor sent;
- the client keeps a message only when its real tag is one of the subscribed tags
  (:meth:`TagFilter.matches_tag`): two tags may share a code, and a message without a tag has
  code 0, which a tag could have too.

An expression is strict: a tag is a non-empty string without ``|`` or white space (a producer's tag
with a space could never be subscribed to alone); empty alternatives (``"a || || b"``), a single
``|``, ``*`` among tags, and more than :data:`MAX_TAGS` tags or :data:`MAX_EXPRESSION_CHARS`
characters are refused with :class:`TagExpressionError`, a ``ValueError`` naming what is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

from rocketray.wire.message import tag_hash

__all__ = ["ALL", "MAX_EXPRESSION_CHARS", "MAX_TAGS", "TagExpressionError", "TagFilter", "parse_expression",
           "tag_code"]

ALL = "*"
MAX_EXPRESSION_CHARS = 4096
MAX_TAGS = 256


class TagExpressionError(ValueError):
    """An expression that is not ``*`` nor tags separated by ``||`` (the message says why)."""


def tag_code(tag: str) -> int:
    """The code a consume-queue entry keeps for a message tagged ``tag`` (as ``message.tag_hash``)."""
    return tag_hash({"TAGS": tag})


@dataclass(frozen=True, slots=True)
class TagFilter:
    """The tags of one subscription (never empty: ``*`` is no filter, ``None``)."""

    tags: frozenset[str]
    codes: frozenset[int]

    @classmethod
    def of(cls, tags: frozenset[str]) -> "TagFilter":
        assert tags, "a filter names at least one tag"
        return cls(tags, frozenset(tag_code(t) for t in tags))

    def matches_code(self, code: int) -> bool:
        """Whether a consume-queue entry with tag code ``code`` may hold a subscribed message."""
        return code in self.codes

    def matches_tag(self, tag: str | None) -> bool:
        """Whether a message whose ``TAGS`` property is ``tag`` (None: untagged) is subscribed."""
        return tag is not None and tag in self.tags

    @property
    def expression(self) -> str:
        """The canonical expression (sorted tags joined by ``" || "``)."""
        return " || ".join(sorted(self.tags))


def parse_expression(expression: object) -> TagFilter | None:
    """The filter of a subscription expression: None for ``*`` (every message), else the tags.

    Raises :class:`TagExpressionError` for anything that is not ``*`` nor ``tag || tag ...``."""
    if not isinstance(expression, str):
        raise TagExpressionError(f"a tag expression is a str ('*' or 'a || b'), not {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise TagExpressionError(f"a tag expression of {len(expression)} characters is over {MAX_EXPRESSION_CHARS}")
    text = expression.strip()
    if text == ALL:
        return None
    if not text:
        raise TagExpressionError("an empty tag expression: use '*' for every message")
    tags = set()
    for part in text.split("||"):
        tag = part.strip()
        if not tag:
            raise TagExpressionError(f"{expression!r}: an empty tag between '||'")
        if tag == ALL:
            raise TagExpressionError(f"{expression!r}: '*' stands alone (every message), never among tags")
        if "|" in tag:
            raise TagExpressionError(f"{expression!r}: tags are separated by '||', not '|'")
        if any(c.isspace() for c in tag) or not tag.isprintable():
            raise TagExpressionError(f"{expression!r}: tag {tag!r} has white space or a control character "
                                     f"(separate tags with '||')")
        tags.add(tag)
    if len(tags) > MAX_TAGS:
        raise TagExpressionError(f"{len(tags)} tags in one expression; at most {MAX_TAGS}")
    return TagFilter.of(frozenset(tags))
