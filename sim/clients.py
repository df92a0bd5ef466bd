"""Producers and consumers in the simulated world, following the real client rules.

A producer finds its group's master through the controller (GET_REPLICA_INFO), sends a batch
(encoded once, ``encode_batch``, as the real producer sends it) and
records the outcome the way ``rocketray.actors.client`` does: PUT_OK is acknowledged (with the
offsets the broker assigned), a result that says nothing was written (``written`` NO) is a failure,
anything else (no answer, FLUSH_SLAVE_TIMEOUT, MASTER_CHANGED) is unknown. After anything but
PUT_OK it looks the master up again. Bodies are unique, so the checker can tell messages apart.
A consumer pulls from a random live replica from its cursor; a store serves only up to its confirm
offset, so whatever it returns counts as *read* and must never disappear.
"""

from __future__ import annotations

from dataclasses import dataclass

from rocketray.broker.message import Message
from rocketray.broker.batch import encode_batch
from rocketray.controller.api import GetReplicaInfoRequest
from rocketray.ha.ack import PutResult, Written
from rocketray.sim.broker import TOPIC, SimBroker
from rocketray.sim.controller import CONTROLLER, SimController
from rocketray.sim.net import Network
from rocketray.sim.world import World

__all__ = ["SimProducer", "SimConsumer", "Acked", "Read"]


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


@dataclass
class _Counts:
    ok: int = 0
    failed: int = 0
    unknown: int = 0
    batches: int = 0


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

    def start(self) -> None:
        self.world.at(self.interval_ms, self._tick, owner=self)

    def _tick(self) -> None:
        if not self.stopped and not self.busy:
            if self.target is None:
                self._lookup()
            else:
                self._send()
        self.world.at(self.interval_ms, self._tick, owner=self)

    def _lookup(self) -> None:
        self.busy = True

        def answered(resp) -> None:
            self.busy = False
            if resp is not None and resp.ok:
                address = (resp.header or {}).get("master_address")
                self.target = address if address in self.brokers else None
        self.net.call(self.name, CONTROLLER, lambda: self.controller.handle(GetReplicaInfoRequest(self.group)),
                      answered, owner=self, timeout_ms=self.timeout_ms)

    def _send(self) -> None:
        target = self.brokers[self.target]  # type: ignore[index]
        bodies = []
        for _ in range(self.batch):
            self.seq += 1
            bodies.append(f"{self.group}/{self.name}/{self.seq}".encode())
        self.busy = True
        self.counts.batches += 1
        done = [False]

        def finish(result: PutResult | None) -> None:
            if done[0]:
                return
            done[0] = True
            self.busy = False
            self._record(bodies, result)

        def deliver() -> None:
            if self.net.down(target.name):
                return

            def reply(result: PutResult | None) -> None:
                if self.net.reachable(target.name, self.name):
                    self.world.at(self.net.delay_ms(), lambda: finish(result), owner=self)
            target.put(encode_batch([Message(TOPIC, 0, body) for body in bodies]), reply)

        if self.net.reachable(self.name, target.name):
            self.world.at(self.net.delay_ms(), deliver)
        self.world.at(self.timeout_ms, lambda: finish(None), owner=self)

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
    def __init__(self, world: World, brokers: list[SimBroker], *, name: str, group: str, interval_ms: int) -> None:
        self.world, self.brokers = world, brokers
        self.name, self.group, self.interval_ms = name, group, interval_ms
        self.cursor = 0
        self.read: list[Read] = []
        self.by_queue_offset: dict[int, Read] = {}
        self.read_end = 0           # end of the furthest read message (its next record's offset)

    def start(self) -> None:
        self.world.at(self.interval_ms, self._tick, owner=self)

    def _tick(self) -> None:
        live = [b for b in self.brokers if b.up]
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
