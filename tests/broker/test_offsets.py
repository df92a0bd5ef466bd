"""Committed offsets as system-topic records: the codec (golden bytes, bad input) and the fold's
rules (a commit never moves a group's offset backwards; an admin's reset record assigns it)."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, strategies as st

from rocketray.wire.message import decode_record
from rocketray.wire.batch import encode_batch
from rocketray.wire.offset_records import (OFFSETS_TOPIC, OffsetCommit, OffsetRecordError, commit_message,
                                           decode_commit, encode_commit, encode_reset, reset_message)
from rocketray.broker.offsets import OffsetTable, fold_all


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


def test_reset_golden_bytes_and_version_one_still_decodes():
    """A reset is a version-2 record naming its kind; commits stay version 1 (old records decode)."""
    assert encode_reset("billing", [("orders", 3, 0)]) == bytes.fromhex("9402a57265736574a762696c6c696e679193a66f7264657273" "0300")
    assert decode_commit(bytes.fromhex("9402a57265736574a762696c6c696e679193a66f72646572730300")) == [
        OffsetCommit("billing", "orders", 3, 0, reset=True)]
    assert decode_commit(bytes.fromhex("9301a762696c6c696e679193a66f72646572730311")) == [
        OffsetCommit("billing", "orders", 3, 17, reset=False)]
    msg, _ = decode_record(encode_batch([reset_message("g", [("t", 0, 2)], born_timestamp_ms=5)]).data)
    assert msg.topic == OFFSETS_TOPIC and decode_commit(msg.body) == [OffsetCommit("g", "t", 0, 2, reset=True)]


@pytest.mark.parametrize("body", [
    msgpack.packb([2, "reset", "g", []]), msgpack.packb([2, "rewind", "g", [["t", 0, 1]]]),
    msgpack.packb([2, "reset", "g"]), msgpack.packb([1, "reset", "g", [["t", 0, 1]]]),
    msgpack.packb([3, "reset", "g", [["t", 0, 1]]]),
])
def test_malformed_reset_bodies_raise_the_codec_error_only(body):
    with pytest.raises(OffsetRecordError):
        decode_commit(body)


C, R = encode_commit, encode_reset


@pytest.mark.parametrize("records, expected", [
    # a reset goes back: the one record that may
    ([C("g", [("t", 0, 10)]), R("g", [("t", 0, 0)])], 0),
    # progress read from the reset point moves it forward again
    ([C("g", [("t", 0, 10)]), R("g", [("t", 0, 0)]), C("g", [("t", 0, 3)])], 3),
    # a commit before the reset in log order is overridden by it
    ([C("g", [("t", 0, 4)]), C("g", [("t", 0, 10)]), R("g", [("t", 0, 6)])], 6),
    # a late commit from before the reset that lands after it wins the race (max against the reset)
    ([C("g", [("t", 0, 10)]), R("g", [("t", 0, 0)]), C("g", [("t", 0, 10)])], 10),
    # ... and a late lower commit after a reset is still absorbed by the maximum
    ([R("g", [("t", 0, 8)]), C("g", [("t", 0, 5)])], 8),
    # a reset may also move forward, and of a queue never committed
    ([R("g", [("t", 0, 7)])], 7),
    # the last of two resets wins
    ([R("g", [("t", 0, 7)]), R("g", [("t", 0, 2)])], 2),
    # a reset of another group, topic or queue changes nothing here
    ([C("g", [("t", 0, 9)]), R("h", [("t", 0, 0)]), R("g", [("u", 0, 0)]), R("g", [("t", 1, 0)])], 9),
])
def test_the_fold_applies_a_reset_as_an_assignment_and_commits_as_the_maximum(records, expected):
    """Fold table: only a reset record moves an offset back; commits keep the running maximum
    against whatever the last reset set."""
    assert fold_all(enumerate(records)).committed("g", "t", 0) == expected

