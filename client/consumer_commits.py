"""A consumer's positions and their commits: what the application has been handed of each queue,
what is held back, and committing it (the commit side of ``rocketray.client.consumer``).

Theory of operation. ``Positions`` (``rocketray.client.core``) keeps, per owned queue, the offset
after the last message ``poll`` returned (or where a seek moved it), the offsets a nack holds back
until its copy is stored, and the offset last acknowledged as committed; ``pending`` is what a
commit would store now. ``commit`` splits the offsets by the broker group of each queue and commits
every broker group concurrently on a pool (``rocketray.client.committer``); ``commit_async`` runs
those commits one after another on its own thread, in call order. The positions are shared by the
polling thread, nacks and commits from other threads, so each access takes the one lock.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from typing import Any, Callable, Mapping

from rocketray.client.committer import commit_offsets
from rocketray.client.config import ClientConfig
from rocketray.client.core import Positions
from rocketray.client.errors import AccessDenied, CommitFailed, InvalidRequest
from rocketray.client.metrics import Tally
from rocketray.client.routes import Routes
from rocketray.client.transport import Transport
from rocketray.client.types import TopicQueue

__all__ = ["Commits", "CommitCallback", "queue_key", "COMMIT_THREADS"]

log = logging.getLogger("rocketray.client")

#: ``commit_async``'s callback: the offsets it tried, and None or the :class:`CommitFailed` (or
#: :class:`AccessDenied`) it raised.
CommitCallback = Callable[[dict[TopicQueue, int], "CommitFailed | AccessDenied | None"], Any]
COMMIT_THREADS = 8


def queue_key(value: Any) -> TopicQueue:
    """A :class:`TopicQueue` from one or a ``(topic, queue_id)`` pair; InvalidRequest otherwise."""
    if isinstance(value, TopicQueue):
        return value
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], int) \
            and not isinstance(value[1], bool):
        return TopicQueue(*value)
    raise InvalidRequest(f"a queue is a TopicQueue(topic, queue_id), not {value!r}")


class Commits:
    """The positions of one member of ``group`` and their commits (module docstring). ``tally``
    counts ``committed`` (queue offsets acknowledged) and ``commit_failures``."""

    def __init__(self, transport: Transport, routes: Routes, group: str, config: ClientConfig, tally: Tally,
                 client_id: str) -> None:
        self._transport, self._routes, self._group = transport, routes, group
        self._config, self._tally, self._client_id = config, tally, client_id
        self._positions: Positions[TopicQueue] = Positions()
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(COMMIT_THREADS, thread_name_prefix="rocketray-commit")
        self._async = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rocketray-commit-async")

    # --- positions --------------------------------------------------------------------------------
    def started(self, found: Mapping[TopicQueue, int]) -> None:
        """Queues whose start offsets became known: the group's committed offsets (or the reset's)."""
        with self._lock:
            for key, offset in found.items():
                self._positions.acknowledged(key, offset)

    def returned(self, ends: Mapping[TopicQueue, int]) -> None:
        """``poll`` handed the application every message of each queue below its offset here."""
        with self._lock:
            for key, end in ends.items():
                self._positions.returned(key, end)

    def hold(self, key: TopicQueue, offset: int) -> None:
        """A nack's message: commits stop short of it until ``release``."""
        with self._lock:
            self._positions.hold(key, offset)

    def release(self, key: TopicQueue, offset: int) -> None:
        with self._lock:
            self._positions.release(key, offset)

    def sought(self, key: TopicQueue, offset: int) -> None:
        with self._lock:
            self._positions.sought(key, offset)

    def pending(self) -> dict[TopicQueue, int]:
        """Per queue whose position is past what was acknowledged: the position."""
        with self._lock:
            return dict(self._positions.to_commit())

    # --- commits ----------------------------------------------------------------------------------
    def todo(self, offsets: Mapping[TopicQueue, int] | None) -> dict[TopicQueue, int]:
        """What a commit of ``offsets`` stores (None: ``pending``); InvalidRequest for a bad entry."""
        if offsets is None:
            return self.pending()
        todo: dict[TopicQueue, int] = {}
        for key, offset in offsets.items():
            tq = queue_key(key)
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise InvalidRequest(f"the offset to commit for {tq} must be an int >= 0, not {offset!r}")
            if not 0 <= tq.queue_id < len(self._routes.get(tq.topic).queues):
                raise InvalidRequest(f"topic {tq.topic!r} has no queue {tq.queue_id}")
            todo[tq] = offset
        return todo

    def commit(self, todo: dict[TopicQueue, int], timeout_s: float | None) -> dict[TopicQueue, int]:
        """Commit ``todo``, every broker group at once, until acknowledged or the deadline (``timeout_s``,
        None: ``send_timeout_ms``); CommitFailed or AccessDenied when a queue was not acknowledged."""
        if not todo:
            return {}
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self._config.send_timeout_ms / 1000)
        by_group: dict[str, dict[TopicQueue, int]] = {}
        for key, offset in sorted(todo.items()):
            by_group.setdefault(self._routes.get(key.topic).group_of(key.queue_id), {})[key] = offset
        outcome = commit_offsets(self._transport, self._group, by_group, deadline,
                                 self._config.request_timeout_ms / 1000, self._pool)
        with self._lock:
            for key, offset in outcome.done.items():
                self._positions.acknowledged(key, offset)
        self._tally.add("committed", len(outcome.done))
        if outcome.failed:
            self._tally.add("commit_failures")
            raise outcome.error(self._group)
        return dict(todo)

    def commit_async(self, todo: dict[TopicQueue, int], callback: CommitCallback | None) -> concurrent.futures.Future:
        """``commit(todo)`` on the commit thread, then ``callback(todo, error)`` on that thread."""

        def run() -> dict[TopicQueue, int]:
            error: CommitFailed | AccessDenied | None = None
            try:
                return self.commit(todo, None)
            except (CommitFailed, AccessDenied) as exc:
                error = exc
                raise
            finally:
                if callback is not None:
                    try:
                        callback(dict(todo), error)
                    except Exception:  # noqa: BLE001 - an application's callback never stops the thread
                        log.exception("consumer %s: commit callback raised", self._client_id)

        return self._async.submit(run)

    def close(self, wait: bool = True) -> None:
        """After every ``commit_async`` already made (``wait``), end the commit threads."""
        self._async.shutdown(wait=wait)
        self._pool.shutdown(wait=wait)
