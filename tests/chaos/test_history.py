"""The chaos run directory format: records round-trip, and every malformed line is named by file and line."""

from __future__ import annotations

import json

import pytest

from rocketray.verify.history import ControllerEventRecord, NemesisEvent, OpRecord, ReplicaSnapshot, RunDirError, Sample
from rocketray.verify.run_dir import RunData, read_history, read_replicas, read_run_dir, read_samples, write_run_dir

DIGEST = "ab" * 32


def op_json(**overrides):
    base = {"op_id": 1, "process": "producer-0", "f": "send", "group": "broker-a", "queue_id": 0,
            "payload_id": "p-1", "queue_offset": 0, "physical_offset": 0, "start_ms": 1000, "end_ms": 1005,
            "outcome": "ok", "broker_id": 1, "error": None}
    base.update(overrides)
    return base


def replica_json(**overrides):
    base = {"group": "broker-a", "broker_id": 1, "role": "MASTER", "master_epoch": 2,
            "epoch_entries": [[1, 0, 100], [2, 100, 250]], "min_offset": 0, "max_offset": 250,
            "confirm_offset": 250}
    base.update(overrides)
    return base


def write_lines(path, objs):
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs))


def sample_run() -> RunData:
    return RunData(
        ops=(OpRecord.from_json(op_json()),
             OpRecord.from_json(op_json(op_id=2, f="read", process="final", start_ms=2000, end_ms=2001)),
             OpRecord.from_json(op_json(op_id=3, payload_id=7, outcome="unknown", queue_offset=None,
                                        physical_offset=None, broker_id=None, error="FLUSH_SLAVE_TIMEOUT"))),
        nemesis=(NemesisEvent(1500, "kill-master", "start", "broker-a/1", "broker-a"),
                 NemesisEvent(1900, "heal", "end", None, None)),
        replicas=(ReplicaSnapshot.from_json(replica_json(digest_to_confirm=DIGEST)),
                  ReplicaSnapshot.from_json(replica_json(broker_id=2, role="SLAVE"))),
        samples=(Sample(1200, "broker-a", 1, "MASTER", 1, 100, 100),),
        controller_events=(ControllerEventRecord(0, 1100, "ElectMasterEvent",
                                                 {"broker_name": "broker-a", "new_master_elected": True}),),
    )


def test_run_dir_round_trips_through_files(tmp_path):
    """Writing a run directory and reading it back gives the same records (contract keys, optional digest)."""
    run = sample_run()
    write_run_dir(tmp_path / "run", run)
    assert read_run_dir(tmp_path / "run") == run
    replicas = json.loads((tmp_path / "run" / "replicas.json").read_text())
    assert replicas[0]["digest_to_confirm"] == DIGEST
    assert "digest_to_confirm" not in replicas[1]
    first = json.loads((tmp_path / "run" / "history.jsonl").read_text().splitlines()[0])
    assert list(first) == ["op_id", "process", "f", "group", "queue_id", "payload_id", "queue_offset",
                           "physical_offset", "start_ms", "end_ms", "outcome", "broker_id", "error"]


def test_only_history_is_required(tmp_path):
    """A run directory with just history.jsonl reads with empty optional tables; without it, the error names it."""
    write_lines(tmp_path / "history.jsonl", [op_json()])
    run = read_run_dir(tmp_path)
    assert len(run.ops) == 1 and run.nemesis == () and run.replicas == () and run.samples == ()
    (tmp_path / "history.jsonl").unlink()
    with pytest.raises(RunDirError, match="history.jsonl"):
        read_run_dir(tmp_path)


def test_nullable_keys_may_be_absent_and_unknown_keys_are_ignored(tmp_path):
    """Keys the contract marks 'null if unknown' default to null; extra keys do not break old readers."""
    obj = op_json(extra="ignored")
    for key in ("queue_offset", "physical_offset", "broker_id", "error"):
        del obj[key]
    write_lines(tmp_path / "history.jsonl", [obj, "", op_json(op_id=2)])  # blank lines are skipped
    ops = read_history(tmp_path / "history.jsonl")
    assert ops[0].queue_offset is None and ops[0].broker_id is None and ops[0].error is None
    assert ops[1].op_id == 2


@pytest.mark.parametrize("bad, reason", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    (op_json(outcome="maybe"), "'outcome' must be one of"),
    (op_json(f="write"), "'f' must be one of"),
    (op_json(queue_id=True), "'queue_id' must be an integer"),
    (op_json(queue_id=-1), "'queue_id' must be >= 0"),
    (op_json(group=None), "'group' must not be null"),
    (op_json(start_ms="soon"), "'start_ms' must be a number"),
    (op_json(start_ms=10, end_ms=5), "end_ms 5 is before start_ms 10"),
    (op_json(payload_id=None), "'payload_id' must not be null"),
    (op_json(f="read", queue_offset=None), "'queue_offset' must not be null for an ok read"),
    ({k: v for k, v in op_json().items() if k != "outcome"}, "missing required key 'outcome'"),
])
def test_malformed_history_line_names_file_and_line(tmp_path, bad, reason):
    """The third line is bad: the error says history.jsonl:3 and why."""
    write_lines(tmp_path / "history.jsonl", [op_json(), op_json(op_id=2), bad])
    with pytest.raises(RunDirError) as exc:
        read_run_dir(tmp_path)
    assert str(exc.value).startswith("history.jsonl:3: ")
    assert reason in str(exc.value)
    assert exc.value.file == "history.jsonl" and exc.value.line == 3


def test_failed_read_may_have_no_payload(tmp_path):
    """A read that failed carries no message; only ok reads must name payload and offset."""
    write_lines(tmp_path / "history.jsonl",
                [op_json(f="read", outcome="failed", payload_id=None, queue_offset=None, error="SYSTEM_ERROR")])
    assert read_history(tmp_path / "history.jsonl")[0].payload_id is None


@pytest.mark.parametrize("name, bad, reason", [
    ("nemesis.jsonl", {"time_ms": 1, "kind": "explode", "phase": "start", "target": None, "group": None},
     "'kind' must be one of"),
    ("nemesis.jsonl", {"time_ms": 1, "kind": "heal", "phase": "middle", "target": None}, "'phase' must be one of"),
    ("samples.jsonl", {"time_ms": 1, "group": "g", "broker_id": 1, "role": "MASTER", "master_epoch": 1,
                       "max_offset": 0}, "missing required key 'confirm_offset'"),
    ("controller_events.jsonl", {"index": -1, "time_ms": 1, "type": "X"}, "'index' must be >= 0"),
])
def test_malformed_optional_files_name_file_and_line(tmp_path, name, bad, reason):
    """Each JSONL file of the run directory is validated the same way."""
    write_lines(tmp_path / "history.jsonl", [op_json()])
    write_lines(tmp_path / name, [bad])
    with pytest.raises(RunDirError, match=f"^{name}:1: .*{reason}"):
        read_run_dir(tmp_path)


@pytest.mark.parametrize("bad, reason", [
    (replica_json(epoch_entries=[[1, 0]]), "epoch_entries[0] must be [epoch, start, end]"),
    (replica_json(digest_to_confirm="XYZ"), "'digest_to_confirm' must be 64 lowercase hex digits"),
    (replica_json(min_offset=-3), "'min_offset' must be >= 0"),
    ("oops", "expected a JSON object"),
])
def test_malformed_replica_names_file_line_and_item(tmp_path, bad, reason):
    """replicas.json is one list; the error names the line where the bad item starts and its index."""
    items = [json.dumps(replica_json()), json.dumps(replica_json(broker_id=2)), json.dumps(bad)]
    (tmp_path / "replicas.json").write_text("[\n" + ",\n".join(items) + "\n]\n")
    with pytest.raises(RunDirError) as exc:
        read_replicas(tmp_path / "replicas.json")
    assert str(exc.value).startswith("replicas.json:4 [item 2]: ")
    assert reason in str(exc.value)


def test_replicas_json_must_be_a_list(tmp_path):
    (tmp_path / "replicas.json").write_text(json.dumps(replica_json()))
    with pytest.raises(RunDirError, match="^replicas.json:1: expected a JSON list"):
        read_replicas(tmp_path / "replicas.json")


@pytest.mark.parametrize("written, read", [("MASTER", "MASTER"), ("SLAVE", "SLAVE"), ("NONE", "NONE"),
                                           ("master", "MASTER"), ("slave", "SLAVE")])
def test_roles_read_as_the_one_spelling(tmp_path, written, read):
    """The role enum's names, and the lowercase legacy spellings of saved runs read as those names."""
    write_lines(tmp_path / "samples.jsonl", [{"time_ms": 1, "group": "g", "broker_id": 1, "role": written,
                                              "master_epoch": 1, "max_offset": 0, "confirm_offset": 0}])
    sample = read_samples(tmp_path / "samples.jsonl")[0]
    assert sample.role == read and sample.is_master == (read == "MASTER")
    assert ReplicaSnapshot.from_json(replica_json(role=written)).role == read


@pytest.mark.parametrize("bad", ["SYNC_MASTER", "ASYNC_MASTER", "Master", "none", "leader", ""])
def test_a_role_in_no_known_spelling_is_refused(tmp_path, bad):
    """Any other spelling names the file, the line and the spellings accepted."""
    write_lines(tmp_path / "history.jsonl", [op_json()])
    write_lines(tmp_path / "samples.jsonl", [{"time_ms": 1, "group": "g", "broker_id": 1, "role": bad,
                                              "master_epoch": 1, "max_offset": 0, "confirm_offset": 0}])
    with pytest.raises(RunDirError, match=r"^samples.jsonl:1: .*'role' must be one of NONE, SLAVE, MASTER"):
        read_run_dir(tmp_path)
