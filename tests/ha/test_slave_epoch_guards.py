"""Issue 15 fix 7, slave part: the slave refuses a batch of an older epoch and a master whose
handshake names another epoch than the controller gave it (each also against its old rule)."""

from __future__ import annotations

import rocketray.ha.session as session_mod
from memory_log import MemoryLog, apply_slave_actions
from rocketray.wire.ha_protocol import EpochPoint, encode_master_handshake, encode_master_transfer
from rocketray.ha.session import Append, Close, SlaveSession, Truncate


def slave_at_epoch_2() -> tuple[SlaveSession, MemoryLog]:
    """A slave holding epoch 1 [0,14) and epoch 2 [14,28), connected to a master at epoch 2."""
    log = MemoryLog()
    log.become_master(1)
    log.append_record(b"a" * 10)
    log.become_master(2)
    log.append_record(b"b" * 10)
    s = SlaveSession(3)
    s.connect(log.local(), 0)
    s.receive_data(encode_master_handshake(28, [EpochPoint(1, 0), EpochPoint(2, 14)]), 0)
    apply_slave_actions(log, s.next_actions(log.local(), 0))
    return s, log


def test_batch_of_an_older_epoch_is_refused():
    """A batch labelled epoch 1 appended after our epoch-2 bytes would put an old master's data
    into the new term: the slave closes instead of appending."""
    s, log = slave_at_epoch_2()
    s.receive_data(encode_master_transfer(28, 1, 0, 0, b"\x00\x00\x00\x02xy"), 1)
    actions = s.next_actions(log.local(), 1)
    assert len(actions) == 1 and isinstance(actions[0], Close), actions
    assert "behind local epoch 2" in actions[0].reason


def test_batch_of_an_older_epoch_old_rule_is_caught(monkeypatch):
    monkeypatch.setattr(session_mod, "batch_epoch_ok", lambda batch, local: True)
    s, log = slave_at_epoch_2()
    s.receive_data(encode_master_transfer(28, 1, 0, 0, b"\x00\x00\x00\x02xy"), 1)
    assert any(isinstance(a, Append) for a in s.next_actions(log.local(), 1))


def test_batch_of_the_same_or_newer_epoch_is_appended():
    s, log = slave_at_epoch_2()
    s.receive_data(encode_master_transfer(28, 2, 14, 0, b"\x00\x00\x00\x02xy"), 1)
    assert any(isinstance(a, Append) for a in s.next_actions(log.local(), 1))


def handshake(expected: int | None, master_points: list[EpochPoint]) -> list:
    log = MemoryLog()
    log.become_master(1)
    log.append_record(b"a" * 10)
    s = SlaveSession(3, expected_epoch=expected)
    s.connect(log.local(), 0)
    s.receive_data(encode_master_handshake(28, master_points), 0)
    return s.next_actions(log.local(), 0)


def test_master_handshake_at_another_epoch_than_the_controller_named_is_refused():
    """The controller said "master at epoch 3"; a master answering with last epoch 2 is a stale
    master (or one we must not follow yet): close before any truncation or append."""
    actions = handshake(3, [EpochPoint(1, 0), EpochPoint(2, 14)])
    assert len(actions) == 1 and isinstance(actions[0], Close), actions
    assert "controller named epoch 3" in actions[0].reason
    ahead = handshake(2, [EpochPoint(1, 0), EpochPoint(3, 14)])
    assert len(ahead) == 1 and isinstance(ahead[0], Close), ahead


def test_master_handshake_at_the_named_epoch_is_followed():
    actions = handshake(2, [EpochPoint(1, 0), EpochPoint(2, 14)])
    assert not any(isinstance(a, Close) for a in actions)
    assert handshake(None, [EpochPoint(1, 0), EpochPoint(5, 14)])[-1].__class__.__name__ == "Send"


def test_handshake_epoch_old_rule_is_caught(monkeypatch):
    """Old rule: no comparison; the stale master's handshake is followed (and may truncate us)."""
    monkeypatch.setattr(session_mod, "handshake_epoch_ok", lambda expected, master: True)
    actions = handshake(3, [EpochPoint(1, 0), EpochPoint(2, 4)])
    assert not any(isinstance(a, Close) for a in actions)
    assert any(isinstance(a, Truncate) for a in actions)
