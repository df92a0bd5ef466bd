"""Pure slave/master sessions: handshake, truncation, batch labelling, quirks 10 and 11, acks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ha_helpers import chunked

from memory_log import MemoryLog, apply_slave_actions
from rocketray.wire.ha_protocol import (ConnState, EpochPoint, MasterPacketDecoder, MasterTransfer, ProtocolError,
                                        encode_master_handshake, encode_master_transfer, encode_slave_ack,
                                        encode_slave_handshake)
from rocketray.ha.session import (
    AckEvent, Append, Close, HandshakeEvent, LocalLog, MasterSession, RecordEpoch, Send,
    SetConfirmOffset, SlaveSession, Truncate,
)


def master_log_two_epochs() -> MemoryLog:
    """Epoch 1: 3 records; epoch 2: 3 records (each record 4 + 10 bytes)."""
    log = MemoryLog()
    log.become_master(1)
    for i in range(3):
        log.append_record(b"epoch1-%03d" % i)
    log.become_master(2)
    for i in range(3):
        log.append_record(b"epoch2-%03d" % i)
    return log


def decode_all(data: bytes):
    dec = MasterPacketDecoder()
    dec.receive_data(data)
    out = []
    while (p := dec.next_packet()) is not None:
        out.append(p)
    return out


def start_master(log: MemoryLog, request_offset: int, batch_size: int = 1 << 20,
                 sync_from_last_file: bool = False) -> MasterSession:
    m = MasterSession(0, heartbeat_interval_ms=100, batch_size=batch_size)
    m.receive_data(encode_slave_handshake(2, sync_from_last_file, False), 0)
    assert m.next_event(log.max_offset, 0) == HandshakeEvent(2, sync_from_last_file, False)
    m.handshake_reply(log, 0)
    m.receive_data(encode_slave_ack(request_offset), 1)
    ev = m.next_event(log.max_offset, 1)
    assert isinstance(ev, AckEvent) and ev.offset == request_offset
    return m


def test_batches_never_cross_an_epoch_and_are_labelled_by_their_first_byte():
    """A large batch size still stops at the epoch boundary; the batch that ends the epoch is
    labelled with the epoch owning its first byte (upstream would label it with the next epoch,
    reference 11.7 boundary note)."""
    log = master_log_two_epochs()
    m = start_master(log, 0)
    first = m.next_send(log, 2)
    assert first.header and len(first.body) == 42
    (pkt,) = decode_all(first.header + bytes(first.body))
    assert (pkt.offset, pkt.epoch, pkt.epoch_start_offset) == (0, 1, 0)
    second = m.next_send(log, 3)
    (pkt,) = decode_all(second.header + bytes(second.body))
    assert (pkt.offset, pkt.epoch, pkt.epoch_start_offset, len(pkt.body)) == (42, 2, 42, 42)
    assert m.next_send(log, 4).caught_up


def test_batches_carry_whole_records_only():
    """A batch size smaller than a record still sends one whole record; 20 bytes hold one."""
    log = master_log_two_epochs()
    m = start_master(log, 0, batch_size=20)
    sizes = []
    while (out := m.next_send(log, 5)) is not None and out.body:
        sizes.append(len(out.body))
    assert sizes == [14] * 6


def test_empty_slave_starts_at_min_or_last_file():
    log = master_log_two_epochs()
    log.last_segment_base_offset = lambda: 42  # type: ignore[method-assign]
    m = start_master(log, 0, sync_from_last_file=True)
    (pkt,) = decode_all(b"".join([(o := m.next_send(log, 2)).header, bytes(o.body)]))
    assert pkt.offset == 42 and pkt.epoch == 2


def test_quirk11_slave_acks_right_after_truncation():
    """Quirk 11: after the handshake truncation the slave acks its new max at once (upstream
    waits up to haSendHeartbeatInterval)."""
    s = SlaveSession(2, heartbeat_interval_ms=5000)
    local = LocalLog(0, 1738, ((1, 0),))
    s.connect(local, 0)
    s.receive_data(encode_master_handshake(3160, [EpochPoint(1, 0), EpochPoint(2, 1580)]), 1)
    actions = s.next_actions(local, 1)
    assert actions == [Truncate(1580), Send(encode_slave_ack(1580))]
    assert s.state == ConnState.TRANSFER


def test_quirk10_received_epoch_resets_on_every_connection():
    """Quirk 10: an epoch entry removed by handshake truncation is re-recorded when the next
    batch carries the same epoch, because the last received epoch resets on connect."""
    s = SlaveSession(2)
    log = MemoryLog()
    log.become_master(1)
    log.append_record(b"a" * 10)
    s.connect(log.local(), 0)
    s.receive_data(encode_master_handshake(14, [EpochPoint(1, 0)]), 0)
    apply_slave_actions(log, s.next_actions(log.local(), 0))
    s.receive_data(encode_master_transfer(14, 2, 14, 0, b"\x00\x00\x00\x02xy"), 0)
    apply_slave_actions(log, s.next_actions(log.local(), 0))
    assert log.points == [EpochPoint(1, 0), EpochPoint(2, 14)] and s.received_epoch == 2
    # New master at epoch 3 never had our epoch-2 bytes: truncation removes entry 2 ...
    s.disconnected()
    s.connect(log.local(), 10)
    assert s.received_epoch == -1
    s.receive_data(encode_master_handshake(14, [EpochPoint(1, 0), EpochPoint(3, 14)]), 10)
    apply_slave_actions(log, s.next_actions(log.local(), 10))
    assert log.points == [EpochPoint(1, 0)] and log.max_offset == 14
    # ... and the next data batch records the master's entry again.
    s.receive_data(encode_master_transfer(14, 3, 14, 0, b"\x00\x00\x00\x01z"), 10)
    actions = s.next_actions(log.local(), 10)
    assert RecordEpoch(3, 14) in actions
    apply_slave_actions(log, actions)
    assert log.points == [EpochPoint(1, 0), EpochPoint(3, 14)]


def test_slave_transfer_actions_and_confirm_offset():
    s = SlaveSession(2)
    s.connect(LocalLog(0, 0, ()), 0)
    s.receive_data(encode_master_handshake(100, [EpochPoint(1, 0)]), 0)
    assert s.next_actions(LocalLog(0, 0, ()), 0) == [Send(encode_slave_ack(0))]
    s.receive_data(encode_master_transfer(0, 1, 0, 100, b"x" * 30), 1)
    actions = s.next_actions(LocalLog(0, 0, ()), 1)
    assert actions == [RecordEpoch(1, 0), Append(0, b"x" * 30), SetConfirmOffset(30),
                       Send(encode_slave_ack(30))]
    # heartbeat: confirm = min(master confirm, own max); no ack since max did not grow
    s.receive_data(encode_master_transfer(30, 1, 0, 20), 2)
    assert s.next_actions(LocalLog(0, 30, ((1, 0),)), 2) == [SetConfirmOffset(20)]
    # offset mismatch closes
    s.receive_data(encode_master_transfer(50, 1, 0, 20, b"y"), 3)
    (close,) = s.next_actions(LocalLog(0, 30, ((1, 0),)), 3)
    assert isinstance(close, Close)


def test_slave_reports_once_per_read():
    """Upstream's HAClient reports its max offset once per read, after every whole packet read:
    two batches in one receive give one confirm offset and one ack, covering both; a batch whose
    successor is not whole yet is acked at once (the rest may never come)."""
    s = SlaveSession(2)
    s.connect(LocalLog(0, 0, ()), 0)
    s.receive_data(encode_master_handshake(100, [EpochPoint(1, 0)]), 0)
    s.next_actions(LocalLog(0, 0, ()), 0)
    second = encode_master_transfer(30, 1, 0, 100, b"y" * 20)
    s.receive_data(encode_master_transfer(0, 1, 0, 100, b"x" * 30) + second[:-1], 1)
    assert s.next_actions(LocalLog(0, 0, ()), 1) == [RecordEpoch(1, 0), Append(0, b"x" * 30),
                                                     SetConfirmOffset(30),
                                                     Send(encode_slave_ack(30))]
    s.receive_data(second[-1:] + encode_master_transfer(50, 1, 0, 100, b"z" * 10), 2)
    assert s.next_actions(LocalLog(0, 30, ((1, 0),)), 2) == [Append(30, b"y" * 20)]
    assert s.next_actions(LocalLog(0, 50, ((1, 0),)), 2) == [Append(50, b"z" * 10),
                                                             SetConfirmOffset(60),
                                                             Send(encode_slave_ack(60))]
    assert s.next_actions(LocalLog(0, 60, ((1, 0),)), 2) is None


def test_slave_heartbeat_and_housekeeping():
    s = SlaveSession(2, heartbeat_interval_ms=100, housekeeping_interval_ms=1000)
    s.connect(LocalLog(0, 0, ()), 0)
    s.receive_data(encode_master_handshake(0, [EpochPoint(1, 0)]), 0)
    s.next_actions(LocalLog(0, 0, ()), 0)
    assert s.tick(50) == []
    assert s.tick(100) == [Send(encode_slave_ack(0))]
    assert isinstance(s.tick(1001)[0], Close)


def test_slave_rejects_transfer_before_handshake_and_bad_state():
    s = SlaveSession(2)
    s.connect(LocalLog(0, 0, ()), 0)
    s.receive_data(encode_master_transfer(0, 1, 0, 0), 0)
    with pytest.raises(ProtocolError):
        s.next_actions(LocalLog(0, 0, ()), 0)


def test_master_rejects_ack_before_handshake_backwards_and_beyond_sent():
    log = master_log_two_epochs()
    m = MasterSession(0)
    m.receive_data(encode_slave_ack(0), 0)
    with pytest.raises(ProtocolError):
        m.next_event(log.max_offset, 0)
    m = start_master(log, 14)
    m.receive_data(encode_slave_ack(10), 2)
    with pytest.raises(ProtocolError):
        m.next_event(log.max_offset, 2)
    m = start_master(log, 14)
    m.next_send(log, 2)
    m.receive_data(encode_slave_ack(85), 3)
    with pytest.raises(ProtocolError):
        m.next_event(log.max_offset, 3)
    m = MasterSession(0)
    m.receive_data(encode_slave_handshake(1) * 2, 0)
    m.next_event(0, 0)
    with pytest.raises(ProtocolError):
        m.next_event(0, 0)


def test_master_first_ack_beyond_max_is_rejected():
    log = master_log_two_epochs()
    m = MasterSession(0)
    m.receive_data(encode_slave_handshake(3) + encode_slave_ack(10_000), 0)
    m.next_event(log.max_offset, 0)
    m.handshake_reply(log, 0)
    with pytest.raises(ProtocolError):
        m.next_event(log.max_offset, 0)


def test_master_caught_up_event_and_heartbeat():
    """An ack at the master's max marks the slave caught up now; idle master heartbeats."""
    log = master_log_two_epochs()
    m = start_master(log, 84)
    first = m.next_send(log, 40)          # confirm offset not yet told: heartbeat at once
    assert first.caught_up and first.header and not first.body
    out = m.next_send(log, 50)
    assert out.caught_up and out.header == b""
    log.confirm_offset = 70               # confirm moved: heartbeat without waiting
    (hb,) = decode_all(m.next_send(log, 60).header)
    assert hb.confirm_offset == 70
    assert m.next_send(log, 70).header == b""
    out = m.next_send(log, 200)
    (hb,) = decode_all(out.header)
    assert isinstance(hb, MasterTransfer) and hb.is_heartbeat and hb.offset == 84
    m.receive_data(encode_slave_ack(84), 300)
    assert m.next_event(84, 300) == AckEvent(2, 84, 300)


def test_async_learner_is_never_a_caught_up_candidate():
    log = master_log_two_epochs()
    m = MasterSession(0)
    m.receive_data(encode_slave_handshake(3, False, True), 0)
    m.next_event(log.max_offset, 0)
    m.handshake_reply(log, 0)
    m.receive_data(encode_slave_ack(84), 1)
    assert m.next_event(84, 1) == AckEvent(3, 84, None)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3), st.integers(1, 60)), min_size=1, max_size=40),
       st.lists(st.integers(0, 20_000), max_size=30), st.integers(20, 200))
def test_reports_once_per_read_never_early_never_left_behind(writes, cuts, batch_size):
    """Any master stream (two epochs, batches of any size, confirm-offset heartbeats between them)
    received in any chunking, coalesced or split: no ack names bytes before they were appended, no
    confirm offset passes the local log, and once a receive's whole packets are applied the last
    ack names the whole local log (a report is deferred only to a packet already received)."""
    master = MemoryLog()
    master.become_master(1)
    m = start_master(master, 0, batch_size=batch_size)
    stream = bytearray(encode_master_handshake(master.max_offset, master.points))
    for i, (new_epoch, heartbeats, size) in enumerate(writes):
        if new_epoch and i:
            master.become_master(master.points[-1].epoch + 1)
        master.append_record(bytes([i % 251]) * size)
        master.confirm_offset = master.max_offset - size // 2
        while (out := m.next_send(master, 10 + i)) is not None and out.body:
            stream += out.header + bytes(out.body)
        for _ in range(heartbeats):
            master.confirm_offset = min(master.max_offset, master.confirm_offset + 7)
            out = m.next_send(master, 10 + i)
            if out is not None and out.header:
                stream += out.header
    s = SlaveSession(2)
    slave = MemoryLog()
    s.connect(slave.local(), 0)
    data = bytes(stream)
    acked = 0
    for chunk in chunked(data, cuts):
        s.receive_data(chunk, 1)
        while (actions := s.next_actions(slave.local(), 1)) is not None:
            for action in actions:
                apply_slave_actions(slave, [action])
                if isinstance(action, Send):
                    acked = int.from_bytes(action.data[4:], "big")
                    assert acked <= slave.max_offset            # never before the append
                assert slave.confirm_offset <= slave.max_offset
        assert acked == slave.max_offset                       # nothing left unreported
    assert bytes(slave.data) == bytes(master.data[:len(slave.data)])
    assert slave.max_offset == master.max_offset


def test_a_moved_confirm_offset_waits_the_push_delay_unless_a_transfer_carries_it():
    """With ``confirm_push_delay_ms`` a header carrying only a new confirm offset goes that long
    after the last write, not at once; a transfer inside the delay carries the confirm offset
    itself (a busy master sends no header per put); 0 keeps the immediate push."""
    log = master_log_two_epochs()
    m = MasterSession(0, heartbeat_interval_ms=100, confirm_push_delay_ms=3)
    m.receive_data(encode_slave_handshake(2, False, False), 0)
    m.next_event(log.max_offset, 0)
    m.handshake_reply(log, 0)
    m.receive_data(encode_slave_ack(84), 1)
    m.next_event(log.max_offset, 1)
    assert decode_all(m.next_send(log, 10).header)[0].confirm_offset == 0   # first header: 3 ms after the handshake
    log.confirm_offset = 84
    assert m.next_send(log, 11).header == b"" and m.next_header_due_ms(84) == 13
    assert m.next_send(log, 12).header == b""
    (hb,) = decode_all(m.next_send(log, 13).header)
    assert hb.is_heartbeat and hb.confirm_offset == 84 and m.next_header_due_ms(84) == 113
    log.append_record(b"epoch2-new")                       # a put at 14: its transfer is sent at once
    (transfer,) = decode_all(m.next_send(log, 14).header + log.read_raw(84, 14))
    assert not transfer.is_heartbeat and transfer.confirm_offset == 84
    log.confirm_offset = 98                                # its ack moved the confirm offset
    assert m.next_send(log, 15).header == b""             # inside the delay: nothing per put
    log.append_record(b"epoch2-nxt")                       # the next put's transfer carries it
    (transfer,) = decode_all(m.next_send(log, 16).header + log.read_raw(98, 14))
    assert transfer.offset == 98 and transfer.confirm_offset == 98
    assert m.next_header_due_ms(98) == 116
    at_once = start_master(log, 112)
    at_once.next_send(log, 2)
    log.confirm_offset = 112
    assert decode_all(at_once.next_send(log, 3).header)[0].confirm_offset == 112
