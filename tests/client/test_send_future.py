"""``SendFuture`` (client/futures.py) behaves as a ``concurrent.futures.Future``: results,
exceptions, timeouts, cancellation, callbacks, ``wait`` and ``as_completed`` across threads, and it
sets up exactly the attributes ``Future.__init__`` does (so a Python whose Future grows a field
fails here, not in a user's program)."""

from __future__ import annotations

import concurrent.futures
import gc
import threading

import pytest

from rocketray.client.futures import SendFuture


def test_it_has_the_attributes_future_init_sets() -> None:
    plain, ours = concurrent.futures.Future(), SendFuture()
    assert isinstance(ours, concurrent.futures.Future)
    assert vars(ours).keys() == vars(plain).keys()
    assert {k: v for k, v in vars(ours).items() if k != "_condition"} == \
        {k: v for k, v in vars(plain).items() if k != "_condition"}
    assert isinstance(ours._condition, threading.Condition)


def test_a_result_set_by_another_thread_wakes_a_waiter() -> None:
    f = SendFuture()
    started = threading.Event()
    got: list = []

    def waiter() -> None:
        started.set()
        got.append(f.result(timeout=30))

    t = threading.Thread(target=waiter)
    t.start()
    assert started.wait(30)
    f.set_result("ok")
    t.join(30)
    assert got == ["ok"] and f.done() and not f.cancelled()


def test_timeout_exception_cancel_and_callbacks() -> None:
    f = SendFuture()
    with pytest.raises(concurrent.futures.TimeoutError):
        f.result(timeout=0)
    seen: list = []
    f.add_done_callback(lambda fut: seen.append(fut.exception()))
    error = ValueError("refused")
    f.set_exception(error)
    assert seen == [error] and f.exception() is error
    with pytest.raises(ValueError):
        f.result()
    c = SendFuture()
    assert c.cancel() and c.cancelled()
    with pytest.raises(concurrent.futures.CancelledError):
        c.result()
    r = SendFuture()
    assert r.set_running_or_notify_cancel() and r.running() and not r.cancel()


def test_wait_and_as_completed_across_threads() -> None:
    futures = [SendFuture() for _ in range(20)]

    def finish() -> None:
        for i, f in enumerate(reversed(futures)):
            f.set_result(i)

    threading.Thread(target=finish).start()
    done, not_done = concurrent.futures.wait(futures, timeout=30)
    assert len(done) == 20 and not not_done
    assert sorted(f.result() for f in concurrent.futures.as_completed(futures, timeout=30)) == list(range(20))
    first = [SendFuture(), SendFuture()]
    threading.Thread(target=first[1].set_result, args=(1,)).start()
    done, not_done = concurrent.futures.wait(first, timeout=30, return_when=concurrent.futures.FIRST_COMPLETED)
    assert first[1] in done


def test_it_leaves_fewer_objects_for_the_collector() -> None:
    def tracked(make) -> int:
        gc.collect()
        before = len(gc.get_objects())
        keep = [make() for _ in range(100)]
        after = len(gc.get_objects())
        assert len(keep) == 100
        return after - before

    assert tracked(SendFuture) < tracked(concurrent.futures.Future)
