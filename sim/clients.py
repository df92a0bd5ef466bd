"""Producers and consumers in the simulated world, following the real client rules.

A producer finds its group's master through the controller (GET_REPLICA_INFO), sends a batch
(encoded once, ``encode_batch``, as the real producer sends it) and
records the outcome the way ``rocketray.client.Producer`` does: PUT_OK is acknowledged (with the
offsets the broker assigned), a result that says nothing was written (``written`` NO) is a failure,
anything else (no answer, FLUSH_SLAVE_TIMEOUT, MASTER_CHANGED) is unknown. After anything but
PUT_OK it looks the master up again. Bodies are unique, so the checker can tell messages apart.
A consumer pulls from a random live replica from its cursor; a store serves only up to its confirm
offset, so whatever it returns counts as *read* and must never disappear. It commits its cursor
as a record of ``__consumer_offsets`` through the same put path and the same outcome rules, and
after a failover, a lookup or a restart it resumes from the committed offset the master answers
(``SimBroker.committed_offsets``), not from its own cursor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from rocketray.wire.message import Message
from rocketray.wire.batch import encode_batch
from rocketray.wire.offset_records import commit_message, reset_message
from rocketray.wire.controller_api import GetReplicaInfoRequest
from rocketray.wire.put_result import PutResult, Written
from rocketray.sim.broker import TOPIC, SimBroker
from rocketray.sim.controller import CONTROLLER, SimController
from rocketray.sim.net import Network
from rocketray.sim.offsets import CONSUMER_GROUP, CommittedOffsets
from rocketray.sim.world import QUIET, World

__all__ = ["SimProducer", "SimConsumer", "Acked", "Read", "Committed", "ResetAttempt", "request", "lookup"]


@dataclass(frozen=True, slots=True)
class Acked:
    group: str
    physical_offset: int
    queue_offset: int
    body: bytes
    at_ms: int


@dataclass(frozen=True, slots=True)
class Read:
    group: str
    physical_offset: int
    queue_offset: int
    body: bytes
    replica: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class Committed:
    """An acknowledged offset commit (a record of the system topic at ``physical_offset``)."""

    group: str                  # the broker group that holds the queue
    consumer_group: str
    topic: str
    queue_id: int
    offset: int
    physical_offset: int
    body: bytes
    at_ms: int
    stale: bool                 # committed below an offset already acknowledged
    reset: bool = False         # an admin's reset record (an assignment, not a maximum)


@dataclass
class ResetAttempt:
    """A reset record sent (acknowledged or not: one whose answer was lost may be in the log)."""

    key: tuple[str, str, int]           # (consumer group, topic, queue id)
    offset: int
    sent_ms: int
    acked_ms: int | None = None
    physical_offset: int | None = None  # where it was acknowledged


@dataclass
class _Counts:
    ok: int = 0
    failed: int = 0
    unknown: int = 0
    batches: int = 0


def request(client, target: SimBroker, invoke: Callable[[Callable[[Any], None]], None],
            finish: Callable[[Any], None], timeout_ms: int) -> None:
    """Send one request from ``client`` to broker ``target`` over the simulated network: after a
    delay ``invoke(reply)`` runs at the broker, and what it replies travels back; ``finish`` runs
    once, with the reply or with ``None`` at the timeout (no answer: outcome unknown)."""
    world, net = client.world, client.net
    done = [False]

    def once(value: Any) -> object:
        if done[0]:
            return QUIET
        done[0] = True
        finish(value)
        return None

    def deliver() -> None:
        if net.down(target.name):
            return

        def reply(value: Any) -> None:
            if net.reachable(target.name, client.name):
                world.at(net.delay_ms(), lambda: once(value), owner=client)
        invoke(reply)

    if net.reachable(client.name, target.name):
        world.at(net.delay_ms(), deliver, scope=client)   # the broker acts for the client's group
    world.at(timeout_ms, lambda: once(None), owner=client)


def lookup(client, group: str, on_master: Callable[[str | None], None], timeout_ms: int) -> None:
    """Ask the controller for ``group``'s master (GET_REPLICA_INFO); ``on_master`` gets its broker
    name, or ``None`` (no answer, no master, or an unknown address)."""
    def answered(resp) -> None:
        address = resp.header.master_address if resp is not None and resp.ok else None
        on_master(address if address in client.brokers else None)
    client.net.call(client.name, CONTROLLER, lambda: client.controller.handle(GetReplicaInfoRequest(group)),
                    answered, owner=client, timeout_ms=timeout_ms)


class SimProducer:
    def __init__(self, world: World, net: Network, controller: SimController, brokers: dict[str, SimBroker],
                 *, name: str, group: str, batch: int, interval_ms: int, timeout_ms: int) -> None:
        self.world, self.net, self.controller, self.brokers = world, net, controller, brokers
        self.name, self.group, self.batch = name, group, batch
        self.interval_ms, self.timeout_ms = interval_ms, timeout_ms
        self.target: str | None = None
        self.seq = 0
        self.acked: list[Acked] = []
        self.failed_bodies: set[bytes] = set()   # batches the broker said were not written
        self.counts = _Counts()
        self.last_ok_ms = -1
        self.acked_end = 0          # end of the furthest acknowledged message
        self.busy = False
        self.stopped = False
        #: the checker's list of (broker, bodies, result, step the put arrived in) of each PUT_OK a
        #: broker answers, taken at the broker as it answers (invariant 11, sim/ack_checks.py); None:
        #: not kept
        self.answered: list | None = None

    def start(self) -> None:
        self.world.at(self.interval_ms, self._tick, owner=self)

    def _tick(self) -> object:
        if not self.stopped and not self.busy:
            if self.target is None:
                self._lookup()
            else:
                self._send()
        self.world.at(self.interval_ms, self._tick, owner=self)
        return QUIET    # a lookup or a batch on its way: scheduled events only

    def _lookup(self) -> None:
        self.busy = True

        def found(address: str | None) -> None:
            self.busy = False
            self.target = address
        lookup(self, self.group, found, self.timeout_ms)

    def _send(self) -> None:
        target = self.brokers[self.target]  # type: ignore[index]
        bodies = []
        for _ in range(self.batch):
            self.seq += 1
            bodies.append(f"{self.group}/{self.name}/{self.seq}".encode())
        self.busy = True
        self.counts.batches += 1

        def finish(result: PutResult | None) -> None:
            self.busy = False
            self._record(bodies, result)
        batch = encode_batch([Message(TOPIC, 0, body) for body in bodies])
        answered = self.answered

        def put(reply: Callable[[Any], None]) -> None:
            if answered is None:
                target.put(batch, reply)
                return

            arrived = self.world.steps

            def answer(result: PutResult | None) -> None:
                if result is not None and result.ok:
                    answered.append((target, bodies, result, arrived))
                reply(result)
            target.put(batch, answer)
        request(self, target, put, finish, self.timeout_ms)

    def _record(self, bodies: list[bytes], result: PutResult | None) -> None:
        if result is not None and result.ok:
            self.counts.ok += 1
            self.last_ok_ms = self.world.now_ms
            self.acked_end = max(self.acked_end, result.end_offset)
            for body, (queue_offset, physical_offset) in zip(bodies, result.offsets):
                self.acked.append(Acked(self.group, physical_offset, queue_offset, body, self.world.now_ms))
            return
        if result is not None and result.written == Written.NO:
            self.counts.failed += 1
            self.failed_bodies.update(bodies)
        else:
            self.counts.unknown += 1
        self.target = None


class SimConsumer:
    """One consumer of ``CONSUMER_GROUP`` on its broker group's queue.

    It pulls from a random live replica from its cursor (every ``interval_ms``); every
    ``commit_interval_ms`` it commits the cursor to the master through the put path (a record of
    the system topic; PUT_OK = acknowledged, anything else = not), and after anything but PUT_OK,
    at start and after a seeded restart (``restart_p`` per commit tick) it looks the master up and
    resumes from the committed offset the master answers, not from its own cursor. With
    ``stale_p`` a commit carries an offset below one already acknowledged (a consumer that lost
    the queue in a rebalance, a late commit from before a failover): the fold's max absorbs it.
    With ``reset_p`` the consumer stops and an admin resets its group's offset to a random one at
    or below its cursor (a reset record, ``rocketray.broker.offsets``); once that is acknowledged
    it resumes from the master's answer. Every reset sent is in ``resets``."""

    def __init__(self, world: World, net: Network, controller: SimController, brokers: dict[str, SimBroker],
                 replicas: list[SimBroker], *, name: str, group: str, interval_ms: int,
                 commit_interval_ms: int = 0, timeout_ms: int = 1500, stale_p: float = 0.0,
                 restart_p: float = 0.0, reset_p: float = 0.0) -> None:
        self.world, self.net, self.controller, self.brokers = world, net, controller, brokers
        self.replicas = replicas
        self.name, self.group, self.interval_ms = name, group, interval_ms
        self.commit_interval_ms, self.timeout_ms = commit_interval_ms, timeout_ms
        self.stale_p, self.restart_p, self.reset_p = stale_p, restart_p, reset_p
        self.resets: list[ResetAttempt] = []
        self.cursor = 0
        self.read: list[Read] = []
        self.by_queue_offset: dict[int, Read] = {}
        self.read_end = 0           # end of the furthest read message (its next record's offset)
        self.target: str | None = None      # the master commits go to; None: look it up and resume
        self.busy = False
        self.committed: list[Committed] = []    # acknowledged commits
        self.commit_counts = _Counts()
        self.acked_offset = -1      # highest acknowledged commit
        self.commit_end = 0         # end of the furthest acknowledged commit record
        self.last_commit_ok_ms = -1
        self.resumes = 0
        self.stopped = False        # no more commits

    def start(self) -> None:
        self.world.at(self.interval_ms, self._tick, owner=self)
        if self.commit_interval_ms > 0:
            self.world.at(self.commit_interval_ms, self._commit_tick, owner=self)

    def _tick(self) -> None:
        live = [b for b in self.replicas if b.up]
        if live:
            replica = self.world.rng.choice(live)
            for msg in replica.read(self.cursor, 16):
                r = Read(self.group, msg.physical_offset, msg.queue_offset, bytes(msg.body), replica.name,
                         self.world.now_ms)
                self.read.append(r)
                self.by_queue_offset.setdefault(msg.queue_offset, r)
                self.cursor = max(self.cursor, msg.queue_offset + 1)
                self.read_end = max(self.read_end, msg.physical_offset + 1)
        self.world.at(self.interval_ms, self._tick, owner=self)

    # -- commits ------------------------------------------------------------------------------------
    def _commit_tick(self) -> None:
        if not self.busy and not self.stopped:
            rng = self.world.rng
            if self.target is not None and rng.random() < self.restart_p:
                self.world.note(f"{self.name} restarts")
                self.target = None
            if self.target is None:
                self._resume()
            elif self.reset_p and rng.random() < self.reset_p:
                self._commit(rng.randint(0, self.cursor), stale=False, reset=True)
            elif self.acked_offset > 0 and rng.random() < self.stale_p:
                self._commit(rng.randint(max(0, self.acked_offset - 64), self.acked_offset - 1), stale=True)
            else:                   # like RocketMQ's periodic persist: changed or not
                self._commit(self.cursor, stale=False)
        self.world.at(self.commit_interval_ms, self._commit_tick, owner=self)

    def _resume(self) -> None:
        """Look the master up and continue from the committed offset it answers."""
        self.busy = True

        def found(address: str | None) -> None:
            if address is None:
                self.busy = False
                return
            target = self.brokers[address]
            request(self, target, lambda reply: target.committed_offsets(CONSUMER_GROUP, reply),
                    lambda answer: answered(address, answer), self.timeout_ms)

        def answered(address: str, answer: CommittedOffsets | None) -> None:
            self.busy = False
            if answer is not None:
                self.target = address
                self.cursor = answer.offsets.get((TOPIC, 0), 0)
                self.resumes += 1
        lookup(self, self.group, found, self.timeout_ms)

    def _commit(self, offset: int, *, stale: bool, reset: bool = False) -> None:
        target = self.brokers[self.target]  # type: ignore[index]
        self.busy = True
        self.commit_counts.batches += 1
        msg = (reset_message if reset else commit_message)(CONSUMER_GROUP, [(TOPIC, 0, offset)], self.world.now_ms)
        batch = encode_batch([msg])
        attempt = ResetAttempt((CONSUMER_GROUP, TOPIC, 0), offset, self.world.now_ms) if reset else None
        if attempt is not None:
            self.world.note(f"{self.name} resets its group to {offset}")
            self.resets.append(attempt)

        def finish(result: PutResult | None) -> None:
            self.busy = False
            if result is not None and result.ok:
                ((_queue_offset, physical_offset),) = result.offsets
                self.committed.append(Committed(self.group, CONSUMER_GROUP, TOPIC, 0, offset, physical_offset,
                                                bytes(msg.body), self.world.now_ms, stale, reset))
                self.commit_counts.ok += 1
                self.last_commit_ok_ms = self.world.now_ms
                self.acked_offset = offset if reset else max(self.acked_offset, offset)
                self.commit_end = max(self.commit_end, result.end_offset)
                if attempt is not None:
                    attempt.acked_ms, attempt.physical_offset = self.world.now_ms, physical_offset
                    self.target = None          # resume from the master's answer: the reset offset
                return
            if result is not None and result.written == Written.NO:
                self.commit_counts.failed += 1
            else:
                self.commit_counts.unknown += 1
            self.target = None
            self._resume()          # at once, as a client does after a failed commit
        request(self, target, lambda reply: target.put(batch, reply), finish, self.timeout_ms)
