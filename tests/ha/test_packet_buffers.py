"""The slave's receive buffers (``PacketBuffers``): read-only chunks that hold whole master
packets, buffers reused only when no chunk of theirs is alive, and bodies the decoder takes
without joining pieces."""

from __future__ import annotations

import random

import pytest

from rocketray.wire.ha_protocol import (EpochPoint, MasterPacketDecoder, MasterTransfer, ProtocolError,
                                        encode_master_handshake, encode_master_transfer,
                                        master_packet_length)
from rocketray.ha.slave_client import RECV_BUFFER, RECV_MIN_FREE, PacketBuffers

MAX_BODY = 64 << 20


def _receiver() -> PacketBuffers:
    return PacketBuffers(MAX_BODY)


def _receive(rx: PacketBuffers, data: bytes, out: list[memoryview]) -> None:
    """What the receive thread does for ``recv_into`` calls that bring ``data``."""
    while data:
        buf = rx.free()
        n = min(len(buf), len(data))
        buf[:n] = data[:n]
        data = data[n:]
        del buf
        chunk = rx.received(n)
        if chunk is not None:
            out.append(chunk)


def _transfer(offset: int, size: int, fill: int = 0x41) -> bytes:
    return encode_master_transfer(offset, 1, 0, offset, bytes([fill]) * size)


def _packets(chunks: list[memoryview]) -> list[bytes]:
    """Split chunks into packets, asserting none crosses a chunk boundary."""
    out = []
    for chunk in chunks:
        pos = 0
        while pos < len(chunk):
            n = master_packet_length(chunk[pos:], MAX_BODY)
            assert n is not None and pos + n <= len(chunk), "a packet split across chunks"
            out.append(bytes(chunk[pos:pos + n]))
            pos += n
    return out


@pytest.mark.parametrize("head, length", [
    (b"", None),
    (_transfer(0, 10)[:7], None),                                     # size not in yet
    (_transfer(0, 10)[:8], 36 + 10),
    (_transfer(5, 0), 36),                                            # a heartbeat
    (encode_master_handshake(100, [EpochPoint(1, 0), EpochPoint(2, 50)]), 20 + 24),
])
def test_master_packet_length(head, length):
    assert master_packet_length(head, MAX_BODY) == length


@pytest.mark.parametrize("head", [
    b"\x00\x00\x00\x07\x00\x00\x00\x00",                              # no such state
    b"\x00\x00\x00\x02\xff\xff\xff\xff",                              # negative size
    b"\x00\x00\x00\x02\x04\x00\x00\x01",                              # above the limit
])
def test_master_packet_length_refuses_what_no_packet_is(head):
    with pytest.raises(ProtocolError):
        master_packet_length(head, MAX_BODY)


def test_chunks_hold_whole_packets_however_the_bytes_arrive():
    """Packets of every size cut at random points into receives come out in order, unchanged, and
    each inside one chunk (also the ones that had to move to the next buffer)."""
    rng = random.Random(7)
    sizes = [0, 10, 4096, 300_000, 1 << 20, 3 << 20, 5, 2 << 20] * 6
    packets, offset = [], 0
    for i, size in enumerate(sizes):
        packets.append(_transfer(offset, size, fill=i % 251))
        offset += size
    stream = b"".join(packets)
    rx, chunks, pos = _receiver(), [], 0
    while pos < len(stream):
        n = rng.choice([1, 7, 36, 1000, 65536, 400_000, 2 << 20])
        _receive(rx, stream[pos:pos + n], chunks)
        pos += n
    assert all(c.readonly for c in chunks)
    assert _packets(chunks) == packets


def test_the_decoder_takes_a_body_as_a_view_of_the_received_chunk():
    """A body that arrived in many receives is not joined: the decoder hands out a view of the
    buffer the kernel wrote into."""
    body = bytes(range(256)) * 4096            # 1 MiB
    rx, chunks = _receiver(), []
    packet = encode_master_transfer(0, 1, 0, 0, body)
    for i in range(0, len(packet), 65536):
        _receive(rx, packet[i:i + 65536], chunks)
    assert len(chunks) == 1
    decoder = MasterPacketDecoder(MAX_BODY)
    decoder.receive_data(chunks[0])
    got = decoder.next_packet()
    assert isinstance(got, MasterTransfer) and isinstance(got.body, memoryview)
    assert got.body.obj is rx._pool[0] and got.body == body


def test_a_packet_larger_than_a_buffer_gets_one_of_its_size_which_is_reused():
    rx, chunks = _receiver(), []
    big = _transfer(0, RECV_BUFFER + 1000)
    _receive(rx, _transfer(0, 10) + big[:100], chunks)
    _receive(rx, big[100:], chunks)
    assert _packets(chunks) == [_transfer(0, 10), big]
    large = [id(b) for b in rx._pool if len(b) >= len(big)]
    assert len(large) == 1
    del chunks
    again: list[memoryview] = []
    _receive(rx, big, again)                   # the next large packet reuses that buffer
    assert _packets(again) == [big] and id(again[0].obj) == large[0]
    assert len([b for b in rx._pool if len(b) >= len(big)]) == 1


def test_bytes_that_are_no_packet_pass_through_for_the_decoder_to_refuse():
    rx, chunks = _receiver(), []
    _receive(rx, _transfer(0, 10) + b"\x00\x00\x00\x07garbage", chunks)
    assert b"".join(bytes(c) for c in chunks) == _transfer(0, 10) + b"\x00\x00\x00\x07garbage"
    decoder = MasterPacketDecoder(MAX_BODY)
    for chunk in chunks:
        decoder.receive_data(chunk)
    assert isinstance(decoder.next_packet(), MasterTransfer)
    with pytest.raises(ProtocolError, match="bad state"):
        decoder.next_packet()


def test_a_buffer_is_reused_only_when_no_chunk_of_it_is_alive():
    """A live chunk is never overwritten: its buffer is reused only once the chunk is gone."""
    rx = _receiver()
    fill = RECV_BUFFER - RECV_MIN_FREE - 36 + 1        # leaves less than RECV_MIN_FREE
    kept: list[memoryview] = []
    first = _transfer(0, fill)
    _receive(rx, first, kept)
    assert [c.readonly for c in kept] == [True] and bytes(kept[0]) == first
    dropped: list[memoryview] = []
    _receive(rx, _transfer(0, fill, fill=0x42), dropped)   # the second buffer
    del dropped                                    # ... is free again
    got: list[memoryview] = []
    third = _transfer(0, 10, fill=0x43)
    _receive(rx, third, got)                       # needs a new buffer: reuses the free one
    assert bytes(kept[0]) == first                 # the live chunk's buffer was not reused
    assert bytes(got[0]) == third
    assert len(rx._pool) == 2


def test_a_receive_stops_at_a_packet_boundary_rather_than_split_the_next_packet():
    """When the room after the packet being received could not hold a packet as large as the
    largest seen, the receive is limited to that packet's end: the next packet starts the next
    buffer and no received byte is moved."""
    size = 3 << 20
    rx, chunks = _receiver(), []
    packets = [_transfer(i * size, size, fill=i) for i in range(5)]
    moved = []
    real_free_buffer = rx._free_buffer

    def free_buffer(n: int) -> bytearray:
        moved.append(rx._used - rx._start)          # bytes of a packet carried to the new buffer
        return real_free_buffer(n)

    rx._free_buffer = free_buffer                   # type: ignore[method-assign]
    stream = b"".join(packets)
    pos = 0
    while pos < len(stream):
        buf = rx.free()
        n = min(len(buf), len(stream) - pos, 1 << 20)
        buf[:n] = stream[pos:pos + n]
        del buf
        pos += n
        if (chunk := rx.received(n)) is not None:
            chunks.append(chunk)
    assert _packets(chunks) == packets
    assert moved and set(moved) == {0}, moved


def test_missing_is_what_the_packet_being_received_still_needs():
    """The receive thread sets ``SO_RCVLOWAT`` to ``missing()``: a receive then returns once the
    packet being received is whole, not with each piece the network delivers."""
    rx = _receiver()
    out: list[memoryview] = []
    assert rx.missing() == 1                                 # nothing yet: any byte will do
    packet = _transfer(0, 100_000)
    _receive(rx, packet[:5], out)
    assert rx.missing() == 1                                 # its length is not in yet
    _receive(rx, packet[5:1000], out)
    assert rx.missing() == len(packet) - 1000
    _receive(rx, packet[1000:] + _transfer(100_000, 10)[:20], out)
    assert rx.missing() == 36 + 10 - 20                      # the next one's rest
    _receive(rx, _transfer(100_000, 10)[20:], out)
    assert rx.missing() == 1 and len(_packets(out)) == 2
