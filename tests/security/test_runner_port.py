"""Finding 9: the chaos runner's node port (``controller/proc_wire.py``): frames bound to their
connection and order, bounded before the tag check, silent and surplus connections refused."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from rocketray.controller import proc, proc_wire
from rocketray.controller.proc_wire import (FRAME_HEADER, NONCE_BYTES, REQ, RESP, NodeClient, ProtocolError, Sealer,
                                            _read_rest)
from rr_testing import wait_until

SECRET = b"s" * 32


def test_a_frame_opens_only_under_its_label_nonce_sequence_and_secret():
    nonce = os.urandom(NONCE_BYTES)
    sealer = Sealer(SECRET, nonce)
    frame = sealer.seal(REQ, 1, {"id": 1, "op": "status", "args": {"set": {3, 1}}})
    rest = frame[FRAME_HEADER.size:]
    assert sealer.open(REQ, 1, rest) == {"id": 1, "op": "status", "args": {"set": [1, 3]}}
    for label, seq, opener in ((RESP, 1, sealer), (REQ, 2, sealer), (REQ, 1, Sealer(SECRET, os.urandom(32))),
                               (REQ, 1, Sealer(b"other-secret", nonce))):
        with pytest.raises(ProtocolError):
            opener.open(label, seq, rest)
    for i in (0, 40, len(rest) - 1):        # a flipped bit in the tag, the sequence or the body
        with pytest.raises(ProtocolError):
            sealer.open(REQ, 1, rest[:i] + bytes([rest[i] ^ 1]) + rest[i + 1:])


def test_a_request_length_over_the_bound_is_refused_before_its_body():
    a, b = socket.socketpair()
    a.sendall(FRAME_HEADER.pack(proc_wire.MAX_REQUEST_BYTES + 1))
    b.settimeout(2)
    with pytest.raises(ProtocolError, match="out of range"):
        _read_rest(b, proc_wire.MAX_REQUEST_BYTES)
    a.close()
    b.close()


class Node:
    """The real runner port (``controller/proc.py``'s server) over a stand-in node that counts ops."""

    def __init__(self) -> None:
        self.ops: list[str] = []
        self.server = proc._Server(("127.0.0.1", 0), None, SECRET)
        self.server.dispatch = self._dispatch
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _dispatch(self, op: str, args: dict) -> dict:
        self.ops.append(op)
        return {"ok": True}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def node():
    n = Node()
    yield n
    n.close()


def test_a_captured_request_replayed_on_new_connections_runs_once(node):
    # The runner's elect frame, recorded on the wire and sent again three times (the old wire ran
    # it three more times: no nonce, no sequence).
    captured: list[bytes] = []
    real_sendall = socket.socket.sendall

    def recording(sock, data, *args):
        captured.append(bytes(data))
        return real_sendall(sock, data, *args)

    client = NodeClient("127.0.0.1", node.port, SECRET)
    socket.socket.sendall = recording
    try:
        assert client.call("elect", {"group": "g"}) == {"ok": True}
    finally:
        socket.socket.sendall = real_sendall
    frame = captured[-1]
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", node.port), timeout=5) as s:
            s.recv(NONCE_BYTES)
            s.sendall(frame)
            assert s.recv(100) == b"", "the node closes the connection without an answer"
    with socket.create_connection(("127.0.0.1", node.port), timeout=5) as s:   # replayed twice on one connection
        sealer = Sealer(SECRET, s.recv(NONCE_BYTES))
        s.sendall(sealer.seal(REQ, 1, {"id": 1, "op": "elect", "args": {}}))
        assert _read_rest(s, proc_wire.MAX_FRAME_BYTES)
        s.sendall(sealer.seal(REQ, 1, {"id": 1, "op": "elect", "args": {}}))
        assert s.recv(100) == b""
    assert node.ops == ["elect", "elect"]
    client.close()


def test_a_silent_connection_is_closed_after_the_first_frame_deadline(node, monkeypatch):
    # 200 silent connections held a node for 21 s: now each gets PREAUTH_TIMEOUT_S for its first frame.
    monkeypatch.setattr(proc_wire, "PREAUTH_TIMEOUT_S", 0.5)
    silent = [socket.create_connection(("127.0.0.1", node.port), timeout=5) for _ in range(5)]
    try:
        started = time.monotonic()
        for s in silent:
            assert len(s.recv(NONCE_BYTES)) == NONCE_BYTES
            assert s.recv(100) == b"", "closed after the first-frame deadline"
        assert time.monotonic() - started < 4
    finally:
        for s in silent:
            s.close()


def test_connections_beyond_the_bound_are_refused_and_the_runner_still_gets_through(monkeypatch):
    monkeypatch.setattr(proc, "MAX_CONNECTIONS", 4)
    monkeypatch.setattr(proc_wire, "PREAUTH_TIMEOUT_S", 1.0)
    node = Node()
    held = [socket.create_connection(("127.0.0.1", node.port), timeout=5) for _ in range(4)]
    try:
        for s in held:
            assert len(s.recv(NONCE_BYTES)) == NONCE_BYTES       # served: each got its nonce
        with socket.create_connection(("127.0.0.1", node.port), timeout=5) as extra:
            assert extra.recv(100) == b"", "refused at once, no nonce"
        wait_until(lambda: NodeClient("127.0.0.1", node.port, SECRET).call("status") == {"ok": True}, 10,
                   what="the runner served again once the silent connections timed out")
    finally:
        for s in held:
            s.close()
        node.close()
