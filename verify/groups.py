"""The consumer-group checker: at-least-once per group, each message where it was acknowledged, in
order, by one owner at a time, never behind an acknowledged commit.

Theory of operation. The guarantee (docs/client.md, DESIGN.md): every acknowledged message is
delivered to every consumer group at least once, across master kills, consumer joins and leaves
and consumer crashes; once a commit of offset ``o`` of a queue is acknowledged (every in-sync
replica has it), the group never reads that queue below ``o`` again and its committed offset never
goes back below ``o``. ``check_groups`` reduces a run's sends (``OpRecord``) and consumer-group rows
(``rocketray.verify.group_history``) to one :class:`GroupReport` per consumer group the workload
declared or any row names, pure (no IO, no clock). The rules (``rocketray.verify.group_rules``):

- **undelivered** (failure): acknowledged payloads the group never received at the queue and offset
  their send was acknowledged at. The workload drains before it stops, so anything missing at the
  end was never delivered to that group.
- **misplaced** (failure): a delivery at a position where another payload was acknowledged, or two
  payloads received at one position.
- **failed_delivered** (failure): a delivery of a payload whose send was reported failed
  (``SendFailed``: nothing was written).
- **out_of_order** (failure): within one member's ownership of a queue (from the rebalance that
  assigned it), an offset not above the one before.
- **unowned** (failure): a delivery of a queue the member did not own at that poll.
- **shared_ownership** (failure): two members owning one queue at once for longer than
  ``overlap_allowance_ms``. With the order and ownership rules this bounds redeliveries: a message is
  received again only by another owner (after a crash, a leave or a rebalance) or through a failover.
- **redelivered** (reported, allowed: at-least-once): payloads delivered to the group more than once.
- **rereads_below_commit** (failure): a delivery at ``queue_offset < o`` whose poll started after
  ``T + poll_timeout_ms + slack_ms``, where a commit of ``o`` of that queue by any member of the group
  was acknowledged at ``T`` (a pull is held at most one poll timeout).
- **commit_regressions** (failure): a progress sample of a broker group (whose master answered) begun
  after a commit of ``o`` was acknowledged that shows that queue below ``o`` or not at all. A broker
  group that did not answer drops only its own sample (counted in ``progress_samples_failed``).
- **corrupt** (failure): deliveries the workload flagged (``payload_id`` ``corrupt:<pid>``).
- **drained** (failure when False): a declared group's drain did not commit every acknowledged queue
  to its end before its deadline (or was never recorded).

Times are wall-clock milliseconds of the one process that ran the workload.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from rocketray.verify import group_rules as rules
from rocketray.verify.fields import Number
from rocketray.verify.group_history import GroupHistory
from rocketray.verify.history import OpRecord
from rocketray.verify.outcome import Outcome

__all__ = ["POLL_TIMEOUT_MS", "REREAD_SLACK_MS", "OVERLAP_ALLOWANCE_MS", "CORRUPT_PREFIX", "GroupReport",
           "check_groups"]

#: The workload's ``Consumer.poll`` timeout (``chaos/group_workload.py`` uses this one).
POLL_TIMEOUT_MS = 500
#: Allowance past one poll timeout for a pull issued before a commit's acknowledgement.
REREAD_SLACK_MS = 1000
#: How long two members may own one queue at once: until each has heartbeated after a membership
#: change (one interval, 1 s by default) and polled, or a heartbeat that was in flight when the
#: controller leader changed has timed out (5 s), plus slack.
OVERLAP_ALLOWANCE_MS = 10_000
CORRUPT_PREFIX = "corrupt:"
EXAMPLES_MAX = 10
#: The rules whose count fails a group (each a field of GroupReport).
FAILURES = ("undelivered", "misplaced", "failed_delivered", "out_of_order", "unowned", "shared_ownership",
            "rereads_below_commit", "commit_regressions", "corrupt")


@dataclass(frozen=True, slots=True)
class GroupReport:
    """One consumer group's verdict; ``valid`` needs every count of ``FAILURES`` 0 and no failed drain."""

    consumer_group: str
    acked: int                  #: acknowledged payloads the group had to receive
    deliveries: int             #: deliver rows
    delivered_payloads: int     #: distinct payload ids delivered
    undelivered: int
    misplaced: int
    failed_delivered: int
    out_of_order: int
    unowned: int
    shared_ownership: int
    redelivered: int
    max_deliveries: int         #: the most times one payload was delivered
    rereads_below_commit: int
    commit_regressions: int
    corrupt: int
    drained: bool | None        #: the drain's outcome; None: the group was not declared (an older run)
    commits_ok: int
    commits_failed: int
    progress_samples: int
    progress_samples_failed: int
    consumers_started: int
    consumers_crashed: int
    consumers_closed: int
    rebalances: int             #: assign rows (queues assigned or revoked)
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return all(getattr(self, name) == 0 for name in FAILURES) and self.drained is not False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"valid": self.valid}
        for name in self.__dataclass_fields__:
            if name not in ("consumer_group", "examples"):
                out[name] = getattr(self, name)
        out["examples"] = {k: list(v) for k, v in self.examples.items()}
        return out

    def summary(self) -> str:
        """One line for the human verdict."""
        head = "ok" if self.valid else "INVALID"
        drained = {True: "drained", False: "NOT drained", None: "drain not recorded"}[self.drained]
        return (f"group {self.consumer_group}: {head}, {drained}; undelivered {self.undelivered} of {self.acked} acked, "
                f"misplaced {self.misplaced}, delivered though failed {self.failed_delivered}, "
                f"out of order {self.out_of_order}, unowned {self.unowned}, shared queues {self.shared_ownership}, "
                f"redelivered {self.redelivered} (at most {self.max_deliveries}x), rereads below an acked commit "
                f"{self.rereads_below_commit}, committed offsets gone back {self.commit_regressions}, "
                f"corrupt {self.corrupt}; {self.deliveries} deliveries, commits {self.commits_ok} ok / "
                f"{self.commits_failed} failed, {self.progress_samples} progress samples "
                f"({self.progress_samples_failed} unanswered), consumers {self.consumers_started} started / "
                f"{self.consumers_crashed} crashed / {self.consumers_closed} closed, {self.rebalances} rebalance rows")


def _cap(items: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for item in items:
        if len(out) >= EXAMPLES_MAX:
            break
        out.append(item)
    return out


def check_groups(sends: Sequence[OpRecord], history: GroupHistory, *, poll_timeout_ms: Number = POLL_TIMEOUT_MS,
                 slack_ms: Number = REREAD_SLACK_MS,
                 overlap_allowance_ms: Number = OVERLAP_ALLOWANCE_MS) -> tuple[GroupReport, ...]:
    """One report per consumer group declared or named by any row of ``history``; ``sends`` are the
    run's send records (every group must receive each acknowledged one, where it was acknowledged)."""
    acked = [op for op in sends if op.is_send and op.ok]
    failed = {op.payload_id for op in sends if op.is_send and op.outcome is Outcome.FAILED} - \
        {op.payload_id for op in acked}
    queue_groups = {op.queue_id: op.group for op in sends if op.is_send}
    for row in history.progress:
        if row.broker_group is not None:
            queue_groups.setdefault(row.queue_id, row.broker_group)
    times: list[Number] = [d.time_ms for d in history.deliveries]
    times += [e.time_ms for e in history.consumer_events] + [a.time_ms for a in history.assignments]
    history_end_ms = max(times, default=0)
    return tuple(_report(group, acked, failed, queue_groups, history.of_group(group), history_end_ms,
                         poll_timeout_ms, slack_ms, overlap_allowance_ms)
                 for group in history.consumer_groups())


def _report(group: str, acked: list[OpRecord], failed: set, queue_groups: dict[int, str], h: GroupHistory,
            history_end_ms: Number, poll_timeout_ms: Number, slack_ms: Number,
            overlap_allowance_ms: Number) -> GroupReport:
    good = [d for d in h.deliveries if not str(d.payload_id).startswith(CORRUPT_PREFIX)]
    corrupt = [d for d in h.deliveries if str(d.payload_id).startswith(CORRUPT_PREFIX)]
    missing = rules.undelivered_payloads(acked, good)
    misplaced = [*rules.misplaced_deliveries(acked, good), *rules.conflicting_positions(good)]
    again = rules.redelivered_payloads(good)
    sampled, unanswered, regressions = rules.commit_regressions(h.progress, h.samples, h.commits, queue_groups)
    found = {
        "undelivered": [{"payload_id": p} for p in missing],
        "misplaced": misplaced,
        "failed_delivered": rules.failed_but_delivered(failed, good),
        "out_of_order": rules.out_of_order(good, h.assignments),
        "unowned": rules.unowned_deliveries(good, h.assignments) if h.assignments else [],
        "shared_ownership": rules.shared_ownership(h.assignments, h.consumer_events, overlap_allowance_ms,
                                                   history_end_ms),
        "rereads_below_commit": rules.rereads_below_commit(good, h.commits, poll_timeout_ms, slack_ms),
        "commit_regressions": regressions,
        "corrupt": [{"payload_id": d.payload_id, "topic": d.topic, "queue_id": d.queue_id,
                     "queue_offset": d.queue_offset, "process": d.process} for d in corrupt],
    }
    examples = {k: _cap(v) for k, v in found.items() if v}
    if again:
        examples["redelivered"] = _cap({"payload_id": p, "times": n}
                                       for p, n in sorted(again.items(), key=lambda kv: rules.id_key(kv[0])))
    drained = None
    if h.declared:
        drained = bool(h.drains) and all(d.ok for d in h.drains)
        if not drained:
            examples["drain"] = [d.to_json() for d in h.drains] or [{"drain": "not recorded"}]
    events = [e.event for e in h.consumer_events]
    return GroupReport(
        consumer_group=group, acked=len({op.payload_id for op in acked}), deliveries=len(h.deliveries),
        delivered_payloads=len({d.payload_id for d in good}), **{k: len(v) for k, v in found.items()},
        redelivered=len(again), max_deliveries=max(again.values(), default=1 if good else 0),
        drained=drained, commits_ok=sum(1 for c in h.commits if c.ok),
        commits_failed=sum(1 for c in h.commits if not c.ok), progress_samples=sampled,
        progress_samples_failed=unanswered, consumers_started=events.count("start"),
        consumers_crashed=events.count("crash"), consumers_closed=events.count("close"),
        rebalances=len(h.assignments), examples=examples)
