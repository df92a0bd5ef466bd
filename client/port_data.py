"""The client's data path on the brokers' client ports: one socket round trip per batch or pull.

:class:`PortData` is the half of a ``rocketray.client.transport.Transport`` that moves data: put,
pull, commit, committed offsets and queue max offsets go to the group master's client port
(``actors/client_port.py``, frames of ``rocketray.wire.client_frames``) over the connections of
``rocketray.client.connections``. The other half (finding masters, watching for a new one,
controller requests) is the transport's own: Ray calls for a Ray driver
(``rocketray.client.socket_transport``), control frames on the ports for an application outside
Ray (``rocketray.client.port_transport``). A master that does not answer in time, whose connection
breaks, or that a watch replaced while the answer was late answers :class:`Unanswered` (it may have
run).
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from rocketray.wire.batch import EncodedBatch
from rocketray.wire.client_frames import (PUT_COUNT, Frame, FrameType, PullRequest, WireError, decode_offsets_answer,
                                          decode_pull_answer, decode_put_answer, decode_queue_offsets,
                                          encode_commit_request, encode_pull_request, encode_search_request,
                                          pack)
from rocketray.wire.pull_result import OffsetsResult
from rocketray.client.connections import Connection, ConnectionLost, Dialer, DirectConnection
from rocketray.client.unanswered import Unanswered
from rocketray.wire.put_result import PutResult, PutStatus
from rocketray.ha.ack import refused

__all__ = ["PortData"]

WATCH_SLICE_S = 0.05
DIRECT_IDLE_MAX = 8      # idle direct connections kept per broker (one per thread sending synchronously)


class PortData:
    """The data path (module docstring). A subclass provides the control plane: ``master``,
    ``forget_master``, ``_master_moved`` and ``_client_address``, and calls ``_init_ports``."""

    def _init_ports(self, dialer: Dialer) -> None:
        self._dialer = dialer
        self._conns: dict[tuple[str, int], Connection] = {}
        self._conns_lock = threading.Lock()
        self._direct: dict[tuple[str, int], list[DirectConnection]] = {}   # idle ones, per broker

    if TYPE_CHECKING:   # the control plane: the subclass's (PortData comes first in its bases)
        def master(self, group: str) -> int | None: ...

        def forget_master(self, group: str) -> None: ...

        def _master_moved(self, group: str, replica: int) -> bool:
            """Whether a watch has named another master of ``group`` than ``replica`` (never blocks)."""

        def _client_address(self, group: str, replica: int) -> tuple[str, int] | None:
            """The client port of ``group``'s ``replica`` (None: it has none)."""

    def _without_port(self, group: str, method: str, args: tuple, timeout_s: float) -> Any:
        """``method`` of a master without a client port (a Ray driver calls the actor)."""
        return Unanswered("NO_CLIENT_PORT")

    def _pull_without_port(self, group: str, topic: str, queue_id: int, offset: int, max_count: int,
                           max_bytes: int, hold_ms: int, consumer_group: str | None,
                           tag_filter: str | None = None) -> concurrent.futures.Future:
        out: concurrent.futures.Future = concurrent.futures.Future()
        out.set_result(Unanswered("NO_CLIENT_PORT"))
        return out

    def _connection(self, group: str, replica: int) -> Connection | None:
        address = self._client_address(group, replica)
        if address is None:
            return None
        with self._conns_lock:
            conn = self._conns.get(address)
            if conn is not None and conn.closed is None:
                return conn
        conn = Connection(address, self._dialer)      # outside the lock: may take a while
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
        address = self._client_address(group, replica)
        if address is None:
            return None
        with self._conns_lock:
            idle = self._direct.get(address)
            if idle:
                return idle.pop()
        return DirectConnection(address, self._dialer)

    def _give_back(self, conn: DirectConnection) -> None:
        with self._conns_lock:
            idle = self._direct.setdefault(conn.address, [])
            if conn.closed is None and len(idle) < DIRECT_IDLE_MAX:
                idle.append(conn)
                return
        conn.close("not kept")

    def _master_connection(self, group: str) -> tuple[int, Connection | None] | Unanswered:
        """``group``'s master and a connection to its client port (None: it has none), or
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
        answer is late); a broker without a port is asked another way (``_without_port``)."""
        return self._start(group, frame_type, body, decode, timeout_s, ray_method, ray_args)()

    def _start(self, group: str, frame_type: FrameType, body: tuple, decode: Callable[[Frame], Any],
               timeout_s: float, ray_method: str, ray_args: tuple) -> Callable[[], Any]:
        """Send the request now; the returned callable waits for its answer (see ``_request``)."""
        target = self._master_connection(group)
        if isinstance(target, Unanswered):
            return lambda: target
        replica, conn = target
        if conn is None:
            return lambda: self._without_port(group, ray_method, ray_args, timeout_s)
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
                return lambda: self._without_port(group, ray_method, ray_args, timeout_s)
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
               timeout_s: float, reset: bool = False) -> PutResult | Unanswered:
        result = self._request(group, FrameType.COMMIT, (encode_commit_request(consumer_group, entries, reset),),
                               lambda f: decode_put_answer(f.body), timeout_s, "commit_offsets",
                               (consumer_group, entries, reset))
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
                               lambda f: decode_queue_offsets(f.body, "queue max"),
                               timeout_s, "queue_max_offsets", (queues,))
        return Unanswered("REFUSED") if result is None else result

    def search_offsets(self, group: str, queues: list[tuple[str, int]], timestamp_ms: int,
                       timeout_s: float) -> tuple[tuple[str, int, int], ...] | Unanswered:
        result = self._request(group, FrameType.SEARCH_OFFSET, (encode_search_request(queues, timestamp_ms),),
                               lambda f: decode_queue_offsets(f.body, "search offset"),
                               timeout_s, "search_offsets", (queues, timestamp_ms))
        return Unanswered("REFUSED") if result is None else result

    def pull(self, group: str, topic: str, queue_id: int, offset: int, max_count: int, max_bytes: int,
             hold_ms: int, consumer_group: str | None = None,
             tag_filter: str | None = None) -> concurrent.futures.Future:
        out: concurrent.futures.Future = concurrent.futures.Future()
        target = self._master_connection(group)
        if isinstance(target, Unanswered):
            out.set_result(target)
            return out
        _replica, conn = target
        if conn is None:
            return self._pull_without_port(group, topic, queue_id, offset, max_count, max_bytes, hold_ms,
                                           consumer_group, tag_filter)
        inner = conn.request(FrameType.PULL, encode_pull_request(PullRequest(
            topic, queue_id, offset, max_count, max_bytes, hold_ms, consumer_group, tag_filter)))

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

