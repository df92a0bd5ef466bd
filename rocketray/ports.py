"""Free TCP ports that an outgoing connection cannot take before their server binds them.

A port found free by ``bind(host, 0)`` and released lies in the kernel's ephemeral range, the range
``connect()`` draws local ports from: between the probe and the server's bind, any outgoing
connection on the machine (Ray's own, a broker's session, a replica's HA client) may take it, and
the server then fails with ``EADDRINUSE`` (a CI chaos run lost its HA proxy's port that way). Ports
chosen here lie below (or above) the ephemeral range, so only an explicit bind can take them, and
no port is handed out twice by one call.
"""

from __future__ import annotations

import random
import socket

_DEFAULT_EPHEMERAL = (32768, 60999)


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ``ip_local_port_range`` (inclusive); Linux's default when it cannot be read."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            low, high = (int(x) for x in fh.read().split())
        return low, high
    except (OSError, ValueError):
        return _DEFAULT_EPHEMERAL


def outside_ephemeral() -> range:
    """Candidate ports no outgoing connection takes as its local port."""
    low, high = ephemeral_range()
    return range(20000, low) if low > 21000 else range(max(high + 1, 1024), 65536)


def is_free(host: str, port: int) -> bool:
    """Nothing is bound to ``host:port`` now (nor to the wildcard address on that port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(count: int, host: str = "127.0.0.1", *, rng: random.Random | None = None,
               avoid: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """``count`` distinct ports outside the ephemeral range, free on ``host`` a moment ago.

    Raises ``OSError`` when so many free ports cannot be found.
    """
    pick = rng or random.SystemRandom()
    candidates = outside_ephemeral()
    chosen: list[int] = []
    for _ in range(200 * max(count, 1)):
        if len(chosen) == count:
            break
        port = pick.choice(candidates)
        if port in avoid or port in chosen or not is_free(host, port):
            continue
        chosen.append(port)
    if len(chosen) < count:
        raise OSError(f"could not find {count} free ports on {host} in {candidates.start}..{candidates.stop - 1}")
    return chosen


def free_port(host: str = "127.0.0.1") -> int:
    """One port outside the ephemeral range, free on ``host`` a moment ago."""
    return free_ports(1, host)[0]
