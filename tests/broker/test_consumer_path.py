"""The broker's consumer endpoints over a real store: held pulls, commits, committed offsets.

The HA service is replaced by a small stand-in of its port (``put`` appends and, when told to,
confirms; ``add_confirm_listener``), since what is tested here is the endpoint's rules: serve only
confirmed records, hold a pull until the confirm offset moves, never below a group's commit, and
answer committed offsets only from a confirmed log."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rocketray.actors.consumer_path import ConsumerPath
from rocketray.wire.batch import encode_batch
from rocketray.broker.config import StoreConfig
from rocketray.wire.message import Message, decode_record
from rocketray.wire.offset_records import OFFSETS_QUEUE, OFFSETS_TOPIC
from rocketray.wire.pull_result import OffsetsStatus, PullStatus
from rocketray.broker.store import MessageStore
from rocketray.wire.put_result import PutStatus
from store_fakes import FakeHA


@pytest.fixture
def path(tmp_path: Path):
    store = MessageStore(tmp_path, StoreConfig(background_thread=False))
    ha = FakeHA(store)
    state = {"master": True}
    cp = ConsumerPath(store, lambda: state["master"], lambda: state["master"], lambda: ha, ready_timeout_ms=200)
    yield store, ha, cp, state
    store.close()


def put(ha: FakeHA, n: int, queue_id: int = 0) -> None:
    batch = encode_batch(Message("T", queue_id, f"m{i}".encode(), born_timestamp_ms=i) for i in range(n))
    asyncio.run(ha.put(batch, 1))


def bodies(records: bytes, count: int) -> list[bytes]:
    out, pos = [], 0
    for _ in range(count):
        msg, size = decode_record(records, pos)
        out.append(msg.body)
        pos += size
    return out


def test_a_pull_returns_confirmed_records_only(path):
    store, ha, cp, _ = path
    put(ha, 3)
    ha.auto_confirm = False
    asyncio.run(ha.put(encode_batch([Message("T", 0, b"unconfirmed")]), 1))
    r = asyncio.run(cp.pull("T", 0, 0, 100, 1 << 20, 0))
    assert r.status is PullStatus.FOUND and bodies(r.records, r.count) == [b"m0", b"m1", b"m2"]
    assert (r.offset, r.next_offset) == (0, 3)
    r = asyncio.run(cp.pull("T", 0, 3, 100, 1 << 20, 0))
    assert r.status is PullStatus.NO_NEW_MSG and r.next_offset == 3


def test_a_held_pull_answers_when_the_confirm_offset_moves(path):
    """RocketMQ's pull hold: the request waits until a message is confirmed, not a poll interval."""
    store, ha, cp, _ = path
    ha.auto_confirm = False

    async def scenario():
        held = asyncio.ensure_future(cp.pull("T", 0, 0, 100, 1 << 20, 10_000))
        await asyncio.sleep(0.02)
        assert not held.done()
        await ha.put(encode_batch([Message("T", 0, b"late")]), 1)   # written, not yet confirmed
        await asyncio.sleep(0.02)
        assert not held.done()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        ha.confirm(store.max_offset)
        result = await asyncio.wait_for(held, 5)
        return result, loop.time() - t0

    result, waited_s = asyncio.run(scenario())
    assert result.status is PullStatus.FOUND and bodies(result.records, 1) == [b"late"]
    assert waited_s < 0.2     # woken by the listener, well before the 250 ms re-check


def test_a_held_pull_is_answered_in_the_step_that_confirms_its_message(path):
    """The client port's path (``pull_start``): a held pull's answer is handed to ``done`` from
    within the confirm-offset move itself, with no task and no loop pass in between (the
    send -> long-poll latency of issue 27); an early pull is answered at once, by return value."""
    store, ha, cp, _ = path
    ha.auto_confirm = False
    answers: list = []

    async def scenario():
        assert cp.pull_start("T", 0, 0, 100, 1 << 20, 10_000, None, answers.append) is None
        await ha.put(encode_batch([Message("T", 0, b"now")]), 1)
        assert answers == []
        ha.confirm(store.max_offset)
        assert len(answers) == 1            # no await between the move and the answer
        now = cp.pull_start("T", 0, 0, 100, 1 << 20, 10_000, None, answers.append)
        return now

    now = asyncio.run(scenario())
    assert answers[0].status is PullStatus.FOUND and bodies(answers[0].records, 1) == [b"now"]
    assert now.status is PullStatus.FOUND and len(answers) == 1 and cp._held == {}


def test_a_confirm_move_wakes_only_the_held_pulls_of_queues_with_a_new_entry(path):
    """A put to queue 1 wakes queue 1's held pull, not queue 0's (which would re-read its queue and
    wait again on the master's loop); a pull whose wait ended leaves nothing behind."""
    store, ha, cp, _ = path
    ha.auto_confirm = False

    async def scenario():
        on_0 = asyncio.ensure_future(cp.pull("T", 0, 0, 100, 1 << 20, 10_000))
        on_1 = asyncio.ensure_future(cp.pull("T", 1, 0, 100, 1 << 20, 10_000))
        await asyncio.sleep(0.02)
        assert sorted(h.queue_id for h in cp._held) == [0, 1]
        await ha.put(encode_batch([Message("T", 1, b"for one")]), 1)
        ha.confirm(store.max_offset)
        result = await asyncio.wait_for(on_1, 5)
        assert [h.queue_id for h in cp._held] == [0] and not on_0.done()
        on_0.cancel()
        await asyncio.gather(on_0, return_exceptions=True)
        return result

    result = asyncio.run(scenario())
    assert result.status is PullStatus.FOUND and bodies(result.records, 1) == [b"for one"]
    assert cp._held == {}


def test_a_held_pull_ends_empty_when_the_hold_runs_out(path):
    _, _, cp, _ = path
    r = asyncio.run(cp.pull("T", 0, 0, 10, 1024, 50))
    assert r.status is PullStatus.NO_NEW_MSG and r.count == 0


@pytest.mark.parametrize("args", [(-1, 10, 10, 0), (0, 0, 10, 0), (0, 10, 0, 0), (0, 10, 10, -1),
                                  (0, 10**6, 10, 0), (0, 10, 10, 10**9)])
def test_invalid_pulls_are_refused(path, args):
    _, _, cp, _ = path
    assert asyncio.run(cp.pull("T", 0, *args)).status is PullStatus.ILLEGAL


def test_a_replica_that_is_not_master_does_not_serve(path):
    _, ha, cp, state = path
    put(ha, 1)
    state["master"] = False
    assert asyncio.run(cp.pull("T", 0, 0, 10, 1024, 0)).status is PullStatus.NOT_MASTER
    assert asyncio.run(cp.committed("g")).status is OffsetsStatus.NOT_MASTER
    assert not asyncio.run(cp.commit("g", [("T", 0, 1)])).ok


def test_commits_fold_to_the_highest_and_pulls_start_there(path):
    """A lower commit after a higher one leaves the higher; a group's pull below it starts at it."""
    _, ha, cp, _ = path
    put(ha, 10)
    assert asyncio.run(cp.commit("g", [("T", 0, 7)])).ok
    assert asyncio.run(cp.commit("g", [("T", 0, 2)])).ok
    got = asyncio.run(cp.committed("g"))
    assert got.status is OffsetsStatus.OK and got.committed == (("T", 0, 7),) and got.max_offsets == (("T", 0, 10),)
    r = asyncio.run(cp.pull("T", 0, 0, 100, 1 << 20, 0, group="g"))
    assert r.offset == 7 and bodies(r.records, r.count) == [b"m7", b"m8", b"m9"]
    other = asyncio.run(cp.pull("T", 0, 0, 100, 1 << 20, 0, group="h"))       # groups are independent
    assert other.offset == 0 and other.count == 10


def test_a_reset_record_moves_the_group_back_and_survives_a_refresh_and_a_new_fold(path):
    """The admin's reset (``commit(reset=True)``) sets a committed offset below the highest commit,
    the group's pulls start there, later commits raise it from there, and neither the retention
    refresh nor a fold from scratch (a new master's) brings the old maximum back."""
    store, ha, cp, _ = path
    put(ha, 10)
    assert asyncio.run(cp.commit("g", [("T", 0, 7)])).ok
    assert asyncio.run(cp.commit("g", [("T", 0, 1)], reset=True)).ok
    assert asyncio.run(cp.committed("g")).committed == (("T", 0, 1),)
    assert asyncio.run(cp.pull("T", 0, 0, 100, 1 << 20, 0, group="g")).offset == 1
    assert asyncio.run(cp.commit("g", [("T", 0, 0)])).ok                  # below the reset: the maximum keeps 1
    assert asyncio.run(cp.commit("g", [("T", 0, 3)])).ok                  # progress from the reset point
    assert asyncio.run(cp.refresh_idle_groups(max_age_ms=-1)) == ["g"]
    assert asyncio.run(cp.committed("g")).committed == (("T", 0, 3),)
    assert asyncio.run(cp.commit("g", [("T", 0, 11)], reset=True)).status is PutStatus.MESSAGE_ILLEGAL
    cp._table = type(cp._table)()                                       # fold every record again
    assert asyncio.run(cp.committed("g")).committed == (("T", 0, 3),)


def test_a_commit_past_the_queue_end_is_refused_and_not_written(path):
    store, ha, cp, _ = path
    put(ha, 2)
    end = store.max_offset
    assert asyncio.run(cp.commit("g", [("T", 0, 3)])).status is PutStatus.MESSAGE_ILLEGAL
    assert asyncio.run(cp.commit("", [("T", 0, 1)])).status is PutStatus.MESSAGE_ILLEGAL
    assert store.max_offset == end and store.queue_max_offset(OFFSETS_TOPIC, OFFSETS_QUEUE) == 0


def test_committed_offsets_wait_for_a_confirmed_log(path):
    """A new master answers only once its log is confirmed: an acknowledged commit may sit in its
    unconfirmed tail, and answering from less would move the group back."""
    store, ha, cp, _ = path
    put(ha, 5)
    ha.auto_confirm = False
    asyncio.run(cp.commit("g", [("T", 0, 4)]))           # written, not confirmed
    ha.epoch = 2                                           # a new master term: ready is asked again
    assert asyncio.run(cp.committed("g")).status is OffsetsStatus.NOT_READY
    assert asyncio.run(cp.pull("T", 0, 0, 10, 1024, 0, group="g")).status is PullStatus.NOT_MASTER
    ha.confirm(store.max_offset)
    got = asyncio.run(cp.committed("g"))
    assert got.status is OffsetsStatus.OK and got.committed == (("T", 0, 4),)


def test_idle_groups_offsets_are_appended_again_before_retention(path):
    """A group that stopped committing keeps its offsets: its records are re-appended once older than
    half the retention, and the re-append changes no offset (the fold keeps the maximum)."""
    store, ha, cp, _ = path
    put(ha, 10)
    assert asyncio.run(cp.commit("idle", [("T", 0, 6)])).ok
    assert asyncio.run(cp.commit("busy", [("T", 0, 8)])).ok
    assert asyncio.run(cp.refresh_idle_groups(max_age_ms=60_000)) == []           # both fresh
    before = store.queue_max_offset(OFFSETS_TOPIC, OFFSETS_QUEUE)
    assert asyncio.run(cp.refresh_idle_groups(max_age_ms=-1)) == ["busy", "idle"]  # every record is "old"
    assert store.queue_max_offset(OFFSETS_TOPIC, OFFSETS_QUEUE) == before + 2
    got = asyncio.run(cp.committed("idle"))
    assert got.committed == (("T", 0, 6),)


def test_stale_groups_follow_the_newest_record_of_each_group():
    from rocketray.wire.offset_records import encode_commit
    from rocketray.broker.offsets import OffsetTable

    table = OffsetTable()
    table.fold(0, encode_commit("a", [("T", 0, 1)]), store_timestamp_ms=1_000)
    table.fold(1, encode_commit("b", [("T", 0, 1)]), store_timestamp_ms=1_000)
    table.fold(2, encode_commit("a", [("T", 0, 2)]), store_timestamp_ms=9_000)
    assert table.stale_groups(now_ms=10_000, max_age_ms=5_000) == ["b"]


def put_tagged(ha: FakeHA, tags: list[str | None], queue_id: int = 0) -> None:
    batch = encode_batch(Message("T", queue_id, f"{t}".encode(), {"TAGS": t} if t else {}) for t in tags)
    asyncio.run(ha.put(batch, 1))


def test_a_filtered_pull_returns_only_the_subscribed_tags_and_passes_the_rest(path):
    """The broker filters by the consume queue's tag codes: an unwanted body never leaves it, and
    the answer's next offset is past the unwanted messages, so a commit there passes them."""
    _, ha, cp, _ = path
    put_tagged(ha, ["paid", "created", None, "refunded", "created"])
    r = asyncio.run(cp.pull("T", 0, 0, 100, 1 << 20, 0, tag_filter="paid || refunded"))
    assert r.status is PullStatus.FOUND and bodies(r.records, r.count) == [b"paid", b"refunded"]
    assert (r.offset, r.next_offset, r.max_offset) == (0, 5, 5)
    r = asyncio.run(cp.pull("T", 0, 0, 100, 1 << 20, 0, tag_filter="*"))
    assert r.count == 5


def test_a_held_filtered_pull_keeps_waiting_past_unwanted_messages(path):
    """Unwanted messages confirmed during the hold move the held position but do not answer it;
    the first wanted one does; a hold that runs out answers NO_NEW_MSG past what it looked at."""
    store, ha, cp, _ = path
    answers: list = []

    async def scenario():
        assert cp.pull_start("T", 0, 0, 100, 1 << 20, 10_000, None, answers.append, "paid") is None
        await ha.put(encode_batch([Message("T", 0, b"c1", {"TAGS": "created"})]), 1)
        assert answers == [] and len(cp._held) == 1
        await ha.put(encode_batch([Message("T", 0, b"p1", {"TAGS": "paid"})]), 1)
        assert len(answers) == 1
        expired = await cp.pull("T", 0, 2, 100, 1 << 20, 50, tag_filter="paid")
        await ha.put(encode_batch([Message("T", 0, b"c2", {"TAGS": "created"})]), 1)
        late = await cp.pull("T", 0, 2, 100, 1 << 20, 50, tag_filter="paid")
        return expired, late

    expired, late = asyncio.run(scenario())
    assert bodies(answers[0].records, answers[0].count) == [b"p1"] and answers[0].next_offset == 2
    assert expired.status is PullStatus.NO_NEW_MSG and expired.next_offset == 2
    assert late.status is PullStatus.NO_NEW_MSG and late.next_offset == 3 and cp._held == {}


@pytest.mark.parametrize("expression", ["", "a ||", "a | b", "* || a", 7])
def test_a_pull_with_an_invalid_tag_expression_is_refused(path, expression):
    _, _, cp, _ = path
    r = asyncio.run(cp.pull("T", 0, 0, 10, 1024, 0, tag_filter=expression))
    assert r.status is PullStatus.ILLEGAL and "tag_filter" in r.remark


def test_search_offsets_answer_per_queue(path):
    store, ha, cp, _ = path
    asyncio.run(ha.put(encode_batch([Message("T", 0, b"a")]), 1000))
    asyncio.run(ha.put(encode_batch([Message("T", 0, b"b")]), 2000))
    got = asyncio.run(cp.search_offsets([("T", 0), ("T", 1)], 1500))
    assert got == (("T", 0, 1), ("T", 1, 0))
