"""The credentials a cluster's members hold, made once by the operator's process that starts it.

``ClusterCredentials.create`` runs in ``rocketray start`` (or ``start_cluster``): it draws the
members' secret and, unless the configuration names the operator's own certificates
(``tls.ca``/``tls.cert``/``tls.key``), creates the cluster CA; the CA's key is written to
``<data_dir>/tls/ca.key`` (mode 0600, on the operator's machine) with its certificate beside it,
for issuing later. Each member is handed its :class:`~rocketray.tls.MemberCredentials` as an actor
argument (never through the cluster spec that drivers read, never on a command line);
:func:`member_credentials` resolves, on the member's own node, operator-provided certificate files.
Applications get only :class:`~rocketray.tls.ClientTrust` (the CA certificates).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field, replace
from pathlib import Path

from rocketray.identity import Identity
from rocketray.tls import CertificateAuthority, ClientTrust, MemberCredentials, TlsConfig

__all__ = ["ClusterCredentials", "member_credentials", "CA_KEY_FILE", "CA_CERT_FILE"]

CA_KEY_FILE = "ca.key"
CA_CERT_FILE = "ca.pem"


@dataclass(frozen=True)
class ClusterCredentials:
    """The members' secret and the cluster CA (None when the operator brings certificates)."""

    cluster: str
    secret: str = field(repr=False)
    ca: CertificateAuthority | None
    trusted_ca_pem: bytes = field(repr=False)

    @classmethod
    def create(cls, cluster: str, tls: TlsConfig, tls_dir: str | os.PathLike[str] | None = None) -> "ClusterCredentials":
        """New credentials for cluster ``cluster``; with ``tls_dir`` the CA is kept there."""
        secret = secrets.token_hex(32)
        if tls.operator_certificates:
            assert tls.ca is not None
            return cls(cluster, secret, None, Path(tls.ca).read_bytes())
        ca = CertificateAuthority.create(cluster)
        if tls_dir is not None:
            _keep_ca(Path(tls_dir), ca)
        return cls(cluster, secret, ca, ca.cert_pem)

    def member(self, identity: Identity, hosts: tuple[str, ...] = ()) -> MemberCredentials:
        """The credentials handed to member ``identity`` (certificate issued here; with operator
        certificates, the member loads its own files: :func:`member_credentials`)."""
        if self.ca is None:
            return MemberCredentials(identity, self.trusted_ca_pem, b"", b"", self.secret)
        return self.ca.member(identity, self.secret, hosts, self.trusted_ca_pem)

    @property
    def client_trust(self) -> ClientTrust:
        return ClientTrust(self.cluster, self.trusted_ca_pem)


def _keep_ca(tls_dir: Path, ca: CertificateAuthority) -> None:
    tls_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(tls_dir, 0o700)
    key_path = tls_dir / CA_KEY_FILE
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(ca.key_pem)
    (tls_dir / CA_CERT_FILE).write_bytes(ca.cert_pem)


def member_credentials(issued: MemberCredentials, tls: TlsConfig, member: str) -> MemberCredentials:
    """What a member uses, on its own node: the issued credentials, or, with operator
    certificates, the files ``tls.ca``, ``tls.cert`` and ``tls.key`` (``{member}`` expanded to the
    actor name) with the issued secret. Raises OSError naming a missing file."""
    if not tls.operator_certificates:
        return issued
    assert tls.ca is not None and tls.cert is not None and tls.key is not None
    return replace(issued, trusted_ca_pem=Path(tls.ca).read_bytes(),
                   cert_pem=Path(tls.cert.format(member=member)).read_bytes(),
                   key_pem=Path(tls.key.format(member=member)).read_bytes())
