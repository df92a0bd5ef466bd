"""The C record loops (wire/_records.c) against their Python reference: the ``*_py`` loops of
broker/batch.py and wire/batch.py.

``seal_batch`` / ``index_records`` run the C loop; ``seal_batch_py`` / ``index_records_py`` the
Python one. On valid batches, damaged ones (flipped bytes, cuts, spliced garbage, bad topics and
properties) and adversarial ones (thousands of queues) both must return equal results or raise
:class:`MessageCodecError` with the same message, in every mode: seal, verify and the trusted scan.
"""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketray.broker import batch as b
from rocketray.wire import batch as wb
from rocketray.wire import message as m
from rocketray.wire.message import Message, MessageCodecError
from rocketray.wire.batch import EncodedBatch, encode_batch

MAX = 4 << 20


def test_the_c_loops_are_built():
    """CI installs a compiler and libisal-dev: the product runs the C loops there, so this suite
    tests them (a user without a compiler gets the Python loops, also tested here)."""
    assert wb.RECORDS_IMPLEMENTATION == "c+isal", wb.RECORDS_IMPLEMENTATION


def outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except MessageCodecError as exc:
        return ("error", str(exc))


def sealed(fn, batch: EncodedBatch, base: int, offsets: dict) -> tuple:
    kind, got = outcome(fn, batch, base, offsets, 1234, MAX)
    return (kind, (bytes(got.data), got.index)) if kind == "ok" else (kind, got)


def messages(rng: random.Random, n: int, topics=("A", "B_2", "Topic-%|x"), queues=3) -> list[Message]:
    out = []
    for i in range(n):
        props = rng.choice([{}, {"TAGS": f"t{i % 3}"}, {"pid": f"p-{i}"}, {"KEYS": "k", "TAGS": "x"}, {"é": "ü"}])
        out.append(Message(rng.choice(topics), rng.randrange(queues), rng.randbytes(rng.randrange(0, 200)), props,
                           flags=rng.randrange(4), born_timestamp_ms=1000 + i))
    return out


def damage(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    kind = rng.randrange(6)
    if kind == 0 and buf:
        for _ in range(rng.randrange(1, 4)):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
    elif kind == 1 and buf:
        del buf[rng.randrange(len(buf)):]
    elif kind == 2:
        at = rng.randrange(len(buf) + 1)
        buf[at:at] = rng.randbytes(rng.randrange(1, 80))
    elif kind == 3 and len(buf) > 60:
        struct.pack_into(">H", buf, 56, rng.choice([0, 128, 5000]))  # topic length out of range
    elif kind == 4 and len(buf) > 70:
        buf[66] = rng.choice([0x00, 0x20, 0xC3, ord("!")])  # a bad topic character
    elif kind == 5 and len(buf) > 8:
        struct.pack_into(">I", buf, 0, rng.choice([0, 65, 1 << 30]))  # size field
    return bytes(buf)


def assert_same_everywhere(data: bytes, count: int, rng: random.Random) -> None:
    base = rng.choice([0, 1 << 20, 7777])
    offsets = {("A", 1): 5, ("B_2", 0): 1 << 40}
    batch = EncodedBatch(data, count)
    c, py = sealed(b.seal_batch, batch, base, offsets), sealed(b.seal_batch_py, batch, base, offsets)
    assert c == py
    stored = c[1][0] if c[0] == "ok" else data
    if c[0] == "ok":
        assert wb.record_offsets(stored) == wb.record_offsets_py(stored)
    for limit in (0, 1, 70, 300, len(stored) // 2, len(stored), 1 << 30):
        assert wb.whole_records_length(stored, limit) == wb.whole_records_length_py(stored, limit)
    for verify in (True, False):
        for buf in (stored, bytearray(stored), memoryview(stored)):
            assert outcome(b.index_records, buf, base, verify, 600) == outcome(b.index_records_py, buf, base, verify, 600)


@pytest.mark.parametrize("seed", range(40))
def test_valid_and_damaged_batches_give_the_same_result(seed: int) -> None:
    rng = random.Random(seed)
    msgs = messages(rng, rng.randrange(0, 60))
    data = encode_batch(msgs).data
    assert_same_everywhere(data, len(msgs), rng)
    for _ in range(20):
        assert_same_everywhere(damage(rng, data), len(msgs), rng)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400), st.integers(0, 3))
def test_arbitrary_bytes_give_the_same_result(data: bytes, count: int) -> None:
    assert_same_everywhere(data, count, random.Random(len(data)))


def test_many_queues_and_topics_in_one_batch() -> None:
    """Thousands of distinct queues (the C hash table grows) and topics alternating on one queue id."""
    rng = random.Random(5)
    msgs = [Message(f"T{i % 7}", i % 3000, b"x" * (i % 5), {"TAGS": str(i % 11)}) for i in range(9000)]
    assert_same_everywhere(encode_batch(msgs).data, len(msgs), rng)
    alternating = [Message("A" if i % 2 else "B", 0, b"y") for i in range(50)]
    assert_same_everywhere(encode_batch(alternating).data, 50, rng)


def test_stored_records_with_gaps_in_queue_offsets_split_runs_alike() -> None:
    """The slave's view: runs break where a queue's offsets are not contiguous."""
    recs = [Message("A", 0, b"a").with_position(qo, 0, 1) for qo in (0, 1, 5, 6, 2)]
    data = bytearray()
    for r in recs:
        data += m.encode_record(r.with_position(r.queue_offset, len(data), 1))
    c = b.index_records(bytes(data), 0, True)
    assert c == b.index_records_py(bytes(data), 0, True)
    assert [(r.first_queue_offset, r.count) for r in c.runs] == [(0, 2), (5, 2), (2, 1)]


def restamp(record: bytearray, physical: int) -> bytes:
    """The record stored at ``physical``, both CRCs recomputed (whatever its properties hold)."""
    body_start = len(record) - struct.unpack_from(">I", record, 62)[0]
    struct.pack_into(">q", record, 32, physical)
    struct.pack_into(">I", record, 12, m.crc32(bytes(record[body_start:])))
    struct.pack_into(">I", record, 8, m.crc32(bytes(record[12:body_start]), m.crc32(bytes(record[:8]))))
    return bytes(record)


def test_a_callback_error_in_the_trusted_scan_ends_it_with_the_reason() -> None:
    """Malformed properties (checked by the Python callback) in a record whose framing and CRCs
    are fine: the trusted scan stops before it with the reason, verify raises the same message."""
    first = m.encode_record(Message("A", 0, b"1", {"TAGS": "x"}).with_position(0, 0, 1))
    second = bytearray(m.encode_record(Message("A", 0, b"2", {"TAGS": "y"}).with_position(1, len(first), 1)))
    at = second.index(b"TAGS\x01y\x02")
    second[at + 6] = 0x01  # "TAGS 01 y 01": no pair separator
    stored = first + restamp(second, len(first))
    c = b.index_records(stored, 0, False)
    assert c == b.index_records_py(stored, 0, False)
    assert c.count == 1 and c.error is not None and "properties" in c.error
    with pytest.raises(MessageCodecError) as c_err:
        b.index_records(stored, 0, True)
    with pytest.raises(MessageCodecError) as py_err:
        b.index_records_py(stored, 0, True)
    assert str(c_err.value) == str(py_err.value)


PROPS_ALPHABET = [b"\x01", b"\x02", b"T", b"A", b"G", b"S", b"a", b"K", b"\x80", b"\xc3\xa9", b"\xff", b"\x00"]


def raw_props_batch(props: list[bytes]) -> bytes:
    """A batch of one-byte-body records on queue 0 whose properties are exactly ``props`` (unchecked)."""
    topic = m.topic_bytes("A")
    return b"".join(m.encode_fields(topic, p, b"x", 0, 1000 + i) for i, p in enumerate(props))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.sampled_from(PROPS_ALPHABET), max_size=14).map(b"".join), min_size=1, max_size=4))
def test_properties_of_any_bytes_give_the_same_result(props: list[bytes]) -> None:
    """The C loop decides plain properties (no TAGS, ASCII, well formed) itself and hands every
    other one to properties_tag_hash: the same tags and the same errors as the Python loop, for
    properties made of separators, TAGS names, non-ASCII and invalid UTF-8 bytes."""
    assert_same_everywhere(raw_props_batch(props), len(props), random.Random(len(props)))


@pytest.mark.parametrize("raw", [b"TAGS\x01x\x02", b"MYTAGS\x01x\x02", b"a\x01TAGS\x01\x02", b"\x01\x02",
                                 b"a\x01b", b"a\x01b\x02\x02", b"a\x02", b"a\x01b\x02\x01c\x02", b"\xc3\xa9\x01b\x02",
                                 b"k\x01v\x02TAGS\x01t\x02", b"abc"])
def test_properties_the_c_loop_does_not_decide_go_to_python(raw: bytes) -> None:
    if raw:
        assert_same_everywhere(raw_props_batch([raw]), 1, random.Random(1))


def test_a_client_record_s_properties_need_no_callback() -> None:
    """A client's usual record (its properties are its UNIQ_KEY, or user names without TAGS) is
    checked in C: the Python tag callback is not called once; a TAGS name still calls it."""
    calls: list[bytes] = []

    def tag_of(raw: bytes) -> int:
        calls.append(raw)
        return wb.properties_tag_hash(raw)

    def scan(props: list[bytes]) -> list:
        data = bytearray(raw_props_batch(props))
        return wb.C_LOOPS.scan(data, 0, 0, MAX, 1234, {}, wb.topic_of, tag_of, MessageCodecError)[2]

    plain = [b"UNIQ_KEY\x01%020X\x02" % i for i in range(50)] + [b"KEYS\x01k\x02pid\x01p-1\x02UNIQ_KEY\x01ID\x02"]
    runs = scan(plain)
    assert calls == [] and runs[0][4] == len(plain)
    assert all(struct.unpack_from(">qIQ", runs[0][3], 20 * i)[2] == 0 for i in range(len(plain)))
    runs = scan([b"TAGS\x01t\x02UNIQ_KEY\x01ID\x02"])
    assert calls == [b"TAGS\x01t\x02UNIQ_KEY\x01ID\x02"]
    assert struct.unpack_from(">qIQ", runs[0][3], 0)[2] == m.tag_hash({"TAGS": "t"}) != 0


def test_a_new_record_is_encoded_as_encode_fields_does() -> None:
    """``encode_new_record`` (C) gives ``encode_fields``'s bytes for any topic, properties, body,
    queue id and timestamp; what the C case does not take goes to ``encode_fields`` and raises
    (or encodes) as it does."""
    rng = random.Random(3)
    for _ in range(3000):
        args = (rng.randbytes(rng.randrange(1, 130)), rng.randbytes(rng.randrange(0, 60)),
                rng.randbytes(rng.randrange(0, 3000)),
                rng.choice([0, 7, -1, 2**31 - 1, -2**31, rng.randrange(-2**31, 2**31)]),
                rng.choice([0, -1, 2**63 - 1, -2**63, rng.randrange(-2**63, 2**63)]))
        assert wb.C_LOOPS.encode(*args) == wb.encode_new_record(*args) == m.encode_fields(*args)
    for odd in [(b"t", b"", b"x", 2**31, 0), (b"t", b"", b"x", 0, 2**63), (b"t", b"", b"x", -2**31 - 1, 0),
                (b"t" * 70000, b"", b"", 0, 0), (b"t", b"", b"x" * (64 << 20), 0, 0)]:
        assert wb.C_LOOPS.encode(*odd) is None
        assert outcome(wb.encode_new_record, *odd) == outcome(m.encode_fields, *odd)
        assert outcome(wb.encode_new_record, *odd)[0] == "error"
    for taken_by_python in [(bytearray(b"t"), b"", b"x", 0, 0), (b"t", b"", b"x", True, 5)]:
        assert wb.C_LOOPS.encode(*taken_by_python) is None
        assert wb.encode_new_record(*taken_by_python) == m.encode_fields(*taken_by_python)
