"""Broker identity files (reference 9.1): format, load/validate/clear, durable writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocketray.broker.identity import BrokerIdentity, TempBrokerIdentity


def test_identity_file_format_and_round_trip(tmp_path: Path) -> None:
    """brokerIdentity is `<cluster>#<name>#<id>` and loads back equal."""
    ident = BrokerIdentity("DefaultCluster", "broker-a", 3)
    ident.save(tmp_path)
    assert (tmp_path / "brokerIdentity").read_text() == "DefaultCluster#broker-a#3"
    assert BrokerIdentity.load(tmp_path) == ident
    assert ident.matches("DefaultCluster", "broker-a") and not ident.matches("Other", "broker-a")


def test_temp_identity_file_format_and_round_trip(tmp_path: Path) -> None:
    """brokerIdentity-temp is `<cluster>#<name>#<id>#<checkCode>` and loads back equal."""
    temp = TempBrokerIdentity("c", "b", 2, "127.0.0.1:10911;1700000000000")
    temp.save(tmp_path)
    assert (tmp_path / "brokerIdentity-temp").read_text() == "c#b#2#127.0.0.1:10911;1700000000000"
    assert TempBrokerIdentity.load(tmp_path) == temp
    assert temp.to_identity() == BrokerIdentity("c", "b", 2)


def test_missing_or_malformed_is_not_loaded(tmp_path: Path) -> None:
    """A missing or malformed file loads as None (not loaded)."""
    assert BrokerIdentity.load(tmp_path) is None
    assert TempBrokerIdentity.load(tmp_path) is None
    for bad in ["", "c#b", "c#b#x", "#b#1", "c##1", "c#b#1#extra"]:
        (tmp_path / "brokerIdentity").write_text(bad)
        assert BrokerIdentity.load(tmp_path) is None, bad
    for bad in ["c#b#1", "c#b#1#", "c#b#x#code"]:
        (tmp_path / "brokerIdentity-temp").write_text(bad)
        assert TempBrokerIdentity.load(tmp_path) is None, bad


def test_clear_deletes_and_is_idempotent(tmp_path: Path) -> None:
    """clear() removes the file; clearing again is fine."""
    BrokerIdentity("c", "b", 1).save(tmp_path)
    TempBrokerIdentity("c", "b", 1, "code").save(tmp_path)
    BrokerIdentity.clear(tmp_path)
    TempBrokerIdentity.clear(tmp_path)
    BrokerIdentity.clear(tmp_path)
    assert BrokerIdentity.load(tmp_path) is None and TempBrokerIdentity.load(tmp_path) is None
    assert list(tmp_path.iterdir()) == []


def test_overwrite_is_atomic(tmp_path: Path) -> None:
    """Saving replaces the old content through a renamed temp file (no temp left behind)."""
    BrokerIdentity("c", "b", 1).save(tmp_path)
    BrokerIdentity("c", "b", 7).save(tmp_path)
    assert BrokerIdentity.load(tmp_path) == BrokerIdentity("c", "b", 7)
    assert [p.name for p in tmp_path.iterdir()] == ["brokerIdentity"]


@pytest.mark.parametrize("cluster,name", [("", "b"), ("c", ""), ("c#x", "b"), ("c", "b\n")])
def test_invalid_names_refused(cluster: str, name: str) -> None:
    """Names that would not round-trip through the file are refused."""
    with pytest.raises(ValueError):
        BrokerIdentity(cluster, name, 1)
