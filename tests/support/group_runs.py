"""Hand-made runs of sends and consumer-group rows for the consumer-group checker's tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from rocketray.verify.group_actions import DelayedSend, NackRecord, SeekRecord, TopicExtended
from rocketray.verify.group_history import (Assignment, CommitRecord, ConsumerEvent, Delivery, DrainRecord,
                                            GroupDeclared, GroupHistory, ProgressRow, SampleRecord)
from rocketray.verify.history import OpRecord
from rocketray.verify.run_dir import RunData

TOPIC = "chaos"
#: A well-formed ``nack`` row (tests vary it).
NACK_ROW = {"f": "nack", "process": "c", "consumer_group": "g", "topic": "t", "queue_id": 0, "queue_offset": 1,
            "payload_id": "p", "msg_id": "m", "origin_msg_id": None, "delivery_count": 1, "outcome": "ok",
            "copy_topic": "%RETRY%g", "copy_queue_id": 0, "copy_msg_id": "c1", "time_ms": 5}


@dataclass
class Run:
    """A run of sends and consumer-group rows, built by hand."""

    ops: list[OpRecord] = field(default_factory=list)
    rows: list = field(default_factory=list)

    def send(self, pid: str, offset: int | None, *, queue_id: int = 0, outcome: str = "ok", at: float = 0) -> "Run":
        self.ops.append(OpRecord(len(self.ops), "producer-0", "send", "broker-a", queue_id, pid,
                                 offset if outcome == "ok" else None, None, at, at + 5, outcome))
        return self

    def deliver(self, pid: str, offset: int, *, group: str = "cg-0", queue_id: int = 0, poll_start: float = 100,
                process: str = "cg-0-c0-1", poll: int | None = None, topic: str = TOPIC, msg_id: str | None = None,
                **fields) -> "Run":
        """One delivery; ``fields``: Delivery's optional ones (tags, delivery_count, origin_*, deliver_at_ms)."""
        self.rows.append(Delivery(process, group, topic, queue_id, offset, pid, msg_id or f"MSG{offset}", poll_start,
                                  poll_start + 10, poll, **fields))
        return self

    def nack(self, pid: str, offset: int, *, copy: str | None, count: int = 1, group: str = "cg-0",
             process: str = "cg-0-c0-1", copy_topic: str | None = None, outcome: str = "ok", at: float = 200,
             msg_id: str | None = None, origin: str | None = None) -> "Run":
        """A nack of the delivery of ``pid`` at ``offset`` (its msg id ``MSG<offset>`` unless given);
        ``copy``: the copy's msg id (ok nacks), into ``copy_topic`` (default the group's retry topic)."""
        self.rows.append(NackRecord(process, group, TOPIC, 0, offset, pid, msg_id or f"MSG{offset}", origin, count,
                                    outcome, (copy_topic or f"%RETRY%{group}") if copy else None, 0 if copy else None,
                                    copy, at))
        return self

    def seek(self, offset: int, *, poll: int, group: str = "cg-0", process: str = "cg-0-c0-1", queue_id: int = 0,
             at: float = 0) -> "Run":
        self.rows.append(SeekRecord(process, group, TOPIC, queue_id, offset, None, poll, at))
        return self

    def delayed(self, pid: str, msg_id: str, deliver_at: float, *, at: float = 0) -> "Run":
        self.rows.append(DelayedSend("producer-0", pid, msg_id, deliver_at, at))
        return self

    def extend(self, before: int, after: int, *, at: float) -> "Run":
        self.rows.append(TopicExtended(TOPIC, before, after, at))
        return self

    def assign(self, event: str, *, poll: int, at: float, group: str = "cg-0", queue_id: int = 0,
               process: str = "cg-0-c0-1") -> "Run":
        self.rows.append(Assignment(process, group, TOPIC, queue_id, event, poll, at))
        return self

    def declare(self, group: str = "cg-0", drained: bool | None = True, tags: str | None = None,
                max_deliveries: int | None = None) -> "Run":
        self.rows.append(GroupDeclared(group, TOPIC, 2, 0, tags, max_deliveries))
        if drained is not None:
            self.rows.append(DrainRecord(group, "ok" if drained else "failed", 0 if drained else 3, 9999))
        return self

    def sample(self, broker_group: str, committed: dict[int, int] | None, *, start: float,
               group: str = "cg-0") -> "Run":
        """One broker group's progress sample: None means its master did not answer."""
        self.rows.append(SampleRecord(group, broker_group, "failed" if committed is None else "ok", start, start + 30))
        for queue_id, offset in (committed or {}).items():
            self.rows.append(ProgressRow(group, TOPIC, queue_id, offset, 10, start, start + 30, broker_group))
        return self

    def commit(self, offset: int, *, end: float, group: str = "cg-0", queue_id: int = 0, outcome: str = "ok",
               process: str = "cg-0-c0-1", reset: bool = False) -> "Run":
        self.rows.append(CommitRecord(process, group, TOPIC, queue_id, offset, outcome, end - 20, end, reset))
        return self

    def progress(self, committed: dict[int, int], *, start: float, group: str = "cg-0", max_offset: int = 10) -> "Run":
        for queue_id, offset in committed.items():
            self.rows.append(ProgressRow(group, TOPIC, queue_id, offset, max_offset, start, start + 30))
        return self

    def consumer(self, event: str, *, group: str = "cg-0", process: str = "cg-0-c0-1", at: float = 0) -> "Run":
        self.rows.append(ConsumerEvent(process, group, event, at))
        return self

    def data(self) -> RunData:
        """The run, with a final read of every acked send (so only the group rules can fail it; a send
        acknowledged without an offset, a delayed one, is read at an offset of its own)."""
        reads = [OpRecord(f"r{i}", "final", "read", op.group, op.queue_id, op.payload_id,
                          10_000 + i if op.queue_offset is None else op.queue_offset, None, 5000, 5001, "ok")
                 for i, op in enumerate(self.ops) if op.outcome == "ok"]
        return RunData((*self.ops, *reads), groups=GroupHistory.of(self.rows))
