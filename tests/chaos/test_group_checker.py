"""The consumer-group checker: each rule on a hand-made history that passes and one that fails, and the
group rows' run-directory format (round trip, strict lines).

The cases under "seeded bugs" are histories of a plausible client or broker bug that the checker
before these rules judged valid (checked by running the checker of 43e40ea on them): two members
reading one queue for good, a delivery at the wrong position, offsets going back within a member,
a failed send delivered, a declared group that recorded nothing, a drain that did not finish, and a
regression in a sample where another broker group did not answer."""

from __future__ import annotations

import json
from typing import Callable

import pytest

from rocketray.verify.checker import check, check_run_dir, format_verdict
from rocketray.verify.group_history import Delivery
from rocketray.verify.groups import POLL_TIMEOUT_MS, REREAD_SLACK_MS
from rocketray.verify.history import RunDirError
from rocketray.verify.run_dir import read_run_dir, write_run_dir
from tests.support.group_runs import NACK_ROW, Run

ALLOWANCE_MS = POLL_TIMEOUT_MS + REREAD_SLACK_MS


def delivered_everywhere(groups=("cg-0", "cg-1")) -> Run:
    """Three acked payloads in queue 0, each delivered once to every group."""
    r = Run()
    for i in range(3):
        r.send(f"p{i}", i, at=10 * i)
    for g in groups:
        r.consumer("start", group=g, process=f"{g}-c0-1")
        for i in range(3):
            r.deliver(f"p{i}", i, group=g, process=f"{g}-c0-1")
    return r


def owned_reading(offsets=(0, 1, 2)) -> Run:
    """Acked p0..p2 in queue 0; member c0-1 assigned queue 0 in poll 1 reads them, one per poll."""
    r = Run()
    for i in range(3):
        r.send(f"p{i}", i, at=10 * i)
    r.consumer("start", at=0).assign("assigned", poll=1, at=100)
    for poll, offset in enumerate(offsets, start=1):
        r.deliver(f"p{offset}", offset, poll=poll, poll_start=100 * poll)
    return r


def new_owner(assigned_at: float = 1000) -> Run:
    """Acked p0..p2 in queue 0, read by c0-1 (no assignment rows); c1-1 starts and is assigned queue 0
    in its poll 1 at ``assigned_at``."""
    r = delivered_everywhere(("cg-0",))
    return r.consumer("start", process="cg-0-c1-1", at=assigned_at).assign("assigned", poll=1, at=assigned_at,
                                                                           process="cg-0-c1-1")


def two_owners(overlap_end: float) -> Run:
    """Members c0-1 and c1-1 both own queue 0 from 100 ms; c0-1 gives it up at ``overlap_end``."""
    r = owned_reading()
    r.consumer("start", process="cg-0-c1-1", at=50).assign("assigned", poll=1, at=100, process="cg-0-c1-1")
    for i in range(3):
        r.deliver(f"p{i}", i, poll=i + 1, poll_start=100 * (i + 1), process="cg-0-c1-1")
    r.assign("revoked", poll=50, at=overlap_end)
    r.consumer("close", process="cg-0-c1-1", at=30_000)
    return r


def delivered_at(positions: dict[int, int]) -> Run:
    """p0..p2 acked at offsets 0..2 of queue 0; payload i delivered at ``positions[i]``."""
    r = Run()
    for i in range(3):
        r.send(f"p{i}", i, at=10 * i)
    for i, offset in positions.items():
        r.deliver(f"p{i}", offset)
    return r


# Each case: (name, history, the report field it exercises, its expected value in the named group,
# whether the whole verdict is valid).
Case = tuple[str, Callable[[], Run], str, str, int, bool]

CASES: list[Case] = [
    # (a) undelivered acknowledged messages
    ("every acked payload delivered to every group", lambda: delivered_everywhere(), "cg-1", "undelivered", 0, True),
    ("an acked payload one group never received", lambda: Run(delivered_everywhere().ops, [
        r for r in delivered_everywhere().rows if not (isinstance(r, Delivery) and r.consumer_group == "cg-1"
                                                     and r.payload_id == "p2")]), "cg-1", "undelivered", 1, False),
    ("unknown and failed sends need not be delivered",
     lambda: delivered_everywhere().send("u", None, outcome="unknown").send("f", None, outcome="failed"),
     "cg-0", "undelivered", 0, True),
    ("a corrupt delivery does not count as the payload's delivery", lambda: Run(delivered_everywhere(("cg-0",)).ops, [
        r for r in delivered_everywhere(("cg-0",)).rows if not (isinstance(r, Delivery) and r.payload_id == "p1")])
     .deliver("corrupt:p1", 1), "cg-0", "undelivered", 1, False),
    # corrupt deliveries
    ("a corrupt delivery fails the group", lambda: delivered_everywhere(("cg-0",)).deliver("corrupt:p1", 1),
     "cg-0", "corrupt", 1, False),
    # (b) redeliveries: reported, not a failure
    ("a payload delivered twice is a redelivery and allowed",
     lambda: delivered_everywhere().deliver("p1", 1, poll_start=900, process="cg-0-c1-1"), "cg-0", "redelivered", 1,
     True),
    ("no redelivery when each payload came once", lambda: delivered_everywhere(), "cg-0", "redelivered", 0, True),
    # (c) re-reads below an acknowledged commit
    ("a poll within the allowance after the ack may still return below it",
     lambda: delivered_everywhere(("cg-0",)).commit(3, end=1000).deliver("p1", 1, poll_start=1000 + ALLOWANCE_MS - 1),
     "cg-0", "rereads_below_commit", 0, True),
    ("a poll begun after the allowance returns below the acked commit",
     lambda: delivered_everywhere(("cg-0",)).commit(3, end=1000).deliver("p1", 1, poll_start=1000 + ALLOWANCE_MS + 1),
     "cg-0", "rereads_below_commit", 1, False),
    ("reading at the acked offset or above is fine",
     lambda: delivered_everywhere(("cg-0",)).send("p3", 3).commit(3, end=1000).deliver("p3", 3, poll_start=9000),
     "cg-0", "rereads_below_commit", 0, True),
    ("a failed commit makes no promise",
     lambda: delivered_everywhere(("cg-0",)).commit(3, end=1000, outcome="failed").deliver("p1", 1, poll_start=9000),
     "cg-0", "rereads_below_commit", 0, True),
    ("another group's commit does not bind this group",
     lambda: delivered_everywhere().commit(3, end=1000, group="cg-1", process="cg-1-c0-1").deliver("p1", 1,
                                                                                                   poll_start=9000),
     "cg-0", "rereads_below_commit", 0, True),
    ("another queue's commit does not bind this queue",
     lambda: delivered_everywhere(("cg-0",)).commit(3, end=1000, queue_id=1).deliver("p1", 1, poll_start=9000),
     "cg-0", "rereads_below_commit", 0, True),
    ("a commit by another member binds the whole group",
     lambda: delivered_everywhere(("cg-0",)).commit(3, end=1000, process="cg-0-c1-1").deliver(
         "p1", 1, poll_start=9000, process="cg-0-c0-2"), "cg-0", "rereads_below_commit", 1, False),
    # (d) committed offsets that went backwards
    ("a sample after the ack shows the acked offset or more",
     lambda: delivered_everywhere(("cg-0",)).commit(3, end=1000).progress({0: 3}, start=1001), "cg-0",
     "commit_regressions", 0, True),
    ("a sample after the ack shows less than the acked offset",
     lambda: delivered_everywhere(("cg-0",)).commit(3, end=1000).progress({0: 2}, start=1001), "cg-0",
     "commit_regressions", 1, False),
    ("a sample after the ack no longer lists the queue",
     lambda: delivered_everywhere(("cg-0",)).commit(3, end=1000, queue_id=1).progress({0: 3}, start=1001),
     "cg-0", "commit_regressions", 1, False),
    ("a sample begun before the ack may show the older offset",
     lambda: delivered_everywhere(("cg-0",)).commit(2, end=500).commit(3, end=1000).progress({0: 2}, start=999),
     "cg-0", "commit_regressions", 0, True),
    ("the highest acked offset counts, not the latest",
     lambda: delivered_everywhere(("cg-0",)).commit(3, end=500).commit(2, end=1000).progress({0: 2}, start=2000),
     "cg-0", "commit_regressions", 1, False),
    # an admin's reset of the stopped group: the one allowed regression
    ("an acknowledged reset moves the bound back: a sample after it shows the reset offset",
     lambda: delivered_everywhere(("cg-0",)).commit(3, end=500).commit(0, end=1000, process="admin", reset=True)
     .progress({0: 0}, start=1001), "cg-0", "commit_regressions", 0, True),
    ("commits after a reset raise the bound from the reset's offset",
     lambda: delivered_everywhere(("cg-0",)).commit(3, end=500).commit(0, end=1000, process="admin", reset=True)
     .commit(2, end=1500).progress({0: 1}, start=1501), "cg-0", "commit_regressions", 1, False),
    ("a sample begun before the reset was acknowledged may not go back",
     lambda: delivered_everywhere(("cg-0",)).commit(3, end=500).commit(0, end=1000, process="admin", reset=True)
     .progress({0: 0}, start=900), "cg-0", "commit_regressions", 1, False),
    ("a failed reset may have been written: from its start the bound is at most its offset",
     lambda: delivered_everywhere(("cg-0",)).commit(3, end=500).commit(1, end=1000, process="admin", reset=True,
                                                                       outcome="failed")
     .progress({0: 1}, start=1001), "cg-0", "commit_regressions", 0, True),
    ("a failed ordinary commit lowers nothing",
     lambda: delivered_everywhere(("cg-0",)).commit(3, end=500).commit(1, end=1000, outcome="failed")
     .progress({0: 1}, start=1001), "cg-0", "commit_regressions", 1, False),
    # the 30-minute soak of seed 1 (2026-11-28): c1-17 was assigned queue 5 and sent its pull at once; the
    # previous owner, not yet told (the controller leader had just been killed), committed 14400; the
    # answer, from 14390, waited for c1-17's next poll 2.8 s later
    ("a new owner's first pull, sent at its assignment, may return below the previous owner's later commit",
     lambda: new_owner().commit(3, end=1700).deliver("p1", 1, poll=2, poll_start=4200, process="cg-0-c1-1"),
     "cg-0", "rereads_below_commit", 0, True),
    ("a commit acknowledged before the new owner's assignment binds its first pull",
     lambda: new_owner(assigned_at=5000).commit(3, end=1000).deliver("p1", 1, poll=2, poll_start=8000,
                                                                     process="cg-0-c1-1"),
     "cg-0", "rereads_below_commit", 1, False),
    ("a pull sent in the poll after the one that took from the queue is bound by commits before that poll",
     lambda: new_owner().commit(3, end=1700).deliver("p0", 0, poll=2, poll_start=4000, process="cg-0-c1-1")
     .deliver("p1", 1, poll=3, poll_start=9000, process="cg-0-c1-1"), "cg-0", "rereads_below_commit", 1, False),
    ("rereads after an acknowledged reset to 0 are a replay, not a reread below a commit",
     lambda: delivered_everywhere(("cg-0",)).commit(3, end=1000).commit(0, end=2000, process="admin", reset=True)
     .deliver("p1", 1, poll_start=9000, process="cg-0-c0-2"), "cg-0", "rereads_below_commit", 0, True),
    # -- seeded bugs (each passed the checker of 43e40ea) ---------------------------------------------
    # bounded redeliveries: two members reading one queue for good
    ("two members own one queue for 20 s and both read every message", lambda: two_owners(overlap_end=20_000),
     "cg-0", "shared_ownership", 1, False),
    ("a member hands a queue over within the allowance", lambda: two_owners(overlap_end=3_000),
     "cg-0", "shared_ownership", 0, True),
    ("a member reads a queue it was never assigned", lambda: owned_reading().deliver(
        "p1", 1, process="cg-0-c1-1", poll=1, poll_start=500), "cg-0", "unowned", 1, False),
    ("a member reads a queue after it was revoked", lambda: owned_reading().assign(
        "revoked", poll=4, at=400).deliver("p2", 2, poll=4, poll_start=400), "cg-0", "unowned", 1, False),
    # deliveries matched to the position their send was acknowledged at
    ("a payload received only at another position than its ack", lambda: delivered_at({0: 0, 1: 1, 2: 5}),
     "cg-0", "undelivered", 1, False),
    ("a payload received where another one was acknowledged", lambda: delivered_at({0: 0, 1: 2, 2: 2}),
     "cg-0", "misplaced", 2, False),
    ("a second copy at an unacknowledged position is allowed", lambda: delivered_at({0: 0, 1: 1, 2: 2}).deliver(
        "p1", 7, poll_start=900, process="cg-0-c1-1"), "cg-0", "misplaced", 0, True),
    # order within a queue
    ("offsets go back within one member's ownership", lambda: owned_reading([0, 2, 1]),
     "cg-0", "out_of_order", 1, False),
    ("offsets go back after the queue was assigned again", lambda: owned_reading().assign(
        "revoked", poll=4, at=400).assign("assigned", poll=6, at=600).deliver("p1", 1, poll=6, poll_start=600),
     "cg-0", "out_of_order", 0, True),
    # deliveries of failed sends
    ("a send reported failed is delivered", lambda: delivered_everywhere(("cg-0",)).send(
        "f", None, outcome="failed").deliver("f", 3, poll_start=900), "cg-0", "failed_delivered", 1, False),
    # a declared group with no rows, and the drain
    ("a declared group that recorded nothing", lambda: delivered_everywhere(("cg-0",)).declare("cg-1"),
     "cg-1", "undelivered", 3, False),
    ("a drain that did not finish fails the group", lambda: delivered_everywhere(("cg-0",)).declare(drained=False),
     "cg-0", "drained", False, False),
    ("a drain that was never recorded fails the group", lambda: delivered_everywhere(("cg-0",)).declare(drained=None),
     "cg-0", "drained", False, False),
    ("a finished drain", lambda: delivered_everywhere(("cg-0",)).declare(), "cg-0", "drained", True, True),
    # commit regressions: one broker group's answer is a sample even when another did not answer
    ("a regression in a sample whose other broker group did not answer",
     lambda: delivered_everywhere(("cg-0",)).commit(3, end=1000).sample("broker-a", {0: 1}, start=2000)
     .sample("broker-b", None, start=2000), "cg-0", "commit_regressions", 1, False),
    ("an unanswered broker group is not a vanished queue",
     lambda: delivered_everywhere(("cg-0",)).commit(3, end=1000).sample("broker-a", None, start=2000),
     "cg-0", "commit_regressions", 0, True),

]


@pytest.mark.parametrize("name,build,group,key,expected,valid", CASES, ids=[c[0] for c in CASES])
def test_group_rule(name, build, group, key, expected, valid):
    """Each rule on a history that passes and one that fails (see the case's name)."""
    verdict = check(build().data())
    report = {g.consumer_group: g for g in verdict.groups}[group]
    assert getattr(report, key) == expected, (name, report)
    assert verdict.valid is valid, (name, verdict.to_json()["consumer_groups"])


def test_reports_count_consumers_commits_and_samples():
    """The report's counters: consumers started/crashed/closed, commits ok/failed, progress samples."""
    r = delivered_everywhere(("cg-0",)).consumer("crash", at=50).consumer("start", process="cg-0-c0-2", at=60)
    r.consumer("close", process="cg-0-c0-2", at=70).commit(3, end=100).commit(3, end=200, outcome="failed")
    r.progress({0: 3}, start=300).progress({0: 3}, start=800)
    g = check(r.data()).groups[0]
    assert (g.consumers_started, g.consumers_crashed, g.consumers_closed) == (2, 1, 1)
    assert (g.commits_ok, g.commits_failed, g.progress_samples, g.deliveries, g.acked) == (1, 1, 2, 3, 3)


def test_no_group_rows_no_group_report():
    """With the consumer-group workload off the verdict has no group reports and the old rules decide."""
    r = Run().send("p0", 0)
    verdict = check(r.data())
    assert verdict.groups == () and verdict.to_json()["consumer_groups"] == {}


def test_verdict_json_and_text_carry_the_group_report():
    """to_json() has a report per group under consumer_groups; the text names a failing group."""
    bad = delivered_everywhere(("cg-0",)).commit(3, end=1000).progress({0: 1}, start=2000)
    out = check(bad.data()).to_json()
    assert out["valid"] is False and out["consumer_groups"]["cg-0"]["commit_regressions"] == 1
    assert out["consumer_groups"]["cg-0"]["examples"]["commit_regressions"][0]["acked_offset"] == 3
    json.dumps(out)
    text = format_verdict(check(bad.data()))
    assert "consumer group cg-0 broke at-least-once" in text and "group cg-0: INVALID" in text


def test_group_rows_round_trip_through_the_run_directory(tmp_path):
    """write_run_dir then read_run_dir gives back every group row; the file holds the contract's keys."""
    r = delivered_everywhere().commit(3, end=1000).progress({0: 3}, start=1001).consumer("crash", at=5)
    run = r.data()
    write_run_dir(tmp_path / "run", run)
    assert read_run_dir(tmp_path / "run") == run
    rows = [json.loads(line) for line in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
    by_f = {row["f"]: set(row) for row in rows}
    assert by_f["deliver"] == {"f", "process", "consumer_group", "topic", "queue_id", "queue_offset", "payload_id",
                               "msg_id", "poll_start_ms", "time_ms", "poll", "tags", "delivery_count", "origin_topic",
                               "origin_queue_id", "origin_queue_offset", "origin_msg_id", "deliver_at_ms"}
    assert by_f["commit"] == {"f", "process", "consumer_group", "topic", "queue_id", "offset", "outcome", "start_ms",
                              "end_ms"}
    assert by_f["progress"] == {"f", "consumer_group", "broker_group", "topic", "queue_id", "committed", "max_offset",
                                "start_ms", "end_ms"}
    assert by_f["consumer"] == {"f", "process", "consumer_group", "event", "time_ms"}
    assert check_run_dir(tmp_path / "run").valid


@pytest.mark.parametrize("line,reason", [
    ({"f": "commit", "process": "c", "consumer_group": "g", "topic": "t", "queue_id": 0, "offset": 1,
      "outcome": "unknown", "start_ms": 1, "end_ms": 2}, "outcome"),
    ({"f": "deliver", "process": "c", "consumer_group": "g", "topic": "t", "queue_id": 0, "queue_offset": 1,
      "payload_id": "p", "msg_id": "m", "poll_start_ms": 5, "time_ms": 2}, "before poll_start_ms"),
    ({"f": "consumer", "process": "c", "consumer_group": "g", "event": "vanish", "time_ms": 2}, "event"),
    ({"f": "progress", "consumer_group": "g", "topic": "t", "queue_id": 0, "max_offset": 3, "start_ms": 1,
      "end_ms": 2}, "committed"),
    ({"f": "rebalance", "time_ms": 2}, "'f' must be one of"),
    ({**NACK_ROW, "outcome": "maybe"}, "outcome"),
    ({**NACK_ROW, "copy_msg_id": None}, "copy_topic and copy_msg_id exactly when"),
    ({**NACK_ROW, "outcome": "failed"}, "copy_topic and copy_msg_id exactly when"),
    ({**NACK_ROW, "delivery_count": 0}, "delivery_count"),
    ({"f": "seek", "process": "c", "consumer_group": "g", "topic": "t", "queue_id": 0, "offset": -1,
      "from_offset": None, "poll": 1, "time_ms": 2}, "offset"),
    ({"f": "delayed", "process": "p", "payload_id": "x", "msg_id": "m", "time_ms": 2}, "deliver_at_ms"),
    ({"f": "extend", "topic": "t", "queues_before": 4, "queues": 4, "time_ms": 2}, "adds queues"),
])
def test_a_malformed_group_row_is_named_by_file_and_line(tmp_path, line, reason):
    """A bad consumer-group line fails the read with history.jsonl:<line> and the reason."""
    good = {"op_id": 1, "process": "p", "f": "send", "group": "broker-a", "queue_id": 0, "payload_id": "x",
            "queue_offset": 0, "physical_offset": None, "start_ms": 0, "end_ms": 1, "outcome": "ok"}
    (tmp_path / "history.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(RunDirError, match=reason) as exc:
        read_run_dir(tmp_path)
    assert exc.value.file == "history.jsonl" and exc.value.line == 2
