"""The consumer-group workload (chaos/group_workload.py) over the in-memory cluster of
tests/support/fake_client_cluster.py: no Ray. Its rows parse, the checker judges a clean run valid,
a run whose drain cannot finish invalid, and a broker group that does not answer costs only its own
progress sample (the sampler asked every broker group at once and dropped the whole sample)."""

from __future__ import annotations

import dataclasses
import json
import threading

from rocketray.chaos.broker_workload import RunLog, TopicLayout, extend_topic
from rocketray.chaos.group_workload import GroupWorkload, ProgressSampler
from rocketray.chaos.replica_reader import now_ms, payload_body
from rocketray.client import Admin, Producer
from rocketray.client.transport import Unanswered
from rocketray.config import load_config
from rocketray.wire.put_result import PutStatus
from rocketray.ha.ack import refused
from rocketray.verify.group_action_rules import payload_tag
from rocketray.verify.group_history import GroupHistory, parse_group_row
from rocketray.verify.groups import check_groups
from rocketray.verify.history import OpRecord
from rocketray.waiting import wait_for
from tests.support.fake_client_cluster import FakeCluster, FakeTransport

TOPIC = "chaos"


def produce(transport: FakeTransport, n: int) -> list[OpRecord]:
    ops = []
    with Producer(transport=transport) as p:
        for i in range(n):
            pid = f"p{i}"
            r = p.send(TOPIC, payload_body(pid), key=f"k{i % 5}", properties={"pid": pid})
            ops.append(OpRecord(pid, "producer-0", "send", transport.cluster.topics[TOPIC][r.queue_id], r.queue_id,
                                pid, r.queue_offset, None, 0, 1, "ok"))
    return ops


def rows_of(runlog: RunLog) -> GroupHistory:
    """The workload's rows as the checker reads them back from history.jsonl."""
    return GroupHistory.of([parse_group_row(json.loads(json.dumps(r))) for r in runlog.history])


def test_a_clean_run_of_two_groups_is_valid_and_records_every_row_kind():
    c = FakeCluster()
    c.create_topic(TOPIC, 4)
    t = FakeTransport(c)
    ops = produce(t, 40)
    runlog = RunLog()
    workload = GroupWorkload("fake", t, TOPIC, ["cg-0", "cg-1"], 2, runlog)
    workload.start([], 0.0, threading.Event())
    assert workload.finish({(TOPIC, op.queue_id) for op in ops}, timeout_s=30)
    history = rows_of(runlog)
    assert {type(r).__name__ for r in history.records()} == {"GroupDeclared", "ConsumerEvent", "Assignment",
                                                             "Delivery", "CommitRecord", "SampleRecord",
                                                             "ProgressRow", "DrainRecord"}
    reports = check_groups(ops, history)
    assert [r.consumer_group for r in reports] == ["cg-0", "cg-1"]
    assert all(r.valid and r.drained and r.undelivered == 0 and r.rebalances > 0 for r in reports), \
        [r.to_json() for r in reports]
    assert all(d.poll is not None for d in history.deliveries)


def test_a_drain_that_cannot_finish_fails_the_group():
    """Every commit is refused: the drain runs out, its row says so, and the verdict is invalid."""
    c = FakeCluster()
    c.create_topic(TOPIC, 2)
    t = FakeTransport(c)
    ops = produce(t, 6)
    c.commit_hook = lambda group, cg, entries: refused(PutStatus.MESSAGE_ILLEGAL)
    runlog = RunLog()
    workload = GroupWorkload("fake", t, TOPIC, ["cg-0"], 1, runlog)
    workload.start([], 0.0, threading.Event())
    wait_for(lambda: len([r for r in runlog.history if r["f"] == "deliver"]) >= 6, 10, "every delivery")
    assert not workload.finish({(TOPIC, op.queue_id) for op in ops}, timeout_s=1.0)
    (report,) = check_groups(ops, rows_of(runlog))
    assert report.drained is False and not report.valid and report.undelivered == 0


def test_an_unanswered_broker_group_costs_only_its_own_sample():
    c = FakeCluster()
    c.create_topic(TOPIC, 2)                # queue 0 on broker-a, queue 1 on broker-b

    class BrokerBDown(FakeTransport):
        def committed(self, group, consumer_group, topics, timeout_s):
            if group == "broker-b":
                return Unanswered("TIMEOUT")
            return super().committed(group, consumer_group, topics, timeout_s)

    t = BrokerBDown(c)
    produce(t, 4)
    c.committed.update({("cg-0", TOPIC, 0): 2, ("cg-0", TOPIC, 1): 2})
    runlog = RunLog()
    sampler = ProgressSampler(Admin(transport=t), t.groups(), ["cg-0"], runlog, threading.Event())
    assert sampler.sample("cg-0") is None                  # not complete, but broker-a's answer is kept
    history = rows_of(runlog)
    assert [(s.broker_group, s.outcome.value) for s in history.samples] == [("broker-a", "ok"), ("broker-b", "failed")]
    assert [(p.broker_group, p.queue_id, p.committed) for p in history.progress] == [("broker-a", 0, 2)]


def test_nacks_seeks_a_filter_delays_and_new_queues_run_clean():
    """With a seed the members nack (retry copies, dead letters at the third delivery) and seek back,
    the second group filters by tag, some sends are delayed, and the topic gains queues while the
    groups run: every rule holds and each feature left its rows (nacks and seeks at raised rates)."""
    c = FakeCluster()
    c.create_topic(TOPIC, 2)
    t = FakeTransport(c, load_config("fast", {}))       # retries after 100 ms, 200 ms; routes refreshed every 1 s
    runlog = RunLog()
    ops = produce_tagged(t, runlog, range(0, 60))
    workload = GroupWorkload("fake", t, TOPIC, ["cg-0", "cg-1"], 2, runlog, seed=7)
    for slot in workload.slots.values():
        slot.plan = dataclasses.replace(slot.plan, nack_permille=150, poison_permille=50, seek_chance=0.3)
    workload.start([], 0.0, threading.Event())
    wait_for(lambda: sum(r["f"] == "seek" for r in runlog.history) >= 2, 20, "seeks")
    layout = extend_topic(Admin(transport=t), TopicLayout(TOPIC, ("broker-a", "broker-b")), 4, runlog,
                          threading.Event())
    assert layout is not None and layout.queues == 4
    ops += produce_tagged(t, runlog, range(60, 120))
    wait_for(lambda: {r["consumer_group"] for r in runlog.history
                      if r["f"] == "nack" and str(r["copy_topic"]).startswith("%DLQ%")} == {"cg-0", "cg-1"}, 20,
             "a dead letter in each group")
    due = max(r["deliver_at_ms"] for r in runlog.history if r["f"] == "delayed")
    assert workload.finish({(TOPIC, op.queue_id) for op in ops}, timeout_s=30, due_ms=due)
    history = rows_of(runlog)
    reports = {r.consumer_group: r for r in check_groups(ops, history)}
    assert all(r.valid for r in reports.values()), {g: r.to_json() for g, r in reports.items()}
    assert reports["cg-1"].expression == "paid || refunded" and 0 < reports["cg-1"].acked < reports["cg-0"].acked
    for r in reports.values():
        assert r.nacks_ok > 0 and r.copies_delivered > 0 and r.dead_lettered > 0 and r.delayed_delivered > 0, r
    assert sum(r.seeks for r in reports.values()) >= 2
    assert {a.queue_id for a in history.assignments if a.event == "assigned"} >= {2, 3}


def produce_tagged(transport: FakeTransport, runlog: RunLog, ids: range) -> list[OpRecord]:
    """Sends p<i> tagged as the chaos producers tag, every fifth delayed by 1 s (a ``delayed`` row)."""
    ops = []
    with Producer(transport=transport) as p:
        for i in ids:
            pid = f"p{i}"
            due = now_ms() + 1000 if i % 5 == 0 else None
            r = p.send(TOPIC, payload_body(pid), key=f"k{i % 7}", tags=payload_tag(pid), properties={"pid": pid},
                       deliver_at_ms=None if due is None else int(due))
            if due is not None:
                runlog.record({"f": "delayed", "process": "producer-0", "payload_id": pid, "msg_id": r.msg_id,
                               "deliver_at_ms": int(due), "time_ms": now_ms()})
            ops.append(OpRecord(pid, "producer-0", "send", transport.cluster.topics[TOPIC][r.queue_id], r.queue_id,
                                pid, None if due is not None else r.queue_offset, None, 0, 1, "ok"))
    return ops
