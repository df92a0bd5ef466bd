"""GET/UPDATE_CONTROLLER_CONFIG (reference 6.1, 7) for one controller node, apart from Ray.

The view is the node's ``rocketray.controller.config.ControllerConfig`` in snake_case plus the reference's
bookkeeping keys ``config_black_list``, ``config_store_path`` and ``rocketmq_home``. An update names
one key (snake_case, or RocketMQ's camelCase: ``enableElectUncleanMaster``) and a text value:

- a key in the blacklist (``config_black_list``, default ``config_black_list;config_store_path``, and
  ``rocketmq_home`` always) -> NO_PERMISSION (16) "Can not update config in black list.";
- an unknown key -> CONTROLLER_INVALID_REQUEST (2005) (RocketMQ silently ignores unknown keys;
  refusing them is deliberate: a typo must not look like a success);
- a value of the wrong type, or one that makes the config invalid -> SYSTEM_ERROR (1), as upstream
  does for unparsable properties.

Accepted updates are persisted as ``key=value`` lines in ``config_store_path`` (inside the node's
store directory, written atomically) and loaded on top of the cluster's config at start, so a
controller restarted by Ray keeps them. Keys read on every use by the node and the scan loop apply
at once; the Raft timing and snapshot-retention keys apply after the next restart (``LIVE_KEYS``).
Like upstream, an update is local to the node it is sent to; ``rocketray admin`` sends it to every
controller.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

from rocketray.wire.controller_codes import ResponseCode
from rocketray.controller.config import ControllerConfig
from rocketray.durable import write_durably

PROPERTIES_FILE = "controller.properties"
DEFAULT_BLACK_LIST = "config_black_list;config_store_path"
ALWAYS_BLACKLISTED = frozenset({"rocketmq_home", "config_black_list", "config_store_path"})

#: Keys the running node (and the service's scan loop) read on every use.
LIVE_KEYS = frozenset({
    "scan_not_active_broker_interval_ms", "scan_inactive_master_interval_ms", "elect_master_max_retry_count",
    "enable_elect_unclean_master", "is_process_read_event", "notify_broker_role_changed", "snapshot_threshold",
    "request_timeout_ms", "elect_master_attempt_timeout_ms", "consumer_heartbeat_timeout_ms",
})


class ConfigUpdateError(ValueError):
    """A refused update, with the response code to answer."""

    def __init__(self, code: ResponseCode, remark: str):
        super().__init__(remark)
        self.code = code
        self.remark = remark


def snake_key(key: str) -> str:
    """``enableElectUncleanMaster`` -> ``enable_elect_unclean_master``; snake_case stays as is."""
    key = key.strip()
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", key).lower()


def blacklist(black_list: str) -> frozenset[str]:
    return frozenset(snake_key(k) for k in black_list.split(";") if k.strip()) | ALWAYS_BLACKLISTED


def config_view(config: ControllerConfig, store_dir: str | Path, black_list: str = DEFAULT_BLACK_LIST) -> dict:
    """All keys of one node's configuration, as ``get-controller-config`` shows them."""
    view: dict[str, Any] = config.to_dict()
    view["config_black_list"] = black_list
    view["config_store_path"] = str(Path(store_dir) / PROPERTIES_FILE)
    view["rocketmq_home"] = os.environ.get("ROCKETMQ_HOME", "")
    view["controller_type"] = "pysyncobj"
    return view


def parse_value(key: str, raw: str, current: Any) -> Any:
    """Text -> the type of the key's current value; ConfigUpdateError(SYSTEM_ERROR) if unparsable."""
    text = str(raw).strip()
    if isinstance(current, bool):
        low = text.lower()
        if low in ("true", "false"):
            return low == "true"
        raise ConfigUpdateError(ResponseCode.SYSTEM_ERROR, f"{key} must be true or false, got {raw!r}")
    if isinstance(current, int):
        try:
            return int(text)
        except ValueError:
            raise ConfigUpdateError(ResponseCode.SYSTEM_ERROR, f"{key} must be an integer, got {raw!r}") from None
    return text


def apply_update(config: ControllerConfig, key: str, raw: str,
                 black_list: str = DEFAULT_BLACK_LIST) -> tuple[ControllerConfig, str, Any]:
    """The config with ``key`` set from text ``raw``: ``(new_config, snake_key, typed_value)``."""
    name = snake_key(key)
    if name in blacklist(black_list):
        raise ConfigUpdateError(ResponseCode.NO_PERMISSION, "Can not update config in black list.")
    current = config.to_dict()
    if name not in current:
        raise ConfigUpdateError(ResponseCode.CONTROLLER_INVALID_REQUEST, f"Unknown controller config key {key!r}")
    value = parse_value(name, raw, current[name])
    new = dataclasses.replace(config, **{name: value})
    try:
        new.validate()
    except ValueError as exc:
        raise ConfigUpdateError(ResponseCode.SYSTEM_ERROR, str(exc)) from None
    return new, name, value


def load_properties(path: str | Path) -> dict[str, str]:
    """``key=value`` lines (``#`` comments and blank lines skipped); {} if the file is missing."""
    p = Path(path)
    if not p.exists():
        return {}
    out = {}
    for line in p.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        k, v = line.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def save_properties(path: str | Path, values: dict[str, Any]) -> None:
    """Write ``values`` durably: temp file, fsync, atomic rename."""
    text = "".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}\n" for k, v in sorted(values.items()))
    write_durably(path, text.encode("utf-8"))


def apply_persisted(config: ControllerConfig, values: dict[str, str]) -> tuple[ControllerConfig, list[str]]:
    """Apply persisted updates at start; returns the config and the keys that were skipped."""
    skipped = []
    for key, raw in values.items():
        try:
            config, _, _ = apply_update(config, key, raw)
        except ConfigUpdateError:
            skipped.append(key)
    return config, skipped
