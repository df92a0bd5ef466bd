"""The cluster CA, member identities and TLS contexts (rocketray.tls), over real sockets."""

from __future__ import annotations

import socket
import ssl
import threading

import pytest

from rocketray.tls import CertificateAuthority, ClientTrust, Identity, IdentityError, MemberCredentials, peer_identity

CLUSTER = "sec"


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return CertificateAuthority.create(CLUSTER)


def member(ca: CertificateAuthority, identity: Identity) -> MemberCredentials:
    return ca.member(identity, "members-secret", hosts=["127.0.0.1"])


def handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext):
    """Run one TLS handshake over a real loopback connection; (server side peer identity or the
    exception the server saw, client side ssl socket or the exception the client saw)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    result: dict[str, object] = {}

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1)
                result["server"] = tls.getpeercert()
        except (ssl.SSLError, OSError) as exc:
            result["server"] = exc

    t = threading.Thread(target=serve)
    t.start()
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        tls = client_ctx.wrap_socket(raw)
        tls.sendall(b"x")
        client: object = tls
    except (ssl.SSLError, OSError) as exc:
        client = exc
    t.join(5)
    listener.close()
    return result.get("server"), client


def test_identity_uris_round_trip_and_refuse_what_names_no_member():
    # Each member kind has one URI; anything else is an IdentityError, never a wrong identity.
    for ident in (Identity.controller("c1", 2), Identity.broker("c1", "broker-a", 0)):
        assert Identity.parse(ident.uri) == ident
    for bad in ("https://c1/controller/0", "rocketray://c1/controller/x", "rocketray://c1/broker/0",
                "rocketray://c1/broker/g/1/extra", "rocketray://c 1/controller/0", "rocketray://c1/admin/0"):
        with pytest.raises(IdentityError):
            Identity.parse(bad)
    with pytest.raises(IdentityError):
        Identity("c1", "broker", 0)       # a broker names its group


def test_members_authenticate_each_other_by_certificate_identity(ca):
    # Mutual TLS between a broker and a controller: each side reads the other's identity.
    broker = member(ca, Identity.broker(CLUSTER, "broker-a", 1))
    ctrl = member(ca, Identity.controller(CLUSTER, 0))
    server_peer, client = handshake(ctrl.server_context(), broker.client_context())
    assert isinstance(client, ssl.SSLSocket)
    assert peer_identity(client) == ctrl.identity
    assert isinstance(server_peer, dict)
    assert broker.peer_member(client) == ctrl.identity
    client.close()


def test_a_member_listener_refuses_a_peer_without_a_member_certificate(ca):
    # An application (no client certificate) and a member of another CA both fail the handshake.
    ctrl = member(ca, Identity.controller(CLUSTER, 0))
    app = ClientTrust(CLUSTER, ca.cert_pem).context()
    server_peer, _client = handshake(ctrl.server_context(), app)
    assert isinstance(server_peer, (ssl.SSLError, OSError))
    stranger = member(CertificateAuthority.create(CLUSTER), Identity.broker(CLUSTER, "broker-a", 0))
    server_peer, client = handshake(ctrl.server_context(), stranger.client_context())
    assert isinstance(server_peer, (ssl.SSLError, OSError)) or isinstance(client, (ssl.SSLError, OSError))


def test_an_application_accepts_only_a_broker_of_its_cluster(ca):
    # The client port presents the broker's certificate and asks for none; the application checks
    # the chain and that the identity is a broker of the cluster it wants.
    broker = member(ca, Identity.broker(CLUSTER, "broker-b", 2))
    trust = ClientTrust(CLUSTER, ca.cert_pem)
    _server, client = handshake(broker.open_server_context(), trust.context())
    assert isinstance(client, ssl.SSLSocket)
    assert trust.check_broker(client) == broker.identity
    client.close()
    ctrl = member(ca, Identity.controller(CLUSTER, 1))
    _server, client = handshake(ctrl.open_server_context(), trust.context())
    with pytest.raises(IdentityError, match="not a broker"):
        trust.check_broker(client)
    client.close()
    other = ca.member(Identity.broker("other", "broker-b", 2), "s")
    _server, client = handshake(other.open_server_context(), trust.context())
    with pytest.raises(IdentityError):
        trust.check_broker(client)
    client.close()
    # a broker certificate from another CA fails the chain check in the handshake itself
    foreign = member(CertificateAuthority.create(CLUSTER), Identity.broker(CLUSTER, "broker-b", 2))
    _server, client = handshake(foreign.open_server_context(), trust.context())
    assert isinstance(client, ssl.SSLError)


def test_credentials_never_print_their_key_or_secret(ca):
    # repr/str of what members hold name the identity only.
    creds = member(ca, Identity.broker(CLUSTER, "broker-a", 0))
    text = repr(creds) + str(creds) + repr(ca)
    assert "PRIVATE KEY" not in text and "members-secret" not in text and CLUSTER in text
    with pytest.raises(ValueError):
        ca.member(Identity.controller(CLUSTER, 0), "")
