"""``ray.util.metrics`` for the controller and broker actors.

Each service owns one recorder (``ControllerMetrics`` or ``BrokerMetrics``) and feeds it either on
an event (an election answered, a put finished) or from a periodic sample of its own status (role,
term, epochs, offsets, snapshots). The metric objects are created lazily, on first use, by a
factory: :class:`RayMetricFactory` in the actors (Ray exports them through each node's dashboard
agent in Prometheus format, with the ``ray_`` prefix, e.g. ``ray_rocketray_broker_max_offset``),
a fake in unit tests. Every series is tagged with ``cluster`` and, where it applies, ``group`` and
``broker_id`` (``controller`` for the controller's own series).

Recorders also turn consecutive samples into structured log lines for the transitions the cores
do not log with the domain keys: role and epoch changes, SyncStateSet changes, truncations (the
max offset going backwards) and new snapshots. ``observe_*`` returns those lines so a test can
check them; the services log them. ``configure_actor_logging`` sends the INFO lines of rocketray's
loggers to the actor's stderr (Ray's ``worker-*.err`` files), where Python's default would drop them.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from rocketray.actors.views import BrokerStatus, ControllerMetadata

PREFIX = "rocketray_"

#: Loggers of rocketray's packages (cores log under their module names).
LOGGERS = ("rocketray", "controller", "broker", "ha", "snapshot", "actors")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_actor_logging(level: str | None = None) -> None:
    """INFO (or ``$ROCKETRAY_LOG_LEVEL``) from rocketray's loggers to stderr; idempotent per process."""
    chosen = (level or os.environ.get("ROCKETRAY_LOG_LEVEL") or "INFO").upper()
    for name in LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(chosen)
        if not any(getattr(h, "_rocketray", False) for h in logger.handlers):
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter(LOG_FORMAT))
            handler._rocketray = True  # type: ignore[attr-defined]
            logger.addHandler(handler)
            logger.propagate = False


#: Put latency histogram buckets in milliseconds.
PUT_LATENCY_BOUNDARIES_MS = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0]


@dataclass(frozen=True, slots=True)
class MetricDef:
    name: str
    kind: str  # "gauge" | "counter" | "histogram"
    description: str
    tag_keys: tuple[str, ...]


_C = ("cluster", "controller")
_G = ("cluster", "group")
_B = ("cluster", "group", "broker_id")

#: Every metric rocketray exports (without Ray's ``ray_`` prefix).
METRICS: dict[str, MetricDef] = {m.name: m for m in [
    MetricDef("controller_is_leader", "gauge", "1 if this controller is the Raft leader", _C),
    MetricDef("controller_term", "gauge", "Raft term seen by this controller", _C),
    MetricDef("controller_applied_index", "gauge", "last Raft log index applied by this controller", _C),
    MetricDef("controller_snapshot_count", "gauge", "controller snapshots saved since start", _C),
    MetricDef("controller_last_snapshot_index", "gauge", "log index of the newest controller snapshot", _C),
    MetricDef("controller_elections_total", "counter", "elections answered by the leader, by trigger and code",
              ("cluster", "group", "trigger", "code")),
    MetricDef("group_master_epoch", "gauge", "master epoch of a broker group (controller leader view)", _G),
    MetricDef("group_master_broker_id", "gauge", "master broker id of a group, -1 if none (leader view)", _G),
    MetricDef("group_sync_state_set_size", "gauge", "SyncStateSet size of a group (leader view)", _G),
    MetricDef("broker_is_master", "gauge", "1 if this replica acts as master", _B),
    MetricDef("broker_master_epoch", "gauge", "master epoch this replica follows or leads", _B),
    MetricDef("broker_sync_state_set_size", "gauge", "SyncStateSet size this replica knows", _B),
    MetricDef("broker_max_offset", "gauge", "commit-log max offset of a replica (bytes)", _B),
    MetricDef("broker_confirm_offset", "gauge", "confirm offset of a replica (bytes)", _B),
    MetricDef("broker_replication_lag_bytes", "gauge",
              "master max offset minus the replica's acknowledged offset (reported by the master)", _B),
    MetricDef("broker_puts_total", "counter", "put batches by outcome", _B + ("status",)),
    MetricDef("broker_put_messages_total", "counter", "messages in put batches by outcome", _B + ("status",)),
    MetricDef("broker_put_latency_ms", "histogram", "put batch latency until the ack policy is met", _B),
]}


class RayMetricFactory:
    """Builds ``ray.util.metrics`` objects (inside an actor or a connected driver)."""

    def make(self, d: MetricDef) -> Any:
        from ray.util import metrics

        name = PREFIX + d.name
        if d.kind == "gauge":
            return metrics.Gauge(name, description=d.description, tag_keys=d.tag_keys)
        if d.kind == "counter":
            return metrics.Counter(name, description=d.description, tag_keys=d.tag_keys)
        return metrics.Histogram(name, description=d.description, boundaries=PUT_LATENCY_BOUNDARIES_MS,
                                 tag_keys=d.tag_keys)


class _Registry:
    """Lazily created metric objects; records with string tags; never raises into the caller."""

    def __init__(self, factory: Any | None, on_error: Callable[[str, BaseException], None] | None = None):
        self._factory = factory if factory is not None else RayMetricFactory()
        self._objects: dict[str, Any] = {}
        self._on_error = on_error
        self.disabled = False

    def _get(self, name: str) -> Any:
        obj = self._objects.get(name)
        if obj is None:
            obj = self._factory.make(METRICS[name])
            self._objects[name] = obj
        return obj

    def record(self, name: str, value: float, tags: Mapping[str, Any]) -> None:
        if self.disabled:
            return
        d = METRICS[name]
        assert set(tags) == set(d.tag_keys), (name, sorted(tags))
        str_tags = {k: str(v) for k, v in tags.items()}
        try:
            obj = self._get(name)
            if d.kind == "gauge":
                obj.set(value, tags=str_tags)
            elif d.kind == "counter":
                obj.inc(value, tags=str_tags)
            else:
                obj.observe(value, tags=str_tags)
        except Exception as exc:  # noqa: BLE001 - metrics must never break a service
            self.disabled = True  # e.g. no Ray worker in this process: stop trying
            if self._on_error is not None:
                self._on_error(name, exc)


def _kv(**items: Any) -> str:
    return " ".join(f"{k}={v}" for k, v in items.items())


class ControllerMetrics:
    """The controller's series; ``observe`` takes ``ControllerService.metadata()`` and the state tables."""

    def __init__(self, cluster: str, controller: int, factory: Any | None = None,
                 on_error: Callable[[str, BaseException], None] | None = None):
        self._reg = _Registry(factory, on_error)
        self._tags = {"cluster": cluster, "controller": controller}
        self._cluster = cluster
        self._last_snapshot_count: int | None = None
        self._last_leader: bool | None = None
        self._groups: set[str] = set()

    def election(self, group: str, trigger: str, code_name: str) -> None:
        self._reg.record("controller_elections_total", 1,
                         {"cluster": self._cluster, "group": group, "trigger": trigger, "code": code_name})

    def observe(self, metadata: ControllerMetadata, state: Mapping[str, Any] | None) -> list[str]:
        """Record one sample; return log lines for leadership changes and new snapshots."""
        lines: list[str] = []
        leader = metadata.is_leader
        self._reg.record("controller_is_leader", 1 if leader else 0, self._tags)
        self._reg.record("controller_term", metadata.term, self._tags)
        self._reg.record("controller_applied_index", metadata.applied_index, self._tags)
        count = metadata.snapshots_saved
        index = metadata.snapshot_last_index
        self._reg.record("controller_snapshot_count", count, self._tags)
        self._reg.record("controller_last_snapshot_index", index, self._tags)
        if self._last_snapshot_count is not None and count > self._last_snapshot_count:
            lines.append("controller snapshot taken " + _kv(controller=self._tags["controller"], index=index,
                                                            term=metadata.term, count=count))
        self._last_snapshot_count = count
        if self._last_leader is not None and leader != self._last_leader:
            lines.append("controller role changed " + _kv(controller=self._tags["controller"],
                                                          role="leader" if leader else "follower",
                                                          term=metadata.term))
        self._last_leader = leader
        if leader and state is not None:
            self._observe_groups(state)
        return lines

    def _observe_groups(self, state: Mapping[str, Any]) -> None:
        for row in state.get("sync_state", []):
            name, _cluster, master, master_epoch, sss, _sss_epoch = row
            tags = {"cluster": self._cluster, "group": name}
            self._reg.record("group_master_epoch", int(master_epoch), tags)
            self._reg.record("group_master_broker_id", -1 if master is None else int(master), tags)
            self._reg.record("group_sync_state_set_size", len(sss), tags)
            self._groups.add(name)


class BrokerMetrics:
    """One replica's series; ``observe`` takes ``BrokerService.status()``."""

    def __init__(self, cluster: str, group: str, factory: Any | None = None,
                 on_error: Callable[[str, BaseException], None] | None = None):
        self._reg = _Registry(factory, on_error)
        self._cluster = cluster
        self._group = group
        self._last: BrokerStatus | None = None

    def _tags(self, broker_id: Any) -> dict[str, Any]:
        return {"cluster": self._cluster, "group": self._group, "broker_id": -1 if broker_id is None else broker_id}

    def put(self, broker_id: Any, status: str, messages: int, latency_ms: float) -> None:
        tags = self._tags(broker_id)
        self._reg.record("broker_puts_total", 1, dict(tags, status=status))
        self._reg.record("broker_put_messages_total", messages, dict(tags, status=status))
        if status == "PUT_OK":
            self._reg.record("broker_put_latency_ms", latency_ms, tags)

    def observe(self, status: BrokerStatus) -> list[str]:
        """Record one sample of this replica; return log lines for the transitions since the last."""
        tags = self._tags(status.broker_id)
        master = status.is_master
        self._reg.record("broker_is_master", 1 if master else 0, tags)
        self._reg.record("broker_master_epoch", status.master_epoch, tags)
        self._reg.record("broker_sync_state_set_size", len(status.sync_state_set), tags)
        self._reg.record("broker_max_offset", status.max_offset, tags)
        self._reg.record("broker_confirm_offset", status.confirm_offset, tags)
        if master:
            self._reg.record("broker_replication_lag_bytes", 0, tags)
            for slave_id, lag in replication_lags(status):
                self._reg.record("broker_replication_lag_bytes", lag, self._tags(slave_id))
        lines = self._transitions(status)
        self._last = status
        return lines

    def _transitions(self, now: BrokerStatus) -> list[str]:
        before = self._last
        if before is None:
            return []
        keys = {"group": self._group, "broker_id": now.broker_id}
        lines = []
        if (before.role, before.master_epoch) != (now.role, now.master_epoch):
            lines.append("replica role changed " + _kv(**keys, role=now.role.value, epoch=now.master_epoch,
                                                       previous_role=before.role.value,
                                                       previous_epoch=before.master_epoch,
                                                       master_broker_id=now.master_broker_id,
                                                       offset=now.max_offset))
        if before.sync_state_set != now.sync_state_set:
            lines.append("sync state set changed " + _kv(
                **keys, epoch=now.master_epoch, sss_epoch=now.sync_state_set_epoch,
                sync_state_set=";".join(str(i) for i in now.sync_state_set),
                previous=";".join(str(i) for i in before.sync_state_set)))
        old_max, new_max = before.max_offset, now.max_offset
        if new_max < old_max:
            lines.append("replica truncated " + _kv(**keys, epoch=now.master_epoch, offset=new_max,
                                                    previous_offset=old_max, cut_bytes=old_max - new_max))
        return lines


def replication_lags(status: BrokerStatus) -> Iterable[tuple[int, int]]:
    """``(slave_id, lag_bytes)`` for each slave connected to a master, from its HA status."""
    if status.ha is None:
        return
    for conn in status.ha.connections:
        if conn.slave_id is None or conn.ack_offset < 0:
            continue
        yield conn.slave_id, max(0, status.max_offset - conn.ack_offset)
