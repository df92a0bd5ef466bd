"""A producer's and a consumer's counters as metric series, the shape both exporters publish
(``rocketray.client.metrics_export``): to Ray's ``ray.util.metrics`` in a Ray driver, or as a
Prometheus text page outside Ray.

Pure functions, no IO: ``producer_series`` and ``consumer_series`` turn one snapshot
(``ProducerMetrics``, ``ConsumerMetrics``) into :class:`Series` rows named like the brokers' series
(``rocketray_`` then the part, ``_total`` on counters) and labelled ``client_id``, ``group`` (a
consumer's) and ``topic`` (a consumer's lag, summed over the queues of a topic it owns: one series
per topic, not per queue, so a topic of many queues costs one series per member). ``merge`` adds up
the rows several clients gave under one name and label set; ``prometheus_text`` renders rows in
Prometheus' text format 0.0.4; ``ray_updates`` turns successive samples into what Ray's metric
objects take (a counter is increased by what it gained since the last sample, a gauge set, and a
gauge whose label set is gone, e.g. the lag of a topic no longer owned, set to 0 once).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from rocketray.client.metrics import ConsumerMetrics, ProducerMetrics

__all__ = ["Series", "SeriesDef", "DEFINITIONS", "producer_series", "consumer_series", "merge",
           "prometheus_text", "ray_updates", "RayUpdate"]

PREFIX = "rocketray_client_"
_P = ("client_id",)
_C = ("client_id", "group")


@dataclass(frozen=True, slots=True)
class SeriesDef:
    """One metric: its full name, ``counter`` or ``gauge``, what it counts, its label keys."""

    name: str
    kind: str
    help: str
    label_keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Series:
    """One value of one metric under one label set (labels in the order of the metric's keys)."""

    name: str
    kind: str
    labels: tuple[tuple[str, str], ...]
    value: float


def _def(part: str, kind: str, help: str, keys: tuple[str, ...]) -> SeriesDef:
    return SeriesDef(PREFIX + part, kind, help, keys)


#: Every client series, by the snapshot field it comes from (``lag`` is per topic).
PRODUCER_DEFS: dict[str, SeriesDef] = {
    "sent": _def("producer_sent_total", "counter", "messages acknowledged (SEND_OK)", _P),
    "failed": _def("producer_failed_total", "counter", "messages known not written (SendFailed)", _P),
    "unknown": _def("producer_unknown_total", "counter", "messages that ended in SendUnknown (maybe written)", _P),
    "puts": _def("producer_puts_total", "counter", "put attempts (one per batch, plus retries)", _P),
    "retries": _def("producer_retries_total", "counter", "put attempts after a batch's first", _P),
    "pending_messages": _def("producer_pending_messages", "gauge", "messages queued or in flight", _P),
    "buffered_bytes": _def("producer_buffered_bytes", "gauge", "bytes of messages queued or in flight", _P),
}
CONSUMER_DEFS: dict[str, SeriesDef] = {
    "received": _def("consumer_received_total", "counter", "messages poll returned", _C),
    "polls": _def("consumer_polls_total", "counter", "poll calls that returned", _C),
    "committed": _def("consumer_committed_total", "counter", "queue offsets acknowledged as committed", _C),
    "commit_failures": _def("consumer_commit_failures_total", "counter", "commit calls that raised CommitFailed",
                            _C),
    "rebalances": _def("consumer_rebalances_total", "counter", "times this member's assignment changed", _C),
    "nacked": _def("consumer_nacked_total", "counter", "messages nack stored in the group's retry topic", _C),
    "dead_lettered": _def("consumer_dead_lettered_total", "counter",
                          "messages nack stored in the group's dead-letter topic", _C),
    "assigned": _def("consumer_assigned_queues", "gauge", "queues this member owns", _C),
    "held": _def("consumer_held_messages", "gauge", "retry copies read but not due yet", _C),
    "lag": _def("consumer_lag_messages", "gauge",
                "messages of the owned queues of a topic not yet returned by poll", _C + ("topic",)),
}
DEFINITIONS: dict[str, SeriesDef] = {d.name: d for d in [*PRODUCER_DEFS.values(), *CONSUMER_DEFS.values()]}


def _row(d: SeriesDef, labels: Mapping[str, str], value: float) -> Series:
    assert set(labels) == set(d.label_keys), (d.name, sorted(labels))
    return Series(d.name, d.kind, tuple((k, labels[k]) for k in d.label_keys), float(value))


def producer_series(m: ProducerMetrics, client_id: str) -> list[Series]:
    """One row per producer metric, labelled with the producer's ``client_id``."""
    labels = {"client_id": client_id}
    return [_row(d, labels, getattr(m, field)) for field, d in PRODUCER_DEFS.items()]


def consumer_series(m: ConsumerMetrics, client_id: str, group: str) -> list[Series]:
    """One row per consumer metric, and one lag row per topic with an owned queue whose end is known."""
    labels = {"client_id": client_id, "group": group}
    rows = [_row(d, labels, getattr(m, field)) for field, d in CONSUMER_DEFS.items() if field != "lag"]
    by_topic: dict[str, int] = {}
    for queue, lag in m.lag_by_queue.items():
        by_topic[queue.topic] = by_topic.get(queue.topic, 0) + lag
    rows += [_row(CONSUMER_DEFS["lag"], dict(labels, topic=topic), lag) for topic, lag in sorted(by_topic.items())]
    return rows


def merge(rows: Iterable[Series]) -> list[Series]:
    """Rows with one name and label set added into one (two clients given one ``client_id``), in the
    order each first appeared."""
    merged: dict[tuple[str, tuple[tuple[str, str], ...]], Series] = {}
    for row in rows:
        key = (row.name, row.labels)
        before = merged.get(key)
        merged[key] = row if before is None else Series(row.name, row.kind, row.labels, before.value + row.value)
    return list(merged.values())


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)


def prometheus_text(rows: Iterable[Series]) -> str:
    """``rows`` in Prometheus' text exposition format 0.0.4: per metric a ``# HELP`` and a ``# TYPE``
    line, then one line per label set (label values escaped: backslash, double quote, newline)."""
    by_name: dict[str, list[Series]] = {}
    for row in merge(rows):
        by_name.setdefault(row.name, []).append(row)
    lines: list[str] = []
    for name, group in by_name.items():
        d = DEFINITIONS[name]
        lines += [f"# HELP {name} {d.help}", f"# TYPE {name} {d.kind}"]
        for row in group:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in row.labels)
            lines.append(f"{name}{{{labels}}} {_number(row.value)}")
    return "\n".join(lines) + "\n" if lines else ""


@dataclass(frozen=True, slots=True)
class RayUpdate:
    """One call on a Ray metric object: ``inc`` a counter by ``value`` or ``set`` a gauge to it."""

    name: str
    method: str
    tags: Mapping[str, str]
    value: float


_Key = tuple[str, tuple[tuple[str, str], ...]]


def ray_updates(last: Mapping[_Key, float], rows: Iterable[Series]) -> tuple[list[RayUpdate], dict[_Key, float]]:
    """The calls that bring Ray's metric objects from sample ``last`` (what the previous call
    returned; empty at first) to ``rows``, and the sample to pass next time.

    A counter is increased by what it gained; one that went down (a client's counters restarted
    under the same labels) counts its new value as gained, as Prometheus reads a counter reset.
    Nothing is sent for a counter that did not move (Ray refuses ``inc(0)``). A gauge is set every
    time, and set to 0 once when its label set no longer appears."""
    updates: list[RayUpdate] = []
    now: dict[_Key, float] = {}
    for row in merge(rows):
        key = (row.name, row.labels)
        now[key] = row.value
        if row.kind == "gauge":
            updates.append(RayUpdate(row.name, "set", dict(row.labels), row.value))
            continue
        before = last.get(key, 0.0)
        gained = row.value - before if row.value >= before else row.value
        if gained > 0:
            updates.append(RayUpdate(row.name, "inc", dict(row.labels), gained))
    for key, value in last.items():
        name, labels = key
        if key not in now and DEFINITIONS[name].kind == "gauge":
            if value != 0:
                updates.append(RayUpdate(name, "set", dict(labels), 0.0))
        elif key not in now:
            now[key] = value            # a counter absent for a sample keeps its total
    return updates, now
