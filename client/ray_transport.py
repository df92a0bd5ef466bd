"""The client's transport inside Ray: controller requests and master discovery as Ray actor calls.

:class:`RayTransport` is the ``rocketray.client.transport.Transport`` of a Ray driver (an operator):
controller requests, one put or commit to a broker group's master, a held pull, committed offsets,
all as Ray actor calls (one call per batch, per pull of many messages, per commit of many queues).
``rocketray.client.socket_transport.SocketTransport`` keeps its control plane and moves the data
path to the brokers' client ports.

Finding the master. A group's master is cached; it is looked up from what the controllers have
applied (``ControllerService.applied_master``, not a Raft read: it answers during an election),
falling back to asking the replicas. A put learns of a new master as soon as
the controller elects it: it holds a long-poll *watch* per group on every controller
(``ControllerService.watch_master``, answered when that controller applies a higher master epoch);
a put still waiting when the watch names another master is abandoned as *unanswered* (it may have
run) and the caller decides what that means (the producer never resends a batch that may have been
written). This matters when the master's actor died and Ray is restarting it: a call to it waits for
the restart, seconds after the controller elected its successor.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import ray

from rocketray.wire.batch import EncodedBatch
from rocketray.wire.pull_result import OffsetsResult, PullResult
from rocketray.client.unanswered import Unanswered
from rocketray.wire.controller_api import Response
from rocketray.wire.put_result import PutResult

__all__ = ["RayTransport"]

#: A master lookup waits this long for the first controller's answer, then this much more for the
#: others' (the highest applied epoch among the answers names the master).
LOOKUP_TIMEOUT_S = 3.0
LOOKUP_GRACE_S = 0.003


def _views(refs: list[Any]) -> list[Any]:
    """The answers of the ``applied_master`` calls ``refs`` that succeeded."""
    out = []
    for ref in refs:
        try:
            out.append(ray.get(ref, timeout=0))
        except (ray.exceptions.RayError, ValueError):   # that controller died or was killed
            continue
    return out


class RayTransport:
    """:class:`Transport` over Ray actor calls to a :class:`rocketray.actors.cluster.Cluster`.
    Thread-safe: the producer's senders and the consumer's pulls share one."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self._lock = threading.Lock()
        self._master: dict[str, int] = {}
        self._watches: dict[str, dict[int, Any]] = {}  # group -> controller index -> pending watch
        self._epochs: dict[str, int] = {}              # group -> highest master epoch a watch reported
        self._named_at: dict[str, float] = {}          # group -> when a master of a higher epoch was named

    def groups(self) -> list[str]:
        return list(self.cluster.spec.groups)

    def close(self) -> None:
        """Release what the transport holds (Ray calls hold nothing)."""

    def config(self) -> Any:
        from rocketray.config import load_config

        spec = self.cluster.spec
        return load_config(spec.profile, dict(spec.config_overrides))

    def call_controller(self, request: Any, timeout_s: float = 10.0) -> Response:
        return self.cluster.call_controller(request, timeout_s=timeout_s)

    def controller_broadcast(self, method: str, *args: Any, timeout_s: float = 3.0) -> list[Any]:
        refs = []
        for c in self.cluster.spec.controllers:
            try:
                refs.append(getattr(self.cluster.controller(c.index), method).remote(*args))
            except ValueError:
                refs.append(None)
        out = []
        for ref in refs:
            try:
                out.append(None if ref is None else ray.get(ref, timeout=timeout_s))
            except Exception:  # noqa: BLE001 - an unreachable controller answers nothing
                out.append(None)
        return out

    # --- masters ------------------------------------------------------------------------------
    def _lookup_master(self, group: str) -> int | None:
        """The master of the highest epoch the controllers have applied (``applied_master``: not a
        Raft read, so a lookup answers during an election instead of queueing behind it). Naming
        the master just deposed costs one refused or failed attempt; the watch names the next.
        The lookup races the group's watches: one that names a newer master while the lookup waits
        answers it (a lookup that began just before an election would otherwise name the deposed
        master a few ms after the watch had named its successor). The replicas are asked when no
        controller names one."""
        refs = []
        for c in self.cluster.spec.controllers:
            try:
                refs.append(self.cluster.controller(c.index).applied_master.remote(group))
            except ValueError:  # that controller was killed for good
                continue
        views: list[Any] = []
        deadline = time.monotonic() + LOOKUP_TIMEOUT_S
        pending = refs
        while pending and not views and (left := deadline - time.monotonic()) > 0:
            watches = self._watches_of(group)
            ready, _ = ray.wait([*pending, *watches], num_returns=1, timeout=left)
            if not ready:
                break
            if ready[0] in watches:
                if (named := self._take_watch(group, ready[0])) is not None:
                    return named
                continue
            pending = [r for r in pending if r != ready[0]]
            views += _views(ready)
        if views and pending:   # the others' answers too if they come at once: the highest epoch wins
            more, _ = ray.wait(pending, num_returns=len(pending), timeout=LOOKUP_GRACE_S)
            views += _views(more)
        named = [v for v in views if v.master_address]
        if named:
            best = max(named, key=lambda v: v.master_epoch)
            b = self.cluster.spec.broker_by_ha_address(best.master_address)
            if b is not None:
                with self._lock:    # a watch armed from here waits for a *newer* master
                    if best.master_epoch > self._epochs.get(group, -1):
                        self._epochs[group] = best.master_epoch
                        self._named_at[group] = time.monotonic()
                return b.replica
        return self.cluster.master_of(group)

    def master(self, group: str) -> int | None:
        with self._lock:
            cached = self._master.get(group)
        if cached is not None:
            return cached
        found = self._lookup_master(group)
        if found is not None:
            with self._lock:
                self._master[group] = found
        return found

    def named_at(self, group: str) -> float:
        """When (``time.monotonic()``) a master of a higher epoch than the one before was last named
        for ``group``, by a watch or a lookup; -inf if never. Such a master may refuse for the moment
        it takes its role."""
        with self._lock:
            return self._named_at.get(group, float("-inf"))

    def forget_master(self, group: str) -> None:
        with self._lock:
            self._master.pop(group, None)

    def await_new_master(self, group: str, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the controller to elect a newer master of ``group`` (a watch
        answers at the election); True (and the master cached) if one was named. A retry after a
        failed attempt waits here instead of sleeping its backoff blind, so it goes to the new master
        as soon as it is elected, not at the next backoff step."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ready, _ = ray.wait(self._watches_of(group), num_returns=1, timeout=left)
            if not ready:
                return False
            if self._take_watch(group, ready[0]) is not None:
                return True

    def _watches_of(self, group: str) -> list[Any]:
        """The pending master watches of ``group``, one on every controller (armed with the highest
        epoch seen): one whose controller died with the master's node may not answer for seconds."""
        with self._lock:
            watches = self._watches.setdefault(group, {})
            for index in range(len(self.cluster.spec.controllers)):
                if index not in watches:
                    try:
                        watches[index] = self.cluster.controller(index).watch_master.remote(
                            group, self._epochs.get(group, -1))
                    except ValueError:  # that controller was killed for good
                        continue
            return list(watches.values())

    def _take_watch(self, group: str, watch: Any) -> int | None:
        """Take a fired watch: the replica it names as a newer master, or None."""
        with self._lock:
            watches = self._watches.get(group, {})
            for index, ref in list(watches.items()):
                if ref == watch:
                    del watches[index]
        try:
            view = ray.get(watch, timeout=0)
        except (ray.exceptions.RayError, ValueError):
            time.sleep(0.01)                # that controller died: re-armed next time (no hot loop)
            return None
        with self._lock:
            if view.master_epoch <= self._epochs.get(group, -1):
                return None
            self._epochs[group] = view.master_epoch
            self._named_at[group] = time.monotonic()
        b = self.cluster.spec.broker_by_ha_address(view.master_address or "")
        if b is None:
            return None
        with self._lock:
            self._master[group] = b.replica
        return b.replica

    def _call_master(self, group: str, method: str, args: tuple, timeout_s: float) -> Any:
        """Call ``method`` on ``group``'s master, abandoning it (Unanswered) when it times out, the
        actor dies, or a watch names another master first."""
        replica = self.master(group)
        if replica is None:
            return Unanswered("NO_MASTER", unsent=True)
        deadline = time.monotonic() + timeout_s
        try:
            ref = getattr(self.cluster.broker(group, replica), method).remote(*args)
            while True:
                ready, _ = ray.wait([ref, *self._watches_of(group)], num_returns=1,
                                    timeout=max(0.0, deadline - time.monotonic()))
                if ref in ready:
                    return ray.get(ref)
                if not ready:
                    return Unanswered("TIMEOUT")
                new = self._take_watch(group, ready[0])
                if new is not None and new != replica:
                    return Unanswered("MASTER_MOVED", master_moved=True)
        except (ray.exceptions.RayError, ValueError) as exc:
            self.forget_master(group)
            return Unanswered(type(exc).__name__)

    # --- data path ----------------------------------------------------------------------------
    def put(self, group: str, batch: EncodedBatch, timeout_s: float) -> PutResult | Unanswered:
        return self._call_master(group, "put", (batch,), timeout_s)

    def put_start(self, group: str, batch: EncodedBatch, timeout_s: float,
                  caller_waits: bool = False) -> Callable[[], PutResult | Unanswered]:
        """``put``, sent when its answer is waited for (a Ray call is one round trip either way)."""
        return lambda: self.put(group, batch, timeout_s)

    def commit(self, group: str, consumer_group: str, entries: list[tuple[str, int, int]],
               timeout_s: float, reset: bool = False) -> PutResult | Unanswered:
        return self._call_master(group, "commit_offsets", (consumer_group, entries, reset), timeout_s)

    def committed(self, group: str, consumer_group: str, topics: list[str] | None,
                  timeout_s: float) -> OffsetsResult | Unanswered:
        return self._call_master(group, "committed_offsets", (consumer_group, topics), timeout_s)

    def queue_max_offsets(self, group: str, queues: list[tuple[str, int]],
                          timeout_s: float) -> tuple[tuple[str, int, int], ...] | Unanswered:
        return self._call_master(group, "queue_max_offsets", (queues,), timeout_s)

    def search_offsets(self, group: str, queues: list[tuple[str, int]], timestamp_ms: int,
                       timeout_s: float) -> tuple[tuple[str, int, int], ...] | Unanswered:
        return self._call_master(group, "search_offsets", (queues, timestamp_ms), timeout_s)

    def pull(self, group: str, topic: str, queue_id: int, offset: int, max_count: int, max_bytes: int,
             hold_ms: int, consumer_group: str | None = None,
             tag_filter: str | None = None) -> concurrent.futures.Future:
        """A future of the master's :class:`PullResult` (or :class:`Unanswered`); with
        ``consumer_group`` the broker starts no lower than that group's committed offset; with
        ``tag_filter`` (a subscription expression) it returns only the messages tagged so."""
        out: concurrent.futures.Future = concurrent.futures.Future()
        replica = self.master(group)
        if replica is None:
            out.set_result(Unanswered("NO_MASTER", unsent=True))
            return out
        try:
            ref = self.cluster.broker(group, replica).pull.remote(topic, queue_id, offset, max_count, max_bytes,
                                                                  hold_ms, consumer_group, tag_filter)
        except ValueError as exc:
            out.set_result(Unanswered(type(exc).__name__))
            return out
        inner = ref.future()

        def done(f: concurrent.futures.Future) -> None:
            try:
                out.set_result(f.result())
            except Exception as exc:  # noqa: BLE001 - a dead or restarting actor: unanswered
                self.forget_master(group)
                out.set_result(Unanswered(type(exc).__name__))

        inner.add_done_callback(done)
        return out


