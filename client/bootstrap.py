"""How an application outside Ray reaches a cluster: brokers' addresses, the CA, its user credential.

    from rocketray.client import Bootstrap, Producer

    with Producer(Bootstrap.from_file("orders-app.rocketray.toml")) as p:
        p.send("orders", b"...")

The operator makes the file with ``rocketray admin user create NAME --client-config FILE`` (or
writes it by hand)::

    cluster = "demo"                              # the name its brokers' certificates carry
    servers = ["10.0.0.5:30912", "10.0.0.6:30913"]  # any brokers' client ports: the rest is discovered
    user = "orders-app"
    secret_file = "orders-app.secret"             # or: secret = "..." (the file is then mode 0600)
    ca_file = "ca.pem"                            # or: ca = "-----BEGIN CERTIFICATE-----..."
    # tls = false                                 # development clusters started with tls.enabled=false

Relative paths are read from the file's directory. The secret appears in no ``repr``.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from rocketray.client.errors import InvalidRequest
from rocketray.tls import ClientTrust

__all__ = ["Bootstrap"]


@dataclass(frozen=True)
class Bootstrap:
    """What a client outside Ray needs (module docstring). ``ca_pem`` None: TLS off (development)."""

    cluster: str
    servers: tuple[str, ...]
    user: str
    secret: str = field(repr=False)
    ca_pem: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.servers:
            raise InvalidRequest("a Bootstrap needs at least one broker address (host:port)")
        for server in self.servers:
            host, _, port = server.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise InvalidRequest(f"broker address {server!r} is not host:port")
        if not self.user or not self.secret:
            raise InvalidRequest("a Bootstrap needs a user name and its secret")

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [(s.rpartition(":")[0], int(s.rpartition(":")[2])) for s in self.servers]

    @property
    def trust(self) -> ClientTrust | None:
        return None if self.ca_pem is None else ClientTrust(self.cluster, self.ca_pem)

    @classmethod
    def from_file(cls, path: str | Path) -> "Bootstrap":
        """Read a client configuration file (module docstring); InvalidRequest names what is wrong."""
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise InvalidRequest(f"{path}: {exc}") from None
        known = {"cluster", "servers", "user", "secret", "secret_file", "ca", "ca_file", "tls"}
        if unknown := set(data) - known:
            raise InvalidRequest(f"{path}: unknown keys {sorted(unknown)}; known: {sorted(known)}")

        def text(key: str, file_key: str) -> str | None:
            if key in data and file_key in data:
                raise InvalidRequest(f"{path}: give {key} or {file_key}, not both")
            if file_key in data:
                try:
                    return (path.parent / str(data[file_key])).read_text().strip()
                except OSError as exc:
                    raise InvalidRequest(f"{path}: {file_key}: {exc}") from None
            return None if key not in data else str(data[key])

        secret, ca = text("secret", "secret_file"), text("ca", "ca_file")
        tls = data.get("tls", True)
        if tls is not True and tls is not False:
            raise InvalidRequest(f"{path}: tls must be true or false")
        if tls and ca is None:
            raise InvalidRequest(f"{path}: ca or ca_file (the cluster's CA certificate) is needed with TLS")
        servers = data.get("servers")
        if not isinstance(servers, list) or not all(isinstance(s, str) for s in servers):
            raise InvalidRequest(f"{path}: servers must be a list of \"host:port\" strings")
        return cls(str(data.get("cluster", "")), tuple(servers), str(data.get("user", "")), secret or "",
                   ca.encode() if tls and ca is not None else None)

    def to_toml(self) -> str:
        """The client configuration file for this bootstrap (secret and CA inline)."""
        lines = [f"cluster = {self.cluster!r}".replace("'", '"'),
                 "servers = [" + ", ".join(f'"{s}"' for s in self.servers) + "]",
                 f'user = "{self.user}"', f'secret = "{self.secret}"']
        if self.ca_pem is None:
            lines.append("tls = false")
        else:
            lines.append('ca = """\n' + self.ca_pem.decode("ascii").strip() + '\n"""')
        return "\n".join(lines) + "\n"
