"""What a listener lets an unauthenticated or misbehaving peer make it hold (STYLE.md 18).

Theory of operation. Every port is a border: before a peer has authenticated it gets a bounded time
(``preauth_timeout_ms``: the TLS handshake and the authentication exchange together) and the bytes
those exchanges allow; a listener admits at most ``max_connections`` connections, at most
``max_connections_per_ip`` from one address, counted from the moment of accept (a half-open TLS
handshake counts); after authentication a client connection may have at most
``max_inflight_requests`` requests being served and ``max_unsent_bytes`` of answers its peer has not
read: beyond a quarter of that the connection stops reading (so the peer's requests wait in its own
socket buffer), and a connection whose unsent answers do not drain for ``write_deadline_ms`` is
closed as a slow consumer (NATS's rule), with the reason logged. An accept that fails for want of
file descriptors is logged at most once per ``log_interval_ms`` per listener; the listener keeps
serving.

:class:`ConnectionLimiter` and :func:`flow_decision` are the pure rules; :class:`Border` is the
shell's per-listener state (counters, a rate-limited log) and :class:`RateLimitedLog` the log.
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass
from typing import Callable

from rocketray.schema import MIB, key

__all__ = ["LimitsConfig", "ConnectionLimiter", "Flow", "flow_decision", "Border", "RateLimitedLog",
           "install_accept_error_filter"]


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    """The ``limits`` section of ``rocketray.config``: what one peer can make a listener hold."""

    preauth_timeout_ms: int = key(5000, "TLS handshake plus authentication on any listener must finish within this")
    max_connections: int = key(4096, "connections one listener holds at once (client, session, HA ports)")
    max_connections_per_ip: int = key(1024, "connections one listener holds from one peer address")
    max_inflight_requests: int = key(1024, "client port: requests of one connection served at once; reading "
                                           "pauses beyond it")
    max_unsent_bytes: int = key(64 * MIB, "client port: answers a connection's peer has not read; reading "
                                          "pauses beyond a quarter of it, the connection closes beyond it")
    write_deadline_ms: int = key(10_000, "client port: a connection whose unsent answers do not drain for this "
                                         "long is closed (slow consumer)")
    log_interval_ms: int = key(10_000, "a listener's repeated refusal or accept failure is logged once per this")

    def __post_init__(self) -> None:
        assert self.preauth_timeout_ms > 0 and self.write_deadline_ms > 0 and self.log_interval_ms > 0
        assert 1 <= self.max_connections_per_ip <= self.max_connections
        assert self.max_inflight_requests >= 1 and self.max_unsent_bytes >= 4096


class ConnectionLimiter:
    """Counts a listener's connections, in all and per peer address (pure)."""

    __slots__ = ("max_total", "max_per_ip", "total", "_per_ip")

    def __init__(self, max_total: int, max_per_ip: int) -> None:
        assert 1 <= max_per_ip <= max_total
        self.max_total, self.max_per_ip = max_total, max_per_ip
        self.total = 0
        self._per_ip: dict[str, int] = {}

    def admit(self, ip: str) -> str | None:
        """Count a new connection from ``ip``; None if admitted, else why it is refused (nothing counted)."""
        if self.total >= self.max_total:
            return f"listener full ({self.max_total} connections)"
        held = self._per_ip.get(ip, 0)
        if held >= self.max_per_ip:
            return f"{ip} holds {held} connections (limit {self.max_per_ip})"
        self.total += 1
        self._per_ip[ip] = held + 1
        return None

    def release(self, ip: str) -> None:
        held = self._per_ip[ip]
        assert held > 0 and self.total > 0
        self.total -= 1
        if held == 1:
            del self._per_ip[ip]
        else:
            self._per_ip[ip] = held - 1

    def held_by(self, ip: str) -> int:
        return self._per_ip.get(ip, 0)


class Flow(enum.Enum):
    READ = "read"            # keep reading requests
    PAUSE = "pause"          # stop reading until answers drain or requests finish
    CLOSE = "close"          # a slow consumer: close the connection


def flow_decision(unsent_bytes: int, inflight: int, stalled_ms: float, limits: LimitsConfig) -> Flow:
    """Whether a client connection may read more requests. ``stalled_ms``: how long its unsent
    answers have gone without draining below the pause threshold (0 when they did)."""
    if unsent_bytes > limits.max_unsent_bytes or (unsent_bytes > limits.max_unsent_bytes // 4
                                                  and stalled_ms >= limits.write_deadline_ms):
        return Flow.CLOSE
    if unsent_bytes > limits.max_unsent_bytes // 4 or inflight >= limits.max_inflight_requests:
        return Flow.PAUSE
    return Flow.READ


class RateLimitedLog:
    """Logs a message of a given key at most once per ``interval_ms``, counting what it held back."""

    def __init__(self, logger: logging.Logger, interval_ms: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log, self._interval_s, self._clock = logger, interval_ms / 1000, clock
        self._next: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def log(self, level: int, key: str, msg: str, *args: object) -> bool:
        now = self._clock()
        if now < self._next.get(key, 0.0):
            self._held[key] = self._held.get(key, 0) + 1
            return False
        held = self._held.pop(key, 0)
        self._next[key] = now + self._interval_s
        if held:
            msg += " (%d more like it since the last report)"
            args = (*args, held)
        self._log.log(level, msg, *args)
        return True


class Border:
    """One listener's border state: its connection counts, refusals and its rate-limited log."""

    def __init__(self, name: str, limits: LimitsConfig, logger: logging.Logger, *,
                 max_connections: int | None = None) -> None:
        self.name = name
        self.limits = limits
        total = max_connections or limits.max_connections
        self.limiter = ConnectionLimiter(total, min(limits.max_connections_per_ip, total))
        self.log = RateLimitedLog(logger, limits.log_interval_ms)
        self.refused = 0              # over a connection limit
        self.handshake_failures = 0   # TLS handshakes that failed or timed out

    def admit(self, peer: object) -> str | None:
        """Count a connection from ``peer`` (a peername tuple); the peer's address, or None when it
        is refused (then logged, rate-limited, and the caller closes it at once)."""
        ip = peer[0] if isinstance(peer, tuple) and peer else str(peer)
        why = self.limiter.admit(ip)
        if why is None:
            return ip
        self.refused += 1
        self.log.log(logging.WARNING, "refused", "%s: refusing a connection: %s", self.name, why)
        return None

    def release(self, ip: str) -> None:
        self.limiter.release(ip)


_ACCEPT_FAILURE = "socket.accept() out of system resource"


def install_accept_error_filter(loop, interval_ms: int, logger: logging.Logger) -> None:
    """Route asyncio's accept failures (EMFILE and kin: asyncio retries the accept a second later)
    to a rate-limited warning without a traceback; every other loop error to the previous handler."""
    previous = loop.get_exception_handler()
    limited = RateLimitedLog(logger, interval_ms)

    def handler(loop_, context: dict) -> None:
        if context.get("message") == _ACCEPT_FAILURE:
            sock = context.get("socket")
            limited.log(logging.WARNING, f"accept:{sock}", "listener %s: accept failed: %r (retrying; "
                        "raise the file-descriptor limit or lower limits.max_connections)", sock,
                        context.get("exception"))
            return
        if previous is not None:
            previous(loop_, context)
        else:
            loop_.default_exception_handler(context)

    loop.set_exception_handler(handler)
