"""rocketray's one typed configuration: sections ``controller``, ``broker``, ``store``, ``ha``.

Each section's schema is its package's own config dataclass, declared once there with
``rocketray.schema.key(default, meaning, fast=...)``: ``controller`` is
``rocketray.controller.config.ControllerConfig``, ``broker`` is
``rocketray.broker.replicas_model.ReplicasManagerConfig``, ``store`` is
``rocketray.broker.config.StoreConfig`` and ``ha`` is ``rocketray.ha.config.HAConfig``. This module
composes them: profiles, files, ``--set`` overrides, checking, and the README's table. Keys are the
reference's settings in snake_case with units last (``*_ms``) with the reference's defaults
(reference §7 ControllerConfig, §8 BrokerConfig and MessageStoreConfig) plus what a Python
implementation needs on top (Raft timings of pysyncobj, snapshot retention of RIP-59, the store's
flush and retention policy). The ``fast`` profile shortens every heartbeat, timeout and period to
sub-second values so that a failover completes in a couple of seconds; the demo and the tests use it.

Sources, later winning: the defaults, the profile, a TOML or YAML file (one table per section, an
optional top-level ``profile``), then ``--set section.key=value`` overrides. An unknown section or
key is an error naming it; a value of the wrong type is an error naming the key.

The cluster secret (Raft port authentication, HA handshake) is generated per cluster with
``secrets.token_hex`` and never appears in ``repr``, ``str`` or ``to_dict()`` unless asked for.
"""

from __future__ import annotations

import dataclasses
import enum
import secrets
import tomllib
import types
import typing
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any, Iterable, Mapping

from rocketray.broker.config import StoreConfig
from rocketray.broker.replicas_model import ReplicasManagerConfig
from rocketray.controller.config import ControllerConfig
from rocketray.ha.config import HAConfig
from rocketray.schema import GIB, MIB

PROFILES = ("default", "fast")


class ConfigError(ValueError):
    """A configuration source names an unknown key or carries a value of the wrong type."""


SECTIONS: dict[str, type] = {"controller": ControllerConfig, "broker": ReplicasManagerConfig, "store": StoreConfig,
                             "ha": HAConfig}

#: Keys of earlier versions: an error naming one says what replaced it.
RENAMED = {"store.mapped_file_size_commit_log": "store.segment_size_bytes",
           "store.flush_disk_type": "store.flush_mode (async or sync)",
           "store.flush_interval_commit_log_ms": "store.flush_interval_ms",
           "store.file_reserved_time_ms": "store.retention_ms"}
REMOVED = frozenset({"controller.controller_thread_pool_nums", "controller.controller_request_thread_pool_queue_capacity",
                     "controller.controller_store_path", "broker.send_heartbeat_timeout_ms"})


def section_keys(cls: type) -> list[dataclasses.Field]:
    """The configuration keys of a section's dataclass (its fields not declared ``internal``)."""
    return [f for f in fields(cls) if "internal" not in f.metadata]


@cache
def _key_types(cls: type) -> dict[str, tuple[type, bool]]:
    """key -> (base type, accepts None)."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in section_keys(cls):
        hint, optional = hints[f.name], False
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            hint, optional = args[0], True
        out[f.name] = (hint, optional)
    return out


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def _new_secret() -> str:
    return secrets.token_hex(32)


@dataclass(frozen=True)
class RocketrayConfig:
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    broker: ReplicasManagerConfig = field(default_factory=ReplicasManagerConfig)
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
        for name, cls in SECTIONS.items():
            section = getattr(self, name)
            d[name] = {f.name: _plain(getattr(section, f.name)) for f in section_keys(cls)}
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

    # The sections are the packages' own configs; these name them for the code that builds each part.
    def controller_node_config(self) -> ControllerConfig:
        return self.controller

    def ha_config(self) -> HAConfig:
        return self.ha

    def replicas_manager_config(self) -> ReplicasManagerConfig:
        return self.broker

    def store_config(self) -> StoreConfig:
        return self.store

    def with_overrides(self, overrides: Iterable[str] | Mapping[str, Any]) -> "RocketrayConfig":
        """Apply ``section.key=value`` strings (the ``--set`` flags) or a ``{section.key: value}`` map
        whose values are text (parsed like ``--set``) or already typed."""
        if isinstance(overrides, Mapping):
            pairs = list(overrides.items())
        else:
            pairs = []
            for item in overrides:
                if "=" not in item:
                    raise ConfigError(f"--set {item!r}: expected section.key=value")
                dotted, raw = item.split("=", 1)
                pairs.append((dotted, raw.strip()))
        changes: dict[str, dict[str, Any]] = {}
        for dotted, raw in pairs:
            section, key = _split_key(str(dotted).strip())
            cls = SECTIONS[section]
            where = "--set" if isinstance(raw, str) else "overrides"
            value = _parse_text(cls, key, raw) if isinstance(raw, str) else _check_value(cls, key, raw, where)
            changes.setdefault(section, {})[key] = value
        return _replace_sections(self, changes, "--set")


def _unknown(dotted: str) -> str:
    if dotted in RENAMED:
        return f"unknown key {dotted!r}: renamed to {RENAMED[dotted]}"
    if dotted in REMOVED:
        return f"unknown key {dotted!r}: removed (it had no effect)"
    return f"unknown key {dotted!r}"


def _split_key(dotted: str) -> tuple[str, str]:
    if "." not in dotted:
        raise ConfigError(f"unknown key {dotted!r}: expected section.key with section in {sorted(SECTIONS)}")
    section, key = dotted.split(".", 1)
    if section not in SECTIONS:
        raise ConfigError(f"unknown section {section!r} in {dotted!r}; sections: {sorted(SECTIONS)}")
    if key not in _key_types(SECTIONS[section]):
        raise ConfigError(_unknown(dotted))
    return section, key


def _kind_name(kind: type) -> str:
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return " or ".join(str(m.value) for m in kind)
    return kind.__name__


def _check_value(cls: type, key: str, value: Any, where: str) -> Any:
    """A typed value (from a file or a mapping) checked against the key's type."""
    kind, optional = _key_types(cls)[key]
    name = f"{_section_name(cls)}.{key}"
    if value is None or (optional and isinstance(value, str) and value.lower() == "none"):
        if optional:
            return None
        raise ConfigError(f"{where}: {name} must be {_kind_name(kind)}, got {value!r}")
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return _enum_value(kind, value, f"{where}: {name}")
    ok = {int: isinstance(value, int) and not isinstance(value, bool),
          bool: isinstance(value, bool), str: isinstance(value, str)}[kind]
    if not ok:
        raise ConfigError(f"{where}: {name} must be {_kind_name(kind)}{' or none' if optional else ''}, "
                          f"got {value!r}")
    return value


def _enum_value(kind: type[enum.Enum], value: Any, what: str) -> Any:
    if isinstance(value, kind):
        return value
    if isinstance(value, str):
        for member in kind:
            if value.lower() in (str(member.value).lower(), member.name.lower()):
                return member
    raise ConfigError(f"{what} must be {_kind_name(kind)}, got {value!r}")


def _parse_text(cls: type, key: str, raw: str) -> Any:
    """A ``--set`` text value parsed to the key's type."""
    kind, optional = _key_types(cls)[key]
    name = f"{_section_name(cls)}.{key}"
    low = raw.lower()
    if optional and low == "none":
        return None
    if kind is bool:
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"--set {name}: expected true/false, got {raw!r}")
    if kind is int:
        try:
            return int(raw.replace("_", ""), 0)
        except ValueError:
            raise ConfigError(f"--set {name}: expected an integer{' or none' if optional else ''}, "
                              f"got {raw!r}") from None
    if kind is str:
        return raw
    return _enum_value(kind, raw, f"--set {name}")


def _section_name(cls: type) -> str:
    return next(n for n, c in SECTIONS.items() if c is cls)


def _replace_sections(cfg: RocketrayConfig, changes: Mapping[str, Mapping[str, Any]], where: str) -> RocketrayConfig:
    """Apply checked values per section; the package's own validation (``__post_init__``) runs."""
    for section, values in changes.items():
        try:
            cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **values)})
        except (ValueError, AssertionError) as e:
            raise ConfigError(f"{where}: invalid [{section}] {dict(values)}: {e}") from None
    return cfg


def _merge(cfg: RocketrayConfig, data: Mapping[str, Any], where: str) -> RocketrayConfig:
    changes = {}
    for section, values in data.items():
        if section not in SECTIONS:
            raise ConfigError(f"{where}: unknown section {section!r}; sections: {sorted(SECTIONS)}")
        if not isinstance(values, Mapping):
            raise ConfigError(f"{where}: section {section!r} must be a table of keys")
        cls = SECTIONS[section]
        known = _key_types(cls)
        checked = {}
        for key, value in values.items():
            if key not in known:
                raise ConfigError(f"{where}: {_unknown(f'{section}.{key!s}')}")
            checked[key] = _check_value(cls, key, value, where)
        changes[section] = checked
    return _replace_sections(cfg, changes, where)


def profile_config(profile: str = "default") -> RocketrayConfig:
    """The defaults, or the defaults with the ``fast`` values applied."""
    if profile not in PROFILES:
        raise ConfigError(f"unknown profile {profile!r}; profiles: {list(PROFILES)}")
    cfg = RocketrayConfig(profile=profile)
    if profile == "fast":
        for section, cls in SECTIONS.items():
            fast = {f.name: f.metadata["fast"] for f in section_keys(cls) if "fast" in f.metadata}
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
    if value is None:
        return "none"
    if isinstance(value, enum.Enum):
        return str(value.value)
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
        for f in section_keys(cls):
            d, q = getattr(getattr(default, section), f.name), getattr(getattr(fast, section), f.name)
            lines.append(f"| `{section}.{f.name}` | {_fmt(d)} | {_fmt(q) if q != d else '='} | "
                         f"{f.metadata['meaning']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m rocketray.config > table.md
    print(render_config_table(), end="")
