"""The client's pure rules: queue selection, allocate-averagely, batching, commit positions."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, strategies as st

from rocketray.client.core import Accumulator, Positions, allocate_averagely, key_queue, select_queue


# --- queue selection ---------------------------------------------------------------------------------
def test_one_key_always_goes_to_one_queue_and_keys_spread():
    """A key's queue is stable (crc32, not Python's salted hash) and keys spread over the queues."""
    assert key_queue("order-17", 8) == key_queue("order-17", 8) == select_queue("order-17", 8, 12345)
    assert key_queue("order-17", 8) == zlib.crc32(b"order-17") % 8
    assert len({key_queue(f"k{i}", 8) for i in range(200)}) == 8


def test_without_a_key_round_robin():
    assert [select_queue(None, 3, c) for c in range(7)] == [0, 1, 2, 0, 1, 2, 0]


# --- allocate averagely --------------------------------------------------------------------------------
@pytest.mark.parametrize("queues, members, expected", [
    # RocketMQ AllocateMessageQueueAveragely's own cases: contiguous, near-equal slices in member order
    (8, ["a", "b"], {"a": [0, 1, 2, 3], "b": [4, 5, 6, 7]}),
    (8, ["a", "b", "c"], {"a": [0, 1, 2], "b": [3, 4, 5], "c": [6, 7]}),
    (5, ["c", "a"], {"a": [0, 1, 2], "c": [3, 4]}),               # members sorted, not as given
    (2, ["a", "b", "c"], {"a": [0], "b": [1], "c": []}),           # more members than queues
    (4, ["a"], {"a": [0, 1, 2, 3]}),
])
def test_allocate_averagely_table(queues, members, expected):
    for me, want in expected.items():
        assert allocate_averagely(list(range(queues)), members, me) == want


def test_a_non_member_owns_nothing():
    assert allocate_averagely([0, 1], ["a", "b"], "z") == []
    assert allocate_averagely([], ["a"], "a") == []


@given(st.integers(1, 64), st.sets(st.text("abcdef", min_size=1, max_size=4), min_size=1, max_size=20))
def test_every_queue_has_exactly_one_owner(n, members):
    """Members that agree on the member list split the queues exactly: each queue one owner, sizes
    differ by at most one."""
    owned = {m: allocate_averagely(list(range(n)), sorted(members), m) for m in members}
    flat = [q for qs in owned.values() for q in qs]
    assert sorted(flat) == list(range(n))
    sizes = [len(qs) for qs in owned.values()]
    assert max(sizes) - min(sizes) <= 1


# --- batching ------------------------------------------------------------------------------------------
def test_a_batch_waits_for_linger_unless_urgent_or_full():
    acc: Accumulator[str, int] = Accumulator(linger_ms=5, batch_bytes=100, max_batch_count=10)
    acc.add("q", 1, 10, now_ms=0)
    assert acc.take_ready(4) == [] and acc.next_due_ms() == 5
    assert [b.items for b in acc.take_ready(5)] == [[1]]
    acc.done("q")
    acc.add("q", 2, 10, now_ms=10, urgent=True)                       # a synchronous send
    assert [b.items for b in acc.take_ready(10)] == [[2]]
    acc.done("q")
    for i in range(10):                                               # full by bytes before linger
        acc.add("q", i, 10, now_ms=20)
    assert [b.items for b in acc.take_ready(20)] == [list(range(10))]


def test_one_batch_in_flight_per_queue_keeps_order():
    """While a queue's batch is in flight the next waits, so a queue's messages are stored in send order."""
    acc: Accumulator[str, int] = Accumulator(linger_ms=0, batch_bytes=1000, max_batch_count=100)
    acc.add("q", 1, 1, 0)
    first = acc.take_ready(0)
    acc.add("q", 2, 1, 0)
    acc.add("r", 3, 1, 0)
    assert [b.queue for b in acc.take_ready(1)] == ["r"]              # q is busy, r is not
    acc.done("q")
    assert [b.items for b in acc.take_ready(1)] == [[2]]
    assert [b.items for b in first] == [[1]]


def test_take_next_hands_the_answered_queues_next_batch_to_the_same_sender():
    """The thread whose put was answered takes its queue's next ready batch (still one in flight);
    a message added while a batch is in flight does not call for the sender thread."""
    acc: Accumulator[str, int] = Accumulator(linger_ms=5, batch_bytes=1000, max_batch_count=100)
    assert acc.add("q", 1, 1, 0) is True                             # idle: the sender must look
    [first] = acc.take_ready(5)
    assert acc.add("q", 2, 1, 6) is False                            # in flight: its answer comes first
    assert acc.take_ready(20) == []                                  # nobody else may take q's batch
    assert acc.take_next("q", 7) is None and acc.pending() == 1      # not lingered yet: q is idle now
    [second] = acc.take_ready(11)
    assert acc.add("q", 3, 1, 12) is False
    nxt = acc.take_next("q", 17)
    assert nxt is not None and nxt.items == [3] and acc.take_ready(30) == []
    assert acc.take_next("q", 30) is None and acc.pending() == 0
    assert [first.items, second.items] == [[1], [2]]


def test_an_oversize_batch_is_split_in_order():
    acc: Accumulator[str, int] = Accumulator(linger_ms=0, batch_bytes=25, max_batch_count=100)
    for i in range(6):
        acc.add("q", i, 10, 0)
    taken = []
    while acc.pending():
        for b in acc.take_ready(0):
            taken.append(b.items)
            acc.done(b.queue)
    assert taken == [[0, 1], [2, 3], [4, 5]]


def test_flush_all_makes_every_batch_ready():
    acc: Accumulator[str, int] = Accumulator(linger_ms=10_000, batch_bytes=1000, max_batch_count=100)
    acc.add("q", 1, 1, 0)
    assert acc.take_ready(1) == []
    acc.flush_all()
    assert [b.items for b in acc.take_ready(1)] == [[1]]


# --- positions -------------------------------------------------------------------------------------------
def test_commit_positions_only_move_forward():
    p = Positions()
    p.returned(("t", 0), 10)
    p.returned(("t", 0), 5)            # an older pull's answer never moves the position back
    assert p.to_commit() == {("t", 0): 10}
    p.acknowledged(("t", 0), 10)
    assert p.to_commit() == {}
    p.returned(("t", 0), 12)
    assert p.to_commit() == {("t", 0): 12}


def test_a_seek_moves_the_position_either_way_and_only_a_forward_one_is_committed():
    """A seek past the acknowledged commit is what the next commit stores (skipping ahead); one
    below it replays without a commit (the brokers keep each queue's highest offset anyway)."""
    p = Positions()
    p.returned(("t", 0), 10)
    p.acknowledged(("t", 0), 10)
    p.sought(("t", 0), 3)
    assert p.to_commit() == {}
    p.returned(("t", 0), 6)
    assert p.to_commit() == {}          # replayed 3..5: below the acknowledged 10
    p.sought(("t", 0), 40)
    assert p.to_commit() == {("t", 0): 40}
