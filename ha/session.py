"""Slave and master HA sessions as pure state machines (reference 11.6-11.8).

Theory of operation. A session is one TCP connection's worth of protocol state. It never touches
a socket, a file or a clock: the shell feeds it received bytes and ``now_ms`` and a read-only view
of its log, and gets back bytes to send and *actions* to apply to the store, in order.

Slave: ``connect()`` starts a connection (state HANDSHAKE) and returns the 16-byte handshake. The
master's reply yields a truncation decision (reference 12.3): cut the log at the consistent point,
then ack at once (quirk 11: upstream waits up to a heartbeat interval). TRANSFER packets yield
"record epoch" (when the batch label changes and carries data), "append", "set confirm offset"
(min of the master's confirm offset and the new local max) and an ack when the local max grew;
the last two only after the last whole packet received so far (upstream reports once per read). The
last received epoch is reset on every connection (quirk 10).

Master: the 16-byte handshake registers the slave; the shell answers with ``handshake_reply()``.
The first ack is the slave's start point; after it ``next_send()`` returns the next batch to write:
whole records from the commit log, never crossing an epoch boundary, labelled with the epoch that
owns the batch's FIRST byte (upstream labels the last batch of an epoch with the next epoch; both
keep slave epoch files right, ours never names an epoch for bytes it does not own). When there is
nothing to send it reports "caught up" and a heartbeat when one is due. Acks are checked: never
backwards, never beyond what was sent.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Protocol, Sequence

from rocketray.wire.ha_protocol import (DEFAULT_MAX_BODY_BYTES, MAX_EPOCH_ENTRIES, ConnState, EpochPoint,
                                        MasterHandshake, MasterPacketDecoder, MasterTransfer, ProtocolError, SlaveAck,
                                        SlaveHandshake, SlavePacketDecoder, encode_master_handshake,
                                        encode_master_transfer_header, encode_slave_ack, encode_slave_handshake)
from rocketray.ha.truncation import decide_truncation

__all__ = [
    "LocalLog", "Send", "Truncate", "RecordEpoch", "Append", "SetConfirmOffset", "Close",
    "SlaveSession", "MasterLogView", "HandshakeEvent", "AckEvent", "Outgoing", "MasterSession",
    "epoch_owning", "handshake_epoch_ok", "batch_epoch_ok",
]


# ---------------------------------------------------------------------------------------------
# Slave


@dataclass(frozen=True, slots=True)
class LocalLog:
    """What the slave session needs to know about its store right now."""

    min_offset: int
    max_offset: int
    epochs: tuple[tuple[int, int], ...]  # ascending (epoch, start_offset)


@dataclass(frozen=True, slots=True)
class Send:
    data: bytes


@dataclass(frozen=True, slots=True)
class Truncate:
    """Cut the commit log at ``offset`` (if it holds more) and drop epoch entries starting at or
    after it."""

    offset: int


@dataclass(frozen=True, slots=True)
class RecordEpoch:
    epoch: int
    start_offset: int


@dataclass(frozen=True, slots=True)
class Append:
    offset: int
    data: bytes | memoryview


@dataclass(frozen=True, slots=True)
class SetConfirmOffset:
    offset: int


@dataclass(frozen=True, slots=True)
class Close:
    reason: str


SlaveAction = Send | Truncate | RecordEpoch | Append | SetConfirmOffset | Close


def handshake_epoch_ok(expected_epoch: int | None, master_last_epoch: int) -> bool:
    """The master's handshake names the epoch the controller gave this slave (None: not known)."""
    return expected_epoch is None or master_last_epoch == expected_epoch


def batch_epoch_ok(batch_epoch: int, local_last_epoch: int) -> bool:
    """A batch never belongs to an epoch older than the slave's last one (12.3: a stale master)."""
    return batch_epoch >= local_last_epoch


class SlaveSession:
    """The slave side of one connection (``AutoSwitchHAClient`` without the thread and socket)."""

    def __init__(self, slave_id: int, *, expected_epoch: int | None = None,
                 sync_from_last_file: bool = False,
                 async_learner: bool = False, heartbeat_interval_ms: int = 5000,
                 housekeeping_interval_ms: int = 20000,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        assert slave_id >= 0
        assert heartbeat_interval_ms > 0 and housekeeping_interval_ms > 0
        self.slave_id = slave_id
        # The epoch the controller named for this master (None: not known, accept any). A master
        # whose handshake names another last epoch is not the one the controller elected (a stale
        # master, or one ahead of what this slave was told): refuse it, so this slave never
        # truncates to, or copies from, a log the controller did not elect.
        self.expected_epoch = expected_epoch
        self.sync_from_last_file = sync_from_last_file
        self.async_learner = async_learner
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.housekeeping_interval_ms = housekeeping_interval_ms
        self.max_body_bytes = max_body_bytes
        self.state = ConnState.READY
        self.received_epoch = -1
        self.reported_offset = 0
        self.master_confirm_offset = -1
        self.last_read_ms = 0
        self.last_write_ms = 0
        self._decoder = MasterPacketDecoder(max_body_bytes)

    def connect(self, local: LocalLog, now_ms: int) -> bytes:
        """A new connection is up: reset per-connection state and return the handshake."""
        self.state = ConnState.HANDSHAKE
        self.received_epoch = -1          # quirk 10: upstream keeps it across reconnects
        self.reported_offset = local.max_offset
        self.master_confirm_offset = -1
        self.last_read_ms = self.last_write_ms = now_ms
        self._decoder = MasterPacketDecoder(self.max_body_bytes)
        return encode_slave_handshake(self.slave_id, self.sync_from_last_file, self.async_learner)

    def disconnected(self) -> None:
        self.state = ConnState.READY

    def shutdown(self) -> None:
        self.state = ConnState.SHUTDOWN

    def receive_data(self, data: bytes | bytearray | memoryview, now_ms: int) -> None:
        if self.state not in (ConnState.HANDSHAKE, ConnState.TRANSFER):
            raise ProtocolError(f"data received in state {self.state.name}")
        self.last_read_ms = now_ms
        self._decoder.receive_data(data)

    def next_actions(self, local: LocalLog, now_ms: int) -> list[SlaveAction] | None:
        """Process one received packet against the current ``local`` view.

        Returns None when a whole packet is not buffered yet. Raises ProtocolError on malformed
        or out-of-place packets. The shell applies the actions in order, then calls again with
        a fresh view.
        """
        packet = self._decoder.next_packet()
        if packet is None:
            return None
        if isinstance(packet, MasterHandshake):
            if self.state != ConnState.HANDSHAKE:
                raise ProtocolError(f"handshake reply in state {self.state.name}")
            return self._on_handshake(packet, local, now_ms)
        if self.state != ConnState.TRANSFER:
            raise ProtocolError(f"transfer packet in state {self.state.name}")
        return self._on_transfer(packet, local, now_ms)

    def _on_handshake(self, packet: MasterHandshake, local: LocalLog,
                      now_ms: int) -> list[SlaveAction]:
        if not handshake_epoch_ok(self.expected_epoch, packet.last_epoch):
            return [Close(f"master handshake at epoch {packet.last_epoch}, the controller named "
                          f"epoch {self.expected_epoch}")]
        master_points = [(e.epoch, e.start_offset) for e in packet.entries]
        decision = decide_truncation(local.epochs, local.min_offset, local.max_offset,
                                     master_points, packet.max_offset)
        if decision.failure is not None:
            return [Close(decision.failure)]
        actions: list[SlaveAction] = []
        if decision.truncate_to is not None:
            actions.append(Truncate(decision.truncate_to))
        self.state = ConnState.TRANSFER
        self.reported_offset = decision.resume_offset
        # Quirk 11: ack right away so the master learns the start point without waiting a
        # heartbeat interval (upstream only acks when the max offset grows).
        actions.append(Send(encode_slave_ack(self.reported_offset)))
        self.last_write_ms = now_ms
        return actions

    def _on_transfer(self, packet: MasterTransfer, local: LocalLog,
                     now_ms: int) -> list[SlaveAction]:
        actions: list[SlaveAction] = []
        new_max = local.max_offset
        if packet.body:
            empty = local.max_offset == local.min_offset and not local.epochs
            if packet.offset != local.max_offset and not empty:
                return [Close(f"offset mismatch: batch at {packet.offset}, local max "
                              f"{local.max_offset}")]
            last_epoch = local.epochs[-1][0] if local.epochs else -1
            if not batch_epoch_ok(packet.epoch, last_epoch):
                return [Close(f"batch of epoch {packet.epoch} behind local epoch {last_epoch}")]
            if packet.epoch != self.received_epoch:
                self.received_epoch = packet.epoch
                if packet.epoch > last_epoch:
                    actions.append(RecordEpoch(packet.epoch, packet.epoch_start_offset))
            actions.append(Append(packet.offset, packet.body))
            new_max = packet.offset + len(packet.body)
        if self._decoder.packet_buffered():
            # Like upstream's HAClient, report once per read: the confirm offset and the ack
            # follow the last whole packet received, not each one (the next packet's cover these).
            return actions
        confirm = min(packet.confirm_offset, new_max)
        if confirm != self.master_confirm_offset:
            self.master_confirm_offset = confirm
            actions.append(SetConfirmOffset(confirm))
        if new_max > self.reported_offset:
            self.reported_offset = new_max
            actions.append(Send(encode_slave_ack(new_max)))
            self.last_write_ms = now_ms
        return actions

    def tick(self, now_ms: int) -> list[SlaveAction]:
        """Heartbeat ack when idle; housekeeping close when the master went quiet."""
        if self.state not in (ConnState.HANDSHAKE, ConnState.TRANSFER):
            return []
        if now_ms - self.last_read_ms > self.housekeeping_interval_ms:
            return [Close(f"nothing read from the master for {now_ms - self.last_read_ms} ms")]
        if self.state == ConnState.TRANSFER and \
                now_ms - self.last_write_ms >= self.heartbeat_interval_ms:
            self.last_write_ms = now_ms
            return [Send(encode_slave_ack(self.reported_offset))]
        return []


# ---------------------------------------------------------------------------------------------
# Master


class MasterLogView(Protocol):
    """What the master session reads from its store (the caller supplies storage)."""

    @property
    def min_offset(self) -> int: ...

    @property
    def max_offset(self) -> int: ...

    @property
    def confirm_offset(self) -> int: ...

    def epoch_points(self) -> Sequence[EpochPoint]: ...

    def read_raw(self, offset: int, max_bytes: int) -> bytes | memoryview: ...

    def last_segment_base_offset(self) -> int: ...


@dataclass(frozen=True, slots=True)
class HandshakeEvent:
    slave_id: int
    sync_from_last_file: bool
    async_learner: bool


@dataclass(frozen=True, slots=True)
class AckEvent:
    """A slave acked ``offset``. ``caught_up_ms`` is set when the ack reached the master's max
    offset as of the last data sent (the slave is a candidate for the SyncStateSet)."""

    slave_id: int
    offset: int
    caught_up_ms: int | None


@dataclass(frozen=True, slots=True)
class Outgoing:
    """Bytes to write: a header, a body (maybe empty) and whether the slave is now caught up."""

    header: bytes
    body: bytes | memoryview
    caught_up: bool


def epoch_owning(points: Sequence[EpochPoint], offset: int, max_offset: int
                 ) -> tuple[EpochPoint, int] | None:
    """The entry whose range holds ``offset`` and that range's end (the last one ends at
    ``max_offset``, or at ``offset`` + anything when it is open); None if no entry holds it."""
    starts = [p.start_offset for p in points]
    i = bisect.bisect_right(starts, offset) - 1
    if i < 0:
        return None
    end = starts[i + 1] if i + 1 < len(points) else max(max_offset, offset)
    if i + 1 < len(points) and offset >= end:
        return None
    return points[i], end


class MasterSession:
    """The master side of one connection (``AutoSwitchHAConnection`` without threads/sockets)."""

    def __init__(self, now_ms: int, *, heartbeat_interval_ms: int = 5000,
                 housekeeping_interval_ms: int = 20000, batch_size: int = 32 * 1024,
                 confirm_push_delay_ms: int = 0) -> None:
        """``confirm_push_delay_ms``: a header carrying only a new confirm offset waits this long
        after the last write (a transfer in that time carries the confirm offset instead)."""
        assert batch_size > 0 and 0 <= confirm_push_delay_ms <= heartbeat_interval_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.confirm_push_delay_ms = confirm_push_delay_ms
        self.housekeeping_interval_ms = housekeeping_interval_ms
        self.batch_size = batch_size
        self.state = ConnState.HANDSHAKE
        self.slave_id: int | None = None
        self.sync_from_last_file = False
        self.async_learner = False
        self.reply_due = False
        self.ack_offset = -1
        self.request_offset = -1
        self.next_offset = -1
        self.last_master_max_offset = -1
        self.last_transfer_ms = 0
        self.last_sent_confirm_offset = -1
        self.last_read_ms = self.last_write_ms = now_ms
        self._decoder = SlavePacketDecoder()

    def receive_data(self, data: bytes | bytearray | memoryview, now_ms: int) -> None:
        self.last_read_ms = now_ms
        self._decoder.receive_data(data)

    def next_event(self, master_max_offset: int, now_ms: int
                   ) -> HandshakeEvent | AckEvent | None:
        """The next slave packet as an event for the service; None when more bytes are needed."""
        packet = self._decoder.next_packet()
        if packet is None:
            return None
        if isinstance(packet, SlaveHandshake):
            if self.slave_id is not None:
                raise ProtocolError("second handshake on one connection")
            self.slave_id = packet.slave_id
            self.sync_from_last_file = packet.sync_from_last_file
            self.async_learner = packet.async_learner
            self.reply_due = True
            return HandshakeEvent(packet.slave_id, packet.sync_from_last_file,
                                  packet.async_learner)
        assert isinstance(packet, SlaveAck)
        return self._on_ack(packet.offset, master_max_offset, now_ms)

    def _on_ack(self, ack: int, master_max_offset: int, now_ms: int) -> AckEvent:
        if self.slave_id is None or self.reply_due:
            raise ProtocolError("ack before the handshake completed")
        if ack < self.ack_offset:
            raise ProtocolError(f"ack went backwards: {ack} after {self.ack_offset}")
        if self.request_offset < 0:
            if ack > master_max_offset:
                raise ProtocolError(f"slave starts at {ack}, beyond master max "
                                    f"{master_max_offset}")
            self.request_offset = ack
            self.state = ConnState.TRANSFER
        elif self.next_offset >= 0 and ack > self.next_offset:
            raise ProtocolError(f"ack {ack} beyond what was sent ({self.next_offset})")
        self.ack_offset = ack
        caught_up_ms = None
        if not self.async_learner and ack >= self.last_master_max_offset:
            caught_up_ms = now_ms if master_max_offset == ack else self.last_transfer_ms
        return AckEvent(self.slave_id, ack, caught_up_ms)

    def handshake_reply(self, log: MasterLogView, now_ms: int) -> bytes:
        """The reply to the slave's handshake: (the newest 1000 of) our epoch entries."""
        assert self.reply_due
        self.reply_due = False
        self.last_write_ms = now_ms
        points = list(log.epoch_points())[-MAX_EPOCH_ENTRIES:]
        return encode_master_handshake(log.max_offset, points)

    def _choose_start(self, log: MasterLogView) -> int:
        if self.request_offset == 0:
            if self.sync_from_last_file:
                return max(log.last_segment_base_offset(), log.min_offset)
            return log.min_offset
        if self.request_offset < log.min_offset:
            raise ProtocolError(f"slave at {self.request_offset} is behind the master's min "
                                f"offset {log.min_offset}")
        return self.request_offset

    def send_offset(self, log: MasterLogView) -> int:
        """Where the next transfer starts (chosen when first asked in TRANSFER); -1 before."""
        if self.state != ConnState.TRANSFER:
            return -1
        if self.next_offset < 0:
            self.next_offset = self._choose_start(log)
        return self.next_offset

    def next_send(self, log: MasterLogView, now_ms: int) -> Outgoing | None:
        """The next batch (or heartbeat) to write, or None when there is nothing to write."""
        if self.send_offset(log) < 0:
            return None
        max_offset = log.max_offset
        points = log.epoch_points()
        owner = epoch_owning(points, self.next_offset, max_offset) if points else None
        if max_offset > self.next_offset and owner is not None:
            point, end = owner
            size = min(self.batch_size, end - self.next_offset)
            body = log.read_raw(self.next_offset, size)
            assert 0 < len(body) <= end - self.next_offset, (len(body), self.next_offset, end)
            self.last_sent_confirm_offset = log.confirm_offset
            header = encode_master_transfer_header(len(body), self.next_offset, point.epoch,
                                                   point.start_offset,
                                                   self.last_sent_confirm_offset)
            self.next_offset += len(body)
            self.last_master_max_offset = max_offset
            self.last_transfer_ms = self.last_write_ms = now_ms
            return Outgoing(header, body, False)
        caught_up = max_offset <= self.next_offset
        confirm_offset = log.confirm_offset
        # A heartbeat is due after the interval, or ``confirm_push_delay_ms`` after the last write
        # when the confirm offset moved since the last header (slaves learn it without waiting an
        # interval; a busy master's next transfer carries it, so no header goes per put).
        if now_ms < self.next_header_due_ms(confirm_offset):
            return Outgoing(b"", b"", True) if caught_up else None
        self.last_write_ms = now_ms
        self.last_sent_confirm_offset = confirm_offset
        epoch, start = (owner[0].epoch, owner[0].start_offset) if owner is not None else (
            (points[-1].epoch, points[-1].start_offset) if points else (0, 0))
        header = encode_master_transfer_header(0, self.next_offset, epoch, start,
                                               confirm_offset)
        return Outgoing(header, b"", caught_up)

    def next_header_due_ms(self, confirm_offset: int) -> int:
        """When the next header is due if no data comes (``confirm_offset``: the master's now)."""
        due = self.last_write_ms + self.heartbeat_interval_ms
        if confirm_offset != self.last_sent_confirm_offset:
            due = min(due, self.last_write_ms + self.confirm_push_delay_ms)
        return due

    def heartbeat_due(self, now_ms: int) -> bool:
        return now_ms - self.last_write_ms >= self.heartbeat_interval_ms

    def expired(self, now_ms: int) -> bool:
        """Housekeeping: nothing read from the slave for longer than the interval."""
        return now_ms - self.last_read_ms > self.housekeeping_interval_ms
