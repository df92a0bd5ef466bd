"""The broker's client port over real sockets: authentication with the cluster secret, answers out of
order (a held pull never delays a put), bad frames close only their own connection, and a lost
connection fails the requests in flight as unanswered.

The endpoints are a small stand-in of ``BrokerService`` (the port is what is tested here); the
client side is the real ``rocketray.client.socket_transport.Connection``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import threading

import pytest

from rocketray.actors.client_port import ClientPort
from rocketray.auth import AuthError
from rocketray.wire.client_frames import (HEADER, PUT_COUNT, FrameType, PullRequest, decode_pull_answer,
                                          decode_put_answer, decode_queue_offsets, encode_pull_request,
                                          encode_search_request, pack)
from rocketray.wire.pull_result import OffsetsResult, OffsetsStatus, PullResult, PullStatus
from rocketray.client.connections import Connection, ConnectionLost, Dialer, DirectConnection
from rocketray.wire.put_result import PutResult, PutStatus, Written
from rocketray.tls import ClientTrust
from rocketray.waiting import wait_for
from rr_users import authenticator, directory_of, login, table_of
from rr_members import CLUSTER, broker, member, ca_for

SECRET = "s3cret"
USER = "app"


def dialer(secret: str = SECRET) -> Dialer:
    """A client that trusts the test CA and proves ``secret``."""
    return Dialer(ClientTrust(CLUSTER, ca_for().cert_pem), login(USER, secret))


class Endpoints:
    def __init__(self) -> None:
        self.puts: list[tuple[bytes, int]] = []
        self.release_pull = None
        self.tag_filter = None
        self.deferred: list | None = None
        self.commits: list = []

    def put_start(self, batch, done):
        """Answers at once (a refusal, or a put the acks decided in the same step), or, with
        ``self.deferred`` a list, keeps ``done`` there for the test to call later."""
        self.puts.append((batch.data, batch.count))
        result = PutResult(PutStatus.PUT_OK, Written.YES, tuple((i, i * 10) for i in range(batch.count)), 100, 1)
        if self.deferred is None:
            return result
        self.deferred.append(lambda: done(result))
        return None

    def pull_start(self, topic, queue_id, queue_offset, max_count, max_bytes, hold_ms, group, done,
                   tag_filter=None):
        """Held: ``release_pull()`` (on the loop) answers it, as a confirm-offset move would."""
        self.tag_filter = tag_filter
        self.release_pull = lambda: done(PullResult(PullStatus.FOUND, b"rec", 1, queue_offset, queue_offset + 1, 9))
        return None

    async def commit_offsets(self, group, entries, reset=False):
        self.commits.append((group, entries, reset))
        return PutResult(PutStatus.PUT_OK, Written.YES, ((0, 0),), 1, 1)

    async def committed_offsets(self, group, topics=None):
        return OffsetsResult(OffsetsStatus.OK, (("t", 0, 3),), (("t", 0, 5),))

    async def queue_max_offsets(self, queues):
        return tuple((t, q, 5) for t, q in queues)

    async def search_offsets(self, queues, timestamp_ms):
        return tuple((t, q, timestamp_ms % 7) for t, q in queues)


@pytest.fixture
def port():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    endpoints = Endpoints()
    server = ClientPort(endpoints, authenticator(directory_of(table_of({USER: SECRET}))), member(broker(0)).open_server_context())
    number = asyncio.run_coroutine_threadsafe(server.start("127.0.0.1", 0), loop).result(5)
    yield ("127.0.0.1", number), endpoints, server, loop
    asyncio.run_coroutine_threadsafe(server.close(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def test_a_broker_that_closes_during_authentication_is_a_lost_connection():
    """A dying broker (``ray.kill`` returns before its process is gone) may accept a connection and
    close it mid-handshake: that is a connection failure the transport answers as unanswered and
    the producer retries, not an authentication error that escapes the send (a failover benchmark
    run died of it on 2026-11-27)."""
    from rocketray.client.socket_transport import SocketTransport

    with socket.create_server(("127.0.0.1", 0)) as server:
        address = server.getsockname()

        def accept_and_close():
            conn, _ = server.accept()
            conn.close()

        closer = threading.Thread(target=accept_and_close, daemon=True)
        closer.start()
        with pytest.raises(OSError):
            DirectConnection(address, dialer())
        closer.join(5)

        class Spec:
            @staticmethod
            def brokers_of(group):
                return [type("B", (), {"replica": 0, "client_address": address})()]

        transport = SocketTransport.__new__(SocketTransport)
        transport.cluster = type("C", (), {"spec": Spec})()
        transport._conns_lock = threading.Lock()
        transport._direct = {}
        transport._dialer = dialer()
        transport.master = lambda group: 0
        forgotten = []
        transport.forget_master = forgotten.append
        closer = threading.Thread(target=accept_and_close, daemon=True)
        closer.start()
        answer = transport._start_direct("g", FrameType.PUT, (PUT_COUNT.pack(1), b"x"), lambda f: f, 5.0, "put", ())()
        closer.join(5)
        assert answer.error.startswith("CONNECT_FAILED") and forgotten == ["g"]


def test_a_wrong_secret_is_refused_before_any_frame(port):
    address, endpoints, server, _ = port
    with pytest.raises((AuthError, OSError)):
        Connection(address, dialer("not the secret"))
    # the port counts the refusal after it answered it: the client may see the answer first
    wait_for(lambda: server.rejected == 1, 5, "the port to count the refusal", 0.01)
    assert endpoints.puts == []


def test_a_held_pull_does_not_delay_a_put_on_the_same_connection(port):
    address, endpoints, _, loop = port
    conn = Connection(address, dialer())
    held = conn.request(FrameType.PULL, pack(["t", 0, 4, 10, 1024, 10_000, "g"]))
    put = conn.request(FrameType.PUT, PUT_COUNT.pack(2), b"two records")
    result = decode_put_answer(put.result(5).body)
    assert result.ok and result.offsets == ((0, 0), (1, 10)) and endpoints.puts == [(b"two records", 2)]
    assert not held.done()
    wait_for(lambda: endpoints.release_pull is not None, 5, "the pull to be held", 0.01)
    loop.call_soon_threadsafe(endpoints.release_pull)
    pulled = decode_pull_answer(held.result(5).body)
    assert pulled.status is PullStatus.FOUND and pulled.records == b"rec" and pulled.offset == 4
    conn.close("done")


def test_puts_appended_in_arrival_order_are_answered_when_their_event_comes(port):
    """The port hands each put to ``put_start`` in the read loop's own step, in arrival order, and
    writes its answer whenever ``done`` is called (here: the second put first); no put waits for
    another's answer."""
    address, endpoints, _, loop = port
    endpoints.deferred = []
    conn = Connection(address, dialer())
    first = conn.request(FrameType.PUT, PUT_COUNT.pack(1), b"first")
    second = conn.request(FrameType.PUT, PUT_COUNT.pack(2), b"second")
    wait_for(lambda: len(endpoints.deferred) == 2, 5, "both puts handed over", 0.01)
    assert endpoints.puts == [(b"first", 1), (b"second", 2)] and not first.done() and not second.done()
    loop.call_soon_threadsafe(endpoints.deferred[1])
    assert decode_put_answer(second.result(5).body).offsets == ((0, 0), (1, 10))
    assert not first.done()
    loop.call_soon_threadsafe(endpoints.deferred[0])
    assert decode_put_answer(first.result(5).body).offsets == ((0, 0),)
    conn.close("done")


def test_a_direct_connection_is_read_by_the_thread_that_waits(port):
    """A ``DirectConnection`` (no reader thread): ``receive`` gives the answer to the request sent,
    None while it has not come (the put is answered later here), and the connection then serves
    the next request; a broker that closes it is ConnectionLost, and the connection is closed."""
    address, endpoints, _, loop = port
    endpoints.deferred = []
    conn = DirectConnection(address, dialer())
    conn.send(FrameType.PUT, PUT_COUNT.pack(1), b"one")
    wait_for(lambda: endpoints.deferred, 5, "the put handed over", 0.01)
    assert conn.receive(0.05) is None
    loop.call_soon_threadsafe(endpoints.deferred[0])
    frame = conn.receive(5)
    assert frame is not None and decode_put_answer(frame.body).offsets == ((0, 0),)
    endpoints.deferred = None
    conn.send(FrameType.PUT, PUT_COUNT.pack(2), b"two")
    assert decode_put_answer(conn.receive(5).body).offsets == ((0, 0), (1, 10))
    conn._stream.sendall(HEADER.pack(b"RRCL", 1, 99, 5, 0))       # an unknown frame type: the broker closes
    conn._waiting = 3
    with pytest.raises(ConnectionLost):
        conn.receive(5)
    assert conn.closed is not None


def test_a_malformed_frame_closes_only_its_connection(port):
    """Bad input gets an ERROR frame and the close of that connection; other clients go on."""
    address, endpoints, _, _ = port
    good = Connection(address, dialer())
    bad = Connection(address, dialer())
    in_flight = bad.request(FrameType.PULL, pack(["t", 0, 0, 10, 1024, 10_000, None]))
    bad._stream.sendall(HEADER.pack(b"RRCL", 1, 99, 5, 0))             # an unknown frame type
    with pytest.raises(ConnectionLost):
        in_flight.result(5)                                            # the broker closed that connection
    assert bad.closed is not None
    assert decode_put_answer(good.request(FrameType.PUT, PUT_COUNT.pack(1), b"r").result(5).body).ok
    good.close("done")


def test_an_invalid_request_body_gets_an_error_frame(port):
    address, _, _, _ = port
    conn = Connection(address, dialer())
    answer = conn.request(FrameType.PULL, pack(["t", "zero", 0])).result(5)
    assert answer.type is FrameType.ERROR


def test_an_oversized_frame_is_refused_before_its_body(port):
    address, _, _, _ = port
    conn = Connection(address, dialer())
    conn._stream.sendall(HEADER.pack(b"RRCL", 1, 1, 1, 1 << 31))
    fut = conn.request(FrameType.PUT, PUT_COUNT.pack(0), b"")
    with pytest.raises((ConnectionLost, concurrent.futures.TimeoutError)):
        fut.result(5)
    assert conn.closed is not None


def test_a_lost_connection_fails_requests_in_flight(port):
    address, _, _, _ = port
    conn = Connection(address, dialer())
    held = conn.request(FrameType.PULL, pack(["t", 0, 0, 10, 1024, 10_000, None]))
    conn._stream.sock.shutdown(socket.SHUT_RDWR)
    with pytest.raises(ConnectionLost):
        held.result(5)
    assert conn.request(FrameType.PUT, PUT_COUNT.pack(0), b"").exception(5) is not None


def test_a_pull_carries_its_tag_filter_and_a_search_offset_is_answered(port):
    """The PULL frame's eighth field reaches the broker's pull; SEARCH_OFFSET is answered per queue."""
    address, endpoints, _, _ = port
    conn = Connection(address, dialer())
    conn.request(FrameType.PULL, encode_pull_request(PullRequest("t", 0, 4, 10, 1024, 10_000, "g", "a || b")))
    wait_for(lambda: endpoints.release_pull is not None, 5, "the pull to be held", 0.01)
    assert endpoints.tag_filter == "a || b"
    answer = conn.request(FrameType.SEARCH_OFFSET, encode_search_request([("t", 0), ("u", 1)], 15)).result(5)
    assert answer.type is FrameType.SEARCH_OFFSET_ANSWER
    assert decode_queue_offsets(answer.body, "search offset") == (("t", 0, 1), ("u", 1, 1))
    conn.close("done")


def test_a_malformed_tag_filter_closes_only_its_connection(port):
    """A filter that is not a str is a malformed frame: an ERROR answer and that connection closed."""
    address, _, _, _ = port
    good = Connection(address, dialer())
    bad = Connection(address, dialer())
    answer = bad.request(FrameType.PULL, pack(["t", 0, 0, 10, 1024, 10_000, None, ["a"]])).result(5)
    assert answer.type is FrameType.ERROR
    wait_for(lambda: bad.closed is not None, 5, "the broker to close the bad connection", 0.01)
    assert decode_put_answer(good.request(FrameType.PUT, PUT_COUNT.pack(1), b"r").result(5).body).ok
    good.close("done")


def test_a_commit_frame_carries_the_reset_kind_and_nothing_else(port):
    """COMMIT's optional third field "reset" reaches the broker as ``reset=True`` (the admin's reset
    record); a two-field body is an ordinary commit; any other third field is a malformed frame."""
    address, endpoints, _, _ = port
    conn = Connection(address, dialer())
    for body in (["g", [["t", 0, 3]]], ["g", [["t", 0, 0]], "reset"]):
        answer = conn.request(FrameType.COMMIT, pack(body)).result(5)
        assert decode_put_answer(answer.body).ok
    assert endpoints.commits == [("g", [("t", 0, 3)], False), ("g", [("t", 0, 0)], True)]
    answer = conn.request(FrameType.COMMIT, pack(["g", [["t", 0, 0]], "rewind"])).result(5)
    assert answer.type is FrameType.ERROR and len(endpoints.commits) == 2
    conn.close("done")
