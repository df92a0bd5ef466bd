"""The consumer-group checker's rules, one pure function each (``rocketray.verify.groups`` applies them
per group and says which are failures). Inputs are one group's rows (``rocketray.verify.group_history``)
and the run's sends (``rocketray.verify.history.OpRecord``); no IO, no clock.

Positions. A send acknowledged at ``(queue_id, queue_offset)`` is *at* that position: the group
must receive that payload there, and nothing else may be received there. A payload may be stored a
second time elsewhere (the producer resends a call that was never answered), so a delivery of it at
another, unacknowledged position is allowed.

Ownership. A member reads a queue between the rebalance that assigned it and the one that revoked
it (or the member's crash or close). Within one such stretch its offsets only go up; two members own
one queue at once only while they disagree about the members (until each has heartbeated once after
a change, or a heartbeat call outlived a controller failover): a bounded time, after which two readers
mean every message of the queue is delivered twice forever.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any, Callable, Iterable, Mapping, Sequence

from rocketray.verify.fields import Ident, Number
from rocketray.verify.group_history import (Assignment, CommitRecord, ConsumerEvent, Delivery, ProgressRow,
                                            SampleRecord)
from rocketray.verify.history import OpRecord

__all__ = ["undelivered_payloads", "misplaced_deliveries", "conflicting_positions", "failed_but_delivered",
           "redelivered_payloads", "out_of_order", "unowned_deliveries", "shared_ownership", "rereads_below_commit",
           "pull_floors", "commit_regressions", "id_key"]

QueueKey = tuple[str, str, int]  # (consumer_group, topic, queue_id)


def id_key(value: Ident) -> tuple[str, str]:
    return (type(value).__name__, str(value))


def _where(d: Delivery) -> dict[str, Any]:
    return {"process": d.process, "topic": d.topic, "queue_id": d.queue_id, "queue_offset": d.queue_offset,
            "payload_id": d.payload_id, "poll": d.poll, "poll_start_ms": d.poll_start_ms}


# -- positions -------------------------------------------------------------------------------------

def undelivered_payloads(acked: Sequence[OpRecord], deliveries: Sequence[Delivery]) -> list[Ident]:
    """Acknowledged payloads the group never received at the queue and offset their send was
    acknowledged at (a send without a recorded offset: received anywhere), sorted."""
    at = {(d.queue_id, d.queue_offset, d.payload_id) for d in deliveries}
    anywhere = {d.payload_id for d in deliveries}
    missing = set()
    for op in acked:
        if (op.queue_id, op.queue_offset, op.payload_id) not in at and \
                (op.queue_offset is not None or op.payload_id not in anywhere):
            missing.add(op.payload_id)
    return sorted(missing, key=id_key)  # type: ignore[arg-type]


def misplaced_deliveries(acked: Sequence[OpRecord], deliveries: Sequence[Delivery]) -> list[dict[str, Any]]:
    """Deliveries at a position where another payload's send was acknowledged."""
    owner = {(op.queue_id, op.queue_offset): op.payload_id for op in acked if op.queue_offset is not None}
    return [{**_where(d), "acked_payload_id": owner[(d.queue_id, d.queue_offset)]} for d in deliveries
            if (d.queue_id, d.queue_offset) in owner and owner[(d.queue_id, d.queue_offset)] != d.payload_id]


def conflicting_positions(deliveries: Sequence[Delivery]) -> list[dict[str, Any]]:
    """Positions the group received two different payloads at."""
    seen: dict[tuple[str, int, int], set[Ident | None]] = defaultdict(set)
    for d in deliveries:
        seen[(d.topic, d.queue_id, d.queue_offset)].add(d.payload_id)
    return [{"topic": t, "queue_id": q, "queue_offset": o, "payload_ids": sorted(map(str, ps))}
            for (t, q, o), ps in sorted(seen.items()) if len(ps) > 1]


def failed_but_delivered(failed: Iterable[Ident], deliveries: Sequence[Delivery]) -> list[dict[str, Any]]:
    """Deliveries of payloads whose send was reported failed (SendFailed: nothing was written)."""
    failed_ids = set(failed)
    return [_where(d) for d in deliveries if d.payload_id in failed_ids]


def redelivered_payloads(deliveries: Sequence[Delivery]) -> dict[Ident, int]:
    """Payload id -> times delivered, for the payloads one group received more than once."""
    counts: dict[Ident, int] = defaultdict(int)
    for d in deliveries:
        if d.payload_id is not None:
            counts[d.payload_id] += 1
    return {p: n for p, n in counts.items() if n > 1}


# -- ownership -------------------------------------------------------------------------------------

def _events_by_queue(assignments: Sequence[Assignment]) -> dict[tuple[Ident, str, int], list[Assignment]]:
    out: dict[tuple[Ident, str, int], list[Assignment]] = defaultdict(list)
    for a in assignments:
        out[(a.process, a.topic, a.queue_id)].append(a)
    for rows in out.values():
        rows.sort(key=lambda a: a.poll)
    return out


def out_of_order(deliveries: Sequence[Delivery], assignments: Sequence[Assignment],
                 restarts: Callable[[tuple[Ident, str, int]], list[int]] = lambda key: []) -> list[dict[str, Any]]:
    """Deliveries whose offset is not above the previous one of the same member and queue since the
    queue was last assigned to that member, or since a poll ``restarts(key)`` names (the one after a
    seek), in the order the member received them."""
    assigned_polls = {k: sorted([a.poll for a in rows if a.event == "assigned"] + restarts(k))
                      for k, rows in _events_by_queue(assignments).items()}
    highest: dict[tuple[Ident, str, int, int], int] = {}
    out = []
    for d in deliveries:
        if d.poll is None:
            continue
        key = (d.process, d.topic, d.queue_id)
        polls = assigned_polls.get(key) or sorted(restarts(key))
        stretch = (d.process, d.topic, d.queue_id, bisect.bisect_right(polls, d.poll))
        previous = highest.get(stretch)
        if previous is not None and d.queue_offset <= previous:
            out.append({**_where(d), "previous_offset": previous})
        highest[stretch] = max(d.queue_offset, previous if previous is not None else -1)
    return out


def unowned_deliveries(deliveries: Sequence[Delivery], assignments: Sequence[Assignment]) -> list[dict[str, Any]]:
    """Deliveries of a queue the member did not own at that poll (its last assignment event for the
    queue at or before that poll is not ``assigned``)."""
    events = _events_by_queue(assignments)
    out = []
    for d in deliveries:
        if d.poll is None:
            continue
        rows = events.get((d.process, d.topic, d.queue_id), [])
        last = None
        for a in rows:
            if a.poll > d.poll:
                break
            last = a
        if last is None or last.event != "assigned":
            out.append(_where(d))
    return out


def _stretches(assignments: Sequence[Assignment], ends: Mapping[Ident, Number],
               history_end_ms: Number) -> dict[tuple[str, int], list[tuple[Number, Number, Ident]]]:
    """Per queue: (from, to, process) of every stretch a member owned it."""
    out: dict[tuple[str, int], list[tuple[Number, Number, Ident]]] = defaultdict(list)
    for (process, topic, queue_id), rows in _events_by_queue(assignments).items():
        start: Number | None = None
        for a in sorted(rows, key=lambda a: (a.poll, a.time_ms)):
            if a.event == "assigned" and start is None:
                start = a.time_ms
            elif a.event == "revoked" and start is not None:
                out[(topic, queue_id)].append((start, a.time_ms, process))
                start = None
        if start is not None:
            out[(topic, queue_id)].append((start, ends.get(process, history_end_ms), process))
    return out


def shared_ownership(assignments: Sequence[Assignment], events: Sequence[ConsumerEvent], allowance_ms: Number,
                     history_end_ms: Number) -> list[dict[str, Any]]:
    """Pairs of members that owned one queue at the same time for longer than ``allowance_ms``. A
    member's ownership ends at its revocation, else at its crash or close, else at the history's end."""
    ends: dict[Ident, Number] = {}
    for e in events:
        if e.event in ("crash", "close"):
            ends[e.process] = e.time_ms
    out = []
    for (topic, queue_id), stretches in sorted(_stretches(assignments, ends, history_end_ms).items()):
        stretches.sort(key=lambda s: s[0])
        for i, (a_from, a_to, a_process) in enumerate(stretches):
            for b_from, b_to, b_process in stretches[i + 1:]:
                if b_from >= a_to:
                    break
                overlap = min(a_to, b_to) - b_from
                if b_process != a_process and overlap > allowance_ms:
                    out.append({"topic": topic, "queue_id": queue_id, "processes": sorted(map(str, (a_process, b_process))),
                                "from_ms": b_from, "overlap_ms": overlap})
    return out


# -- commits ---------------------------------------------------------------------------------------

class AckedCommits:
    """Per (group, topic, queue): acknowledged commits in ``end_ms`` order with a running maximum,
    so "the highest offset acknowledged before time t" is one bisection.

    An admin's reset (``reset`` rows, ``rocketray.broker.offsets``) is the one allowed regression:
    an acknowledged reset sets the running value to its offset (commits after it raise it from
    there); a failed one may still have been written, at any time after it began, so from its
    ``start_ms`` on the bound is at most its offset. Nothing else lowers the bound."""

    def __init__(self, commits: Iterable[CommitRecord]) -> None:
        by_queue: dict[QueueKey, list[CommitRecord]] = defaultdict(list)
        self._failed_resets: dict[QueueKey, list[CommitRecord]] = defaultdict(list)
        for c in commits:
            if c.ok:
                by_queue[(c.consumer_group, c.topic, c.queue_id)].append(c)
            elif c.reset:
                self._failed_resets[(c.consumer_group, c.topic, c.queue_id)].append(c)
        self._ends: dict[QueueKey, list[Number]] = {}
        self._best: dict[QueueKey, list[CommitRecord]] = {}
        for key, rows in by_queue.items():
            rows.sort(key=lambda c: c.end_ms)
            best: list[CommitRecord] = []
            for c in rows:
                best.append(c if not best or c.reset or c.offset > best[-1].offset else best[-1])
            self._ends[key] = [c.end_ms for c in rows]
            self._best[key] = best

    def queues(self, consumer_group: str) -> list[tuple[str, int]]:
        return sorted((t, q) for g, t, q in self._ends if g == consumer_group)

    def highest_before(self, key: QueueKey, time_ms: Number) -> CommitRecord | None:
        """The row whose offset bounds the committed offset from below at ``time_ms``: the acknowledged
        commit of the highest offset among those that ended strictly before it (since the last
        acknowledged reset, which counts as one), or a failed reset begun before it, if lower."""
        ends = self._ends.get(key)
        if not ends:
            return None
        i = bisect.bisect_left(ends, time_ms)
        if not i:
            return None
        best = self._best[key][i - 1]
        lower = [r for r in self._failed_resets.get(key, ()) if r.start_ms < time_ms and r.offset < best.offset]
        return min(lower, key=lambda r: r.offset) if lower else best


def pull_floors(deliveries: Sequence[Delivery], assignments: Sequence[Assignment]) -> dict[int, Number]:
    """Per delivery (its index), the earliest time the pull that returned it can have been sent, where
    the member's assignment rows tell. A member keeps one pull in flight per queue, sends pulls at
    the start of a poll's wait, and a poll that took messages returns without sending another
    (``client/consumer.py`` ``poll``). So a delivery's pull was sent: no earlier than the member's
    latest assignment of the queue; in the delivery's own poll when the member took from that queue
    in the poll just before; else no earlier than the return of the last earlier poll that took from
    it. Deliveries whose member has no assignment of the queue before them have no floor."""
    assigned: dict[tuple[Ident, str, str, int], list[Number]] = defaultdict(list)
    for a in assignments:
        if a.event == "assigned":
            assigned[(a.process, a.consumer_group, a.topic, a.queue_id)].append(a.time_ms)
    for times in assigned.values():
        times.sort()
    last: dict[tuple[Ident, str, str, int], tuple[int | None, Number, Number, Number]] = {}  # poll, start, end, floor
    floors: dict[int, Number] = {}
    order = sorted(range(len(deliveries)), key=lambda i: (deliveries[i].poll_start_ms, deliveries[i].time_ms))
    for i in order:
        d = deliveries[i]
        key = (d.process, d.consumer_group, d.topic, d.queue_id)
        times = assigned.get(key, [])
        j = bisect.bisect_right(times, d.poll_start_ms)
        if not j:
            continue
        since = times[j - 1]
        prev = last.get(key)
        if prev is not None and prev[1] == d.poll_start_ms:
            floors[i] = prev[3]                        # the same poll's answer: the same pull
            continue
        if prev is None or prev[1] < since:
            floor = since                              # the first pull since the assignment
        elif d.poll is not None and prev[0] is not None and d.poll == prev[0] + 1:
            floor = d.poll_start_ms
        else:
            floor = max(since, prev[2])
        last[key] = (d.poll, d.poll_start_ms, d.time_ms, floor)
        floors[i] = floor
    return floors


def rereads_below_commit(deliveries: Sequence[Delivery], commits: Sequence[CommitRecord], poll_timeout_ms: Number,
                         slack_ms: Number, replayed: Callable[[Delivery], bool] = lambda d: False,
                         assignments: Sequence[Assignment] = ()) -> list[dict[str, Any]]:
    """Deliveries below a commit acknowledged more than ``poll_timeout_ms + slack_ms`` before their
    poll began and more than ``slack_ms`` before their pull can have been sent (``pull_floors``),
    but those ``replayed`` says a seek of their member explains. A pull sent before the commit was
    acknowledged may return below it: the new owner of a queue, whose pull went out at its
    assignment, while the previous owner, not yet told, still commits (the ownership overlap)."""
    acked = AckedCommits(commits)
    floors = pull_floors(deliveries, assignments)
    out = []
    for i, d in enumerate(deliveries):
        if replayed(d):
            continue
        cutoff = d.poll_start_ms - poll_timeout_ms - slack_ms
        if i in floors:
            cutoff = min(cutoff, floors[i] - slack_ms)
        c = acked.highest_before((d.consumer_group, d.topic, d.queue_id), cutoff)
        if c is not None and d.queue_offset < c.offset:
            out.append({**_where(d), "consumer_group": d.consumer_group, "commit_offset": c.offset,
                        "commit_process": c.process, "commit_end_ms": c.end_ms})
    return out


def commit_regressions(progress: Sequence[ProgressRow], samples: Sequence[SampleRecord],
                       commits: Sequence[CommitRecord],
                       queue_groups: Mapping[tuple[str, int], str]) -> tuple[int, int, list[dict]]:
    """(samples checked, samples whose master did not answer, every queue of a sample below an
    offset acknowledged before the sample began, or missing from it). A sample is one broker
    group's answer (``sample`` rows; ``queue_groups`` says which broker group holds each (topic, queue id)),
    or in runs without ``sample`` rows one row set covering every broker group."""
    acked = AckedCommits(commits)
    shown: dict[tuple[str, str | None, Number, Number], dict[tuple[str, int], int]] = defaultdict(dict)
    for row in progress:
        shown[(row.consumer_group, row.broker_group, row.start_ms, row.end_ms)][(row.topic, row.queue_id)] = row.committed
    checked: list[tuple[str, str | None, Number, Number]]
    if samples:
        checked = [(s.consumer_group, s.broker_group, s.start_ms, s.end_ms) for s in samples if s.ok]
    else:
        checked = list(shown)
    out = []
    for group, broker_group, start_ms, end_ms in sorted(checked, key=lambda k: (k[2], k[0], str(k[1]))):
        committed = shown.get((group, broker_group, start_ms, end_ms), {})
        for topic, queue_id in acked.queues(group):
            if samples and queue_groups.get((topic, queue_id)) != broker_group:
                continue
            c = acked.highest_before((group, topic, queue_id), start_ms)
            now = committed.get((topic, queue_id))
            if c is not None and (now is None or now < c.offset):
                out.append({"consumer_group": group, "broker_group": broker_group, "topic": topic,
                            "queue_id": queue_id, "committed": now, "acked_offset": c.offset, "acked_at_ms": c.end_ms,
                            "commit_process": c.process, "sample_start_ms": start_ms, "sample_end_ms": end_ms})
    return len(checked), sum(1 for s in samples if not s.ok), out
