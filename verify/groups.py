"""The consumer-group checker: at-least-once per group, and a group never reads below an acknowledged commit.

Theory of operation. The guarantee (docs/client.md, DESIGN.md): every acknowledged message is
delivered to every consumer group at least once, across master kills, consumer joins and leaves
and consumer crashes; once a commit of offset ``o`` of a queue is acknowledged (every in-sync
replica has it), the group never reads that queue below ``o`` again and its committed offset never
goes back below ``o``. ``check_groups`` reduces a run's sends (``OpRecord``) and consumer-group rows
(``rocketray.verify.group_history``) to one :class:`GroupReport` per consumer group, pure (no IO,
no clock). The rules, each one function:

- **undelivered** (failure): payloads of ok sends that no ``deliver`` row of the group names. The
  workload drains before it stops (consumers poll until every group's lag is 0 or a deadline), so
  anything missing at the end was never delivered to that group.
- **redelivered** (reported, allowed: at-least-once): payloads delivered to the group more than once
  (a crash or a rebalance before the commit, a failover that lost an unacknowledged commit).
- **rereads_below_commit** (failure): a delivery of ``(group, topic, queue)`` at ``queue_offset < o``
  whose poll started after ``T + poll_timeout_ms + slack_ms``, where a commit of ``o`` of that queue
  by any member of the group was acknowledged at ``T`` (its ``end_ms``). The allowance covers a
  pull issued before the acknowledgement that returns in the next poll (a pull is held at most one
  poll timeout; ``slack_ms`` absorbs scheduling and the time between two polls).
- **commit_regressions** (failure): a ``progress`` sample (the rows of one
  ``Admin.consumer_progress`` call, regrouped by ``(consumer_group, start_ms, end_ms)``) that
  started after a commit of ``o`` was acknowledged and shows that queue's committed offset below
  ``o``, or does not list the queue at all (a group whose offsets vanished reads from the start).
- **corrupt** (failure): deliveries the workload flagged (``payload_id`` ``corrupt:<pid>``: the body
  did not match the payload id).

Times are wall-clock milliseconds of the one process that ran the workload.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from rocketray.verify.fields import Ident, Number
from rocketray.verify.group_history import CommitRecord, Delivery, GroupHistory, ProgressRow

__all__ = ["POLL_TIMEOUT_MS", "REREAD_SLACK_MS", "CORRUPT_PREFIX", "GroupReport", "check_groups",
           "undelivered_payloads", "redelivered_payloads", "rereads_below_commit", "commit_regressions"]

#: The workload's ``Consumer.poll`` timeout (``chaos/group_workload.py`` uses this one).
POLL_TIMEOUT_MS = 500
#: Allowance past one poll timeout for a pull issued before a commit's acknowledgement.
REREAD_SLACK_MS = 1000
CORRUPT_PREFIX = "corrupt:"
EXAMPLES_MAX = 10

QueueKey = tuple[str, str, int]  # (consumer_group, topic, queue_id)


@dataclass(frozen=True, slots=True)
class GroupReport:
    """One consumer group's verdict; ``valid`` needs undelivered, rereads, regressions and corrupt all 0."""

    consumer_group: str
    acked: int                  #: acknowledged payloads the group had to receive
    deliveries: int             #: deliver rows
    delivered_payloads: int     #: distinct payload ids delivered
    undelivered: int
    redelivered: int
    rereads_below_commit: int
    commit_regressions: int
    corrupt: int
    commits_ok: int
    commits_failed: int
    progress_samples: int
    consumers_started: int
    consumers_crashed: int
    consumers_closed: int
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return (self.undelivered == 0 and self.rereads_below_commit == 0 and self.commit_regressions == 0
                and self.corrupt == 0)

    def to_json(self) -> dict[str, Any]:
        return {"valid": self.valid, "acked": self.acked, "deliveries": self.deliveries,
                "delivered_payloads": self.delivered_payloads, "undelivered": self.undelivered,
                "redelivered": self.redelivered, "rereads_below_commit": self.rereads_below_commit,
                "commit_regressions": self.commit_regressions, "corrupt": self.corrupt,
                "commits_ok": self.commits_ok, "commits_failed": self.commits_failed,
                "progress_samples": self.progress_samples, "consumers_started": self.consumers_started,
                "consumers_crashed": self.consumers_crashed, "consumers_closed": self.consumers_closed,
                "examples": {k: list(v) for k, v in self.examples.items()}}

    def summary(self) -> str:
        """One line for the human verdict."""
        head = "ok" if self.valid else "INVALID"
        return (f"group {self.consumer_group}: {head}; undelivered {self.undelivered} of {self.acked} acked, "
                f"redelivered {self.redelivered}, rereads below an acked commit {self.rereads_below_commit}, "
                f"committed offsets gone back {self.commit_regressions}, corrupt {self.corrupt}; "
                f"{self.deliveries} deliveries, commits {self.commits_ok} ok / {self.commits_failed} failed, "
                f"{self.progress_samples} progress samples, consumers {self.consumers_started} started / "
                f"{self.consumers_crashed} crashed / {self.consumers_closed} closed")


def _id_key(value: Ident) -> tuple[str, str]:
    return (type(value).__name__, str(value))


def _cap(items: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for item in items:
        if len(out) >= EXAMPLES_MAX:
            break
        out.append(item)
    return out


# -- the rules -------------------------------------------------------------------------------------

def undelivered_payloads(acked: Sequence[Ident], deliveries: Sequence[Delivery]) -> list[Ident]:
    """Acknowledged payload ids that none of ``deliveries`` (one group's) names, sorted."""
    delivered = {d.payload_id for d in deliveries}
    return sorted((p for p in set(acked) if p not in delivered), key=_id_key)


def redelivered_payloads(deliveries: Sequence[Delivery]) -> dict[Ident, int]:
    """Payload id -> times delivered, for the payloads one group received more than once."""
    counts: dict[Ident, int] = defaultdict(int)
    for d in deliveries:
        if d.payload_id is not None:
            counts[d.payload_id] += 1
    return {p: n for p, n in counts.items() if n > 1}


class _AckedCommits:
    """Per (group, topic, queue): acknowledged commits in ``end_ms`` order with a running maximum,
    so "the highest offset acknowledged before time t" is one bisection."""

    def __init__(self, commits: Iterable[CommitRecord]) -> None:
        by_queue: dict[QueueKey, list[CommitRecord]] = defaultdict(list)
        for c in commits:
            if c.ok:
                by_queue[(c.consumer_group, c.topic, c.queue_id)].append(c)
        self._ends: dict[QueueKey, list[Number]] = {}
        self._best: dict[QueueKey, list[CommitRecord]] = {}
        for key, rows in by_queue.items():
            rows.sort(key=lambda c: c.end_ms)
            best: list[CommitRecord] = []
            for c in rows:
                best.append(c if not best or c.offset > best[-1].offset else best[-1])
            self._ends[key] = [c.end_ms for c in rows]
            self._best[key] = best

    def queues(self, consumer_group: str) -> list[tuple[str, int]]:
        return sorted((t, q) for g, t, q in self._ends if g == consumer_group)

    def highest_before(self, key: QueueKey, time_ms: Number) -> CommitRecord | None:
        """The acknowledged commit of the highest offset among those that ended strictly before ``time_ms``."""
        ends = self._ends.get(key)
        if not ends:
            return None
        i = bisect.bisect_left(ends, time_ms)
        return self._best[key][i - 1] if i else None


def rereads_below_commit(deliveries: Sequence[Delivery], commits: Sequence[CommitRecord],
                         poll_timeout_ms: Number = POLL_TIMEOUT_MS, slack_ms: Number = REREAD_SLACK_MS
                         ) -> list[dict[str, Any]]:
    """Deliveries below a commit acknowledged more than ``poll_timeout_ms + slack_ms`` before their poll began."""
    acked = _AckedCommits(commits)
    out = []
    for d in deliveries:
        c = acked.highest_before((d.consumer_group, d.topic, d.queue_id), d.poll_start_ms - poll_timeout_ms - slack_ms)
        if c is not None and d.queue_offset < c.offset:
            out.append({"consumer_group": d.consumer_group, "process": d.process, "topic": d.topic,
                        "queue_id": d.queue_id, "queue_offset": d.queue_offset, "payload_id": d.payload_id,
                        "poll_start_ms": d.poll_start_ms, "commit_offset": c.offset, "commit_process": c.process,
                        "commit_end_ms": c.end_ms})
    return out


def commit_regressions(progress: Sequence[ProgressRow], commits: Sequence[CommitRecord]) -> tuple[int, list[dict]]:
    """(samples checked, every queue of a sample below an offset acknowledged before the sample began)."""
    acked = _AckedCommits(commits)
    samples: dict[tuple[str, Number, Number], dict[tuple[str, int], int]] = defaultdict(dict)
    for row in progress:
        samples[(row.consumer_group, row.start_ms, row.end_ms)][(row.topic, row.queue_id)] = row.committed
    out = []
    for (group, start_ms, end_ms), committed in sorted(samples.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        for topic, queue_id in acked.queues(group):
            c = acked.highest_before((group, topic, queue_id), start_ms)
            shown = committed.get((topic, queue_id))
            if c is not None and (shown is None or shown < c.offset):
                out.append({"consumer_group": group, "topic": topic, "queue_id": queue_id, "committed": shown,
                            "acked_offset": c.offset, "acked_at_ms": c.end_ms, "commit_process": c.process,
                            "sample_start_ms": start_ms, "sample_end_ms": end_ms})
    return len(samples), out


# -- the report ------------------------------------------------------------------------------------

def check_groups(acked: Sequence[Ident], history: GroupHistory, *, poll_timeout_ms: Number = POLL_TIMEOUT_MS,
                 slack_ms: Number = REREAD_SLACK_MS) -> tuple[GroupReport, ...]:
    """One report per consumer group named by any row of ``history``; ``acked`` are the payload ids
    of the run's ok sends (every group must receive each)."""
    reports = []
    for group in history.consumer_groups():
        deliveries = [d for d in history.deliveries if d.consumer_group == group]
        commits = [c for c in history.commits if c.consumer_group == group]
        progress = [p for p in history.progress if p.consumer_group == group]
        events = [e for e in history.consumer_events if e.consumer_group == group]
        good = [d for d in deliveries if not str(d.payload_id).startswith(CORRUPT_PREFIX)]
        corrupt = [d for d in deliveries if str(d.payload_id).startswith(CORRUPT_PREFIX)]
        missing = undelivered_payloads(acked, good)
        again = redelivered_payloads(good)
        rereads = rereads_below_commit(good, commits, poll_timeout_ms, slack_ms)
        sampled, regressions = commit_regressions(progress, commits)
        examples = {
            "undelivered": _cap({"payload_id": p} for p in missing),
            "redelivered": _cap({"payload_id": p, "times": n} for p, n in sorted(again.items(),
                                                                                 key=lambda kv: _id_key(kv[0]))),
            "rereads_below_commit": _cap(rereads),
            "commit_regressions": _cap(regressions),
            "corrupt": _cap({"payload_id": d.payload_id, "topic": d.topic, "queue_id": d.queue_id,
                             "queue_offset": d.queue_offset, "process": d.process} for d in corrupt),
        }
        reports.append(GroupReport(
            consumer_group=group, acked=len(set(acked)), deliveries=len(deliveries),
            delivered_payloads=len({d.payload_id for d in good}), undelivered=len(missing), redelivered=len(again),
            rereads_below_commit=len(rereads), commit_regressions=len(regressions), corrupt=len(corrupt),
            commits_ok=sum(1 for c in commits if c.ok), commits_failed=sum(1 for c in commits if not c.ok),
            progress_samples=sampled, consumers_started=sum(1 for e in events if e.event == "start"),
            consumers_crashed=sum(1 for e in events if e.event == "crash"),
            consumers_closed=sum(1 for e in events if e.event == "close"),
            examples={k: v for k, v in examples.items() if v}))
    return tuple(reports)
