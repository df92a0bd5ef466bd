"""The broker chaos run's consumer groups: members that poll, commit, crash, leave and join, recorded.

Theory of operation. ``G`` consumer groups each run ``C`` slots (a ``group`` row declares each, so
a group whose members recorded nothing still gets a verdict); a slot is a thread that runs one
``rocketray.client.Consumer`` at a time (process name ``<group>-c<slot>-<generation>``): it polls
(``POLL_TIMEOUT_MS``), records a ``deliver`` row per message with the poll's number, and every
``COMMIT_EVERY_POLLS`` polls commits, recording a ``commit`` row per queue entry (taken from the
consumer's pending positions before the call: ``ok`` if ``commit`` returned, ``failed`` if it
raised). Its rebalance listener records an ``assign`` row per queue assigned or revoked, with the
number of the poll it happened in (a close revokes in the poll after the last). The churn schedule
(``rocketray.verify.nemesis.make_churn_schedule``) asks a slot to crash its consumer (stop its
heartbeats without leaving the group, drop it: the controller expires it after
``controller.consumer_heartbeat_timeout_ms``) or to close it (leave at once); either way the slot
starts a new consumer after the step's delay. A sampler asks every broker group's master for every
group's committed offsets every ``PROGRESS_PERIOD_S``, one broker group at a time, so one that does
not answer costs only its own sample: a ``sample`` row per broker group and a ``progress`` row per
queue it answered. At the end, :meth:`GroupWorkload.finish` makes every slot commit after each poll
and waits until every group's progress shows lag 0 on every queue that acknowledged a send (or a
deadline), records a ``drain`` row per group, then the slots close their consumers. Each group has a
:class:`~rocketray.chaos.group_member_actions.MemberPlan`: its subscription (the last of two or more
groups filters by tag), and the nacks and seeks its members make after each poll
(``chaos/group_member_actions.py``). Row formats: ``rocketray.verify.group_history`` and
``rocketray.verify.group_actions``; the rules they are checked against: ``rocketray.verify.groups``.

Every member, and the progress sampler, share one client transport: one master cache and one set
of master watches (a watch holds a controller thread per broker group) instead of one per member.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from dataclasses import dataclass
from typing import Sequence

from rocketray.chaos.broker_workload import RunLog
from rocketray.chaos.group_member_actions import MemberActions, MemberPlan
from rocketray.chaos.replica_reader import checked_payload_id, now_ms
from rocketray.client import Admin, CommitFailed, Consumer, QueueProgress, TopicQueue
from rocketray.verify.outcome import Outcome
from rocketray.client.transport import Transport
from rocketray.verify.groups import POLL_TIMEOUT_MS
from rocketray.verify.nemesis import ChurnStep
from rocketray.waiting import NotYet, WaitTimeout, wait_for

log = logging.getLogger("rocketray.chaos.groups")

COMMIT_EVERY_POLLS = 3
COMMIT_TIMEOUT_S = 5.0
PROGRESS_PERIOD_S = 0.5
CREATE_RETRY_S = 0.5
#: after the last delayed message's time, how long its broker's scheduler (every 100 ms) may take to
#: put it in its queue before the drain can see it
DUE_SLACK_MS = 2000
#: the members' per-call timeout (committed offsets, commits): short, so a poll during a failover
#: gives up and tries again rather than holding the slot for the default 8 s
REQUEST_TIMEOUT_MS = 3000
#: how long a member's nack may take (the copy's send), as the producers' sends
NACK_TIMEOUT_MS = 8000
#: the subscription of the last group when the run has two or more (half the tags, docs/chaos-brokers.md)
FILTER_EXPRESSION = "paid || refunded"


@dataclass(frozen=True, slots=True)
class StopRequest:
    """Ask a slot to stop its consumer (``crash`` or ``leave``) and start another ``restart_after_s`` later."""

    kind: str
    restart_after_s: float


class Slot(threading.Thread):
    """One member position of a consumer group (see the module docstring)."""

    def __init__(self, cluster: str, transport: Transport, topic: str, consumer_group: str, index: int,
                 runlog: RunLog, stop: threading.Event, draining: threading.Event,
                 plan: MemberPlan | None = None) -> None:
        super().__init__(name=f"{consumer_group}-c{index}", daemon=True)
        self.cluster = cluster
        self.transport = transport
        self.topic = topic
        self.consumer_group = consumer_group
        self.index = index
        self.runlog = runlog
        self.stop = stop
        self.draining = draining
        self.plan = plan or MemberPlan(0, nack_permille=0, poison_permille=0, seek_chance=0.0)
        self.requests: queue.Queue[StopRequest] = queue.Queue(maxsize=16)
        self.generation = 0
        self.polls = 0          # polls started by the current consumer (numbers its rows)
        self.closing = False    # its consumer is closing (a revocation then is not inside a poll)

    def request(self, kind: str, restart_after_s: float) -> None:
        assert kind in ("crash", "leave"), kind
        self.requests.put_nowait(StopRequest(kind, restart_after_s))

    def _event(self, process: str, event: str) -> None:
        self.runlog.record({"f": "consumer", "process": process, "consumer_group": self.consumer_group,
                            "event": event, "time_ms": now_ms()})

    def run(self) -> None:
        while not self.stop.is_set():
            self.generation += 1
            process = f"{self.consumer_group}-c{self.index}-{self.generation}"
            consumer = self._start(process)
            if consumer is None:
                return
            request = self._consume(consumer, process)
            if request is not None and request.kind == "crash":
                _abandon(consumer)
                self._event(process, "crash")
            else:
                self._commit(consumer, process)
                self.closing = True
                try:
                    consumer.close()
                finally:
                    self.closing = False
                self._event(process, "close")
            if request is None:
                return
            self.stop.wait(request.restart_after_s)

    def _start(self, process: str) -> Consumer | None:
        """A new member of the group, retried while the cluster cannot take it (None once stopped)."""
        while not self.stop.is_set():
            self.polls = 0
            try:
                consumer = Consumer(self.cluster, group=self.consumer_group, topics={self.topic: self.plan.expression},
                                    transport=self.transport, client_id=process,
                                    request_timeout_ms=REQUEST_TIMEOUT_MS, send_timeout_ms=NACK_TIMEOUT_MS,
                                    max_deliveries=self.plan.max_deliveries, listener=AssignmentLog(self, process))
            except Exception as exc:  # noqa: BLE001 - no controller right now: try again
                log.info("consumer %s not started: %s", process, exc)
                self.stop.wait(CREATE_RETRY_S)
                continue
            self._event(process, "start")
            return consumer
        return None

    def _consume(self, consumer: Consumer, process: str) -> StopRequest | None:
        """Poll, record, nack, seek and commit until a churn request (returned) or the end of the run (None)."""
        polls = 0
        actions = MemberActions(self.plan, self.consumer_group, self.topic, process, self.runlog.record,
                                random.Random(f"{self.plan.seed}/{process}"))
        while not self.stop.is_set():
            try:
                return self.requests.get_nowait()
            except queue.Empty:
                pass
            poll_start = now_ms()
            self.polls += 1
            try:
                messages = consumer.poll(timeout_s=POLL_TIMEOUT_MS / 1000)
            except Exception as exc:  # noqa: BLE001 - a workload thread never dies mid-run
                log.warning("consumer %s: poll failed: %s", process, exc)
                self.stop.wait(0.2)
                continue
            t = now_ms()
            for m in messages:
                self.runlog.record({
                    "f": "deliver", "process": process, "consumer_group": self.consumer_group, "topic": m.topic,
                    "queue_id": m.queue_id, "queue_offset": m.queue_offset,
                    "payload_id": checked_payload_id(m.properties.get("pid"), m.body), "msg_id": m.msg_id,
                    "poll_start_ms": poll_start, "time_ms": t, "poll": self.polls, "tags": m.tags,
                    "delivery_count": m.delivery_count, "origin_topic": m.origin_topic,
                    "origin_queue_id": m.origin_queue_id, "origin_queue_offset": m.origin_queue_offset,
                    "origin_msg_id": m.origin_msg_id, "deliver_at_ms": m.deliver_at_ms})
            actions.after_poll(consumer, messages, self.polls, self.draining.is_set())
            polls += 1
            if polls % COMMIT_EVERY_POLLS == 0 or self.draining.is_set():
                self._commit(consumer, process)
        return None

    def _commit(self, consumer: Consumer, process: str) -> None:
        """Commit what was polled; one ``commit`` row per queue entry of the call."""
        entries = consumer.pending_commits()
        if not entries:
            return
        start = now_ms()
        acked: dict = {}
        try:
            acked = consumer.commit(timeout_s=COMMIT_TIMEOUT_S)
        except CommitFailed as exc:      # the broker groups that did acknowledge say so
            log.info("consumer %s: commit failed: %s", process, exc)
            acked = exc.committed
        except Exception as exc:  # noqa: BLE001 - no route: not known to be acknowledged
            log.info("consumer %s: commit failed: %s", process, exc)
        end = now_ms()
        for (topic, queue_id), offset in sorted(entries.items()):
            outcome = Outcome.OK if acked.get(TopicQueue(topic, queue_id)) == offset else Outcome.FAILED
            self.runlog.record({"f": "commit", "process": process, "consumer_group": self.consumer_group,
                                "topic": topic, "queue_id": queue_id, "offset": offset, "outcome": outcome,
                                "start_ms": start, "end_ms": end})


class AssignmentLog:
    """A slot's rebalance listener: one ``assign`` row per queue, numbered with the slot's poll (a
    revocation outside a poll, at close, belongs to the next one)."""

    def __init__(self, slot: Slot, process: str) -> None:
        self.slot = slot
        self.process = process

    def _record(self, event: str, queues: Sequence[TopicQueue]) -> None:
        closing = event == "revoked" and self.slot.closing
        for q in queues:
            self.slot.runlog.record({"f": "assign", "process": self.process, "consumer_group": self.slot.consumer_group,
                                     "topic": q.topic, "queue_id": q.queue_id, "event": event,
                                     "poll": self.slot.polls + (1 if closing else 0), "time_ms": now_ms()})

    def on_revoked(self, queues: Sequence[TopicQueue]) -> None:
        self._record("revoked", queues)

    def on_assigned(self, queues: Sequence[TopicQueue]) -> None:
        self._record("assigned", queues)


def _abandon(consumer: Consumer) -> None:
    """A crash: the member stops heartbeating and is dropped without leaving its group (its pulls in
    flight are never read). The client has no public way to do this: its membership's ``abandon``."""
    consumer._membership.abandon()


class ProgressSampler(threading.Thread):
    """Records every group's committed offsets every ``period_s``, one broker group at a time (a
    ``sample`` row each, and a ``progress`` row per queue it answered)."""

    def __init__(self, admin: Admin, broker_groups: Sequence[str], consumer_groups: Sequence[str], runlog: RunLog,
                 stop: threading.Event, period_s: float = PROGRESS_PERIOD_S) -> None:
        super().__init__(name="progress-sampler", daemon=True)
        self.admin = admin
        self.broker_groups = list(broker_groups)
        self.consumer_groups = list(consumer_groups)
        self.runlog = runlog
        self.stop = stop
        self.period_s = period_s

    def sample(self, consumer_group: str) -> list[QueueProgress] | None:
        """One recorded sample of ``consumer_group`` from every broker group; the rows if every one
        answered, else None (the answers that came are recorded all the same)."""
        rows: list[QueueProgress] = []
        complete = True
        for broker_group in self.broker_groups:
            start = now_ms()
            try:
                answer = self.admin.consumer_progress(consumer_group, [broker_group])
            except Exception as exc:  # noqa: BLE001 - that master is down: its sample failed, the others count
                log.info("progress of %s on %s not sampled: %s", consumer_group, broker_group, exc)
                answer, complete = None, False
            end = now_ms()
            self.runlog.record({"f": "sample", "consumer_group": consumer_group, "broker_group": broker_group,
                                "outcome": Outcome.OK if answer is not None else Outcome.FAILED,
                                "start_ms": start, "end_ms": end})
            for p in answer or ():
                self.runlog.record({"f": "progress", "consumer_group": consumer_group, "broker_group": broker_group,
                                    "topic": p.topic, "queue_id": p.queue_id, "committed": p.committed_offset,
                                    "max_offset": p.max_offset, "start_ms": start, "end_ms": end})
            rows += answer or ()
        return rows if complete else None

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            for group in self.consumer_groups:
                self.sample(group)
            self.stop.wait(max(0.0, self.period_s - (time.monotonic() - started)))


def _lag_left(rows: list[QueueProgress] | None, queues: set[tuple[str, int]]) -> NotYet | bool:
    """True when every queue of ``queues`` is committed up to its max offset."""
    if rows is None:
        return NotYet("no progress sample")
    by_queue = {(p.topic, p.queue_id): p for p in rows}
    behind = {q: (by_queue[q].committed_offset, by_queue[q].max_offset) if q in by_queue else None
              for q in sorted(queues) if q not in by_queue or by_queue[q].lag > 0}
    return NotYet(f"(topic, queue) -> (committed, max) behind: {behind}") if behind else True


def _lag(rows: list[QueueProgress] | None, queues: set[tuple[str, int]]) -> int | None:
    """Messages of ``queues`` not committed (None if unknown: no complete sample, a queue missing)."""
    if rows is None:
        return None
    by_queue = {(p.topic, p.queue_id): p for p in rows}
    return None if any(q not in by_queue for q in queues) else sum(by_queue[q].lag for q in queues)


class GroupWorkload:
    """``G`` consumer groups of ``C`` slots each, the churn schedule, the progress sampler, the drain.

    ``start`` then, once the faults are healed and the cluster settled, ``finish``."""

    def __init__(self, cluster: str, transport: Transport, topic: str, consumer_groups: Sequence[str],
                 consumers: int, runlog: RunLog, seed: int | None = None) -> None:
        """``seed`` None: members only poll and commit (every group reads ``*``, the producers do not
        tag); else each group's :class:`MemberPlan` from it (nacks, seeks, the last group's filter)."""
        assert consumers >= 1 and consumer_groups
        self.runlog = runlog
        self.stop_slots, self.stop_sampler, self.draining = threading.Event(), threading.Event(), threading.Event()
        self.plans = {g: MemberPlan(seed, FILTER_EXPRESSION if len(consumer_groups) > 1 and g == consumer_groups[-1]
                                    else "*") if seed is not None else None for g in consumer_groups}
        self.slots = {(g, i): Slot(cluster, transport, topic, g, i, runlog, self.stop_slots, self.draining,
                                   self.plans[g])
                      for g in consumer_groups for i in range(consumers)}
        self.sampler = ProgressSampler(Admin(cluster, transport=transport, timeout_s=2.0), transport.groups(),
                                       consumer_groups, runlog, self.stop_sampler)
        self.consumer_groups = list(consumer_groups)
        self.topic = topic
        self.consumers = consumers
        self.churner: threading.Thread | None = None
        self.acted = 0  #: churn steps carried out

    def start(self, churn: Sequence[ChurnStep], t0: float, stop_churn: threading.Event) -> None:
        """Start the members, the sampler and the churn (step times relative to monotonic ``t0``,
        until done or ``stop_churn``)."""
        for group in self.consumer_groups:
            plan = self.plans[group]
            self.runlog.record({"f": "group", "consumer_group": group, "topic": self.topic, "members": self.consumers,
                                "time_ms": now_ms(), "tags": plan.expression if plan else None,
                                "max_deliveries": plan.max_deliveries if plan else None})
        for t in (*self.slots.values(), self.sampler):
            t.start()
        self.churner = threading.Thread(target=self._run_churn, args=(churn, t0, stop_churn), name="churn",
                                        daemon=True)
        self.churner.start()

    def _run_churn(self, steps: Sequence[ChurnStep], t0: float, stop: threading.Event) -> None:
        for step in steps:
            delay = t0 + step.at_ms / 1000.0 - time.monotonic()
            if delay > 0 and stop.wait(delay):
                return
            kind = "crash" if step.kind == "crash-consumer" else "leave"
            self.slots[(step.consumer_group, step.slot)].request(kind, step.restart_after_ms / 1000.0)
            self.acted += 1

    def finish(self, queues: set[tuple[str, int]], timeout_s: float, due_ms: float = 0) -> bool:
        """After the churn stopped: drain (every group commits every queue of ``queues``, those that
        acknowledged a send, up to its end, and consumes its retry topic; not before wall-clock
        ``due_ms``, the last delayed send's time; False if ``timeout_s`` passed first), then stop the
        members (each commits and leaves) and the sampler."""
        if self.churner is not None:
            self.churner.join(timeout=30)
        drained = self._drain(queues, timeout_s, due_ms)
        self.stop_slots.set()
        for t in self.slots.values():
            t.join(timeout=30)
        self.stop_sampler.set()
        self.sampler.join(timeout=30)
        return drained

    def _drain(self, queues: set[tuple[str, int]], timeout_s: float, due_ms: float) -> bool:
        """Wait until every group committed ``queues`` to their ends and has no retry copy left to
        consume; a ``drain`` row per group."""
        self.draining.set()
        last: dict[str, list[QueueProgress] | None] = {}

        def drained() -> NotYet | bool:
            if now_ms() < due_ms + DUE_SLACK_MS:
                return NotYet(f"delayed messages fall due until {due_ms}")
            for group in self.consumer_groups:
                if self.plans[group] is not None and (why := self._retries_left(group)):
                    last.pop(group, None)
                    return NotYet(f"{group}: {why}")
                if _lag(last.get(group), queues) == 0:
                    continue
                last[group] = self.sampler.sample(group)
                left = _lag_left(last[group], queues)
                if not left:
                    return NotYet(f"{group}: {left.why}")  # type: ignore[union-attr]
            return True

        try:
            wait_for(drained, timeout_s, "every consumer group to commit every acknowledged message", 0.5)
            ok = True
        except WaitTimeout as exc:
            log.warning("drain incomplete: %s", exc)
            ok = False
        for group in self.consumer_groups:
            lag = _lag(last.get(group), queues) if self.plans[group] is None or not self._retries_left(group) else None
            self.runlog.record({"f": "drain", "consumer_group": group,
                                "outcome": Outcome.OK if lag == 0 else Outcome.FAILED, "lag": lag, "time_ms": now_ms()})
        return ok

    def _retries_left(self, group: str) -> str:
        """Why ``group``'s retry topic is not consumed yet ("" if it is, or the group never nacked)."""
        try:
            stats = self.sampler.admin.retry_stats(group)
        except Exception as exc:  # noqa: BLE001 - a master that does not answer: ask again
            return f"retry topic not sampled: {exc}"
        return f"{stats.retry_pending} retry copies not consumed" if stats.retry_pending else ""
