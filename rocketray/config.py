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

No secret lives in the configuration: the members' credentials are made when a cluster starts
(``rocketray.credentials``) and handed to the members only; ``tls`` names operator-provided
certificate files, never their contents.
"""

from __future__ import annotations

import dataclasses
import enum
import tomllib
import types
import typing
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any, Iterable, Mapping

from rocketray.border import LimitsConfig
from rocketray.broker.config import StoreConfig
from rocketray.broker.replicas_model import ReplicasManagerConfig
from rocketray.client.config import ClientConfig
from rocketray.controller.config import ControllerConfig
from rocketray.ha.config import HAConfig
from rocketray.schema import GIB, MIB
from rocketray.tls import TlsConfig

PROFILES = ("default", "fast")


class ConfigError(ValueError):
    """A configuration source names an unknown key or carries a value of the wrong type."""


SECTIONS: dict[str, type] = {"controller": ControllerConfig, "broker": ReplicasManagerConfig, "store": StoreConfig,
                             "ha": HAConfig, "client": ClientConfig, "tls": TlsConfig, "limits": LimitsConfig}

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


@dataclass(frozen=True)
class RocketrayConfig:
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    broker: ReplicasManagerConfig = field(default_factory=ReplicasManagerConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    ha: HAConfig = field(default_factory=HAConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    profile: str = "default"

    def to_dict(self) -> dict:
        """Plain data (no secrets live in the configuration: members' credentials are
        ``rocketray.tls.MemberCredentials``)."""
        d: dict[str, Any] = {"profile": self.profile}
        for name, cls in SECTIONS.items():
            section = getattr(self, name)
            d[name] = {f.name: _plain(getattr(section, f.name)) for f in section_keys(cls)}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RocketrayConfig":
        """Inverse of ``to_dict``: profile defaults, then the sections' values; unknown keys are errors."""
        d = dict(d)
        cfg = profile_config(d.pop("profile", "default"))
        return _merge(cfg, d, "dict")

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
        pairs = list(overrides.items()) if isinstance(overrides, Mapping) else set_pairs(overrides)
        changes: dict[str, dict[str, Any]] = {}
        for dotted, raw in pairs:
            section, key = _split_key(str(dotted).strip())
            cls = SECTIONS[section]
            where = "--set" if isinstance(raw, str) else "overrides"
            value = _parse_text(cls, key, raw) if isinstance(raw, str) else _check_value(cls, key, raw, where)
            changes.setdefault(section, {})[key] = value
        return _replace_sections(self, changes, "--set")


def set_pairs(items: Iterable[str]) -> list[tuple[str, str]]:
    """``--set section.key=value`` strings as ``(section.key, value)`` text pairs (keys not yet checked)."""
    pairs = []
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected section.key=value")
        dotted, raw = item.split("=", 1)
        pairs.append((dotted.strip(), raw.strip()))
    return pairs


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
            reason = str(e) or f"{SECTIONS[section].__name__}'s own check failed (out of range or inconsistent)"
            raise ConfigError(f"{where}: invalid [{section}] {dict(values)}: {reason}") from None
    return cfg


def _checked_sections(data: Mapping[str, Any], where: str) -> dict[str, dict[str, Any]]:
    """``{section: {key: value}}`` data with every section, key and value type checked."""
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
    return changes


def _merge(cfg: RocketrayConfig, data: Mapping[str, Any], where: str) -> RocketrayConfig:
    return _replace_sections(cfg, _checked_sections(data, where), where)


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
    """A config file as plain data: TOML (``.toml``) or YAML (``.yaml``/``.yml``).

    A missing or unreadable file, a syntax error, or a top level that is not a table is a
    ``ConfigError`` naming the file."""
    p = Path(path)
    if p.suffix not in (".toml", ".yaml", ".yml"):
        raise ConfigError(f"{p}: unsupported config file type (use .toml, .yaml or .yml)")
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such config file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: cannot read the config file: {e}") from None
    if p.suffix == ".toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p}: not valid TOML: {e}") from None
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping at the top level")
    return data


def load_config(profile: str | None = None, overrides: Iterable[str] | Mapping[str, Any] = (), *,
                path: str | Path | None = None) -> RocketrayConfig:
    """Defaults -> profile (argument, else the file's ``profile``, else default) -> file -> overrides.

    ``overrides``: ``["section.key=value", ...]`` (the ``--set`` flags) or ``{"section.key": value}``
    (what a ClusterSpec carries).
    """
    data = read_file(path) if path is not None else {}
    file_profile = _file_profile(data, path)
    cfg = profile_config(profile or file_profile or "default")
    cfg = _merge(cfg, data, str(path))
    return cfg.with_overrides(overrides)


def _file_profile(data: dict, path: str | Path | None) -> str | None:
    """Pops the file's top-level ``profile`` (None if absent); an unknown one names the file."""
    profile = data.pop("profile", None)
    if profile is not None and profile not in PROFILES:
        raise ConfigError(f"{path}: unknown profile {profile!r}; profiles: {list(PROFILES)}")
    return profile


def _text(value: Any) -> str:
    """A checked value in the form ``--set`` takes (``_parse_text`` reads it back to the same value)."""
    if value is None:
        return "none"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def file_overrides(path: str | Path) -> tuple[str | None, dict[str, str]]:
    """A config file as a ClusterSpec carries it: the file's ``profile`` (None if it names none) and
    its keys flattened to ``{"section.key": text}`` in ``--set``'s form.

    The file is checked here, so an unknown section or key, or a value of the wrong type, is a
    ``ConfigError`` naming the key and the file; the actors, possibly on other nodes, never read it.
    """
    data = read_file(path)
    profile = _file_profile(data, path)
    flat = {}
    for section, values in _checked_sections(data, str(path)).items():
        for key, value in values.items():
            flat[f"{section}.{key}"] = _text(value)
    return profile, flat


def add_config_arguments(parser: Any, default_profile: str = "default") -> None:
    """``--config FILE``, ``--profile NAME``, ``--set section.key=value`` (repeatable) for a CLI command.

    ``default_profile`` is only the help text; ``cluster_settings`` takes the same fallback."""
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="TOML or YAML file with [controller]/[broker]/[store]/[ha] tables and an optional "
                             "top-level profile; --profile and --set win over it")
    parser.add_argument("--profile", default=None, choices=PROFILES,
                        help=f"default or fast (sub-second timings); default: the file's profile, else "
                             f"{default_profile}")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one setting (repeatable; wins over --config)")


def config_from_args(args: Any) -> RocketrayConfig:
    return load_config(getattr(args, "profile", None), getattr(args, "overrides", None) or (),
                       path=getattr(args, "config", None))


def cluster_settings(args: Any, default_profile: str = "default") -> tuple[str, dict[str, str]]:
    """``--config``/``--profile``/``--set`` as a ClusterSpec's ``profile`` and ``config_overrides``.

    Profile: the flag, else the file's, else ``default_profile``. Overrides: the file's keys, then the
    ``--set`` pairs (the later wins). The composition is checked here, on the driver, so a bad key or
    value fails before any actor starts, naming the key (and the file when it came from there).
    """
    path = getattr(args, "config", None)
    sets = list(getattr(args, "overrides", None) or ())
    file_profile, overrides = file_overrides(path) if path is not None else (None, {})
    overrides.update(set_pairs(sets))
    profile = getattr(args, "profile", None) or file_profile or default_profile
    checked = load_config(profile, sets, path=path)  # what load_config makes of the file itself
    assert load_config(profile, overrides) == checked, "the flattened file must read back to the same values"
    return profile, overrides


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
