"""A consume-queue file (or its topic directory: ``names_to_sync``) created by a process killed
before it fsynced the directory holding its name: the next process sees the name (a kill keeps the
page cache) but must not trust it to be durable. Its checkpoints vouch for the queue's entries, so
it fsyncs those directories before the first one; else a later power loss drops the name and the
queue restarts past entries the log still holds (simulator ``async-overlap`` seeds 55 and 70 for the
file, 456 for the topic directory). Real store over the simulated disk, which drops each unsynced
directory operation or keeps it, by its seed."""

from __future__ import annotations

import random

import pytest

from rocketray.broker import consume_queue
from rocketray.broker.config import FlushMode, StoreConfig
from rocketray.wire.message import Message
from rocketray.broker.store import MessageStore
from rocketray.sim.disk import CrashMode, SimDisk

CONFIG = StoreConfig(flush_mode=FlushMode.ASYNC, background_thread=False)


def _queue_after_kill_then_power_loss(seed: int) -> tuple[int, int]:
    """Process A writes two messages of a new topic and dispatches them (the queue file is created),
    then is killed before any flush; process B opens the store, flushes (checkpoint: dispatched past
    both), then the machine loses power; process C opens it. Returns (messages the queue serves,
    records in the log)."""
    disk = SimDisk(random.Random(seed))
    a = MessageStore("/s", CONFIG, disk=disk)
    a.put_messages([Message(topic="t", queue_id=0, body=b"one"), Message(topic="t", queue_id=0, body=b"two")], 1)
    a.commitlog.flush()                      # the log is durable; the queue file's name is not
    a.confirm_offset = a.max_offset          # dispatch: creates the queue file
    disk.crash(CrashMode.KILL)
    return _restart_flush_then_lose_power(disk, 2, "after a kill the page cache, with the name, is still there")


def _restart_flush_then_lose_power(disk: SimDisk, messages: int, why: str) -> tuple[int, int]:
    """Process B opens the store, dispatches (``why`` it serves topic t), flushes (its checkpoint
    vouches for every entry), then the machine loses power and process C opens it. Returns (messages
    queue t/0 serves, ``messages`` if the log kept what B had, else -1)."""
    b = MessageStore("/s", CONFIG, disk=disk)
    b.confirm_offset = b.max_offset          # (a master's confirm offset after its restart)
    assert b.get_messages("t", 0, 0, 10), why
    b.flush()
    assert b.dispatched_offset == b.max_offset
    disk.crash(CrashMode.POWER_LOSS)
    c = MessageStore("/s", CONFIG, disk=disk)
    c.confirm_offset = c.max_offset
    return len(c.get_messages("t", 0, 0, 10)), messages if c.max_offset == b.max_offset else -1


@pytest.mark.parametrize("seed", range(8))
def test_a_queue_found_at_start_keeps_its_entries_through_a_later_power_loss(seed):
    served, in_log = _queue_after_kill_then_power_loss(seed)
    assert in_log == 2 and served == 2


def without_queue_check(monkeypatch) -> None:
    """Start-up's check of the queues against the log (``broker/queue_check.py``) repairs what these
    old rules lose; it is turned off to show each rule's own effect."""
    monkeypatch.setattr(MessageStore, "_check_queues", lambda self, dispatched: dispatched)


@pytest.mark.slow
def test_trusting_the_name_found_at_start_loses_the_entries(monkeypatch):
    """The old rule (a name is synced only by the process that created it): on some seeds the power
    loss drops the name, and the queue serves nothing of what the log and the checkpoint hold."""
    monkeypatch.setattr(consume_queue, "name_needs_sync", lambda created: created)
    without_queue_check(monkeypatch)
    outcomes = [_queue_after_kill_then_power_loss(seed) for seed in range(8)]
    assert all(in_log == 2 for _served, in_log in outcomes)
    assert any(served == 0 for served, _in_log in outcomes), outcomes


def _topic_dir_after_kill_then_power_loss(seed: int) -> tuple[int, int]:
    """``async-overlap`` seed 456's shape. Process A dispatches a message of a new topic and is killed
    between ``mkdir consumequeue/t`` and the fsync of ``consumequeue`` (the topic directory's name
    is in the page cache only). Process B finds ``t`` but not its queue-id directory (A died before
    making it), dispatches (B makes ``t/0`` and its file), flushes (checkpoint: dispatched past the
    message), then the machine loses power; process C opens the store. Returns (messages the queue
    serves, messages in the log)."""
    disk = SimDisk(random.Random(seed))
    a = MessageStore("/s", CONFIG, disk=disk)
    a.put_messages([Message(topic="t", queue_id=0, body=b"one")], 1)
    a.commitlog.flush()
    made = []

    def kill_before_the_topic_name_is_synced(_n: int, op: str, path: str):
        if op == "mkdir" and path.endswith("/consumequeue/t"):
            made.append(path)
        elif op == "fsync_dir" and path.endswith("/consumequeue") and made:
            return CrashMode.KILL
        return None

    disk.set_hook(kill_before_the_topic_name_is_synced)
    with pytest.raises(BaseException) as crashed:
        a.confirm_offset = a.max_offset          # dispatch: makes consumequeue/t, then dies
    assert type(crashed.value).__name__ == "SimCrash"
    disk.set_hook(None)
    assert disk.is_dir("/s/consumequeue/t") and not disk.is_dir("/s/consumequeue/t/0")
    return _restart_flush_then_lose_power(disk, 1, "B made the queue-id directory and dispatched")


@pytest.mark.parametrize("seed", range(8))
def test_a_topic_directory_found_at_start_keeps_its_queues_through_a_later_power_loss(seed):
    served, in_log = _topic_dir_after_kill_then_power_loss(seed)
    assert in_log == 1 and served == 1


@pytest.mark.slow
def test_syncing_only_the_queue_directory_loses_a_topic_directory_a_killed_process_made(monkeypatch):
    """The old rule (a checkpoint fsyncs only the queue-id directory of a new queue file): on some
    seeds the power loss drops the topic directory, and the queue serves nothing of what the log and
    the checkpoint hold."""
    monkeypatch.setattr(consume_queue, "names_to_sync", lambda queue_dir, root: [queue_dir])
    without_queue_check(monkeypatch)
    outcomes = [_topic_dir_after_kill_then_power_loss(seed) for seed in range(8)]
    assert all(in_log == 1 for _served, in_log in outcomes)
    assert any(served == 0 for served, _in_log in outcomes), outcomes
