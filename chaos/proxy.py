"""A fault-injecting TCP proxy network on loopback, and the address plan that makes it fit pysyncobj.

Theory of operation. Every pair of Raft nodes talks through one proxy ``Link``: a listening socket
that forwards each accepted connection to the other node's real Raft port. The network holds a set of
*blocked directed pairs* ``(src, dst)``: bytes that ``src`` sends to ``dst`` are not delivered while
the pair is blocked. A blocked direction stalls like a firewall DROP rule: the proxy keeps reading
(so it still notices a peer closing), queues what it read (bounded; past the bound the connection is
reset), and delivers the queue in order once the direction is healed. A node that hears nothing
times out its connection (pysyncobj ``connectionTimeout``) and reconnects; the new connection is
subject to the same rules, so a one-way block lets the open direction through between reconnects,
and a two-way block lets nothing through. ``heal()`` unblocks everything.

Why one proxy per *pair* and not per directed link. pysyncobj's ``TCPTransport`` keeps exactly one
connection per pair of nodes: only the node whose own address string is greater dials (its
``_shouldConnect``: ``self.address > peer.address``), and the node that accepts identifies the caller
by the address string the caller announces as its first message (its own ``selfNode.address``),
dropping the connection if that string is not in its peer list. So for a pair (i dials j):

- i's peer entry for j is the proxy's listen address ``P(i, j)``, and it must compare below i's own
  address so that i is the one that dials;
- j's peer entry for i must be exactly i's own address (that is what i announces), and j's own
  address must compare below it so that j never dials.

``plan_topology`` satisfies both when every proxy address sorts below every node address and node
addresses ascend with the node index: then higher-index nodes dial lower-index ones, always through
a proxy. ``allocate_addresses`` guarantees that by putting the proxies on ``127.0.0.1`` and the nodes
on ``127.0.0.2`` (any port sorts below), with node ports outside the kernel's ephemeral range so
that a killed node's port cannot be taken by some outgoing connection before it restarts. Both directions of the pair's
traffic flow over the dialer's connection, so the proxy can still block each direction on its own.
A node's entry for a peer is thus either a proxy address or the peer's real address;
``Topology.node_of`` maps any of them back to a node index (used to read NOT_LEADER redirects).
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rocketray import ports
from rocketray.chaos.loop import ProxyLoop

log = logging.getLogger(__name__)

#: A blocked direction queues at most this many bytes per connection before the proxy resets it.
MAX_STALLED_BYTES = 8 * 1024 * 1024
READ_CHUNK_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class LinkPlan:
    """Node ``dialer`` reaches node ``acceptor`` by dialing ``listen`` (a proxy) which forwards
    to ``upstream`` (the acceptor's own address)."""

    dialer: int
    acceptor: int
    listen: str
    upstream: str


@dataclass(frozen=True, slots=True)
class Topology:
    self_addresses: tuple[str, ...]
    peer_addresses: tuple[tuple[str, ...], ...]  # node i's peer list, one entry per other node
    links: tuple[LinkPlan, ...]
    _owners: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for i, address in enumerate(self.self_addresses):
            self._owners[address] = i
        for link in self.links:
            self._owners[link.listen] = link.acceptor

    @property
    def size(self) -> int:
        return len(self.self_addresses)

    def node_of(self, address: str | None) -> int | None:
        """The node an address denotes (its own address, or a proxy in front of it)."""
        return self._owners.get(address) if address else None

    def link_between(self, a: int, b: int) -> LinkPlan:
        for link in self.links:
            if {link.dialer, link.acceptor} == {a, b}:
                return link
        raise KeyError((a, b))


def plan_topology(node_addresses: Sequence[str], proxy_addresses: Sequence[str]) -> Topology:
    """The peer lists and pair proxies for nodes ``0..n-1`` (see module doc).

    ``node_addresses`` must be strictly ascending as strings and every proxy address must compare
    below every node address; ``allocate_addresses`` returns addresses that are.
    """
    n = len(node_addresses)
    assert n >= 1 and len(proxy_addresses) == n * (n - 1) // 2, (n, len(proxy_addresses))
    assert all(a < b for a, b in zip(node_addresses, node_addresses[1:])), "node addresses must ascend"
    assert not proxy_addresses or max(proxy_addresses) < node_addresses[0], "proxies must sort below nodes"
    proxies = iter(proxy_addresses)
    links = [LinkPlan(i, j, next(proxies), node_addresses[j]) for i in range(n) for j in range(i)]
    by_pair = {(link.dialer, link.acceptor): link.listen for link in links}
    # i dials j (i > j) through the proxy; i accepts j (i < j) and knows j by j's own address.
    peers = tuple(tuple(by_pair.get((i, j), node_addresses[j]) for j in range(n) if j != i) for i in range(n))
    return Topology(tuple(node_addresses), peers, tuple(links))


def allocate_addresses(n: int, rng: random.Random, node_host: str = "127.0.0.2",
                       proxy_host: str = "127.0.0.1") -> tuple[list[str], dict[str, socket.socket]]:
    """Node addresses (free ports outside the ephemeral range, ascending) and bound proxy sockets.

    Proxies listen on ephemeral ports of ``proxy_host`` and stay bound for the whole run; nodes use
    ``node_host`` (which must sort above ``proxy_host``) so every proxy address sorts below every
    node address whatever the port numbers.
    """
    assert proxy_host < node_host
    # pysyncobj binds the wildcard address unless told otherwise: the ports must be free there
    nodes = sorted(f"{node_host}:{p}" for p in ports.free_ports(n, "0.0.0.0", rng=rng))
    sockets = {}
    for s in reserve_ports(n * (n - 1) // 2, proxy_host):
        sockets[f"{proxy_host}:{s.getsockname()[1]}"] = s
    return nodes, sockets


def reserve_ports(count: int, host: str = "127.0.0.1") -> list[socket.socket]:
    """Bind ``count`` listening-ready sockets on ephemeral ports (kept open: no one can take them)."""
    socks = []
    for _ in range(count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        socks.append(s)
    return socks


class _Connection:
    """One proxied connection: two directions, each a reader task and a writer task."""

    def __init__(self, link: LinkPlan) -> None:
        self.link = link
        self.tasks: list[asyncio.Task] = []
        self.writers: list[asyncio.StreamWriter] = []

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        for writer in self.writers:
            writer.transport.abort()


class ProxyNetwork(ProxyLoop):
    """The pair proxies of one topology, run on an asyncio loop in a daemon thread.

    ``block(pairs)`` / ``heal()`` are thread-safe and take effect before they return.
    """

    def __init__(self, topology: Topology) -> None:
        super().__init__("chaos-proxy")
        self.topology = topology
        self._open: dict[tuple[int, int], asyncio.Event] = {}
        self._blocked: frozenset[tuple[int, int]] = frozenset()
        self._connections: set[_Connection] = set()
        self.bytes_forwarded: dict[tuple[int, int], int] = {}
        self.connections_accepted = 0
        self.connections_reset = 0

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self, sockets: dict[str, socket.socket] | None = None) -> None:
        """Listen on every link's address (using a pre-bound socket from ``sockets`` if given)."""
        self._start_loop(self._start(sockets or {}))

    async def _start(self, sockets: dict[str, socket.socket]) -> None:
        n = self.topology.size
        for a in range(n):
            for b in range(n):
                if a != b:
                    self._open[(a, b)] = asyncio.Event()
                    self._open[(a, b)].set()
                    self.bytes_forwarded[(a, b)] = 0
        for link in self.topology.links:
            handler = lambda r, w, link=link: self._serve(link, r, w)  # noqa: E731
            host, port = link.listen.rsplit(":", 1)
            await self._listen(handler, sock=sockets.get(link.listen), host=host, port=int(port))

    def _abort_connections(self) -> None:
        for conn in list(self._connections):
            conn.close()

    # -- faults -----------------------------------------------------------------------------------

    @property
    def blocked(self) -> frozenset[tuple[int, int]]:
        return self._blocked

    def block(self, pairs: Iterable[tuple[int, int]], reset: bool = False) -> None:
        """Make exactly ``pairs`` (directed ``(src, dst)``) blocked; everything else flows.

        ``reset`` also aborts existing connections of every pair with a blocked direction, so the
        nodes notice at once instead of after their connection timeout.
        """
        wanted = frozenset(pairs)
        for src, dst in wanted:
            assert src != dst and 0 <= src < self.topology.size and 0 <= dst < self.topology.size, (src, dst)
        self._call(self._apply(wanted, reset))

    def heal(self) -> None:
        self.block(())

    async def _apply(self, wanted: frozenset[tuple[int, int]], reset: bool) -> None:
        self._blocked = wanted
        for pair, event in self._open.items():
            if pair in wanted:
                event.clear()
            else:
                event.set()
        if reset:
            for conn in list(self._connections):
                a, b = conn.link.dialer, conn.link.acceptor
                if (a, b) in wanted or (b, a) in wanted:
                    self.connections_reset += 1
                    conn.close()

    # -- forwarding -------------------------------------------------------------------------------

    async def _serve(self, link: LinkPlan, down_reader: asyncio.StreamReader,
                     down_writer: asyncio.StreamWriter) -> None:
        self.connections_accepted += 1
        conn = _Connection(link)
        conn.writers.append(down_writer)
        self._connections.add(conn)
        try:
            host, port = link.upstream.rsplit(":", 1)
            try:
                up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 5.0)
            except (OSError, asyncio.TimeoutError):
                return  # the acceptor is down: the dialer sees its connection close, as it would
            conn.writers.append(up_writer)
            conn.tasks = self._direction(down_reader, up_writer, link.dialer, link.acceptor) + \
                self._direction(up_reader, down_writer, link.acceptor, link.dialer)
            await asyncio.wait(conn.tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            conn.close()
            self._connections.discard(conn)

    def _direction(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   src: int, dst: int) -> list[asyncio.Task]:
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        stalled = [0]

        async def read() -> None:
            while True:
                data = await reader.read(READ_CHUNK_BYTES)
                if not data:
                    await queue.put(None)
                    return
                stalled[0] += len(data)
                if stalled[0] > MAX_STALLED_BYTES:
                    self.connections_reset += 1
                    return  # ends the connection
                await queue.put(data)

        async def write() -> None:
            open_event = self._open[(src, dst)]
            while True:
                data = await queue.get()
                if data is None:
                    return
                await open_event.wait()
                writer.write(data)
                await writer.drain()
                stalled[0] -= len(data)
                self.bytes_forwarded[(src, dst)] += len(data)

        loop = asyncio.get_running_loop()
        return [loop.create_task(_quiet(read())), loop.create_task(_quiet(write()))]


async def _quiet(coro) -> None:
    """A forwarding task ends on a closed or reset socket; that is normal, not an error."""
    try:
        await coro
    except (ConnectionError, OSError, asyncio.IncompleteReadError):
        pass
