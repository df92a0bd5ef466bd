"""The master side of HA replication: one asyncio shell around a pure ``MasterSession`` per slave.

Theory of operation. A master connection runs on the broker's event loop: the transport's read
event hands the slave's bytes to its ``MasterSession`` and the events to the service in the same
step (``rocketray.direct_reads``), and a writer task (handshake reply, then batches from the commit
log through ``MasterSession.next_send``, heartbeats when idle, housekeeping close) sleeps on
``Wake`` until it has something to do (``nudge``); a put's bytes are written in the put's own step
(``send_now``). Blocking store work runs on the
owner's ordered IO thread (``ConnectionOwner.io``, one per broker); a catch-up's log is read into
the page cache ahead of the sends on the owner's reader thread (``ConnectionOwner.reader``), so the
loop does not wait for the disk on a backlog no longer cached. Authentication
(``rocketray.links``: TLS with member certificates, then the members' secret) runs before any
RocketMQ packet in both directions; a failure closes the connection with a logged reason. The slave side is ``rocketray.ha.slave_client``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Callable, Protocol

from rocketray.direct_reads import DirectReads
from rocketray.ha.config import HAConfig
from rocketray.ha.loop_monitor import OrderedIO
from rocketray.wire.ha_protocol import EpochPoint
from rocketray.ha.session import MasterSession, Outgoing

if TYPE_CHECKING:
    from rocketray.broker.store import MessageStore
    from rocketray.ha.peers import HAPeers
    from rocketray.links import MemberLinks

__all__ = ["StoreLogView", "MasterConnection", "ConnectionDropped", "ConnectionOwner", "close_writer"]

log = logging.getLogger(__name__)

WARM_BYTES = 4 << 20        # a catch-up's log is read ahead of the sends in steps of this
STREAM_LIMIT = 8 << 20      # StreamReader pauses the socket beyond 2x this (default 64 KiB)
YIELD_BYTES = 2 << 20       # the master's writer lets the loop run after sending this much


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

    def warm(self, offset: int, length: int) -> None:
        """A helper thread: bring the log's ``[offset, offset + length)`` into the page cache."""
        self._store.warm(offset, length)


class ConnectionOwner(Protocol):
    """What the connection shells need from their owner (``HAService`` implements it). The shells
    call back only through these public members; the owner holds every decision."""

    broker_id: int
    config: HAConfig
    links: "MemberLinks"
    peers: "HAPeers | None"
    group: str
    store: "MessageStore"
    log_view: "StoreLogView"
    io: OrderedIO
    reader: OrderedIO

    def now_ms(self) -> int: ...

    def on_session_event(self, conn: "MasterConnection", event: object, now_ms: int) -> None: ...

    def on_caught_up(self, conn: "MasterConnection", now_ms: int) -> None: ...

    def connection_closed(self, conn: "MasterConnection") -> None: ...


def close_writer(writer: asyncio.StreamWriter | None) -> None:
    if writer is not None:
        try:
            writer.close()
        except Exception:  # noqa: BLE001 - closing a broken transport
            pass


#: A transfer body up to this size is sent with its header in one send (joined: one copy).
_JOIN_MAX = 256 * 1024


class Wake:
    """A flag a loop sleeps on with a timeout: ``asyncio.Event`` without the task that
    ``asyncio.wait_for(event.wait(), t)`` creates on every wait (the master's write loop waits
    once per put per slave). ``wake_at`` brings the end of a sleep forward without a loop pass now."""

    __slots__ = ("_flag", "_waiter", "_timer")

    def __init__(self) -> None:
        self._flag = False
        self._waiter: asyncio.Future | None = None
        self._timer: asyncio.TimerHandle | None = None

    def set(self) -> None:
        self._flag = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def clear(self) -> None:
        self._flag = False

    def is_set(self) -> bool:
        return self._flag

    @property
    def asleep(self) -> bool:
        """A loop is waiting in ``wait`` and has not been released yet."""
        return self._waiter is not None and not self._waiter.done()

    def wake_at(self, when: float) -> None:
        """End the current sleep at loop time ``when`` at the latest (a sleep already ending
        sooner is left alone; no sleep: nothing to do, the loop decides its next wait itself)."""
        waiter, timer = self._waiter, self._timer
        if waiter is None or waiter.done() or timer is None or timer.when() <= when:
            return
        timer.cancel()
        self._timer = asyncio.get_running_loop().call_at(when, _release, waiter)

    async def wait(self, timeout_s: float) -> None:
        """Return when set (at once if it is), after ``timeout_s``, or at a ``wake_at`` time."""
        if self._flag:
            return
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        self._timer = loop.call_later(timeout_s, _release, waiter)
        try:
            await waiter
        finally:
            if self._timer is not None:
                self._timer.cancel()
            self._waiter = self._timer = None


def _release(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


class MasterConnection:
    """One authenticated slave connection on the master."""

    def __init__(self, service: ConnectionOwner, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, peer: str, leftover: bytes, *,
                 expected_slave_id: int | None = None) -> None:
        """``expected_slave_id``: the only slave id this peer's handshake may claim (None: unchecked)."""
        cfg = service.config
        self.service = service
        self.peer = peer
        self.expected_slave_id = expected_slave_id
        self._reader = reader
        self._writer = writer
        self.session = MasterSession(service.now_ms(),
                                     heartbeat_interval_ms=cfg.ha_send_heartbeat_interval_ms,
                                     housekeeping_interval_ms=cfg.ha_housekeeping_interval_ms,
                                     batch_size=cfg.ha_transfer_batch_size,
                                     confirm_push_delay_ms=cfg.ha_confirm_push_delay_ms)
        self._leftover = leftover
        self.wake = Wake()
        self.write_passes = 0                       # the write loop's passes (each woken or timed out)
        self.closed = False
        self.close_reason = ""
        self.bytes_sent = 0
        self._warming: dict[int, asyncio.Future] = {}   # WARM_BYTES step start -> its read-ahead

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
        close_writer(self._writer)
        log.info("ha master: closed connection peer=%s slave_id=%s reason=%s", self.peer,
                 self.slave_id, self.close_reason)
        self.service.connection_closed(self)

    async def _read_loop(self) -> None:
        """The slave's packets, handled in the transport's read event (``DirectReads``: no loop
        pass between the socket and the session), until the connection ends."""
        reads = DirectReads(self._reader, self._writer, self._on_data, self._leftover)
        self._leftover = b""
        error = await reads.closed
        if error is not None:
            raise error
        raise ConnectionDropped("peer closed the connection")

    def _on_data(self, data: bytes) -> None:
        if self.closed:
            return
        now = self.service.now_ms()
        self.session.receive_data(data, now)
        while (event := self.session.next_event(self.service.store.max_offset, now)) is not None:
            self.service.on_session_event(self, event, now)
        self.nudge()

    async def _write_loop(self) -> None:
        service = self.service
        view = service.log_view
        hb_s = service.config.ha_send_heartbeat_interval_ms / 1000
        writer = self._writer
        unyielded = 0
        while not self.closed:
            self.wake.clear()
            self.write_passes += 1
            now = service.now_ms()
            if self.session.expired(now):
                raise ConnectionDropped(f"housekeeping: nothing read for "
                                        f"{now - self.session.last_read_ms} ms")
            if self.session.reply_due:
                writer.write(self.session.handshake_reply(view, now))
                await writer.drain()
                continue
            if self._catching_up(view):
                await self._warm_ahead(view)
            out = self.session.next_send(view, now)
            if out is not None:
                if out.header:
                    self._write_out(out)
                    await writer.drain()
                if out.body:
                    unyielded += len(out.body)
                    if unyielded >= YIELD_BYTES:
                        # drain() returns without suspending while the socket takes every byte:
                        # a fast slave's catch-up would hold the loop for tens of ms
                        unyielded = 0
                        await asyncio.sleep(0)
                    continue
                if out.caught_up:
                    service.on_caught_up(self, now)
            await self.wake.wait(self._idle_wait_s(view, hb_s))

    def _idle_wait_s(self, view: StoreLogView, hb_s: float) -> float:
        """How long the write loop sleeps when it has nothing to send: until the next header is
        due (a moved confirm offset's push delay, a heartbeat), at most 100 ms, at least 1 ms."""
        wait_s = min(hb_s, 0.1)
        if self.session.send_offset(view) >= 0:
            due_s = (self.session.next_header_due_ms(view.confirm_offset) - self.service.now_ms()) / 1000
            wait_s = min(wait_s, due_s)
        return max(0.001, wait_s)

    def send_now(self) -> None:
        """A put just appended: write the new bytes to this slave now, in the put's own step on
        the loop (waking the write loop costs a loop pass before the slave sees them), unless the
        write loop has something else to do first (a handshake reply, a catch-up, a full socket
        buffer), which it is then woken for; else it is woken only when it has more to do
        (``nudge``)."""
        if self.closed or self.session.reply_due or self._writer.transport.get_write_buffer_size() > 0:
            self.wake.set()
            return
        view = self.service.log_view
        if self._catching_up(view):
            self.wake.set()
            return
        out = self.session.next_send(view, self.service.now_ms())
        if out is not None and out.header:
            self._write_out(out)
        self.nudge()

    def nudge(self) -> None:
        """Wake the write loop if it has something to do before its sleep ends: a handshake reply,
        bytes not sent yet, a header due sooner (a moved confirm offset), the close. A slave's ack
        of bytes already sent, or a put ``send_now`` wrote whole, then costs no loop pass (it was
        one per put and per ack of every slave on the master's loop, and one more per moved confirm
        offset to learn when to push it)."""
        if not self.wake.asleep or self.closed or self.session.reply_due:
            self.wake.set()
            return
        view = self.service.log_view
        offset = self.session.send_offset(view)
        if offset < 0 or offset < view.max_offset:
            self.wake.set()
            return
        now = self.service.now_ms()
        due = self.session.next_header_due_ms(view.confirm_offset)
        if due <= now:
            self.wake.set()
        else:                   # e.g. a moved confirm offset: push it when due, no loop pass before
            self.wake.wake_at(asyncio.get_running_loop().time() + (due - now) / 1000)

    def _catching_up(self, view: StoreLogView) -> bool:
        offset = self.session.send_offset(view)
        return offset >= 0 and view.max_offset - offset >= 2 * self.session.batch_size

    async def _warm_ahead(self, view: StoreLogView) -> None:
        """A catch-up: wait until the log the next transfer reads is in the page cache, read there
        on the service's reader thread (the loop would wait for the disk on a backlog no longer
        cached), and start on the step after it, so the thread keeps ahead of the sends."""
        offset = self.session.next_offset
        first = offset - offset % WARM_BYTES
        steps = range(first, min(offset + self.session.batch_size, view.max_offset), WARM_BYTES)
        for start in (*steps, steps[-1] + WARM_BYTES):
            if start not in self._warming and start < view.max_offset:
                future = self._warming[start] = self.service.reader.submit(view.warm, start,
                                                                           WARM_BYTES)
                # retrieved even when the connection ends first (else logged from its finalizer)
                future.add_done_callback(lambda f: f.cancelled() or f.exception())
        for start in [s for s in self._warming if s < first]:
            del self._warming[start]
        for start in steps:
            try:
                await self._warming[start]
            except Exception as exc:  # noqa: BLE001 - the send reads again and reports its error
                log.debug("ha master: read-ahead at %d failed: %r", start, exc)

    def _write_out(self, out: Outgoing) -> None:
        writer = self._writer
        if not out.body:
            writer.write(out.header)
        elif len(out.body) <= _JOIN_MAX:  # one send instead of two (and one TLS record: a TLS
            writer.write(b"".join((out.header, out.body)))   # transport's writelines writes each apart)
        else:                            # a catch-up chunk: not worth a copy
            writer.write(out.header)
            writer.write(out.body)
        self.bytes_sent += len(out.body)
