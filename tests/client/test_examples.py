"""The user guide's examples (examples/*.py, whose marked parts docs/client.md shows) run as written
against the in-memory cluster of tests/support/fake_client_cluster.py: ``ray.init`` is a no-op and
every client the example makes by cluster name gets the in-memory transport. The same files run
against a real cluster in tests/cluster/test_client_groups_e2e.py."""

from __future__ import annotations

import importlib.util
import signal
import sys
from pathlib import Path

import pytest

from tests.support.fake_client_cluster import FakeCluster, FakeTransport

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def cluster(monkeypatch):
    """One in-memory cluster named "demo" for every client the examples make; fast membership."""
    import ray

    from rocketray.client import admin, consumer, producer

    c = FakeCluster()

    class Demo(FakeTransport):
        def config(self):
            from rocketray.config import profile_config

            return profile_config("fast")

    def connect(name: str) -> FakeTransport:
        assert name == "demo"
        return Demo(c)

    for module in (admin, consumer, producer):
        monkeypatch.setattr(module, "connect_transport", connect)
    monkeypatch.setattr(ray, "init", lambda *a, **k: None)
    previous = signal.getsignal(signal.SIGTERM)
    yield c
    signal.signal(signal.SIGTERM, previous)


def test_quickstart(cluster, capsys):
    load("quickstart").main("demo")
    assert "group billing received all 101 and committed" in capsys.readouterr().out


def test_produce_then_consume_loop(cluster, capsys):
    load("produce").main("demo", count=300)
    assert "sent 300, failed 0, unknown 0" in capsys.readouterr().out
    assert load("consume_loop").main("demo", idle_exit_s=1.0) == 300
    assert sum(o for (g, _t, _q), o in cluster.committed.items() if g == "billing") == 300


def test_replay(cluster, capsys):
    load("quickstart").main("demo")
    load("replay").main("demo")
    out = capsys.readouterr().out
    assert "read every queue from its start" in out and "again from offset 0" in out
    assert out.count(" -> 0") == 8 and "a new member of the group read 101 messages again" in out
    ends = {q: len(cluster.records[("orders", q)]) for q in range(8)}
    assert {q: o for (g, _t, q), o in cluster.committed.items() if g == "audit-replay"} == ends


def test_retries(cluster, capsys):
    """The poison message is delivered max_deliveries (3) times, then dead-lettered, read from the
    dead-letter topic and replayed to its topic; nothing else is nacked."""
    load("quickstart").main("demo")
    load("retries").main("demo")
    out = capsys.readouterr().out
    assert [line.split(" failed")[0] for line in out.splitlines() if " failed (" in line] == [
        "delivery 1", "delivery 2", "delivery 3"]
    assert "copy in %DLQ%invoicing" in out and "dead letter of orders/" in out
    assert "invoicing: 2 retried, 0 pending, 1 dead-lettered" in out
    assert sum(len(cluster.records[("orders", q)]) for q in range(8)) == 101 + 1 + 1     # quickstart, poison, replay


def test_asyncio_app(cluster, capsys):
    load("quickstart").main("demo")
    load("asyncio_app").main("demo")
    assert "async-billing received all 100 sent" in capsys.readouterr().out


def test_outside_ray(cluster, capsys, monkeypatch, tmp_path):
    """The outside-Ray example with a client configuration file: the Bootstrap it reads reaches the
    in-memory cluster named in the file; a group the user may not join prints what to allow."""
    from rocketray.client import AccessDenied, consumer, producer

    load("quickstart").main("demo")
    config = tmp_path / "app.rocketray.toml"
    config.write_text('cluster = "demo"\nservers = ["127.0.0.1:1"]\nuser = "app"\nsecret = "s"\ntls = false\n')
    transports = []

    def connect(target):
        assert target.cluster == "demo" and target.user == "app"
        transports.append(target)
        return FakeTransport(cluster)

    for module in (consumer, producer):
        monkeypatch.setattr(module, "connect_transport", connect)
    load("outside_ray").main(str(config))
    out = capsys.readouterr().out
    assert "orders/" in out and "b'order 18 paid'" in out and len(transports) == 2

    class Denied(consumer.Consumer):
        def __init__(self, *args, **kwargs):
            raise AccessDenied("denied", resource="Group:billing", action="Sub")

    monkeypatch.setattr("rocketray.client.Consumer", Denied)
    load("outside_ray").main(str(config))
    assert "an operator must allow Sub on Group:billing" in capsys.readouterr().out


def test_metrics(cluster, capsys, monkeypatch, tmp_path):
    """The metrics example serves its producer's and consumer's series and reads its own page: one
    message sent, the consumer's lag per topic (0 once it polled the message)."""
    from rocketray.client import consumer, producer

    load("quickstart").main("demo")
    config = tmp_path / "app.rocketray.toml"
    config.write_text('cluster = "demo"\nservers = ["127.0.0.1:1"]\nuser = "app"\nsecret = "s"\ntls = false\n')
    for module in (consumer, producer):
        monkeypatch.setattr(module, "connect_transport", lambda target: FakeTransport(cluster))
    load("metrics").main(str(config), 0)
    out = capsys.readouterr().out.splitlines()
    assert any(line.endswith(": b'order 19 paid'") for line in out)
    assert [line.split("{")[0] + " " + line.rsplit(" ", 1)[1] for line in out if line.startswith("rocketray_")] == [
        "rocketray_client_producer_sent_total 1", "rocketray_client_consumer_lag_messages 0"]


def test_filters(cluster, capsys):
    load("filters").main("demo")
    assert "payments received {'paid': 25, 'refunded': 25}, lag 0" in capsys.readouterr().out
    ends = {q: len(cluster.records[("order-events", q)]) for q in range(4)}
    assert {q: o for (g, _t, q), o in cluster.committed.items() if g == "payments"} == ends


def test_delayed(cluster, capsys):
    """Both reminders come at or after their times, through the schedule queues of their broker group."""
    load("delayed").main("demo")
    out = capsys.readouterr().out
    assert "received 2 reminders, none early: True" in out and "early\n" not in out
    assert sum(len(r) for (t, _q), r in cluster.records.items() if t == "%SCHEDULE%reminders") == 2


def test_replay_by_time(cluster, capsys):
    load("quickstart").main("demo")
    load("replay_by_time").main("demo")
    out = capsys.readouterr().out
    assert "101 messages stored in the last hour, none before" in out and ": True" in out
    assert out.count(" -> 0") == 8              # all stored in the last five minutes: each queue from 0
