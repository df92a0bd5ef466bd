"""``SendFuture`` (client/futures.py) behaves as a ``concurrent.futures.Future``: results,
exceptions, timeouts, callbacks, ``wait`` and ``as_completed`` across threads, and it sets up exactly
the attributes ``Future.__init__`` does plus its dispatcher (so a Python whose Future grows a field
fails here, not in a user's program). Its two rules of its own: a send cannot be cancelled, and
done callbacks run where the dispatcher sends them."""

from __future__ import annotations

import concurrent.futures
import gc
import threading

import pytest

from rocketray.client.futures import SendFuture


def test_it_has_the_attributes_future_init_sets() -> None:
    plain, ours = concurrent.futures.Future(), SendFuture()
    assert isinstance(ours, concurrent.futures.Future)
    assert vars(ours).keys() == vars(plain).keys() | {"_dispatch"}
    assert {k: v for k, v in vars(ours).items() if k not in ("_condition", "_dispatch")} == \
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
    assert not c.cancel() and not c.cancelled()      # a queued message may be on its way: not cancellable
    c.set_result("sent")                             # so its answer can always be set
    assert c.result() == "sent"


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


def test_done_callbacks_run_where_the_dispatcher_sends_them() -> None:
    """The resolving thread hands callbacks to the dispatcher (the producer's callback thread) and
    runs none itself; without one, or once the dispatcher refuses (closed), they run inline."""
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="callbacks")
    f = SendFuture(pool.submit)
    ran_on: list[str] = []
    done = threading.Event()
    f.add_done_callback(lambda _f: (ran_on.append(threading.current_thread().name), done.set()))
    f.set_result(1)
    assert done.wait(30) and ran_on[0].startswith("callbacks")
    pool.shutdown()
    late = SendFuture(pool.submit)
    late.add_done_callback(lambda _f: ran_on.append(threading.current_thread().name))
    late.set_result(2)
    assert ran_on[1] == threading.current_thread().name
