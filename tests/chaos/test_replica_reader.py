"""ReplicaReader's read rows from the broker's typed answer (``StoredMessage``), one layer, no Ray."""

from __future__ import annotations

from rocketray.actors.views import StoredMessage
from rocketray.chaos.replica_reader import ReplicaReader, payload_body


def test_a_read_row_per_stored_message_and_corrupt_bodies_are_marked():
    """Each message becomes a ``read`` row with its offsets and the answering broker id; a body that is
    not its pid's payload is recorded as ``corrupt:<pid>`` (a missing pid as ``corrupt:None``)."""
    rows: list[dict] = []
    reader = ReplicaReader(None, "T", "tail-g", rows.append)  # type: ignore[arg-type]
    good = StoredMessage("T", 1, 7, 640, payload_body("p-1"), {"pid": "p-1"}, 5, 3)
    bad = StoredMessage("T", 1, 8, 700, b"garbage", {"pid": "p-2"}, 6, 3)
    bare = StoredMessage("T", 1, 9, 760, b"x", {}, 7, None)
    for m in (good, bad, bare):
        reader._record("g", 1, m, 10.0, 11.0)
    assert [r["payload_id"] for r in rows] == ["p-1", "corrupt:p-2", "corrupt:None"]
    assert rows[0] | {"op_id": None} == {
        "op_id": None, "process": "tail-g", "f": "read", "group": "g", "queue_id": 1, "payload_id": "p-1",
        "queue_offset": 7, "physical_offset": 640, "start_ms": 10.0, "end_ms": 11.0, "outcome": "ok",
        "broker_id": 3, "error": None}
    assert rows[2]["broker_id"] is None


def test_a_tail_goes_on_from_what_a_failed_pass_recorded():
    """A pass whose second call times out has recorded the first call's messages: the tail's next pass
    starts after them (it stepped back to the pass's start before, and the checker counted each such
    step as a nonmonotonic read: 8 in the 30-minute soak of seed 1, 2026-11-28)."""
    import threading
    from types import SimpleNamespace

    from rocketray.chaos.broker_workload import ConsumerLoop, TopicLayout

    rows: list[dict] = []
    stop = threading.Event()
    cluster = SimpleNamespace(spec=SimpleNamespace(brokers_of=lambda g: [SimpleNamespace(replica=0)]))
    loop = ConsumerLoop(cluster, TopicLayout("T", ("g",)), "g", SimpleNamespace(record=rows.append), stop, seed=1)
    asked: list[int] = []

    def read_queue(group: str, replica: int, queue_id: int, from_offset: int = 0) -> list:
        asked.append(from_offset)
        for offset in range(from_offset, from_offset + 10):   # the first call's batch is recorded ...
            loop.reader._record(group, queue_id, StoredMessage("T", queue_id, offset, offset * 60, b"x",
                                                               {"pid": "p"}, 5, 1), 1.0, 2.0)
        if len(asked) == 2:
            stop.set()
        raise TimeoutError("the second call of the pass timed out")   # ... then the pass fails

    loop.reader.read_queue = read_queue   # type: ignore[method-assign]
    loop.period_s = 0
    loop.run()
    assert asked == [0, 10]
    assert [r["queue_offset"] for r in rows] == list(range(20))
