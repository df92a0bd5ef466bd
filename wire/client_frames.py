"""The client port's wire format: frames between a client and a broker actor, pure (no IO).

Theory of operation. After TLS and the user's SCRAM-SHA-256 login (``actors/client_port.py``,
``rocketray.scram``), a connection carries frames in both directions::

    header (18 bytes, big-endian)
        magic       4s   b"RRCL"
        version     u8   1
        type        u8   a request type, or its response (request type | 0x80), or ERROR
        request_id  u64  chosen by the client, echoed by the broker (answers may come out of order:
                         a held pull does not delay a put behind it)
        body_len    u32  at most ``MAX_BODY_BYTES``
    body        body_len bytes

Bodies. A put's request body is a u32 record count and the producer's encoded batch itself (the
commit-log records, the bytes the master appends), and a pull's answer carries the stored records as they are, after a
small msgpack header: neither is copied into another encoding. Everything else is msgpack with
positional fields; nothing is ever unpickled. A put or commit answer is a fixed struct
(``PUT_ANSWER``) followed by the ``(queue_offset, physical_offset)`` pairs.

Bad input. :class:`FrameDecoder` raises :class:`WireError` on a bad magic, version, type or an
oversized body; the server then answers an ERROR frame when it can and closes that connection only.
Body decoders raise ``WireError`` for anything malformed, never anything else.
"""

from __future__ import annotations

import enum
import itertools
import struct
from dataclasses import dataclass
from typing import Any

import msgpack

from rocketray.wire.pull_result import OffsetsResult, OffsetsStatus, PullResult, PullStatus
from rocketray.wire.put_result import PutResult, PutStatus, Written

__all__ = ["MAGIC", "VERSION", "HEADER", "MAX_BODY_BYTES", "FrameType", "Frame", "FrameDecoder", "WireError",
           "encode_frame", "PUT_COUNT", "decode_put_request", "encode_put_answer", "decode_put_answer", "encode_pull_answer", "decode_pull_answer",
           "encode_offsets_answer", "decode_offsets_answer", "pack", "unpack", "answer_type", "PullRequest",
           "encode_pull_request", "decode_pull_request", "encode_search_request", "decode_search_request",
           "encode_commit_request", "decode_commit_request",
           "decode_queue_offsets"]

MAGIC = b"RRCL"
VERSION = 1
HEADER = struct.Struct(">4sBBQI")
MAX_BODY_BYTES = 80 << 20        # a 64 MiB batch or pull plus headers
PUT_ANSWER = struct.Struct(">BBqqI")
OFFSET_PAIR = struct.Struct(">qq")
_WRITTEN = {Written.NO: 0, Written.YES: 1, Written.UNKNOWN: 2}
_WRITTEN_BACK = {v: k for k, v in _WRITTEN.items()}


class WireError(ValueError):
    """Bytes that are not a valid frame or body: the connection that sent them is closed."""


class FrameType(enum.IntEnum):
    PUT = 1            # body: u32 record count, then the encoded batch
    PULL = 2           # body: msgpack [topic, queue_id, offset, max_count, max_bytes, hold_ms, group|nil
                       #                (, tag expression: only when the pull filters)]
    COMMIT = 3         # body: msgpack [group, [[topic, queue_id, offset], ...](, "reset": an admin's reset)]
    COMMITTED = 4      # body: msgpack [group, [topic, ...]|nil]
    QUEUE_MAX = 5      # body: msgpack [[topic, queue_id], ...]
    METADATA = 6       # body: msgpack []: the cluster's groups, brokers, masters (wire/client_control.py)
    WATCH = 7          # body: msgpack [group, known_epoch, wait_ms]: answered at a newer master or the wait's end
    CONTROL = 8        # body: msgpack [request type, fields]: a client request for the controller leader
    SEARCH_OFFSET = 9  # body: msgpack [[[topic, queue_id], ...], timestamp_ms]: first offsets stored at or after
    PUT_ANSWER = 0x81
    PULL_ANSWER = 0x82
    COMMIT_ANSWER = 0x83
    COMMITTED_ANSWER = 0x84
    QUEUE_MAX_ANSWER = 0x85
    METADATA_ANSWER = 0x86
    WATCH_ANSWER = 0x87
    CONTROL_ANSWER = 0x88
    SEARCH_OFFSET_ANSWER = 0x89
    ERROR = 0xFF       # body: msgpack [code, message]; the broker then closes the connection


def answer_type(request: FrameType) -> FrameType:
    return FrameType(request | 0x80)


@dataclass(frozen=True, slots=True)
class Frame:
    type: FrameType
    request_id: int
    body: bytes | memoryview


def encode_frame(frame_type: FrameType, request_id: int, *body: bytes | memoryview) -> list[bytes | memoryview]:
    """The frame as buffers to write in order (the body's parts are not joined)."""
    length = sum(len(b) for b in body)
    if length > MAX_BODY_BYTES:
        raise WireError(f"a frame body of {length} bytes is over {MAX_BODY_BYTES}")
    return [HEADER.pack(MAGIC, VERSION, frame_type, request_id, length), *body]


class FrameDecoder:
    """Feed received bytes, take whole frames (h11 style). Bodies are views into one buffer per
    frame, never copied again."""

    def __init__(self, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self._buf = bytearray()
        self._max = max_body_bytes

    def feed(self, data: bytes | memoryview) -> list[Frame]:
        self._buf += data
        frames = []
        pos = 0
        buf = self._buf
        while len(buf) - pos >= HEADER.size:
            magic, version, ftype, request_id, length = HEADER.unpack_from(buf, pos)
            if magic != MAGIC:
                raise WireError(f"bad frame magic {bytes(magic)!r}")
            if version != VERSION:
                raise WireError(f"unsupported frame version {version}")
            if length > self._max:
                raise WireError(f"frame body of {length} bytes is over {self._max}")
            try:
                frame_type = FrameType(ftype)
            except ValueError:
                raise WireError(f"unknown frame type {ftype}") from None
            end = pos + HEADER.size + length
            if len(buf) < end:
                break
            frames.append(Frame(frame_type, request_id, bytes(buf[pos + HEADER.size:end])))
            pos = end
        if pos:
            del buf[:pos]
        return frames

    @property
    def buffered(self) -> int:
        return len(self._buf)


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def unpack(body: bytes | memoryview, what: str) -> Any:
    try:
        return msgpack.unpackb(bytes(body), raw=False, use_list=True, strict_map_key=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise WireError(f"{what}: not msgpack ({exc})") from None


PUT_COUNT = struct.Struct(">I")


def decode_put_request(body: bytes | memoryview) -> tuple[int, bytes]:
    """``(record count, batch bytes)`` of a put (the master verifies the records and the count)."""
    if len(body) < PUT_COUNT.size:
        raise WireError("put request too short")
    return PUT_COUNT.unpack_from(body, 0)[0], bytes(memoryview(body)[PUT_COUNT.size:])


def encode_put_answer(result: PutResult) -> bytes:
    n = len(result.offsets)
    pairs = struct.pack(f">{2 * n}q", *itertools.chain.from_iterable(result.offsets)) if n else b""
    broker_id = -1 if result.broker_id is None else result.broker_id
    return PUT_ANSWER.pack(int(result.status), _WRITTEN[result.written], result.end_offset, broker_id,
                           len(result.offsets)) + pairs


def decode_put_answer(body: bytes | memoryview) -> PutResult:
    if len(body) < PUT_ANSWER.size:
        raise WireError("put answer too short")
    status, written, end_offset, broker_id, count = PUT_ANSWER.unpack_from(body, 0)
    if len(body) != PUT_ANSWER.size + count * OFFSET_PAIR.size:
        raise WireError("put answer length does not match its offset count")
    try:
        put_status, written_as = PutStatus(status), _WRITTEN_BACK[written]
    except (ValueError, KeyError):
        raise WireError(f"bad put answer status {status}/{written}") from None
    offsets = tuple(OFFSET_PAIR.iter_unpack(memoryview(body)[PUT_ANSWER.size:]))
    try:
        return PutResult(put_status, written_as, offsets, end_offset, None if broker_id < 0 else broker_id)
    except AssertionError:
        raise WireError("inconsistent put answer") from None


@dataclass(frozen=True, slots=True)
class PullRequest:
    """A pull's fields as a client port received them (the broker checks their ranges)."""

    topic: str
    queue_id: int
    offset: int
    max_count: int
    max_bytes: int
    hold_ms: int
    group: str | None
    tag_filter: str | None = None   # a subscription expression (rocketray.broker.tag_filter); None: all


def encode_pull_request(request: PullRequest) -> bytes:
    """The PULL body: seven fields, an eighth only when the pull filters (a broker that predates
    filters still reads every other pull)."""
    fields: list[Any] = [request.topic, request.queue_id, request.offset, request.max_count, request.max_bytes,
                         request.hold_ms, request.group]
    if request.tag_filter is not None:
        fields.append(request.tag_filter)
    return pack(fields)


def decode_pull_request(body: bytes | memoryview) -> PullRequest:
    args = unpack(body, "pull")
    if not (isinstance(args, list) and len(args) in (7, 8) and isinstance(args[0], str)
            and all(isinstance(a, int) and not isinstance(a, bool) for a in args[1:6])
            and (args[6] is None or isinstance(args[6], str))
            and (len(args) == 7 or args[7] is None or isinstance(args[7], str))):
        raise WireError("pull: expected [topic, queue_id, offset, max_count, max_bytes, hold_ms, group(, tag_filter)]")
    return PullRequest(*args)


def encode_commit_request(group: str, entries: list[tuple[str, int, int]], reset: bool = False) -> bytes:
    """A COMMIT body; ``reset``: an admin's reset of the group's offsets (a reset record)."""
    return pack([group, [list(e) for e in entries]] + (["reset"] if reset else []))


def decode_commit_request(body: bytes | memoryview) -> tuple[str, list[tuple[str, int, int]], bool]:
    """``(group, entries, reset)`` of a COMMIT request (entries' ints are checked by the fold's codec)."""
    value = unpack(body, "commit")
    if not (isinstance(value, list) and len(value) in (2, 3) and (len(value) == 2 or value[2] == "reset")
            and isinstance(value[0], str) and isinstance(value[1], list)
            and all(isinstance(x, list) and len(x) == 3 and isinstance(x[0], str) for x in value[1])):
        raise WireError("commit: expected [group, [[topic, queue_id, offset], ...](, 'reset')]")
    return value[0], [tuple(x) for x in value[1]], len(value) == 3


def encode_search_request(queues: list[tuple[str, int]], timestamp_ms: int) -> bytes:
    return pack([[list(q) for q in queues], timestamp_ms])


def decode_search_request(body: bytes | memoryview) -> tuple[list[tuple[str, int]], int]:
    """``(queues, timestamp_ms)`` of a SEARCH_OFFSET request."""
    value = unpack(body, "search offset")
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], list)
            and isinstance(value[1], int) and not isinstance(value[1], bool) and 0 <= value[1] < 2**63
            and all(isinstance(q, list) and len(q) == 2 and isinstance(q[0], str)
                    and isinstance(q[1], int) and not isinstance(q[1], bool) for q in value[0])):
        raise WireError("search offset: expected [[[topic, queue_id], ...], timestamp_ms >= 0]")
    return [(t, q) for t, q in value[0]], value[1]


def decode_queue_offsets(body: bytes | memoryview, what: str) -> tuple[tuple[str, int, int], ...]:
    """A QUEUE_MAX or SEARCH_OFFSET answer: ``[[topic, queue_id, offset], ...]``."""
    value = unpack(body, what)
    try:
        return tuple((str(t), int(q), int(o)) for t, q, o in value)
    except (TypeError, ValueError):
        raise WireError(f"malformed {what} answer") from None


def encode_pull_answer(result: PullResult) -> list[bytes]:
    head = pack([int(result.status), result.count, result.offset, result.next_offset, result.max_offset,
                 result.remark])
    return [struct.pack(">I", len(head)), head, result.records]


def decode_pull_answer(body: bytes | memoryview) -> PullResult:
    if len(body) < 4:
        raise WireError("pull answer too short")
    (head_len,) = struct.unpack_from(">I", body, 0)
    if 4 + head_len > len(body):
        raise WireError("pull answer header longer than the body")
    head = unpack(memoryview(body)[4:4 + head_len], "pull answer")
    try:
        status, count, offset, next_offset, max_offset, remark = head
        return PullResult(PullStatus(status), bytes(memoryview(body)[4 + head_len:]), int(count), int(offset),
                          int(next_offset), int(max_offset), str(remark))
    except (TypeError, ValueError):
        raise WireError("malformed pull answer header") from None


def encode_offsets_answer(result: OffsetsResult) -> bytes:
    return pack([int(result.status), [list(c) for c in result.committed], [list(m) for m in result.max_offsets],
                 result.remark])


def decode_offsets_answer(body: bytes | memoryview) -> OffsetsResult:
    try:
        status, committed, maxes, remark = unpack(body, "offsets answer")
        return OffsetsResult(OffsetsStatus(status), tuple((str(t), int(q), int(o)) for t, q, o in committed),
                             tuple((str(t), int(q), int(o)) for t, q, o in maxes), str(remark))
    except (TypeError, ValueError):
        raise WireError("malformed offsets answer") from None
