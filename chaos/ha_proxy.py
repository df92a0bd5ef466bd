"""Fault-injecting TCP proxies in front of the brokers' HA ports (the ``partition-ha`` nemesis).

Theory of operation. A cluster started with ``start_cluster(..., ha_proxy=True)`` gives each broker
an advertised HA address (``BrokerSpec.ha_port``: what it registers with the controller and what its
slaves dial) and a separate listen port (``BrokerSpec.listen_port``). :class:`HaProxies` listens on
every advertised port and forwards each accepted connection to the broker's listen port, byte for
byte, on an asyncio loop in a background thread of the chaos runner. Replication links are
slave -> master connections, so every link of a group enters through the proxy of its master.

A fault applies to the connections at one proxy (``broker``), optionally only to those opened by
given peer processes (``peer_pids``: the actor pids of particular slaves, found from the
connection's source port in ``/proc``), which cuts a single master-slave link:

- ``cut``: matching connections are aborted and new matching connections are accepted and aborted
  at once (the slave sees a reset and reconnects with backoff);
- ``stall``: matching connections stop forwarding in both directions (TCP back-pressure holds the
  sender) and new matching connections are stalled as well, until healed.

``heal()`` lifts every fault: stalled connections flow again, new connections are forwarded. The
proxies bind loopback-reachable addresses of the local host, so ``partition-ha`` needs the runner
on the same node as the brokers (a single-node Ray, as ``rocketray chaos`` starts by default).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from dataclasses import dataclass
from typing import Iterable

from rocketray.chaos.loop import ProxyLoop
from rocketray.spec import BrokerSpec, ClusterSpec

log = logging.getLogger("rocketray.chaos.ha_proxy")

CHUNK_BYTES = 1 << 16
MODES = ("cut", "stall")

BrokerKey = tuple[str, int]  # (group, replica)


def _proc_net_address(host: str, port: int) -> str:
    """An IPv4 address as ``/proc/net/tcp`` spells it (little-endian hex, upper case)."""
    return f"{socket.inet_aton(host)[::-1].hex().upper()}:{port:04X}"


def _socket_inode(peer: tuple[str, int], local: tuple[str, int]) -> str | None:
    want_local, want_remote = _proc_net_address(*peer), _proc_net_address(*local)
    try:
        with open("/proc/net/tcp", encoding="ascii") as fh:
            next(fh)
            for line in fh:
                parts = line.split()
                # inode 0: a TIME_WAIT leftover of an earlier socket, not ours
                if len(parts) > 9 and parts[1] == want_local and parts[2] == want_remote and parts[9] != "0":
                    return parts[9]
    except OSError:
        return None
    return None


def peer_pids(peer: tuple[str, int], local: tuple[str, int]) -> frozenset[int]:
    """Pids of the local processes holding the TCP socket ``peer`` connected to ``local``.

    Reads ``/proc/net/tcp`` for the socket's inode, then every process's fd table (Linux, IPv4;
    psutil is not used because pysyncobj, imported by the driver, replaces ``socket.inet_ntop``).
    All holders are returned, not the first: a process forked at the wrong moment shares the
    socket until it execs, and must not hide the real owner. Empty if nothing was found."""
    inode = _socket_inode(peer, local)
    if inode is None:
        return frozenset()
    target = f"socket:[{inode}]"
    return frozenset(int(pid) for pid in os.listdir("/proc") if pid.isdigit() and _holds(pid, target))


def _holds(pid: str, target: str) -> bool:
    """Whether process ``pid`` has an fd pointing at ``target``. An fd closed between listing and
    reading (routine in a busy process) is skipped on its own; it must not hide the others."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False  # gone, or not ours to read
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                return True
        except OSError:
            continue
    return False


@dataclass(frozen=True, slots=True)
class LinkFault:
    mode: str
    peer_pids: frozenset[int] | None = None  # None: every connection at this proxy

    def matches(self, pids: frozenset[int]) -> bool:
        return self.peer_pids is None or bool(pids & self.peer_pids)


class _Conn:
    def __init__(self, key: BrokerKey, peer: tuple[str, int], local: tuple[str, int],
                 client: asyncio.StreamWriter) -> None:
        self.key = key
        self.peer = peer
        self.local = local
        self.pids: frozenset[int] = frozenset()  # processes holding the peer's socket; empty: not looked up
        self.writers: list[asyncio.StreamWriter] = [client]
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.closed = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.flowing.set()  # wake stalled pumps so they exit
        for w in self.writers:
            try:
                w.transport.abort()
            except Exception:  # noqa: BLE001 - already closed
                pass


class HaProxies(ProxyLoop):
    """One forwarding listener per broker of ``spec`` (which must have been planned with ``ha_proxy``)."""

    def __init__(self, spec: ClusterSpec) -> None:
        super().__init__("ha-proxies")
        self._brokers: dict[BrokerKey, BrokerSpec] = {(b.group, b.replica): b for b in spec.brokers}
        for b in spec.brokers:
            if b.listen_port is None or b.listen_port == b.ha_port:
                raise ValueError(f"broker {b.group}/{b.replica} has no separate listen port; "
                                 "start the cluster with ha_proxy=True")
        self._faults: dict[BrokerKey, LinkFault] = {}
        self._conns: set[_Conn] = set()
        self.accepted = 0
        self.aborted = 0

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> "HaProxies":
        self._start_loop(self._start_servers())
        return self

    async def _start_servers(self) -> None:
        for key, b in self._brokers.items():
            await self._listen(lambda r, w, key=key: self._accept(key, r, w), host=b.host, port=b.ha_port)

    def _abort_connections(self) -> None:
        for c in list(self._conns):
            c.close()
        self._conns.clear()

    # --- faults ---------------------------------------------------------------------------
    def fault(self, broker: BrokerKey, mode: str, peer_pids: Iterable[int] | None = None) -> int:
        """Start a ``cut`` or ``stall`` at ``broker``'s proxy; returns how many live connections it hit."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if broker not in self._brokers:
            raise KeyError(broker)
        pids = None if peer_pids is None else frozenset(peer_pids)
        return self._call(self._apply(broker, LinkFault(mode, pids)))

    def heal(self) -> None:
        """Lift every fault."""
        self._call(self._heal())

    @property
    def faults(self) -> dict[BrokerKey, LinkFault]:
        return dict(self._faults)

    async def _apply(self, broker: BrokerKey, fault: LinkFault) -> int:
        self._faults[broker] = fault
        hit = 0
        for conn in [c for c in self._conns if c.key == broker]:
            if fault.peer_pids is not None and not conn.pids:
                conn.pids = await asyncio.to_thread(peer_pids, conn.peer, conn.local)
            if not fault.matches(conn.pids):
                continue
            hit += 1
            if fault.mode == "cut":
                self.aborted += 1
                conn.close()
                self._conns.discard(conn)
            else:
                conn.flowing.clear()
        log.info("ha fault %s at %s/%s peers=%s hit=%d", fault.mode, broker[0], broker[1],
                 sorted(fault.peer_pids) if fault.peer_pids is not None else "all", hit)
        return hit

    async def _heal(self) -> None:
        self._faults.clear()
        for conn in self._conns:
            conn.flowing.set()

    # --- forwarding -----------------------------------------------------------------------
    async def _accept(self, key: BrokerKey, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        peer = writer.get_extra_info("peername")[:2]
        local = writer.get_extra_info("sockname")[:2]
        conn = _Conn(key, peer, local, writer)
        fault = self._faults.get(key)
        if fault is not None and fault.peer_pids is not None:
            conn.pids = await asyncio.to_thread(peer_pids, peer, local)
        if fault is not None and fault.matches(conn.pids) and fault.mode == "cut":
            self.aborted += 1
            conn.close()
            return
        b = self._brokers[key]
        try:
            up_reader, up_writer = await asyncio.open_connection(b.host, b.bind_port)
        except OSError:
            conn.close()
            return
        conn.writers.append(up_writer)
        fault = self._faults.get(key)  # it may have changed while connecting
        if fault is not None and fault.peer_pids is not None and not conn.pids:
            conn.pids = await asyncio.to_thread(peer_pids, peer, local)
        if fault is not None and fault.matches(conn.pids):
            if fault.mode == "cut":
                conn.close()
                return
            conn.flowing.clear()
        self._conns.add(conn)
        await asyncio.gather(self._pump(conn, reader, up_writer), self._pump(conn, up_reader, writer))
        self._conns.discard(conn)

    async def _pump(self, conn: _Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while not conn.closed:
                data = await reader.read(CHUNK_BYTES)
                if not data:
                    break
                await conn.flowing.wait()
                if conn.closed:
                    break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            conn.close()
