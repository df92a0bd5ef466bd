"""Publishing producers' and consumers' counters where the brokers' metrics go (docs/client.md, "Metrics").

    export_to_ray(producer, consumer, interval_s=5)   # a Ray driver: Ray's Prometheus endpoint serves them
    serve_prometheus(9464, producer, consumer)         # outside Ray: http://127.0.0.1:9464/metrics

Both shells publish the rows of ``rocketray.client.metrics_series`` (names, kinds, labels), one
sampling each client's ``metrics()`` on a daemon timer and handing the rows to ``ray.util.metrics``
objects (Ray adds its ``ray_`` prefix when it exports them, as it does for the brokers' series), the
other answering each ``GET /metrics`` with a fresh sample in Prometheus' text format from the
standard library's ``http.server``. Ray is imported only when ``export_to_ray`` is called, so the
base install (no Ray) serves its page without it.
"""

from __future__ import annotations

import functools
import http.server
import logging
import threading
from typing import Any, Callable, Iterable, Protocol

from rocketray.client.aio import AsyncConsumer, AsyncProducer
from rocketray.client.consumer import Consumer
from rocketray.client.errors import InvalidRequest
from rocketray.client.metrics_series import (DEFINITIONS, Series, SeriesDef, consumer_series, producer_series,
                                             prometheus_text, ray_updates)
from rocketray.client.producer import Producer

__all__ = ["export_to_ray", "RayExporter", "serve_prometheus", "PrometheusServer", "MetricObjects"]

log = logging.getLogger(__name__)

Client = Producer | Consumer | AsyncProducer | AsyncConsumer
Sampler = Callable[[], list[Series]]
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: a scrape's peer gets this long to send its request and read the answer
SCRAPE_TIMEOUT_S = 5.0


def _producer_rows(producer: Producer) -> list[Series]:
    return producer_series(producer.metrics(), producer.client_id)


def _consumer_rows(consumer: Consumer) -> list[Series]:
    return consumer_series(consumer.metrics(), consumer.client_id, consumer.group)


def samplers(clients: Iterable[Client]) -> list[Sampler]:
    """One sampler per client: its ``metrics()`` now, as series rows; TypeError for anything else."""
    found: list[Sampler] = []
    for client in clients:
        inner = client.producer if isinstance(client, AsyncProducer) else (
            client.consumer if isinstance(client, AsyncConsumer) else client)
        if isinstance(inner, Producer):
            found.append(functools.partial(_producer_rows, inner))
        elif isinstance(inner, Consumer):
            found.append(functools.partial(_consumer_rows, inner))
        else:
            raise TypeError(f"metrics are exported of a Producer, Consumer, AsyncProducer or AsyncConsumer, "
                            f"not {type(client).__name__}")
    if not found:
        raise InvalidRequest("name at least one producer or consumer whose metrics to export")
    return found


def sample(sources: Iterable[Sampler]) -> list[Series]:
    """Every source's rows; a source that raises is left out of this sample (logged)."""
    rows: list[Series] = []
    for source in sources:
        try:
            rows += source()
        except Exception:  # noqa: BLE001 - one client's failure must not hide the others' series
            log.exception("client metrics: sampling a client failed")
    return rows


# --- inside Ray: ray.util.metrics on a timer -------------------------------------------------------
class MetricObjects(Protocol):
    """Makes the metric object of a series definition: ``inc(value, tags=)`` for a counter,
    ``set(value, tags=)`` for a gauge (``ray.util.metrics`` in production)."""

    def make(self, d: SeriesDef) -> Any: ...


class RayMetricObjects:
    """``ray.util.metrics`` objects; only in a process connected to Ray (a driver or an actor)."""

    def __init__(self) -> None:
        try:
            from ray.util import metrics
        except ImportError:
            raise InvalidRequest("export_to_ray needs Ray (pip install 'rocketray[server]'); outside Ray "
                                 "use serve_prometheus") from None
        self._metrics = metrics

    def make(self, d: SeriesDef) -> Any:
        kind = self._metrics.Counter if d.kind == "counter" else self._metrics.Gauge
        return kind(d.name, description=d.help, tag_keys=d.label_keys)


class RayExporter:
    """Samples its clients every ``interval_s`` and records the rows on Ray metric objects; ``stop``
    (or leaving its ``with`` block) records a last sample and ends the timer."""

    def __init__(self, clients: Iterable[Client], interval_s: float, objects: MetricObjects) -> None:
        if not interval_s > 0:
            raise InvalidRequest(f"interval_s must be > 0, not {interval_s!r}")
        self._sources = samplers(clients)
        self._objects = objects
        self._made: dict[str, Any] = {}
        self._last: dict[Any, float] = {}
        self._lock = threading.Lock()           # one export at a time (the timer, stop)
        self._stop = threading.Event()
        self._interval_s = interval_s
        self.exports = 0                        # samples recorded so far
        self._thread = threading.Thread(target=self._run, name="rocketray-metrics-export", daemon=True)
        self._thread.start()

    def export_once(self) -> None:
        """Sample every client now and record the changes (what the timer does each interval)."""
        with self._lock:
            updates, self._last = ray_updates(self._last, sample(self._sources))
            for u in updates:
                obj = self._made.get(u.name)
                if obj is None:
                    obj = self._made[u.name] = self._objects.make(DEFINITIONS[u.name])
                getattr(obj, u.method)(u.value, tags=dict(u.tags))
            self.exports += 1

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.export_once()
            except Exception:  # noqa: BLE001 - the timer keeps running; the next sample may succeed
                log.exception("client metrics: recording on Ray failed")

    def stop(self) -> None:
        """Record a last sample, then end the timer (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self.export_once()

    def __enter__(self) -> "RayExporter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def export_to_ray(*clients: Client, interval_s: float = 5.0, objects: MetricObjects | None = None) -> RayExporter:
    """Publish ``clients``' counters as ``ray.util.metrics`` series every ``interval_s`` seconds
    (a first sample right away), exported by Ray's metrics agent with the brokers' series
    (``ray_rocketray_client_*``). Needs a connected Ray driver or actor (InvalidRequest otherwise);
    ``objects`` makes the metric objects instead of ``ray.util.metrics`` (and skips that check)."""
    if objects is None:
        objects = RayMetricObjects()
        import ray

        if not ray.is_initialized():    # recorded in a process without a Ray worker, series go nowhere
            raise InvalidRequest("export_to_ray needs a Ray driver: call ray.init(address=...) first")
    exporter = RayExporter(clients, interval_s, objects)
    exporter.export_once()
    return exporter


# --- outside Ray: a Prometheus text page ------------------------------------------------------------
class _Handler(http.server.BaseHTTPRequestHandler):
    server: "_Server"
    timeout = SCRAPE_TIMEOUT_S

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path.split("?", 1)[0] not in ("/metrics", "/"):
            self.send_error(404, "only /metrics is served")
            return
        body = prometheus_text(sample(self.server.sources)).encode()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        log.debug("client metrics: " + format, *args)


class _Server(http.server.HTTPServer):
    sources: list[Sampler]


class PrometheusServer:
    """A daemon thread answering ``GET /metrics``; one scrape at a time, each peer given
    ``SCRAPE_TIMEOUT_S``. ``close`` (or leaving its ``with`` block) stops it and frees the port."""

    def __init__(self, port: int, clients: Iterable[Client], host: str) -> None:
        sources = samplers(clients)
        try:
            self._server = _Server((host, port), _Handler)
        except OSError as exc:
            raise InvalidRequest(f"cannot serve client metrics on {host}:{port}: {exc.strerror}") from None
        self._server.sources = sources
        self.host = host
        self.port: int = self._server.server_address[1]     # the one chosen when port was 0
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="rocketray-metrics-http", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def __enter__(self) -> "PrometheusServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_prometheus(port: int, *clients: Client, host: str = "127.0.0.1") -> PrometheusServer:
    """Serve ``clients``' counters at ``http://host:port/metrics`` in Prometheus' text format, each
    scrape a fresh sample (port 0: any free port, see ``.port``). ``host`` is the address to bind:
    the loopback by default; ``"0.0.0.0"`` lets a Prometheus on another host scrape it."""
    return PrometheusServer(port, clients, host)
