"""The Raft port's wire (pure): frames, the message codec, and the shape of every message.

Theory of operation. pysyncobj's own ``TcpConnection`` frames a message as a signed 32-bit length
and ``zlib(pickle(message))``, buffers a frame of any announced length with ``bytes +=`` and
unpickles it. Our connection (``controller/raft_conn.py``) replaces that codec on both ends:

- A frame is a 4-byte little-endian **unsigned** length, then that many bytes of body. The length
  is checked against the connection's bound as soon as its 4 bytes are in, before any byte of the
  body is kept (``FrameReader``); a longer frame closes that connection. The reader keeps one
  ``bytearray`` and consumes whole frames from its front (no quadratic copying).
- The body is one msgpack document (TLS mode) or a Fernet token of one (development mode, the
  members' secret as pysyncobj's ``password``). msgpack has no globals and no code: a message
  decodes to maps, arrays (as tuples, like pysyncobj's pickled tuples), bytes, str, int, bool and
  None only, and nothing on this port is unpickled. The commands pysyncobj pickles *inside* log
  entries are decoded by ``controller/raft_pickle.py``'s restricted unpickler at apply time.
- Every decoded message is checked against ``SCHEMA`` (the messages pysyncobj 0.3.17 sends, and
  our keepalive) before pysyncobj sees it: a message of an unknown type, with an unknown or
  missing field or a field of the wrong type closes that connection (``message_problem``). Log
  entries may carry only the command kinds our members write (a regular command or pysyncobj's
  no-op); a membership or version command is refused at the door.

Bounds. What pysyncobj really sends (``appendEntriesBatchSizeBytes`` and ``logCompactionBatchSize``,
both set to ``RAFT_CHUNK_BYTES`` by ``controller/raft.py``): an ``append_entries`` carries entries
until their commands reach ``RAFT_CHUNK_BYTES`` (so at most ``RAFT_CHUNK_BYTES`` plus one entry), an
entry whose command alone is larger travels pickled in ``RAFT_CHUNK_BYTES`` chunks, a snapshot in
``RAFT_CHUNK_BYTES`` chunks. One entry's command is pysyncobj's protocol-2 pickle of one payload of
at most ``leader_pipeline.MAX_BATCH_BYTES`` (256 KiB; protocol 2 writes bytes as latin-1 text, up
to twice as long). ``WORST_MESSAGE_BYTES`` is that bound in development mode (Fernet's base64
adds a third); ``raft_max_frame_bytes`` must not be below it (``ControllerConfig.validate``), and
``tests/security/test_raft_wire.py`` builds the largest messages and checks them against it.
"""

from __future__ import annotations

import struct
from typing import Any, Callable

import msgpack

__all__ = ["FrameReader", "LENGTH", "RAFT_CHUNK_BYTES", "SCHEMA", "WORST_MESSAGE_BYTES", "WireError",
           "decode_message", "encode_frame", "encode_message", "message_problem"]

LENGTH = struct.Struct("<I")
RAFT_CHUNK_BYTES = 64 * 1024
_MAX_COMMAND_BYTES = 2 * (256 * 1024 + 64) + 64           # pickle protocol 2 of one payload
WORST_MESSAGE_BYTES = (RAFT_CHUNK_BYTES + _MAX_COMMAND_BYTES + 4096) * 4 // 3 + 1024  # + Fernet
_REGULAR, _NO_OP = 0, 1                                    # pysyncobj's _COMMAND_TYPE
_INT_MAX = 2 ** 63 - 1


class WireError(ValueError):
    """A frame or message that is not ours: the connection that carried it is closed."""


class FrameReader:
    """Splits a byte stream into frames; refuses a length above ``max_frame`` at its prefix.

    ``push`` appends what arrived, ``pop`` takes one whole frame off the front (the bound may change
    between two frames: a connection raises it once its peer is admitted)."""

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def push(self, data: bytes) -> None:
        self._buf += data

    def pop(self) -> bytes | None:
        """The next whole frame's body, None if it has not fully arrived; WireError on a length
        over the bound (close the connection: the stream cannot be resynchronised)."""
        buf = self._buf
        if len(buf) < LENGTH.size:
            return None
        (size,) = LENGTH.unpack_from(buf, 0)
        if size > self.max_frame:
            raise WireError(f"frame of {size} bytes announced, over the bound of {self.max_frame}")
        end = LENGTH.size + size
        if len(buf) < end:
            return None
        with memoryview(buf) as view:
            body = bytes(view[LENGTH.size:end])
        del buf[:end]  # CPython moves a bytearray's start: no copy of what follows
        return body


def encode_frame(body: bytes) -> bytes:
    return LENGTH.pack(len(body)) + body


def encode_message(message: Any) -> bytes:
    return msgpack.packb(message, use_bin_type=True)


def decode_message(body: bytes) -> Any:
    """One msgpack document (arrays as tuples); WireError on anything else."""
    try:
        return msgpack.unpackb(body, raw=False, use_list=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types on malformed input
        raise WireError(f"undecodable message: {type(exc).__name__}: {exc}") from None


# -- message shapes ------------------------------------------------------------------------------

Check = Callable[[Any], bool]


def _uint(value: Any) -> bool:
    return type(value) is int and 0 <= value <= _INT_MAX


def _bool(value: Any) -> bool:
    return type(value) is bool


def _bytes(value: Any) -> bool:
    return type(value) is bytes


def _command(value: Any, kinds: tuple[int, ...] = (_REGULAR, _NO_OP)) -> bool:
    return type(value) is bytes and len(value) >= 1 and value[0] in kinds


def _regular_command(value: Any) -> bool:
    return _command(value, (_REGULAR,))


def _entry(value: Any) -> bool:
    return (type(value) is tuple and len(value) == 3 and _command(value[0])
            and _uint(value[1]) and _uint(value[2]))


def _entries(value: Any) -> bool:
    return type(value) is tuple and all(_entry(e) for e in value)


def _transmission(value: Any) -> bool:
    return value in ("start", "process", "finish")


def _serialized(value: Any) -> bool:
    return value is None or (type(value) is tuple and len(value) == 3 and _bytes(value[0])
                             and _bool(value[1]) and _bool(value[2]))


#: type -> (required fields, optional fields), each field -> its check.
SCHEMA: dict[str, tuple[dict[str, Check], dict[str, Check]]] = {
    "request_vote": ({"term": _uint, "last_log_index": _uint, "last_log_term": _uint}, {}),
    "response_vote": ({"term": _uint}, {}),
    "timeout_now": ({"term": _uint}, {}),
    "append_entries": ({"term": _uint, "commit_index": _uint},
                       {"entries": _entries, "prevLogIdx": _uint, "prevLogTerm": _uint,
                        "transmission": _transmission, "data": _bytes, "serialized": _serialized}),
    "next_node_idx": ({"next_node_idx": _uint, "reset": _bool, "success": _bool}, {}),
    "apply_command": ({"command": _regular_command}, {"request_id": _uint}),
    "apply_command_response": ({"request_id": _uint}, {"error": _uint, "log_idx": _uint, "log_term": _uint}),
    "rr_keepalive": ({}, {}),
}


def message_problem(message: Any) -> str | None:
    """None if ``message`` is one pysyncobj may receive, else what is wrong with it."""
    if type(message) is not dict:
        return f"a message is a map, not {type(message).__name__}"
    kind = message.get("type")
    if not isinstance(kind, str) or kind not in SCHEMA:
        return f"unknown message type {kind!r:.40}"
    required, optional = SCHEMA[kind]
    for name, check in required.items():
        if name not in message:
            return f"{kind} lacks {name}"
        if not check(message[name]):
            return f"{kind}.{name} is malformed"
    for name, value in message.items():
        if name == "type" or name in required:
            continue
        if name not in optional:
            return f"{kind} has an unknown field {name!r:.40}"
        if not optional[name](value):
            return f"{kind}.{name} is malformed"
    return _relation_problem(kind, message)


def _relation_problem(kind: str, message: dict[str, Any]) -> str | None:
    if kind == "append_entries":
        if "transmission" in message and not ("data" in message and "prevLogIdx" in message
                                               and "entries" not in message):
            return "append_entries: a transmission chunk needs data and prevLogIdx, and no entries"
        if ("entries" in message or "transmission" in message) != ("prevLogIdx" in message) or \
                ("prevLogIdx" in message) != ("prevLogTerm" in message):
            return "append_entries: entries come with prevLogIdx and prevLogTerm"
    if kind == "apply_command_response" and "error" not in message \
            and not ("log_idx" in message and "log_term" in message):
        return "apply_command_response without an error needs log_idx and log_term"
    return None
