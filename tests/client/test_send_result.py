"""``send_ok`` (what the producer resolves each acknowledged future with) makes the same
:class:`SendResult` as its constructor: equal, same hash and repr, still frozen."""

from __future__ import annotations

import dataclasses

import pytest

from rocketray.client.types import SendResult, SendStatus, send_ok


def test_send_ok_is_the_constructed_send_result() -> None:
    made = send_ok("ID1", "orders", 3, 42)
    built = SendResult(SendStatus.SEND_OK, "ID1", "orders", 3, 42)
    assert type(made) is SendResult
    assert made == built and hash(made) == hash(built) and repr(made) == repr(built)
    assert dataclasses.astuple(made) == (SendStatus.SEND_OK, "ID1", "orders", 3, 42)
    assert made != send_ok("ID1", "orders", 3, 43)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.queue_offset = 7  # type: ignore[misc]
