"""The broker's session carries its heartbeats (issue 29): a real ``ControllerSession`` against a real
``SessionServer`` on loopback, the node's reactions recorded (one layer: no Raft, no Ray).

A heartbeat given before the session is held is sent with the hello; each later one is a frame on
the connection, acked; when the leader moves, the session says bye (the old controller drops the
row) and reopens with the new one, sending the newest heartbeat with its hello at once.
"""

from __future__ import annotations

import asyncio
import threading

from rocketray.actors.controller_client import AsyncControllerClient
from rocketray.actors.controller_session import ControllerSession
from rocketray.controller.api import BrokerHeartbeatRequest
from rocketray.controller.session import Hello
from rocketray.controller.session_server import SessionServer
from rocketray.spec import ClusterSpec, ControllerSpec

SECRET = "s" * 64
HELLO = Hello("c", "g", 2, "127.0.0.1:9002")


def request(max_offset: int, broker_id: int = 2) -> BrokerHeartbeatRequest:
    return BrokerHeartbeatRequest("c", "g", "127.0.0.1:9002", broker_id, epoch=1, max_offset=max_offset,
                                  confirm_offset=0, heartbeat_timeout_ms=10_000)


class Recorder:
    """What one controller's node was told (called on the listener's loop / worker threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.heartbeats: list[BrokerHeartbeatRequest] = []
        self.moved: list[tuple[str, int]] = []
        self.closed: list[tuple[str, int]] = []

    def server(self) -> SessionServer:
        return SessionServer("127.0.0.1", 0, SECRET, lambda *k: self.closed.append(k),
                             on_heartbeat=lambda r: self.heartbeats.append(r),
                             on_moved=lambda *k: self.moved.append(k)).start()


async def until(predicate, what: str, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def test_heartbeats_ride_the_session_and_follow_the_leader():
    nodes = [Recorder(), Recorder()]
    servers = [n.server() for n in nodes]
    spec = ClusterSpec("t", "c", "/tmp/t", "fast",
                       tuple(ControllerSpec(i, "127.0.0.1", 7000 + i, f"/tmp/t/c{i}", session_port=s.port)
                             for i, s in enumerate(servers)), (), secret=SECRET)
    assert ControllerSession.carries_heartbeats(spec)
    assert not ControllerSession.carries_heartbeats(ClusterSpec("t", "c", "/tmp/t", "fast", (
        ControllerSpec(0, "127.0.0.1", 7000, "/tmp/t/c0"),), ()))
    leader = ["127.0.0.1:7000"]

    async def refresh() -> None:
        return None

    async def main() -> None:
        session = ControllerSession(spec, lambda: HELLO, lambda: leader[0], refresh)
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
