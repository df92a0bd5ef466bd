"""Client metrics on a live Ray and a live cluster: a producer's and a consumer's counters reach the
node's Prometheus endpoint through ``export_to_ray`` (as ``ray_rocketray_client_*``), and
``serve_prometheus`` answers a plain HTTP GET with the same counters."""

from __future__ import annotations

import re
import urllib.request

import pytest

from rocketray.client import Admin, Consumer, Producer, SendStatus
from rocketray.client.metrics_export import export_to_ray, serve_prometheus
from rocketray.client.socket_transport import SocketTransport
from rocketray.waiting import wait_for

pytestmark = pytest.mark.slow
SENT = 12
_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>[^}]*)\} (?P<value>\S+)$')


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as answer:
        assert answer.status == 200
        return answer.read().decode()


def values(text: str, client_id: str) -> dict[str, float]:
    """``name -> value`` of the samples labelled ``client_id``."""
    out = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and f'client_id="{client_id}"' in m.group("labels"):
            out[m.group("name")] = float(m.group("value"))
    return out


def traffic(cluster, topic: str, group: str):
    """A producer that sent ``SENT`` messages and a consumer that received them all (both open)."""
    transport = SocketTransport(cluster)
    Admin(transport=transport).create_topic(topic, queues=2)
    producer = Producer(transport=transport, client_id=f"{topic}-producer")
    assert all(producer.send(topic, b"m").status is SendStatus.SEND_OK for _ in range(SENT))
    consumer = Consumer(group=group, topics=[topic], transport=transport, client_id=f"{topic}-consumer")
    got: list = []
    wait_for(lambda: got.extend(consumer.poll(0.2)) or len(got) >= SENT, 60, "the sent messages")
    consumer.commit()
    return transport, producer, consumer


def test_client_counters_reach_rays_metrics_endpoint(make_cluster):
    """export_to_ray in this Ray driver: the node's metrics export port serves the producer's sent
    count and the consumer's received and committed counts, labelled with their client ids."""
    import ray

    cluster = make_cluster(controllers=1, replicas=2)
    transport, producer, consumer = traffic(cluster, "metered", "meter-readers")
    port = next(n["MetricsExportPort"] for n in ray.nodes() if n.get("Alive"))
    url = f"http://127.0.0.1:{port}/metrics"
    seen: dict[str, dict[str, float]] = {}

    def exported() -> bool:
        text = scrape(url)
        seen["producer"], seen["consumer"] = values(text, producer.client_id), values(text, consumer.client_id)
        return seen["producer"].get("ray_rocketray_client_producer_sent_total") == SENT and \
            seen["consumer"].get("ray_rocketray_client_consumer_received_total") == SENT and \
            seen["consumer"].get("ray_rocketray_client_consumer_committed_total", 0) >= 1

    with export_to_ray(producer, consumer, interval_s=0.5):
        try:
            wait_for(exported, 90, "the client series in Ray's metrics export", interval_s=1)
        except Exception:
            pytest.fail(f"client series not exported as expected from {url}: {seen}")
    assert seen["consumer"]["ray_rocketray_client_consumer_assigned_queues"] == 2
    consumer.close()
    producer.close()
    transport.close()


def test_serve_prometheus_answers_a_plain_http_get(make_cluster):
    """serve_prometheus on any free port: a GET of /metrics returns the text format with the live
    producer's and consumer's counters, a fresh sample per scrape; another path is a 404."""
    cluster = make_cluster(controllers=1, replicas=2)
    transport, producer, consumer = traffic(cluster, "served", "page-readers")
    with serve_prometheus(0, producer, consumer) as server:
        text = scrape(server.url)
        assert "# TYPE rocketray_client_producer_sent_total counter" in text
        assert values(text, producer.client_id)["rocketray_client_producer_sent_total"] == SENT
        got = values(text, consumer.client_id)
        assert got["rocketray_client_consumer_received_total"] == SENT
        assert got["rocketray_client_consumer_committed_total"] >= 1
        assert producer.send("served", b"one more").status is SendStatus.SEND_OK
        assert values(scrape(server.url), producer.client_id)["rocketray_client_producer_sent_total"] == SENT + 1
        with pytest.raises(urllib.error.HTTPError) as exc:
            scrape(server.url.replace("/metrics", "/other"))
        assert exc.value.code == 404
    consumer.close()
    producer.close()
    transport.close()
