"""Consumer-group lag over time and redeliveries around failovers, on constructed rows with known
answers (real Spark on Ray via RayDP)."""

from __future__ import annotations

import pytest

from rocketray.spark_on_ray import consumer_groups as cg

pytestmark = pytest.mark.slow


def rows(df, *cols):
    return [tuple(r[c] for c in cols) for r in df.collect()]


def progress(group, queue, committed, max_offset, end_ms, topic="T"):
    return {"f": "progress", "consumer_group": group, "topic": topic, "queue_id": queue, "committed": committed,
            "max_offset": max_offset, "start_ms": end_ms - 5, "end_ms": end_ms}


def deliver(group, payload, time_ms, queue_offset=0, process="c-1"):
    return {"f": "deliver", "process": process, "consumer_group": group, "topic": "T", "queue_id": 0,
            "queue_offset": queue_offset, "payload_id": payload, "msg_id": f"M-{payload}-{time_ms}",
            "poll_start_ms": time_ms - 10, "time_ms": time_ms}


def kill(time_ms, target, kind="kill-master", phase="start"):
    return {"time_ms": time_ms, "kind": kind, "phase": phase, "target": target, "group": target.split("/")[0]}


def test_consumer_lag_sums_each_queues_latest_sample_per_bucket_and_carries_unsampled_queues(frame):
    # billing, 1 s buckets. Bucket 0: q0 sampled twice (lag 10 at 100 ms, then 8 at 600 ms: the
    # latest counts) and q1 once (5) -> 13. Bucket 1000: only q0 answered (0); q1 keeps its 5 and is
    # stale -> 5. Bucket 2000: q1 answered (0), q0 keeps 0 (stale), and q2 is sampled for the first
    # time (3) -> 3 over 3 queues. A queue never counts before its first sample. audit: two queues
    # (q1's committed offset above its max, a sample taken across a commit, is lag 0) -> 12 in bucket
    # 2000; no sample lands in bucket 3000 (a failover): both queues carried, both stale; in 4000 q0
    # is caught up (0) and q1 still carried.
    p = frame("consumer_progress", [
        progress("billing", 0, 0, 10, 100), progress("billing", 1, 0, 5, 100), progress("billing", 0, 4, 12, 600),
        progress("billing", 0, 12, 12, 1500),
        progress("billing", 1, 9, 9, 2100), progress("billing", 2, 1, 4, 2200),
        progress("audit", 0, 0, 12, 2500), progress("audit", 1, 20, 18, 2600), progress("audit", 0, 12, 12, 4100),
    ])
    lag = cg.consumer_lag(p, bucket_ms=1000)
    assert rows(lag, "consumer_group", "bucket_ms", "lag", "queues", "stale_queues") == [
        ("audit", 2000, 12, 2, 0), ("audit", 3000, 12, 2, 2), ("audit", 4000, 0, 2, 1),
        ("billing", 0, 13, 2, 0), ("billing", 1000, 5, 2, 1), ("billing", 2000, 3, 3, 1)]
    summary = rows(cg.consumer_lag_summary(lag), "consumer_group", "buckets", "max_lag", "max_lag_bucket_ms",
                   "final_lag")
    assert summary == [("audit", 3, 12, 2000, 0), ("billing", 3, 13, 0, 3)]


def test_consumer_lag_of_a_run_without_progress_rows_is_empty(frame):
    # An older run or analytics --live: no progress rows, no buckets, no summary rows.
    lag = cg.consumer_lag(frame("consumer_progress", []))
    assert lag.count() == 0 and cg.consumer_lag_summary(lag).count() == 0


REDELIVERY_NEMESIS = [kill(10_000, "a/1"), kill(20_000, "a/2", kind="kill-broker"),
                      kill(30_000, "b/1"), {"time_ms": 45_000, "kind": "heal", "phase": "end", "target": None}]
REDELIVERY_ROWS = [
    # billing: p1..p3 first delivered early
    deliver("billing", "p1", 1000), deliver("billing", "p2", 1100), deliver("billing", "p3", 1200),
    deliver("billing", "p3", 7999),            # a redelivery just before failover 1's window [8000, 20000)
    deliver("billing", "p1", 9000),            # in window 1
    deliver("billing", None, 9500),            # no payload id: a delivery, never a redelivery
    deliver("billing", "p2", 15000),           # in window 1
    deliver("billing", "p4", 29000),           # first delivery of p4, in window 2 [28000, 40000)
    deliver("billing", "p4", 29500),           # in window 2
    deliver("billing", "p1", 39999),           # p1's third delivery, in window 2
    deliver("billing", "p2", 40000),           # at window 2's end (excluded)
    # audit: its own deliveries of the same payloads are not billing's redeliveries
    deliver("audit", "p1", 1000), deliver("audit", "p1", 12000), deliver("audit", "p5", 50000),
]


def test_redeliveries_are_counted_per_failover_window_and_consumer_group(frame):
    # Failovers are master kills only (fault ids as in `failovers`: the kill-broker at 20 s is not one).
    # billing: window 1 holds p1@9000 and p2@15000 (2 of its 5 deliveries there: p3@7999 is before it),
    # window 2 p4@29500 and p1@39999 (2 of 3); audit: 1 in window 1, none in window 2.
    nem = frame("nemesis", REDELIVERY_NEMESIS)
    d = frame("deliveries", REDELIVERY_ROWS)
    got = rows(cg.redeliveries_around_failovers(nem, d), "fault_id", "kill_ms", "target", "consumer_group",
               "window_start_ms", "window_end_ms", "deliveries", "redeliveries")
    assert got == [(1, 10_000, "a/1", "audit", 8000, 20_000, 1, 1),
                   (1, 10_000, "a/1", "billing", 8000, 20_000, 3, 2),
                   (2, 30_000, "b/1", "audit", 28_000, 40_000, 0, 0),
                   (2, 30_000, "b/1", "billing", 28_000, 40_000, 3, 2)]


def test_redelivery_totals_count_each_redelivery_once(frame):
    # billing: 6 redeliveries (p3@7999, p1@9000, p2@15000, p4@29500, p1@39999, p2@40000) of 4 payloads,
    # 4 of them near a failover; 11 deliveries of 4 payloads (the one without a payload id counts as a
    # delivery). audit: 1 redelivery, near failover 1. A wider window takes in p3@7999 and p2@40000.
    nem = frame("nemesis", REDELIVERY_NEMESIS)
    d = frame("deliveries", REDELIVERY_ROWS)
    cols = ("consumer_group", "deliveries", "payloads", "redeliveries", "redelivered_payloads",
            "redeliveries_near_failovers")
    assert rows(cg.redelivery_totals(nem, d), *cols) == [("audit", 3, 2, 1, 1, 1), ("billing", 11, 4, 6, 4, 4)]
    wide = cg.redelivery_totals(nem, d, before_ms=2001, after_ms=10_001)
    assert rows(wide, "consumer_group", "redeliveries_near_failovers") == [("audit", 1), ("billing", 6)]


def test_redeliveries_agree_with_the_checkers_redelivered_payloads(frame):
    # The payloads delivered more than once are what the group checker reports as redelivered.
    from rocketray.verify.group_history import Delivery
    from rocketray.verify.group_rules import redelivered_payloads

    checker = redelivered_payloads([Delivery.from_json(r) for r in REDELIVERY_ROWS if r["consumer_group"] == "billing"])
    d = cg.numbered_deliveries(frame("deliveries", REDELIVERY_ROWS)).where("consumer_group = 'billing'")
    spark = {r["payload_id"]: r["n"] for r in d.groupBy("payload_id").count().withColumnRenamed("count", "n")
             .where("n > 1 and payload_id is not null").collect()}
    assert spark == checker == {"p1": 3, "p2": 3, "p3": 2, "p4": 2}


def test_no_deliveries_or_no_failovers_give_empty_or_zero_rows(frame):
    # Without deliveries there is nothing per failover; without failovers every redelivery is far from one.
    nem = frame("nemesis", REDELIVERY_NEMESIS)
    d = frame("deliveries", REDELIVERY_ROWS)
    assert cg.redeliveries_around_failovers(nem, frame("deliveries", [])).count() == 0
    assert cg.redelivery_totals(nem, frame("deliveries", [])).count() == 0
    none = frame("nemesis", [])
    assert cg.redeliveries_around_failovers(none, d).count() == 0
    assert rows(cg.redelivery_totals(none, d), "consumer_group", "redeliveries", "redeliveries_near_failovers") == [
        ("audit", 1, 0), ("billing", 6, 0)]
