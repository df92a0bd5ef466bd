"""The producer beyond the happy path, one layer: an in-memory cluster behind the Transport protocol
(tests/support/fake_client_cluster.py), no Ray, no sockets.

Each test names the rule it checks; the ones marked "(defect)" failed on the client before these
rules (a done callback that sends deadlocked the producer; NO_MASTER was SendUnknown; the k-th
queued batch of a dead group failed after about k send timeouts; close ignored its timeout; the
buffer had no bound; flush raised a plain TimeoutError)."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest

from rocketray.client import (BufferFull, ClientClosed, ClientError, FlushTimeout, InvalidRequest, Producer,
                              SendFailed, SendStatus, SendUnknown)
from rocketray.client.transport import Unanswered
from rocketray.wire.put_result import PutStatus
from rocketray.ha.ack import refused
from rocketray.waiting import wait_for
from tests.support.fake_client_cluster import FakeCluster, FakeTransport


def cluster(queues: int = 2) -> tuple[FakeCluster, FakeTransport]:
    c = FakeCluster()
    c.create_topic("t", queues)
    return c, FakeTransport(c)


def test_a_send_inside_a_done_callback_does_not_deadlock_under_load():
    """(defect) 2,000 send_async to one key, 20 of whose futures' callbacks send synchronously:
    every future finishes and close returns. Callbacks ran on the thread that had to send the
    group's next batch, which then waited for a send only it could make."""
    c, t = cluster()
    c.put_hook = lambda group, batch: time.sleep(0.0005)       # a broker's answer takes a while
    inner: list[concurrent.futures.Future] = []
    callback_threads: set[str] = set()
    p = Producer(transport=t)

    def send_from_callback(_f):
        callback_threads.add(threading.current_thread().name)
        inner.append(p.send("t", b"inner", key="k"))

    futures = []
    for i in range(2000):
        f = p.send_async("t", b"outer", key="k")
        if i % 100 == 0:
            f.add_done_callback(send_from_callback)
        futures.append(f)
    done, stuck = concurrent.futures.wait(futures, timeout=30)
    assert not stuck, f"{len(stuck)} of 2000 sends never finished"
    wait_for(lambda: len(inner) == 20, 30, "the 20 sends made in callbacks")
    closer = threading.Thread(target=p.close)
    closer.start()
    closer.join(30)
    assert not closer.is_alive(), "close did not return"
    assert all(r.status is SendStatus.SEND_OK for r in inner)
    assert all(name.startswith("rocketray-callbacks") for name in callback_threads), callback_threads


def test_callbacks_run_in_completion_order_on_one_thread():
    """Which thread runs callbacks: one callback thread per producer, in the order sends finished."""
    c, t = cluster(1)
    seen: list[tuple[int, str]] = []
    with Producer(transport=t) as p:
        futures = [p.send_async("t", f"{i}".encode()) for i in range(50)]
        for i, f in enumerate(futures):
            f.add_done_callback(lambda f, i=i: seen.append((f.result().queue_offset, threading.current_thread().name)))
        p.flush()
    wait_for(lambda: len(seen) == 50, 10, "every callback")
    assert {name for _, name in seen} == {seen[0][1]} and seen[0][1].startswith("rocketray-callbacks")


@pytest.mark.parametrize("error", ["NO_MASTER", "CONNECT_FAILED ConnectionRefusedError()"])
def test_nothing_sent_is_send_failed_not_unknown(error):
    """(defect) NO_MASTER and CONNECT_FAILED reach no broker: after the send timeout the send is
    SendFailed (retriable, sending again is safe), not SendUnknown."""
    c, t = cluster()
    c.put_hook = lambda group, batch: Unanswered(error, unsent=True)
    with Producer(transport=t, send_timeout_ms=200) as p:
        with pytest.raises(SendFailed) as exc:
            p.send("t", b"x")
    assert exc.value.retriable and p.metrics().failed == 1 and p.metrics().retries > 0


def test_a_call_that_may_have_run_still_makes_the_send_unknown():
    """An unanswered call that was sent (a timeout) may have written: SendUnknown, even when later
    attempts found no master."""
    c, t = cluster()
    replies = iter([Unanswered("TIMEOUT")])
    c.put_hook = lambda group, batch: next(replies, Unanswered("NO_MASTER", unsent=True))
    with Producer(transport=t, send_timeout_ms=200) as p:
        with pytest.raises(SendUnknown):
            p.send("t", b"x")
    assert p.metrics().unknown == 1


def test_the_send_deadline_is_per_send_not_per_queued_batch():
    """(defect) Six batches queued behind a group that refuses everything each fail within about
    one send timeout of their send_async call; each batch's clock started only when the one before
    it finished, so the k-th failed after k timeouts."""
    c, t = cluster(1)
    c.put_hook = lambda group, batch: refused(PutStatus.NOT_MASTER)
    with Producer(transport=t, send_timeout_ms=400, max_batch_messages=1) as p:
        started = time.monotonic()
        futures = [p.send_async("t", b"x") for _ in range(6)]
        ended = []
        for f in futures:
            with pytest.raises(SendFailed):
                f.result(timeout=30)
            ended.append(time.monotonic() - started)
    assert max(ended) < 0.4 + 1.4, ended           # the 6th failed after about 6 x 0.4 s


def test_close_returns_within_its_timeout_and_ends_every_send():
    """(defect) A put that hangs: close(timeout_s=0.3) returns in about 0.3 s (it waited for the
    send and request timeouts); the send in flight ends SendUnknown, one still queued ClientClosed."""
    c, t = cluster(1)
    gate = threading.Event()
    c.put_hook = lambda group, batch: (gate.wait(30), Unanswered("TIMEOUT"))[1]
    p = Producer(transport=t, send_timeout_ms=30_000, max_batch_messages=1, linger_ms=60_000)
    in_flight = p.send_async("t", b"a")
    wait_for(lambda: c.puts or p.metrics().puts, 10, "the first put to go out")
    queued = p.send_async("t", b"b")
    started = time.monotonic()
    p.close(timeout_s=0.3)
    took = time.monotonic() - started
    gate.set()
    assert took < 3.0, took                         # it waited for the put (30 s)
    assert isinstance(in_flight.exception(timeout=5), SendUnknown)
    assert isinstance(queued.exception(timeout=5), ClientClosed)
    with pytest.raises(ClientClosed):
        p.send_async("t", b"c")


def test_flush_timeout_is_a_client_error():
    """(defect) flush(timeout_s) that runs out raises FlushTimeout: a ClientError (and a TimeoutError)."""
    c, t = cluster(1)
    gate = threading.Event()
    c.put_hook = lambda group, batch: (gate.wait(30), None)[1]
    with Producer(transport=t) as p:
        f = p.send_async("t", b"x")
        with pytest.raises(ClientError) as exc:
            p.flush(timeout_s=0.05)
        assert isinstance(exc.value, FlushTimeout) and isinstance(exc.value, TimeoutError) and exc.value.retriable
        gate.set()
        assert f.result(timeout=10).status is SendStatus.SEND_OK


def test_the_buffer_is_bounded_and_send_async_blocks_then_fails():
    """(defect) With nothing acknowledged, send_async takes buffer_bytes of messages, then waits
    max_block_ms and raises BufferFull (retriable, nothing queued); once puts are answered the room
    comes back."""
    c, t = cluster(1)
    gate = threading.Event()
    c.put_hook = lambda group, batch: (gate.wait(30), None)[1]
    body = b"x" * 1000
    with Producer(transport=t, buffer_bytes=64 * 1024, max_message_bytes=4096, max_block_ms=100) as p:
        futures = []
        with pytest.raises(BufferFull) as exc:
            for _ in range(1000):
                futures.append(p.send_async("t", body))
        assert exc.value.retriable and 50 <= len(futures) < 70, len(futures)
        m = p.metrics()
        assert m.buffered_bytes <= 64 * 1024 and m.pending_messages == len(futures)
        started = time.monotonic()
        with pytest.raises(BufferFull):
            p.send_async("t", body)
        assert time.monotonic() - started >= 0.09
        gate.set()
        p.flush(timeout_s=10)
        assert p.metrics().buffered_bytes == 0 and p.metrics().sent == len(futures)
        assert p.send_async("t", body).result(timeout=10).status is SendStatus.SEND_OK


def test_a_blocked_send_async_proceeds_when_room_comes_back():
    """A send_async waiting for room returns as soon as an acknowledged batch frees it."""
    c, t = cluster(1)
    gate = threading.Event()
    c.put_hook = lambda group, batch: (gate.wait(30), None)[1]
    with Producer(transport=t, buffer_bytes=8192, max_message_bytes=4096, max_block_ms=30_000) as p:
        first = [p.send_async("t", b"x" * 3000) for _ in range(2)]
        threading.Timer(0.1, gate.set).start()
        late = p.send_async("t", b"y" * 3000)        # blocks until the first put is answered
        assert gate.is_set()
        p.flush(timeout_s=10)
        assert all(f.result().status is SendStatus.SEND_OK for f in [*first, late])


def test_settings_are_checked_at_construction():
    """An unknown or out-of-range setting is InvalidRequest naming it, before anything runs."""
    c, t = cluster()
    for bad, name in [({"linger_ms": -1}, "linger_ms"), ({"sender_threads": 0}, "sender_threads"),
                      ({"batch_bytes": "big"}, "batch_bytes"), ({"buffer_bytes": 10}, "buffer_bytes"),
                      ({"lingerms": 5}, "lingerms")]:
        with pytest.raises(InvalidRequest, match=name):
            Producer(transport=t, **bad)


def test_metrics_count_what_happened():
    """metrics(): sent, failed, unknown, puts and retries, and nothing pending after a flush."""
    c, t = cluster(1)
    replies = iter([refused(PutStatus.NOT_MASTER), None, refused(PutStatus.MESSAGE_ILLEGAL)])
    c.put_hook = lambda group, batch: next(replies, None)
    with Producer(transport=t, send_timeout_ms=30_000) as p:
        p.send("t", b"a")                        # refused once, then acknowledged
        with pytest.raises(ClientError):
            p.send("t", b"b")                    # malformed
        p.send("t", b"c")
        m = p.metrics()
    assert (m.sent, m.failed, m.unknown, m.puts, m.retries, m.pending_messages, m.buffered_bytes) == \
        (2, 1, 0, 4, 1, 0, 0)


def test_flush_returns_after_the_sends_callbacks_ran():
    """flush(): every send so far finished and its done callback ran (a callback still queued on the
    callback thread when flush returned would see a caller's state change under it)."""
    c, t = cluster(1)
    ran: list[int] = []
    with Producer(transport=t) as p:
        for i in range(20):
            p.send_async("t", b"x").add_done_callback(lambda _f, i=i: (time.sleep(0.005), ran.append(i)))
        p.flush(timeout_s=30)
        assert sorted(ran) == list(range(20))
