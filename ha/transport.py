"""asyncio shells around the pure sessions: one master-side connection, the slave-side client.

Theory of operation. The shells run on the broker's event loop; blocking store work runs on the
owner's ordered IO thread (``ConnectionOwner.io``, one per broker). A master connection is a reader
task (bytes -> ``MasterSession`` events -> the service) and a writer task (handshake reply, then
batches from the commit log through ``MasterSession.next_send``, heartbeats when idle, housekeeping
close), woken by an ``asyncio.Event`` when the service has new data or the reader saw a packet. The
slave client loops: cut a torn tail, connect, authenticate, run a ``SlaveSession`` (reader applies
actions to the store; a ticker sends heartbeat acks and enforces housekeeping), and on any failure
close and reconnect with exponential backoff. The slave's session and its store actions run on the
IO thread: the chunks read from the socket since the last job become one job (decode, verify and
append, record epochs, set the confirm offset); each packet's ack is handed to the loop right after
that packet's bytes were appended and written in order, so an ack never names bytes not appended. At most ``MAX_INFLIGHT``
chunks are queued (the socket keeps receiving meanwhile); the idle ticker touches the session only
when no job is queued. When no job is queued and at most ``INLINE_MAX_BYTES`` arrived, the loop
does the work itself as long as each action is bounded (an append that is not fsynced, a small
confirm-offset dispatch, an ack) and hands the first heavy action (a truncation, an fsynced epoch
entry or append, a large dispatch) and everything after it to the IO thread as one job: the order
of actions and acks is the same either way. Authentication (``rocketray.auth``) runs before any
RocketMQ packet in both directions; a failure closes the connection with a logged reason.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import TYPE_CHECKING, Callable, Protocol

from rocketray.auth import AuthError, authenticate
from rocketray.broker.config import FlushMode
from rocketray.ha.config import HAConfig
from rocketray.ha.loop_monitor import OrderedIO
from rocketray.ha.protocol import EpochPoint, ProtocolError
from rocketray.ha.session import (
    Append, Close, LocalLog, MasterSession, Outgoing, RecordEpoch, Send, SetConfirmOffset,
    SlaveAction, SlaveSession, Truncate,
)

if TYPE_CHECKING:
    from rocketray.broker.store import MessageStore

__all__ = ["StoreLogView", "MasterConnection", "SlaveClient", "ConnectionDropped",
           "ConnectionOwner"]

log = logging.getLogger(__name__)

READ_CHUNK = 4 << 20
STREAM_LIMIT = 8 << 20      # StreamReader pauses the socket beyond 2x this (default 64 KiB)
MAX_INFLIGHT = 2            # slave: receive jobs queued on the IO thread at most
INLINE_MAX_BYTES = 256 << 10  # slave: received bytes the loop appends itself when no job is queued
RECV_BUFFER = 8 << 20       # slave: the kernel copies received bytes into buffers of this size
RECV_MIN_FREE = 256 << 10   # ... and a new one starts when less than this is left
RECV_POOL = 6               # receive buffers kept for reuse


class ConnectionDropped(Exception):
    """A session decided to close (reason in the message)."""


class StoreLogView:
    """``MasterLogView`` over a ``rocketray.broker.store.MessageStore``."""

    def __init__(self, store, confirm_offset: Callable[[], int]) -> None:
        self._store = store
        self._confirm = confirm_offset

    @property
    def min_offset(self) -> int:
        return self._store.min_offset

    @property
    def max_offset(self) -> int:
        return self._store.max_offset

    @property
    def confirm_offset(self) -> int:
        return max(0, self._confirm())

    def epoch_points(self) -> list[EpochPoint]:
        return [EpochPoint(e.epoch, e.start_offset) for e in self._store.epoch_file.entries()]

    def read_raw(self, offset: int, max_bytes: int):
        return self._store.read_raw(offset, max_bytes)

    def last_segment_base_offset(self) -> int:
        return self._store.last_segment_base_offset()


class ConnectionOwner(Protocol):
    """What the connection shells need from their owner (``HAService`` implements it). The shells
    call back only through these public members; the owner holds every decision."""

    broker_id: int
    config: HAConfig
    secret: bytes | str
    store: "MessageStore"
    log_view: "StoreLogView"
    io: OrderedIO

    def now_ms(self) -> int: ...

    def on_session_event(self, conn: "MasterConnection", event: object, now_ms: int) -> None: ...

    def on_caught_up(self, conn: "MasterConnection", now_ms: int) -> None: ...

    def connection_closed(self, conn: "MasterConnection") -> None: ...


def local_log(store) -> LocalLog:
    return LocalLog(store.min_offset, store.max_offset,
                    tuple((e.epoch, e.start_offset) for e in store.epoch_file.entries()))


def apply_to_store(store, action: "Append | SetConfirmOffset | RecordEpoch | Truncate") -> bool:
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


def _close_writer(writer: asyncio.StreamWriter | None) -> None:
    if writer is not None:
        try:
            writer.close()
        except Exception:  # noqa: BLE001 - closing a broken transport
            pass


class ChunkReceiver(asyncio.BufferedProtocol):
    """The slave's receive side after authentication: the kernel copies straight into large
    buffers that are handed out once and never written again, so each received range becomes a
    read-only chunk the decoder and the IO thread keep without copying. Chunks queue here until
    the session takes them; beyond ``STREAM_LIMIT`` queued bytes the socket stops reading."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._buf = memoryview(bytearray(0))
        self._pool: list[bytearray] = []
        self._used = 0
        self._chunks: list[memoryview] = []
        self._queued = 0
        self._paused = False
        self.ended = False
        self.error: BaseException | None = None
        self.ready = asyncio.Event()

    def get_buffer(self, sizehint: int) -> memoryview:
        if len(self._buf) - self._used < RECV_MIN_FREE:
            self._buf.release()         # the full buffer is free once its chunks are
            self._buf = memoryview(self._free_buffer())
            self._used = 0
        return self._buf[self._used:]

    def _free_buffer(self) -> bytearray:
        """A receive buffer no chunk refers to any more (its pages are already mapped: a fresh
        8 MiB buffer costs ~2,000 page faults), or a new one while all of them are in use."""
        for buf in self._pool:
            # The pool's reference, the loop variable and getrefcount's argument: three. A fourth
            # is a memoryview of it (a received chunk still in use somewhere).
            if sys.getrefcount(buf) <= 3:
                return buf
        buf = bytearray(RECV_BUFFER)
        if len(self._pool) < RECV_POOL:
            self._pool.append(buf)
        return buf

    def buffer_updated(self, nbytes: int) -> None:
        chunk = self._buf[self._used:self._used + nbytes].toreadonly()
        self._used += nbytes
        self._chunks.append(chunk)
        self._queued += nbytes
        if self._queued > STREAM_LIMIT and not self._paused:
            self._paused = True
            self._transport.pause_reading()
        self.ready.set()

    def eof_received(self) -> bool:
        self.ended = True
        self.ready.set()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self.error = exc
        self.ready.set()

    def take(self) -> list[memoryview]:
        """Every chunk received since the last call (maybe none)."""
        chunks, self._chunks = self._chunks, []
        self._queued = 0
        if not self.ended:
            self.ready.clear()
        if self._paused and not self.ended:
            self._paused = False
            self._transport.resume_reading()
        return chunks


#: A transfer body up to this size is sent with its header in one send (joined: one copy).
_JOIN_MAX = 256 * 1024


class Wake:
    """A flag a loop sleeps on with a timeout: ``asyncio.Event`` without the task that
    ``asyncio.wait_for(event.wait(), t)`` creates on every wait (the master's write loop waits
    once per put per slave)."""

    __slots__ = ("_flag", "_waiter")

    def __init__(self) -> None:
        self._flag = False
        self._waiter: asyncio.Future | None = None

    def set(self) -> None:
        self._flag = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def clear(self) -> None:
        self._flag = False

    def is_set(self) -> bool:
        return self._flag

    async def wait(self, timeout_s: float) -> None:
        """Return when set (at once if it is) or after ``timeout_s``."""
        if self._flag:
            return
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout_s, _release, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None


def _release(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


class MasterConnection:
    """One authenticated slave connection on the master."""

    def __init__(self, service: ConnectionOwner, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, peer: str, leftover: bytes) -> None:
        cfg = service.config
        self.service = service
        self.peer = peer
        self._reader = reader
        self._writer = writer
        self.session = MasterSession(service.now_ms(),
                                     heartbeat_interval_ms=cfg.ha_send_heartbeat_interval_ms,
                                     housekeeping_interval_ms=cfg.ha_housekeeping_interval_ms,
                                     batch_size=cfg.ha_transfer_batch_size)
        self._leftover = leftover
        self.wake = Wake()
        self.closed = False
        self.close_reason = ""
        self.bytes_sent = 0

    @property
    def slave_id(self) -> int | None:
        return self.session.slave_id

    @property
    def ack_offset(self) -> int:
        return self.session.ack_offset

    async def run(self) -> None:
        tasks = [asyncio.create_task(self._read_loop()), asyncio.create_task(self._write_loop())]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    self._note_close(f"{type(task.exception()).__name__}: {task.exception()}")
        finally:
            # Close first: both loops also stop on the flag (a cancellation can be swallowed by
            # Python 3.11's wait_for when it races with the wake-up).
            self.close("connection ended")
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _note_close(self, reason: str) -> None:
        if not self.close_reason:
            self.close_reason = reason

    def close(self, reason: str) -> None:
        if self.closed:
            return
        self._note_close(reason)
        self.closed = True
        self.wake.set()
        _close_writer(self._writer)
        log.info("ha master: closed connection peer=%s slave_id=%s reason=%s", self.peer,
                 self.slave_id, self.close_reason)
        self.service.connection_closed(self)

    async def _read_loop(self) -> None:
        data = self._leftover
        while not self.closed:
            if data:
                now = self.service.now_ms()
                self.session.receive_data(data, now)
                while (event := self.session.next_event(self.service.store.max_offset, now)) \
                        is not None:
                    self.service.on_session_event(self, event, now)
                self.wake.set()
            data = await self._reader.read(READ_CHUNK)
            if not data:
                raise ConnectionDropped("peer closed the connection")

    async def _write_loop(self) -> None:
        service = self.service
        view = service.log_view
        hb_s = service.config.ha_send_heartbeat_interval_ms / 1000
        writer = self._writer
        while not self.closed:
            self.wake.clear()
            now = service.now_ms()
            if self.session.expired(now):
                raise ConnectionDropped(f"housekeeping: nothing read for "
                                        f"{now - self.session.last_read_ms} ms")
            if self.session.reply_due:
                writer.write(self.session.handshake_reply(view, now))
                await writer.drain()
                continue
            out = self.session.next_send(view, now)
            if out is not None:
                if out.header:
                    self._write_out(out)
                    await writer.drain()
                if out.body:
                    continue
                if out.caught_up:
                    service.on_caught_up(self, now)
            await self.wake.wait(min(hb_s, 0.1))

    def _write_out(self, out: Outgoing) -> None:
        writer = self._writer
        if not out.body:
            writer.write(out.header)
        elif len(out.body) <= _JOIN_MAX:  # one send instead of two (writelines joins)
            writer.writelines((out.header, out.body))
        else:                            # a catch-up chunk: not worth a copy
            writer.write(out.header)
            writer.write(out.body)
        self.bytes_sent += len(out.body)


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
        self._task: asyncio.Task | None = None
        self._writer: asyncio.StreamWriter | None = None
        self.connected = False
        self.connections = 0
        self.last_error = ""
        self._queued_jobs = 0       # chunks submitted to the IO thread whose acks are not written

    def expect_epoch(self, epoch: int) -> None:
        """The controller named ``epoch`` for this master; the next handshake must match it."""
        self.session.expected_epoch = epoch

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"ha-slave-{self.service.broker_id}")

    async def stop(self) -> None:
        self._stopped.set()
        _close_writer(self._writer)
        task, self._task = self._task, None
        # Python 3.11's wait_for can swallow a cancellation that races with completion, so keep
        # cancelling until the task is really gone (it also checks _stopped at every step).
        while task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=0.5)
        # After the jobs still queued for the IO thread (they own the session while queued).
        await self._on_io(self.session.shutdown)
        self.connected = False

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
                host, port = self.master_address
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port, limit=STREAM_LIMIT),
                    cfg.ha_auth_timeout_ms / 1000)
                self._writer = writer
                if self._stopped.is_set():
                    return
                leftover = await authenticate(reader, writer, "client", self.service.secret,
                                              cfg.ha_auth_timeout_ms)
                if self._stopped.is_set():
                    return
                backoff_ms = cfg.ha_reconnect_backoff_min_ms
                self.connections += 1
                await self._session(reader, writer, leftover)
            except asyncio.CancelledError:
                raise
            except (OSError, asyncio.TimeoutError, ProtocolError, AuthError, ConnectionDropped,
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
                else:   # after the jobs still queued for this connection
                    io.submit(self.session.disconnected)
                _close_writer(self._writer)
                self._writer = None
            try:
                await asyncio.wait_for(self._stopped.wait(), backoff_ms / 1000)
            except asyncio.TimeoutError:
                pass
            backoff_ms = min(backoff_ms * 2, cfg.ha_reconnect_backoff_max_ms)

    def _connect(self, now_ms: int) -> bytes:
        """IO thread: start the session against the store as it is after every queued job."""
        return self.session.connect(local_log(self.service.store), now_ms)

    def _process(self, chunks: list[bytes | memoryview], now_ms: int,
                 send: Callable[[bytes], object], pending: list[SlaveAction] | None = None) -> None:
        """IO thread: apply ``pending`` (actions the loop left to this thread), feed received chunks
        and apply every whole packet's store actions in order; each ack goes to ``send`` right
        after the bytes it names were appended. Raises ConnectionDropped / ProtocolError."""
        if pending:
            self._apply(pending, send)
        self._feed(chunks, now_ms, send, lambda action: True)

    def _process_inline(self, chunks: list[bytes | memoryview], now_ms: int,
                        send: Callable[[bytes], object]) -> list[SlaveAction] | None:
        """On the loop, with no job queued (so the loop owns the session): what ``_process`` does,
        as long as every action is light. Returns the actions from the first heavy one on (the IO
        thread must apply them, then go on with the session), or None when all is done."""
        return self._feed(chunks, now_ms, send, self._light)

    def _feed(self, chunks: list[bytes | memoryview], now_ms: int, send: Callable[[bytes], object],
              may_apply: Callable[[SlaveAction], bool]) -> list[SlaveAction] | None:
        """Feed ``chunks`` to the session and apply its actions in order while ``may_apply``
        allows; the actions from the first it refuses on, or None when all were applied."""
        store = self.service.store
        for chunk in chunks:
            self.session.receive_data(chunk, now_ms)
        while (actions := self.session.next_actions(local_log(store), now_ms)) is not None:
            for i, action in enumerate(actions):
                if not may_apply(action):
                    return actions[i:]
                self._apply_one(action, send)
        return None

    def _apply(self, actions: list[SlaveAction], send: Callable[[bytes], object]) -> None:
        for action in actions:
            self._apply_one(action, send)

    def _apply_one(self, action: SlaveAction, send: Callable[[bytes], object]) -> None:
        if isinstance(action, Send):
            send(action.data)
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

    def _light(self, action: SlaveAction) -> bool:
        """Bounded work the loop may do itself: an ack, a close, an append of at most
        ``INLINE_MAX_BYTES`` that is not fsynced, a confirm offset that dispatches at most that
        many bytes of records. Truncations and epoch entries (fsynced) go to the IO thread."""
        if isinstance(action, (Send, Close)):
            return True
        store = self.service.store
        if isinstance(action, Append):
            return (len(action.data) <= INLINE_MAX_BYTES and action.offset == store.max_offset  # no log reset
                    and store.config.flush_mode is not FlushMode.SYNC)
        if isinstance(action, SetConfirmOffset):
            return action.offset - store.dispatched_offset <= INLINE_MAX_BYTES
        return False

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       leftover: bytes) -> None:
        service = self.service
        io = service.io
        transport = writer.transport
        handshake = await io.run(self._connect, service.now_ms())
        # The master sends nothing after authentication until our handshake, so the stream
        # reader holds no bytes: from here the socket reads straight into ``ChunkReceiver``.
        receiver = ChunkReceiver(transport)
        transport.set_protocol(receiver)
        transport.write(handshake)
        self.connected = True
        progress = asyncio.Event()
        failure: list[BaseException] = []

        loop = asyncio.get_running_loop()

        def write_ack(data: bytes) -> None:
            if not failure and not transport.is_closing():
                transport.write(data)

        def send(data: bytes) -> None:
            # IO thread -> loop, FIFO: acks leave in order, each after its job appended the
            # bytes, and before the job's completion callback below.
            loop.call_soon_threadsafe(write_ack, data)

        def job_done(fut: asyncio.Future) -> None:
            # Runs on the loop, in submission order (one IO thread).
            self._queued_jobs -= 1
            progress.set()
            if fut.cancelled() or failure:
                return
            exc = fut.exception()
            if exc is not None:
                failure.append(exc)
                transport.close()       # wakes the receive loop below

        ticker = asyncio.create_task(self._tick(writer))
        try:
            chunks: list[bytes | memoryview] = [leftover] if leftover else []
            while True:
                if ticker.done():
                    ticker.result()
                if failure:
                    raise failure[0]
                rest: list[SlaveAction] | None = None
                if chunks and not self._queued_jobs and sum(map(len, chunks)) <= INLINE_MAX_BYTES:
                    # no job queued: the loop owns the session and does the light work itself
                    # (a thread hand-off each way cost more than appending a small chunk)
                    rest = self._process_inline(chunks, service.now_ms(), write_ack)
                    chunks = []
                if chunks or rest:
                    while self._queued_jobs >= MAX_INFLIGHT and not failure:
                        progress.clear()
                        await progress.wait()
                    if failure:
                        raise failure[0]
                    fut = io.submit(self._process, chunks, service.now_ms(), send, rest)
                    self._queued_jobs += 1
                    fut.add_done_callback(job_done)
                await receiver.ready.wait()
                chunks = receiver.take()
                if self._stopped.is_set():
                    return
                if not chunks and receiver.ended:
                    while self._queued_jobs and not failure:   # a failing job closes the socket
                        progress.clear()
                        await progress.wait()
                    if failure:
                        raise failure[0]
                    if receiver.error is not None:
                        raise ConnectionDropped(f"connection lost: {receiver.error}")
                    raise ConnectionDropped("master closed the connection")
        finally:
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)

    async def _tick(self, writer: asyncio.StreamWriter) -> None:
        interval_s = min(self.service.config.ha_send_heartbeat_interval_ms / 1000, 0.1)
        while True:
            await asyncio.sleep(interval_s)
            if self._queued_jobs:
                continue        # the IO thread owns the session while a job is queued
            for action in self.session.tick(self.service.now_ms()):
                if isinstance(action, Send):
                    writer.write(action.data)
                elif isinstance(action, Close):
                    raise ConnectionDropped(action.reason)
            await writer.drain()
