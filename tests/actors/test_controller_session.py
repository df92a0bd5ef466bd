"""The broker's session carries its heartbeats (issue 29): a real ``ControllerSession`` against a real
``SessionServer`` on loopback, the node's reactions recorded (one layer: no Raft, no Ray).

A heartbeat given before the session is held is sent with the hello; each later one is a frame on
the connection, acked; when the leader moves, the session says bye (the old controller drops the
row) and reopens with the new one, sending the newest heartbeat with its hello at once. The
controller's role-change notifications come back on the same connection and reach ``on_role``.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from rocketray.actors.controller_client import AsyncControllerClient
from rocketray.actors.controller_session import ControllerSession
from rocketray.auth import SESSION_LABEL
from rocketray.border import Border, LimitsConfig
from rocketray.listener import start_listener
from rocketray.wire.controller_api import BrokerHeartbeatRequest, MasterInfo
from rocketray.controller.session import Hello, SessionDecoder, encode_ack, encode_role
from rocketray.controller.session_server import SessionServer
from rocketray.spec import ClusterSpec, ControllerSpec
from rr_members import broker, controller, links

HELLO = Hello("c", "g", 2, "127.0.0.1:9002")
log = logging.getLogger(__name__)


def broker_links():
    """Broker 2 of group g of cluster t (the specs below are cluster t)."""
    return links(broker(2, "g", "t"))


def request(max_offset: int, broker_id: int = 2) -> BrokerHeartbeatRequest:
    return BrokerHeartbeatRequest("c", "g", "127.0.0.1:9002", broker_id, epoch=1, max_offset=max_offset,
                                  confirm_offset=0, heartbeat_timeout_ms=10_000)


class Recorder:
    """What one controller's node was told (called on the listener's loop / worker threads)."""

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self.lock = threading.Lock()
        self.heartbeats: list[BrokerHeartbeatRequest] = []
        self.moved: list[tuple[str, int]] = []
        self.closed: list[tuple[str, int]] = []

    def server(self) -> SessionServer:
        return SessionServer("127.0.0.1", 0, links(controller(self.index, "t")), lambda *k: self.closed.append(k),
                             on_heartbeat=lambda r: self.heartbeats.append(r),
                             on_moved=lambda *k: self.moved.append(k)).start()


async def until(predicate, what: str, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def test_heartbeats_ride_the_session_and_follow_the_leader():
    nodes = [Recorder(0), Recorder(1)]
    servers = [n.server() for n in nodes]
    spec = ClusterSpec("t", "c", "/tmp/t", "fast",
                       tuple(ControllerSpec(i, "127.0.0.1", 7000 + i, f"/tmp/t/c{i}", session_port=s.port)
                             for i, s in enumerate(servers)), ())
    assert ControllerSession.carries_heartbeats(spec)
    assert not ControllerSession.carries_heartbeats(ClusterSpec("t", "c", "/tmp/t", "fast", (
        ControllerSpec(0, "127.0.0.1", 7000, "/tmp/t/c0"),), ()))
    leader = ["127.0.0.1:7000"]

    async def refresh() -> None:
        return None

    async def main() -> None:
        session = ControllerSession(spec, broker_links(), lambda: HELLO, lambda: leader[0], refresh)
        client = AsyncControllerClient(spec, heartbeat_sink=session.heartbeat)
        client._start_watches = lambda: None          # no Ray here: the heartbeat path only
        await client.heartbeat(request(100))          # before any session: kept for the hello
        session.start()
        await until(lambda: len(nodes[0].heartbeats) == 1, "the heartbeat sent with the hello")
        assert nodes[0].heartbeats[0] == request(100)
        await client.heartbeat(request(200))
        await until(lambda: session.heartbeats_acked == 2, "both heartbeats acked")
        assert [h.max_offset for h in nodes[0].heartbeats] == [100, 200]
        assert session.last_ack_ms is not None and session.last_ack_ms >= 0
        await client.heartbeat(request(300, broker_id=5))     # not this session's broker: not sent
        await asyncio.sleep(0.1)
        assert len(nodes[0].heartbeats) == 2

        leader[0] = "127.0.0.1:7001"                  # the leader moved: bye to 0, hello to 1
        await client.heartbeat(request(400))
        await until(lambda: nodes[0].moved == [("g", 2)], "the bye to the old leader")
        await until(lambda: [h.max_offset for h in nodes[1].heartbeats][-1:] == [400],
                    "the newest heartbeat with the hello to the new leader")
        assert session.connected_to == "127.0.0.1:7001"
        assert nodes[0].closed == [] and nodes[1].closed == [], "a move is not a death"
        session._task.cancel()

    try:
        asyncio.run(main())
    finally:
        for s in servers:
            s.close()


def spec_of(*ports: int) -> ClusterSpec:
    return ClusterSpec("t", "c", "/tmp/t", "fast",
                       tuple(ControllerSpec(i, "127.0.0.1", 7000 + i, f"/tmp/t/c{i}", session_port=port)
                             for i, port in enumerate(ports)), ())


async def no_refresh() -> None:
    return None


def test_a_role_notification_from_the_controller_reaches_on_role_on_the_brokers_loop():
    """``SessionServer.notify`` (called from a thread that is not the listener's, like the node's
    election callback) reaches the broker's ``on_role`` through its held session, as a task on the
    broker's loop, and the session stays held and keeps its heartbeats acked."""
    node = Recorder()
    server = node.server()
    info = MasterInfo(2, "127.0.0.1:9002", 4, 5, frozenset({2, 3}))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        got: list[tuple[MasterInfo, bool]] = []

        async def on_role(notification: MasterInfo) -> None:
            got.append((notification, asyncio.get_running_loop() is loop))

        session = ControllerSession(spec_of(server.port), broker_links(), lambda: HELLO, lambda: "127.0.0.1:7000",
                                    no_refresh, on_role=on_role)
        session.heartbeat(request(100))
        session.start()
        await until(lambda: session.heartbeats_acked == 1, "the session held and its first heartbeat acked")
        sent = await loop.run_in_executor(None, server.notify, "g", 2, info)
        assert sent, "the controller holds this broker's session"
        assert not server.notify("g", 3, info), "no session of broker 3 here: the caller uses Ray"
        await until(lambda: got == [(info, True)], "the notification in on_role, on the broker's loop")
        session.heartbeat(request(200))
        await until(lambda: session.heartbeats_acked == 2, "the next heartbeat acked on the same session")
        assert session.roles_received == 1 and session.connected_to == "127.0.0.1:7000"
        assert node.closed == [] and server.protocol_errors == 0
        session._task.cancel()

    try:
        asyncio.run(main())
    finally:
        server.close()


class FakeController:
    """A controller end that authenticates, reads each broker's hello and answers it with ``reply(hello)``
    bytes (the test's frames, good or bad), counting the sessions each broker opened."""

    def __init__(self, reply) -> None:
        self.reply = reply
        self.hellos: list[Hello] = []
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> int:
        self.links = links(controller(0, "t"))
        self.server = await start_listener(self._serve, "127.0.0.1", 0, border=Border("fake", LimitsConfig(), log),
                                           ssl_context=self.links.server_context, handshake_timeout_s=5)
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            data = (await self.links.accept(reader, writer, SESSION_LABEL)).leftover
            decoder = SessionDecoder()
            hello = None
            while hello is None:
                frames = decoder.receive_data(data)
                hello = next((f for f in frames if isinstance(f, Hello)), None)
                if hello is None:
                    data = await reader.read(4096)
                    if not data:
                        return
            self.hellos.append(hello)
            writer.write(self.reply(hello, sum(h.broker_id == hello.broker_id for h in self.hellos)))
            while await reader.read(4096):
                pass
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


def test_a_bad_role_frame_closes_that_session_only_and_it_reconnects():
    """A controller end that sends broker 2 a malformed role frame (a member id 0 in the SyncStateSet)
    right after an ack: broker 2's session takes the ack, drops the connection (a protocol error,
    nothing handed to ``on_role``) and reconnects; broker 3's session on the same controller gets a
    good role frame and stays on its first connection."""
    good = MasterInfo(3, "127.0.0.1:9003", 2, 2, frozenset({3}))
    bad = bytearray(encode_role(MasterInfo(3, "127.0.0.1:9003", 2, 2, frozenset({1}))))
    assert bad[-1] == 1
    bad[-1] = 0                                        # "sss": [0]: a broker id is >= 1

    def reply(hello: Hello, nth: int) -> bytes:
        if hello.broker_id == 2 and nth == 1:
            return encode_ack(1) + bytes(bad)
        return encode_ack(1) + encode_role(good)

    async def main() -> None:
        fake = FakeController(reply)
        port = await fake.start()
        got: dict[int, list[MasterInfo]] = {2: [], 3: []}
        sessions = {}
        for broker_id in (2, 3):
            async def on_role(info: MasterInfo, broker_id: int = broker_id) -> None:
                got[broker_id].append(info)
            hello = Hello("c", "g", broker_id, f"127.0.0.1:{9000 + broker_id}")
            sessions[broker_id] = ControllerSession(spec_of(port), links(broker(broker_id, "g", "t")),
                                                    lambda hello=hello: hello, lambda: "127.0.0.1:7000",
                                                    no_refresh, on_role=on_role)
            sessions[broker_id].heartbeat(request(100, broker_id=broker_id))
            sessions[broker_id].start()
        await until(lambda: [h.broker_id for h in fake.hellos].count(2) == 2, "broker 2's second session")
        await until(lambda: got[2] == [good], "the reconnected session's good role frame")
        assert got[3] == [good]
        assert [h.broker_id for h in fake.hellos].count(3) == 1, "broker 3's session was not touched"
        assert sessions[2].heartbeats_acked == 2, "the ack before the bad frame was taken"
        assert sessions[2].roles_received == 1 and sessions[3].roles_received == 1
        for s in sessions.values():
            s._task.cancel()
        fake.server.close()

    asyncio.run(main())
