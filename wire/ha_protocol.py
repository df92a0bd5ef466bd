"""AutoSwitch HA packets: exact byte layouts and incremental decoders (pure).

Theory of operation. Replication runs over a plain TCP byte stream with no framing other than the
packet headers of reference section 11 (all integers big-endian):

- slave -> master: HANDSHAKE (16 bytes) and TRANSFER ack (12 bytes), told apart by the leading
  4-byte state field;
- master -> slave: HANDSHAKE reply (20-byte header + 12 bytes per epoch entry) and TRANSFER
  (36-byte header + raw commit-log bytes; a body of 0 bytes is a heartbeat).

Each direction has one decoder object. The caller feeds it whatever the socket produced
(``receive_data``) and pulls packets out with ``next_packet()``, which returns a packet, ``None``
when more bytes are needed, or raises ``ProtocolError`` when the bytes cannot be a valid packet.
A decoder consumes exactly the bytes of the packet it returns (unlike the Java reader, quirk 12)
so any chunking of the stream yields the same packets. After a ``ProtocolError`` the decoder is
dead: the connection must be closed.
"""

from __future__ import annotations

import collections
import enum
import struct
from dataclasses import dataclass

__all__ = [
    "ConnState", "ProtocolError", "SlaveHandshake", "SlaveAck", "MasterHandshake", "MasterTransfer",
    "EpochPoint", "encode_slave_handshake", "encode_slave_ack", "encode_master_handshake",
    "encode_master_transfer_header", "encode_master_transfer", "SlavePacketDecoder",
    "MasterPacketDecoder", "MAX_EPOCH_ENTRIES", "DEFAULT_MAX_BODY_BYTES",
    "SLAVE_HANDSHAKE_SIZE", "SLAVE_ACK_SIZE", "MASTER_HANDSHAKE_HEADER_SIZE",
    "MASTER_TRANSFER_HEADER_SIZE", "EPOCH_ENTRY_SIZE", "master_packet_length",
]

INT64_MAX = 2**63 - 1
MAX_EPOCH_ENTRIES = 1000             # the Java master's handshake buffer holds 1000 entries (quirk 12)
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024   # a transfer body larger than this is "absurd"

_SLAVE_HANDSHAKE = struct.Struct(">ihhq")      # state, isSyncFromLastFile, isAsyncLearner, slave id
_SLAVE_ACK = struct.Struct(">iq")              # state, offset
_MASTER_HANDSHAKE = struct.Struct(">iiqi")     # state, body size, master max offset, last epoch
_EPOCH_ENTRY = struct.Struct(">iq")            # epoch, start offset
_MASTER_TRANSFER = struct.Struct(">iiqiqq")    # state, body size, offset, epoch, epoch start, confirm
_STATE = struct.Struct(">i")
_STATE_AND_SIZE = struct.Struct(">ii")         # the first two fields of every master packet

SLAVE_HANDSHAKE_SIZE = _SLAVE_HANDSHAKE.size            # 16
SLAVE_ACK_SIZE = _SLAVE_ACK.size                        # 12
MASTER_HANDSHAKE_HEADER_SIZE = _MASTER_HANDSHAKE.size   # 20
EPOCH_ENTRY_SIZE = _EPOCH_ENTRY.size                    # 12
MASTER_TRANSFER_HEADER_SIZE = _MASTER_TRANSFER.size     # 36
assert (SLAVE_HANDSHAKE_SIZE, SLAVE_ACK_SIZE, MASTER_HANDSHAKE_HEADER_SIZE, EPOCH_ENTRY_SIZE,
        MASTER_TRANSFER_HEADER_SIZE) == (16, 12, 20, 12, 36)


class ConnState(enum.IntEnum):
    """HAConnectionState; the ordinal travels on the wire (reference 11.1)."""

    READY = 0
    HANDSHAKE = 1
    TRANSFER = 2
    SUSPEND = 3
    SHUTDOWN = 4


class ProtocolError(Exception):
    """The peer sent bytes that are not a valid packet here. Close the connection."""


@dataclass(frozen=True, slots=True)
class EpochPoint:
    """One epoch entry as it travels in the master's handshake reply."""

    epoch: int
    start_offset: int


@dataclass(frozen=True, slots=True)
class SlaveHandshake:
    sync_from_last_file: bool
    async_learner: bool
    slave_id: int


@dataclass(frozen=True, slots=True)
class SlaveAck:
    offset: int


@dataclass(frozen=True, slots=True)
class MasterHandshake:
    max_offset: int
    last_epoch: int
    entries: tuple[EpochPoint, ...]


@dataclass(frozen=True, slots=True)
class MasterTransfer:
    offset: int
    epoch: int
    epoch_start_offset: int
    confirm_offset: int
    body: bytes | memoryview    # a read-only view of the received bytes when they held it whole

    @property
    def is_heartbeat(self) -> bool:
        return not self.body


# ---------------------------------------------------------------------------------------------
# Encoders


def _check_offset(name: str, value: int) -> None:
    if not 0 <= value <= INT64_MAX:
        raise ValueError(f"{name} out of range: {value}")


def _check_epoch(name: str, value: int, allow_minus_one: bool = False) -> None:
    low = -1 if allow_minus_one else 0
    if not low <= value <= 2**31 - 1:
        raise ValueError(f"{name} out of range: {value}")


def encode_slave_handshake(slave_id: int, sync_from_last_file: bool = False,
                           async_learner: bool = False) -> bytes:
    """Slave -> master HANDSHAKE, 16 bytes (reference 11.2)."""
    _check_offset("slave_id", slave_id)
    return _SLAVE_HANDSHAKE.pack(ConnState.HANDSHAKE, int(sync_from_last_file), int(async_learner),
                                 slave_id)


def encode_slave_ack(offset: int) -> bytes:
    """Slave -> master TRANSFER ack, 12 bytes (reference 11.3)."""
    _check_offset("ack offset", offset)
    return _SLAVE_ACK.pack(ConnState.TRANSFER, offset)


def encode_master_handshake(max_offset: int, entries: list[EpochPoint] | tuple[EpochPoint, ...]
                            ) -> bytes:
    """Master -> slave HANDSHAKE reply, 20 + 12*N bytes (reference 11.4).

    ``entries`` ascend by epoch; the last one's epoch is the "last epoch" field (-1 if none).
    """
    _check_offset("max_offset", max_offset)
    if len(entries) > MAX_EPOCH_ENTRIES:
        raise ValueError(f"{len(entries)} epoch entries exceed {MAX_EPOCH_ENTRIES}")
    _check_ascending(entries, ValueError)
    last_epoch = entries[-1].epoch if entries else -1
    parts = [_MASTER_HANDSHAKE.pack(ConnState.HANDSHAKE, EPOCH_ENTRY_SIZE * len(entries),
                                    max_offset, last_epoch)]
    parts.extend(_EPOCH_ENTRY.pack(e.epoch, e.start_offset) for e in entries)
    return b"".join(parts)


def encode_master_transfer_header(body_size: int, offset: int, epoch: int, epoch_start_offset: int,
                                  confirm_offset: int) -> bytes:
    """The 36-byte TRANSFER header (reference 11.5); the body follows it on the wire."""
    if not 0 <= body_size <= 2**31 - 1:
        raise ValueError(f"body size out of range: {body_size}")
    _check_offset("offset", offset)
    _check_epoch("epoch", epoch)
    _check_offset("epoch_start_offset", epoch_start_offset)
    _check_offset("confirm_offset", confirm_offset)
    return _MASTER_TRANSFER.pack(ConnState.TRANSFER, body_size, offset, epoch, epoch_start_offset,
                                 confirm_offset)


def encode_master_transfer(offset: int, epoch: int, epoch_start_offset: int, confirm_offset: int,
                           body: bytes = b"") -> bytes:
    """A whole TRANSFER packet (header + body); an empty body is a heartbeat."""
    return encode_master_transfer_header(len(body), offset, epoch, epoch_start_offset,
                                         confirm_offset) + bytes(body)


def _check_ascending(entries: tuple[EpochPoint, ...] | list[EpochPoint],
                     error: type[Exception]) -> None:
    for prev, cur in zip(entries, entries[1:]):
        if not (cur.epoch > prev.epoch and cur.start_offset > prev.start_offset):
            raise error(f"epoch entries not strictly ascending: {prev} then {cur}")
    for e in entries:
        if e.epoch < 0 or e.start_offset < 0:
            raise error(f"negative epoch entry {e}")


# ---------------------------------------------------------------------------------------------
# Incremental decoders


def master_packet_length(head: bytes | memoryview, max_body_bytes: int) -> int | None:
    """The length, header and body, of the master packet ``head`` starts with, once its first eight
    bytes (state and body size) are in; None before that. Raises ProtocolError for a state or a
    size no valid packet has. Lets a receiver keep each packet in one buffer, so that the decoder
    takes a body as one view instead of joining the pieces it arrived in."""
    if len(head) < _STATE_AND_SIZE.size:
        return None
    state, body_size = _STATE_AND_SIZE.unpack_from(head)
    if not 0 <= body_size <= max_body_bytes:
        raise ProtocolError(f"absurd body size {body_size}")
    if state == ConnState.TRANSFER:
        return MASTER_TRANSFER_HEADER_SIZE + body_size
    if state == ConnState.HANDSHAKE:
        return MASTER_HANDSHAKE_HEADER_SIZE + body_size
    raise ProtocolError(f"bad state field {state} from master")


class _Buffer:
    """Received bytes as a queue of read-only chunks with a read position in the first one.

    Zero-copy for the common case: a packet body lying inside one received chunk is returned as
    a ``memoryview`` of that chunk (immutable ``bytes``: safe to hand to another thread). Only a
    body spanning chunks is assembled (one copy of that body); headers are peeked in place or
    gathered when split (at most 36 bytes)."""

    __slots__ = ("_chunks", "_pos", "_size")

    def __init__(self) -> None:
        self._chunks: collections.deque[memoryview] = collections.deque()
        self._pos = 0               # read position in self._chunks[0]
        self._size = 0              # bytes available

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if not len(data):
            return
        if isinstance(data, bytes):
            view = memoryview(data)
        elif isinstance(data, memoryview) and data.readonly:
            view = data.cast("B")   # read-only view: the caller promises the bytes never change
        else:   # the caller may reuse a mutable buffer: keep our own copy
            view = memoryview(bytes(data))
        self._chunks.append(view)
        self._size += len(view)

    def available(self) -> int:
        return self._size

    def _peek(self, n: int) -> bytes | memoryview:
        first = self._chunks[0]
        if len(first) - self._pos >= n:
            return first[self._pos:self._pos + n]
        parts = []
        need, pos = n, self._pos
        for chunk in self._chunks:
            part = chunk[pos:pos + need]
            parts.append(part)
            need -= len(part)
            pos = 0
            if not need:
                break
        return b"".join(parts)

    def peek_state(self) -> int:
        return _STATE.unpack_from(self._peek(4))[0]

    def unpack(self, st: struct.Struct) -> tuple:
        return st.unpack_from(self._peek(st.size))

    def take(self, n: int) -> bytes | memoryview:
        assert 0 <= n <= self.available()
        if n == 0:
            return b""
        first = self._chunks[0]
        if len(first) - self._pos >= n:
            out: bytes | memoryview = first[self._pos:self._pos + n]
        else:
            out = self._peek(n)
        self.skip(n)
        return out

    def skip(self, n: int) -> None:
        assert 0 <= n <= self.available()
        self._size -= n
        n += self._pos
        chunks = self._chunks
        while chunks and n >= len(chunks[0]):
            n -= len(chunks.popleft())
        self._pos = n


class _Decoder:
    def __init__(self) -> None:
        self._buf = _Buffer()
        self._dead: ProtocolError | None = None

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes read from the socket."""
        if self._dead is not None:
            raise self._dead
        self._buf.feed(data)

    @property
    def buffered(self) -> int:
        """Bytes received but not yet consumed by a returned packet."""
        return self._buf.available()

    def _fail(self, reason: str) -> ProtocolError:
        self._dead = ProtocolError(reason)
        return self._dead


class SlavePacketDecoder(_Decoder):
    """Decodes what a slave sends (read on the master side)."""

    def next_packet(self) -> SlaveHandshake | SlaveAck | None:
        if self._dead is not None:
            raise self._dead
        buf = self._buf
        if buf.available() < 4:
            return None
        state = buf.peek_state()
        if state == ConnState.HANDSHAKE:
            if buf.available() < SLAVE_HANDSHAKE_SIZE:
                return None
            _, from_last, learner, slave_id = buf.unpack(_SLAVE_HANDSHAKE)
            if from_last not in (0, 1) or learner not in (0, 1):
                raise self._fail(f"bad handshake flags {from_last}/{learner}")
            if slave_id < 0:
                raise self._fail(f"negative slave id {slave_id}")
            buf.skip(SLAVE_HANDSHAKE_SIZE)
            return SlaveHandshake(bool(from_last), bool(learner), slave_id)
        if state == ConnState.TRANSFER:
            if buf.available() < SLAVE_ACK_SIZE:
                return None
            _, offset = buf.unpack(_SLAVE_ACK)
            if offset < 0:
                raise self._fail(f"negative ack offset {offset}")
            buf.skip(SLAVE_ACK_SIZE)
            return SlaveAck(offset)
        raise self._fail(f"bad state field {state} from slave")


class MasterPacketDecoder(_Decoder):
    """Decodes what a master sends (read on the slave side)."""

    def __init__(self, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        super().__init__()
        assert max_body_bytes > 0
        self._max_body_bytes = max_body_bytes

    def next_packet(self) -> MasterHandshake | MasterTransfer | None:
        if self._dead is not None:
            raise self._dead
        buf = self._buf
        if buf.available() < 4:
            return None
        state = buf.peek_state()
        if state == ConnState.HANDSHAKE:
            return self._handshake()
        if state == ConnState.TRANSFER:
            return self._transfer()
        raise self._fail(f"bad state field {state} from master")

    def packet_buffered(self) -> bool:
        """True when the bytes of a whole packet are buffered: ``next_packet`` then returns it (or
        fails on its content). False tells nothing (the next call may still fail)."""
        buf = self._buf
        if self._dead is not None or buf.available() < _STATE_AND_SIZE.size:
            return False
        try:
            need = master_packet_length(buf._peek(_STATE_AND_SIZE.size), self._max_body_bytes)
        except ProtocolError:
            return False
        return need is not None and buf.available() >= need

    def _handshake(self) -> MasterHandshake | None:
        buf = self._buf
        if buf.available() < MASTER_HANDSHAKE_HEADER_SIZE:
            return None
        _, body_size, max_offset, last_epoch = buf.unpack(_MASTER_HANDSHAKE)
        if body_size < 0 or body_size % EPOCH_ENTRY_SIZE:
            raise self._fail(f"handshake body size {body_size} is not a multiple of 12")
        n = body_size // EPOCH_ENTRY_SIZE
        if n > MAX_EPOCH_ENTRIES:
            raise self._fail(f"handshake carries {n} epoch entries (max {MAX_EPOCH_ENTRIES})")
        if max_offset < 0:
            raise self._fail(f"negative master max offset {max_offset}")
        if (n == 0) != (last_epoch == -1) or last_epoch < -1:
            raise self._fail(f"last epoch {last_epoch} does not match {n} entries")
        if buf.available() < MASTER_HANDSHAKE_HEADER_SIZE + body_size:
            return None
        buf.skip(MASTER_HANDSHAKE_HEADER_SIZE)
        raw = buf.take(body_size)
        entries = tuple(EpochPoint(*_EPOCH_ENTRY.unpack_from(raw, i * EPOCH_ENTRY_SIZE))
                        for i in range(n))
        try:
            _check_ascending(entries, ProtocolError)
        except ProtocolError as exc:
            raise self._fail(str(exc)) from None
        if entries and entries[-1].epoch != last_epoch:
            raise self._fail(f"last epoch {last_epoch} != last entry epoch {entries[-1].epoch}")
        if entries and entries[-1].start_offset > max_offset:
            raise self._fail(f"last epoch starts at {entries[-1].start_offset} beyond max "
                             f"offset {max_offset}")
        return MasterHandshake(max_offset, last_epoch, entries)

    def _transfer(self) -> MasterTransfer | None:
        buf = self._buf
        if buf.available() < MASTER_TRANSFER_HEADER_SIZE:
            return None
        _, size, offset, epoch, epoch_start, confirm = buf.unpack(_MASTER_TRANSFER)
        if size < 0 or size > self._max_body_bytes:
            raise self._fail(f"absurd transfer body size {size}")
        if offset < 0 or epoch < 0 or epoch_start < 0 or confirm < 0:
            raise self._fail(f"negative field in transfer header offset={offset} epoch={epoch} "
                             f"epoch_start={epoch_start} confirm={confirm}")
        if size and epoch_start > offset:
            raise self._fail(f"batch at {offset} precedes its epoch start {epoch_start}")
        if offset + size > INT64_MAX:
            raise self._fail("transfer offset overflows")
        if buf.available() < MASTER_TRANSFER_HEADER_SIZE + size:
            return None
        buf.skip(MASTER_TRANSFER_HEADER_SIZE)
        body = buf.take(size)
        return MasterTransfer(offset, epoch, epoch_start, confirm, body)
