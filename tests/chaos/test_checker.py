"""The chaos checker: a clean run passes, each planted anomaly is flagged, and a model-generated run never loses."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketray.verify.checker import EXAMPLES_MAX, Verdict, check, check_run_dir, format_verdict
from rocketray.verify.history import NemesisEvent, OpRecord, ReplicaSnapshot, Sample
from rocketray.verify.run_dir import RunData, write_run_dir


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class RunBuilder:
    """Builds run directories by hand: sends, reads, nemesis events, samples and replicas."""

    def __init__(self) -> None:
        self.ops: list[OpRecord] = []
        self.nemesis: list[NemesisEvent] = []
        self.samples: list[Sample] = []
        self.replicas: list[ReplicaSnapshot] = []

    def send(self, payload, offset=None, *, group="g0", queue_id=0, outcome="ok", start=0, end=None,
             process="producer", broker_id=1):
        self.ops.append(OpRecord(len(self.ops), process, "send", group, queue_id, payload, offset, None,
                                 start, start + 5 if end is None else end, outcome, broker_id, None))
        return self

    def read(self, payload, offset, *, group="g0", queue_id=0, at=0, process="reader", broker_id=1):
        self.ops.append(OpRecord(len(self.ops), process, "read", group, queue_id, payload, offset, None,
                                 at, at + 1, "ok", broker_id, None))
        return self

    def nem(self, time_ms, kind, phase="start", *, group="g0", target=None):
        self.nemesis.append(NemesisEvent(time_ms, kind, phase, target, group))
        return self

    def sample(self, time_ms, broker_id, role, epoch, *, group="g0"):
        self.samples.append(Sample(time_ms, group, broker_id, role, epoch, 0, 0))
        return self

    def replica(self, broker_id, role, epoch, *, group="g0", digest_hex=None, confirm=100,
                entries=((1, 0, 50), (2, 50, 100))):
        self.replicas.append(ReplicaSnapshot(group, broker_id, role, epoch, tuple(entries), 0, 100, confirm,
                                             digest_hex))
        return self

    def data(self) -> RunData:
        return RunData(tuple(self.ops), tuple(self.nemesis), tuple(self.replicas), tuple(self.samples))


def clean_run() -> RunBuilder:
    """Ten acked writes, a master kill and failover at t=100, heal at t=300, a final read of everything."""
    b = RunBuilder()
    for i in range(5):
        b.send(f"p{i}", i, start=10 * i)
    b.read("p0", 0, at=60).read("p1", 1, at=61)
    b.nem(100, "kill-master", target="g0/1").nem(100, "kill-master", "end", target="g0/1")
    b.send("p-x", None, outcome="unknown", start=95, end=3000, broker_id=None)  # in flight at the kill
    for i in range(5, 10):
        b.send(f"p{i}", i, start=150 + 10 * i, broker_id=2)
    b.nem(300, "heal", "end", group=None)
    for i in range(10):
        b.read(f"p{i}", i, at=400 + i, process="final", broker_id=2)
    b.sample(50, 1, "MASTER", 1).sample(50, 2, "SLAVE", 1).sample(200, 2, "MASTER", 2)
    b.sample(200, 1, "SLAVE", -1)  # restarted, epoch not known yet
    b.sample(250, 1, "SLAVE", 2)
    b.replica(2, "MASTER", 2, digest_hex=digest(b"log")).replica(1, "SLAVE", 2, digest_hex=digest(b"log"))
    return b


def test_clean_run_is_valid():
    """A run with a kill, failover and a complete final read: nothing lost, every invariant holds."""
    v = check(clean_run().data())
    assert v.valid
    assert (v.ops, v.sends, v.acked, v.lost, v.unseen) == (23, 11, 10, 0, 1)
    assert (v.duplicates, v.inconsistent_offsets, v.nonmonotonic, v.masters_per_epoch_max) == (0, 0, 0, 1)
    assert v.epochs_monotonic and v.replicas_converged and v.replicas_checked == 1
    assert v.final_reads == 10 and v.reads == 12 and v.heal_at_ms == 300
    assert v.failover_ms.to_json() == {"p50": 105, "max": 105, "count": 1, "unrecovered": 0}


def test_verdict_json_carries_the_contract_keys():
    """to_json() has every key the CLI and the analytics rely on, and is JSON-encodable."""
    out = check(clean_run().data()).to_json()
    for key in ("ops", "acked", "lost", "unseen", "duplicates", "inconsistent_offsets", "nonmonotonic",
                "masters_per_epoch_max", "epochs_monotonic", "replicas_converged", "failover_ms", "valid",
                "examples"):
        assert key in out
    assert set(out["failover_ms"]) >= {"p50", "max", "count"}
    json.dumps(out)


def test_lost_acknowledged_write_is_flagged():
    """An acked payload missing from the final reads is lost, and the run is invalid."""
    b = clean_run()
    b.ops = [op for op in b.ops if not (op.is_read and op.process == "final" and op.payload_id == "p3")]
    v = check(b.data())
    assert v.lost == 1 and not v.valid
    assert v.examples["lost"][0]["payload_id"] == "p3"
    assert "INVALID: 1 acknowledged writes lost" in format_verdict(v)


def test_acked_write_read_before_heal_but_gone_after_is_lost():
    """Reading a payload mid-run does not excuse its absence after heal (it was truncated later)."""
    b = clean_run()
    b.ops = [op for op in b.ops if not (op.process == "final" and op.payload_id == "p0")]
    v = check(b.data())
    assert v.lost == 1 and v.examples["lost"][0]["payload_id"] == "p0"


def test_unknown_write_never_read_is_unseen_and_allowed():
    """An unknown/failed write nobody read is reported as unseen, not lost; once read it is neither."""
    b = clean_run().send("p-f", None, outcome="failed", start=120)
    v = check(b.data())
    assert (v.unseen, v.lost, v.valid) == (2, 0, True)
    b.read("p-x", 10, at=410, process="final")
    v = check(b.data())
    assert (v.unseen, v.lost, v.valid) == (1, 0, True)
    assert v.examples["unseen"][0]["payload_id"] == "p-f"


def test_payload_at_two_offsets_is_a_duplicate_and_allowed():
    """A retried write that landed twice: reported as a duplicate, not an anomaly of validity."""
    b = clean_run().read("p4", 10, at=420, process="final")
    v = check(b.data())
    assert v.duplicates == 1 and v.valid
    assert v.examples["duplicates"] == [{"payload_id": "p4", "positions": [["g0", 0, 4], ["g0", 0, 10]]}]


def test_two_payloads_at_one_offset_across_reads_is_inconsistent():
    """Two replicas serving different payloads at one queue offset is flagged."""
    b = clean_run().read("p-other", 3, at=70, process="reader-2", broker_id=3)
    v = check(b.data())
    assert v.inconsistent_offsets == 1 and not v.valid
    assert v.examples["inconsistent_offsets"] == [
        {"group": "g0", "queue_id": 0, "queue_offset": 3, "payload_ids": ["p-other", "p3"]}]


def test_acked_offset_overwritten_after_failover_is_inconsistent():
    """An ok send reported offset 7; after heal another payload sits there (and the acked one elsewhere)."""
    b = clean_run()
    b.ops = [replace(op, payload_id="p-new") if op.process == "final" and op.payload_id == "p7" else op
             for op in b.ops]
    b.read("p7", 11, at=430, process="final")
    v = check(b.data())
    assert v.inconsistent_offsets == 1 and v.lost == 0 and not v.valid


def test_offsets_in_other_queues_and_groups_do_not_collide():
    """The same queue offset in another queue or group is a different position."""
    b = clean_run().send("q0", 0, queue_id=1, start=20).send("h0", 0, group="g1", start=20)
    b.read("q0", 0, queue_id=1, at=450, process="final").read("h0", 0, group="g1", at=450, process="final")
    v = check(b.data())
    assert v.valid and v.inconsistent_offsets == 0 and v.acked == 12


def test_two_masters_in_one_epoch_is_flagged():
    """Brokers 1 and 2 both claim master at epoch 2 (split brain)."""
    b = clean_run().sample(210, 1, "MASTER", 2)
    v = check(b.data())
    assert v.masters_per_epoch_max == 2 and not v.valid
    assert v.examples["masters_per_epoch"] == [{"group": "g0", "master_epoch": 2, "broker_ids": [1, 2]}]


def test_two_masters_in_one_epoch_seen_only_after_heal_is_flagged():
    """The final replica states count too."""
    b = clean_run()
    b.replicas[1] = replace(b.replicas[1], role="MASTER")
    assert check(b.data()).masters_per_epoch_max == 2


def test_same_master_in_two_epochs_is_fine_and_groups_are_separate():
    """One master per (group, epoch): a master re-elected at a new epoch, or another group's master, is fine."""
    b = clean_run().sample(260, 2, "MASTER", 3).sample(260, 7, "MASTER", 2, group="g1")
    assert check(b.data()).masters_per_epoch_max == 1


def test_epoch_regression_is_flagged():
    """Broker 2 went from epoch 2 back to epoch 1 in a later sample."""
    b = clean_run().sample(270, 2, "SLAVE", 1)
    v = check(b.data())
    assert not v.epochs_monotonic and not v.valid
    ex = v.examples["epochs_monotonic"][0]
    assert (ex["broker_id"], ex["from"], ex["to"], ex["time_ms"]) == (2, 2, 1, 270)


def test_epoch_regression_between_samples_and_final_state_is_flagged():
    """The replica's state after heal is the last point of its series."""
    b = clean_run().sample(280, 1, "SLAVE", 3)
    assert not check(b.data()).epochs_monotonic


def test_restart_reporting_unknown_epoch_is_not_a_regression():
    """A restarted broker reports -1/0 until it learns the epoch; that is not a regression (documented model)."""
    b = clean_run().sample(265, 2, "SLAVE", 0).sample(266, 2, "MASTER", 2)
    assert check(b.data()).epochs_monotonic


def test_samples_are_ordered_by_time_not_by_file_position():
    """Samples written out of order by concurrent samplers are sorted by time_ms first."""
    b = clean_run()
    b.samples.insert(0, Sample(240, "g0", 2, "MASTER", 2, 0, 0))
    assert check(b.data()).epochs_monotonic


def test_disordered_epoch_file_is_flagged():
    """Epoch entries must have strictly increasing epochs and non-decreasing start offsets."""
    b = clean_run()
    b.replicas[0] = replace(b.replicas[0], epoch_entries=((1, 0, 50), (1, 50, 100)))
    assert not check(b.data()).epochs_monotonic
    b.replicas[0] = replace(b.replicas[0], epoch_entries=((1, 60, 60), (2, 50, 100)))
    assert not check(b.data()).epochs_monotonic


def test_divergent_replicas_are_flagged():
    """Two replicas with different bytes below the group's minimum confirm offset."""
    b = clean_run()
    b.replicas[1] = replace(b.replicas[1], digest_to_confirm=digest(b"other"), confirm_offset=90)
    v = check(b.data())
    assert not v.replicas_converged and not v.valid
    ex = v.examples["replicas_converged"][0]
    assert (ex["reason"], ex["confirm_offset"]) == ("digests differ", 90)


def test_replica_missing_its_digest_is_not_converged():
    """If any replica of a group carries a digest, every replica of the group must."""
    b = clean_run()
    b.replicas[1] = replace(b.replicas[1], digest_to_confirm=None)
    v = check(b.data())
    assert not v.replicas_converged and v.examples["replicas_converged"][0]["reason"].startswith("digest missing")


def test_replicas_without_digests_are_not_compared():
    """No digests at all: convergence is not checked, and the summary says so."""
    b = clean_run()
    b.replicas = [replace(r, digest_to_confirm=None) for r in b.replicas]
    v = check(b.data())
    assert v.valid and v.replicas_checked == 0
    assert "no digests to compare" in format_verdict(v)


def test_nonmonotonic_read_is_flagged():
    """A reader saw offset 2 then offset 1 in one pass."""
    b = clean_run().read("p2", 2, at=80).read("p1", 1, at=81)
    v = check(b.data())
    assert v.nonmonotonic == 1
    assert v.examples["nonmonotonic"][0]["previous_offset"] == 2 and v.examples["nonmonotonic"][0]["offset"] == 1
    assert v.valid  # reported, not part of validity


def test_reads_are_ordered_by_start_time_and_passes_split_at_heal():
    """Lines out of time order are sorted first; the same process re-reading from 0 after heal is a new pass."""
    b = clean_run().read("p3", 3, at=90).read("p2", 2, at=85)  # written out of order, read in order
    b.read("p0", 0, at=500)  # process "reader" again, after heal: a new pass
    assert check(b.data()).nonmonotonic == 0


def test_redelivery_of_the_same_offset_is_not_nonmonotonic():
    b = clean_run().read("p1", 1, at=62)
    assert check(b.data()).nonmonotonic == 0


def test_failover_p50_and_max_are_exact():
    """Three kills recovering after 300, 500 and 700 ms: p50 500, max 700."""
    b = RunBuilder()
    for kill, delay in ((1000, 300), (5000, 700), (9000, 500)):
        b.nem(kill, "kill-master", target="g0/1")
        b.send(f"early-{kill}", None, start=kill - 10, end=kill + 5)  # started before the kill: ignored
        b.send(f"slow-{kill}", None, start=kill + 1, end=kill + delay + 50)
        b.send(f"ack-{kill}", None, start=kill + 2, end=kill + delay)
        b.send(f"other-{kill}", None, group="g1", start=kill + 3, end=kill + 4)  # other group: ignored
        b.send(f"fail-{kill}", None, outcome="failed", start=kill, end=kill + 1)  # not acked: ignored
    f = check(b.data()).failover_ms
    assert (f.p50, f.max, f.count, f.unrecovered) == (500, 700, 3, 0)


def test_failover_lower_median_and_unrecovered_kills():
    """Two recovered kills (200, 800): p50 is the lower median 200; a kill never followed by an ack is unrecovered."""
    b = RunBuilder()
    b.nem(0, "kill-master").send("a", None, start=0, end=200)
    b.nem(1000, "kill-master").send("b", None, start=1000, end=1800)
    b.nem(1000, "kill-master", "end")  # end phases are not kills
    b.nem(5000, "kill-broker").nem(6000, "kill-master", group="g1")
    f = check(b.data()).failover_ms
    assert f.to_json() == {"p50": 200, "max": 800, "count": 2, "unrecovered": 1}


def test_examples_are_capped():
    """However many writes are lost, the human lists stay short."""
    b = RunBuilder()
    for i in range(50):
        b.send(i, i, start=i)
    v = check(b.data())
    assert v.lost == 50 and len(v.examples["lost"]) == EXAMPLES_MAX


def test_check_run_dir_reads_and_checks(tmp_path):
    """The file round trip gives the same verdict as the in-memory check."""
    b = clean_run()
    b.ops.pop()  # lose p9
    write_run_dir(tmp_path, b.data())
    v = check_run_dir(tmp_path)
    assert isinstance(v, Verdict) and v.to_json() == check(b.data()).to_json()
    text = format_verdict(v)
    assert text.splitlines()[0] == "INVALID: 1 acknowledged writes lost"
    assert "payload_id=p9" in text


def test_format_verdict_of_a_clean_run():
    text = format_verdict(check(clean_run().data()))
    assert text.splitlines()[0] == "VALID: no acknowledged write lost"
    assert "p50 105 ms, max 105 ms" in text


# -- property: a correct log model never loses -----------------------------------------------------

ACTIONS = st.one_of(
    st.tuples(st.just("send"), st.integers(0, 1), st.integers(0, 1),
              st.sampled_from(["ok", "ok", "ok", "unknown-kept", "unknown-dropped", "failed"])),
    st.tuples(st.just("kill"), st.integers(0, 1)),
    st.tuples(st.just("read"), st.integers(0, 1), st.integers(0, 1), st.integers(1, 4)),
)


def model_run(actions) -> RunData:
    """Replay actions against an obviously-correct replicated log: acked writes are always committed,
    unknown writes may or may not be, a kill elects the next replica at epoch + 1 and all replicas
    hold the same committed log."""
    b = RunBuilder()
    logs = {(g, q): [] for g in range(2) for q in range(2)}
    master = {g: 1 for g in range(2)}
    epoch = {g: 1 for g in range(2)}
    entries = {g: [(1, 0)] for g in range(2)}
    readers = {key: 0 for key in logs}
    clock = 0
    for n, action in enumerate(actions):
        clock += 10
        if action[0] == "send":
            _, g, q, kind = action
            log = logs[(g, q)]
            offset = len(log)
            if kind in ("ok", "unknown-kept"):
                log.append(f"m{n}")
            outcome = {"ok": "ok", "failed": "failed"}.get(kind, "unknown")
            b.send(f"m{n}", offset if kind == "ok" else None, group=f"g{g}", queue_id=q, outcome=outcome,
                   start=clock, end=clock + 5, broker_id=master[g])
        elif action[0] == "kill":
            g = action[1]
            b.sample(clock, master[g], "MASTER", epoch[g], group=f"g{g}")
            b.nem(clock, "kill-master", group=f"g{g}", target=f"g{g}/{master[g]}")
            b.sample(clock + 1, master[g], "SLAVE", -1, group=f"g{g}")  # restarted, epoch unknown
            master[g] = master[g] % 3 + 1
            epoch[g] += 1
            entries[g].append((epoch[g], sum(len(logs[(g, q)]) for q in range(2))))
            b.sample(clock + 2, master[g], "MASTER", epoch[g], group=f"g{g}")
            b.nem(clock + 3, "kill-master", "end", group=f"g{g}", target=f"g{g}/{master[g]}")
        else:
            _, g, q, count = action
            log = logs[(g, q)]
            for offset in range(readers[(g, q)], min(len(log), readers[(g, q)] + count)):
                b.read(log[offset], offset, group=f"g{g}", queue_id=q, at=clock, process=f"reader-{g}-{q}",
                       broker_id=master[g])
            readers[(g, q)] = min(len(log), readers[(g, q)] + count)
    clock += 10
    b.nem(clock, "heal", "end", group=None)
    for (g, q), log in logs.items():
        for offset, payload in enumerate(log):
            b.read(payload, offset, group=f"g{g}", queue_id=q, at=clock + 1, process="final")
    for g in range(2):
        size = sum(len(logs[(g, q)]) for q in range(2))
        data = json.dumps([logs[(g, q)] for q in range(2)]).encode()
        ends = [s for _, s in entries[g][1:]] + [size]
        epoch_entries = tuple((e, s, end) for (e, s), end in zip(entries[g], ends))
        for broker_id in (1, 2, 3):
            role = "MASTER" if broker_id == master[g] else "SLAVE"
            b.replica(broker_id, role, epoch[g], group=f"g{g}", digest_hex=digest(data), confirm=size,
                      entries=epoch_entries)
    return b.data()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ACTIONS, max_size=60))
def test_model_run_with_random_kills_never_reports_loss(actions):
    """Property: a history from a correct log model, whatever the kills, is valid with nothing lost."""
    v = check(model_run(actions))
    assert v.lost == 0 and v.inconsistent_offsets == 0 and v.nonmonotonic == 0
    assert v.masters_per_epoch_max <= 1 and v.epochs_monotonic and v.replicas_converged
    assert v.valid


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ACTIONS, max_size=60), st.data())
def test_removing_any_acked_payload_from_reads_reports_exactly_one_lost(actions, data):
    """Property: delete every read of one acknowledged payload and the checker reports exactly one loss."""
    run = model_run(actions)
    acked = sorted({op.payload_id for op in run.ops if op.is_send and op.ok})
    if not acked:
        return
    victim = data.draw(st.sampled_from(acked))
    ops = tuple(op for op in run.ops if not (op.is_read and op.payload_id == victim))
    v = check(replace(run, ops=ops))
    assert v.lost == 1 and not v.valid
    assert v.examples["lost"][0]["payload_id"] == victim


def test_json_heal_ms_is_a_duration_from_the_runs_first_record():
    """Histories carry wall-clock ms; the summary's heal_ms must not be that timestamp."""
    import dataclasses

    epoch = 1_763_800_000_000
    run = clean_run().data()
    shifted = dataclasses.replace(
        run, ops=[dataclasses.replace(op, start_ms=op.start_ms + epoch, end_ms=op.end_ms + epoch) for op in run.ops],
        nemesis=[dataclasses.replace(e, time_ms=e.time_ms + epoch) for e in run.nemesis])
    for data, offset in ((run, 0), (shifted, epoch)):
        out = check(data).to_json()
        assert out["heal_ms"] == 300  # first record at 0 (+offset), final heal at 300 (+offset)
        assert out["heal_at_ms"] == 300 + offset
    assert check(dataclasses.replace(run, nemesis=[])).to_json()["heal_ms"] is None
