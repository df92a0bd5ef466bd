"""The cluster's certificates and TLS contexts: who a member is, and how every listener speaks TLS.

Theory of operation. A cluster has one certificate authority (an EC P-256 key and a self-signed
certificate). Every member (controller or broker actor) holds a certificate of its own, issued by
that CA, whose subject alternative name carries its identity as a URI::

    rocketray://<cluster>/controller/<index>
    rocketray://<cluster>/broker/<group>/<replica>

Members speak mutual TLS to each other (Raft, broker sessions, HA replication): each side checks
that the peer's chain ends at a CA it trusts and reads the peer's :class:`Identity` from its
certificate; the listener then checks that the identity may say what the peer says (a broker's
session names its own group, a slave's handshake its own broker id). Applications hold no
certificate: their client verifies that the broker it reached is a member of the cluster it expects
(the CA and a broker identity of that cluster), then authenticates as a user inside the TLS channel.
Host names are not checked: members and brokers are named by their identity URI, which the CA
vouches for, not by the address a client happened to dial (a node's address may change when Ray
moves an actor).

:class:`MemberCredentials` is what a member holds (trust anchors, its certificate and key, and the
members' shared secret that authenticates member links when TLS is off for development). It never
leaves the members: it is not in the cluster spec that drivers read, its ``repr`` names only the
identity, and its key reaches OpenSSL through a private temporary file removed at once (Python's
``ssl`` loads keys only from files). :class:`ClientTrust` is what an application needs (public: the
CA certificates and the cluster name).

``trusted_ca_pem`` may hold several CA certificates: rotation adds the new CA to every member's
trust first, then switches member certificates, then removes the old CA (docs/security.md).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
import ssl
import tempfile
from dataclasses import dataclass, field
from typing import Iterable

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from rocketray.identity import URI_SCHEME, Identity, IdentityError
from rocketray.schema import key as config_key

__all__ = ["Identity", "IdentityError", "CertificateAuthority", "MemberCredentials", "ClientTrust",
           "TlsConfig", "peer_identity", "TLS_MIN_VERSION"]

TLS_MIN_VERSION = ssl.TLSVersion.TLSv1_3
CERT_DAYS = 825
CA_DAYS = 3650


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """The ``tls`` section of ``rocketray.config``."""

    enabled: bool = config_key(True, "every listener speaks TLS (client, session, HA, Raft); false is a development "
                              "mode that sends data in plain text and warns at start")
    ca: str | None = config_key(None, "the operator's trust bundle (PEM file on every node); none: the cluster CA "
                               "rocketray start makes")
    cert: str | None = config_key(None, "the member's certificate (PEM; {member} expands to the actor name, e.g. "
                                 "broker-a-0); needs tls.ca and tls.key")
    key: str | None = config_key(None, "the member's private key (PEM file, {member} expanded)")

    def __post_init__(self) -> None:
        given = [v is not None for v in (self.ca, self.cert, self.key)]
        if any(given) and not all(given):
            raise ValueError("tls.ca, tls.cert and tls.key are given together or not at all")

    @property
    def operator_certificates(self) -> bool:
        return self.cert is not None


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _san_hosts(hosts: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


@dataclass(frozen=True)
class CertificateAuthority:
    """A cluster CA: issues member certificates. ``key_pem`` is the operator's to keep."""

    cert_pem: bytes
    key_pem: bytes = field(repr=False)

    @classmethod
    def create(cls, cluster: str, days: int = CA_DAYS) -> "CertificateAuthority":
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"rocketray CA {cluster} {secrets.token_hex(4)}")])
        now = _now()
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False, data_encipherment=False,
                                             key_agreement=False, encipher_only=False, decipher_only=False),
                               critical=True)
                .sign(key, hashes.SHA256()))
        return cls(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    def issue(self, identity: Identity, hosts: Iterable[str] = (), days: int = CERT_DAYS) -> tuple[bytes, bytes]:
        """A certificate and key for ``identity`` (PEM), usable as TLS server and client."""
        ca_cert = x509.load_pem_x509_certificate(self.cert_pem)
        ca_key = serialization.load_pem_private_key(self.key_pem, password=None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity.uri[len(URI_SCHEME):])]))
                .issuer_name(ca_cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
                .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(identity.uri),
                                                            *_san_hosts(hosts)]), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                               critical=False)
                .sign(ca_key, hashes.SHA256()))
        return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)

    def member(self, identity: Identity, secret: str, hosts: Iterable[str] = (),
               trusted_ca_pem: bytes | None = None) -> "MemberCredentials":
        cert, key = self.issue(identity, hosts)
        return MemberCredentials(identity, trusted_ca_pem or self.cert_pem, cert, key, secret)


def _load_chain(context: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """``load_cert_chain`` from memory: through a private file that exists only during the call."""
    fd, path = tempfile.mkstemp(prefix="rocketray-key-", suffix=".pem",
                                dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(cert_pem + b"\n" + key_pem)
        context.load_cert_chain(path)
    finally:
        os.unlink(path)


def _base_context(purpose: ssl.Purpose, trusted_ca_pem: bytes) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if purpose is ssl.Purpose.CLIENT_AUTH else ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = TLS_MIN_VERSION
    context.check_hostname = False      # members and brokers are named by identity URI (module docstring)
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cadata=trusted_ca_pem.decode("ascii"))
    return context


@dataclass(frozen=True)
class MemberCredentials:
    """What a member holds (module docstring). Never printed: ``repr`` names the identity only."""

    identity: Identity
    trusted_ca_pem: bytes = field(repr=False)
    cert_pem: bytes = field(repr=False)
    key_pem: bytes = field(repr=False)
    secret: str = field(repr=False)

    def __post_init__(self) -> None:
        if not self.secret:
            raise ValueError("member credentials need the members' secret (non-empty)")

    def to_json(self) -> dict[str, str]:
        """Plain data for a member process started by hand (its stdin, never its argv)."""
        return {"identity": self.identity.uri, "trusted_ca_pem": self.trusted_ca_pem.decode("ascii"),
                "cert_pem": self.cert_pem.decode("ascii"), "key_pem": self.key_pem.decode("ascii"),
                "secret": self.secret}

    @classmethod
    def from_json(cls, d: dict[str, str]) -> "MemberCredentials":
        return cls(Identity.parse(d["identity"]), d["trusted_ca_pem"].encode("ascii"), d["cert_pem"].encode("ascii"),
                   d["key_pem"].encode("ascii"), d["secret"])

    def server_context(self) -> ssl.SSLContext:
        """A listener's context: presents this member's certificate, requires a client certificate
        of a trusted CA (members only)."""
        context = _base_context(ssl.Purpose.CLIENT_AUTH, self.trusted_ca_pem)
        _load_chain(context, self.cert_pem, self.key_pem)
        return context

    def open_server_context(self) -> ssl.SSLContext:
        """A listener that applications reach (the client port): presents this member's
        certificate, asks for none (users authenticate inside the channel)."""
        context = _base_context(ssl.Purpose.CLIENT_AUTH, self.trusted_ca_pem)
        context.verify_mode = ssl.CERT_NONE
        _load_chain(context, self.cert_pem, self.key_pem)
        return context

    def client_context(self) -> ssl.SSLContext:
        """Connecting to another member: presents this certificate, verifies the peer's chain."""
        context = _base_context(ssl.Purpose.SERVER_AUTH, self.trusted_ca_pem)
        _load_chain(context, self.cert_pem, self.key_pem)
        return context

    def peer_member(self, ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> Identity:
        """The identity of the member on the other end; raises IdentityError if it names none of
        this cluster's members."""
        ident = peer_identity(ssl_object)
        if ident.cluster != self.identity.cluster:
            raise IdentityError(f"peer {ident} is a member of another cluster than {self.identity.cluster!r}")
        return ident


@dataclass(frozen=True)
class ClientTrust:
    """What an application needs to know a broker is a member of ``cluster`` (public)."""

    cluster: str
    trusted_ca_pem: bytes = field(repr=False)

    def context(self) -> ssl.SSLContext:
        return _base_context(ssl.Purpose.SERVER_AUTH, self.trusted_ca_pem)

    def check_broker(self, ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> Identity:
        """The broker identity of the server reached; raises IdentityError when it is not one of
        this cluster's brokers (a controller certificate, another cluster's broker)."""
        ident = peer_identity(ssl_object)
        if ident.cluster != self.cluster or ident.role != "broker":
            raise IdentityError(f"the server is {ident}, not a broker of cluster {self.cluster!r}")
        return ident


def peer_identity(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> Identity:
    """The :class:`Identity` in the URI SAN of the peer's (already verified) certificate."""
    if ssl_object is None:
        raise IdentityError("the connection is not TLS")
    cert = ssl_object.getpeercert()
    if not cert:
        raise IdentityError("the peer presented no certificate")
    uris = [value for kind, value in cert.get("subjectAltName", ()) if kind == "URI" and value.startswith(URI_SCHEME)]
    if len(uris) != 1:
        raise IdentityError(f"the peer's certificate names {len(uris)} rocketray identities, not one")
    return Identity.parse(uris[0])
