"""Who may replicate with whom: the HA port's identity rules (pure, plus the port the broker fills).

A slave reads a master's whole log and its acks decide when a put is acknowledged, so the HA port
serves only a registered replica of its own group, under its own broker id: with TLS, the slave's
certificate names a broker of this group (``rocketray.identity``), and its handshake may claim only
the broker id that member registered with the controller (the registration's check code records
the member: ``rocketray.identity.check_code``; :meth:`HAPeers.slave_id_of` reads it from the
controller). A slave follows only a master whose certificate names a broker of its own group.
Without TLS (development mode) the members' secret proves membership only, and these checks are
skipped.
"""

from __future__ import annotations

from typing import Awaitable, Callable, Protocol

from rocketray.identity import Identity

__all__ = ["HAPeers", "RegisteredPeers", "master_problem", "handshake_problem"]


class HAPeers(Protocol):
    """What the HA service asks about an authenticated peer (the broker actor implements it)."""

    async def slave_id_of(self, identity: Identity) -> int | None:
        """The broker id member ``identity`` registered in this group, or None if it registered none."""
        ...


def master_problem(group: str, identity: Identity | None, dialed: str) -> str | None:
    """Why the master reached at ``dialed`` must not be followed, or None."""
    if identity is not None and (identity.role != "broker" or identity.group != group):
        return f"{dialed} is {identity}, not a broker of {group}"
    return None


def handshake_problem(expected_slave_id: int | None, claimed: int) -> str | None:
    """Why a slave handshake claiming broker id ``claimed`` is refused, or None. ``expected_slave_id``
    None: no identity to check (TLS off)."""
    if expected_slave_id is not None and claimed != expected_slave_id:
        return f"the peer is broker {expected_slave_id} and may not claim slave id {claimed}"
    return None


def registered_id(registered: dict[int, str | None], identity: Identity) -> int | None:
    """The newest broker id ``identity`` registered (a member whose store was wiped registers anew)."""
    ids = [bid for bid, member in registered.items() if member == identity.uri]
    return max(ids) if ids else None


class RegisteredPeers:
    """:class:`HAPeers` of group ``group`` from the controller's registrations
    (``registered(group) -> {broker_id: member URI or None}``, asked again when an identity is not
    known yet)."""

    def __init__(self, group: str, registered: Callable[[str], Awaitable[dict[int, str | None]]]) -> None:
        self.group = group
        self._registered = registered
        self._known: dict[int, str | None] = {}

    async def slave_id_of(self, identity: Identity) -> int | None:
        if identity.role != "broker" or identity.group != self.group:
            return None
        found = registered_id(self._known, identity)
        if found is None:
            self._known = dict(await self._registered(self.group))
            found = registered_id(self._known, identity)
        return found
