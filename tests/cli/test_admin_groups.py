"""``rocketray admin consumer-progress`` and ``reset-offset`` without Ray: the commands run in-process
through ``rocketray.cli.main`` against the in-memory cluster of tests/support/fake_client_cluster.py
(the CLI's Admin gets its transport), so what is checked is the command: text, --json, exits."""

from __future__ import annotations

import json

import pytest

from rocketray.cli import admin_common
from rocketray.cli.commands import admin_groups
from rocketray.client import Consumer, Producer
from rocketray.waiting import wait_for
from tests.support.fake_client_cluster import FakeCluster, FakeTransport


@pytest.fixture
def fake(monkeypatch):
    c = FakeCluster()
    c.create_topic("orders", 2)
    transport = FakeTransport(c)
    monkeypatch.setattr(admin_common, "connect_cluster", lambda address, name: c)
    monkeypatch.setattr(admin_groups, "client_transport", lambda cluster: transport)
    with Producer(transport=transport) as p:
        for i in range(6):
            p.send("orders", b"x")                 # 3 per queue
    return c, transport


def cli(capsys, *argv):
    from rocketray.cli.main import main

    code = main(["admin", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_reset_offset_latest_then_back_to_earliest(fake, capsys):
    """--to latest sets each queue's end; --to earliest afterwards moves the stopped group back to 0
    with reset records (a commit could not: it only raises an offset); a second time says "already there"."""
    c, _ = fake
    code, out, err = cli(capsys, "reset-offset", "-g", "billing", "-t", "orders", "--to", "latest")
    assert (code, err) == (0, "")
    assert out.splitlines()[0] == "#Group  billing  #Topic  orders  reset to latest"
    assert out.splitlines()[2].split() == ["0", "-", "3"] and out.splitlines()[-1] == "moved 2 of 2 queues"
    assert c.committed == {("billing", "orders", 0): 3, ("billing", "orders", 1): 3}
    code, out, _ = cli(capsys, "reset-offset", "-g", "billing", "-t", "orders", "--to", "earliest", "--json")
    assert code == 0 and json.loads(out) == [
        {"topic": "orders", "queue_id": q, "before": 3, "after": 0, "moved": True} for q in (0, 1)]
    code, out, _ = cli(capsys, "consumer-progress", "-g", "billing", "--json")
    assert code == 0 and [r["committed_offset"] for r in json.loads(out)["billing"]] == [0, 0]
    assert [entries for _g, entries in c.resets[2:]] == [[("orders", 0, 0)], [("orders", 1, 0)]]  # one per broker group
    code, out, _ = cli(capsys, "reset-offset", "-g", "billing", "-t", "orders", "--to", "earliest")
    assert code == 0 and out.splitlines()[2].split() == ["0", "0", "0", "already", "there"]
    assert out.splitlines()[-1] == "moved 0 of 2 queues" and len(c.resets) == 4     # nothing written


def test_reset_offset_overtaken_by_a_late_commit_fails(fake, capsys):
    """A member the controller no longer counts commits its old position right after the reset
    record: the read-back sees the queue above the target and the command fails RESET_OVERTAKEN."""
    c, _ = fake
    cli(capsys, "reset-offset", "-g", "billing", "-t", "orders", "--to", "latest")
    real_commit = c.commit

    def commit_then_race(consumer_group, entries, reset=False):
        answer = real_commit(consumer_group, entries, reset)
        if reset and entries == [("orders", 1, 0)]:       # a late commit lands right after queue 1's reset
            real_commit(consumer_group, [("orders", 1, 3)])
        return answer
    c.commit = commit_then_race
    code, _out, err = cli(capsys, "reset-offset", "-g", "billing", "-t", "orders", "--to", "earliest")
    assert code == 1 and "RESET_OVERTAKEN" in err and "orders/1 at 3 (reset to 0)" in err
    assert c.committed == {("billing", "orders", 0): 0, ("billing", "orders", 1): 3}


def test_reset_offset_is_refused_while_the_group_has_members(fake, capsys):
    c, transport = fake
    with Consumer(group="billing", topics=["orders"], transport=transport, client_id="m1"):
        code, out, err = cli(capsys, "reset-offset", "-g", "billing", "-t", "orders", "--to", "1")
    assert code == 1 and "GROUP_ACTIVE" in err and "m1" in err and not c.committed


@pytest.mark.parametrize("to", ["first", "-3"])
def test_reset_offset_rejects_a_bad_target(fake, capsys, to):
    with pytest.raises(SystemExit) as exc:
        cli(capsys, "reset-offset", "-g", "billing", "-t", "orders", "--to", to)
    assert exc.value.code == 2


def test_reset_offset_of_a_missing_topic_names_it(fake, capsys):
    code, _, err = cli(capsys, "reset-offset", "-g", "billing", "-t", "nope", "--to", "latest")
    assert code == 1 and "topic 'nope' does not exist" in err


def test_consumer_progress_shows_the_groups_retries_and_dead_letters(fake, capsys):
    """A group's retry topic is one of its topics (its rows show what the group consumed of it); the
    lines under the table count what is waiting there and what was dead-lettered."""
    c, transport = fake
    code, out, _ = cli(capsys, "consumer-progress", "-g", "billing")
    assert code == 0 and out.splitlines()[-2:] == ["Retry topic %RETRY%billing: not created (nothing nacked)",
                                                   "Dead-letter topic %DLQ%billing: not created (nothing dead-lettered)"]
    fast = {"consumer_heartbeat_interval_ms": 20, "route_refresh_ms": 50, "retry_delays": "100ms 5s"}
    with Consumer(group="billing", topics=["orders"], transport=transport, max_deliveries=1, **fast) as first:
        got: list = []
        wait_for(lambda: got.extend(first.poll(0.05)) or len(got) == 6, 10, "the 6 messages")
        first.nack(got[0])                                 # its first delivery was its last: dead-lettered
        first.commit()
    with Producer(transport=transport) as p:
        p.send("orders", b"y")
    with Consumer(group="billing", topics=["orders"], transport=transport, **fast) as second:
        (m,) = wait_for(lambda: second.poll(0.05), 10, "the new message")
        second.nack(m, delay_s=5)                          # waits in the retry topic's 5 s queue
        second.commit()
    code, out, _ = cli(capsys, "consumer-progress", "-g", "billing")
    assert code == 0 and out.splitlines()[-2:] == ["Retry topic %RETRY%billing: 1 stored, 1 not consumed yet",
                                                   "Dead-letter topic %DLQ%billing: 1 stored"]
    code, out, _ = cli(capsys, "consumer-progress", "-g", "billing", "--json")
    stats = json.loads(out)["#retries"]["billing"]
    assert (stats["retried"], stats["retry_pending"], stats["dead_letters"]) == (1, 1, 1)
    assert [r["topic"] for r in json.loads(out)["billing"]] == ["orders", "orders"]


def test_reset_offset_to_a_time_moves_each_queue_to_its_first_message_stored_then(fake, capsys):
    """--to an ISO-8601 time or @EPOCH_MS: each queue's first offset stored at or after it (its end
    when all are older), back or forward."""
    from rocketray.wire.message import decode_record

    c, _ = fake
    times = [decode_record(r)[0].store_timestamp_ms for r in c.records[("orders", 0)]]
    code, out, err = cli(capsys, "reset-offset", "-g", "billing", "-t", "orders", "--to", f"@{times[0] - 1}", "--json")
    assert (code, err) == (0, "") and [r["after"] for r in json.loads(out)] == [0, 0]
    code, out, _ = cli(capsys, "reset-offset", "-g", "billing", "-t", "orders", "--to", "2999-01-01T00:00:00")
    assert code == 0 and "reset to 2999-01-01T00:00:00.000+00:00 (@32472144000000)" in out
    assert c.committed == {("billing", "orders", 0): 3, ("billing", "orders", 1): 3}
    code, out, _ = cli(capsys, "reset-offset", "-g", "billing", "-t", "orders", "--to", "1970-01-01T01:00:00+01:00",
                       "--json")
    assert code == 0 and [(r["after"], r["moved"]) for r in json.loads(out)] == [(0, True), (0, True)]


@pytest.mark.parametrize("to, expected", [
    ("@0", "1970-01-01T00:00:00+00:00"),
    ("@1764318600000", "2025-11-28T08:30:00+00:00"),
    ("2026-11-28T09:30:00+01:00", "2026-11-28T09:30:00+01:00"),
    ("2026-11-28T09:30:00Z", "2026-11-28T09:30:00+00:00"),
    ("2026-11-28", "2026-11-28T00:00:00+00:00"),
    ("7", 7),
    ("latest", "latest"),
])
def test_reset_targets_parse(to, expected):
    got = admin_groups.reset_target(to)
    assert (got.isoformat() if hasattr(got, "isoformat") else got) == expected


@pytest.mark.parametrize("to", ["@", "@-5", "@x", "2026-13-01", "yesterday", "@99999999999999999999"])
def test_reset_offset_rejects_a_bad_time(fake, capsys, to):
    with pytest.raises(SystemExit) as exc:
        cli(capsys, "reset-offset", "-g", "billing", "-t", "orders", "--to", to)
    assert exc.value.code == 2
