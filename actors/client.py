"""Producer and consumer clients: batched, failover-aware, and recording a history.

A :class:`Producer` finds a group's master (cached; refreshed from the controller
or by asking the replicas), encodes a batch once (``encode_batch``: the records in
the commit-log layout, one ``bytes`` object; the master only checks them and fills
in offsets), sends it in one Ray call (one bytes object: Ray inlines a small one and moves a
large one through its object store, never pickling per message) and branches on the
typed answer (``rocketray.ha.ack.PutResult``): acknowledged -> done; refused
before anything was written (``retriable``: not master, fenced, too few in-sync
replicas) -> retry with backoff, possibly on a new master; written but not
acknowledged (``written`` YES or UNKNOWN: replicas did not ack in time, or the
role changed during the ack wait) -> stop: sending it again would store a second
copy as a new batch. A call that never answered (the actor died mid call, the
call timed out) is retried: the only case where a payload may be stored twice;
consumers de-duplicate by payload id and the checker reports duplicates.
Every payload ends as one history record: ``ok`` if an attempt was acknowledged,
``unknown`` if some attempt may have written it, and ``failed`` only if every
attempt was refused before anything was written (a batch refused as malformed,
MESSAGE_ILLEGAL, is not retried). A :class:`Consumer` reads a
queue from any replica, which serves only up to its confirm offset.

The producer learns a group's next master from the controller as soon as it is elected: it holds
a long-poll *watch* per group on every controller (``ControllerService.watch_master``, answered
when that controller applies a higher master epoch; one on every node, since the node of a dead
master may take a controller with it). A put still waiting when the watch names another master is
abandoned (an unanswered call: it may have run) and sent to the new master at once. This matters
when the master's actor died and Ray is restarting it: a call to it waits for the restart, seconds
after the controller elected its successor.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import ray

from rocketray.actors.cluster import Cluster
from rocketray.controller.api import GetReplicaInfoRequest
from rocketray.broker.message import Message
from rocketray.broker.batch import EncodedBatch, encode_batch
from rocketray.ha.ack import PutResult, PutStatus


@dataclass(frozen=True, slots=True)
class Unanswered:
    """A put call that never answered (timeout, actor death): it may or may not have run."""

    error: str

Recorder = Callable[[dict], None]


def now_ms() -> float:
    return time.time() * 1000.0


@dataclass
class SendOutcome:
    outcome: str  # "ok" | "unknown" | "failed"
    offsets: list[tuple[int, int]] = field(default_factory=list)  # (queue_offset, physical_offset)
    replica: int | None = None
    broker_id: int | None = None
    error: str | None = None
    attempts: int = 0


class Producer:
    def __init__(self, cluster: Cluster, process: str = "producer-0", topic: str = "rocketray",
                 recorder: Recorder | None = None, call_timeout_s: float = 8.0, retry_deadline_s: float = 60.0):
        self.cluster = cluster
        self.process = process
        self.topic = topic
        self.recorder = recorder
        self.call_timeout_s = call_timeout_s
        self.retry_deadline_s = retry_deadline_s
        self._master: dict[str, int] = {}
        self._op_id = 0
        self._watches: dict[str, dict[int, object]] = {}  # group -> controller index -> pending watch
        self._epochs: dict[str, int] = {}       # group -> highest master epoch a watch reported

    # --- master discovery -------------------------------------------------------------
    def _find_master(self, group: str) -> int | None:
        try:
            resp = self.cluster.call_controller(GetReplicaInfoRequest(broker_name=group), timeout_s=3.0)
            address = (resp.header or {}).get("master_address") if resp.ok else None
            if address:
                b = self.cluster.spec.broker_by_ha_address(address)
                if b is not None:
                    return b.replica
        except Exception:  # noqa: BLE001 - fall back to asking the replicas
            pass
        return self.cluster.master_of(group)

    def forget_master(self, group: str) -> None:
        """Drop the cached master of ``group`` (the next send looks it up again)."""
        self._master.pop(group, None)

    def _watches_of(self, group: str) -> dict:
        """The pending master watches of ``group``, one on every controller (armed with the highest
        epoch seen): one whose controller died with the master's node may not answer for seconds."""
        watches = self._watches.setdefault(group, {})
        for index in range(len(self.cluster.spec.controllers)):
            if index not in watches:
                watches[index] = self.cluster.controller(index).watch_master.remote(group, self._epochs.get(group, -1))
        return watches

    def _watched_master(self, group: str, watch) -> int | None:
        """Take a fired watch: the replica it names as a newer master, or None."""
        watches = self._watches.get(group, {})
        for index, ref in list(watches.items()):
            if ref == watch:
                del watches[index]
        try:
            view = ray.get(watch, timeout=0)
        except (ray.exceptions.RayError, ValueError):
            time.sleep(0.01)                # that controller died: re-armed next time (no hot loop)
            return None
        if view["master_epoch"] <= self._epochs.get(group, -1):
            return None
        self._epochs[group] = view["master_epoch"]
        b = self.cluster.spec.broker_by_ha_address(view["master_address"] or "")
        return None if b is None else b.replica

    # --- sending -----------------------------------------------------------------------
    def _attempt(self, group: str, replica: int, batch: EncodedBatch) -> PutResult | Unanswered:
        actor = self.cluster.broker(group, replica)
        deadline = time.monotonic() + self.call_timeout_s
        try:
            ref = actor.put.remote(batch)
            while True:
                watches = list(self._watches_of(group).values())
                ready, _ = ray.wait([ref, *watches], num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
                if ref in ready:
                    reply = ray.get(ref)
                    break
                if not ready:
                    return Unanswered("GetTimeoutError")
                new = self._watched_master(group, ready[0])
                if new is not None and new != replica:
                    self._master[group] = new
                    return Unanswered("MASTER_MOVED")  # the call may still run: treated as unanswered
        except (ray.exceptions.RayError, ValueError) as exc:
            return Unanswered(type(exc).__name__)
        assert isinstance(reply, PutResult), reply
        return reply

    def send(self, group: str, queue_id: int, payloads: list[tuple[str, bytes]]) -> SendOutcome:
        """Send one batch (all payloads to one queue); returns the final outcome."""
        start = now_ms()
        born = int(start)
        batch = encode_batch(Message(self.topic, queue_id, body, {"pid": pid}, born_timestamp_ms=born)
                             for pid, body in payloads)
        deadline = time.monotonic() + self.retry_deadline_s
        maybe_written = False
        result = SendOutcome(outcome="failed")
        backoff_s = 0.02  # doubles to 1 s: a new master usually takes its role within tens of ms
        while time.monotonic() < deadline:
            result.attempts += 1
            replica = self._master.get(group)
            if replica is None:
                replica = self._find_master(group)
                if replica is None:
                    result.error = "NO_MASTER"
                    time.sleep(backoff_s)
                    backoff_s = min(backoff_s * 2, 1.0)
                    continue
                self._master[group] = replica
            reply = self._attempt(group, replica, batch)
            if isinstance(reply, PutResult) and reply.ok:
                result = SendOutcome("ok", [tuple(o) for o in reply.offsets], replica,
                                     reply.broker_id, None, result.attempts)
                break
            if isinstance(reply, PutResult):
                result.error = reply.status.name
                if reply.status is PutStatus.MESSAGE_ILLEGAL:
                    break  # refused as malformed, nothing written: sending it again cannot help
                if not reply.retriable:
                    # Written (or maybe written) but not acknowledged: a resend would be a second
                    # copy, so the outcome stays unknown.
                    maybe_written = True
                    break
            else:
                result.error = "UNREACHABLE"
                maybe_written = True
                if reply.error == "MASTER_MOVED":
                    continue  # a watch named the new master (self._master): send there now
            self._master.pop(group, None)
            time.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, 1.0)
        if result.outcome != "ok":
            result.outcome = "unknown" if maybe_written else "failed"
        self._record(group, queue_id, payloads, result, start, now_ms())
        return result

    def _record(self, group: str, queue_id: int, payloads: list[tuple[str, bytes]], result: SendOutcome,
                start: float, end: float) -> None:
        if self.recorder is None:
            return
        for i, (pid, _body) in enumerate(payloads):
            qo, po = result.offsets[i] if result.outcome == "ok" else (None, None)
            self._op_id += 1
            self.recorder({"op_id": f"{self.process}-{self._op_id}", "process": self.process, "f": "send",
                           "group": group, "queue_id": queue_id, "payload_id": pid, "queue_offset": qo,
                           "physical_offset": po, "start_ms": start, "end_ms": end, "outcome": result.outcome,
                           "broker_id": result.broker_id, "error": None if result.outcome == "ok" else result.error})


class Consumer:
    def __init__(self, cluster: Cluster, process: str = "consumer-0", topic: str = "rocketray",
                 recorder: Recorder | None = None, batch: int = 512, call_timeout_s: float = 10.0):
        self.cluster = cluster
        self.process = process
        self.topic = topic
        self.recorder = recorder
        self.batch = batch
        self.call_timeout_s = call_timeout_s
        self._op_id = 0

    def read_queue(self, group: str, replica: int, queue_id: int, from_offset: int = 0) -> list[dict]:
        """Every message of one queue on one replica, from ``from_offset`` up to its confirm offset."""
        actor = self.cluster.broker(group, replica)
        out: list[dict] = []
        offset = from_offset
        while True:
            start = now_ms()
            msgs = ray.get(actor.get_messages.remote(self.topic, queue_id, offset, self.batch),
                           timeout=self.call_timeout_s)
            end = now_ms()
            if not msgs:
                return out
            for m in msgs:
                self._record(group, queue_id, m, start, end)
            out.extend(msgs)
            offset = msgs[-1]["queue_offset"] + 1

    def _record(self, group: str, queue_id: int, m: dict, start: float, end: float) -> None:
        if self.recorder is None:
            return
        self._op_id += 1
        self.recorder({"op_id": f"{self.process}-{self._op_id}", "process": self.process, "f": "read",
                       "group": group, "queue_id": queue_id, "payload_id": m["properties"].get("pid"),
                       "queue_offset": m["queue_offset"], "physical_offset": m["physical_offset"],
                       "start_ms": start, "end_ms": end, "outcome": "ok", "broker_id": m.get("broker_id"),
                       "error": None})
