"""The transport of an application outside Ray against a real client port (TLS, authentication, frames);
the broker's control answers come from a stand-in (``actors/client_control.py`` is tested on a real
cluster in tests/cluster)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from rocketray.actors.client_port import ClientPort
from rocketray.wire.batch import encode_batch
from rocketray.wire.client_control import GroupView, Metadata
from rocketray.wire.message import Message
from rocketray.client.bootstrap import Bootstrap
from rocketray.client.port_transport import PortTransport
from rocketray.wire.controller_api import ConsumerHeartbeatRequest, GetTopicRouteRequest, Response
from rocketray.wire.controller_codes import ResponseCode
from rocketray.wire.controller_headers import ConsumerHeartbeatResponseHeader, TopicRouteResponseHeader
from rocketray.wire.put_result import PutResult, PutStatus, Written
from rr_users import authenticator, directory_of, login, table_of
from rr_members import CLUSTER, broker, ca_for, member
from rr_testing import wait_until

SECRET = "client-secret"
USER = "app"


class Broker:
    """One broker's client port: puts recorded, control answers from a settable view."""

    def __init__(self) -> None:
        self.puts: list[int] = []
        self.epoch, self.master = 3, 0
        self.requests: list[object] = []
        self.changed: asyncio.Event | None = None
        self.port = 0

    # data
    def put_start(self, batch, done):
        self.puts.append(batch.count)
        return PutResult(PutStatus.PUT_OK, Written.YES, tuple((i, i) for i in range(batch.count)), 1, 1)

    # control
    async def metadata(self) -> Metadata:
        return Metadata(CLUSTER, (GroupView("broker-a", self.master, self.epoch, ((0, "127.0.0.1", self.port),
                                                                                 (1, "127.0.0.1", self.port))),),
                        {"linger_ms": 3})

    async def watch(self, group, known_epoch, wait_ms):
        if self.changed is None:
            self.changed = asyncio.Event()
        if self.epoch <= known_epoch:
            try:
                await asyncio.wait_for(self.changed.wait(), wait_ms / 1000)
            except asyncio.TimeoutError:
                pass
        return self.epoch, self.master

    async def control(self, request):
        self.requests.append(request)
        if isinstance(request, GetTopicRouteRequest):
            return Response(ResponseCode.SUCCESS, TopicRouteResponseHeader(request.topic, ((0, "broker-a"),)))
        return Response(ResponseCode.SUCCESS, ConsumerHeartbeatResponseHeader(request.group, ("c1",)))


@pytest.fixture
def broker_port():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    b = Broker()
    port = ClientPort(b, authenticator(directory_of(table_of({USER: SECRET}))), member(broker(0)).open_server_context(),
                      control=b)
    b.port = asyncio.run_coroutine_threadsafe(port.start("127.0.0.1", 0), loop).result(5)

    def elect(master: int) -> None:
        async def go() -> None:
            b.epoch, b.master = b.epoch + 1, master
            if b.changed is not None:
                b.changed.set()
                b.changed = asyncio.Event()
        asyncio.run_coroutine_threadsafe(go(), loop).result(5)

    yield b, elect
    asyncio.run_coroutine_threadsafe(port.close(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def bootstrap(port: int) -> Bootstrap:
    return Bootstrap(CLUSTER, ("127.0.0.1:1", f"127.0.0.1:{port}"), "app", SECRET, ca_for().cert_pem)


def test_an_application_outside_ray_finds_groups_masters_and_settings_and_sends(broker_port):
    # The first bootstrap address refuses; the second answers. Metadata names the group and its
    # master; the cluster's client settings become the transport's config; a put goes to the master.
    b, _elect = broker_port
    t = PortTransport(bootstrap(b.port))
    try:
        assert t.groups() == ["broker-a"] and t.master("broker-a") == 0
        assert t.config().client.linger_ms == 3
        result = t.put("broker-a", encode_batch([Message("orders", 0, b"x")]), 5.0)
        assert result.status is PutStatus.PUT_OK and b.puts == [1]
        route = t.call_controller(GetTopicRouteRequest("orders"))
        assert route.ok and route.header.queues == ((0, "broker-a"),)
        hb = t.call_controller(ConsumerHeartbeatRequest("g", "c1", ("orders",)))
        assert hb.header.members == ("c1",) and b.requests[-1] == ConsumerHeartbeatRequest("g", "c1", ("orders",))
    finally:
        t.close()


def test_a_watch_names_the_new_master_as_soon_as_the_broker_learns_it(broker_port):
    b, elect = broker_port
    t = PortTransport(bootstrap(b.port))
    try:
        assert t.master("broker-a") == 0
        waiter: list[bool] = []
        th = threading.Thread(target=lambda: waiter.append(t.await_new_master("broker-a", 10)))
        th.start()
        wait_until(lambda: "broker-a" in t._armed, 5, what="the watch armed")   # noqa: SLF001
        elect(1)
        th.join(10)
        assert waiter == [True] and t.master("broker-a") == 1 and t._master_moved("broker-a", 0)   # noqa: SLF001
    finally:
        t.close()


def test_a_wrong_credential_is_refused_at_once_and_an_unknown_ca_finds_no_cluster(broker_port):
    from rocketray.client.errors import AuthenticationFailed, ClusterNotFound
    from rocketray.tls import CertificateAuthority

    b, _elect = broker_port
    with pytest.raises(AuthenticationFailed):
        PortTransport(Bootstrap(CLUSTER, (f"127.0.0.1:{b.port}",), "app", "wrong", ca_for().cert_pem), timeout_s=1)
    with pytest.raises(ClusterNotFound):
        PortTransport(Bootstrap(CLUSTER, (f"127.0.0.1:{b.port}",), "app", SECRET,
                                CertificateAuthority.create(CLUSTER).cert_pem), timeout_s=1)
