"""The two shells of rocketray.client.metrics_export, against a producer and a consumer on the
in-memory cluster (tests/support/fake_client_cluster.py): the Prometheus page answers a real HTTP GET
on 127.0.0.1 with the clients' counters now, and imports no Ray; the Ray exporter records the same
rows on metric objects (a recording stand-in of ``ray.util.metrics``; Ray is not started)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from rocketray.client import Consumer, InvalidRequest, Producer
from rocketray.client.metrics_export import RayMetricObjects, export_to_ray, serve_prometheus
from rocketray.client.metrics_series import DEFINITIONS, SeriesDef
from rocketray.waiting import wait_for
from tests.support.fake_client_cluster import FakeCluster, FakeTransport

ROOT = Path(__file__).resolve().parents[2]
FAST = {"consumer_heartbeat_interval_ms": 20, "route_refresh_ms": 50}


@pytest.fixture
def transport():
    c = FakeCluster()
    c.create_topic("t", 2)
    yield FakeTransport(c)
    c.close()


def scrape(url: str) -> tuple[str, dict[str, float]]:
    with urllib.request.urlopen(url, timeout=5) as answer:
        content_type = answer.headers["Content-Type"]
        text = answer.read().decode()
    samples = {}
    for line in text.splitlines():
        if not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            samples[series] = float(value)
    return content_type, samples


def test_the_prometheus_page_serves_a_producers_and_a_consumers_counters_now(transport):
    """GET /metrics answers the text format with both clients' series; a later GET shows what they
    did since (each scrape samples anew)."""
    with Producer(transport=transport, client_id="p1") as p, \
            Consumer(group="g", topics=["t"], transport=transport, client_id="c1", **FAST) as c, \
            serve_prometheus(0, p, c) as server:
        for i in range(6):
            p.send("t", f"m{i}".encode())
        content_type, before = scrape(server.url)
        assert content_type.startswith("text/plain; version=0.0.4")
        assert before['rocketray_client_producer_sent_total{client_id="p1"}'] == 6
        assert before['rocketray_client_consumer_received_total{client_id="c1",group="g"}'] == 0
        got: list = []
        wait_for(lambda: got.extend(c.poll(0.05)) or len(got) == 6, 10, "the 6 messages")
        c.commit()
        _, after = scrape(f"http://127.0.0.1:{server.port}/metrics")
        assert after['rocketray_client_consumer_received_total{client_id="c1",group="g"}'] == 6
        assert after['rocketray_client_consumer_committed_total{client_id="c1",group="g"}'] == 2
        assert after['rocketray_client_consumer_assigned_queues{client_id="c1",group="g"}'] == 2
        assert after['rocketray_client_consumer_lag_messages{client_id="c1",group="g",topic="t"}'] == 0
        assert set(k.split("{")[0] for k in after) == set(DEFINITIONS)


def test_the_page_refuses_other_paths_and_a_taken_port_is_a_clear_error(transport):
    with Producer(transport=transport) as p, serve_prometheus(0, p) as server:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/admin", timeout=5)
        assert err.value.code == 404
        with pytest.raises(InvalidRequest, match=f"127.0.0.1:{server.port}"):
            serve_prometheus(server.port, p)
        port = server.port
    with serve_prometheus(port, p) as again:                     # close freed the port
        assert scrape(again.url)[1]['rocketray_client_producer_sent_total{client_id="%s"}' % p.client_id] == 0
    with pytest.raises(TypeError, match="not str"):
        serve_prometheus(0, "producer")                          # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="at least one"):
        serve_prometheus(0)


def test_the_page_needs_no_ray():
    """Outside Ray (the base install has no Ray): with ``import ray`` failing, the page is served."""
    script = textwrap.dedent("""
        import sys, urllib.request
        sys.modules["ray"] = None                     # any import of ray raises ImportError
        from rocketray.client import Producer
        from rocketray.client.metrics_export import serve_prometheus
        from tests.support.fake_client_cluster import FakeCluster, FakeTransport
        c = FakeCluster(); c.create_topic("t", 1)
        with Producer(transport=FakeTransport(c), client_id="p") as p, serve_prometheus(0, p) as s:
            p.send("t", b"x")
            print(urllib.request.urlopen(s.url, timeout=5).read().decode())
        c.close()
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert 'rocketray_client_producer_sent_total{client_id="p"} 1' in out.stdout


class Recorded:
    """A stand-in of one ``ray.util.metrics`` object: the calls made on it."""

    def __init__(self, d: SeriesDef) -> None:
        self.d = d
        self.calls: list[tuple[str, float, dict]] = []

    def inc(self, value: float, tags: dict) -> None:
        assert value > 0 and set(tags) == set(self.d.label_keys)   # what Ray enforces
        self.calls.append(("inc", value, tags))

    def set(self, value: float, tags: dict) -> None:
        assert set(tags) == set(self.d.label_keys)
        self.calls.append(("set", value, tags))


class Objects:
    def __init__(self) -> None:
        self.made: dict[str, Recorded] = {}

    def make(self, d: SeriesDef) -> Recorded:
        assert d.name not in self.made, "one object per metric"
        self.made[d.name] = Recorded(d)
        return self.made[d.name]

    def total(self, name: str, **tags: str) -> float:
        return sum(v for m, v, t in self.made[name].calls if m == "inc" and t == tags)

    def value(self, name: str, **tags: str) -> float:
        return [v for m, v, t in self.made[name].calls if m == "set" and t == tags][-1]


def test_export_to_ray_records_counter_gains_and_gauges_on_its_timer(transport):
    """A first sample at once, then one per interval: counters increased by what they gained (their
    sum is the client's count), gauges set; stop records a last sample and ends the timer."""
    objects = Objects()
    with Producer(transport=transport, client_id="p1") as p, \
            Consumer(group="g", topics=["t"], transport=transport, client_id="c1", **FAST) as c:
        p.send("t", b"first")
        exporter = export_to_ray(p, c, interval_s=0.05, objects=objects)
        assert exporter.exports == 1
        assert objects.total("rocketray_client_producer_sent_total", client_id="p1") == 1
        for i in range(4):
            p.send("t", f"m{i}".encode())
        wait_for(lambda: objects.total("rocketray_client_producer_sent_total", client_id="p1") == 5, 10,
                 "the timer to record the 4 later sends")
        got: list = []
        wait_for(lambda: got.extend(c.poll(0.05)) or len(got) == 5, 10, "the 5 messages")
        exporter.stop()
        done = exporter.exports
        assert objects.total("rocketray_client_consumer_received_total", client_id="c1", group="g") == 5
        assert objects.value("rocketray_client_consumer_assigned_queues", client_id="c1", group="g") == 2
        assert objects.value("rocketray_client_consumer_lag_messages", client_id="c1", group="g", topic="t") == 0
        p.send("t", b"after stop")
        exporter.stop()                                          # idempotent: no further sample
        assert exporter.exports == done
        assert objects.total("rocketray_client_producer_sent_total", client_id="p1") == 5


def test_export_to_ray_refuses_a_bad_interval_and_a_process_without_ray_init(transport, monkeypatch):
    import ray

    # a process without ray.init (earlier tests of the same pytest process may have connected one)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with Producer(transport=transport) as p:
        with pytest.raises(InvalidRequest, match="interval_s"):
            export_to_ray(p, interval_s=0, objects=Objects())
        with pytest.raises(InvalidRequest, match="ray.init"):
            export_to_ray(p)


def test_asyncio_clients_are_served_through_the_client_underneath(transport):
    """An AsyncProducer's and an AsyncConsumer's series are their synchronous clients'."""
    import asyncio

    from rocketray.client.aio import AsyncConsumer, AsyncProducer

    async def run() -> dict[str, float]:
        async with AsyncProducer(transport=transport, client_id="ap") as p, \
                AsyncConsumer(group="ag", topics=["t"], transport=transport, client_id="ac", **FAST) as c:
            await p.send("t", b"x")
            with serve_prometheus(0, p, c) as server:
                return await asyncio.to_thread(lambda: scrape(server.url)[1])

    got = asyncio.run(run())
    assert got['rocketray_client_producer_sent_total{client_id="ap"}'] == 1
    assert got['rocketray_client_consumer_polls_total{client_id="ac",group="ag"}'] == 0


@pytest.mark.filterwarnings("error")
def test_every_series_is_accepted_by_ray_util_metrics(transport):
    """Ray's own metric classes (no Ray session: the records go nowhere) take every definition and
    its updates without a warning: Ray discards, with a warning, a metric whose name it finds
    invalid, and raises on a tag key it was not given or a value it refuses."""
    objects = RayMetricObjects()
    for d in DEFINITIONS.values():
        tags = {key: "x" for key in d.label_keys}
        obj = objects.make(d)
        obj.inc(2, tags=tags) if d.kind == "counter" else obj.set(0, tags=tags)
    with Producer(transport=transport) as p, Consumer(group="g", topics=["t"], transport=transport, **FAST) as c:
        p.send("t", b"x")
        wait_for(lambda: c.poll(0.05), 10, "the message")
        exporter = export_to_ray(p, c, interval_s=60, objects=RayMetricObjects())
        p.send("t", b"y")
        exporter.stop()
        assert exporter.exports == 2
