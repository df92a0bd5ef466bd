"""The broker's session connection to the controller leader (``rocketray.controller.session``).

A task on the broker actor's event loop. Once the broker has its id and knows the controller leader,
it connects to that controller's session port, authenticates as a member (``rocketray.links``: TLS with
its certificate, checking the controller's, then the members' secret) and sends its
hello with its newest heartbeat; then every heartbeat of the broker (``heartbeat``, called by the
ReplicasManager every ``broker_heartbeat_interval_ms``) is a frame on this connection, acked by the
controller: liveness goes only to the leader the broker follows, as RocketMQ's broker heartbeats on
its channel, not as a Ray call to every controller. A heartbeat while no session is held is kept
and sent with the next hello. If the broker's process dies the kernel closes the connection and the
leader re-elects at once. When another leader is known (``leader_of``: the broker's controller client
follows leadership with a long poll on every controller, ``actors/controller_client.py``) or the broker
id changes, the session says bye and moves within ``POLL_S``: a new leader treats a master that has
not reopened its session within a grace window as dead (``LeaderSessionGrace``). When the controller
end closes (the controller died or restarted), or a connect fails, it asks for the leader again and
retries with a bounded backoff, cut short as soon as another leader is known. A malformed frame from
the controller closes the connection (and the session reconnects).

The controller also pushes role-change notifications on the session (a ``role`` frame after an
election, ``SessionServer.notify``): each one is handed to ``on_role`` (the ReplicasManager's
``on_role_change``) as a task on this loop, so the read loop never waits for a role switch; the
manager's feed lock orders it with everything else, and its role machine ignores a notification it
already had (the same one may also come as a Ray call) or an older one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable

from rocketray.auth import SESSION_LABEL
from rocketray.wire.controller_api import BrokerHeartbeatRequest, MasterInfo
from rocketray.controller.session import (Ack, ControllerFrameDecoder, Hello, SessionProtocolError, encode_bye,
                                          encode_heartbeat, encode_hello, heartbeat_of)
from rocketray.links import LinkRefused, MemberLinks
from rocketray.spec import ClusterSpec

log = logging.getLogger("rocketray.broker.session")

__all__ = ["ControllerSession"]

POLL_S = 0.05            # how often a held session checks whether the leader moved
READ_BYTES = 4096
CONNECT_TIMEOUT_S = 2.0
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 1.0
MAX_ROLE_TASKS = 16      # role switches in flight at once (each waits for the manager's feed lock)

Target = tuple[str, str, int, Hello]  # (leader raft address, session host, session port, hello)


class ControllerSession:
    """``hello_of()`` is this broker's hello (None until it has an id), ``leader_of()`` the raft address
    of the controller it believes leads, ``refresh_leader()`` looks the leader up again, ``on_role(info)``
    takes a role-change notification that came on the session."""

    def __init__(self, spec: ClusterSpec, links: MemberLinks, hello_of: Callable[[], Hello | None],
                 leader_of: Callable[[], str | None], refresh_leader: Callable[[], Awaitable[object]], *,
                 on_role: Callable[[MasterInfo], Awaitable[Any]] | None = None) -> None:
        self._spec = spec
        self._links = links
        self._hello_of = hello_of
        self._leader_of = leader_of
        self._refresh_leader = refresh_leader
        self._on_role = on_role
        self._role_tasks: set[asyncio.Task] = set()
        self._task: asyncio.Task | None = None
        self.connected_to: str | None = None   # raft address of the controller holding the session
        self._latest: BrokerHeartbeatRequest | None = None     # the newest heartbeat, sent on every hello
        self._held: tuple[Hello, asyncio.StreamWriter] | None = None
        self._seq = 0
        self._sent_at: dict[int, float] = {}    # seq -> monotonic send time, until acked (bounded)
        self.heartbeats_sent = 0
        self.heartbeats_acked = 0
        self.last_ack_ms: float | None = None   # the newest ack's round trip
        self.roles_received = 0

    @staticmethod
    def carries_heartbeats(spec: ClusterSpec) -> bool:
        """Do this cluster's heartbeats ride the session? Only if every controller has a session port;
        else brokers heartbeat every controller through Ray (``AsyncControllerClient.heartbeat``)."""
        return bool(spec.controllers) and all(c.session_port is not None for c in spec.controllers)

    def heartbeat(self, request: BrokerHeartbeatRequest) -> None:
        """Send ``request`` on the session now if one is held for its broker id, and keep it for the
        next hello either way. Never blocks (the socket's buffer takes it)."""
        self._latest = request
        if self._held is not None:
            self._send_heartbeat(*self._held)

    def _send_heartbeat(self, hello: Hello, writer: asyncio.StreamWriter) -> None:
        request = self._latest
        if request is None or request.broker_id != hello.broker_id or writer.is_closing():
            return
        self._seq += 1
        if len(self._sent_at) >= 64:     # acks that never came (a closed session) do not pile up
            self._sent_at.clear()
        self._sent_at[self._seq] = time.monotonic()
        writer.write(encode_heartbeat(heartbeat_of(request, self._seq)))
        self.heartbeats_sent += 1

    def start(self) -> "ControllerSession":
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def _target(self) -> Target | None:
        hello, leader = self._hello_of(), self._leader_of()
        if hello is None or not leader:
            return None
        c = self._spec.controller_by_address(leader)
        if c is None or c.session_port is None:
            return None
        return leader, c.host, c.session_port, hello

    async def _run(self) -> None:
        backoff_s = BACKOFF_MIN_S
        while True:
            target = self._target()
            if target is None:
                await asyncio.sleep(POLL_S)
                continue
            try:
                held = await self._hold(target)
            except (OSError, LinkRefused, asyncio.TimeoutError) as exc:
                log.info("controller session to %s failed: %r", target[0], exc)
                held = False
            except Exception:  # noqa: BLE001 - a shell: log and keep trying
                log.exception("controller session to %s failed", target[0])
                held = False
            self.connected_to = None
            if held:
                backoff_s = BACKOFF_MIN_S
                continue
            if self._target() == target:
                try:
                    await self._refresh_leader()
                except Exception as exc:  # noqa: BLE001 - the next round retries
                    log.info("controller leader lookup failed: %r", exc)
            await self._backoff(target, backoff_s)
            backoff_s = min(backoff_s * 2, BACKOFF_MAX_S)

    async def _backoff(self, failed: Target, backoff_s: float) -> None:
        """Wait ``backoff_s`` before trying ``failed`` again, but no longer than until another leader
        is known: a new leader gets this broker's session at once (``LeaderSessionGrace``)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + backoff_s
        while loop.time() < until:
            if self._target() not in (None, failed):
                return
            await asyncio.sleep(min(POLL_S, max(0.0, until - loop.time())))

    async def _hold(self, target: Target) -> bool:
        """Open the session and hold it. True: it moved on purpose (bye sent); False: the controller
        end closed it (or sent bytes that are not acks)."""
        leader, host, port, hello = target
        reader, writer, member = await self._links.connect(host, port, SESSION_LABEL)
        try:
            if member.identity is not None and member.identity != self._spec.controller_identity(leader):
                raise LinkRefused(f"{host}:{port} is {member.identity}, not the controller at {leader}")
            writer.write(encode_hello(hello))
            self._send_heartbeat(hello, writer)
            await writer.drain()
            self._held = (hello, writer)
            self.connected_to = leader
            log.info("controller session opened to %s group=%s broker_id=%d", leader, hello.group, hello.broker_id)
            closed = asyncio.ensure_future(self._read_frames(reader))
            try:
                while True:
                    done, _ = await asyncio.wait({closed}, timeout=POLL_S)
                    if done:
                        log.info("controller session to %s closed: %s", leader, closed.result())
                        return False
                    if self._target() != target:
                        self._held = None
                        writer.write(encode_bye())
                        await asyncio.wait_for(writer.drain(), CONNECT_TIMEOUT_S)
                        return True
            finally:
                closed.cancel()
        finally:
            self._held = None
            writer.close()

    async def _read_frames(self, reader: asyncio.StreamReader) -> str:
        """Take the controller's acks and role notifications until the connection ends; returns why it ended."""
        decoder = ControllerFrameDecoder()
        while True:
            data = await reader.read(READ_BYTES)
            if not data:
                return "by the controller"
            now = time.monotonic()
            try:
                for frame in decoder.frames(data):
                    if isinstance(frame, Ack):
                        sent = self._sent_at.pop(frame.seq, None)
                        self.heartbeats_acked += 1
                        if sent is not None:
                            self.last_ack_ms = (now - sent) * 1000
                    else:
                        self._role(frame)
            except SessionProtocolError as exc:
                return f"protocol error {exc.code.value}: {exc}"

    def _role(self, info: MasterInfo) -> None:
        """Hand a notification to ``on_role`` as a task (the read loop goes on reading)."""
        self.roles_received += 1
        log.info("role notification on the session master_broker_id=%s epoch=%d sss_epoch=%d",
                 info.master_broker_id, info.master_epoch, info.sync_state_set_epoch)
        if self._on_role is None:
            return
        if len(self._role_tasks) >= MAX_ROLE_TASKS:   # the broker also polls: dropping costs time only
            log.warning("role notification dropped: %d switches in flight", len(self._role_tasks))
            return
        task = asyncio.get_running_loop().create_task(self._apply_role(self._on_role, info))
        self._role_tasks.add(task)
        task.add_done_callback(self._role_tasks.discard)

    @staticmethod
    async def _apply_role(on_role: Callable[[MasterInfo], Awaitable[Any]], info: MasterInfo) -> None:
        try:
            await on_role(info)
        except Exception:  # noqa: BLE001 - a shell step: log; the broker's polls still converge
            log.exception("role notification failed epoch=%d", info.master_epoch)
