"""The producer's send loop on typed put results (issue 15 fix 4), without Ray: one layer, the
broker replies scripted. Every history record must parse as a valid history.jsonl line."""

from __future__ import annotations

from rocketray.actors.client import Producer, Unanswered
from rocketray.ha.ack import PutResult, PutStatus, Written, after_write, refused
from rocketray.verify.history import OpRecord


class ScriptedProducer(Producer):
    """Replies come from a script instead of a broker actor; the master is always replica 0."""

    def __init__(self, replies):
        self.records: list[dict] = []
        super().__init__(cluster=None, recorder=self.records.append, retry_deadline_s=1.0)
        self.replies = list(replies)
        self.sent = 0

    def _find_master(self, group):
        return 0

    def _attempt(self, group, replica, messages):
        self.sent += 1
        return self.replies.pop(0)


def send(replies):
    p = ScriptedProducer(replies)
    out = p.send("g0", 1, [("p-1", b"a"), ("p-2", b"b")])
    records = [OpRecord.from_json(r) for r in p.records]
    return p, out, records


def written(status_acked: bool, still_master: bool) -> PutResult:
    return after_write(status_acked, still_master, ((0, 0), (1, 80)), 160)


def test_role_change_after_the_write_is_unknown_and_not_resent():
    """MASTER_CHANGED (written UNKNOWN): recorded unknown, never sent again as a new batch."""
    p, out, records = send([written(False, False), written(True, True)])
    assert p.sent == 1 and out.outcome == "unknown" and out.error == "MASTER_CHANGED"
    assert [r.outcome for r in records] == ["unknown", "unknown"]


def test_timeout_after_the_write_is_unknown_and_not_resent():
    p, out, _ = send([written(False, True), written(True, True)])
    assert p.sent == 1 and out.outcome == "unknown" and out.error == "FLUSH_SLAVE_TIMEOUT"


def test_refusals_are_retried_and_an_ack_is_ok():
    p, out, records = send([refused(PutStatus.NOT_MASTER), refused(PutStatus.FENCED),
                            written(True, True)])
    assert p.sent == 3 and out.outcome == "ok"
    assert [(r.outcome, r.queue_offset, r.physical_offset) for r in records] == \
        [("ok", 0, 0), ("ok", 1, 80)]


def test_only_refusals_are_failed():
    p, out, records = send([refused(PutStatus.NOT_MASTER)] * 1000)
    assert out.outcome == "failed" and all(r.outcome == "failed" for r in records)


def test_an_unanswered_call_is_retried_and_stays_unknown_unless_acked():
    p, out, _ = send([Unanswered("GetTimeoutError"), written(True, True)])
    assert p.sent == 2 and out.outcome == "ok"
    p, out, _ = send([Unanswered("RayActorError")] + [refused(PutStatus.NOT_MASTER)] * 1000)
    assert out.outcome == "unknown"


def test_old_rule_not_master_after_the_write_resends_the_batch():
    """The old answer (NOT_MASTER, written NO, after the write) makes the client send the written
    batch again: a second copy, and a "failed" record if the retries are refused."""
    old = PutResult(PutStatus.NOT_MASTER, Written.NO)
    p, out, _ = send([old, written(True, True)])
    assert p.sent == 2


class RecordingProducer(ScriptedProducer):
    def _attempt(self, group, replica, messages):
        self.batches.append(messages)
        return super()._attempt(group, replica, messages)


def test_a_batch_refused_as_malformed_is_failed_and_not_resent():
    """MESSAGE_ILLEGAL (nothing written, the same bytes would be refused again): one attempt, every
    payload recorded failed with the status as error."""
    p, out, records = send([refused(PutStatus.MESSAGE_ILLEGAL), written(True, True)])
    assert p.sent == 1 and out.outcome == "failed" and out.error == "MESSAGE_ILLEGAL"
    assert [(r.outcome, r.error) for r in records] == [("failed", "MESSAGE_ILLEGAL")] * 2


def test_the_producer_sends_one_encoded_batch_and_resends_the_same_bytes():
    """Each attempt carries one EncodedBatch (the records in the log layout, encoded once): the
    payloads in order with their ids as properties, the same object on a retry."""
    from rocketray.broker.message import decode_record
    from rocketray.broker.batch import EncodedBatch

    p = RecordingProducer([refused(PutStatus.NOT_MASTER), written(True, True)])
    p.batches = []
    p.send("g0", 1, [("p-1", b"a"), ("p-2", b"b")])
    assert len(p.batches) == 2 and p.batches[0] is p.batches[1]
    batch = p.batches[0]
    assert isinstance(batch, EncodedBatch) and batch.count == 2
    first, size = decode_record(batch.data)
    second, _ = decode_record(batch.data, size)
    assert [(m.topic, m.queue_id, m.body, dict(m.properties), m.queue_offset, m.physical_offset)
            for m in (first, second)] == [("rocketray", 1, b"a", {"pid": "p-1"}, -1, -1),
                                          ("rocketray", 1, b"b", {"pid": "p-2"}, -1, -1)]
