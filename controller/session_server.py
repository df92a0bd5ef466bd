"""The controller's broker-session listener (the shell around ``rocketray.controller.session``).

One asyncio loop on a daemon thread accepts broker session connections on the controller's session
port (within the listener's limits, ``rocketray.border``), authenticates each as a member
(``rocketray.links``: TLS with the member's certificate, then the members' secret), admits its hello
only if that member may speak for the broker it names (``hello_problem``), reads its heartbeats (and,
last, a bye or EOF), and keeps the :class:`SessionTable` on that loop thread only. Each heartbeat goes to
``on_heartbeat`` (the node's heartbeat table: a lock held for microseconds, never Raft) on the loop
and is acked on the same connection. When a broker's current session ends without a bye,
``on_closed(group, broker_id)`` runs on a worker thread (it may block on a Raft commit: an
election), never on the loop; when it ends with a bye (the broker moved to another controller),
``on_moved(group, broker_id)`` runs on the loop (it drops the broker's heartbeat row here, which its
next leader now holds). A malformed frame closes that connection only.

``notify(group, broker_id, info)`` writes a role-change notification (``encode_role``) to that
broker's current session. It is called after an election commits, from whichever thread ran it (a
Ray worker, the scan thread, a close worker), so it only looks the session up (a dict under a lock
the loop holds for microseconds) and hands the write to the loop with ``call_soon_threadsafe``; the
loop writes only if that session is still the broker's current one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from rocketray.auth import SESSION_LABEL
from rocketray.border import Border, LimitsConfig, install_accept_error_filter
from rocketray.wire.controller_api import BrokerHeartbeatRequest, MasterInfo
from rocketray.controller.session import (Bye, Heartbeat, Hello, SessionDecoder, SessionErrorCode, SessionProtocolError,
                                          SessionTable, encode_ack, encode_role, heartbeat_request)
from rocketray.identity import Identity
from rocketray.links import LinkRefused, MemberLinks
from rocketray.listener import start_listener

log = logging.getLogger(__name__)

__all__ = ["SessionServer"]

READ_BYTES = 4096
START_TIMEOUT_S = 10.0


class SessionServer:
    """Listens on ``host:port``; see the module docstring. ``start`` raises if the port cannot be bound."""

    def __init__(self, host: str, port: int, links: MemberLinks, on_closed: Callable[[str, int], object], *,
                 on_heartbeat: Callable[[BrokerHeartbeatRequest], object] = lambda request: None,
                 on_moved: Callable[[str, int], object] = lambda group, broker_id: None,
                 hello_problem: Callable[[Hello, Identity | None], str | None] = lambda hello, peer: None,
                 limits: LimitsConfig = LimitsConfig()) -> None:
        """``hello_problem(hello, peer)``: why the member ``peer`` may not open that session
        (``rocketray.controller.session.hello_problem`` bound to the node's state), or None."""
        self.host, self.port = host, port
        self._links = links
        self._on_closed = on_closed
        self._on_heartbeat = on_heartbeat
        self._on_moved = on_moved
        self._hello_problem = hello_problem
        self._limits = limits
        self.border = Border(f"controller session port {host}:{port}", limits, log)
        self._table = SessionTable()
        # each current session's (token, writer), for ``notify`` on other threads: changed on the
        # loop next to the table (which only the loop reads), read under the lock
        self._writers: dict[tuple[str, int], tuple[int, asyncio.StreamWriter]] = {}
        self._writers_lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"controller-sessions-{port}",
                                        daemon=True)
        self._workers = ThreadPoolExecutor(max_workers=2, thread_name_prefix="controller-session-closed")
        self.closes_handled = 0
        self.refused = 0
        self.heartbeats = 0          # heartbeats recorded (read from other threads: a counter only)
        self.protocol_errors = 0
        self.roles_sent = 0          # role notifications written to a session (loop thread)
        self.roles_dropped = 0       # handed to the loop, but the session had ended meanwhile

    def start(self) -> "SessionServer":
        install_accept_error_filter(self._loop, self._limits.log_interval_ms, log)
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(
            start_listener(self._serve, self.host, self.port, border=self.border,
                           ssl_context=self._links.server_context,
                           handshake_timeout_s=self._limits.preauth_timeout_ms / 1000), self._loop)
        try:
            self._server = future.result(START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise
        if self.port == 0:
            self.port = self._server.sockets[0].getsockname()[1]
            self.border.name = f"controller session port {self.host}:{self.port}"
        log.info("controller session listener on %s:%d", self.host, self.port)
        return self

    @property
    def open_sessions(self) -> int:
        return len(self._table)

    def session_keys(self, timeout_s: float = START_TIMEOUT_S) -> frozenset[tuple[str, int]]:
        """The ``(group, broker_id)`` of every current session, read on the listener's loop (the
        table's one thread). Raises TimeoutError if the loop does not answer in ``timeout_s``."""
        async def read() -> frozenset[tuple[str, int]]:
            return self._table.keys()
        return asyncio.run_coroutine_threadsafe(read(), self._loop).result(timeout_s)

    def notify(self, group: str, broker_id: int, info: MasterInfo) -> bool:
        """Send ``info`` as a role frame on the current session of ``(group, broker_id)`` if this node
        holds one (True: the write is handed to the listener's loop), else False (the caller uses
        another way). Thread-safe and never blocks on the loop."""
        with self._writers_lock:
            held = self._writers.get((group, broker_id))
        if held is None:
            return False
        data = encode_role(info)
        try:
            self._loop.call_soon_threadsafe(self._write_role, (group, broker_id), held[0], data)
        except RuntimeError:  # the loop is closed: the listener is shutting down
            return False
        return True

    def _write_role(self, key: tuple[str, int], token: int, data: bytes) -> None:
        """On the loop: write a role frame if ``token`` is still ``key``'s current, open session."""
        with self._writers_lock:
            held = self._writers.get(key)
        if held is None or held[0] != token or held[1].is_closing():
            self.roles_dropped += 1
            log.info("role notification dropped: session ended group=%s broker_id=%d", *key)
            return
        held[1].write(data)
        self.roles_sent += 1

    def _hold(self, hello: Hello, token: int, writer: asyncio.StreamWriter | None) -> None:
        """Record (``writer``) or forget (None) the writer of ``hello``'s session ``token``, on the loop."""
        with self._writers_lock:
            if writer is not None:
                self._writers[hello.key] = (token, writer)
            elif self._writers.get(hello.key, (None,))[0] == token:
                del self._writers[hello.key]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        hello: Hello | None = None
        token = 0
        said_bye = False
        try:
            member = await asyncio.wait_for(self._links.accept(reader, writer, SESSION_LABEL),
                                            self._limits.preauth_timeout_ms / 1000)
            data = member.leftover
            decoder = SessionDecoder()
            while not said_bye:
                for frame in decoder.frames(data):
                    if isinstance(frame, Heartbeat):
                        assert hello is not None  # the decoder admits heartbeats only after the hello
                        self._heartbeat(hello, frame, writer)
                    elif isinstance(frame, Hello):
                        problem = self._hello_problem(frame, member.identity)
                        if problem is not None:
                            raise SessionProtocolError(SessionErrorCode.NOT_ALLOWED, problem)
                        hello, token = frame, self._table.opened(frame)
                        self._hold(hello, token, writer)
                        log.info("broker session opened group=%s broker_id=%d address=%s", frame.group,
                                 frame.broker_id, frame.address)
                    elif isinstance(frame, Bye):
                        said_bye = True
                if not said_bye:
                    data = await reader.read(READ_BYTES)
                    if not data:
                        break
        except (LinkRefused, asyncio.TimeoutError) as exc:
            self.refused += 1
            self.border.log.log(logging.WARNING, "unauthenticated",
                                "controller session: dropping unauthenticated peer %s: %s", peer, exc)
        except SessionProtocolError as exc:
            self.protocol_errors += 1
            log.warning("controller session: closing peer %s code=%s: %s", peer, exc.code.value, exc)
        except (ConnectionError, OSError):
            pass  # a reset is a close like any other
        finally:
            writer.close()
        if hello is not None:
            self._hold(hello, token, None)
            current = self._table.is_current(hello, token)
            dead = self._table.closed(hello, token, said_bye)
            log.info("broker session closed group=%s broker_id=%d bye=%s current=%s", hello.group,
                     hello.broker_id, said_bye, current)
            if dead is not None:
                self._workers.submit(self._closed, *dead)
            elif current:
                self._call(self._on_moved, *hello.key)

    def _heartbeat(self, hello: Hello, frame: Heartbeat, writer: asyncio.StreamWriter) -> None:
        """Record one heartbeat (on the loop: the node's table is a dict under a short lock) and ack it."""
        if self._call(self._on_heartbeat, heartbeat_request(hello, frame)):
            self.heartbeats += 1
            writer.write(encode_ack(frame.seq))

    @staticmethod
    def _call(fn: Callable, *args: object) -> bool:
        try:
            fn(*args)
            return True
        except Exception:  # noqa: BLE001 - a failed reaction must not drop the session
            log.exception("broker session callback failed %s%r", getattr(fn, "__name__", fn), args)
            return False

    def _closed(self, group: str, broker_id: int) -> None:
        try:
            self._on_closed(group, broker_id)
        except Exception:  # noqa: BLE001 - a failed reaction must not kill the worker; expiry still covers it
            log.exception("broker session close handling failed group=%s broker_id=%d", group, broker_id)
        self.closes_handled += 1

    def close(self) -> None:
        """Stop listening and drop every connection (their closes are not acted on). Idempotent."""
        if not self._loop.is_running():
            return
        self._on_closed = self._on_moved = lambda group, broker_id: None
        self._on_heartbeat = lambda request: None

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(START_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - closing
            log.exception("controller session listener shutdown")
        with self._writers_lock:
            self._writers.clear()       # no listener, no sessions: notify answers False from now on
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(START_TIMEOUT_S)
        self._workers.shutdown(wait=False)
