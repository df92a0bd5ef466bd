"""``SendFuture``: the ``concurrent.futures.Future`` that ``Producer.send_async`` returns, made in
half the time and with half the objects the garbage collector tracks.

A producer makes one future per message and keeps up to a window of them alive until their batch
is acknowledged, so they outlive the collector's young generation and every full collection walks
them: with a stock ``Future`` (11 tracked objects: its condition holds five bound methods, a dict
and a deque) the collector cost the producer about as much CPU per message as everything else it
does for it (docs/client-design.md, "Where a send's time goes"). ``SendFuture`` is a ``Future`` in
every way (the same methods, states and attributes, set up as ``Future.__init__`` sets them); only
its condition is a ``threading.Condition`` whose lock methods are looked up on the class instead
of being bound per instance: 6 tracked objects.

Two rules differ from a stock ``Future``, both so that the producer's own threads never run user
code and never find a future changed under them:

- **Callbacks run on the producer's callback thread**, not on the thread that resolved the future
  (a sending thread that still has other batches to send and futures to resolve). A done callback
  may therefore call ``send`` (which waits for another future) without stalling the sending
  threads. Callbacks run one at a time, in the order their futures finished; a callback added to
  a future that is already done runs at once, on the thread that adds it.
- **A send cannot be cancelled** (``cancel()`` returns False): once queued, a message may be on its
  way to the broker, and only its answer says what happened to it.
"""

from __future__ import annotations

import _thread
import collections
import concurrent.futures
import threading
import time
from concurrent.futures import _base
from typing import Any, Callable

__all__ = ["SendFuture", "Dispatch", "CallbackThread"]

#: Runs a callable on the producer's callback thread (``ThreadPoolExecutor(1).submit``).
Dispatch = Callable[[Callable[[], None]], Any]

_RLock = _thread.RLock


class _Condition(threading.Condition):
    """``threading.Condition(threading.RLock())`` with the lock's methods on the class: the same
    behaviour (``wait``, ``notify`` and the context manager are Condition's own), no bound method
    objects per instance."""

    def __init__(self) -> None:  # noqa: D107 - Condition.__init__ minus the per-instance bindings
        self._lock = _RLock()
        self._waiters: collections.deque = collections.deque()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:  # type: ignore[override]
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:  # type: ignore[override]
        self._lock.release()

    def _release_save(self) -> Any:
        return self._lock._release_save()  # type: ignore[attr-defined]

    def _acquire_restore(self, state: Any) -> None:
        self._lock._acquire_restore(state)  # type: ignore[attr-defined]

    def _is_owned(self) -> bool:
        return self._lock._is_owned()  # type: ignore[attr-defined]


class SendFuture(concurrent.futures.Future):
    """A ``concurrent.futures.Future`` (module docstring); ``dispatch`` runs its done callbacks
    (None: on the resolving thread, as a stock future does)."""

    def __init__(self, dispatch: Dispatch | None = None) -> None:  # noqa: D107 - Future.__init__'s attributes
        self._condition = _Condition()
        self._state = _base.PENDING
        self._result = None
        self._exception = None
        self._waiters: list = []
        self._done_callbacks: list = []
        self._dispatch = dispatch

    def cancel(self) -> bool:
        """A send cannot be cancelled (module docstring): always False."""
        return False

    def _invoke_callbacks(self) -> None:
        if not self._done_callbacks:
            return
        if self._dispatch is not None:
            try:
                self._dispatch(super()._invoke_callbacks)  # type: ignore[misc]
                return
            except RuntimeError:        # the producer is closed and its callback thread gone
                pass
        super()._invoke_callbacks()  # type: ignore[misc]


class CallbackThread:
    """The producer's one thread for done callbacks (module docstring): ``dispatch`` is what each
    :class:`SendFuture` is given; ``wait_idle`` waits for the callbacks handed over so far."""

    def __init__(self) -> None:
        self.ident: int | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rocketray-callbacks",
                                                           initializer=self._note)
        self.dispatch: Dispatch = self._pool.submit     # one bound method shared by every future

    def _note(self) -> None:
        self.ident = threading.get_ident()

    def current(self) -> bool:
        """Whether the calling thread is the callback thread (waiting for itself would never end)."""
        return threading.get_ident() == self.ident

    def wait_idle(self, deadline: float | None) -> bool:
        """Wait until the callbacks handed over before this call ran (False: ``deadline`` came first)."""
        marker = threading.Event()
        try:
            self._pool.submit(marker.set)
        except RuntimeError:            # closed: nothing is queued any more
            return True
        return marker.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def close(self, deadline: float | None) -> None:
        """Stop once the callbacks handed over so far ran (waiting until ``deadline``, unless called
        from a callback); a future resolved later runs its callbacks on the resolving thread."""
        marker = threading.Event()
        self._pool.submit(marker.set)
        self._pool.shutdown(wait=False)
        if not self.current():
            marker.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
