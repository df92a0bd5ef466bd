"""The producer's send loop on typed put results (issue 15 fix 4), one layer: the transport is a
script of broker answers (the Transport protocol), no Ray, no sockets.

A refusal that wrote nothing is retried; an answer saying "written but not acknowledged" raises
SendUnknown and is never resent (a resend would store a second copy); an unanswered call is resent
(the one case a message may be stored twice); a batch refused as malformed is not resent."""

from __future__ import annotations

import time

import pytest

from rocketray.wire.batch import EncodedBatch
from rocketray.wire.message import decode_record
from rocketray.client import InvalidMessage, Producer, SendFailed, SendStatus, SendUnknown, TopicNotFound
from rocketray.client.transport import Unanswered
from rocketray.wire.controller_headers import TopicRouteResponseHeader
from rocketray.wire.controller_api import GetTopicRouteRequest, Response
from rocketray.wire.controller_codes import ResponseCode
from rocketray.wire.put_result import PutResult, PutStatus, Written
from rocketray.ha.ack import after_write, refused


class ScriptedTransport:
    """Answers puts from a script; the topic ``t`` has 2 queues on broker-a."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.batches: list[EncodedBatch] = []
        self.forgotten = 0

    def config(self):
        raise LookupError("no cluster config: the client's defaults")

    def groups(self):
        return ["broker-a"]

    def call_controller(self, request, timeout_s=10.0):
        assert isinstance(request, GetTopicRouteRequest)
        if request.topic != "t":
            return Response.error(ResponseCode.TOPIC_NOT_EXIST, f"topic {request.topic!r} does not exist")
        return Response(ResponseCode.SUCCESS, TopicRouteResponseHeader("t", ((0, "broker-a"), (1, "broker-a"))))

    def put(self, group, batch, timeout_s):
        self.batches.append(batch)
        return self.replies.pop(0)

    def put_start(self, group, batch, timeout_s, caller_waits=False):
        reply = self.put(group, batch, timeout_s)
        return lambda: reply

    def named_at(self, group):
        return float("-inf")

    def forget_master(self, group):
        self.forgotten += 1

    def await_new_master(self, group, timeout_s):
        time.sleep(timeout_s)          # no election in the script: the wait runs out
        return False

    def close(self):
        pass


def written(acked: bool, still_master: bool) -> PutResult:
    return after_write(acked, still_master, ((7, 0),), 160)


def send(replies, **settings):
    """One send over a script; the send timeout is short (300 ms) unless the test gives one (a test
    expecting success after retries gives a long one: their backoff waits must fit on a loaded machine)."""
    transport = ScriptedTransport(replies)
    settings.setdefault("send_timeout_ms", 300)
    with Producer(transport=transport, **settings) as p:
        try:
            return transport, p.send("t", b"a", key="k"), None
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            return transport, None, exc


def test_an_ack_is_send_ok_with_the_queue_offset():
    t, r, _ = send([written(True, True)])
    assert r.status is SendStatus.SEND_OK and r.queue_offset == 7 and r.topic == "t" and len(t.batches) == 1


def test_role_change_after_the_write_is_unknown_and_not_resent():
    """MASTER_CHANGED (written UNKNOWN): SendUnknown, never sent again as a new batch."""
    t, _, exc = send([written(False, False), written(True, True)])
    assert isinstance(exc, SendUnknown) and not exc.retriable and exc.status is None and len(t.batches) == 1
    assert exc.msg_id


def test_timeout_after_the_write_is_unknown_with_flush_slave_timeout():
    t, _, exc = send([written(False, True), written(True, True)])
    assert isinstance(exc, SendUnknown) and exc.status is SendStatus.FLUSH_SLAVE_TIMEOUT and len(t.batches) == 1


def test_refusals_are_retried_and_an_ack_is_ok():
    t, r, _ = send([refused(PutStatus.NOT_MASTER), refused(PutStatus.FENCED), written(True, True)],
                   send_timeout_ms=30_000)
    assert r.status is SendStatus.SEND_OK and len(t.batches) == 3 and t.forgotten == 2


def test_only_refusals_until_the_timeout_are_send_failed():
    t, _, exc = send([refused(PutStatus.NOT_MASTER)] * 10_000)
    assert isinstance(exc, SendFailed) and exc.retriable


def test_an_unanswered_call_is_resent_and_unknown_unless_acked():
    t, r, _ = send([Unanswered("CONNECTION_LOST"), written(True, True)], send_timeout_ms=30_000)
    assert r.status is SendStatus.SEND_OK and len(t.batches) == 2
    t, _, exc = send([Unanswered("TIMEOUT")] + [refused(PutStatus.NOT_MASTER)] * 10_000)
    assert isinstance(exc, SendUnknown)


def test_old_rule_not_master_after_the_write_resends_the_batch():
    """The pre-issue-15 answer (NOT_MASTER, written NO, after the write) makes the client send the
    written batch again: why a put after its write must never answer written NO."""
    t, _, _ = send([PutResult(PutStatus.NOT_MASTER, Written.NO), written(True, True)])
    assert len(t.batches) == 2


def test_a_batch_refused_as_malformed_is_not_resent():
    t, _, exc = send([refused(PutStatus.MESSAGE_ILLEGAL), written(True, True)])
    assert isinstance(exc, InvalidMessage) and not exc.retriable and len(t.batches) == 1


def test_one_encoded_batch_is_resent_as_the_same_bytes():
    """Each attempt carries one EncodedBatch (encoded once): the message with its key, tags, user
    properties and msg id, the same object on a retry."""
    t, r, _ = send([refused(PutStatus.NOT_MASTER), written(True, True)])
    assert t.batches[0] is t.batches[1] and t.batches[0].count == 1
    m, _ = decode_record(t.batches[0].data)
    assert (m.topic, m.body, m.properties["KEYS"], m.properties["UNIQ_KEY"]) == ("t", b"a", "k", r.msg_id)


def test_bad_input_raises_before_anything_is_sent():
    transport = ScriptedTransport([])
    with Producer(transport=transport) as p:
        with pytest.raises(TopicNotFound, match="'nope'"):
            p.send("nope", b"x")
        with pytest.raises(InvalidMessage):
            p.send("t", b"x", properties={"UNIQ_KEY": "mine"})
        with pytest.raises(InvalidMessage):
            p.send("t", "not bytes")
        with pytest.raises(InvalidMessage):
            Producer(transport=transport, max_message_bytes=10).send("t", b"x" * 11)
    assert transport.batches == []


def test_async_sends_keep_order_per_queue_and_share_puts():
    """send_async batches per broker group: both queues' messages travel together, in send order."""
    class Counting(ScriptedTransport):
        def put(self, group, batch, timeout_s):
            self.batches.append(batch)
            return PutResult(PutStatus.PUT_OK, Written.YES, tuple((i, i) for i in range(batch.count)), 1)

    transport = Counting([])
    with Producer(transport=transport) as p:
        futures = [p.send_async("t", f"{i}".encode()) for i in range(100)]
        p.flush()
    assert all(f.result().status is SendStatus.SEND_OK for f in futures)
    bodies = []
    for batch in transport.batches:
        pos = 0
        for _ in range(batch.count):
            m, size = decode_record(batch.data, pos)
            bodies.append(m.body)
            pos += size
    assert bodies == [f"{i}".encode() for i in range(100)]      # one put in flight: send order kept
    assert len(transport.batches) < 100                         # and batched


class StartingTransport(ScriptedTransport):
    """A transport that sends a put at once (``put_start``) and answers it when the test opens its
    gate; records whether the first message's future was resolved when each put went out."""

    def __init__(self, futures):
        super().__init__([])
        self.futures = futures
        self.gates: list = []
        self.first_done_at_start: list[bool] = []
        self.caller_waits: list[bool] = []

    def put_start(self, group, batch, timeout_s, caller_waits=False):
        import threading

        self.batches.append(batch)
        self.caller_waits.append(caller_waits)
        self.first_done_at_start.append(bool(self.futures) and self.futures[0].done())
        gate = threading.Event()
        self.gates.append(gate)

        def answer():
            assert gate.wait(5)
            return after_write(True, True, tuple((10 * len(self.gates) + i, 0) for i in range(batch.count)), 0)

        return answer


def test_a_busy_groups_next_put_goes_out_before_the_answered_ones_futures_resolve():
    """One put per group in flight; when it is answered the same thread sends the group's next
    batch first and resolves the answered futures after, in send order."""
    from rocketray.waiting import wait_for

    futures: list = []
    transport = StartingTransport(futures)
    with Producer(transport=transport) as p:
        futures.append(p.send_async("t", b"m0"))
        wait_for(lambda: len(transport.gates) == 1, 5, "the first put", 0.001)
        futures.extend(p.send_async("t", f"m{i}".encode()) for i in (1, 2))
        transport.gates[0].set()
        wait_for(lambda: len(transport.gates) == 2, 5, "the second put", 0.001)
        assert transport.first_done_at_start == [False, False]      # put 2 left before m0 resolved
        transport.gates[1].set()
        results = [f.result(timeout=5) for f in futures]
    assert [r.status for r in results] == [SendStatus.SEND_OK] * 3
    assert [transport.batches[0].count, transport.batches[1].count] == [1, 2]
    assert [r.queue_offset for r in results] == [10, 20, 21]
    assert transport.caller_waits == [False, False]              # batches sent for futures


def test_a_synchronous_send_is_started_for_the_calling_thread_to_wait_on():
    """``send`` puts with ``caller_waits``: the thread that sends is the one that waits, so the
    transport may let it read the answer itself (the socket transport's direct connection)."""
    import threading

    from rocketray.waiting import wait_for

    transport = StartingTransport([])

    def open_the_gate() -> None:
        wait_for(lambda: transport.gates, 5, "the put", 0.001)
        transport.gates[0].set()

    threading.Thread(target=open_the_gate, daemon=True).start()
    with Producer(transport=transport) as p:
        assert p.send("t", b"m").status is SendStatus.SEND_OK
    assert transport.caller_waits == [True]


class ElectionAfterWaits(ScriptedTransport):
    """``await_new_master`` runs out ``elect_after`` times, then a new master is named; records each wait."""

    def __init__(self, replies, elect_after):
        super().__init__(replies)
        self.waits: list[float] = []
        self.elect_after = elect_after

    def await_new_master(self, group, timeout_s):
        self.waits.append(timeout_s)
        return len(self.waits) == self.elect_after + 1


def test_a_new_master_resets_the_backoff():
    """After an outage whose waits doubled, the master a watch names refuses while it takes its role
    (NOT_MASTER): it is asked again after a few ms each time, not the outage's doubled wait nor the
    usual first step, and it is not looked up again (the replica holds a put that arrives during its
    switch, so the next attempt is usually answered). The old rule doubled from the short step and
    forgot the master after every refusal."""
    from rocketray.client.sending import BACKOFF_AFTER_ELECTION_S, BACKOFF_MIN_S

    lost = [Unanswered("CONNECT_FAILED")] * 5
    switching = [refused(PutStatus.NOT_MASTER)] * 3
    transport = ElectionAfterWaits(lost + switching + [written(True, True)], elect_after=4)
    with Producer(transport=transport, send_timeout_ms=30_000) as p:
        result = p.send("t", b"a", key="k")
    assert result.status is SendStatus.SEND_OK
    assert transport.waits[:4] == [BACKOFF_MIN_S * 2 ** i for i in range(4)]
    assert BACKOFF_AFTER_ELECTION_S < BACKOFF_MIN_S
    # the waits after the new master's refusals, and it was forgotten only after the lost attempts
    assert transport.waits[5:] == [BACKOFF_AFTER_ELECTION_S] * 3
    assert transport.forgotten == 5


def test_refusals_after_the_promotion_window_double_and_forget_again(monkeypatch):
    """A named master that keeps refusing past the window is not promoting: the waits double again
    and the master is looked up again (it may have lost its role meanwhile)."""
    from rocketray.client import sending as producer

    monkeypatch.setattr(producer, "PROMOTION_WINDOW_S", 0.0)
    transport = ElectionAfterWaits([Unanswered("CONNECT_FAILED")] + [refused(PutStatus.NOT_MASTER)] * 3
                                   + [written(True, True)], elect_after=0)
    with Producer(transport=transport, send_timeout_ms=30_000) as p:
        assert p.send("t", b"a", key="k").status is SendStatus.SEND_OK
    short = producer.BACKOFF_AFTER_ELECTION_S
    assert transport.waits == [producer.BACKOFF_MIN_S, short, short * 2, short * 4]
    assert transport.forgotten == 4


def test_a_master_a_lookup_just_named_is_asked_again_soon_while_it_refuses():
    """A lookup (not a watch) found the new master, before its notification reached it: its
    NOT_MASTER refusals within the window are retried at the short step, the master kept; the old
    rule forgot it and doubled the wait, and no watch would end that wait (the epoch was known)."""
    from rocketray.client.sending import BACKOFF_AFTER_ELECTION_S

    class LookedUp(ScriptedTransport):
        def __init__(self, replies):
            super().__init__(replies)
            self.waits: list[float] = []
            self.named = time.monotonic()

        def named_at(self, group):
            return self.named

        def await_new_master(self, group, timeout_s):
            self.waits.append(timeout_s)
            return False

    transport = LookedUp([refused(PutStatus.NOT_MASTER)] * 3 + [written(True, True)])
    with Producer(transport=transport, send_timeout_ms=30_000) as p:
        assert p.send("t", b"a", key="k").status is SendStatus.SEND_OK
    assert transport.waits == [BACKOFF_AFTER_ELECTION_S] * 3 and transport.forgotten == 0


def test_synchronous_sends_of_an_idle_producer_do_not_wake_the_sender_thread():
    """The calling thread sends and waits itself; finishing wakes the sender thread (a thread
    switch per send in the producer's process) only when it has work, or flush() waits. The old
    rule woke it after every send."""
    class Answering(ScriptedTransport):
        def put(self, group, batch, timeout_s):
            time.sleep(0.002)           # a broker's answer takes a while (the sender thread could run)
            return super().put(group, batch, timeout_s)

    transport = Answering([written(True, True) for _ in range(50)])
    with Producer(transport=transport) as p:
        p.send("t", b"warm")
        passes = p.sender_passes
        for i in range(40):
            assert p.send("t", bytes([i])).status is SendStatus.SEND_OK
        assert p.sender_passes - passes <= 2, p.sender_passes - passes
        future = p.send_async("t", b"async")   # queued work still wakes it, flush still returns
        p.flush(timeout_s=5)
        assert future.result(timeout=5).status is SendStatus.SEND_OK


def test_a_transport_that_raises_on_start_fails_the_send_and_close_returns():
    """An exception from the transport's put_start (here: an object without one) reaches the send's
    caller; the old rule looked put_start up outside the try, so the batch never finished and
    send() and close() waited forever."""

    class Broken(ScriptedTransport):
        def __getattribute__(self, name):
            if name == "put_start":
                raise AttributeError("put_start")
            return object.__getattribute__(self, name)

    import threading

    transport = Broken([])
    p = Producer(transport=transport, send_timeout_ms=2000)
    with pytest.raises(AttributeError):
        p.send("t", b"a", key="k")
    closer = threading.Thread(target=p.close, daemon=True)      # no timeout: waits for every batch
    closer.start()
    closer.join(5)
    assert not closer.is_alive(), "close() still waits for a batch that never finished"
