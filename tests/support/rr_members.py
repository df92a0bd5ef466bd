"""Member credentials for tests: one test CA, credentials and links for any member identity.

On pytest's ``pythonpath`` (see pyproject.toml): ``from rr_members import links, member``.
"""

from __future__ import annotations

import functools

from rocketray.identity import Identity
from rocketray.links import MemberLinks
from rocketray.tls import CertificateAuthority, MemberCredentials

CLUSTER = "test"
SECRET = "test-members-secret"


def ca_for(cluster: str = CLUSTER) -> CertificateAuthority:
    """The one test CA of ``cluster`` in this process."""
    return _ca(cluster)


@functools.cache
def _ca(cluster: str) -> CertificateAuthority:
    return CertificateAuthority.create(cluster)


def broker(replica: int, group: str = "broker-a", cluster: str = CLUSTER) -> Identity:
    return Identity.broker(cluster, group, replica)


def controller(index: int, cluster: str = CLUSTER) -> Identity:
    return Identity.controller(cluster, index)


@functools.cache
def member(identity: Identity, secret: str = SECRET) -> MemberCredentials:
    """Credentials of ``identity`` issued by the test CA of its cluster (for 127.0.0.1)."""
    return ca_for(identity.cluster).member(identity, secret, hosts=("127.0.0.1",))


def links(identity: Identity | None = None, *, tls: bool = True, secret: str = SECRET,
          preauth_timeout_ms: int = 5000) -> MemberLinks:
    """How a test member connects: TLS with the test CA (or plain, ``tls=False``) and the secret."""
    return MemberLinks(member(identity or broker(0), secret), tls=tls, preauth_timeout_ms=preauth_timeout_ms)
