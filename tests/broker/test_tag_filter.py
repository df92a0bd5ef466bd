"""Subscription expressions and the consume-queue entry test (rocketray.broker.tag_filter), as tables."""

from __future__ import annotations

import zlib

import pytest

from rocketray.wire.message import tag_hash
from rocketray.broker.tag_filter import (MAX_EXPRESSION_CHARS, MAX_TAGS, TagExpressionError, TagFilter,
                                         parse_expression, tag_code)


@pytest.mark.parametrize("expression, tags", [
    ("*", None),
    ("  *  ", None),
    ("paid", {"paid"}),
    ("paid || refunded", {"paid", "refunded"}),
    ("paid||refunded", {"paid", "refunded"}),
    (" paid  ||refunded ||paid ", {"paid", "refunded"}),
    ("TagA || tag-b || tag_c || 订单", {"TagA", "tag-b", "tag_c", "订单"}),
])
def test_valid_expressions_name_their_tags(expression, tags):
    """An expression is '*' (no filter) or tags separated by '||', white space around them ignored."""
    parsed = parse_expression(expression)
    if tags is None:
        assert parsed is None
    else:
        assert parsed is not None and parsed.tags == frozenset(tags)
        assert parsed.codes == frozenset(zlib.crc32(t.encode()) for t in tags)
        assert parse_expression(parsed.expression) == parsed


@pytest.mark.parametrize("expression, says", [
    ("", "empty tag expression"),
    ("   ", "empty tag expression"),
    ("a ||", "empty tag between"),
    ("|| a", "empty tag between"),
    ("a || || b", "empty tag between"),
    ("a ||| b", "not '|'"),
    ("a | b", "not '|'"),
    ("* || a", "stands alone"),
    ("paid refunded", "white space"),
    ("a\tb", "white space"),
    ("a\x01b", "control character"),
    (None, "not NoneType"),
    (["a"], "not list"),
    (b"a", "not bytes"),
    ("x" * (MAX_EXPRESSION_CHARS + 1), "characters is over"),
    (" || ".join(f"t{i}" for i in range(MAX_TAGS + 1)), "at most"),
])
def test_invalid_expressions_are_refused_saying_why(expression, says):
    """Every malformed expression raises TagExpressionError (a ValueError) naming the problem."""
    with pytest.raises(TagExpressionError, match=says):
        parse_expression(expression)


def test_the_filters_code_is_the_consume_queue_entrys_tag_code():
    """The broker compares a consume-queue entry's tag code (message.tag_hash of the record's TAGS)
    with the subscription's codes: both sides must compute the same number."""
    for tag in ("paid", "订单", "a" * 300):
        assert tag_code(tag) == tag_hash({"TAGS": tag})


def _colliding_tags() -> tuple[str, str]:
    """Two different tags with one CRC-32 (found once by brute force over 't<i>')."""
    pair = ("t928096", "t11200040")
    assert zlib.crc32(pair[0].encode()) == zlib.crc32(pair[1].encode())
    return pair


@pytest.mark.parametrize("entry_tag, by_code, by_tag", [
    ("paid", True, True),
    ("refunded", True, True),
    ("created", False, False),
    (None, False, False),            # an untagged message: code 0
])
def test_entries_and_messages_match_by_code_then_by_tag(entry_tag, by_code, by_tag):
    """The broker keeps entries by code; the client keeps messages by their real tag."""
    f = parse_expression("paid || refunded")
    code = tag_hash({"TAGS": entry_tag} if entry_tag else {})
    assert f.matches_code(code) is by_code
    assert f.matches_tag(entry_tag) is by_tag


def test_a_tag_sharing_a_code_passes_the_broker_and_is_dropped_by_the_client():
    """Two tags with one code: the broker cannot tell them apart, the client's tag check can."""
    wanted, other = _colliding_tags()
    f = TagFilter.of(frozenset({wanted}))
    assert f.matches_code(tag_code(other)) and not f.matches_tag(other)
    assert f.matches_tag(wanted)
