"""Each analysis on small constructed DataFrames with known answers (real Spark on Ray via RayDP)."""

from __future__ import annotations

import pytest

from rocketray.spark_on_ray import analyses

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny(frame, tiny_records):
    return {kind: frame(kind, rows) for kind, rows in tiny_records.items()}


@pytest.fixture(scope="module")
def TINY_TRUTH(tiny_truth):  # noqa: N802 - reads like the constant it is
    return tiny_truth


def rows(df, *cols):
    return [tuple(r[c] for c in cols) for r in df.collect()]


def test_epoch_entries_close_open_ends_at_the_replica_max_offset(frame):
    # An open-ended (Long.MAX) last entry ends at the replica's max offset; earlier ones at the next start.
    reps = frame("replicas", [{"group": "g", "broker_id": 1, "role": "MASTER", "master_epoch": 2,
                               "epoch_entries": [[1, 0, 2**63 - 1], [2, 700, 2**63 - 1]],
                               "min_offset": 0, "max_offset": 900, "confirm_offset": 900}])
    got = rows(analyses.epoch_entries(reps).orderBy("epoch"), "epoch", "start_offset", "end_offset", "is_last")
    assert got == [(1, 0, 700, False), (2, 700, 900, True)]


def test_epoch_timeline_gives_master_offsets_bytes_and_durations_per_group(tiny, TINY_TRUTH):
    # The hand-built run: 3 epochs in group a, 2 in b, with masters, offsets and wall-clock spans.
    t = analyses.epoch_timeline(tiny["replicas"], tiny["samples"], tiny["controller_events"])
    got = {(r["group"], r["epoch"]): r for r in t.collect()}
    assert len(got) == TINY_TRUTH["epochs"]
    for key, master in TINY_TRUTH["masters"].items():
        assert got[key]["master_broker_id"] == master, key
    assert [(got[("a", e)]["start_offset"], got[("a", e)]["end_offset"], got[("a", e)]["bytes"])
            for e in (1, 2, 3)] == [(0, 1000, 1000), (1000, 2000, 1000), (2000, 2600, 600)]
    # epoch 2 of a: elected at 2300 (controller), epoch 3 elected at 4600 -> 2300 ms long
    assert (got[("a", 2)]["start_ms"], got[("a", 2)]["end_ms"], got[("a", 2)]["duration_ms"]) == (2300, 4600, 2300)
    assert got[("a", 3)]["end_ms"] is None
    assert got[("b", 2)]["masters_seen"] == 2 and got[("b", 2)]["distinct_start_offsets"] == 2


def test_epoch_timeline_counts_elected_epochs_and_never_epoch_zero(frame):
    # A restarted replica reports master epoch 0 between reading its identity and its registration,
    # and a slave reports epoch 5, which an election that found no master bumped to: neither is a
    # master term (CI counted seven epochs of six). Epoch 3 was elected, but its master died before
    # it wrote an entry or sampled as master: it is one. The timeline is exactly the elections.
    reps = frame("replicas", [{"group": "g", "broker_id": b, "role": "MASTER" if b == 1 else "SLAVE",
                               "master_epoch": 4, "epoch_entries": [[1, 0, 100], [2, 100, 300], [4, 300, 2**63 - 1]],
                               "min_offset": 0, "max_offset": 400, "confirm_offset": 400} for b in (1, 2)])
    samples = frame("samples", [
        {"time_ms": 10, "group": "g", "broker_id": 1, "role": "MASTER", "master_epoch": 1, "max_offset": 50,
         "confirm_offset": 50},
        {"time_ms": 20, "group": "g", "broker_id": 2, "role": "NONE", "master_epoch": 0, "max_offset": 100,
         "confirm_offset": 100},
        {"time_ms": 30, "group": "g", "broker_id": 2, "role": "SLAVE", "master_epoch": 3, "max_offset": 300,
         "confirm_offset": 300},
        {"time_ms": 60, "group": "g", "broker_id": 2, "role": "SLAVE", "master_epoch": 5, "max_offset": 400,
         "confirm_offset": 400},
    ])
    events = frame("controller_events", [
        {"index": i, "seq": 0, "time_ms": 5 * i, "type": "ElectMasterEvent", "broker_name": "g",
         "new_master_elected": elected, "new_master_broker_id": master, "master_epoch": epoch}
        for i, (epoch, elected, master) in enumerate([(1, True, 1), (2, True, 2), (3, True, 2), (4, True, 1),
                                                      (5, False, None)], start=1)])
    got = rows(analyses.epoch_timeline(reps, samples, events), "group", "epoch", "master_broker_id")
    assert got == [("g", 1, 1), ("g", 2, 2), ("g", 3, 2), ("g", 4, 1)]


def test_split_brain_reports_an_epoch_with_two_starts_and_two_masters(tiny):
    # Group b's epoch 2 starts at 500 on broker 2 and at 600 on broker 1, and both sampled as master.
    found = rows(analyses.split_brain(tiny["replicas"], tiny["samples"]), "group", "epoch", "start_offsets",
                 "masters", "reason")
    assert found == [("b", 2, [500, 600], [1, 2], "two start offsets; two masters")]


def test_split_brain_is_empty_when_replicas_agree(frame):
    # Identical epoch files and one master per epoch: nothing to report.
    entries = [[1, 0, 100], [2, 100, 2**63 - 1]]
    reps = frame("replicas", [{"group": "g", "broker_id": i, "role": "MASTER" if i == 1 else "SLAVE",
                               "master_epoch": 2, "epoch_entries": entries, "min_offset": 0, "max_offset": 300,
                               "confirm_offset": 300} for i in (1, 2)])
    samples = frame("samples", [{"time_ms": 1, "group": "g", "broker_id": 1, "role": "MASTER", "master_epoch": 2,
                                 "max_offset": 300, "confirm_offset": 300}])
    assert analyses.split_brain(reps, samples).count() == 0
    agreement = rows(analyses.replica_agreement(reps), "broker_id", "epoch", "status")
    assert agreement == [(1, 1, "agree"), (1, 2, "agree"), (2, 1, "agree"), (2, 2, "agree")]


def test_replica_agreement_flags_diverged_and_missing_epochs(tiny, frame):
    # In b, broker 1's epoch-1 entry starts where the master's does (agree) but epoch 2 does not (diverged);
    # an epoch the master never had is missing_on_master.
    got = {(r["group"], r["broker_id"], r["epoch"]): r["status"]
           for r in analyses.replica_agreement(tiny["replicas"]).collect()}
    assert got[("b", 1, 1)] == "agree" and got[("b", 1, 2)] == "diverged"
    assert all(status == "agree" for (g, _, _), status in got.items() if g == "a")
    reps = frame("replicas", [
        {"group": "g", "broker_id": 1, "role": "MASTER", "master_epoch": 3, "epoch_entries": [[1, 0, 1], [3, 50, 99]],
         "min_offset": 0, "max_offset": 99, "confirm_offset": 99},
        {"group": "g", "broker_id": 2, "role": "SLAVE", "master_epoch": 3, "epoch_entries": [[1, 0, 1], [2, 50, 60]],
         "min_offset": 0, "max_offset": 60, "confirm_offset": 60}])
    got = rows(analyses.replica_agreement(reps).where("broker_id = 2"), "epoch", "status")
    assert got == [(1, "agree"), (2, "missing_on_master")]


def test_truncations_are_decreases_of_a_replicas_max_offset(tiny):
    # Broker a/1 came back with 1100 bytes and was cut to 1000 in the handshake: one truncation of 100 bytes.
    truncs = analyses.truncations(tiny["samples"])
    assert rows(truncs, "group", "broker_id", "time_ms", "from_offset", "to_offset", "bytes_truncated") == [
        ("a", 1, 3000, 1100, 1000, 100)]
    summary = rows(analyses.truncation_summary(truncs), "group", "broker_id", "truncations", "bytes_truncated")
    assert summary == [("a", 1, 1, 100)]


def test_replication_lag_is_measured_against_the_masters_latest_sample(frame):
    # Master samples at t=0 (100) and t=10 (300); a slave at t=5 (60) is 40 behind, at t=10 (250) 50 behind.
    s = frame("samples", [
        {"time_ms": 0, "group": "g", "broker_id": 1, "role": "MASTER", "master_epoch": 1, "max_offset": 100,
         "confirm_offset": 80},
        {"time_ms": 5, "group": "g", "broker_id": 2, "role": "SLAVE", "master_epoch": 1, "max_offset": 60,
         "confirm_offset": 50},
        {"time_ms": 10, "group": "g", "broker_id": 2, "role": "SLAVE", "master_epoch": 1, "max_offset": 250,
         "confirm_offset": 250},
        {"time_ms": 10, "group": "g", "broker_id": 1, "role": "MASTER", "master_epoch": 1, "max_offset": 300,
         "confirm_offset": 250},
        {"time_ms": 1, "group": "h", "broker_id": 1, "role": "SLAVE", "master_epoch": 1, "max_offset": 7,
         "confirm_offset": 7},
    ])
    lag = analyses.replication_lag(s)
    got = rows(lag.orderBy("group", "time_ms", "broker_id"), "group", "time_ms", "broker_id", "lag_bytes",
               "confirm_lag_bytes")
    assert got == [("g", 0, 1, 0, 20), ("g", 5, 2, 40, 50), ("g", 10, 1, 0, 50), ("g", 10, 2, 50, 50),
                   ("h", 1, 1, None, None)]
    summary = rows(analyses.lag_summary(lag), "group", "broker_id", "samples", "max_lag_bytes")
    assert summary == [("g", 1, 2, 0), ("g", 2, 2, 50)]


def test_failovers_are_master_kills_and_other_faults_keep_their_kind(tiny, TINY_TRUTH):
    # Master kills are the failovers (the checker's meaning); the controller kill (no group) is
    # reported under its own kind, for every group.
    fo = analyses.failovers(tiny["nemesis"], tiny["history"])
    assert {(r["group"], r["kill_ms"]): r["failover_ms"] for r in fo.collect()} == TINY_TRUTH["failover_ms"]
    other = analyses.other_faults(tiny["nemesis"], tiny["history"])
    got = {(r["kind"], r["group"], r["fault_ms"]): r["recovery_ms"] for r in other.collect()}
    assert got == TINY_TRUTH["other_faults_ms"]


def test_failover_counts_only_sends_started_at_or_after_the_kill(frame):
    # The checker's rule: sends started before the kill (even if acknowledged after it) do not end the
    # failover; a send started at the kill's own millisecond does; another group's ack does not.
    nem = frame("nemesis", [{"time_ms": 100, "kind": "kill-master", "phase": "start", "target": "g/1", "group": "g"}])

    def ack(i, group, start_ms, end_ms):
        return {"op_id": i, "process": "p", "f": "send", "group": group, "queue_id": 0, "payload_id": f"m{i}",
                "start_ms": start_ms, "end_ms": end_ms, "outcome": "ok"}

    hist = frame("history", [ack(1, "g", 89, 90), ack(2, "g", 95, 120), ack(3, "h", 100, 110),
                             ack(4, "g", 100, 150), ack(5, "g", 129, 130), ack(6, "g", 169, 170)])
    assert rows(analyses.failovers(nem, hist), "group", "first_ack_ms", "failover_ms") == [("g", 130, 30)]


def test_failover_agrees_with_the_checker_on_constructed_runs(frame):
    # Same ops and nemesis through verify/checker.py failover_times and the Spark analysis.
    from rocketray.verify.checker import failover_times
    from rocketray.verify.history import NemesisEvent, OpRecord

    sends = [(1, "g", 10, 40), (2, "g", 55, 300), (3, "g", 60, 90), (4, "h", 70, 75), (5, "g", 200, 210),
             (6, "h", 205, 260), (7, "h", 400, 401)]
    kills = [(50, "g"), (50, "h"), (199, "g"), (300, "h"), (500, "g")]
    ops = [OpRecord(i, "p", "send", g, 0, f"m{i}", None, None, s, e, "ok") for i, g, s, e in sends]
    nemesis = [NemesisEvent(t, "kill-master", "start", f"{g}/1", g) for t, g in kills]
    stats, details = failover_times(ops, nemesis)
    checker = {(d["group"], d["kill_ms"]): d["failover_ms"] for d in details}
    hist = frame("history", [o.to_json() for o in ops])
    nem = frame("nemesis", [e.to_json() for e in nemesis])
    spark = {(r["group"], r["kill_ms"]): r["failover_ms"] for r in analyses.failovers(nem, hist).collect()}
    assert spark == checker == {("g", 50): 40, ("h", 50): 25, ("g", 199): 11, ("h", 300): 101, ("g", 500): None}
    assert stats.unrecovered == 1


def test_failover_does_not_count_a_send_started_in_the_kills_millisecond_before_it(frame):
    """A CI chaos run: a send started 0.4 ms before the kill, in the same millisecond, and was
    acknowledged 8 ms later. With times rounded to whole ms the analytics sorted it with the kill
    and reported an 8 ms failover where the checker (unrounded times) waited 114 ms for a send that
    started after the kill. Times keep their fraction now; the old rounding fails this test."""
    from rocketray.verify.checker import failover_times
    from rocketray.verify.history import NemesisEvent, OpRecord

    ops = [OpRecord(1, "p", "send", "g", 0, "m1", None, None, 1000.1, 1008.5, "ok"),
           OpRecord(2, "p", "send", "g", 0, "m2", None, None, 1000.6, 1114.9, "ok")]
    nemesis = [NemesisEvent(1000.5, "kill-master", "start", "g/1", "g")]
    _, details = failover_times(ops, nemesis)
    hist = frame("history", [o.to_json() for o in ops])
    nem = frame("nemesis", [e.to_json() for e in nemesis])
    spark = [r["failover_ms"] for r in analyses.failovers(nem, hist).collect()]
    assert spark == [d["failover_ms"] for d in details] == [1114.9 - 1000.5]


def test_failover_without_a_later_ack_is_unrecovered(frame):
    # A master kill after the last acknowledged send has no end: failover_ms is null and recovered false.
    nem = frame("nemesis", [{"time_ms": 50, "kind": "kill-master", "phase": "start", "target": "g/2", "group": "g"}])
    hist = frame("history", [{"op_id": 1, "process": "p", "f": "send", "group": "g", "queue_id": 0,
                              "payload_id": "x", "start_ms": 1, "end_ms": 10, "outcome": "ok"}])
    assert rows(analyses.failovers(nem, hist), "group", "failover_ms", "recovered") == [("g", None, False)]


def test_message_fate_reports_lost_and_duplicated_messages(tiny, TINY_TRUTH):
    # a5 and b7 were acknowledged and never read (lost); a12 was read at two queue offsets (duplicated).
    fate = analyses.message_fate(tiny["history"])
    lost = rows(analyses.lost_messages(fate), "group", "payload_id")
    assert lost == [(g, p) for g, ps in sorted(TINY_TRUTH["lost"].items()) for p in ps]
    dup = rows(fate.where("status = 'duplicated'"), "group", "payload_id")
    assert dup == [("a", "a12")]
    summary = {r["group"]: r.asDict() for r in analyses.delivery_summary(fate).collect()}
    assert summary["a"]["acknowledged"] == 26 and summary["a"]["lost"] == 1 and summary["a"]["duplicated"] == 1
    assert summary["b"]["acknowledged"] == 11 and summary["b"]["lost"] == 1 and summary["b"]["consumed"] == 10


def test_message_fate_classifies_indeterminate_and_phantom_reads(frame):
    # unknown+read -> unknown_delivered, unknown alone -> unknown_absent, read-but-never-sent -> phantom.
    def op(i, f, payload, outcome="ok", qo=None):
        return {"op_id": i, "process": "p", "f": f, "group": "g", "queue_id": 0, "payload_id": payload,
                "queue_offset": qo, "start_ms": i, "end_ms": i + 1, "outcome": outcome}

    hist = frame("history", [op(1, "send", "u1", "unknown"), op(2, "read", "u1", qo=0), op(3, "send", "u2", "unknown"),
                             op(4, "read", "ghost", qo=1), op(5, "send", "f1", "failed"),
                             op(6, "send", "r", "ok"), op(7, "read", "r"), op(8, "read", "r")])
    got = dict(rows(analyses.message_fate(hist), "payload_id", "status"))
    assert got == {"u1": "unknown_delivered", "u2": "unknown_absent", "ghost": "phantom", "f1": "failed_absent",
                   "r": "duplicated"}


def test_elections_use_the_logged_master_epoch_over_counting(frame):
    # A log that starts after a snapshot: its first ElectMasterEvent set epoch 4, not 1. Records
    # without master_epoch (older logs) fall back to counting per group in (index, seq) order.
    ev = frame("controller_events", [
        {"index": 40, "seq": 1, "time_ms": 100, "type": "ElectMasterEvent", "broker_name": "g",
         "new_master_elected": True, "new_master_broker_id": 2, "master_epoch": 4},
        {"index": 40, "seq": 0, "time_ms": 100, "type": "AlterSyncStateSetEvent", "broker_name": "g",
         "master_epoch": 3},
        {"index": 55, "seq": 0, "time_ms": 900, "type": "ElectMasterEvent", "broker_name": "g",
         "new_master_elected": False, "master_epoch": 5},
        {"index": 7, "seq": 1, "time_ms": 50, "type": "ElectMasterEvent", "broker_name": "h",
         "new_master_elected": True, "new_master_broker_id": 1},
        {"index": 7, "seq": 0, "time_ms": 50, "type": "ElectMasterEvent", "broker_name": "h",
         "new_master_elected": True, "new_master_broker_id": 3},
    ])
    got = rows(analyses.elections(ev).orderBy("group", "epoch"), "group", "epoch", "elected_ms", "elected_broker_id")
    assert got == [("g", 4, 100, 2), ("g", 5, 900, None), ("h", 1, 50, 3), ("h", 2, 50, 1)]


def test_queue_positions_show_hidden_entries_and_how_far_each_replica_is_behind(frame):
    # The master (authoritative) sees 10 entries of T/0; a slave dispatched 9 but can serve 7
    # (2 beyond its confirm offset, 3 behind the master). A replica without queues adds no rows.
    reps = frame("replicas", [
        {"group": "g", "broker_id": 1, "role": "MASTER", "master_epoch": 2, "epoch_entries": [[2, 0, 2**63 - 1]],
         "min_offset": 0, "max_offset": 1000, "confirm_offset": 1000,
         "queues": [{"topic": "T", "queue_id": 0, "min_offset": 0, "max_offset": 10, "visible_offset": 10},
                    {"topic": "T", "queue_id": 1, "min_offset": 4, "max_offset": 6, "visible_offset": 6}]},
        {"group": "g", "broker_id": 2, "role": "SLAVE", "master_epoch": 2, "epoch_entries": [[2, 0, 2**63 - 1]],
         "min_offset": 0, "max_offset": 900, "confirm_offset": 700,
         "queues": [{"topic": "T", "queue_id": 0, "min_offset": 0, "max_offset": 9, "visible_offset": 7}]},
        {"group": "g", "broker_id": 3, "role": "SLAVE", "master_epoch": 2, "epoch_entries": [],
         "min_offset": 0, "max_offset": 0, "confirm_offset": 0},
    ])
    got = rows(analyses.queue_positions(reps), "broker_id", "queue_id", "hidden_entries", "behind_reference")
    assert got == [(1, 0, 0, 0), (2, 0, 2, 3), (1, 1, 0, 0)]


def test_queue_positions_on_the_hand_built_run(tiny):
    # Group b's slave dispatched 11 entries of T/0 but its confirm offset shows only 10: one hidden,
    # one behind the master. Group a's replicas recorded no queues, so they add no rows.
    got = rows(analyses.queue_positions(tiny["replicas"]), "group", "broker_id", "hidden_entries", "behind_reference")
    assert got == [("b", 1, 1, 1), ("b", 2, 0, 0)]
