"""The master side of a simulated broker (``sim/broker.py``): the ports of the product's put shell
in virtual time, its slaves' HA connections and the consumers' committed-offset queries, as a base
class of ``SimBroker`` (which holds the state these methods use: ``gate``, ``put_shell``,
``sessions``, ``master``, ``store``, ``queries``, the role machine's views).

Theory of operation. Producers' puts run through the product's ``PutShell`` (``ha/put_shell.py``:
the gate, the hold, the write, the ack waits and their timers), the one the broker's HA service
runs; here are its ports: ``SimTimers`` (the world's clock; a timer is an event of the broker
process, so it dies with it) and the ``ReplicaPort`` (``endpoint_up``, ``appended``). The real
``MasterSession`` of each connection decodes the slave's packets and says what to send; the real
``MasterReplication`` decides acks, the union view, proposals and the confirm offset; here only the
simulated IO is done (bytes over ``sim.net`` connections, at most a few batches per pump while the
simulated socket buffer takes them). A committed-offset query waits for the wait rule
(``offsets.answerable``) and is answered with the fold of the confirmed commit records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from rocketray.wire.batch import EncodedBatch
from rocketray.broker.role import Role
from rocketray.wire.ha_protocol import ProtocolError
from rocketray.ha.put_gate import PutWait
from rocketray.ha.put_shell import Reply
from rocketray.ha.session import AckEvent, HandshakeEvent, MasterSession
from rocketray.sim import offsets
from rocketray.sim.net import Connection
from rocketray.sim.world import QUIET

__all__ = ["SimMasterSide", "SimTimers", "Query", "Reply"]


class SimTimer:
    """An armed timer of ``SimTimers``."""

    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class SimTimers:
    """The put shell's ``Timers`` in virtual time: the world's clock; a timer is an event owned by
    the broker process (a crash drops it) and runs as one of its steps (``SimBroker.guard``)."""

    def __init__(self, broker) -> None:
        self.b = broker

    def now_ms(self) -> int:
        return self.b.world.now_ms

    def call_at(self, at_ms: int, fn: Callable[[], object]) -> SimTimer:
        timer = SimTimer()
        b = self.b

        def fire() -> object:
            if timer.cancelled:
                return QUIET
            b.guard(fn)
            return None
        b.world.at(max(0, at_ms - b.world.now_ms), fire, owner=b)
        return timer


@dataclass(slots=True)
class Query:
    """A consumer's "committed offsets of my group?" waiting for the wait rule (``offsets.answerable``)."""

    group: str
    asked_max_offset: int
    asked_ms: int
    deadline_ms: int
    reply: Callable[[offsets.CommittedOffsets | None], None]


class SimMasterSide:
    """``SimBroker``'s master side (see the module docstring)."""

    def _close_sessions(self, reason: str) -> None:
        for conn, _session in list(self.sessions.values()):
            conn.reset(reason)
        for key in list(self.sessions):
            self._session_closed(key)

    # ================================================================== puts (ha/put_shell.py)
    @property
    def puts(self) -> "list[PutWait[Reply]]":
        """The written puts waiting for their acks, oldest first."""
        return list(self.gate.waits)

    def put(self, batch: EncodedBatch, reply: Reply) -> None:
        """A producer's encoded batch, through the product's put shell (``PutShell.put_start``: the
        gate, the hold while this replica becomes master, the write, the ack wait); a refusal is
        answered at once."""
        def run() -> None:
            refusal = self.put_shell.put_start(batch, self.world.now_ms, reply, may_hold=True)
            if refusal is not None:
                reply(refusal)
        self.guard(run)

    def endpoint_up(self) -> bool:
        """ReplicaPort: the process is alive."""
        return self.up

    def appended(self) -> None:
        """ReplicaPort: a put was just written: the confirm offset moves and every slave's session
        sends what it can now; a committed-offset query it makes answerable is answered."""
        self._update_confirm()
        for key in list(self.sessions):
            self._pump(key)
        self._check_queries()

    def _settle(self) -> None:
        """An input that may decide waiting puts or queries (an ack, a closed session, a role or
        SyncStateSet change): the queries, then the puts (``PutShell.settle``)."""
        self._check_queries()
        self.put_shell.settle()

    # ================================================================== HA: master side
    def accept(self, conn: Connection) -> bool:
        """A slave connects to this broker's HA port."""
        if not self.up or self.ha_role != Role.MASTER:
            return False
        session = MasterSession(self.world.now_ms, heartbeat_interval_ms=self.t.ha_heartbeat_ms,
                                housekeeping_interval_ms=self.t.ha_housekeeping_ms, batch_size=1024)
        self.sessions[conn.id] = (conn, session)
        self.master.opened(conn.id)
        conn.bind(self.name, lambda c, d: self.guard(lambda: self._master_data(c, d)),
                  lambda c: self.guard(lambda: self._session_closed(c.id)), owner=self)
        return True

    def _master_data(self, conn: Connection, data: bytes) -> None:
        entry = self.sessions.get(conn.id)
        if entry is None or self.store is None:
            return
        session = entry[1]
        now = self.world.now_ms
        try:
            session.receive_data(data, now)
            while True:
                event = session.next_event(self.store.max_offset, now)
                if event is None:
                    break
                if isinstance(event, HandshakeEvent):
                    for old in self.master.handshake(conn.id, event.slave_id):
                        self.sessions[old][0].reset("slave reconnected")
                        self._session_closed(old)
                    conn.send(self.name, session.handshake_reply(self.log_view, now))
                elif isinstance(event, AckEvent):
                    last = self.store.epoch_file.last_entry()
                    proposal = self.master.acked(conn.id, event, self.store.confirm_offset,
                                                 last.start_offset if last is not None else 0)
                    self._propose(proposal)
                    self._update_confirm()
                    self._settle()
        except ProtocolError as exc:
            conn.reset(f"protocol error: {exc}")
            self._session_closed(conn.id)
            return
        self._pump(conn.id)

    def _session_closed(self, key: int) -> None:
        if self.sessions.pop(key, None) is None:
            return
        proposal = self.master.closed(key, still_master=self.ha_role == Role.MASTER)
        if self.ha_role == Role.MASTER:
            self._propose(proposal)
        self._settle()

    def _pump(self, key: int) -> None:
        """Send what the master session has for its slave (a few batches at most)."""
        entry = self.sessions.get(key)
        if entry is None or self.store is None:
            return
        conn, session = entry
        now = self.world.now_ms
        for _ in range(4):
            if not conn.writable(self.name):
                return                      # the socket buffer is full: not caught up, wait
            out = session.next_send(self.log_view, now)
            if out is None:
                return
            if out.header:
                conn.send(self.name, bytes(out.header) + bytes(out.body))
            if out.caught_up:
                self.master.caught_up(key, now, session.async_learner)
                return

    def _update_confirm(self) -> None:
        if self.ha_role != Role.MASTER or self.store is None:
            return
        value = self.master.confirm_offset(self.store.max_offset, self.store.confirm_offset)
        if value != self.store.confirm_offset:
            self.store.confirm_offset = value

    # ================================================================== committed offsets
    def committed_offsets(self, group: str, reply: Callable[[offsets.CommittedOffsets | None], None]) -> None:
        """A consumer asks for ``group``'s committed offsets: as master, answered once the wait rule
        holds (``offsets.answerable``) with the fold of the confirmed commit records; ``None`` when
        not master, or not answerable within the slave timeout."""
        def run() -> None:
            if self.ha_role != Role.MASTER or self.store is None:
                reply(None)
                return
            now = self.world.now_ms
            self.queries.append(Query(group, self.store.max_offset, now, now + self.t.slave_timeout_ms, reply))
            self._later(self.t.slave_timeout_ms, self._check_queries)
            self._check_queries()
        self.guard(run)

    def _check_queries(self) -> None:
        if not self.queries:
            return
        now = self.world.now_ms
        keep = []
        for q in self.queries:
            if not self.up or self.store is None or self.ha_role != Role.MASTER or now >= q.deadline_ms:
                q.reply(None)
            elif offsets.answerable(self.store.confirm_offset, q.asked_max_offset):
                answer = self.offset_table().of_group(q.group)
                self.answers.append(offsets.OffsetAnswer(self.name, q.group, q.asked_ms, answer))
                q.reply(offsets.CommittedOffsets(answer))
            else:
                keep.append(q)
        self.queries = keep
