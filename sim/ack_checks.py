"""Invariant 11: what a PUT_OK promised when it was answered (a mixin of ``Invariants``,
sim/invariants.py).

Theory of operation. A master running ``min_in_sync_replicas`` N (``BrokerTimings``; the product's
``ha.min_in_sync_replicas``) admits a put only while at least N replicas are in sync (its union
view), and under the all-ack policy answers PUT_OK once every member of its view acknowledged the
batch. So a PUT_OK promises that, as it was answered, the batch was in the logs of N replicas. The
check takes that from the simulator's own state, not from the broker's answer: each producer hands
the checker every PUT_OK at the broker, as it is answered (``SimProducer.answered``), and after that
step every record of the batch must be whole, at the offset answered, in the logs of N replicas of
the group: a live process's store or, for a replica down at that moment, what its disk holds (a
slave may ack and die before its ack arrives; with sync flush its copy is durable).

One window is excused, and it is the product's rule, not slack: N is checked at admission (as
upstream RocketMQ does), and a SyncStateSet that shrinks below N while the put waits lets all-ack
answer with the set that remains. A PUT_OK is excused exactly when the answering master's union
view has fewer than N members at the answer, every one of them holds the records, and its view had
N or more members at some step since the put arrived (``_isr_seen``: sampled after every step).
A put admitted with fewer than N in sync has no such step. Async flush acknowledges copies a power
loss may drop (sim/loss.py), so the check runs with sync flush only.
"""

from __future__ import annotations

from bisect import bisect_right

from rocketray.broker.commitlog import StoreError
from rocketray.wire.message import MessageCodecError, decode_record
from rocketray.broker.segments import segment_name
from rocketray.sim.broker import SimBroker
from rocketray.sim.world import Violation

__all__ = ["AckChecks", "PROMISE"]

PROMISE = "PUT_OK on min_in_sync_replicas replicas"


def _store_holds(b: SimBroker, offset: int, body: bytes) -> bool:
    store = b.store
    if store is None or not store.min_offset <= offset < store.max_offset:
        return False
    try:
        msg, _ = decode_record(store.read_raw(offset, 1))     # exactly the record at offset, whole
    except (MessageCodecError, StoreError, ValueError):
        return False
    return msg.physical_offset == offset and bytes(msg.body) == body


def _disk_holds(b: SimBroker, offset: int, body: bytes) -> bool:
    """What a down replica's disk holds now (the page cache a kill keeps, what a power loss left)."""
    root = f"/{b.name}/store/commitlog"
    disk = b.disk
    if not disk.is_dir(root):
        return False
    bases = [int(n) for n in disk.listdir(root) if n.isdigit()]
    base = max((x for x in bases if x <= offset), default=None)
    if base is None:
        return False
    data = disk.read_bytes(f"{root}/{segment_name(base)}")
    try:
        msg, _ = decode_record(data, offset - base)
    except (MessageCodecError, ValueError, IndexError):
        return False
    return msg.physical_offset == offset and bytes(msg.body) == body


def _holders(brokers: list[SimBroker], offset: int, body: bytes, enough: int) -> int:
    """How many of ``brokers`` hold the record (counting stops at ``enough``)."""
    count = 0
    for b in brokers:
        if _store_holds(b, offset, body) if b.up else _disk_holds(b, offset, body):
            count += 1
            if count >= enough:
                break
    return count


class AckChecks:
    """11 (see the module docstring); uses ``groups``, ``producers``, ``controller`` and ``async_flush``."""

    def _setup_ack_checks(self) -> None:
        brokers = [b for members in self.groups.values() for b in members]
        n = brokers[0].t.min_in_sync_replicas if brokers else 1
        self._isr_n = n if not self.async_flush else 1
        self._answered: list = []
        # broker -> ([steps], [in-sync count after that step]): the change points of its master's count
        self._isr_seen: dict[SimBroker, tuple[list[int], list[int]]] = {b: ([0], [0]) for b in brokers}
        if self._isr_n > 1:
            for p in self.producers:
                p.answered = self._answered

    def _sample_isr(self) -> None:
        """After every step: each broker's in-sync count as a master (its union view; 0 otherwise)."""
        step = self.controller.world.steps
        for b, (steps, counts) in self._isr_seen.items():
            count = len(b.master.view()) if b.up and b.machine.is_master else 0
            if counts[-1] != count:
                steps.append(step)
                counts.append(count)

    def _check_answers(self) -> None:
        """Every PUT_OK answered in the step that just ran is held by N replicas of its group (or by
        every member of the view that answered it, in the admission rule's window)."""
        answered = list(self._answered)
        self._answered.clear()
        n = self._isr_n
        for target, bodies, result, arrived in answered:
            brokers = self.groups[target.group]
            for body, (_queue_offset, offset) in zip(bodies, result.offsets):
                if _holders(brokers, offset, body, n) >= n:
                    continue
                held = [b.id for b in brokers if _holders([b], offset, body, 1)]
                view = sorted(target.master.view()) if target.up else []
                if len(view) < n and self._was_in_sync(target, arrived) and set(view) <= set(held):
                    continue            # the set shrank below N while the put waited (all-ack held)
                raise Violation(PROMISE, f"{target.name} answered PUT_OK for {body!r} at {offset} held by "
                                f"replicas {held} only (min_in_sync_replicas {n}, its view {view})")

    def _was_in_sync(self, b: SimBroker, since_step: int) -> bool:
        """``b``'s in-sync count reached N at some step from ``since_step`` on."""
        steps, counts = self._isr_seen[b]
        first = max(0, bisect_right(steps, since_step) - 1)
        return any(c >= self._isr_n for c in counts[first:])
