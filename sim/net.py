"""The simulated network: TCP-like connections and request/response calls, with faults.

Theory of operation. Nodes are named by strings. A *connection* delivers bytes in order, once,
with a delay drawn per message (mostly a few ms, sometimes hundreds: a long tail, so a late ack can
arrive after the master changed). A connection breaks when either end crashes, when a message meets
a cut link (the sender sees a reset a little later, as a TCP timeout would), or when a fault resets
it; both ends learn of it through their close handler, unless they crashed meanwhile. A *call* is
one request and one answer (the controller's RPCs): either may be lost, and the caller then sees
``None`` at its timeout, which means "outcome unknown" (the request may have been applied).
Links are cut one way at a time, so partitions can be symmetric, one-way or isolate one node.

A crashed node's connections break, but what it already wrote to a socket is not lost with it
(``Network.in_flight``): after a kill the kernel still sends the socket buffer and then the FIN, so
every send arrives before the peer hears of the close; after a power loss only what was already on
the wire arrives, a prefix of the sends in flight chosen by the seed. So a rule of the form "send
only after the durable step" is exercised: an ack sent before the write it acknowledges reaches
the master even though the process that sent it died before writing. What was sent *to* the
crashed node is lost.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from rocketray.sim.world import QUIET, World

__all__ = ["Network", "Connection"]

DataHandler = Callable[["Connection", bytes], None]
CloseHandler = Callable[["Connection"], None]


class Connection:
    """One TCP-like connection from ``client`` to ``server``."""

    def __init__(self, net: "Network", client: str, server: str) -> None:
        net.connection_ids += 1
        self.id = net.connection_ids
        self.net = net
        self.ends = (client, server)
        self.alive = True
        self._last_at = {client: 0, server: 0}
        self._in_flight = {client: 0, server: 0}     # bytes sent and not yet delivered, per sender
        self._sends: dict[str, list[int]] = {client: [], server: []}   # per sender: sequence numbers not yet delivered
        self._sent = 0
        self._drain: set[int] = set()                # sends of a crashed end that still arrive
        self._drain_until = 0                        # the last of them arrives by then
        self._handlers: dict[str, tuple[DataHandler, CloseHandler, object]] = {}

    def bind(self, node: str, on_data: DataHandler, on_close: CloseHandler, owner: object) -> None:
        self._handlers[node] = (on_data, on_close, owner)

    def peer(self, node: str) -> str:
        return self.ends[1] if node == self.ends[0] else self.ends[0]

    def writable(self, src: str) -> bool:
        """Room in ``src``'s send buffer: what it sent and the peer has not received yet is below
        the network's window (a full socket buffer makes a sender wait, as TCP does)."""
        return self._in_flight[src] < self.net.window_bytes

    def send(self, src: str, data: bytes) -> None:
        if not self.alive or not data:
            return
        dst = self.peer(src)
        world = self.net.world
        if not self.net.reachable(src, dst):
            world.at(self.net.reset_delay_ms(), lambda: self.reset("link cut"), what="",
                     scope=self._handlers.get(src, (None, None, None))[2])
            return
        at = max(world.now_ms + self.net.delay_ms(), self._last_at[src])
        rate = self.net.rate(src, dst)
        if rate is not None:
            at += -(-len(data) // rate)            # a slow link: bytes leave at its rate, in order
        self._last_at[src] = at
        self._in_flight[src] += len(data)
        self._sent += 1
        seq = self._sent
        self._sends[src].append(seq)

        def deliver() -> None:
            self._in_flight[src] -= len(data)
            self._sends[src].remove(seq)
            if not self.alive and seq not in self._drain:
                return
            handler = self._handlers.get(dst)
            if handler is None:
                return
            on_data, _close, owner = handler
            if owner is not None and self.net.down(dst):
                return
            on_data(self, data)

        owner = self._handlers.get(dst, (None, None, None))[2]
        world.at(at - world.now_ms, deliver, owner=owner)

    def reset(self, reason: str) -> None:
        """Break the connection; each live end hears of it after a network delay."""
        if not self.alive:
            return
        self.alive = False
        self.net.world.note(f"conn {self.id} {self.ends[0]}->{self.ends[1]} reset: {reason}")
        for _node, (_data, on_close, owner) in list(self._handlers.items()):
            delay = self.net.delay_ms()
            if _node != self._crashed:      # the peer of a crashed end: the close follows its data
                delay = max(delay, self._drain_until - self.net.world.now_ms + 1)
            self.net.world.at(delay, functools.partial(on_close, self), owner=owner)

    _crashed: str | None = None

    def crashed(self, node: str, power_loss: bool) -> None:
        """``node`` crashed: what it sent arrives (after a kill all of it, after a power loss the
        prefix already on the wire, drawn by the seed), then the connection breaks."""
        pending = self._sends[node]
        if pending and self.alive:
            keep = len(pending) if not power_loss else self.net.world.rng.randint(0, len(pending))
            self._drain = set(pending[:keep])
            if keep:
                self._drain_until = self._last_at[node]
                self.net.world.note(f"conn {self.id}: {keep} of {len(pending)} sends of {node} still in flight")
        self._crashed = node
        self.reset(f"{node} crashed")


SIGNAL_DELAY_MS = 1


class Network:
    """Links, partitions, delays and loss, all drawn from the world's seeded random source."""

    def __init__(self, world: World, *, loss: float = 0.0, tail: float = 0.02,
                 window_bytes: int = 64 * 1024, in_flight: bool = True) -> None:
        self.world = world
        #: a crashed node's sends still arrive (see the module docstring); False: they are dropped
        self.in_flight = in_flight
        #: how a node went down, asked when it does: True for a power loss (set by the world)
        self.power_lost: Callable[[str], bool] = lambda node: False
        self.loss = loss
        self.tail = tail
        self.window_bytes = window_bytes
        self._cut: set[tuple[str, str]] = set()
        self._slow: dict[tuple[str, str], int] = {}   # (src, dst) -> bytes per ms
        self._down: set[str] = set()
        self.connections: list[Connection] = []
        self.connection_ids = 0

    # -- faults -----------------------------------------------------------------------------------
    def delay_ms(self) -> int:
        rng = self.world.rng
        if rng.random() < self.tail:
            return rng.randint(50, 400)
        return rng.randint(1, 6)

    def reset_delay_ms(self) -> int:
        return self.world.rng.randint(20, 200)

    def cut(self, src: str, dst: str) -> None:
        self._cut.add((src, dst))

    def heal(self) -> None:
        self._cut.clear()
        self._slow.clear()

    def slow(self, src: str, dst: str, bytes_per_ms: int) -> None:
        """Congest one direction of one link: its bytes leave at ``bytes_per_ms``."""
        self._slow[(src, dst)] = max(1, bytes_per_ms)

    def rate(self, src: str, dst: str) -> int | None:
        return self._slow.get((src, dst))

    def mend(self, src: str, dst: str) -> None:
        """Restore one direction of one link."""
        self._cut.discard((src, dst))

    def cuts(self) -> set[tuple[str, str]]:
        return set(self._cut)

    def set_down(self, node: str, down: bool) -> None:
        """A crashed node: its connections break; nothing reaches it until it is up again."""
        if down:
            self._down.add(node)
            power_loss = self.in_flight and self.power_lost(node)
            for conn in self.connections:
                if conn.alive and node in conn.ends:
                    if self.in_flight:
                        conn.crashed(node, power_loss)
                    else:
                        conn.reset(f"{node} crashed")
            self.connections = [c for c in self.connections if c.alive]
        else:
            self._down.discard(node)

    def down(self, node: str) -> bool:
        return node in self._down

    def reachable(self, src: str, dst: str) -> bool:
        return src not in self._down and dst not in self._down and (src, dst) not in self._cut

    # -- connections --------------------------------------------------------------------------------
    def connect(self, client: str, server: str) -> Connection | None:
        """A new connection, or None (refused: the server is down or the link is cut)."""
        if not (self.reachable(client, server) and self.reachable(server, client)):
            return None
        conn = Connection(self, client, server)
        self.connections = [c for c in self.connections if c.alive]
        self.connections.append(conn)
        return conn

    # -- calls ----------------------------------------------------------------------------------------
    def call(self, src: str, dst: str, handle: Callable[[], Any], on_answer: Callable[[Any], None],
             owner: object, timeout_ms: int) -> None:
        """Deliver a request (``handle`` runs at ``dst`` and returns the answer, or None for no
        answer), then the answer to ``on_answer``; a lost request or answer gives None at the
        timeout. ``on_answer`` runs once, and not at all if ``owner`` crashed meanwhile."""
        world, rng = self.world, self.world.rng
        done = [False]

        def answer(value: Any) -> object:
            if done[0]:
                return QUIET
            done[0] = True
            on_answer(value)
            return None

        def arrive() -> None:
            if self.down(dst):
                return
            value = handle()
            if value is None or not self.reachable(dst, src) or rng.random() < self.loss:
                return
            world.at(self.delay_ms(), lambda: answer(value), owner=owner)

        if self.reachable(src, dst) and rng.random() >= self.loss:
            world.at(self.delay_ms(), arrive, scope=owner)   # the server acts for the caller's group
        world.at(timeout_ms, lambda: answer(None), owner=owner)

    def signal(self, src: str, dst: str, deliver: Callable[[], None], owner: object) -> None:
        """A connection event the kernel sends (a session's hello, the FIN of a killed process):
        delivered after ``SIGNAL_DELAY_MS`` unless the link is cut or an end is down. It draws
        nothing from the seed, so runs without kills keep their schedules."""
        if self.reachable(src, dst):
            self.world.at(SIGNAL_DELAY_MS, deliver, owner=owner)

    def notify(self, src: str, dst: str, deliver: Callable[[], None], owner: object) -> None:
        """A one-way message (a role-change notification); may be lost."""
        if self.reachable(src, dst) and self.world.rng.random() >= self.loss:
            self.world.at(self.delay_ms(), deliver, owner=owner)
