"""The shape of a rocketray cluster: which controllers and brokers exist, where they listen.

A :class:`ClusterSpec` is decided once when a cluster starts (ports chosen, nodes
assigned) and then handed unchanged to every actor, so that an actor restarted by
Ray comes back on the same Raft / HA port with the same store directory. It is
plain, public data: it travels through Ray and into the registry actor that every
driver reads. It holds no credential (members get theirs apart:
``rocketray.credentials``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rocketray.identity import Identity


@dataclass(frozen=True, slots=True)
class ControllerSpec:
    index: int
    host: str
    raft_port: int
    store_dir: str
    node_id: str | None = None  # Ray node the actor is pinned to (None: anywhere, single node)
    #: Custom Ray resource only one node offers (``rocketray_node_<label>``): the actor is pinned to
    #: whichever node carries it, so it restarts there when that node comes back (a new node id).
    node_resource: str | None = None
    #: Port of the broker-session listener (``rocketray.controller.session``): brokers hold a
    #: connection here so the controller notices a dead broker when the kernel closes it. None: no
    #: listener (brokers then rely on heartbeat expiry alone).
    session_port: int | None = None

    @property
    def raft_address(self) -> str:
        return f"{self.host}:{self.raft_port}"


@dataclass(frozen=True, slots=True)
class BrokerSpec:
    group: str
    replica: int  # 0-based position in its group; the controller assigns the broker id
    host: str
    ha_port: int
    store_dir: str
    node_id: str | None = None
    #: Port the HA server binds when it differs from the advertised ``ha_port`` (a chaos proxy
    #: listens on ``ha_port`` and forwards here); None: bind ``ha_port`` itself.
    listen_port: int | None = None
    #: See ``ControllerSpec.node_resource``.
    node_resource: str | None = None
    #: Port the broker serves clients on (``actors/client_port.py``); None: clients use Ray calls.
    client_port: int | None = None

    @property
    def client_address(self) -> tuple[str, int] | None:
        return None if self.client_port is None else (self.host, self.client_port)

    @property
    def ha_address(self) -> str:
        return f"{self.host}:{self.ha_port}"

    @property
    def bind_port(self) -> int:
        """The port the broker's HA server listens on."""
        return self.ha_port if self.listen_port is None else self.listen_port


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    cluster_name: str
    data_dir: str
    profile: str
    controllers: tuple[ControllerSpec, ...]
    brokers: tuple[BrokerSpec, ...]
    config_overrides: tuple[tuple[str, str], ...] = ()

    @property
    def namespace(self) -> str:
        return f"rocketray-{self.name}"

    @property
    def groups(self) -> list[str]:
        seen: list[str] = []
        for b in self.brokers:
            if b.group not in seen:
                seen.append(b.group)
        return seen

    def controller_actor_name(self, index: int) -> str:
        return f"controller-{index}"

    def broker_actor_name(self, group: str, replica: int) -> str:
        return f"{group}-{replica}"  # groups are named broker-a, broker-b, ...: actors broker-a-0, ...

    def brokers_of(self, group: str) -> list[BrokerSpec]:
        return [b for b in self.brokers if b.group == group]

    def controller_by_address(self, raft_address: str) -> ControllerSpec | None:
        for c in self.controllers:
            if c.raft_address == raft_address:
                return c
        return None

    def broker_by_ha_address(self, ha_address: str) -> BrokerSpec | None:
        for b in self.brokers:
            if b.ha_address == ha_address:
                return b
        return None

    # --- member identities (``rocketray.identity``) ----------------------------------------------
    def controller_identity(self, raft_address: str) -> Identity | None:
        c = self.controller_by_address(raft_address)
        return None if c is None else Identity.controller(self.name, c.index)

    def broker_identity(self, group: str, replica: int) -> Identity:
        return Identity.broker(self.name, group, replica)

    def member_address(self, identity: Identity) -> str | None:
        """Where member ``identity`` listens for members: a controller's Raft address, a broker's
        advertised HA address; None if it is no member of this cluster."""
        if identity.cluster != self.name:
            return None
        if identity.role == "controller":
            c = next((c for c in self.controllers if c.index == identity.index), None)
            return None if c is None else c.raft_address
        b = next((b for b in self.brokers if b.group == identity.group and b.replica == identity.index), None)
        return None if b is None else b.ha_address

    def member_hosts(self, identity: Identity) -> tuple[str, ...]:
        """The hosts member ``identity`` is reached at (its certificate names them too)."""
        address = self.member_address(identity)
        return () if address is None else (address.rsplit(":", 1)[0],)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ClusterSpec":
        d = dict(d)
        d["controllers"] = tuple(ControllerSpec(**c) for c in d["controllers"])
        d["brokers"] = tuple(BrokerSpec(**b) for b in d["brokers"])
        d["config_overrides"] = tuple(tuple(kv) for kv in d.get("config_overrides", ()))
        return cls(**d)
