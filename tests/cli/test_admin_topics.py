"""``rocketray admin update-topic / delete-topic / topic-route / topic-list`` without Ray: the exact text
lines, ``--json``, error exits, and the argument parsing. The commands run in-process through
``rocketray.cli.main`` against a fake cluster whose ``call_controller`` is the pure controller core
(decide + apply), so what is checked is the command, not a copy of it. tests/actors/test_admin.py
runs the same commands once against a real cluster."""

from __future__ import annotations

import json

import pytest

from rocketray.cli import admin_format as fmt
from rocketray.cli.commands import admin

from core_cluster import CoreCluster, install


@pytest.fixture
def core(monkeypatch):
    return install(monkeypatch, CoreCluster(groups=("broker-a", "broker-b")))


def cli(capsys, *argv):
    from rocketray.cli.main import main

    code = main(["admin", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_update_topic_creates_then_is_idempotent_then_extends(core, capsys):
    """update-topic: created (round robin over the groups), the same count again is unchanged, a larger
    count extends keeping the old queues."""
    code, out, err = cli(capsys, "update-topic", "-t", "orders", "-q", "3")
    assert (code, err) == (0, "")
    assert out == ("create topic orders to controller success.\n"
                   "#Topic\torders\n#QueueNums\t3\n#Queue\t0\tbroker-a\n#Queue\t1\tbroker-b\n#Queue\t2\tbroker-a\n")
    code, out, _ = cli(capsys, "update-topic", "-t", "orders", "-q", "3")
    assert code == 0 and out.splitlines()[0] == "topic orders unchanged: it already has 3 queues."
    code, out, _ = cli(capsys, "update-topic", "-t", "orders", "--queues", "4", "--json")
    data = json.loads(out)
    assert code == 0 and data["code_name"] == "SUCCESS" and data["header"] == {
        "topic": "orders", "created": True,
        "queues": [[0, "broker-a"], [1, "broker-b"], [2, "broker-a"], [3, "broker-b"]]}


def test_update_topic_default_queue_count_is_mqadmins_eight(core, capsys):
    code, _, _ = cli(capsys, "update-topic", "-t", "orders")
    assert code == 0 and core.requests[-1].queues == admin.DEFAULT_TOPIC_QUEUES == 8


def test_route_list_and_delete(core, capsys):
    cli(capsys, "update-topic", "-t", "b-topic", "-q", "2")
    cli(capsys, "update-topic", "-t", "a-topic", "-q", "1")
    code, out, _ = cli(capsys, "topic-route", "-t", "b-topic")
    assert code == 0 and out == "#Topic\tb-topic\n#QueueNums\t2\n#Queue\t0\tbroker-a\n#Queue\t1\tbroker-b\n"
    code, out, _ = cli(capsys, "topic-route", "-t", "b-topic", "--json")
    assert json.loads(out)["header"] == {"topic": "b-topic", "queues": [[0, "broker-a"], [1, "broker-b"]]}
    code, out, _ = cli(capsys, "topic-list")
    assert code == 0 and out == "a-topic\t1\nb-topic\t2\n"
    code, out, _ = cli(capsys, "topic-list", "--json")
    assert json.loads(out)["header"] == {"topics": {"a-topic": 1, "b-topic": 2}}
    code, out, _ = cli(capsys, "delete-topic", "-t", "a-topic")
    assert code == 0 and out == "delete topic [a-topic] from controller success.\n"
    code, out, _ = cli(capsys, "delete-topic", "-t", "b-topic", "--json")
    assert code == 0 and json.loads(out)["header"] == {"topic": "b-topic"}
    code, out, _ = cli(capsys, "topic-list")
    assert code == 0 and out == "(no topics)\n"


@pytest.mark.parametrize("argv,line", [
    (("topic-route", "-t", "nope"), "error: TOPIC_NOT_EXIST (17): topic 'nope' does not exist"),
    (("delete-topic", "-t", "nope"), "error: TOPIC_NOT_EXIST (17): topic 'nope' does not exist"),
    (("update-topic", "-t", "bad name", "-q", "1"),
     "error: CONTROLLER_INVALID_REQUEST (2005): topic name 'bad name' has characters outside [%|a-zA-Z0-9_-]"),
    (("update-topic", "-t", "%SYS%g", "-q", "1"), "error: CONTROLLER_INVALID_REQUEST (2005): topic name "
     "'%SYS%g' is reserved for system topics (names starting with '%' or '__', except a group's %RETRY%<group> "
     "and %DLQ%<group>)"),
    (("update-topic", "-t", "orders", "-q", "0"),
     "error: CONTROLLER_INVALID_REQUEST (2005): queue count 0 is outside 1..1024"),
])
def test_refusals_print_the_code_name_and_exit_1(core, capsys, argv, line):
    code, out, err = cli(capsys, *argv)
    assert code == 1 and out == "" and err.strip() == line


def test_shrinking_is_refused_and_json_errors_are_objects(core, capsys):
    cli(capsys, "update-topic", "-t", "orders", "-q", "4")
    code, out, _ = cli(capsys, "update-topic", "-t", "orders", "-q", "2", "--json")
    assert code == 1 and json.loads(out) == {"code": 2005, "code_name": "CONTROLLER_INVALID_REQUEST",
                                             "remark": "cannot shrink topic orders from 4 to 2 queues"}


def test_no_broker_group_yet(monkeypatch, capsys):
    install(monkeypatch, CoreCluster(groups=()))
    code, _, err = cli(capsys, "update-topic", "-t", "orders", "-q", "1")
    assert code == 1 and "CONTROLLER_INVALID_REQUEST (2005): no broker group registered yet" in err


@pytest.mark.parametrize("argv", [("update-topic",), ("update-topic", "-t", "x", "-q", "many"), ("topic-route",),
                                  ("delete-topic",)])
def test_bad_arguments_are_usage_errors(core, capsys, argv):
    with pytest.raises(SystemExit) as exit_:
        cli(capsys, *argv)
    assert exit_.value.code == 2 and core.requests == []


def test_route_lines_are_in_queue_order_whatever_the_header_order():
    assert fmt.format_topic_route({"topic": "t", "queues": [[1, "b"], [0, "a"]]}) == (
        "#Topic\tt\n#QueueNums\t2\n#Queue\t0\ta\n#Queue\t1\tb")


def test_topic_events_in_the_event_log_output():
    """get-controller-events shows a topic event with no group, its queue count and the topic table."""
    event = {"index": 9, "seq": 0, "term": 2, "time_ms": 1_700_000_000_000, "type": "CreateTopicEvent",
             "topic": "orders", "broker_names": ["broker-a", "broker-b", "broker-a"], "master_broker_id": None,
             "master_epoch": None, "sync_state_set": None, "sync_state_set_epoch": None}
    assert fmt.format_controller_events([event]) == (
        "9.0\t2023-11-14T22:13:20.000Z\tCreateTopicEvent\t-\ttopic=orders queues=3\t-> (topic table)")
