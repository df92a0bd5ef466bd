"""The slave side of HA replication: connect to the master, then run the data path on one thread.

Theory of operation. ``SlaveClient`` loops on the broker's event loop: cut a torn tail (IO thread),
connect and authenticate the master as a member of this group (``rocketray.links``, on a worker
thread, blocking), start a ``SlaveSession`` against the store (IO thread, after every queued store
job), run the session, and on any failure close and reconnect with exponential backoff. The session
itself runs on a receive thread of its own, like RocketMQ's ``HAClient`` service thread: the thread
owns the connected socket (TLS or plain) and does, in one pass per receive, what the protocol
asks: ``recv_into`` a large buffer (without TLS ``SO_RCVLOWAT`` set to the rest of the packet being
received, so a receive returns a whole transfer, not each piece the network delivers), hand the whole packets
that completed to the session, apply its store actions in order (verify and append, record epochs,
set the confirm offset, truncate) and send each ack right after the bytes it names were appended
(one per receive: the session reports after the last whole packet, like upstream). Nothing of
it runs on the event loop, so a large append or truncation never stalls the loop, and there is no
hop between threads per packet (each cost more than appending a small batch). With a receive
timeout of at most 100 ms the same thread sends heartbeat acks when idle and closes the
connection when the master went quiet
(``SlaveSession.tick``). ``stop`` sets a flag, shuts the socket down (waking a blocked receive) and
waits for the thread to end: after it returns the client touches the store no more.

The receive buffers (:class:`PacketBuffers`) hold whole master packets: each packet lies in one
buffer, so the decoder takes a body as one read-only view of the buffer the kernel wrote into and
the store appends that view; nothing is copied in user space. A packet that would not fit in the
rest of its buffer moves, with the part of it received so far, to the next buffer. Buffers no view
refers to any more are reused.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import sys
import threading
from typing import TYPE_CHECKING, Callable

from rocketray.auth import HA_LABEL
from rocketray.wire.ha_protocol import ProtocolError, master_packet_length
from rocketray.ha.session import (
    Append, Close, LocalLog, RecordEpoch, Send, SetConfirmOffset, SlaveAction, SlaveSession, Truncate,
)
from rocketray.ha.peers import master_problem
from rocketray.ha.transport import ConnectionDropped, ConnectionOwner
from rocketray.links import LinkRefused

if TYPE_CHECKING:
    from rocketray.broker.store import MessageStore

__all__ = ["SlaveClient", "PacketBuffers", "apply_to_store", "local_log"]

log = logging.getLogger(__name__)

RECV_BUFFER = 4 << 20       # the kernel copies received bytes into buffers of this size (or larger)
RECV_MIN_FREE = 256 << 10   # ... and a new one starts when less than this is left
RECV_POOL = 4               # receive buffers kept for reuse
RCVLOWAT_MAX = 1 << 20     # a receive returns once this much of the packet being received is in
TICK_MAX_S = 0.1            # the receive timeout: how often an idle thread looks at the clock


def local_log(store: "MessageStore") -> LocalLog:
    return LocalLog(store.min_offset, store.max_offset,
                    tuple((e.epoch, e.start_offset) for e in store.epoch_file.entries()))


def apply_to_store(store: "MessageStore",
                   action: "Append | SetConfirmOffset | RecordEpoch | Truncate") -> bool:
    """Execute one of a slave session's store actions; False when the epoch file refused an entry."""
    if isinstance(action, Append):
        store.append_raw(action.offset, action.data)
    elif isinstance(action, SetConfirmOffset):
        if action.offset != store.confirm_offset:
            store.confirm_offset = action.offset
    elif isinstance(action, RecordEpoch):
        return bool(store.epoch_file.append(action.epoch, action.start_offset))
    elif isinstance(action, Truncate):
        if action.offset < store.max_offset:
            store.truncate(action.offset)
        store.epoch_file.truncate_suffix_by_offset(action.offset)
    else:
        raise TypeError(f"not a store action: {action!r}")
    return True


class PacketBuffers:
    """Receive buffers that hand out whole master packets: ``free()`` is where the next receive
    writes, ``received(n)`` returns the packets that ``n`` more bytes completed as one read-only
    view (or None). Bytes that are no packet (``master_packet_length`` refuses their header) are
    handed out as they come, for the decoder to refuse with the precise reason."""

    def __init__(self, max_body_bytes: int) -> None:
        self._max_body_bytes = max_body_bytes
        self._buf = memoryview(bytearray(0))
        self._pool: list[bytearray] = []
        self._used = 0              # bytes received into ``_buf``
        self._start = 0             # where the first packet not handed out yet begins in ``_buf``
        self._need: int | None = None   # that packet's length, once its header says
        self._largest = 0           # the longest packet received so far
        self._raw = False           # not packets: hand every byte out as it comes

    def free(self) -> memoryview:
        """Where the next receive writes: the rest of the buffer, or only up to the end of the
        packet being received when the room after it could not hold the largest packet seen so
        far (up to half a buffer): the next packet then starts the next buffer and nothing moves."""
        room = len(self._buf) - self._start
        need = self._need
        largest = min(self._largest, RECV_BUFFER // 2)
        if (len(self._buf) - self._used < RECV_MIN_FREE or (need is not None and need > room)
                or (self._used == self._start and room < largest)):
            partial = bytes(self._buf[self._start:self._used])  # of the next packet (usually small)
            self._buf.release()             # the full buffer is free once its views are
            new = self._free_buffer(max(RECV_BUFFER, need or 0))
            new[:len(partial)] = partial
            self._buf = memoryview(new)
            self._start, self._used = 0, len(partial)
        elif need is not None and room - need < largest:
            return self._buf[self._used:self._start + need]
        return self._buf[self._used:]

    def _free_buffer(self, size: int) -> bytearray:
        """A buffer of ``size`` bytes or more that no view refers to any more (its pages are
        already mapped: a fresh 4 MiB buffer costs ~1,000 page faults), or a new one, kept in the
        pool in place of the smallest free buffer when the pool is full."""
        free = []
        for buf in self._pool:
            # The pool's reference, the loop variable and getrefcount's argument: three. A fourth
            # is a view of it (a received packet still in use somewhere).
            if sys.getrefcount(buf) <= 3:
                if len(buf) >= size:
                    return buf
                free.append(buf)
        new = bytearray(size)
        if len(self._pool) < RECV_POOL:
            self._pool.append(new)
        elif free:
            self._pool[self._pool.index(min(free, key=len))] = new
        return new

    def missing(self) -> int:
        """Bytes still to receive of the packet being received (1 while its length is unknown)."""
        need = self._need
        return 1 if need is None or self._raw else max(1, need - (self._used - self._start))

    def received(self, nbytes: int) -> memoryview | None:
        self._used += nbytes
        end = self._start
        while not self._raw:
            try:
                need = master_packet_length(self._buf[end:self._used], self._max_body_bytes)
            except ProtocolError:
                self._raw = True
                break
            if need is not None and need > self._largest:
                self._largest = need
            if need is None or end + need > self._used:
                self._need = need
                break
            end += need
        if self._raw:
            end, self._need = self._used, None
        if end == self._start:
            return None
        chunk = self._buf[self._start:end].toreadonly()
        self._start = end
        return chunk


class SlaveClient:
    """The slave side: connect to the master's HA address and keep replicating."""

    def __init__(self, service: ConnectionOwner, master_address: tuple[str, int],
                 expected_epoch: int | None = None) -> None:
        cfg = service.config
        self.service = service
        self.master_address = master_address
        self.session = SlaveSession(service.broker_id, expected_epoch=expected_epoch,
                                    sync_from_last_file=cfg.sync_from_last_file,
                                    async_learner=cfg.async_learner,
                                    heartbeat_interval_ms=cfg.ha_send_heartbeat_interval_ms,
                                    housekeeping_interval_ms=cfg.ha_housekeeping_interval_ms,
                                    max_body_bytes=cfg.ha_max_body_bytes)
        self._stopped = asyncio.Event()
        self._halt = threading.Event()      # set to end the current receive thread (one per session)
        self._task: asyncio.Task | None = None
        self._sock: socket.socket | None = None        # the receive thread's socket
        self._tls = False
        self._thread: threading.Thread | None = None
        self.connected = False
        self.connections = 0
        self.last_error = ""

    def expect_epoch(self, epoch: int) -> None:
        """The controller named ``epoch`` for this master; the next handshake must match it."""
        self.session.expected_epoch = epoch

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"ha-slave-{self.service.broker_id}")

    async def stop(self) -> None:
        self._stopped.set()
        self._wake_thread()
        task, self._task = self._task, None
        # Python 3.11's wait_for can swallow a cancellation that races with completion, so keep
        # cancelling until the task is really gone (it also checks _stopped at every step).
        while task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=0.5)
        await self._join_thread()
        # After the jobs still queued for the IO thread.
        await self._on_io(self.session.shutdown)
        self.connected = False

    def _wake_thread(self) -> None:
        self._halt.set()
        sock = self._sock
        if sock is not None:
            try:
                # a blocked receive returns at once; the plain socket's shutdown, also under TLS
                # (SSLSocket.shutdown would drop the TLS state under the receiving thread's feet)
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass

    async def _join_thread(self) -> None:
        thread = self._thread
        while thread is not None and thread.is_alive():
            await asyncio.sleep(0.005)

    async def _on_io(self, fn: Callable[[], object]) -> None:
        io = self.service.io
        if io.closed:
            fn()
        else:
            await io.run(fn)

    def _cut_torn_tail(self) -> None:
        """IO thread: READY cuts a torn tail to the last whole message (12.4)."""
        store = self.service.store
        cut = store.truncate_invalid_tail()
        if cut >= 0:
            store.epoch_file.truncate_suffix_by_offset(cut)
            log.warning("ha slave %s: cut torn tail at %d", self.service.broker_id, cut)

    async def _run(self) -> None:
        cfg = self.service.config
        backoff_ms = cfg.ha_reconnect_backoff_min_ms
        io = self.service.io
        while not self._stopped.is_set():
            try:
                await io.run(self._cut_torn_tail)
                sock, leftover = await asyncio.get_running_loop().run_in_executor(None, self._open)
                if self._stopped.is_set():
                    sock.close()
                    return
                backoff_ms = cfg.ha_reconnect_backoff_min_ms
                self.connections += 1
                await self._session(sock, leftover)
            except asyncio.CancelledError:
                raise
            except (OSError, asyncio.TimeoutError, ProtocolError, LinkRefused, ConnectionDropped,
                    Exception) as exc:  # noqa: BLE001 - the shell logs and reconnects
                self.last_error = f"{type(exc).__name__}: {exc}"
                level = logging.INFO if isinstance(exc, (OSError, asyncio.TimeoutError)) \
                    else logging.WARNING
                log.log(level, "ha slave %s: connection to %s:%s ended: %s",
                        self.service.broker_id, *self.master_address, self.last_error)
            finally:
                self.connected = False
                if io.closed:
                    self.session.disconnected()
                else:   # after the receive thread and the jobs still queued
                    io.submit(self.session.disconnected)
            try:
                await asyncio.wait_for(self._stopped.wait(), backoff_ms / 1000)
            except asyncio.TimeoutError:
                pass
            backoff_ms = min(backoff_ms * 2, cfg.ha_reconnect_backoff_max_ms)

    def _connect(self, now_ms: int) -> bytes:
        """IO thread: start the session against the store as it is after every queued job."""
        return self.session.connect(local_log(self.service.store), now_ms)

    def _open(self) -> tuple[socket.socket, bytes]:
        """A worker thread: connect to the master and authenticate it as a member of this group at
        the address dialed (``rocketray.ha.peers.master_problem``); the blocking socket (TLS or
        not) and the bytes that came after the exchange."""
        host, port = self.master_address
        sock, member = self.service.links.connect_blocking(host, port, HA_LABEL)
        problem = None if self.service.peers is None else master_problem(self.service.group, member.identity,
                                                                         f"{host}:{port}")
        if problem is not None:
            sock.close()
            raise LinkRefused(problem)
        return sock, member.leftover

    async def _session(self, sock: socket.socket, leftover: bytes) -> None:
        """Run one connection's session on the receive thread until it ends; raises its error.
        The master sends nothing after authentication until our handshake: from here the receive
        thread alone reads (and writes) the socket."""
        handshake = await self.service.io.run(self._connect, self.service.now_ms())
        self._sock = sock
        self._tls = isinstance(sock, ssl.SSLSocket)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        # Retrieved here too: after a cancelled session nobody awaits it, and an exception never
        # retrieved is logged from the future's finalizer, at whatever point the GC runs it.
        done.add_done_callback(lambda f: f.cancelled() or f.exception())

        def finish(error: BaseException | None) -> None:
            if not done.done():
                if error is None:
                    done.set_result(None)
                else:
                    done.set_exception(error)

        def main() -> None:
            error: BaseException | None = None
            try:
                self._stream(handshake, leftover)
            except BaseException as exc:  # noqa: BLE001 - handed to the loop, which logs it
                error = exc
            finally:
                assert self._sock is not None
                self._sock.close()
            try:
                loop.call_soon_threadsafe(finish, error)
            except RuntimeError:
                pass                        # the loop is closed: nobody waits any more

        if self._stopped.is_set():
            self._sock.close()
            return
        self._halt = threading.Event()
        self._thread = threading.Thread(target=main, daemon=True,
                                        name=f"ha-slave-{self.service.broker_id}")
        self._thread.start()
        self.connected = True
        try:
            await asyncio.shield(done)
        finally:
            self._wake_thread()
            await self._join_thread()
            self._sock = None

    def _stream(self, handshake: bytes, leftover: bytes) -> None:
        """Receive thread: the session of one connection, until it closes or ``stop``."""
        sock = self._sock
        assert sock is not None
        service = self.service
        session = self.session
        tick_ms = min(service.config.ha_send_heartbeat_interval_ms, int(TICK_MAX_S * 1000))
        sock.settimeout(tick_ms / 1000)
        sock.sendall(handshake)
        buffers = PacketBuffers(service.config.ha_max_body_bytes)
        next_tick = service.now_ms() + tick_ms
        if leftover:
            self._feed(leftover, service.now_ms(), sock)
        lowat = 1
        while not self._halt.is_set():
            # Under TLS a receive returns one record's plaintext and the kernel counts ciphertext:
            # the low-water mark stays 1.
            want = 1 if self._tls else min(buffers.missing(), RCVLOWAT_MAX)
            if want != lowat:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
                lowat = want
            try:
                n = sock.recv_into(buffers.free())
            except (TimeoutError, ssl.SSLWantReadError):
                n = -1
            now = service.now_ms()
            if n == 0:
                raise ConnectionDropped("stopped" if self._halt.is_set()
                                        else "master closed the connection")
            if n > 0 and (chunk := buffers.received(n)) is not None:
                self._feed(chunk, now, sock)
            if now >= next_tick:
                next_tick = now + tick_ms
                for action in session.tick(now):
                    self._apply_one(action, sock)

    def _feed(self, chunk: bytes | memoryview, now_ms: int, sock: socket.socket) -> None:
        """Feed ``chunk`` to the session and apply every whole packet's actions in order."""
        store = self.service.store
        self.session.receive_data(chunk, now_ms)
        while (actions := self.session.next_actions(local_log(store), now_ms)) is not None:
            for action in actions:
                self._apply_one(action, sock)

    def _apply_one(self, action: SlaveAction, sock: socket.socket) -> None:
        if isinstance(action, Send):
            sock.sendall(action.data)
        elif isinstance(action, Close):
            raise ConnectionDropped(action.reason)
        else:
            store = self.service.store
            if isinstance(action, Truncate):
                log.info("ha slave %s: truncating at %d (max %d)",
                         self.service.broker_id, action.offset, store.max_offset)
            if not apply_to_store(store, action):
                log.warning("ha slave %s: epoch entry (%d, %d) refused by the epoch file",
                            self.service.broker_id, action.epoch, action.start_offset)

