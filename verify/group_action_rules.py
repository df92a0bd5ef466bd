"""The consumer-group checker's rules for nacks, tag filters, seeks, delayed sends and new queues, one
pure function each (``rocketray.verify.groups`` applies them per group). Inputs are one group's rows
(``rocketray.verify.group_history``, ``rocketray.verify.group_actions``) and the run's sends; no IO,
no clock.

Tags. The workload tags each payload by a pure function of its id (:func:`payload_tag`), so the
checker knows every send's tag without a column for it, and a group's subscription expression (its
``group`` row) says which payloads it must receive: every acknowledged one whose tag matches, and
none other (:func:`tag_matches`, RocketMQ's ``*`` or ``a || b``; an untagged message matches only
``*``).

Retries. An acknowledged nack's copy is a message of the retry topic (or, at ``max_deliveries``, of
the dead-letter topic, which the group does not read): the group must receive the copy (by its
``msg_id``) as delivery ``n + 1`` of the message first sent, ``origin_msg_id`` naming it. A nack that
raised leaves the message uncommitted, so the group must receive the payload again afterwards.

Seeks. After a member seeks an owned queue to ``s`` (after poll ``n``), its next delivery of that
queue, while it still owns it, is at ``s`` or, when a filter or an unacknowledged position lies
between, at the first acknowledged position at or after ``s`` that the group's filter matches, at
the latest; from then on its deliveries of the queue at or above ``s`` are a replay, not a re-read
below a commit (``rocketray.verify.group_rules.rereads_below_commit`` asks :func:`seek_explains`).
"""

from __future__ import annotations

import bisect
import zlib
from collections import defaultdict
from typing import Any, Iterable, Sequence

from rocketray.verify.fields import Ident, Number
from rocketray.verify.group_actions import DelayedSend, NackRecord, SeekRecord, TopicExtended
from rocketray.verify.group_history import Assignment, Delivery
from rocketray.verify.history import OpRecord

__all__ = ["TAGS", "payload_tag", "tag_matches", "filtered_out_deliveries", "wrong_tags", "lost_nacks",
           "wrong_copies", "misrouted_nacks", "unexplained_copies", "SeekIndex", "seeks_not_honoured",
           "new_queues_unread", "early_deliveries"]

#: The workload's tags; a payload is untagged or has one of these (:func:`payload_tag`).
TAGS = ("created", "paid", "refunded")


def payload_tag(payload_id: Ident | None) -> str | None:
    """The tag the workload sends payload ``payload_id`` with: None (a quarter) or one of :data:`TAGS`."""
    if payload_id is None:
        return None
    n = zlib.crc32(str(payload_id).encode()) % (len(TAGS) + 1)
    return TAGS[n - 1] if n else None


def tag_matches(expression: str, tag: str | None) -> bool:
    """Whether a message tagged ``tag`` matches a subscription ``expression`` (``*`` or ``a || b``)."""
    if expression.strip() == "*":
        return True
    return tag is not None and tag in {t.strip() for t in expression.split("||")}


def _where(d: Delivery) -> dict[str, Any]:
    return {"process": d.process, "topic": d.topic, "queue_id": d.queue_id, "queue_offset": d.queue_offset,
            "payload_id": d.payload_id, "msg_id": d.msg_id, "poll": d.poll, "time_ms": d.time_ms}


# -- filters ---------------------------------------------------------------------------------------

def filtered_out_deliveries(expression: str, deliveries: Iterable[Delivery]) -> list[dict[str, Any]]:
    """Deliveries of payloads whose tag the group's ``expression`` does not match."""
    return [{**_where(d), "tag": payload_tag(d.payload_id), "expression": expression} for d in deliveries
            if not tag_matches(expression, payload_tag(d.payload_id))]


def wrong_tags(deliveries: Iterable[Delivery]) -> list[dict[str, Any]]:
    """Deliveries whose tag is not the one the payload was sent with (only in runs that record tags:
    a delivery row with ``tags`` null of a tagged payload counts)."""
    return [{**_where(d), "tags": d.tags, "sent_tag": payload_tag(d.payload_id)} for d in deliveries
            if d.tags != payload_tag(d.payload_id)]


# -- nacks -----------------------------------------------------------------------------------------

def lost_nacks(nacks: Sequence[NackRecord], deliveries: Sequence[Delivery]) -> list[dict[str, Any]]:
    """Nacked messages the group did not get again: an acknowledged retry copy never delivered (by
    its ``msg_id``), or a nacked delivery never followed by an acknowledged nack whose payload was
    not delivered again after the nack. An acknowledged nack of the same message and delivery count
    by any member of the group settles it (two members owning one queue for a moment may both get
    the message; the copy the acknowledged nack made is judged by the first rule)."""
    got = {d.msg_id for d in deliveries}
    settled = {(n.msg_id, n.delivery_count) for n in nacks if n.ok}
    out = []
    for n in nacks:
        if n.ok:
            if not n.dead and n.copy_msg_id not in got:
                out.append({**n.to_json(), "why": "its retry copy was never delivered"})
        elif (n.msg_id, n.delivery_count) not in settled and not any(
                d.payload_id == n.payload_id and d.poll_start_ms > n.time_ms for d in deliveries):
            out.append({**n.to_json(), "why": "the nack failed and the message was not delivered again"})
    return out


def wrong_copies(nacks: Sequence[NackRecord], deliveries: Sequence[Delivery]) -> list[dict[str, Any]]:
    """Deliveries of an acknowledged copy that do not say what it copies: another payload, a
    delivery count other than the nacked one's plus one, an origin other than the first message."""
    by_copy = {n.copy_msg_id: n for n in nacks if n.ok and not n.dead}
    out = []
    for d in deliveries:
        n = by_copy.get(d.msg_id)
        if n is not None and (d.payload_id != n.payload_id or d.delivery_count != n.delivery_count + 1
                              or d.origin_msg_id != n.first_msg_id or d.topic != n.copy_topic):
            out.append({**_where(d), "delivery_count": d.delivery_count, "origin_msg_id": d.origin_msg_id,
                        "nack": n.to_json()})
    return out


def misrouted_nacks(nacks: Sequence[NackRecord], max_deliveries: int | None) -> list[dict[str, Any]]:
    """Acknowledged nacks whose copy went to the dead-letter topic before the ``max_deliveries``-th
    delivery, or to the retry topic at or after it."""
    if max_deliveries is None:
        return []
    return [{**n.to_json(), "max_deliveries": max_deliveries} for n in nacks
            if n.ok and n.dead != (n.delivery_count >= max_deliveries)]


def unexplained_copies(nacks: Sequence[NackRecord], deliveries: Sequence[Delivery]) -> list[dict[str, Any]]:
    """Copies delivered that no nack made: not an acknowledged nack's copy, and no nack of that
    payload's previous delivery raised (a nack that raised ``SendUnknown`` may have stored one)."""
    copies = {n.copy_msg_id for n in nacks if n.ok}
    tried = {(n.payload_id, n.delivery_count) for n in nacks if not n.ok}
    return [{**_where(d), "delivery_count": d.delivery_count, "origin_msg_id": d.origin_msg_id} for d in deliveries
            if d.is_copy and d.msg_id not in copies and (d.payload_id, d.delivery_count - 1) not in tried]


# -- seeks -----------------------------------------------------------------------------------------

Key = tuple[Ident, str, int]  # (process, topic, queue_id)


class SeekIndex:
    """A group's seeks and assignments by member and queue, to ask which deliveries a seek explains."""

    def __init__(self, seeks: Iterable[SeekRecord], assignments: Iterable[Assignment]) -> None:
        self.seeks: dict[Key, list[SeekRecord]] = defaultdict(list)
        for s in seeks:
            self.seeks[(s.process, s.topic, s.queue_id)].append(s)
        for rows in self.seeks.values():
            rows.sort(key=lambda s: s.poll)
        self.changes: dict[Key, list[int]] = defaultdict(list)  #: polls an assign row of the key happened in
        for a in assignments:
            self.changes[(a.process, a.topic, a.queue_id)].append(a.poll)
        for polls in self.changes.values():
            polls.sort()

    def boundaries(self, key: Key) -> list[int]:
        """Polls that begin a new run of increasing offsets: one after each seek."""
        return [s.poll + 1 for s in self.seeks.get(key, ())]

    def _owned_since(self, key: Key, after_poll: int, poll: int) -> bool:
        """No assignment change of ``key`` in polls ``(after_poll, poll]``."""
        polls = self.changes.get(key, [])
        return bisect.bisect_right(polls, poll) == bisect.bisect_right(polls, after_poll)

    def latest(self, d: Delivery) -> SeekRecord | None:
        """The member's last seek of the delivery's queue before its poll, if it still owned the queue since."""
        if d.poll is None:
            return None
        key = (d.process, d.topic, d.queue_id)
        before = [s for s in self.seeks.get(key, ()) if s.poll < d.poll]
        return before[-1] if before and self._owned_since(key, before[-1].poll, d.poll) else None

    def explains(self, d: Delivery) -> bool:
        """``d`` is part of a replay: its member sought the queue to at most its offset, since owning it."""
        s = self.latest(d)
        return s is not None and s.offset <= d.queue_offset


def seeks_not_honoured(index: SeekIndex, deliveries: Sequence[Delivery], acked: Sequence[OpRecord],
                       topic: str | None, expression: str) -> list[dict[str, Any]]:
    """Seeks whose member's next delivery of the queue (while it still owned it, before another seek)
    was below the sought offset, or above the first acknowledged position at or after it that the
    group's filter matches."""
    positions: dict[int, list[int]] = defaultdict(list)
    for op in acked:
        if op.queue_offset is not None and tag_matches(expression, payload_tag(op.payload_id)):
            positions[op.queue_id].append(op.queue_offset)
    for offsets in positions.values():
        offsets.sort()
    first: dict[tuple[Key, int], Delivery] = {}
    for d in deliveries:
        s = index.latest(d)
        if s is not None:
            first.setdefault(((d.process, d.topic, d.queue_id), s.poll), d)
    out = []
    for (key, poll), d in sorted(first.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        s = next(s for s in index.seeks[key] if s.poll == poll)
        at = positions.get(s.queue_id, []) if s.topic == topic else []
        i = bisect.bisect_left(at, s.offset)
        latest_ok = at[i] if i < len(at) else None
        if d.queue_offset < s.offset or (latest_ok is not None and d.queue_offset > latest_ok):
            out.append({**s.to_json(), "next_delivery": _where(d), "expected_at_most": latest_ok})
    return out


# -- new queues, delayed sends ---------------------------------------------------------------------

def new_queues_unread(extensions: Sequence[TopicExtended], assignments: Sequence[Assignment], bound_ms: Number,
                      history_end_ms: Number) -> list[dict[str, Any]]:
    """Queues an extension added that no member of the group was assigned within ``bound_ms`` of the
    extension (judged only when the history goes on that long)."""
    first: dict[tuple[str, int], Number] = {}
    for a in assignments:
        if a.event == "assigned":
            key = (a.topic, a.queue_id)
            first[key] = min(first.get(key, a.time_ms), a.time_ms)
    out = []
    for e in extensions:
        if history_end_ms < e.time_ms + bound_ms:
            continue
        for q in range(e.queues_before, e.queues):
            at = first.get((e.topic, q))
            if at is None or at > e.time_ms + bound_ms:
                out.append({"topic": e.topic, "queue_id": q, "extended_at_ms": e.time_ms, "first_assigned_ms": at,
                            "bound_ms": bound_ms})
    return out


def early_deliveries(delayed: Sequence[DelayedSend], deliveries: Iterable[Delivery], tolerance_ms: Number,
                     clocks_ahead: Sequence[tuple[Number, Number, Number]] = (),
                     lookback_ms: Number = 0) -> list[dict[str, Any]]:
    """Deliveries of a delayed payload (not a retry copy) that returned more than ``tolerance_ms``
    before its time, or that carry another ``msg_id`` than its send's. ``clocks_ahead`` are
    ``(start_ms, end_ms, ahead_ms)`` windows in which a broker's wall clock ran ``ahead_ms`` ahead:
    a delivery may come that much earlier when such a window meets ``[send time - lookback_ms,
    delivery time]`` (the master's scheduler follows its own clock)."""
    by_payload = {s.payload_id: s for s in delayed}
    out = []
    for d in deliveries:
        s = by_payload.get(d.payload_id)  # type: ignore[arg-type]
        if s is None or d.is_copy:
            continue
        ahead = max((a for start, end, a in clocks_ahead if start <= d.time_ms and end >= s.time_ms - lookback_ms),
                    default=0)
        if d.time_ms < s.deliver_at_ms - tolerance_ms - max(0, ahead) or d.msg_id != s.msg_id:
            out.append({**_where(d), "deliver_at_ms": s.deliver_at_ms, "sent_msg_id": s.msg_id,
                        "early_ms": s.deliver_at_ms - d.time_ms})
    return out
