"""Committed offsets as system-topic records: the codec (golden bytes, bad input) and the fold's
one data-survival rule (a group's offset never goes backwards)."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, strategies as st

from rocketray.broker.message import decode_record
from rocketray.broker.batch import encode_batch
from rocketray.broker.offsets import (OFFSETS_TOPIC, OffsetCommit, OffsetRecordError, OffsetTable, commit_message,
                                      decode_commit, encode_commit, fold_all)


def test_golden_bytes():
    """The record body's layout is a wire format: msgpack [1, group, [[topic, queue_id, offset]]]."""
    assert encode_commit("billing", [("orders", 3, 17)]) == bytes.fromhex("9301a762696c6c696e679193a66f726465727303" "11")
    assert decode_commit(bytes.fromhex("9301a762696c6c696e679193a66f72646572730311")) == [
        OffsetCommit("billing", "orders", 3, 17)]


def test_commit_message_is_a_record_of_the_system_topic():
    msg = commit_message("g", [("t", 0, 5), ("t", 1, 6)], born_timestamp_ms=123)
    batch = encode_batch([msg])
    decoded, _ = decode_record(batch.data)
    assert decoded.topic == OFFSETS_TOPIC and decoded.properties["GROUP"] == "g"
    assert decode_commit(decoded.body) == [OffsetCommit("g", "t", 0, 5), OffsetCommit("g", "t", 1, 6)]


@pytest.mark.parametrize("group, entries", [
    ("", [("t", 0, 1)]),                    # no group
    ("g", []),                              # nothing to commit
    ("g", [("bad topic", 0, 1)]),           # invalid topic name
    ("g", [("t", -1, 1)]),                  # negative queue id
    ("g", [("t", 0, -5)]),                  # negative offset
    ("g", [("t", 0, True)]),                # a bool is not an offset
    ("g", [("t", 0, 2**63)]),               # beyond int64
])
def test_invalid_commits_are_refused(group, entries):
    with pytest.raises(OffsetRecordError):
        encode_commit(group, entries)


@pytest.mark.parametrize("body", [
    b"", b"\xc1", msgpack.packb([2, "g", [["t", 0, 1]]]), msgpack.packb([1, "g", []]),
    msgpack.packb([1, "g", [["t", 0]]]), msgpack.packb([1, 5, [["t", 0, 1]]]), msgpack.packb({"a": 1}),
    msgpack.packb([1, "g", [["t", "0", 1]]]),
])
def test_malformed_bodies_raise_the_codec_error_only(body):
    with pytest.raises(OffsetRecordError):
        decode_commit(body)


@given(st.binary(max_size=64))
def test_random_bytes_decode_or_raise_the_codec_error(body):
    try:
        decode_commit(body)
    except OffsetRecordError:
        pass


def test_the_fold_keeps_the_highest_commit():
    """A late, lower commit (a consumer that lost the queue in a rebalance, a commit from before a
    failover) never rolls the group back (apache/rocketmq#1094, #7790, #9711)."""
    table = fold_all(enumerate([encode_commit("g", [("t", 0, 10)]), encode_commit("g", [("t", 0, 4)]),
                                encode_commit("h", [("t", 0, 2)]), encode_commit("g", [("t", 1, 7)])]))
    assert table.committed("g", "t", 0) == 10
    assert table.committed("h", "t", 0) == 2          # groups are independent
    assert table.of_group("g") == {("t", 0): 10, ("t", 1): 7}
    assert table.committed("g", "t", 9) is None and table.position == 4


def test_a_record_that_does_not_decode_is_skipped_and_counted():
    table = fold_all(enumerate([b"junk", encode_commit("g", [("t", 0, 3)])]))
    assert table.skipped == 1 and table.committed("g", "t", 0) == 3 and table.position == 2


@given(st.lists(st.tuples(st.sampled_from("gh"), st.integers(0, 2), st.integers(0, 100)), max_size=40))
def test_the_fold_is_the_running_maximum(commits):
    table = fold_all(enumerate(encode_commit(g, [("t", q, o)]) for g, q, o in commits))
    for g, q, _ in commits:
        assert table.committed(g, "t", q) == max(o for g2, q2, o in commits if (g2, q2) == (g, q))
