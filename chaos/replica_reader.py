"""Verification reads: one replica's queues, straight from its broker actor (not a client).

The chaos checker needs what each replica holds, not what a consumer group was served: the tailing
readers and the final sweep read every queue of the topic on a chosen replica (master or slave)
through ``BrokerService.get_messages``, which serves a replica's messages up to its own confirm
offset. Each message read becomes one ``read`` row of ``history.jsonl`` (``docs/contracts.md``).
A message whose body is not :func:`payload_body` of its ``pid`` property is recorded under the
payload id ``corrupt:<pid>``, which the checker reports as an inconsistent offset (and the real id,
if nothing else returned it, as lost). Applications read through ``rocketray.client.Consumer``.
"""

from __future__ import annotations

import itertools
import time
from typing import Callable

import ray

from rocketray.actors.cluster import Cluster
from rocketray.actors.views import StoredMessage
from rocketray.verify.outcome import Outcome

Recorder = Callable[[dict], None]
READ_BATCH = 512


def now_ms() -> float:
    """Wall-clock milliseconds: the clock of every record of a chaos run."""
    return time.time() * 1000.0


def payload_body(payload_id: str) -> bytes:
    """The body every message with this payload id carries (verifiable by any reader)."""
    return f"rocketray-chaos {payload_id};".encode() * 4


def checked_payload_id(pid: str | None, body: bytes) -> str:
    """``pid``, or ``corrupt:<pid>`` when ``body`` is not that payload's body."""
    if pid is None or bytes(body) != payload_body(str(pid)):
        return f"corrupt:{pid}"
    return str(pid)


class ReplicaReader:
    """Reads queues of ``topic`` from one replica at a time, recording a ``read`` row per message."""

    def __init__(self, cluster: Cluster, topic: str, process: str, recorder: Recorder,
                 call_timeout_s: float = 10.0, batch: int = READ_BATCH) -> None:
        self.cluster = cluster
        self.topic = topic
        self.process = process
        self.recorder = recorder
        self.call_timeout_s = call_timeout_s
        self.batch = batch
        self._op_ids = itertools.count(1)
        #: per (group, queue id): one past the highest queue offset this reader recorded, also when a
        #: later call of the same ``read_queue`` failed (a tail goes on from there, never back)
        self.recorded_up_to: dict[tuple[str, int], int] = {}

    def read_queue(self, group: str, replica: int, queue_id: int, from_offset: int = 0) -> list[StoredMessage]:
        """Every message of one queue on one replica from ``from_offset`` up to its confirm offset
        (raises if the replica does not answer within the call timeout)."""
        actor = self.cluster.broker(group, replica)
        out: list[StoredMessage] = []
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
            offset = msgs[-1].queue_offset + 1

    def _record(self, group: str, queue_id: int, m: StoredMessage, start: float, end: float) -> None:
        key = (group, queue_id)
        self.recorded_up_to[key] = max(self.recorded_up_to.get(key, 0), m.queue_offset + 1)
        pid = m.properties.get("pid")
        self.recorder({"op_id": f"{self.process}-{next(self._op_ids)}", "process": self.process, "f": "read",
                       "group": group, "queue_id": queue_id, "payload_id": checked_payload_id(pid, m.body),
                       "queue_offset": m.queue_offset, "physical_offset": m.physical_offset,
                       "start_ms": start, "end_ms": end, "outcome": Outcome.OK.value, "broker_id": m.broker_id,
                       "error": None})
