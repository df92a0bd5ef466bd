"""Who gets through the Raft port, and how much a connection may cost before it does (pure).

Theory of operation. The Raft port is a border only the cluster's controllers cross
(docs/security.md). With TLS (the default) a connection is admitted in two steps, and until then
it gets a bounded time and number of bytes (``PortLimits``) and nothing of it is decoded:

1. The TLS handshake: the peer's certificate chain must end at a CA the member trusts, and the
   identity in it (``rocketray.tls``) must name a controller of this cluster other than this node
   (``identity_problem``). A dialing node also checks that the node it reached is the controller it
   dialed, so a member certificate of another role or index cannot stand in for a controller.
2. pysyncobj's first message on a connection is the dialer's Raft address; it must be the address
   the cluster spec gives the certificate's controller index, and a peer of this node
   (``claim_problem``). pysyncobj's other first messages (``readonly`` nodes, utility commands such
   as ``add``/``remove``/``transfer``) are refused.

In development mode (TLS off) step 1 is pysyncobj's own: the members' secret as its ``password``
(Fernet: every frame authenticated, keys exchanged per connection), and step 2 checks the claim
against the peers alone.

Then the limits of every connection: ``max_frame_bytes`` per frame (``handshake_max_frame`` before
admission), ``max_connections`` on the listener and ``max_connections_per_address`` per peer host
(``ConnectionCounts``), ``max_unsent_bytes`` of output a peer that stops reading can make a node
hold; and ``LogThrottle`` so that a flood of refusals or of accept failures (EMFILE) writes one log
line per interval, with the number suppressed.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rocketray.controller.config import ControllerConfig
    from rocketray.tls import Identity

__all__ = ["ConnectionCounts", "LogThrottle", "PortLimits", "Refusal", "claim_problem", "identity_problem"]

HANDSHAKE_MAX_BYTES = 64 * 1024   # a TLS handshake with a certificate chain, then the address claim
HANDSHAKE_MAX_FRAME = 4096        # pysyncobj's first messages: an address, or a 32-byte key (dev mode)


class Refusal:
    """Why a connection was closed (the keys of the port's refusal counts)."""

    TLS = "tls"              # the TLS handshake failed (not TLS, no certificate, untrusted chain)
    IDENTITY = "identity"    # the certificate names no controller of this cluster, or not the one dialed
    CLAIM = "claim"          # the first message claims an address the peer does not own
    FRAME = "frame"          # a length over the bound, or a frame that does not decode
    MESSAGE = "message"      # an admitted peer's message of a shape pysyncobj never sends
    BUDGET = "budget"        # more bytes than the handshake needs before admission
    TIMEOUT = "timeout"      # not admitted within the handshake timeout
    LIMIT = "limit"          # over the listener's or the peer host's connection limit
    SLOW = "slow"            # a peer that stopped reading while output piled up


@dataclass(frozen=True, slots=True)
class PortLimits:
    max_frame_bytes: int
    handshake_timeout_s: float
    max_connections: int
    max_connections_per_address: int
    max_unsent_bytes: int
    handshake_max_bytes: int = HANDSHAKE_MAX_BYTES
    handshake_max_frame: int = HANDSHAKE_MAX_FRAME
    accept_pause_s: float = 0.1       # the listener rests this long after EMFILE and the like
    log_interval_s: float = 5.0       # one log line per interval per kind of refusal or accept failure

    @classmethod
    def from_config(cls, config: "ControllerConfig") -> "PortLimits":
        return cls(max_frame_bytes=config.raft_max_frame_bytes,
                   handshake_timeout_s=config.raft_handshake_timeout_ms / 1000,
                   max_connections=config.raft_max_connections,
                   max_connections_per_address=config.raft_max_connections_per_address,
                   max_unsent_bytes=16 * config.raft_max_frame_bytes)


def identity_problem(identity: "Identity", cluster: str, controllers: Mapping[int, str], self_index: int,
                     expected_index: int | None = None) -> str | None:
    """None if ``identity`` (from a verified certificate) may speak Raft with this node."""
    if identity.cluster != cluster:
        return f"{identity} is a member of another cluster than {cluster!r}"
    if identity.role != "controller":
        return f"{identity} is not a controller"
    if identity.index not in controllers:
        return f"{identity} names no controller of this cluster (controllers {sorted(controllers)})"
    if identity.index == self_index:
        return f"{identity} is this node's own identity"
    if expected_index is not None and identity.index != expected_index:
        return f"dialed controller {expected_index}, reached {identity}"
    return None


def claim_problem(identity: "Identity | None", claim: Any, controllers: Mapping[int, str],
                  peers: Container[str]) -> str | None:
    """None if the first message ``claim`` is an address this peer may announce: one of this node's
    peers and, with TLS, the address of the certificate's controller."""
    if type(claim) is not str:
        return f"the first message must be the peer's Raft address, not {type(claim).__name__}"
    if identity is not None and controllers.get(identity.index) != claim:
        return f"{identity} claims {claim!r:.80}, but its Raft address is {controllers.get(identity.index)!r}"
    if claim not in peers:
        return f"{claim!r:.80} is not a peer of this node"
    return None


class ConnectionCounts:
    """Open connections on a listener, in total and per peer host."""

    def __init__(self, max_total: int, max_per_address: int) -> None:
        self.max_total = max_total
        self.max_per_address = max_per_address
        self.total = 0
        self.by_host: dict[str, int] = {}

    def open(self, host: str) -> str | None:
        """Count a new connection from ``host``; a reason (and nothing counted) if over a limit."""
        if self.total >= self.max_total:
            return f"the listener holds {self.total} connections, its limit"
        if self.by_host.get(host, 0) >= self.max_per_address:
            return f"{host} holds {self.by_host[host]} connections, the limit per address"
        self.total += 1
        self.by_host[host] = self.by_host.get(host, 0) + 1
        return None

    def close(self, host: str) -> None:
        left = self.by_host.get(host, 0) - 1
        if left < 0:
            raise AssertionError(f"closing a connection from {host} that was never counted")
        self.total -= 1
        if left:
            self.by_host[host] = left
        else:
            del self.by_host[host]


class LogThrottle:
    """At most one log line per ``interval_s``; ``admit(now)`` returns how many were suppressed
    since the last one when a line may be written, None when it may not."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._next = float("-inf")
        self._suppressed = 0

    def admit(self, now: float) -> int | None:
        if now < self._next:
            self._suppressed += 1
            return None
        suppressed, self._suppressed = self._suppressed, 0
        self._next = now + self.interval_s
        return suppressed
