"""``rocketray admin consumer-progress`` and ``reset-offset`` without Ray: the commands run in-process
through ``rocketray.cli.main`` against the in-memory cluster of tests/support/fake_client_cluster.py
(the CLI's Admin gets its transport), so what is checked is the command: text, --json, exits."""

from __future__ import annotations

import json

import pytest

from rocketray.cli import admin_common
from rocketray.cli.commands import admin_groups
from rocketray.client import Consumer, Producer
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


def test_reset_offset_latest_then_back_is_kept(fake, capsys):
    """--to latest commits each queue's end; --to earliest afterwards moves nothing and says why."""
    c, _ = fake
    code, out, err = cli(capsys, "reset-offset", "-g", "billing", "-t", "orders", "--to", "latest")
    assert (code, err) == (0, "")
    assert out.splitlines()[0] == "#Group  billing  #Topic  orders  reset to latest"
    assert out.splitlines()[2].split() == ["0", "-", "3"] and out.splitlines()[-1] == "moved 2 of 2 queues"
    assert c.committed == {("billing", "orders", 0): 3, ("billing", "orders", 1): 3}
    code, out, _ = cli(capsys, "reset-offset", "-g", "billing", "-t", "orders", "--to", "earliest", "--json")
    assert code == 0 and json.loads(out) == [
        {"topic": "orders", "queue_id": q, "before": 3, "after": 3, "moved": False} for q in (0, 1)]
    code, out, _ = cli(capsys, "consumer-progress", "-g", "billing", "--json")
    assert code == 0 and [r["committed_offset"] for r in json.loads(out)["billing"]] == [3, 3]


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
