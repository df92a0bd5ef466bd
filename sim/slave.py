"""The slave side of one simulated broker: its link to the master it follows.

Theory of operation. ``SimSlave`` is what ``HAClient`` does in production, for virtual time: it
connects to the master the role machine named (retrying every 50-300 ms while refused), runs the
real ``SlaveSession`` over the simulated connection and executes the session's store actions with
the same ``apply_to_store`` the HA shell uses. It belongs to one ``SimBroker`` process and one
master address; a role change replaces it (``stop``). A truncation counts as a rewrite of the
broker's log (the checker's cache key).
"""

from __future__ import annotations

from typing import Callable, Mapping, Protocol

from rocketray.broker.store import MessageStore
from rocketray.wire.ha_protocol import ProtocolError
from rocketray.ha.session import Close, Send, SlaveSession, Truncate
from rocketray.ha.slave_client import apply_to_store, local_log
from rocketray.sim.net import Connection, Network
from rocketray.sim.timings import BrokerTimings
from rocketray.sim.world import World

__all__ = ["SimSlave", "SlaveHost"]


class Peer(Protocol):
    def accept(self, conn: Connection) -> bool:
        """A slave connects to this broker's HA port: False refuses it."""


class SlaveHost(Protocol):
    """The broker process a slave link belongs to (``SimBroker``)."""

    id: int
    name: str
    up: bool
    rewrites: int
    store: MessageStore | None
    slave: "SimSlave | None"
    net: Network
    world: World
    t: BrokerTimings

    @property
    def peers(self) -> Mapping[str, Peer]: ...
    def guard(self, fn: Callable[[], None]) -> None: ...
    def retry_slave_connect(self) -> None: ...


class SimSlave:
    def __init__(self, broker: SlaveHost, master: str, expected_epoch: int) -> None:
        self.b = broker
        self.master = master
        self.expected_epoch = expected_epoch
        self.conn: Connection | None = None
        self.session: SlaveSession | None = None

    def expect(self, epoch: int) -> None:
        """The controller named the same master at ``epoch``."""
        self.expected_epoch = epoch
        if self.session is not None:
            self.session.expected_epoch = epoch

    def connect(self) -> None:
        b = self.b
        if not b.up or self.conn is not None:
            return
        conn = b.net.connect(b.name, self.master)
        peer = b.peers.get(self.master)
        if conn is None or peer is None or not peer.accept(conn):
            if conn is not None:
                conn.reset("refused")
            b.retry_slave_connect()
            return
        assert b.store is not None
        session = SlaveSession(b.id, expected_epoch=self.expected_epoch,
                               heartbeat_interval_ms=b.t.ha_heartbeat_ms,
                               housekeeping_interval_ms=b.t.ha_housekeeping_ms)
        self.conn, self.session = conn, session
        conn.bind(b.name, lambda c, d: b.guard(lambda: self._data(c, d)),
                  lambda c: b.guard(lambda: self._closed(c)), owner=b)
        conn.send(b.name, session.connect(local_log(b.store), b.world.now_ms))

    def stop(self) -> None:
        if self.conn is not None:
            self.conn.reset("slave stopped")

    def tick(self, now_ms: int) -> None:
        if self.session is not None and self.conn is not None:
            self._apply(self.conn, self.session.tick(now_ms))

    def _current(self, conn: Connection) -> bool:
        return self.b.slave is self and self.conn is conn

    def _data(self, conn: Connection, data: bytes) -> None:
        b = self.b
        if not self._current(conn) or self.session is None or b.store is None:
            return
        session = self.session
        now = b.world.now_ms
        try:
            session.receive_data(data, now)
            while True:
                actions = session.next_actions(local_log(b.store), now)
                if actions is None:
                    break
                if not self._apply(conn, actions):
                    return
        except ProtocolError as exc:
            self._drop(conn, f"protocol error: {exc}")

    def _apply(self, conn: Connection, actions: list) -> bool:
        b = self.b
        assert b.store is not None
        for action in actions:
            if isinstance(action, Send):
                conn.send(b.name, action.data)
            elif isinstance(action, Close):
                self._drop(conn, action.reason)
                return False
            else:
                if isinstance(action, Truncate):
                    b.rewrites += 1
                apply_to_store(b.store, action)
        return True

    def _drop(self, conn: Connection, reason: str) -> None:
        conn.reset(reason)
        self._closed(conn)

    def _closed(self, conn: Connection) -> None:
        if not self._current(conn):
            return
        self.conn, self.session = None, None
        self.b.retry_slave_connect()
