"""Finding 4: the controller's session port admits a session only for the broker its member is, and
bounds what a heartbeat may claim. A real controller node and its real session listener; the peers
are raw member connections with the test CA's certificates (``rr_members``)."""

from __future__ import annotations

import asyncio

import pytest

from rocketray.auth import SESSION_LABEL
from rocketray.wire.controller_api import (AlterSyncStateSetRequest, ApplyBrokerIdRequest, BrokerHeartbeatRequest,
                                           ElectMasterRequest, GetReplicaInfoRequest, RegisterBrokerRequest)
from rocketray.controller.config import ControllerConfig
from rocketray.controller.proc import InProcessControllers
from rocketray.controller.session import (Heartbeat, Hello, encode_heartbeat, encode_hello, heartbeat_problem,
                                          hello_problem)
from rocketray.controller.session_server import SessionServer
from rocketray.identity import check_code
from rr_members import broker, controller, links
from rr_testing import wait_until

CLUSTER, GROUP = "c", "broker-a"
HEARTBEAT_TIMEOUT_MS = 60_000


def address(broker_id: int) -> str:
    return f"127.0.0.1:{9000 + broker_id}"


@pytest.fixture
def port(tmp_path, port_factory):
    """A controller node with brokers 1-3 of broker-a registered by members broker-a/1..3, 1 master;
    its session listener, whose closes are recorded."""
    cluster = InProcessControllers(tmp_path / "n", [port_factory()], ControllerConfig.for_tests())
    node = cluster.wait_leader()
    closed: list[tuple[str, int]] = []

    def on_closed(group: str, broker_id: int) -> None:
        closed.append((group, broker_id))
        node.on_broker_session_closed(group, broker_id)

    server = SessionServer("127.0.0.1", 0, links(controller(0)), on_closed, on_heartbeat=node.heartbeat,
                           on_moved=node.forget_broker,
                           hello_problem=lambda hello, peer: hello_problem(hello, peer, CLUSTER,
                                                                           node.registration)).start()
    for broker_id in (1, 2, 3):
        code = check_code(address(broker_id), 1, broker(broker_id))
        assert node.handle(ApplyBrokerIdRequest(CLUSTER, GROUP, broker_id, code)).ok
        assert node.handle(RegisterBrokerRequest(CLUSTER, GROUP, broker_id, address(broker_id))).ok
        assert node.heartbeat(BrokerHeartbeatRequest(CLUSTER, GROUP, address(broker_id), broker_id, epoch=1,
                                                     max_offset=0, confirm_offset=0,
                                                     heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS)).ok
    assert node.handle(ElectMasterRequest.of_broker_trigger(CLUSTER, GROUP, 1)).ok
    assert node.handle(AlterSyncStateSetRequest(GROUP, 1, 1, frozenset({1, 2, 3}), 1)).ok
    yield node, server, closed
    server.close()
    cluster.stop(0)


def master(node) -> tuple[int, int]:
    info = node.handle(GetReplicaInfoRequest(GROUP))
    return info.header.master_broker_id, info.header.master_epoch


async def hello_then_close(port: int, member, hello: Hello, then: bytes = b"") -> bytes:
    """Open a session as ``member`` with ``hello`` (and ``then``), close it without a bye; what came back."""
    reader, writer, _peer = await links(member).connect("127.0.0.1", port, SESSION_LABEL)
    writer.write(encode_hello(hello) + then)
    await writer.drain()
    try:
        got = await asyncio.wait_for(reader.read(4096), 5)
    finally:
        writer.close()
    return got


@pytest.mark.parametrize("member, hello, why", [
    (broker(1), Hello("some-other-cluster", GROUP, 1, address(1)), "another cluster"),
    (broker(1, "broker-b"), Hello(CLUSTER, GROUP, 1, address(1)), "a member of another group"),
    (broker(2), Hello(CLUSTER, GROUP, 1, address(1)), "a replica claiming the master's broker id"),
    (broker(1), Hello(CLUSTER, GROUP, 1, address(2)), "the master's id at another address"),
    (broker(4), Hello(CLUSTER, GROUP, 4, address(4)), "an unregistered broker id"),
    (controller(1), Hello(CLUSTER, GROUP, 1, address(1)), "a controller speaking for a broker"),
])
def test_a_hello_for_a_broker_the_member_is_not_is_refused_and_its_close_elects_nobody(port, member, hello, why):
    # Today a hello naming any cluster, group and broker id is accepted and its close without a
    # bye fires on_closed for that broker: the real group broker-a is re-elected.
    node, server, closed = port
    before = master(node)
    got = asyncio.run(hello_then_close(server.port, member, hello))
    assert got == b"", f"{why}: the controller closes the connection"
    wait_until(lambda: server.protocol_errors == 1, 5, what=f"{why}: the refusal counted")
    assert closed == [] and server.open_sessions == 0 and master(node) == before, why


def test_the_member_that_registered_a_broker_id_holds_its_session(port):
    # The control case: broker-a/1 itself opens broker 1's session; its close is a death.
    node, server, closed = port
    got = asyncio.run(hello_then_close(server.port, broker(1), Hello(CLUSTER, GROUP, 1, address(1)),
                                       encode_heartbeat(Heartbeat(1, HEARTBEAT_TIMEOUT_MS, 1, 0, 0, 0))))
    assert got != b"", "the heartbeat was acked"
    wait_until(lambda: closed == [(GROUP, 1)], 5, what="the master's close handled")
    wait_until(lambda: master(node)[0] in (2, 3), 10, what="the re-election")


def test_a_heartbeat_beyond_the_bounds_closes_its_session_and_keeps_nothing_alive(port):
    # timeout_ms = 2**62 would keep a dead master "alive" for ever; it is a protocol error now.
    node, server, closed = port
    assert heartbeat_problem(Heartbeat(1, 2 ** 62, 1, 0, 0, 0)) is not None
    assert heartbeat_problem(Heartbeat(1, 10_000, -2, 0, 0, 0)) is not None
    assert heartbeat_problem(Heartbeat(1, 10_000, 1, 0, 0, 0)) is None
    got = asyncio.run(hello_then_close(server.port, broker(2), Hello(CLUSTER, GROUP, 2, address(2)),
                                       encode_heartbeat(Heartbeat(1, 2 ** 62, 1, 0, 0, 0))))
    assert got == b""
    wait_until(lambda: server.protocol_errors == 1, 5, what="the bad heartbeat refused")
    row = node.heartbeats.live_info(GROUP, 2)   # the session's close drops the row; never extended
    assert row is None or row.heartbeat_timeout_ms == HEARTBEAT_TIMEOUT_MS


def test_a_peer_without_a_member_certificate_gets_no_session(port):
    # An application (it holds no member credential) fails TLS before any session byte.
    import ssl

    from rocketray.tls import ClientTrust
    from rr_members import ca_for

    node, server, closed = port

    async def attempt() -> bytes:
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", server.port, ssl=ClientTrust("test", ca_for().cert_pem).context(), server_hostname="x")
            writer.write(encode_hello(Hello(CLUSTER, GROUP, 1, address(1))))
            await writer.drain()
            return await asyncio.wait_for(reader.read(100), 5)
        except (ssl.SSLError, ConnectionError):
            return b""      # TLS 1.3: the server's refusal may reach the client as a reset

    assert asyncio.run(attempt()) == b"", "nothing of the session protocol came back"
    wait_until(lambda: server.border.handshake_failures == 1, 5, what="the failed handshake counted")
    assert closed == [] and server.open_sessions == 0
