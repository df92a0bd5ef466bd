"""rocketray.config: one typed configuration with the reference defaults, a fast profile, files and --set.

Defaults are checked against reference §7/§8 values; unknown keys must be errors that name the key;
the cluster secret must never show up in repr/str/to_dict (it authenticates the Raft port).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import re

import pytest

from rocketray import config as C
from rocketray.broker.config import FlushMode


def test_reference_defaults():
    """A few load-bearing defaults of reference §7 and §8, in snake_case with units last."""
    cfg = C.profile_config()
    assert cfg.controller.scan_not_active_broker_interval_ms == 5000
    assert cfg.controller.scan_inactive_master_interval_ms == 5000
    assert cfg.controller.elect_master_max_retry_count == 3
    assert cfg.controller.enable_elect_unclean_master is False
    assert cfg.controller.notify_broker_role_changed is True
    assert (cfg.controller.snapshot_threshold, cfg.controller.max_snapshot_reserved_num) == (1000, 3)
    assert cfg.broker.sync_broker_metadata_period_ms == 5000
    assert cfg.broker.check_sync_state_set_period_ms == 5000
    assert cfg.broker.sync_controller_metadata_period_ms == 10000
    assert cfg.broker.broker_heartbeat_interval_ms == 1000
    assert cfg.broker.controller_heartbeat_timeout_ms == 10000
    assert cfg.broker.broker_election_priority == 2**31 - 1
    assert cfg.ha.ha_send_heartbeat_interval_ms == 5000
    assert cfg.ha.ha_housekeeping_interval_ms == 20000
    assert cfg.ha.ha_transfer_batch_size == 1024 * 1024  # upstream 32 KiB: a measured, documented change
    assert cfg.ha.ha_max_time_slave_not_catchup_ms == 15000
    assert cfg.ha.slave_timeout_ms == 3000
    assert (cfg.ha.in_sync_replicas, cfg.ha.min_in_sync_replicas) == (1, 1)
    # rocketray departs from upstream here on purpose: acknowledged writes survive a failover
    assert cfg.ha.all_ack_in_sync_state_set is True and cfg.ha.async_learner is False
    assert cfg.store.segment_size_bytes == 64 * 1024**2  # reference 1 GiB; 64 MiB suits a laptop
    assert cfg.store.read_uncommitted is False


def test_fast_profile_is_sub_second():
    cfg = C.profile_config("fast")
    assert cfg.profile == "fast"
    assert cfg.broker.broker_heartbeat_interval_ms == 200
    assert cfg.broker.controller_heartbeat_timeout_ms == 1500
    assert cfg.broker.sync_broker_metadata_period_ms == 500
    assert cfg.broker.check_sync_state_set_period_ms == 500
    assert 300 <= cfg.controller.scan_not_active_broker_interval_ms <= 500
    assert 300 <= cfg.controller.scan_inactive_master_interval_ms <= 500
    assert cfg.ha.ha_send_heartbeat_interval_ms == 200
    assert cfg.ha.ha_housekeeping_interval_ms == 3000
    assert cfg.ha.ha_max_time_slave_not_catchup_ms == 3000
    # the things the fast profile does not touch keep the reference value
    assert cfg.ha.slave_timeout_ms == 1000 and cfg.controller.snapshot_threshold == 1000
    assert cfg.ha.ha_transfer_batch_size == 1024 * 1024


def test_fast_profile_keeps_failure_detection_consistent():
    """Timeouts exceed the periods they watch, or the fast cluster would flap."""
    cfg = C.profile_config("fast")
    assert cfg.broker.controller_heartbeat_timeout_ms > 3 * cfg.broker.broker_heartbeat_interval_ms
    assert cfg.ha.ha_housekeeping_interval_ms > 3 * cfg.ha.ha_send_heartbeat_interval_ms
    assert cfg.controller.raft_min_timeout_ms > 10 * cfg.controller.append_entries_period_ms
    assert cfg.controller.raft_max_timeout_ms > cfg.controller.raft_min_timeout_ms


def test_toml_file_then_overrides(tmp_path):
    path = tmp_path / "rocketray.toml"
    path.write_text('profile = "fast"\n[broker]\nbroker_heartbeat_interval_ms = 250\n'
                    '[ha]\nall_ack_in_sync_state_set = false\n')
    cfg = C.load_config(path=path, overrides=["broker.broker_heartbeat_interval_ms=300", "store.flush_mode=sync",
                                         "ha.min_in_sync_replicas=2", "controller.enable_elect_unclean_master=yes"])
    assert cfg.profile == "fast" and cfg.broker.controller_heartbeat_timeout_ms == 1500
    assert cfg.broker.broker_heartbeat_interval_ms == 300  # --set beats the file
    assert cfg.ha.all_ack_in_sync_state_set is False and cfg.ha.min_in_sync_replicas == 2
    assert cfg.store.flush_mode == FlushMode.SYNC and cfg.controller.enable_elect_unclean_master is True


def test_yaml_file_and_profile_argument_wins(tmp_path):
    path = tmp_path / "rocketray.yaml"
    path.write_text("profile: default\nha:\n  ha_max_time_slave_not_catchup_ms: 4000\n")
    cfg = C.load_config("fast", path=path)
    assert cfg.profile == "fast" and cfg.ha.ha_max_time_slave_not_catchup_ms == 4000
    assert cfg.ha.ha_send_heartbeat_interval_ms == 200


@pytest.mark.parametrize("text, needle", [
    ("[broker]\nbroker_hearbeat_interval_ms = 1\n", "broker.broker_hearbeat_interval_ms"),
    ("[brokr]\nx = 1\n", "'brokr'"),
    ("[ha]\nha_transfer_batch_size = \"1\"\n", "ha.ha_transfer_batch_size"),
    ("[ha]\nasync_learner = 1\n", "ha.async_learner"),
])
def test_file_errors_name_the_key(tmp_path, text, needle):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(C.ConfigError, match=needle.replace(".", r"\.")):
        C.load_config(path=path)


@pytest.mark.parametrize("item, needle", [
    ("broker.nope=1", "broker.nope"),
    ("nope.key=1", "nope"),
    ("broker_heartbeat_interval_ms=1", "broker_heartbeat_interval_ms"),
    ("broker.broker_heartbeat_interval_ms=fast", "broker.broker_heartbeat_interval_ms"),
    ("ha.async_learner=maybe", "ha.async_learner"),
    ("broker.broker_heartbeat_interval_ms", "section.key=value"),
])
def test_set_errors_name_the_key(item, needle):
    with pytest.raises(C.ConfigError, match=needle.replace(".", r"\.")):
        C.load_config(overrides=[item])


def test_unknown_profile_and_file_type(tmp_path):
    with pytest.raises(C.ConfigError, match="turbo"):
        C.profile_config("turbo")
    with pytest.raises(C.ConfigError, match="unsupported"):
        C.load_config(path=tmp_path / "x.ini")


@pytest.mark.parametrize("name, text, needle", [
    ("missing.toml", None, "no such config file"),
    ("bad.toml", "[ha\n", "not valid TOML"),
    ("bad.yaml", "ha: [1\n", "not valid YAML"),
    ("list.yaml", "- 1\n", "expected a mapping at the top level"),
    ("profile.yaml", "profile: turbo\n", "unknown profile 'turbo'"),
])
def test_unreadable_files_are_config_errors_naming_the_file(tmp_path, name, text, needle):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(C.ConfigError, match=f"^{re.escape(str(path))}: {needle}"):
        C.load_config(path=path)
    with pytest.raises(C.ConfigError, match=f"^{re.escape(str(path))}: {needle}"):
        C.file_overrides(path)


def test_an_empty_yaml_file_is_no_settings(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert C.file_overrides(path) == (None, {})
    assert C.load_config(path=path) == C.profile_config()


def test_file_overrides_are_set_text(tmp_path):
    """A file as a ClusterSpec carries it: its profile, and each key as the text ``--set`` would take."""
    path = tmp_path / "c.toml"
    path.write_text('profile = "fast"\n[store]\nflush_mode = "SYNC"\nretention_ms = "none"\n'
                    '[ha]\nasync_learner = true\nha_transfer_batch_size = 65536\n')
    assert C.file_overrides(path) == ("fast", {"store.flush_mode": "sync", "store.retention_ms": "none",
                                               "ha.async_learner": "true", "ha.ha_transfer_batch_size": "65536"})


def test_a_section_check_without_a_message_still_says_what_failed():
    with pytest.raises(C.ConfigError, match=r"invalid \[ha\] .*HAConfig's own check failed"):
        C.load_config(overrides=["ha.ha_housekeeping_interval_ms=1"])


def test_the_configuration_holds_no_secret_and_round_trips():
    # Members' credentials live in rocketray.credentials, never in a config a driver can read.
    cfg = C.load_config(profile="fast", overrides=["ha.async_learner=true", "tls.enabled=false"])
    assert not any("secret" in key for section in cfg.to_dict().values() if isinstance(section, dict)
                   for key in section)
    again = C.RocketrayConfig.from_dict(cfg.to_dict())
    assert again == cfg and again.tls.enabled is False


def test_operator_certificates_are_named_together():
    with pytest.raises(C.ConfigError, match="tls.ca, tls.cert and tls.key"):
        C.load_config(overrides=["tls.cert=/etc/rr/{member}.pem"])
    cfg = C.load_config(overrides=["tls.ca=/etc/rr/ca.pem", "tls.cert=/etc/rr/{member}.pem",
                                   "tls.key=/etc/rr/{member}.key"])
    assert cfg.tls.operator_certificates


def test_from_dict_refuses_unknown_keys():
    with pytest.raises(C.ConfigError, match="broker.zzz"):
        C.RocketrayConfig.from_dict({"broker": {"zzz": 1}})


def test_every_key_has_meaning_and_a_snake_case_name():
    for section, cls in C.SECTIONS.items():
        for f in C.section_keys(cls):
            assert f.name == f.name.lower() and " " not in f.name
            assert f.metadata.get("meaning"), f"{section}.{f.name} has no meaning"
            if "interval" in f.name or "period" in f.name or "timeout" in f.name:
                assert f.name.endswith("_ms"), f"{section}.{f.name}: units last"


def test_readme_table_lists_every_key_with_default_and_fast_value():
    table = C.render_config_table()
    lines = table.strip().splitlines()
    assert lines[0] == "| key | default | fast | meaning |"
    keys = [f"{s}.{f.name}" for s, cls in C.SECTIONS.items() for f in C.section_keys(cls)]
    assert len(lines) == 2 + len(keys)
    assert "| `broker.broker_heartbeat_interval_ms` | 1000 | 200 | heartbeat period to every controller |" in lines
    assert "| `ha.in_sync_replicas` | 1 | = |" in table


def test_cli_arguments():
    parser = argparse.ArgumentParser()
    C.add_config_arguments(parser)
    args = parser.parse_args(["--profile", "fast", "--set", "ha.in_sync_replicas=2", "--set",
                              "broker.broker_election_priority=1"])
    cfg = C.config_from_args(args)
    assert cfg.profile == "fast" and cfg.ha.in_sync_replicas == 2 and cfg.broker.broker_election_priority == 1
    assert C.cluster_settings(args) == ("fast", {"ha.in_sync_replicas": "2", "broker.broker_election_priority": "1"})
    assert C.cluster_settings(parser.parse_args([]), default_profile="fast") == ("fast", {})


def test_store_section_is_the_stores_own_config():
    cfg = C.load_config(profile="fast", overrides=["store.flush_mode=SYNC", "store.retention_max_bytes=none",
                                                   "store.retention_ms=none"])
    assert cfg.store_config() is cfg.store
    assert cfg.store.flush_mode is FlushMode.SYNC and cfg.store.retention_ms is None
    assert cfg.store.retention_max_bytes is None
    assert C.load_config(overrides=["store.retention_max_bytes=1_000"]).store.retention_max_bytes == 1000
    with pytest.raises(C.ConfigError, match="store.flush_mode"):
        C.load_config(overrides=["store.flush_mode=SOMETIMES"])
    with pytest.raises(C.ConfigError, match="store.segment_size_bytes"):
        C.load_config(overrides=["store.segment_size_bytes=none"])
    with pytest.raises(C.ConfigError, match="unknown key 'store.background_thread'"):
        C.load_config(overrides=["store.background_thread=false"])  # internal: not a key


def test_package_validation_is_a_config_error():
    """The package's own checks run on the composed values and come back as ConfigError."""
    with pytest.raises(C.ConfigError, match="segment_size_bytes"):
        C.load_config(overrides=["store.segment_size_bytes=10"])
    with pytest.raises(C.ConfigError, match=r"\[ha\]"):
        C.load_config(overrides=["ha.ha_housekeeping_interval_ms=1"])


@pytest.mark.parametrize("item, needle", [
    ("store.flush_disk_type=SYNC_FLUSH", "renamed to store.flush_mode"),
    ("store.mapped_file_size_commit_log=1", "renamed to store.segment_size_bytes"),
    ("controller.controller_store_path=x", "removed"),
    ("broker.send_heartbeat_timeout_ms=1", "removed"),
])
def test_old_keys_say_what_happened(item, needle):
    with pytest.raises(C.ConfigError, match=needle):
        C.load_config(overrides=[item])


def test_file_values_of_enum_and_optional_keys(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[store]\nflush_mode = "sync"\nretention_ms = "none"\n')
    cfg = C.load_config(path=path)
    assert cfg.store.flush_mode is FlushMode.SYNC and cfg.store.retention_ms is None
    assert cfg.to_dict()["store"]["flush_mode"] == "sync"
    assert C.RocketrayConfig.from_dict(cfg.to_dict()) == cfg


def test_overrides_as_a_mapping_like_a_cluster_spec_carries():
    """ClusterSpec.config_overrides -> dict: text values are parsed, typed values are checked."""
    cfg = C.load_config("fast", {"ha.async_learner": "true", "broker.broker_election_priority": 5})
    assert cfg.ha.async_learner is True and cfg.broker.broker_election_priority == 5
    with pytest.raises(C.ConfigError, match="broker.broker_election_priority"):
        C.load_config("fast", {"broker.broker_election_priority": "high"})
    with pytest.raises(C.ConfigError, match="ha.async_learner"):
        C.load_config("fast", {"ha.async_learner": 1})


@pytest.mark.parametrize("profile", C.PROFILES)
def test_sections_are_the_packages_own_configs(profile):
    """Declared once: each section is the package's config object itself, valid in every profile."""
    from rocketray.broker.config import StoreConfig
    from rocketray.broker.replicas_model import ReplicasManagerConfig
    from rocketray.controller.config import ControllerConfig
    from rocketray.ha.config import HAConfig

    cfg = C.profile_config(profile)
    assert type(cfg.controller) is ControllerConfig and type(cfg.ha) is HAConfig
    assert type(cfg.broker) is ReplicasManagerConfig and type(cfg.store) is StoreConfig
    cfg.controller_node_config().validate()
    assert cfg.ha_config() is cfg.ha and cfg.replicas_manager_config() is cfg.broker


def test_readme_table_is_current_when_present():
    """Docs stay true: the README's table between the config markers is what render_config_table gives."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    begin, end = "<!-- config-table:begin -->", "<!-- config-table:end -->"
    assert begin in readme and end in readme
    current = readme.split(begin, 1)[1].split(end, 1)[0].strip()
    assert current == C.render_config_table().strip(), "regenerate with: python -m rocketray.config"
