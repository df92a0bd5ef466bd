"""The consumer-group checker's rules for nacks, tag filters, seeks, a topic's extension and delayed
sends (verify/group_action_rules.py), each on a hand-made history that passes and one that fails.

The cases marked "seeded bug" are histories of a plausible client or broker bug that the checker
before these rules (1db9fd4) judged valid, checked by reading them with it: a nacked message's copy
lost, a nack that failed and was never redelivered, a copy under the wrong delivery count, a dead
letter before max_deliveries, a copy nobody nacked, a filter the broker ignored, a tag lost on the
way, a seek the client ignored, a new queue nobody reads for a long time, a delayed message
delivered early or under another msg id, and a delayed message delivered only as another topic's
message. The cases marked "false alarm" are correct histories the old checker failed (a copy at a
position of the run's topic, a replay after a seek)."""

from __future__ import annotations

import json
from typing import Callable

import pytest

from rocketray.verify.checker import check, check_run_dir
from rocketray.verify.group_action_rules import TAGS, payload_tag, tag_matches
from rocketray.verify.group_actions import NackRecord, TopicExtended
from rocketray.verify.groups import NEW_QUEUE_BOUND_MS, POLL_TIMEOUT_MS, REREAD_SLACK_MS
from rocketray.verify.run_dir import read_run_dir, write_run_dir
from tests.support.group_runs import NACK_ROW, TOPIC, Run

RETRY = "%RETRY%cg-0"
LATE_MS = POLL_TIMEOUT_MS + REREAD_SLACK_MS + 1000


def pids(tag: str | None, n: int, start: int = 0) -> list[str]:
    """``n`` payload ids the workload sends with ``tag``."""
    out, i = [], start
    while len(out) < n:
        if payload_tag(f"p{i}") == tag:
            out.append(f"p{i}")
        i += 1
    return out


# -- filters ---------------------------------------------------------------------------------------

def filtered(expression: str = "paid || refunded", deliver_unwanted: bool = False, lose_tag: bool = False) -> Run:
    """Two "paid" and two "created" payloads acked in queue 0; group cg-0 subscribes ``expression``
    and receives what it matches (``deliver_unwanted``: everything)."""
    paid, created = pids("paid", 2), pids("created", 2)
    r = Run().declare(tags=expression)
    for offset, pid in enumerate([paid[0], created[0], paid[1], created[1]]):
        r.send(pid, offset)
        if tag_matches(expression, payload_tag(pid)) or deliver_unwanted:
            r.deliver(pid, offset, tags=None if lose_tag else payload_tag(pid))
    return r


# -- nacks -----------------------------------------------------------------------------------------

def nacked(copy_delivered: bool = True, count: int = 2, origin: str | None = "MSG0", copy_offset: int = 1) -> Run:
    """p0, p1 acked at offsets 0, 1 and delivered; p0 nacked (copy C1 in the retry topic, queue 0
    offset ``copy_offset``: by default the same numbers as p1's position in the run's topic), the
    copy delivered."""
    r = Run().declare(max_deliveries=3).send("p0", 0).send("p1", 1).deliver("p0", 0).deliver("p1", 1)
    r.nack("p0", 0, copy="C1")
    if copy_delivered:
        r.deliver("p0", copy_offset, topic=RETRY, msg_id="C1", poll_start=400, delivery_count=count, origin_topic=TOPIC,
                  origin_queue_id=0, origin_queue_offset=0, origin_msg_id=origin)
    return r


def failed_nack(redelivered: bool) -> Run:
    r = Run().declare().send("p0", 0).deliver("p0", 0).nack("p0", 0, copy=None, outcome="unknown", at=200)
    if redelivered:
        r.deliver("p0", 0, poll_start=300, process="cg-0-c1-1")
    return r


def nacked_then_failed_elsewhere() -> Run:
    """p0 nacked ok by c0-1 and its copy delivered; c1-1, owning the queue for a while too, got p0
    again and its nack of it failed (``unknown``); nothing delivers p0 after that."""
    return nacked().deliver("p0", 0, poll_start=450, process="cg-0-c1-1").nack(
        "p0", 0, copy=None, outcome="unknown", at=500, process="cg-0-c1-1")


# -- seeks -----------------------------------------------------------------------------------------

def replay(seek_to: int | None, next_offsets: tuple[int, ...] = (1, 2)) -> Run:
    """Member c0-1 owns queue 0, reads p0..p2 in polls 1-3, commits 3 (acked at 1000), seeks to
    ``seek_to`` after poll 3 (None: no seek), then reads ``next_offsets`` in polls 4, 5 long after."""
    r = Run().declare()
    for i in range(3):
        r.send(f"p{i}", i)
    r.consumer("start").assign("assigned", poll=1, at=50)
    for poll in range(1, 4):
        r.deliver(f"p{poll - 1}", poll - 1, poll=poll, poll_start=100 * poll)
    r.commit(3, end=1000)
    if seek_to is not None:
        r.seek(seek_to, poll=3, at=1001)
    for poll, offset in enumerate(next_offsets, start=4):
        r.deliver(f"p{offset}", offset, poll=poll, poll_start=1000 + LATE_MS * poll)
    return r


# -- new queues and delayed sends ------------------------------------------------------------------

def extended(first_assigned_ms: float) -> Run:
    """The topic goes from 1 to 2 queues at 1000; queue 1 is first assigned at ``first_assigned_ms``;
    its one acked message is delivered then; the history goes on to 60 s."""
    r = Run().declare().send("p0", 0).send("p1", 0, queue_id=1, at=1500)
    r.consumer("start").assign("assigned", poll=1, at=50).deliver("p0", 0, poll=1)
    r.extend(1, 2, at=1000)
    r.assign("assigned", poll=2, at=first_assigned_ms, queue_id=1)
    r.deliver("p1", 0, queue_id=1, poll=2, poll_start=first_assigned_ms + 1)
    r.consumer("close", at=60_000)
    return r


def delayed(delivered_at: float | None, *, msg_id: str = "D0", topic: str = TOPIC) -> Run:
    """p0 sent with a delay to 5000 (its send acked without a queue offset, msg id D0), delivered
    at ``delivered_at`` (the poll's return) at offset 7, or not at all."""
    r = Run().declare().send("p0", None, at=100).delayed("p0", "D0", 5000, at=105)
    if delivered_at is not None:
        r.deliver("p0", 7, poll_start=delivered_at - 10, msg_id=msg_id, topic=topic, deliver_at_ms=5000)
    return r


Case = tuple[str, Callable[[], Run], str, int, bool]

CASES: list[Case] = [
    # filters
    ("a filtered group receives exactly the matching payloads", lambda: filtered(), "filtered_delivered", 0, True),
    ("a filtered group need not receive what its filter skips", lambda: filtered(), "undelivered", 0, True),
    ("seeded bug: the broker ignores the filter", lambda: filtered(deliver_unwanted=True), "filtered_delivered", 2,
     False),
    ("seeded bug: the tag is lost on the way", lambda: filtered("*", lose_tag=True), "wrong_tags", 4, False),
    ("a filtered group that misses a matching payload", lambda: Run(filtered().ops, filtered().rows[:-1]),
     "undelivered", 1, False),
    # nacks
    ("a nacked message's copy delivered as delivery 2 naming its origin", lambda: nacked(), "nacks_lost", 0, True),
    ("false alarm: a copy at numbers an acked send holds in the run's topic is not misplaced", lambda: nacked(),
     "misplaced", 0, True),
    ("seeded bug: the retry copy is never delivered", lambda: nacked(copy_delivered=False), "nacks_lost", 1, False),
    ("seeded bug: a failed nack's message is never delivered again", lambda: failed_nack(False), "nacks_lost", 1,
     False),
    ("a failed nack's message delivered again", lambda: failed_nack(True), "nacks_lost", 0, True),
    ("false alarm: a failed nack of a message another member nacked (its copy delivered)",
     nacked_then_failed_elsewhere, "nacks_lost", 0, True),
    ("seeded bug: the copy comes back as a first delivery", lambda: nacked(count=1, copy_offset=5), "wrong_copies", 1, False),
    ("seeded bug: the copy names no origin", lambda: nacked(origin=None, copy_offset=5), "wrong_copies", 1, False),
    ("seeded bug: a dead letter at the first delivery (max 3)",
     lambda: Run().declare(max_deliveries=3).send("p0", 0).deliver("p0", 0).nack("p0", 0, copy="C1",
                                                                                 copy_topic="%DLQ%cg-0"),
     "nacks_misrouted", 1, False),
    ("a dead letter at the third delivery (max 3) is not delivered to the group",
     lambda: Run().declare(max_deliveries=3).send("p0", 0).deliver("p0", 0).nack(
         "p0", 0, copy="C9", count=3, copy_topic="%DLQ%cg-0", origin="MSG0", msg_id="C2"), "nacks_lost", 0, True),
    ("seeded bug: a retry after the last delivery (max 3)",
     lambda: Run().declare(max_deliveries=3).send("p0", 0).deliver("p0", 0).nack("p0", 0, copy="C9", count=3),
     "nacks_misrouted", 1, False),
    ("seeded bug: a copy nobody nacked",
     lambda: Run().declare().send("p0", 0).deliver("p0", 0).deliver(
         "p0", 0, topic=RETRY, msg_id="C1", delivery_count=2, origin_topic=TOPIC, origin_queue_id=0,
         origin_queue_offset=0, origin_msg_id="MSG0"), "unexplained_copies", 1, False),
    # seeks
    ("false alarm: a replay after a seek is no re-read below the commit", lambda: replay(1), "rereads_below_commit",
     0, True),
    ("a replay after a seek is in order", lambda: replay(1), "out_of_order", 0, True),
    ("a re-read below the commit that no seek explains", lambda: replay(None), "rereads_below_commit", 2, False),
    ("a seek explains nothing below its own offset", lambda: replay(2, (2, 1)), "rereads_below_commit", 1, False),
    ("a seek followed by no delivery of its queue judges nothing", lambda: replay(0, ()), "seeks_not_honoured", 0,
     True),
    ("seeded bug: after a seek to 0 the member goes on from 3",
     lambda: replay(0, ()).send("p3", 3).deliver("p3", 3, poll=4, poll_start=9000), "seeks_not_honoured", 1, False),
    ("after a seek to 1 the member reads from 2", lambda: replay(1, (2,)), "seeks_not_honoured", 1, False),
    # new queues
    ("a new queue assigned soon after the extension", lambda: extended(3000), "new_queues_unread", 0, True),
    ("seeded bug: a running group reads a new queue only after a membership change 40 s later",
     lambda: extended(41_000), "new_queues_unread", 1, False),
    # delayed sends
    ("a delayed message delivered after its time, matched by payload", lambda: delayed(5200), "delayed_early", 0,
     True),
    ("a delayed message delivered after its time is delivered", lambda: delayed(5200), "undelivered", 0, True),
    ("seeded bug: a delayed message delivered early", lambda: delayed(3000), "delayed_early", 1, False),
    ("seeded bug: a delayed message delivered under another msg id", lambda: delayed(5200, msg_id="X"),
     "delayed_early", 1, False),
    ("a delayed message never delivered", lambda: delayed(None), "undelivered", 1, False),
    ("seeded bug: a delayed message delivered only in another topic", lambda: delayed(5200, topic=RETRY),
     "undelivered", 1, False),
]


@pytest.mark.parametrize("name,build,key,expected,valid", CASES, ids=[c[0] for c in CASES])
def test_action_rule(name, build, key, expected, valid):
    verdict = check(build().data())
    (report,) = verdict.groups
    assert getattr(report, key) == expected, report.to_json()
    assert report.valid is valid and verdict.valid is valid, report.to_json()


def test_tags_and_expressions():
    """The workload's tags cover every kind (untagged too); expressions match as RocketMQ's do."""
    assert {payload_tag(f"producer-0-{i:08d}") for i in range(200)} == {None, *TAGS}
    assert tag_matches("*", None) and tag_matches(" * ", "paid")
    assert tag_matches("paid || refunded", "refunded") and not tag_matches("paid || refunded", "created")
    assert not tag_matches("paid", None)


def test_reports_count_nacks_seeks_copies_and_delays():
    (report,) = check(nacked().data()).groups
    assert (report.nacks_ok, report.nacks_failed, report.copies_delivered, report.dead_lettered) == (1, 0, 1, 0)
    (report,) = check(replay(1).data()).groups
    assert report.seeks == 1
    (report,) = check(delayed(5200).data()).groups
    assert report.delayed_delivered == 1
    (report,) = check(filtered().data()).groups
    assert report.expression == "paid || refunded" and report.acked == 2


def test_new_queue_rule_waits_for_the_bound():
    """An extension less than the bound before the history ends is not judged yet."""
    r = extended(41_000)
    r.rows = [row for row in r.rows if not (hasattr(row, "event") and row.event == "close")]
    r.rows = [TopicExtended(TOPIC, 1, 2, 41_000 - NEW_QUEUE_BOUND_MS + 20) if isinstance(row, TopicExtended) else row
              for row in r.rows]
    (report,) = check(r.data()).groups
    assert report.new_queues_unread == 0, report.to_json()


def test_action_rows_round_trip_through_the_run_directory(tmp_path):
    run = nacked().seek(0, poll=2).delayed("p1", "MSG1", 50).extend(1, 2, at=70).data()
    write_run_dir(tmp_path / "run", run)
    assert read_run_dir(tmp_path / "run") == run
    rows = [json.loads(line) for line in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
    by_f = {row["f"]: set(row) for row in rows}
    assert by_f["nack"] == {"f", "process", "consumer_group", "topic", "queue_id", "queue_offset", "payload_id",
                            "msg_id", "origin_msg_id", "delivery_count", "outcome", "copy_topic", "copy_queue_id",
                            "copy_msg_id", "time_ms"}
    assert by_f["seek"] == {"f", "process", "consumer_group", "topic", "queue_id", "offset", "from_offset", "poll",
                            "time_ms"}
    assert by_f["delayed"] == {"f", "process", "payload_id", "msg_id", "deliver_at_ms", "time_ms"}
    assert by_f["extend"] == {"f", "topic", "queues_before", "queues", "time_ms"}
    assert by_f["group"] >= {"tags", "max_deliveries"}
    assert check_run_dir(tmp_path / "run").valid


def test_a_nack_record_names_the_first_message():
    n = NackRecord.from_json({**NACK_ROW, "origin_msg_id": "m0"})
    assert n.first_msg_id == "m0" and not n.dead and n.ok
