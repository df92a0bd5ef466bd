"""The client data path over the brokers' client ports: one socket round trip per batch or pull.

:class:`SocketTransport` is a :class:`~rocketray.client.transport.RayTransport` whose data calls
(put, pull, commit, committed offsets, queue max offsets) go to the master's client port
(``actors/client_port.py``, frames of ``rocketray.broker.client_wire``) instead of a Ray actor call;
the controller, master discovery and the master watch stay on Ray. A broker without a client port
(an older cluster spec) is reached through Ray as before.

One connection per broker, shared by every thread of the client: requests carry ids and answers
are matched by a reader thread, so many sends and held pulls are in flight on one socket at once.
A connection that breaks answers every request in flight as unanswered (it may have run), exactly
as a Ray call to a dead actor does; the next request opens a new connection.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import os
import socket
import threading
import time
from typing import Any, Callable

from rocketray.auth import CLIENT_LABEL, NONCE_SIZE, Authenticator
from rocketray.broker.batch import EncodedBatch
from rocketray.broker.client_wire import (PUT_COUNT, Frame, FrameDecoder, FrameType, WireError,
                                          decode_offsets_answer, decode_pull_answer, decode_put_answer, encode_frame,
                                          pack, unpack)
from rocketray.broker.pull import OffsetsResult
from rocketray.client.transport import RayTransport, Unanswered
from rocketray.ha.ack import PutResult, PutStatus, refused

__all__ = ["SocketTransport", "Connection", "DirectConnection"]

log = logging.getLogger("rocketray.client")

CONNECT_TIMEOUT_S = 3.0
RECV_BYTES = 1 << 20
WATCH_SLICE_S = 0.05
DIRECT_IDLE_MAX = 8      # idle direct connections kept per broker (one per thread sending synchronously)


class ConnectionLost(Exception):
    pass


class Connection:
    """One authenticated connection to a broker's client port (thread-safe)."""

    def __init__(self, address: tuple[str, int], secret: str | bytes, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self.address = address
        sock = socket.create_connection(address, timeout=timeout_s)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            leftover = _authenticate(sock, secret)
            sock.settimeout(None)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._send_lock = threading.Lock()
        self._pending: dict[int, concurrent.futures.Future] = {}
        self._pending_lock = threading.Lock()
        self._ids = itertools.count(1)
        self.closed: str | None = None
        self._decoder = FrameDecoder()
        self._reader = threading.Thread(target=self._read_loop, args=(leftover,), name=f"rocketray-conn-{address[1]}",
                                        daemon=True)
        self._reader.start()

    def request(self, frame_type: FrameType, *body: bytes) -> concurrent.futures.Future:
        """Send one request; the future gives the answer :class:`Frame` or raises ConnectionLost."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        request_id = next(self._ids)
        with self._pending_lock:
            if self.closed is not None:
                fut.set_exception(ConnectionLost(self.closed))
                return fut
            self._pending[request_id] = fut
        try:
            buffers = encode_frame(frame_type, request_id, *body)
            with self._send_lock:
                if sum(len(b) for b in buffers) < 65536:
                    self._sock.sendall(b"".join(buffers))
                else:
                    for b in buffers:
                        self._sock.sendall(b)
        except (OSError, WireError) as exc:
            self.close(f"send failed: {exc!r}")
        return fut

    def _read_loop(self, leftover: bytes) -> None:
        data: bytes = leftover
        try:
            while True:
                for frame in self._decoder.feed(data):
                    self._deliver(frame)
                data = self._sock.recv(RECV_BYTES)
                if not data:
                    raise ConnectionLost("closed by the broker")
        except (OSError, WireError, ConnectionLost) as exc:
            self.close(repr(exc))

    def _deliver(self, frame: Frame) -> None:
        if frame.type is FrameType.ERROR:
            reason = unpack(frame.body, "error")
            log.warning("client port %s refused a request: %s", self.address, reason)
        with self._pending_lock:
            fut = self._pending.pop(frame.request_id, None)
        if fut is not None and not fut.done():
            fut.set_result(frame)

    def close(self, reason: str) -> None:
        with self._pending_lock:
            if self.closed is not None:
                return
            self.closed = reason
            pending, self._pending = self._pending, {}
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(ConnectionLost(reason))


class DirectConnection:
    """An authenticated connection that one thread at a time uses for one request and reads itself:
    no reader thread, so the answer to a synchronous send wakes the sending thread directly (the
    shared :class:`Connection` hands it over from its reader thread, one more thread wake-up)."""

    def __init__(self, address: tuple[str, int], secret: str | bytes, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self.address = address
        self._sock = socket.create_connection(address, timeout=timeout_s)
        try:
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            leftover = _authenticate(self._sock, secret)
        except BaseException:
            self._sock.close()
            raise
        self._decoder = FrameDecoder()
        self._frames = self._decoder.feed(leftover) if leftover else []
        self._ids = itertools.count(1)
        self._waiting: int | None = None
        self.closed: str | None = None

    def send(self, frame_type: FrameType, *body: bytes) -> None:
        """Send one request (the previous one was answered); raises ConnectionLost."""
        assert self._waiting is None, "one request at a time"
        self._waiting = next(self._ids)
        try:
            self._sock.settimeout(None)
            self._sock.sendall(b"".join(encode_frame(frame_type, self._waiting, *body)))
        except (OSError, WireError) as exc:
            self.close(f"send failed: {exc!r}")
            raise ConnectionLost(self.closed) from None

    def receive(self, timeout_s: float) -> Frame | None:
        """The answer to the request sent, or None if it did not come within ``timeout_s``;
        raises ConnectionLost (the connection is then closed)."""
        try:
            while not self._frames:
                self._sock.settimeout(max(timeout_s, 1e-4))
                try:
                    data = self._sock.recv(RECV_BYTES)
                except TimeoutError:
                    return None
                if not data:
                    raise ConnectionLost("closed by the broker")
                self._frames = self._decoder.feed(data)
        except (OSError, WireError, ConnectionLost) as exc:
            self.close(repr(exc))
            raise ConnectionLost(self.closed) from None
        frame = self._frames.pop(0)
        if frame.request_id != self._waiting or self._frames:
            self.close(f"answer {frame.request_id} to request {self._waiting}")
            raise ConnectionLost(self.closed)
        self._waiting = None
        return frame

    def close(self, reason: str) -> None:
        if self.closed is None:
            self.closed = reason
            self._sock.close()


def _authenticate(sock: socket.socket, secret: str | bytes) -> bytes:
    auth = Authenticator("client", secret, os.urandom(NONCE_SIZE), CLIENT_LABEL)
    while not auth.done:
        out = auth.data_to_send()
        if out:
            sock.sendall(out)
        if auth.done:
            break
        data = sock.recv(4096)
        if not data:    # the broker went away (a dying process): a lost connection, retried like one
            raise ConnectionResetError("the broker closed the connection during authentication")
        auth.receive_data(data)
    out = auth.data_to_send()
    if out:
        sock.sendall(out)
    return auth.leftover


class SocketTransport(RayTransport):
    """:class:`RayTransport` with the data path on the brokers' client ports (module docstring)."""

    def __init__(self, cluster: Any) -> None:
        super().__init__(cluster)
        self._conns: dict[tuple[str, int], Connection] = {}
        self._conns_lock = threading.Lock()
        self._direct: dict[tuple[str, int], list[DirectConnection]] = {}   # idle ones, per broker

    def _connection(self, group: str, replica: int) -> Connection | None:
        b = next((x for x in self.cluster.spec.brokers_of(group) if x.replica == replica), None)
        if b is None or b.client_address is None:
            return None
        address = b.client_address
        with self._conns_lock:
            conn = self._conns.get(address)
            if conn is not None and conn.closed is None:
                return conn
        conn = Connection(address, self.cluster.spec.secret)      # outside the lock: may take a while
        with self._conns_lock:
            old = self._conns.get(address)
            if old is not None and old.closed is None:
                conn.close("a concurrent connection won")
                return old
            self._conns[address] = conn
        return conn

    def close(self) -> None:
        with self._conns_lock:
            conns, self._conns = list(self._conns.values()), {}
            idle, self._direct = [c for cs in self._direct.values() for c in cs], {}
        for conn in conns:
            conn.close("transport closed")
        for direct in idle:
            direct.close("transport closed")

    def _take_direct(self, group: str, replica: int) -> DirectConnection | None:
        b = next((x for x in self.cluster.spec.brokers_of(group) if x.replica == replica), None)
        if b is None or b.client_address is None:
            return None
        with self._conns_lock:
            idle = self._direct.get(b.client_address)
            if idle:
                return idle.pop()
        return DirectConnection(b.client_address, self.cluster.spec.secret)

    def _give_back(self, conn: DirectConnection) -> None:
        with self._conns_lock:
            idle = self._direct.setdefault(conn.address, [])
            if conn.closed is None and len(idle) < DIRECT_IDLE_MAX:
                idle.append(conn)
                return
        conn.close("not kept")

    def _master_connection(self, group: str) -> tuple[int, Connection | None] | Unanswered:
        """``group``'s master and a connection to its client port (None: it has none, use Ray), or
        Unanswered when there is no master or it cannot be reached (refused, unreachable, auth
        failed: like a dead actor)."""
        replica = self.master(group)
        if replica is None:
            return Unanswered("NO_MASTER", unsent=True)
        try:
            return replica, self._connection(group, replica)
        except OSError as exc:
            self.forget_master(group)
            return Unanswered(f"CONNECT_FAILED {exc!r}", unsent=True)

    def _request(self, group: str, frame_type: FrameType, body: tuple, decode: Callable[[Frame], Any],
                 timeout_s: float, ray_method: str, ray_args: tuple) -> Any:
        """Send to ``group``'s master's client port and wait (watching for a new master while the
        answer is late); a broker without a port is called through Ray."""
        return self._start(group, frame_type, body, decode, timeout_s, ray_method, ray_args)()

    def _start(self, group: str, frame_type: FrameType, body: tuple, decode: Callable[[Frame], Any],
               timeout_s: float, ray_method: str, ray_args: tuple) -> Callable[[], Any]:
        """Send the request now; the returned callable waits for its answer (see ``_request``)."""
        target = self._master_connection(group)
        if isinstance(target, Unanswered):
            return lambda: target
        replica, conn = target
        if conn is None:
            return lambda: self._call_master(group, ray_method, ray_args, timeout_s)
        fut = conn.request(frame_type, *body)
        deadline = time.monotonic() + timeout_s

        def wait() -> Any:
            try:
                answer = fut.result(timeout=max(0.0, min(deadline - time.monotonic(), WATCH_SLICE_S)))
            except concurrent.futures.TimeoutError:
                answer = self._wait_watching(group, replica, fut, deadline)
                if isinstance(answer, Unanswered):
                    return answer
            except ConnectionLost as exc:
                self.forget_master(group)
                return Unanswered(f"CONNECTION_LOST {exc}")
            if answer.type is FrameType.ERROR:
                return None
            try:
                return decode(answer)
            except WireError as exc:
                conn.close(f"undecodable answer: {exc}")
                return Unanswered(f"BAD_ANSWER {exc}")

        return wait

    def _start_direct(self, group: str, frame_type: FrameType, body: tuple, decode: Callable[[Frame], Any],
                      timeout_s: float, ray_method: str, ray_args: tuple) -> Callable[[], Any]:
        """``_start`` on a :class:`DirectConnection` that the waiting thread reads itself; the same
        answers (Unanswered on a lost connection, a timeout or a new master, None for an ERROR
        frame). A connection left with its request unanswered is closed, never reused."""
        replica = self.master(group)
        if replica is None:
            return lambda: Unanswered("NO_MASTER", unsent=True)
        try:
            conn = self._take_direct(group, replica)
            if conn is None:
                return lambda: self._call_master(group, ray_method, ray_args, timeout_s)
            conn.send(frame_type, *body)
        except (OSError, ConnectionLost) as exc:
            self.forget_master(group)
            lost = Unanswered(f"CONNECT_FAILED {exc!r}", unsent=True)
            return lambda: lost
        deadline = time.monotonic() + timeout_s

        def wait() -> Any:
            try:
                while (answer := conn.receive(min(max(0.0, deadline - time.monotonic()), WATCH_SLICE_S))) is None:
                    if time.monotonic() >= deadline:
                        conn.close("no answer in time")
                        return Unanswered("TIMEOUT")
                    if self._master_moved(group, replica):
                        conn.close("the master moved")
                        return Unanswered("MASTER_MOVED", master_moved=True)
            except ConnectionLost as exc:
                self.forget_master(group)
                return Unanswered(f"CONNECTION_LOST {exc}")
            self._give_back(conn)
            if answer.type is FrameType.ERROR:
                return None
            try:
                return decode(answer)
            except WireError as exc:
                return Unanswered(f"BAD_ANSWER {exc}")

        return wait

    def _master_moved(self, group: str, replica: int) -> bool:
        """Whether the controller's master watch has named another master of ``group`` than ``replica``."""
        import ray

        ready, _ = ray.wait(self._watches_of(group), num_returns=1, timeout=0)
        return bool(ready) and (new := self._take_watch(group, ready[0])) is not None and new != replica

    def _wait_watching(self, group: str, replica: int, fut: concurrent.futures.Future, deadline: float) -> Any:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return Unanswered("TIMEOUT")
            if self._master_moved(group, replica):
                return Unanswered("MASTER_MOVED", master_moved=True)
            try:
                return fut.result(timeout=min(left, WATCH_SLICE_S))
            except concurrent.futures.TimeoutError:
                continue
            except ConnectionLost as exc:
                self.forget_master(group)
                return Unanswered(f"CONNECTION_LOST {exc}")

    # --- the data path ----------------------------------------------------------------------------
    def put(self, group: str, batch: EncodedBatch, timeout_s: float) -> PutResult | Unanswered:
        return self.put_start(group, batch, timeout_s)()

    def put_start(self, group: str, batch: EncodedBatch, timeout_s: float,
                  caller_waits: bool = False) -> Callable[[], PutResult | Unanswered]:
        """Send the put now and return what waits for its answer: the producer sends a group's next
        batch before it resolves the futures of the one just answered. ``caller_waits``: the thread
        that sends is the one that waits (a synchronous send), so it reads the answer itself on a
        connection of its own (:class:`DirectConnection`)."""
        body = (PUT_COUNT.pack(batch.count), batch.data)
        if caller_waits:
            wait = self._start_direct(group, FrameType.PUT, body, lambda f: decode_put_answer(f.body), timeout_s,
                                      "put", (batch,))
        else:
            wait = self._start(group, FrameType.PUT, body, lambda f: decode_put_answer(f.body), timeout_s,
                               "put", (batch,))

        def answer() -> PutResult | Unanswered:
            result = wait()
            return refused(PutStatus.MESSAGE_ILLEGAL) if result is None else result

        return answer

    def commit(self, group: str, consumer_group: str, entries: list[tuple[str, int, int]],
               timeout_s: float) -> PutResult | Unanswered:
        result = self._request(group, FrameType.COMMIT, (pack([consumer_group, [list(e) for e in entries]]),),
                               lambda f: decode_put_answer(f.body), timeout_s, "commit_offsets",
                               (consumer_group, entries))
        return refused(PutStatus.MESSAGE_ILLEGAL) if result is None else result

    def committed(self, group: str, consumer_group: str, topics: list[str] | None,
                  timeout_s: float) -> OffsetsResult | Unanswered:
        result = self._request(group, FrameType.COMMITTED, (pack([consumer_group, topics]),),
                               lambda f: decode_offsets_answer(f.body), timeout_s, "committed_offsets",
                               (consumer_group, topics))
        return Unanswered("REFUSED") if result is None else result

    def queue_max_offsets(self, group: str, queues: list[tuple[str, int]],
                          timeout_s: float) -> tuple[tuple[str, int, int], ...] | Unanswered:
        result = self._request(group, FrameType.QUEUE_MAX, (pack([list(q) for q in queues]),),
                               lambda f: tuple((str(t), int(q), int(o)) for t, q, o in unpack(f.body, "queue max")),
                               timeout_s, "queue_max_offsets", (queues,))
        return Unanswered("REFUSED") if result is None else result

    def pull(self, group: str, topic: str, queue_id: int, offset: int, max_count: int, max_bytes: int,
             hold_ms: int, consumer_group: str | None = None) -> concurrent.futures.Future:
        out: concurrent.futures.Future = concurrent.futures.Future()
        target = self._master_connection(group)
        if isinstance(target, Unanswered):
            out.set_result(target)
            return out
        _replica, conn = target
        if conn is None:
            return super().pull(group, topic, queue_id, offset, max_count, max_bytes, hold_ms, consumer_group)
        inner = conn.request(FrameType.PULL, pack([topic, queue_id, offset, max_count, max_bytes, hold_ms,
                                                   consumer_group]))

        def done(f: concurrent.futures.Future) -> None:
            try:
                frame = f.result()
                if frame.type is FrameType.ERROR:
                    out.set_result(Unanswered("REFUSED"))
                else:
                    out.set_result(decode_pull_answer(frame.body))
            except (ConnectionLost, WireError) as exc:
                self.forget_master(group)
                out.set_result(Unanswered(f"CONNECTION_LOST {exc}"))

        inner.add_done_callback(done)
        return out

