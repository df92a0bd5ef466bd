"""rocketray.config: one typed configuration with the reference defaults, a fast profile, files and --set.

Defaults are checked against reference §7/§8 values; unknown keys must be errors that name the key;
the cluster secret must never show up in repr/str/to_dict (it authenticates the Raft port).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging

import pytest

from rocketray import config as C


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
    assert cfg.ha.ha_transfer_batch_size == 256 * 1024  # upstream 32 KiB: a measured, documented change
    assert cfg.ha.ha_max_time_slave_not_catchup_ms == 15000
    assert cfg.ha.slave_timeout_ms == 3000
    assert (cfg.ha.in_sync_replicas, cfg.ha.min_in_sync_replicas) == (1, 1)
    # rocketray departs from upstream here on purpose: acknowledged writes survive a failover
    assert cfg.ha.all_ack_in_sync_state_set is True and cfg.ha.async_learner is False
    assert cfg.store.mapped_file_size_commit_log == 1024**3
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
    assert cfg.ha.ha_transfer_batch_size == 256 * 1024


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
    cfg = C.load_config(path=path, overrides=["broker.broker_heartbeat_interval_ms=300", "store.flush_disk_type=SYNC_FLUSH",
                                         "ha.min_in_sync_replicas=2", "controller.enable_elect_unclean_master=yes"])
    assert cfg.profile == "fast" and cfg.broker.controller_heartbeat_timeout_ms == 1500
    assert cfg.broker.broker_heartbeat_interval_ms == 300  # --set beats the file
    assert cfg.ha.all_ack_in_sync_state_set is False and cfg.ha.min_in_sync_replicas == 2
    assert cfg.store.flush_disk_type == "SYNC_FLUSH" and cfg.controller.enable_elect_unclean_master is True


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


def test_secret_is_generated_per_cluster_and_never_shown(caplog):
    a, b = C.load_config(), C.load_config()
    assert len(a.cluster_secret) == 64 and a.cluster_secret != b.cluster_secret
    for text in (repr(a), str(a), f"{a}", repr(a.to_dict())):
        assert a.cluster_secret not in text
    assert "***" in repr(a)
    with caplog.at_level(logging.INFO):
        logging.getLogger("test").info("config %s %r", a, a)
    assert a.cluster_secret not in caplog.text
    assert a.to_dict(include_secret=True)["cluster_secret"] == a.cluster_secret
    assert a == b  # equality ignores the secret: same settings


def test_to_dict_round_trip_keeps_secret_only_when_asked():
    cfg = C.load_config(profile="fast", overrides=["ha.async_learner=true"])
    again = C.RocketrayConfig.from_dict(cfg.to_dict(include_secret=True))
    assert again == cfg and again.cluster_secret == cfg.cluster_secret
    assert C.RocketrayConfig.from_dict(cfg.to_dict()).cluster_secret != cfg.cluster_secret
    with pytest.raises(C.ConfigError, match="broker.zzz"):
        C.RocketrayConfig.from_dict({"broker": {"zzz": 1}})


def test_every_key_has_meaning_and_a_snake_case_name():
    for section, cls in C.SECTIONS.items():
        for f in dataclasses.fields(cls):
            assert f.name == f.name.lower() and " " not in f.name
            assert f.metadata.get("meaning"), f"{section}.{f.name} has no meaning"
            if "interval" in f.name or "period" in f.name or "timeout" in f.name:
                assert f.name.endswith("_ms"), f"{section}.{f.name}: units last"


def test_readme_table_lists_every_key_with_default_and_fast_value():
    table = C.render_config_table()
    lines = table.strip().splitlines()
    assert lines[0] == "| key | default | fast | meaning |"
    keys = [f"{s}.{f.name}" for s, cls in C.SECTIONS.items() for f in dataclasses.fields(cls)]
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


def test_replicas_manager_reads_the_broker_section():
    from rocketray.broker.replicas_manager import ReplicasManagerConfig

    rm = ReplicasManagerConfig.from_section(C.profile_config("fast").broker)
    assert rm.broker_heartbeat_interval_ms == 200 and rm.controller_heartbeat_timeout_ms == 1500
    assert set(ReplicasManagerConfig.__dataclass_fields__) <= {f.name for f in dataclasses.fields(C.BrokerConfig)}


def test_store_section_builds_the_stores_own_config():
    from rocketray.broker.config import FlushMode, StoreConfig

    cfg = C.load_config(profile="fast", overrides=["store.flush_disk_type=SYNC_FLUSH"])
    store = cfg.store_config()
    assert isinstance(store, StoreConfig)
    assert store.segment_size_bytes == 64 * 1024 * 1024 and store.flush_mode == FlushMode.SYNC
    assert store.retention_ms == 72 * 3600 * 1000
    with pytest.raises(C.ConfigError, match="flush_disk_type"):
        C.load_config(overrides=["store.flush_disk_type=SOMETIMES"]).store_kwargs()


def test_overrides_as_a_mapping_like_a_cluster_spec_carries():
    """ClusterSpec.config_overrides -> dict: text values are parsed, typed values are checked."""
    cfg = C.load_config("fast", {"ha.async_learner": "true", "broker.broker_election_priority": 5})
    assert cfg.ha.async_learner is True and cfg.broker.broker_election_priority == 5
    with pytest.raises(C.ConfigError, match="broker.broker_election_priority"):
        C.load_config("fast", {"broker.broker_election_priority": "high"})
    with pytest.raises(C.ConfigError, match="ha.async_learner"):
        C.load_config("fast", {"ha.async_learner": 1})


@pytest.mark.parametrize("profile", C.PROFILES)
def test_builds_every_packages_own_config(profile):
    """The sections build the controller node's, the HA service's, the store's and the broker loop's
    configs, and those accept the values (their own validation runs)."""
    cfg = C.profile_config(profile)
    node = cfg.controller_node_config()
    node.validate()
    assert node.raft_max_timeout_ms == cfg.controller.raft_max_timeout_ms
    ha = cfg.ha_config()
    assert ha.ha_send_heartbeat_interval_ms == cfg.ha.ha_send_heartbeat_interval_ms
    assert cfg.replicas_manager_config().broker_heartbeat_interval_ms == cfg.broker.broker_heartbeat_interval_ms
    assert cfg.store_config().segment_size_bytes == cfg.store.mapped_file_size_commit_log


@pytest.mark.parametrize("section, module, cls", [
    ("controller", "rocketray.controller.config", "ControllerConfig"),
    ("ha", "rocketray.ha.config", "HAConfig"),
    ("broker", "rocketray.broker.replicas_manager", "ReplicasManagerConfig"),
])
def test_sections_cover_the_package_configs_with_the_same_defaults(section, module, cls):
    """Drift guard: every key of a package's config is settable here, with the same default."""
    import importlib

    target = getattr(importlib.import_module(module), cls)
    mine = {f.name: f.default for f in dataclasses.fields(C.SECTIONS[section])}
    for f in dataclasses.fields(target):
        assert f.name in mine, f"{section}.{f.name} missing"
        assert mine[f.name] == f.default, f"{section}.{f.name}: {mine[f.name]} != {f.default}"


def test_readme_table_is_current_when_present():
    """Docs stay true: the README's table between the config markers is what render_config_table gives."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    begin, end = "<!-- config-table:begin -->", "<!-- config-table:end -->"
    if begin not in readme:
        pytest.skip("README has no generated configuration table yet (python -m rocketray.config)")
    current = readme.split(begin, 1)[1].split(end, 1)[0].strip()
    assert current == C.render_config_table().strip(), "regenerate with: python -m rocketray.config"
