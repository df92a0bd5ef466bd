"""The controller event log on its own: codec, torn and damaged tails, rolling, paging, gaps."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketray.controller.event_log import (FRAME_HEADER, EventLog, EventLogError, EventLogRecord, Gap, decode_body,
                                  encode_record, merge_logs, scan_tail)
from rocketray.controller.events import (AlterSyncStateSetEvent, ApplyBrokerIdEvent, CleanBrokerDataEvent,
                               ElectMasterEvent)


def elect(index, seq=0, broker=1, epoch=1, time_ms=1000):
    return EventLogRecord(index, seq, 3, time_ms, ElectMasterEvent(True, "g", broker), broker, epoch, (broker,), epoch)


def test_records_round_trip_through_frames():
    """Every record kind comes back equal from its frame, and to_json carries the event's fields
    with sets as sorted lists plus the group's state after the event."""
    records = [
        elect(5),
        EventLogRecord(6, 0, 3, None, AlterSyncStateSetEvent("g", frozenset({3, 1})), 1, 1, (1, 3), 2),
        EventLogRecord(7, 1, 4, 9, ApplyBrokerIdEvent("c", "g", "h:1", "h:1;x", 2)),
        EventLogRecord(8, 0, 4, 9, CleanBrokerDataEvent("g", None)),
        Gap(9, 20),
    ]
    for record in records:
        frame = encode_record(record)
        assert scan_tail(frame) == (record, len(frame))
    data = b"".join(encode_record(r) for r in records)
    assert scan_tail(data) == (records[-1], len(data))
    j = records[1].to_json()
    assert j == {"index": 6, "seq": 0, "term": 3, "time_ms": None, "type": "AlterSyncStateSetEvent",
                 "broker_name": "g", "new_sync_state_set": [1, 3], "master_broker_id": 1, "master_epoch": 1,
                 "sync_state_set": [1, 3], "sync_state_set_epoch": 2}


@pytest.mark.parametrize("body", [b"", b"\xc1", b"\x93\x01\x01\x05", b"\x92\x02\x02", b"\x94\x01\x02\x01\xa1x"])
def test_malformed_bodies_are_rejected(body):
    """Undecodable, wrong-version, wrong-kind or mistyped bodies raise EventLogError, nothing else."""
    with pytest.raises(EventLogError):
        decode_body(body)


def test_scan_stops_at_every_torn_prefix():
    """A tail cut at any byte yields exactly the frames that are complete before the cut."""
    frames = [encode_record(elect(i)) for i in range(1, 4)]
    data = b"".join(frames)
    bounds = [sum(len(f) for f in frames[:k]) for k in range(4)]
    for cut in range(len(data) + 1):
        last, used = scan_tail(data[:cut])
        complete = max(k for k in range(4) if bounds[k] <= cut)
        assert used == bounds[complete] and (last.index if last else 0) == complete


def test_scan_stops_at_a_corrupt_frame():
    """A flipped byte inside a body fails its CRC: scanning stops before that frame."""
    frames = [encode_record(elect(i)) for i in range(1, 4)]
    data = bytearray(b"".join(frames))
    data[len(frames[0]) + FRAME_HEADER.size + 2] ^= 0xFF
    last, used = scan_tail(bytes(data))
    assert last.index == 1 and used == len(frames[0])


def test_reopen_cuts_a_torn_tail_and_keeps_the_rest(tmp_path):
    """After a crash mid-append the log reopens with the complete records and appends after them."""
    ev = EventLog(tmp_path)
    ev.append([elect(1), elect(2)])
    ev.close()
    (segment,) = ev.segments()
    with open(segment, "ab") as fh:
        fh.write(encode_record(elect(3))[:-4])
    ev = EventLog(tmp_path)
    assert ev.last_index == 2 and ev.truncated_bytes > 0
    ev.append([elect(3)])
    assert [r.index for r in ev.read()["events"]] == [1, 2, 3]
    ev.close()


def test_append_refuses_indexes_at_or_below_the_last(tmp_path):
    """Records are logged once: appending an index the log already holds is a broken invariant."""
    ev = EventLog(tmp_path)
    ev.append([elect(4)])
    with pytest.raises(AssertionError):
        ev.append([elect(4, seq=1)])
    ev.close()


def test_segments_roll_and_only_the_newest_are_kept(tmp_path):
    """Disk use is bounded: segments roll at segment_bytes and the oldest beyond segments_kept go."""
    ev = EventLog(tmp_path, segment_bytes=200, segments_kept=3)
    for i in range(1, 61):
        ev.append([elect(i)])
    segments = ev.segments()
    assert len(segments) == 3
    page = ev.read(0, limit=1000)
    indexes = [r.index for r in page["events"]]
    assert indexes == list(range(indexes[0], 61)) and indexes[0] > 1
    assert page["first_index"] == indexes[0]
    ev.close()
    assert EventLog(tmp_path, segment_bytes=200, segments_kept=3).last_index == 60


def test_paging_returns_whole_batches_and_a_cursor(tmp_path):
    """Pages never split a Raft batch; following next_index visits every record exactly once."""
    ev = EventLog(tmp_path, segment_bytes=300)
    expected = []
    for index in range(1, 30):
        batch = [elect(index, seq) for seq in range(index % 3 + 1)]
        ev.append(batch)
        expected += [(r.index, r.seq) for r in batch]
    seen, cursor, pages = [], 0, 0
    while True:
        page = ev.read(cursor, limit=4)
        pages += 1
        seen += [(r.index, r.seq) for r in page["events"]]
        by_index = {}
        for r in page["events"]:
            by_index.setdefault(r.index, []).append(r.seq)
        assert all(seqs == list(range(len(seqs))) for seqs in by_index.values())
        cursor = page["next_index"]
        if not page["more"]:
            break
    assert seen == expected and pages > 5
    ev.close()


def test_gaps_are_recorded_once_and_reported(tmp_path):
    """A gap names the unlogged range, moves last_index, and is returned to readers after it."""
    ev = EventLog(tmp_path)
    ev.append([elect(1)])
    ev.note_gap(2, 9)
    ev.note_gap(2, 9)   # already covered: nothing written
    ev.note_gap(10, 9)  # empty range: nothing written
    ev.append([elect(10)])
    page = ev.read(0)
    assert page["gaps"] == [Gap(2, 9)] and [r.index for r in page["events"]] == [1, 10]
    assert ev.read(9)["gaps"] == [] and ev.last_index == 10
    ev.close()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=40), st.integers(0, 45),
       st.integers(1, 7))
def test_paging_matches_filtering(tmp_path_factory, batch_sizes, after, limit):
    """Property: the concatenated pages after any cursor are exactly the records with a larger index."""
    ev = EventLog(tmp_path_factory.mktemp("ev"), segment_bytes=256, segments_kept=1000)  # retention: its own test
    allrec = []
    for index, size in enumerate(batch_sizes, start=1):
        batch = [elect(index, seq) for seq in range(size)]
        ev.append(batch)
        allrec += batch
    got, cursor = [], after
    while True:
        page = ev.read(cursor, limit)
        got += page["events"]
        cursor = page["next_index"]
        if not page["more"]:
            break
    assert got == [r for r in allrec if r.index > after]
    ev.close()


def _log(first, last, gaps, indexes):
    return {"first_index": first, "last_index": last, "gaps": gaps,
            "events": [{"index": i, "seq": 0, "type": "ElectMasterEvent"} for i in indexes]}


@pytest.mark.parametrize("logs,indexes,uncovered", [
    ([_log(1, 9, [], [2, 5, 9]), _log(1, 9, [], [2, 5, 9])], [2, 5, 9], []),
    ([_log(1, 9, [[1, 6]], [9]), _log(1, 9, [], [2, 5, 9])], [2, 5, 9], []),
    ([_log(1, 9, [[1, 6]], [9]), _log(1, 9, [[5, 7]], [2, 9])], [2, 9], [[1, 6], [5, 7]]),
    ([_log(1, 9, [[1, 6]], [9]), _log(3, 9, [], [5, 9])], [5, 9], [[1, 6]]),
    ([_log(1, 9, [[1, 6]], [9]), _log(1, 4, [], [2])], [2, 9], [[1, 6]]),
    ([_log(1, 9, [[1, 6]], [9]), _log(1, 9, [[1, 6]], [9])], [9], [[1, 6]]),
    ([_log(None, 0, [], [])], [], []),
])
def test_merge_fills_one_logs_gap_from_another(logs, indexes, uncovered):
    """A gap is covered only by a log spanning the whole range without a gap of its own; events
    are merged by (index, seq) in log order."""
    events, left = merge_logs(logs)
    assert [e["index"] for e in events] == indexes and left == uncovered
