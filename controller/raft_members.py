"""The controllers of a group and what a node needs to open its Raft port, checked before it binds.

A node is given the cluster spec's controllers (index -> Raft address), its own
``MemberCredentials`` (``rocketray.tls``: the trusted CA, its certificate and key, the members'
secret) and whether TLS is on. ``port_settings`` refuses, before anything binds, whatever would
open the port to strangers (``InsecureRaftBindError``, a ``ValueError``): missing or empty
credentials, on every address, loopback included; a certificate that is not this controller's;
a Raft address that is not a concrete host (a wildcard such as ``0.0.0.0`` would listen on
every interface of the host). With TLS off (development mode) the members' secret authenticates
every frame (pysyncobj's password), never an application's secret.

``dial`` maps an index to where this node reaches that controller when it is not its Raft address
(the chaos runner's fault proxies); a dialed controller is still identified by its certificate.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

from cryptography import x509

from rocketray.controller.raft_admission import PortLimits
from rocketray.controller.raft_port import RaftPortSettings
from rocketray.tls import URI_SCHEME, Identity, IdentityError, MemberCredentials

__all__ = ["InsecureRaftBindError", "port_settings"]

_WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]", "*"})


class InsecureRaftBindError(ValueError):
    """Refusing to open the controller's Raft port without what keeps strangers out."""


def _certificate_identity(cert_pem: bytes) -> Identity:
    cert = x509.load_pem_x509_certificate(cert_pem)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    uris = [u for u in names.get_values_for_type(x509.UniformResourceIdentifier) if u.startswith(URI_SCHEME)]
    if len(uris) != 1:
        raise IdentityError(f"the certificate names {len(uris)} rocketray identities, not one")
    return Identity.parse(uris[0])


def _check_address(address: Any, what: str) -> str:
    host, sep, port = str(address).rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise InsecureRaftBindError(f"{what} {address!r} is not host:port")
    if host in _WILDCARDS:
        raise InsecureRaftBindError(f"{what} {address!r} names every interface of the host; give the "
                                    "address this controller is reached at (the Raft port binds only it)")
    return str(address)


def _contexts(credentials: MemberCredentials) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    if not (credentials.trusted_ca_pem and credentials.cert_pem and credentials.key_pem):
        raise InsecureRaftBindError("TLS on the Raft port needs the trusted CA, this controller's certificate "
                                    "and its key; one of them is empty")
    try:
        cert_identity = _certificate_identity(credentials.cert_pem)
        contexts = credentials.server_context(), credentials.client_context()
    except (ValueError, ssl.SSLError, x509.ExtensionNotFound) as exc:
        raise InsecureRaftBindError(f"the member certificate cannot be used on the Raft port: {exc}") from None
    if cert_identity != credentials.identity:
        raise InsecureRaftBindError(f"the certificate is {cert_identity}'s, the credentials {credentials.identity}'s")
    return contexts


def port_settings(credentials: MemberCredentials | None, tls: bool, controllers: Mapping[int, str],
                  dial: Mapping[int, str] | None, limits: PortLimits) -> RaftPortSettings:
    """Everything the Raft port of controller ``credentials.identity`` needs (module docstring)."""
    if not isinstance(credentials, MemberCredentials):
        raise InsecureRaftBindError(
            "the controller's Raft port needs the members' credentials (rocketray.tls.MemberCredentials), "
            f"got {type(credentials).__name__}: without them any host that reaches the port could join the group")
    if not credentials.secret:
        raise InsecureRaftBindError("the members' secret is empty")
    identity = credentials.identity
    if identity.role != "controller":
        raise InsecureRaftBindError(f"{identity} is not a controller identity")
    if identity.index not in controllers:
        raise InsecureRaftBindError(f"{identity} is not among the cluster's controllers {sorted(controllers)}")
    for index, address in controllers.items():
        _check_address(address, f"controller {index}'s Raft address")
    dial = dict(dial or {})
    peer_index = {_check_address(dial.get(i, a), f"the address to reach controller {i}"): i
                  for i, a in controllers.items() if i != identity.index}
    server, client = _contexts(credentials) if tls else (None, None)
    return RaftPortSettings(cluster=identity.cluster, self_index=identity.index, controllers=dict(controllers),
                            peer_index=peer_index, bind_address=controllers[identity.index], limits=limits,
                            credentials=credentials, server_context=server, client_context=client)
