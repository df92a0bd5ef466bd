"""rocketray's one typed configuration: sections ``controller``, ``broker``, ``store``, ``ha``.

Keys are the reference's settings in snake_case with units last (``*_ms``), with the reference's
defaults (reference §7 ControllerConfig, §8 BrokerConfig and MessageStoreConfig), plus the few
settings a Python implementation needs on top (Raft timings of pysyncobj, snapshot retention of
RIP-59, the commit-log segment size and flush policy). The ``fast`` profile shortens every
heartbeat, timeout and period to sub-second values so that a failover completes in a couple of
seconds; the demo and the tests use it.

Sources, later winning: the defaults, the profile, a TOML or YAML file (one table per section, an
optional top-level ``profile``), then ``--set section.key=value`` overrides. An unknown section or
key is an error naming it; a value of the wrong type is an error naming the key.

The cluster secret (Raft port authentication, HA handshake) is generated per cluster with
``secrets.token_hex`` and never appears in ``repr``, ``str`` or ``to_dict()`` unless asked for.
"""

from __future__ import annotations

import dataclasses
import secrets
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Mapping

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
INT_MAX = 2**31 - 1

PROFILES = ("default", "fast")


class ConfigError(ValueError):
    """A configuration source names an unknown key or carries a value of the wrong type."""


def _f(default: Any, meaning: str, fast: Any = None) -> Any:
    """A field with its meaning and (optionally) its value in the ``fast`` profile."""
    md = {"meaning": meaning}
    if fast is not None:
        md["fast"] = fast
    return field(default=default, metadata=md)


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """Reference §7 (ControllerConfig) plus the node's pipeline, Raft (pysyncobj) and RIP-59 keys.

    Same names and defaults as ``rocketray.controller.config.ControllerConfig``; see ``controller_node_config``.
    """

    scan_not_active_broker_interval_ms: int = _f(5000, "heartbeat-expiry scan period", 300)
    scan_inactive_master_interval_ms: int = _f(5000, "leader's scan for dead masters", 500)
    controller_thread_pool_nums: int = _f(16, "request executor threads (reference key)")
    controller_request_thread_pool_queue_capacity: int = _f(50000, "pending requests (reference key)")
    controller_store_path: str = _f("", "store directory ('' = the one the cluster assigns)")
    elect_master_max_retry_count: int = _f(3, "controller-triggered election attempts")
    enable_elect_unclean_master: bool = _f(False, "allow electing a master outside the SyncStateSet")
    is_process_read_event: bool = _f(True, "reads pass a Raft read barrier (reference default false: "
                                           "linearizable reads chosen on purpose)")
    notify_broker_role_changed: bool = _f(True, "push role-change notifications to brokers")
    snapshot_threshold: int = _f(1000, "committed entries between controller snapshots (RIP-59)")
    max_snapshot_reserved_num: int = _f(3, "controller snapshots kept (RIP-59)")
    event_log_segment_bytes: int = _f(8 * MIB, "controller event-log segment size in bytes")
    event_log_segments_kept: int = _f(8, "controller event-log segments kept (bounds its disk use)")
    request_timeout_ms: int = _f(5000, "wait for a write's commit before failing the request", 3000)
    elect_master_attempt_timeout_ms: int = _f(3000, "per controller-triggered election attempt", 2000)
    raft_min_timeout_ms: int = _f(400, "Raft election timeout, lower bound", 200)
    raft_max_timeout_ms: int = _f(1000, "Raft election timeout, upper bound", 450)
    append_entries_period_ms: int = _f(5, "Raft leader heartbeat / batch period")
    tick_period_ms: int = _f(5, "how long one Raft tick waits for socket events")
    append_entries_use_batch: bool = _f(False, "batch commands per append (False: lowest latency)")
    connection_timeout_ms: int = _f(3500, "silence after which a Raft peer connection is dropped", 1000)
    connection_retry_ms: int = _f(500, "reconnect period to a down Raft peer", 100)
    leader_fallback_timeout_ms: int = _f(3000, "a leader without a majority this long steps down", 1500)
    commands_queue_size: int = _f(100_000, "Raft commands queue bound")


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """Reference §8 BrokerConfig, the controller-mode subset (the ReplicasManager's keys)."""

    sync_broker_metadata_period_ms: int = _f(5000, "poll the controller for replica info", 500)
    check_sync_state_set_period_ms: int = _f(5000, "master's SyncStateSet shrink check", 500)
    sync_controller_metadata_period_ms: int = _f(10000, "refresh the controller leader address", 500)
    controller_heartbeat_timeout_ms: int = _f(10000, "timeout the controller applies to this broker", 1500)
    broker_heartbeat_interval_ms: int = _f(1000, "heartbeat period to every controller", 200)
    send_heartbeat_timeout_ms: int = _f(1000, "heartbeat RPC timeout", 300)
    broker_election_priority: int = _f(INT_MAX, "election tie-break, lower is preferred")
    start_retry_interval_ms: int = _f(1000, "between attempts to register and find a master", 200)


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Reference §8 MessageStoreConfig (store part) plus retention; see ``store_config``."""

    mapped_file_size_commit_log: int = _f(GIB, "commit-log segment size in bytes", 64 * MIB)
    flush_disk_type: str = _f("ASYNC_FLUSH", "ASYNC_FLUSH or SYNC_FLUSH (fsync before acking a put)")
    flush_interval_commit_log_ms: int = _f(500, "async flush period")
    read_uncommitted: bool = _f(False, "serve messages beyond the confirm offset")
    file_reserved_time_ms: int = _f(72 * 3600 * 1000, "commit-log retention by age")
    retention_max_bytes: int = _f(0, "commit-log retention by size (0: unlimited)")
    retention_check_interval_ms: int = _f(10_000, "retention check period")


@dataclass(frozen=True, slots=True)
class HAConfig:
    """Reference §8 MessageStoreConfig (HA part); same names as ``rocketray.ha.config.HAConfig``."""

    ha_send_heartbeat_interval_ms: int = _f(5000, "idle heartbeat / offset report interval", 200)
    ha_housekeeping_interval_ms: int = _f(20000, "connection dead after this long without reads", 3000)
    ha_transfer_batch_size: int = _f(256 * KIB, "max body per transfer packet (upstream 32 KiB; "
                                                "256 KiB measured faster here, docs/ha.md)")
    ha_max_time_slave_not_catchup_ms: int = _f(15000, "SyncStateSet shrink threshold", 3000)
    slave_timeout_ms: int = _f(3000, "bound on the replica-ack wait of a put", 1000)
    in_sync_replicas: int = _f(1, "acks needed including the master when all-ack is off")
    min_in_sync_replicas: int = _f(1, "minimum SyncStateSet size to accept writes")
    all_ack_in_sync_state_set: bool = _f(True, "wait for every SyncStateSet member before acking a put "
                                            "(rocketray default; upstream false)")
    sync_from_last_file: bool = _f(False, "an empty slave starts copying from the master's last segment")
    async_learner: bool = _f(False, "this replica never joins the SyncStateSet")
    ha_reconnect_backoff_min_ms: int = _f(100, "slave reconnect backoff, lower bound (upstream: fixed 5 s)")
    ha_reconnect_backoff_max_ms: int = _f(5000, "slave reconnect backoff, upper bound", 1000)
    ha_auth_timeout_ms: int = _f(5000, "the HA connection's auth exchange must finish within this")
    ha_max_body_bytes: int = _f(64 * MIB, "a transfer body above this is a protocol error")


SECTIONS: dict[str, type] = {"controller": ControllerConfig, "broker": BrokerConfig, "store": StoreConfig,
                             "ha": HAConfig}


def _new_secret() -> str:
    return secrets.token_hex(32)


@dataclass(frozen=True)
class RocketrayConfig:
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    ha: HAConfig = field(default_factory=HAConfig)
    profile: str = "default"
    cluster_secret: str = field(default_factory=_new_secret, repr=False, compare=False)

    def __repr__(self) -> str:
        return (f"RocketrayConfig(profile={self.profile!r}, controller={self.controller!r}, broker={self.broker!r}, "
                f"store={self.store!r}, ha={self.ha!r}, cluster_secret='***')")

    __str__ = __repr__

    def to_dict(self, include_secret: bool = False) -> dict:
        """Plain data; the secret only when asked for (e.g. to hand it to the actors)."""
        d: dict[str, Any] = {"profile": self.profile}
        for name in SECTIONS:
            d[name] = dataclasses.asdict(getattr(self, name))
        if include_secret:
            d["cluster_secret"] = self.cluster_secret
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RocketrayConfig":
        """Inverse of ``to_dict``: profile defaults, then the sections' values; unknown keys are errors."""
        d = dict(d)
        secret = d.pop("cluster_secret", None)
        cfg = profile_config(d.pop("profile", "default"))
        cfg = _merge(cfg, d, "dict")
        if secret is not None:
            cfg = dataclasses.replace(cfg, cluster_secret=str(secret))
        return cfg

    def controller_node_config(self):
        """The controller node's ``rocketray.controller.config.ControllerConfig`` (same key names)."""
        from rocketray.controller.config import ControllerConfig as NodeConfig

        return _build(NodeConfig, self.controller)

    def ha_config(self):
        """The HA service's ``rocketray.ha.config.HAConfig`` (same key names)."""
        from rocketray.ha.config import HAConfig as ServiceConfig

        return _build(ServiceConfig, self.ha)

    def replicas_manager_config(self):
        """The broker loop's ``rocketray.broker.replicas_manager.ReplicasManagerConfig``."""
        from rocketray.broker.replicas_manager import ReplicasManagerConfig

        return _build(ReplicasManagerConfig, self.broker)

    def store_kwargs(self) -> dict:
        """Keyword arguments for ``rocketray.broker.config.StoreConfig`` (the store's own key names)."""
        s = self.store
        if s.flush_disk_type not in ("ASYNC_FLUSH", "SYNC_FLUSH"):
            raise ConfigError(f"store.flush_disk_type must be ASYNC_FLUSH or SYNC_FLUSH, got {s.flush_disk_type!r}")
        return {"segment_size_bytes": s.mapped_file_size_commit_log,
                "flush_mode": "sync" if s.flush_disk_type == "SYNC_FLUSH" else "async",
                "flush_interval_ms": s.flush_interval_commit_log_ms, "read_uncommitted": s.read_uncommitted,
                "retention_ms": s.file_reserved_time_ms or None,
                "retention_max_bytes": s.retention_max_bytes or None,
                "retention_check_interval_ms": s.retention_check_interval_ms}

    def store_config(self):
        """The message store's ``rocketray.broker.config.StoreConfig``."""
        from rocketray.broker.config import StoreConfig as MessageStoreConfig

        return MessageStoreConfig(**self.store_kwargs())

    def with_overrides(self, overrides: Iterable[str] | Mapping[str, Any]) -> "RocketrayConfig":
        """Apply ``section.key=value`` strings (the ``--set`` flags) or a ``{section.key: value}`` map
        whose values are text (parsed like ``--set``) or already typed."""
        cfg = self
        if isinstance(overrides, Mapping):
            pairs = list(overrides.items())
        else:
            pairs = []
            for item in overrides:
                if "=" not in item:
                    raise ConfigError(f"--set {item!r}: expected section.key=value")
                dotted, raw = item.split("=", 1)
                pairs.append((dotted, raw.strip()))
        for dotted, raw in pairs:
            section, key = _split_key(str(dotted).strip())
            cls = SECTIONS[section]
            if isinstance(raw, str):
                value = _parse_text(cls, key, raw)
            else:
                value = _check_value(cls, key, raw, "overrides")
            cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **{key: value})})
        return cfg


def _build(target: type, section: Any) -> Any:
    """``target`` from the same-named keys of ``section`` (keys ``target`` lacks keep its default)."""
    names = {f.name for f in fields(target)}
    return target(**{f.name: getattr(section, f.name) for f in fields(section) if f.name in names})


def _split_key(dotted: str) -> tuple[str, str]:
    if "." not in dotted:
        raise ConfigError(f"unknown key {dotted!r}: expected section.key with section in {sorted(SECTIONS)}")
    section, key = dotted.split(".", 1)
    if section not in SECTIONS:
        raise ConfigError(f"unknown section {section!r} in {dotted!r}; sections: {sorted(SECTIONS)}")
    if key not in _field_types(SECTIONS[section]):
        raise ConfigError(f"unknown key {dotted!r}")
    return section, key


def _field_types(cls: type) -> dict[str, str]:
    return {f.name: (f.type if isinstance(f.type, str) else f.type.__name__) for f in fields(cls)}


def _check_value(cls: type, key: str, value: Any, where: str) -> Any:
    kind = _field_types(cls)[key]
    name = f"{_section_name(cls)}.{key}"
    ok = {"int": isinstance(value, int) and not isinstance(value, bool),
          "bool": isinstance(value, bool), "str": isinstance(value, str)}[kind]
    if not ok:
        raise ConfigError(f"{where}: {name} must be {kind}, got {value!r}")
    return value


def _parse_text(cls: type, key: str, raw: str) -> Any:
    kind = _field_types(cls)[key]
    name = f"{_section_name(cls)}.{key}"
    if kind == "bool":
        low = raw.lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"--set {name}: expected true/false, got {raw!r}")
    if kind == "int":
        try:
            return int(raw.replace("_", ""), 0)
        except ValueError:
            raise ConfigError(f"--set {name}: expected an integer, got {raw!r}") from None
    return raw


def _section_name(cls: type) -> str:
    return next(n for n, c in SECTIONS.items() if c is cls)


def _merge(cfg: RocketrayConfig, data: Mapping[str, Any], where: str) -> RocketrayConfig:
    for section, values in data.items():
        if section not in SECTIONS:
            raise ConfigError(f"{where}: unknown section {section!r}; sections: {sorted(SECTIONS)}")
        if not isinstance(values, Mapping):
            raise ConfigError(f"{where}: section {section!r} must be a table of keys")
        cls = SECTIONS[section]
        known = _field_types(cls)
        checked = {}
        for key, value in values.items():
            if key not in known:
                raise ConfigError(f"{where}: unknown key {section}.{key!s}")
            checked[key] = _check_value(cls, key, value, where)
        cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **checked)})
    return cfg


def profile_config(profile: str = "default") -> RocketrayConfig:
    """The defaults, or the defaults with the ``fast`` values applied."""
    if profile not in PROFILES:
        raise ConfigError(f"unknown profile {profile!r}; profiles: {list(PROFILES)}")
    cfg = RocketrayConfig(profile=profile)
    if profile == "fast":
        for section, cls in SECTIONS.items():
            fast = {f.name: f.metadata["fast"] for f in fields(cls) if "fast" in f.metadata}
            cfg = dataclasses.replace(cfg, **{section: cls(**fast)})
    return cfg


def read_file(path: str | Path) -> dict:
    """A config file as plain data: TOML (``.toml``) or YAML (``.yaml``/``.yml``)."""
    p = Path(path)
    if p.suffix == ".toml":
        with p.open("rb") as fh:
            return tomllib.load(fh)
    if p.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(p.read_text()) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: expected a mapping at the top level")
        return data
    raise ConfigError(f"{p}: unsupported config file type (use .toml, .yaml or .yml)")


def load_config(profile: str | None = None, overrides: Iterable[str] | Mapping[str, Any] = (), *,
                path: str | Path | None = None, secret: str | None = None) -> RocketrayConfig:
    """Defaults -> profile (argument, else the file's ``profile``, else default) -> file -> overrides.

    ``overrides``: ``["section.key=value", ...]`` (the ``--set`` flags) or ``{"section.key": value}``
    (what a ClusterSpec carries).
    """
    data = read_file(path) if path is not None else {}
    file_profile = data.pop("profile", None)
    cfg = profile_config(profile or file_profile or "default")
    cfg = _merge(cfg, data, str(path))
    cfg = cfg.with_overrides(overrides)
    if secret is not None:
        cfg = dataclasses.replace(cfg, cluster_secret=secret)
    return cfg


def add_config_arguments(parser: Any) -> None:
    """``--config FILE``, ``--profile NAME``, ``--set section.key=value`` (repeatable) for a CLI command."""
    parser.add_argument("--config", default=None, help="TOML or YAML file with [controller]/[broker]/[store]/[ha]")
    parser.add_argument("--profile", default=None, choices=PROFILES, help="default or fast (sub-second timings)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one setting (repeatable)")


def config_from_args(args: Any) -> RocketrayConfig:
    return load_config(getattr(args, "profile", None), getattr(args, "overrides", None) or (),
                       path=getattr(args, "config", None))


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int) and not isinstance(value, bool) and value >= GIB and value % GIB == 0:
        return f"{value} ({value // GIB} GiB)"
    if isinstance(value, int) and not isinstance(value, bool) and value >= MIB and value % MIB == 0:
        return f"{value} ({value // MIB} MiB)"
    return str(value)


def render_config_table() -> str:
    """The README's configuration table (key, default, fast-profile value, meaning), in Markdown."""
    default, fast = profile_config("default"), profile_config("fast")
    lines = ["| key | default | fast | meaning |", "|---|---|---|---|"]
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            d, q = getattr(getattr(default, section), f.name), getattr(getattr(fast, section), f.name)
            lines.append(f"| `{section}.{f.name}` | {_fmt(d)} | {_fmt(q) if q != d else '='} | "
                         f"{f.metadata['meaning']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m rocketray.config > table.md
    print(render_config_table(), end="")
