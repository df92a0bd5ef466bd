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
  ``T + poll_timeout_ms + slack_ms`` and whose pull was sent after ``T + slack_ms``, where a commit of
  ``o`` of that queue by any member of the group was acknowledged at ``T`` (a pull is held at most one
  poll timeout, and is sent no earlier than the member's assignment of the queue and than the end of
  its last earlier poll that took from it, ``group_rules.pull_floors``: an answer may wait for the
  member's next poll, so a new owner's first pull may precede the last commits of the owner before it).
- **commit_regressions** (failure): a progress sample of a broker group (whose master answered) begun
  after a commit of ``o`` was acknowledged that shows that queue below ``o`` or not at all. A broker
  group that did not answer drops only its own sample (counted in ``progress_samples_failed``).
  An admin's reset of the stopped group (``commit`` rows with ``reset``) is the one allowed
  regression, for this rule and rereads_below_commit: an acknowledged reset sets ``o`` to its offset
  (commits after it raise it again), a failed one caps ``o`` from its start (it may have been
  written); nothing else lowers ``o`` (``group_rules.AckedCommits``).
- **corrupt** (failure): deliveries the workload flagged (``payload_id`` ``corrupt:<pid>``).
- **filtered_delivered** (failure): a group subscribed with a tag expression received a payload
  whose tag it does not match (it must receive every acknowledged one that matches: undelivered
  counts only those); **wrong_tags** (failure): a delivery whose tag is not the one sent.
- **nacks_lost** (failure): an acknowledged nack's retry copy never delivered, or a nack that raised
  whose message no member of the group nacked successfully and nothing delivered again; **wrong_copies** (failure): a copy delivered with another
  payload, delivery count or origin than its nack's; **nacks_misrouted** (failure): a copy in the
  dead-letter topic before ``max_deliveries`` or in the retry topic at it; **unexplained_copies**
  (failure): a retry copy no nack made.
- **seeks_not_honoured** (failure): after a seek to ``s`` the member's next delivery of the queue was
  below ``s`` or past the first acknowledged position at or after ``s`` its filter matches. A
  member's deliveries at or above its own seek's offset, while it owns the queue since, are a replay:
  neither rereads_below_commit nor out_of_order.
- **new_queues_unread** (failure): a queue added by extending the topic that no member was assigned
  within ``new_queue_bound_ms`` (the acknowledged messages on it must be delivered like any other).
- **delayed_early** (failure): a delayed send delivered more than ``delay_tolerance_ms`` before its
  time (its producer's wall clock against the time the consumer's poll returned, one host's clock),
  or under another ``msg_id``; a clock fault that ran a broker's wall clock ahead between the send
  (``clock_lookback_ms`` before its row) and the delivery allows that much more (``clock_faults``). (Its send row has no ``queue_offset``: it must be delivered anywhere
  in its topic, and is matched by payload id.)
- **drained** (failure when False): a declared group's drain did not commit every acknowledged queue
  to its end before its deadline (or was never recorded).

Times are wall-clock milliseconds of the one process that ran the workload.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from rocketray.verify import group_action_rules as actions
from rocketray.verify import group_rules as rules
from rocketray.verify.fields import Number
from rocketray.verify.group_history import Delivery, GroupDeclared, GroupHistory
from rocketray.verify.history import OpRecord
from rocketray.verify.outcome import Outcome

__all__ = ["POLL_TIMEOUT_MS", "REREAD_SLACK_MS", "OVERLAP_ALLOWANCE_MS", "CORRUPT_PREFIX", "GroupReport",
           "NEW_QUEUE_BOUND_MS", "DELAY_TOLERANCE_MS", "check_groups"]

#: The workload's ``Consumer.poll`` timeout (``chaos/group_workload.py`` uses this one).
POLL_TIMEOUT_MS = 500
#: Allowance past one poll timeout for a pull issued before a commit's acknowledgement.
REREAD_SLACK_MS = 1000
#: How long two members may own one queue at once: until each has heartbeated after a membership
#: change (one interval, 1 s by default) and polled, or a heartbeat that was in flight when the
#: controller leader changed has timed out (5 s), plus slack.
OVERLAP_ALLOWANCE_MS = 10_000
#: How soon a queue added to the topic must be assigned to a member: the client reads a new queue
#: within ``client.route_refresh_ms`` plus a heartbeat (under 10 s with the defaults), plus a
#: controller failover's 5 s in which routes and heartbeats go unanswered.
NEW_QUEUE_BOUND_MS = 15_000
#: How early a delayed message may come: both times are one host's wall clock (the producer's and
#: the broker's scheduler run in one node's processes); this covers whole-millisecond rounding.
DELAY_TOLERANCE_MS = 50
#: a delayed send was stored up to its send timeout (8 s) before its row: a clock fault that ended
#: that long before the row may still have scheduled it
CLOCK_LOOKBACK_MS = 10_000
CORRUPT_PREFIX = "corrupt:"
EXAMPLES_MAX = 10
#: The rules whose count fails a group (each a field of GroupReport).
FAILURES = ("undelivered", "misplaced", "failed_delivered", "out_of_order", "unowned", "shared_ownership",
            "rereads_below_commit", "commit_regressions", "corrupt", "filtered_delivered", "wrong_tags", "nacks_lost",
            "wrong_copies", "nacks_misrouted", "unexplained_copies", "seeks_not_honoured", "new_queues_unread",
            "delayed_early")


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
    filtered_delivered: int
    wrong_tags: int
    nacks_lost: int
    wrong_copies: int
    nacks_misrouted: int
    unexplained_copies: int
    seeks_not_honoured: int
    new_queues_unread: int
    delayed_early: int
    drained: bool | None        #: the drain's outcome; None: the group was not declared (an older run)
    commits_ok: int
    commits_failed: int
    progress_samples: int
    progress_samples_failed: int
    consumers_started: int
    consumers_crashed: int
    consumers_closed: int
    rebalances: int             #: assign rows (queues assigned or revoked)
    expression: str = "*"       #: the group's subscription (tag filter)
    nacks_ok: int = 0           #: nacks whose copy was acknowledged (dead letters included)
    nacks_failed: int = 0       #: nacks that raised
    dead_lettered: int = 0      #: acknowledged nacks into the dead-letter topic
    copies_delivered: int = 0   #: deliveries of retry copies
    seeks: int = 0
    delayed_delivered: int = 0  #: deliveries of delayed payloads
    queues_added: int = 0       #: queues the run's extensions of the topic added
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
                f"corrupt {self.corrupt}; filter {self.expression!r}: {self.filtered_delivered} filtered out but "
                f"delivered, {self.wrong_tags} wrong tags; nacks {self.nacks_ok} ok / {self.nacks_failed} failed "
                f"({self.dead_lettered} dead letters, {self.copies_delivered} copies delivered): {self.nacks_lost} lost, "
                f"{self.wrong_copies} wrong copies, {self.nacks_misrouted} misrouted, {self.unexplained_copies} "
                f"unexplained; {self.seeks} seeks, {self.seeks_not_honoured} not honoured; new queues unread "
                f"{self.new_queues_unread} of {self.queues_added}; delayed delivered {self.delayed_delivered}, early {self.delayed_early}; "
                f"{self.deliveries} deliveries, commits {self.commits_ok} ok / "
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
                 slack_ms: Number = REREAD_SLACK_MS, overlap_allowance_ms: Number = OVERLAP_ALLOWANCE_MS,
                 new_queue_bound_ms: Number = NEW_QUEUE_BOUND_MS,
                 delay_tolerance_ms: Number = DELAY_TOLERANCE_MS,
                 clock_faults: Sequence[tuple[Number, Number, Number]] = ()) -> tuple[GroupReport, ...]:
    """One report per consumer group declared or named by any row of ``history``; ``sends`` are the
    run's send records (every group must receive each acknowledged one its filter matches, where it
    was acknowledged). ``clock_faults``: ``(start_ms, end_ms, offset_ms)`` of each broker clock
    fault (``verify/nemesis.clock_windows``)."""
    acked = [op for op in sends if op.is_send and op.ok]
    failed = {op.payload_id for op in sends if op.is_send and op.outcome is Outcome.FAILED} - \
        {op.payload_id for op in acked}
    topics = {d.topic for d in history.declared} or {c.topic for c in history.commits if not c.topic.startswith("%")}
    queue_groups = {(t, op.queue_id): op.group for op in sends if op.is_send for t in topics}
    for row in history.progress:
        if row.broker_group is not None:
            queue_groups.setdefault((row.topic, row.queue_id), row.broker_group)
    times: list[Number] = [d.time_ms for d in history.deliveries]
    times += [e.time_ms for e in history.consumer_events] + [a.time_ms for a in history.assignments]
    history_end_ms = max(times, default=0)
    limits = {"poll_timeout_ms": poll_timeout_ms, "slack_ms": slack_ms, "overlap_allowance_ms": overlap_allowance_ms,
              "new_queue_bound_ms": new_queue_bound_ms, "delay_tolerance_ms": delay_tolerance_ms,
              "history_end_ms": history_end_ms}
    ahead = [(start, end, offset) for start, end, offset in clock_faults if offset > 0]
    return tuple(_report(group, acked, failed, queue_groups, history.of_group(group), limits, ahead)
                 for group in history.consumer_groups())


def _report(group: str, acked: list[OpRecord], failed: set, queue_groups: dict[tuple[str, int], str],
            h: GroupHistory, limits: dict[str, Number],
            clocks_ahead: Sequence[tuple[Number, Number, Number]] = ()) -> GroupReport:
    good = [d for d in h.deliveries if not str(d.payload_id).startswith(CORRUPT_PREFIX)]
    corrupt = [d for d in h.deliveries if str(d.payload_id).startswith(CORRUPT_PREFIX)]
    main = [d for d in good if not d.is_copy and not d.topic.startswith("%")]   # not a retry copy
    declared = h.declared[0] if h.declared else None
    expression = (declared.tags if declared is not None else None) or "*"
    wanted = [op for op in acked if actions.tag_matches(expression, actions.payload_tag(op.payload_id))]
    seeks = actions.SeekIndex(h.seeks, h.assignments)
    again = rules.redelivered_payloads(good)
    sampled, unanswered, regressions = rules.commit_regressions(h.progress, h.samples, h.commits, queue_groups)
    found = {
        "undelivered": [{"payload_id": p} for p in rules.undelivered_payloads(wanted, main)],
        "misplaced": [*rules.misplaced_deliveries(acked, main), *rules.conflicting_positions(good)],
        "failed_delivered": rules.failed_but_delivered(failed, good),
        "out_of_order": rules.out_of_order(good, h.assignments, seeks.boundaries),
        "unowned": rules.unowned_deliveries(good, h.assignments) if h.assignments else [],
        "shared_ownership": rules.shared_ownership(h.assignments, h.consumer_events, limits["overlap_allowance_ms"],
                                                   limits["history_end_ms"]),
        "rereads_below_commit": rules.rereads_below_commit(good, h.commits, limits["poll_timeout_ms"],
                                                           limits["slack_ms"], seeks.explains, h.assignments),
        "commit_regressions": regressions,
        "corrupt": [{"payload_id": d.payload_id, "topic": d.topic, "queue_id": d.queue_id,
                     "queue_offset": d.queue_offset, "process": d.process} for d in corrupt],
        **_action_findings(h, good, main, acked, declared, expression, seeks, limits, clocks_ahead),
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
    delayed_ids = {s.payload_id for s in h.delayed}
    return GroupReport(
        consumer_group=group, acked=len({op.payload_id for op in wanted}), deliveries=len(h.deliveries),
        delivered_payloads=len({d.payload_id for d in good}), **{k: len(v) for k, v in found.items()},
        redelivered=len(again), max_deliveries=max(again.values(), default=1 if good else 0),
        drained=drained, commits_ok=sum(1 for c in h.commits if c.ok),
        commits_failed=sum(1 for c in h.commits if not c.ok), progress_samples=sampled,
        progress_samples_failed=unanswered, consumers_started=events.count("start"),
        consumers_crashed=events.count("crash"), consumers_closed=events.count("close"),
        rebalances=len(h.assignments), expression=expression, nacks_ok=sum(1 for n in h.nacks if n.ok),
        nacks_failed=sum(1 for n in h.nacks if not n.ok), dead_lettered=sum(1 for n in h.nacks if n.ok and n.dead),
        copies_delivered=sum(1 for d in good if d.is_copy), seeks=len(h.seeks),
        delayed_delivered=sum(1 for d in main if d.payload_id in delayed_ids),
        queues_added=sum(e.queues - e.queues_before for e in h.extensions), examples=examples)


def _action_findings(h: GroupHistory, good: list[Delivery], main: list[Delivery], acked: list[OpRecord],
                     declared: GroupDeclared | None, expression: str, seeks: actions.SeekIndex,
                     limits: dict[str, Number], clocks_ahead: Sequence[tuple[Number, Number, Number]]
                     ) -> dict[str, list[dict[str, Any]]]:
    """The rules of ``rocketray.verify.group_action_rules``: filters, nacks, seeks, new queues, delays."""
    tagged = declared is not None and declared.tags is not None   # older runs sent untagged payloads
    return {
        "filtered_delivered": actions.filtered_out_deliveries(expression, good),
        "wrong_tags": actions.wrong_tags(good) if tagged else [],
        "nacks_lost": actions.lost_nacks(h.nacks, good),
        "wrong_copies": actions.wrong_copies(h.nacks, good),
        "nacks_misrouted": actions.misrouted_nacks(h.nacks, declared.max_deliveries if declared else None),
        "unexplained_copies": actions.unexplained_copies(h.nacks, good),
        "seeks_not_honoured": actions.seeks_not_honoured(seeks, good, acked, declared.topic if declared else None,
                                                         expression),
        "new_queues_unread": actions.new_queues_unread(h.extensions, h.assignments, limits["new_queue_bound_ms"],
                                                       limits["history_end_ms"]),
        "delayed_early": actions.early_deliveries(h.delayed, main, limits["delay_tolerance_ms"], clocks_ahead,
                                                  CLOCK_LOOKBACK_MS),
    }
