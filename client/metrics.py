"""Counters of a producer and a consumer, readable in code: ``producer.metrics()``,
``consumer.metrics()`` return one of these frozen snapshots (Kafka's ``metrics()``, reduced to what an
application watches: what was sent, what failed, what is waiting, how far behind a consumer is)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Mapping

from rocketray.client.types import TopicQueue

__all__ = ["ProducerMetrics", "ConsumerMetrics", "Tally"]


@dataclass(frozen=True, slots=True)
class ProducerMetrics:
    """A producer's counters since it was made, and what it holds now."""

    sent: int                #: messages acknowledged (``SEND_OK``)
    failed: int              #: messages known not written (``SendFailed``, ``InvalidMessage``, closed before sent)
    unknown: int             #: messages that ended in ``SendUnknown`` (maybe written)
    puts: int                #: put attempts (one per batch, plus retries)
    retries: int             #: put attempts after a batch's first (refusals, unanswered calls, failovers)
    pending_messages: int    #: messages queued or in flight now
    buffered_bytes: int      #: their bytes (at most ``buffer_bytes``)


@dataclass(frozen=True, slots=True)
class ConsumerMetrics:
    """A consumer's counters since it was made, and its position now."""

    received: int            #: messages ``poll`` returned
    polls: int               #: ``poll`` calls that returned
    committed: int           #: queue offsets acknowledged as committed
    commit_failures: int     #: ``commit`` calls that raised ``CommitFailed``
    rebalances: int          #: times this member's assignment changed
    assigned: int            #: queues this member owns now
    lag: int                 #: the sum of ``lag_by_queue``
    #: per owned queue whose end is known (from its last pull): the queue's confirmed end minus
    #: this member's position, i.e. messages not yet returned by ``poll``
    lag_by_queue: Mapping[TopicQueue, int] = field(default_factory=dict)
    nacked: int = 0          #: messages ``nack`` stored in the group's retry topic
    dead_lettered: int = 0   #: messages ``nack`` stored in the group's dead-letter topic
    held: int = 0            #: retry copies read but not due yet (not returned by ``poll`` before their time)


class Tally:
    """Named counters that many threads add to (a lock: ``+=`` on a shared int may lose updates)."""

    def __init__(self, *names: str) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(names, 0)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)
