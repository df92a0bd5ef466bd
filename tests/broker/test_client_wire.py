"""The client port's frames: round trips, golden header bytes, and bad input that raises WireError only
(fed whole, byte by byte, and in every chunking h11-style)."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from rocketray.wire.client_frames import (HEADER, MAX_BODY_BYTES, FrameDecoder, FrameType, WireError,
                                          decode_commit_request, encode_commit_request,
                                          decode_offsets_answer, decode_pull_answer, decode_put_answer,
                                          decode_put_request, encode_frame, encode_offsets_answer,
                                          encode_pull_answer, encode_put_answer, PUT_COUNT, PullRequest,
                                          decode_pull_request, decode_queue_offsets, decode_search_request,
                                          encode_pull_request, encode_search_request, pack, unpack)
from rocketray.wire.pull_result import OffsetsResult, OffsetsStatus, PullResult, PullStatus
from rocketray.wire.put_result import PutResult, PutStatus, Written
from rocketray.ha.ack import refused


def joined(parts) -> bytes:
    return b"".join(bytes(p) for p in parts)


def test_golden_header():
    """magic RRCL, version 1, type, request id u64, body length u32, big-endian."""
    assert joined(encode_frame(FrameType.PUT, 7, b"ab")) == bytes.fromhex("5252434c" "01" "01" "0000000000000007"
                                                                         "00000002") + b"ab"


def test_frames_decode_in_any_chunking():
    stream = joined(encode_frame(FrameType.PULL, 1, b"x" * 10) + encode_frame(FrameType.PUT, 2, b"")
                    + encode_frame(FrameType.COMMIT, 3, b"yz"))
    one_by_one, dec = [], FrameDecoder()
    for i in range(len(stream)):
        one_by_one += dec.feed(stream[i:i + 1])
    assert [(f.type, f.request_id, bytes(f.body)) for f in one_by_one] == [
        (FrameType.PULL, 1, b"x" * 10), (FrameType.PUT, 2, b""), (FrameType.COMMIT, 3, b"yz")]
    assert dec.buffered == 0


@pytest.mark.parametrize("bad", [
    b"XXXX" + bytes(14),                                             # magic
    HEADER.pack(b"RRCL", 2, 1, 1, 0),                                # version
    HEADER.pack(b"RRCL", 1, 42, 1, 0),                               # type
    HEADER.pack(b"RRCL", 1, 1, 1, MAX_BODY_BYTES + 1),               # oversize: refused before the body comes
])
def test_bad_headers_raise_wire_error(bad):
    with pytest.raises(WireError):
        FrameDecoder().feed(bad)


@given(st.binary(max_size=64))
def test_random_bytes_give_frames_more_or_wire_error(data):
    try:
        FrameDecoder().feed(data)
    except WireError:
        pass


@pytest.mark.parametrize("result", [
    PutResult(PutStatus.PUT_OK, Written.YES, ((0, 0), (1, 200)), 400, 2),
    PutResult(PutStatus.FLUSH_SLAVE_TIMEOUT, Written.YES, ((5, 10),), 99, None),
    PutResult(PutStatus.MASTER_CHANGED, Written.UNKNOWN, ((5, 10),), 99, 1),
    refused(PutStatus.NOT_MASTER),
])
def test_put_answers_round_trip(result):
    assert decode_put_answer(encode_put_answer(result)) == result


def test_put_request_carries_the_count_and_the_batch():
    assert decode_put_request(PUT_COUNT.pack(3) + b"records") == (3, b"records")
    with pytest.raises(WireError):
        decode_put_request(b"\x00")


@pytest.mark.parametrize("body", [b"", b"\x00" * 5, encode_put_answer(refused(PutStatus.FENCED)) + b"x",
                                  bytes([9, 0]) + bytes(20)])
def test_bad_put_answers_raise_wire_error(body):
    with pytest.raises(WireError):
        decode_put_answer(body)


def test_pull_and_offsets_answers_round_trip():
    pull = PullResult(PullStatus.FOUND, b"records", 2, 5, 7, 9, "")
    assert decode_pull_answer(joined(encode_pull_answer(pull))) == pull
    offsets = OffsetsResult(OffsetsStatus.OK, (("t", 0, 4),), (("t", 0, 9),), "")
    assert decode_offsets_answer(encode_offsets_answer(offsets)) == offsets
    for bad in (b"", b"\x00\x00\x00\x09ab", b"\x00\x00\x00\x01\xc1"):
        with pytest.raises(WireError):
            decode_pull_answer(bad)
    with pytest.raises(WireError):
        decode_offsets_answer(b"\x93\x01\x02\x03")


def test_pull_requests_round_trip_and_carry_a_filter_only_when_they_filter():
    """A pull without a filter is the seven fields every broker reads; a filter adds an eighth."""
    plain = PullRequest("t", 1, 5, 10, 1024, 100, "g")
    assert unpack(encode_pull_request(plain), "x") == ["t", 1, 5, 10, 1024, 100, "g"]
    assert decode_pull_request(encode_pull_request(plain)) == plain
    filtered = PullRequest("t", 1, 5, 10, 1024, 100, None, "a || b")
    assert len(unpack(encode_pull_request(filtered), "x")) == 8
    assert decode_pull_request(encode_pull_request(filtered)) == filtered
    assert decode_pull_request(pack(["t", 1, 5, 10, 1024, 100, "g", None])).tag_filter is None


@pytest.mark.parametrize("fields", [
    ["t", 1, 5, 10, 1024, 100],                       # six
    ["t", 1, 5, 10, 1024, 100, "g", "a", "extra"],    # nine
    ["t", 1, 5, 10, 1024, 100, "g", 7],               # a filter that is not a str
    ["t", 1, 5, 10, 1024, 100, "g", ["a"]],
    ["t", 1, 5, 10, 1024, True, "g"],
    [1, 1, 5, 10, 1024, 100, "g"],
])
def test_malformed_pull_requests_raise_wire_error(fields):
    with pytest.raises(WireError):
        decode_pull_request(pack(fields))


def test_commit_requests_round_trip_with_and_without_the_reset_kind():
    """A commit is [group, entries]; an admin's reset adds "reset" (the old two-field body is unchanged)."""
    assert encode_commit_request("g", [("t", 0, 3)]) == pack(["g", [["t", 0, 3]]])
    assert decode_commit_request(encode_commit_request("g", [("t", 0, 3)])) == ("g", [("t", 0, 3)], False)
    assert decode_commit_request(encode_commit_request("g", [("t", 1, 0)], reset=True)) == ("g", [("t", 1, 0)], True)
    for bad in (["g", [["t", 0, 1]], "rewind"], ["g", [["t", 0, 1]], True], ["g"], [5, [["t", 0, 1]]],
                ["g", [["t", 0]]], ["g", [[0, 0, 1]]], {"g": 1}):
        with pytest.raises(WireError):
            decode_commit_request(pack(bad))


def test_search_offset_requests_and_answers_round_trip():
    body = encode_search_request([("t", 0), ("u", 3)], 1_700_000_000_000)
    assert decode_search_request(body) == ([("t", 0), ("u", 3)], 1_700_000_000_000)
    assert decode_queue_offsets(pack([["t", 0, 4]]), "search offset") == (("t", 0, 4),)
    for bad in ([[["t", 0]], -1], [[["t", 0]], True], [[["t"]], 5], [["t", 0], 5], [[], "5"], [[]]):
        with pytest.raises(WireError):
            decode_search_request(pack(bad))
    with pytest.raises(WireError):
        decode_queue_offsets(pack([["t", 0]]), "search offset")
