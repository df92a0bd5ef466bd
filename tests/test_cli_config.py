"""``rocketray start`` and ``driver.py`` take ``--config FILE``, ``--profile`` and ``--set`` alike.

The file is read on the driver and becomes the ClusterSpec's ``profile`` and ``config_overrides``
(``section.key`` -> text, as ``--set`` gives them), so actors on other nodes never need it; what the
actors rebuild from those must equal what ``load_config`` makes of the file. Errors are usage errors
(exit code 2) that name the key and the file, and come before Ray is touched.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

from rocketray import config as C
from rocketray.broker.config import FlushMode
from rocketray.cli import main as cli
from rocketray.cli import options
from rocketray.cli.commands import cluster as cluster_cmd

ROOT = Path(__file__).resolve().parent.parent


def _driver():
    spec = importlib.util.spec_from_file_location("rocketray_job_driver", ROOT / "driver.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _start_args(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["start", *argv])


def _actors_view(profile: str, overrides: dict[str, str]) -> C.RocketrayConfig:
    """What a broker or controller actor builds from its ClusterSpec."""
    return C.load_config(profile, dict(tuple(sorted(overrides.items()))))


TOML = """profile = "fast"
[broker]
broker_heartbeat_interval_ms = 250
broker_election_priority = 7
[ha]
all_ack_in_sync_state_set = false
[store]
flush_mode = "sync"
retention_ms = "none"
"""

YAML = """broker:
  broker_heartbeat_interval_ms: 250
  broker_election_priority: 7
ha:
  all_ack_in_sync_state_set: false
store:
  flush_mode: sync
  retention_ms: null
"""


@pytest.mark.parametrize("name, text", [("rocketray.toml", TOML), ("rocketray.yaml", YAML)])
def test_start_config_file_values_reach_the_actors_and_set_wins(tmp_path, name, text):
    """A TOML and a YAML file through ``rocketray start``'s parser: the file's values apply, ``--set``
    wins over the file, and the spec's text overrides rebuild exactly what load_config reads."""
    path = tmp_path / name
    path.write_text(text)
    args = _start_args("--config", str(path), "--set", "broker.broker_election_priority=3")
    profile, overrides = C.cluster_settings(args)
    assert profile == ("fast" if name.endswith(".toml") else "default")  # the file's profile, else default
    assert all(isinstance(v, str) for v in overrides.values())  # what ClusterSpec.config_overrides holds
    cfg = _actors_view(profile, overrides)
    assert cfg.broker.broker_heartbeat_interval_ms == 250
    assert cfg.broker.broker_election_priority == 3  # --set beats the file
    assert cfg.ha.all_ack_in_sync_state_set is False
    assert cfg.store.flush_mode is FlushMode.SYNC and cfg.store.retention_ms is None
    assert cfg == C.load_config(profile, ["broker.broker_election_priority=3"], path=path)


def test_profile_flag_wins_over_the_files_profile(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(TOML)
    profile, overrides = C.cluster_settings(_start_args("--config", str(path), "--profile", "default"))
    cfg = _actors_view(profile, overrides)
    assert profile == "default" and cfg.broker.controller_heartbeat_timeout_ms == 10000
    assert cfg.broker.broker_heartbeat_interval_ms == 250


def test_every_key_round_trips_through_the_spec_text(tmp_path):
    """All keys at their fast values, written as YAML (nulls included) and applied over the default
    profile, come back through the text overrides as the fast profile's values."""
    fast = C.profile_config("fast").to_dict()
    del fast["profile"]
    path = tmp_path / "all.yaml"
    path.write_text(yaml.safe_dump(fast))
    profile, overrides = C.cluster_settings(_start_args("--config", str(path)))
    assert profile == "default"
    assert len(overrides) == sum(len(C.section_keys(cls)) for cls in C.SECTIONS.values())
    cfg = _actors_view(profile, overrides)
    for section in C.SECTIONS:
        assert getattr(cfg, section) == getattr(C.profile_config("fast"), section), section


@pytest.mark.parametrize("text, needle", [
    ("[broker]\nbroker_hearbeat_interval_ms = 1\n", "unknown key 'broker.broker_hearbeat_interval_ms'"),
    ("[brokr]\nx = 1\n", "unknown section 'brokr'"),
    ("[ha]\nha_transfer_batch_size = \"1\"\n", "ha.ha_transfer_batch_size must be int"),
    ('profile = "turbo"\n', "unknown profile 'turbo'"),
])
def test_start_with_a_bad_file_is_a_usage_error_naming_key_and_file(tmp_path, monkeypatch, capsys, text, needle):
    """Nothing starts: the error comes before Ray is contacted, with exit code 2."""
    path = tmp_path / "bad.toml"
    path.write_text(text)

    def no_ray(address):
        raise AssertionError("Ray must not be contacted for a bad configuration")

    monkeypatch.setattr(cluster_cmd, "_ray", no_ray)
    assert cli.main(["start", "--config", str(path)]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: ") and needle in err, err


@pytest.mark.parametrize("argv, needle", [
    (["--config", "{missing}"], "{missing}: no such config file"),
    (["--config", "{bad_yaml}"], "{bad_yaml}: not valid YAML"),
    (["--set", "broker.nope=1"], "unknown key 'broker.nope'"),
    (["--set", "broker_heartbeat_interval_ms"], "expected section.key=value"),
    (["--config", "{ok}", "--set", "ha.nope=1"], "unknown key 'ha.nope'"),
])
def test_start_and_driver_report_the_same_usage_errors(tmp_path, monkeypatch, capsys, argv, needle):
    paths = {"missing": tmp_path / "missing.toml", "bad_yaml": tmp_path / "bad.yaml", "ok": tmp_path / "ok.toml"}
    paths["bad_yaml"].write_text("ha: [1\n")
    paths["ok"].write_text(TOML)
    argv = [a.format(**paths) for a in argv]
    needle = needle.format(**paths)
    monkeypatch.setattr(cluster_cmd, "_ray", lambda address: pytest.fail("Ray contacted"))
    assert cli.main(["start", *argv]) == 2
    assert needle in capsys.readouterr().err
    driver = _driver()
    monkeypatch.setitem(sys.modules, "ray", None)  # an import of ray in main() would fail the test
    assert driver.main(argv) == 2
    assert needle in capsys.readouterr().err


def test_driver_takes_config_like_start_but_defaults_to_fast(tmp_path):
    driver = _driver()
    path = tmp_path / "c.yaml"
    path.write_text(YAML)
    args = driver.build_parser().parse_args(["--config", str(path), "--set", "ha.async_learner=true"])
    profile, overrides = C.cluster_settings(args, default_profile=driver.DEFAULT_PROFILE)
    assert profile == "fast"
    cfg = _actors_view(profile, overrides)
    assert cfg.broker.broker_heartbeat_interval_ms == 250 and cfg.ha.async_learner is True
    assert C.cluster_settings(driver.build_parser().parse_args([]), default_profile="fast") == ("fast", {})


def test_driver_and_cli_default_to_the_same_cluster_name():
    """``rocketray start`` then ``python driver.py --connect`` (or the reverse, then ``rocketray
    status``) must find the same cluster without ``--name``."""
    from rocketray.actors.cluster import DEFAULT_NAME

    parser = cli.build_parser()
    assert options.DEFAULT_NAME == DEFAULT_NAME
    assert _driver().build_parser().get_default("name") == DEFAULT_NAME
    for command in ("start", "status", "stop"):
        assert parser.parse_args([command]).name == DEFAULT_NAME, command
    assert parser.parse_args(["admin", "get-controller-metadata"]).name == DEFAULT_NAME
