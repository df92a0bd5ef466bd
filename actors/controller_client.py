"""Reaching the controller leader through Ray, from a broker (async) or a driver (sync).

Controllers are actors named ``controller-<i>``. Both clients keep a
:class:`rocketray.controller.leadership.LeaderView`, the newest *ready* leader a controller said it
is (``leader_status``), and send each attempt to it with its term, so only that leader in that term
can decide it (``ControllerNode.handle(term=...)``). Nothing waits on a dead controller:

- no leader known: every controller is asked at once (``leader_status``) and the first ready
  leader's answer is taken; a controller whose last question is still unanswered (a restarting
  actor, a lost node) is not asked again, so the others' answers are not held up by it;
- an attempt unanswered for ``PROBE_AFTER_S`` starts asking the others every ``PROBE_PERIOD_S``;
  a ready leader of a later term elsewhere ends the wait and the request goes there
  (``Attempts.give_up``: the earlier attempt's outcome is then decided and visible to the new
  leader, so the retry never races it);
- the broker's client also holds a long poll on every controller (``watch_leader``), so it learns a
  new leader the moment that one can serve, even between calls: its session
  (``actors/controller_session.py``) follows it at once.

A broker's heartbeats do not go through Ray: they ride its session connection to the leader
(``heartbeat_sink``, the session's ``heartbeat``). Only a cluster whose controllers have no session
port still fires one Ray call per heartbeat at every controller.

A killed leader therefore costs a client the election plus a round trip, not the killed actor's
restart (Ray queues calls to a restarting actor) or a call timeout (a lost node). A call still waits
longer than the controller's own request deadline (``request_timeout_ms``, ``ControllerNode.handle``)
plus a margin before it gives a live controller up: a client that gave up first would report an
unknown outcome for a write the controller still commits and answers (a broker's registrar that gave
up so would orphan the broker id the controller still assigns). Transport failures surface as
:class:`ControllerUnavailable` (``retriable = True``), never as a bare Ray exception.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Callable

import ray

from rocketray.config import load_config
from rocketray.wire.controller_api import Response
from rocketray.controller.leadership import Attempts, Leader, LeaderStatus, LeaderView
from rocketray.spec import ClusterSpec

log = logging.getLogger("rocketray.controller_client")

__all__ = ["AsyncControllerClient", "ControllerUnavailable", "SyncControllerClient", "call_leader_sync",
           "call_timeout_for"]


class ControllerUnavailable(RuntimeError):
    """No controller answered as leader in time; worth retrying later."""

    retriable = True


CLIENT_MARGIN_S = 2.0
PROBE_AFTER_S = 0.03     # an attempt unanswered this long starts asking the other controllers
PROBE_PERIOD_S = 0.02    # how often one controller is asked for its status while a client waits
WATCH_S = 10.0           # one leader long poll (``watch_leader``); then it is armed again
WATCH_RETRY_S = 0.2      # after a failed long poll (dead or restarting controller)
_TRANSPORT_ERRORS = (ray.exceptions.RayError, ValueError)   # ValueError: the named actor is gone


def call_timeout_for(spec: ClusterSpec) -> float:
    """The per-call timeout of a controller client: the controllers' request deadline + a margin."""
    node_config = load_config(spec.profile, dict(spec.config_overrides)).controller_node_config()
    return node_config.request_timeout_ms / 1000 + CLIENT_MARGIN_S


class AsyncControllerClient:
    """Used inside a broker actor's event loop (see the module docstring)."""

    def __init__(self, spec: ClusterSpec, call_timeout_s: float | None = None,
                 heartbeat_sink: Callable[[Any], None] | None = None):
        self._spec = spec
        self._timeout_s = call_timeout_for(spec) if call_timeout_s is None else call_timeout_s
        self._heartbeat_sink = heartbeat_sink
        self._view = LeaderView()
        self._handles: dict[int, Any] = {}
        self._probes: dict[int, asyncio.Future] = {}
        self._probed_at: dict[int, float] = {}
        self._moved: asyncio.Event | None = None
        self._watches: list[asyncio.Task] = []

    @property
    def leader_address(self) -> str | None:
        """Raft address of the ready leader this client follows (None: none known now)."""
        leader = self._view.leader
        return None if leader is None else self._spec.controllers[leader.index].raft_address

    def _handle(self, index: int):
        h = self._handles.get(index)
        if h is None:
            h = ray.get_actor(self._spec.controller_actor_name(index), namespace=self._spec.namespace)
            self._handles[index] = h
        return h

    def _event(self) -> asyncio.Event:
        if self._moved is None:
            self._moved = asyncio.Event()
        return self._moved

    def _observe(self, status: LeaderStatus) -> None:
        if self._view.observe(status):
            log.info("controller leader is now controller-%d term=%d", status.index, status.term)
            moved, self._moved = self._event(), asyncio.Event()
            moved.set()

    def _start_watches(self) -> None:
        if not self._watches:
            self._watches = [asyncio.get_running_loop().create_task(self._watch(c.index))
                             for c in self._spec.controllers]

    async def _watch(self, index: int) -> None:
        while True:
            try:
                ref = self._handle(index).watch_leader.remote(self._view.term, WATCH_S)
                status = await asyncio.wait_for(ref, WATCH_S + self._timeout_s)
            except (asyncio.TimeoutError, *_TRANSPORT_ERRORS):
                self._handles.pop(index, None)
                await asyncio.sleep(WATCH_RETRY_S)
                continue
            self._observe(status)

    def _probe(self) -> None:
        """Ask each controller with no question pending, at most every ``PROBE_PERIOD_S``."""
        now = time.monotonic()
        for c in self._spec.controllers:
            pending = self._probes.get(c.index)
            if (pending is not None and not pending.done()) or now - self._probed_at.get(c.index, -1e9) < PROBE_PERIOD_S:
                continue
            self._probed_at[c.index] = now
            self._probes[c.index] = asyncio.ensure_future(self._status(c.index))

    async def _status(self, index: int) -> None:
        try:
            status = await asyncio.wait_for(self._handle(index).leader_status.remote(), self._timeout_s)
        except (asyncio.TimeoutError, *_TRANSPORT_ERRORS):
            self._handles.pop(index, None)
            return
        self._observe(status)

    async def _wait_moved(self, timeout_s: float) -> None:
        try:
            await asyncio.wait_for(self._event().wait(), max(0.0, timeout_s))
        except asyncio.TimeoutError:
            pass

    async def _leader(self, deadline: float) -> Leader | None:
        """The view's leader, asking every controller until one says it leads (or ``deadline``)."""
        while self._view.leader is None and time.monotonic() < deadline:
            self._probe()
            await self._wait_moved(min(PROBE_PERIOD_S, deadline - time.monotonic()))
        return self._view.leader

    async def call(self, request, address: str | None = None) -> Response:
        """Send ``request`` to the leader; returns its Response or raises ControllerUnavailable.
        ``address`` (the caller's belief) is not needed: the client follows the leader itself."""
        self._start_watches()
        deadline = time.monotonic() + self._timeout_s
        attempts = Attempts(self._view)
        previous: Leader | None = None
        while True:
            leader = await self._leader(deadline)
            if leader is None:
                raise ControllerUnavailable(f"no controller leader answered {type(request).__name__}")
            if leader == previous:
                await asyncio.sleep(PROBE_PERIOD_S)   # the same leader refused it: do not spin
            attempts.sent(leader)
            try:
                answer = asyncio.ensure_future(self._handle(leader.index).handle.remote(request, leader.term))
            except _TRANSPORT_ERRORS:
                self._handles.pop(leader.index, None)
                attempts.failed()
                previous = leader
                continue
            response = await self._attempt(answer, attempts, deadline)
            if response is not None:
                return response
            previous = leader

    async def _attempt(self, answer: asyncio.Future, attempts: Attempts, deadline: float) -> Response | None:
        sent_at = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= deadline:
                answer.cancel()
                attempts.failed()
                raise ControllerUnavailable("no controller leader answered in time")
            if now - sent_at >= PROBE_AFTER_S:
                self._probe()
                wait_s = PROBE_PERIOD_S
            else:
                wait_s = PROBE_AFTER_S - (now - sent_at)
            moved = asyncio.ensure_future(self._event().wait())
            await asyncio.wait({answer, moved}, timeout=min(wait_s, deadline - now),
                               return_when=asyncio.FIRST_COMPLETED)
            moved.cancel()
            if answer.done():
                try:
                    return attempts.answered(answer.result())
                except _TRANSPORT_ERRORS:
                    attempts.failed()
                    return None
            if attempts.give_up():
                log.info("controller request moves to the new leader controller-%s", self._view.leader)
                answer.cancel()
                return None

    async def heartbeat(self, request) -> None:
        """Hand a heartbeat to the session (``heartbeat_sink``: it goes to the leader on the broker's
        session connection), or without one fire it at every controller through Ray."""
        self._start_watches()
        if self._heartbeat_sink is not None:
            self._heartbeat_sink(request)
            return
        for c in self._spec.controllers:
            try:
                self._handle(c.index).heartbeat.remote(request)
            except _TRANSPORT_ERRORS:
                self._handles.pop(c.index, None)

    async def metadata(self) -> list[dict]:
        """The ready leader as ``[{"leader_address", "index", "term", "is_leader": True}]``, or []
        when none answered within the call timeout (``ReplicasManager`` takes the first)."""
        self._start_watches()
        leader = await self._leader(time.monotonic() + self._timeout_s)
        if leader is None:
            return []
        address = self._spec.controllers[leader.index].raft_address
        return [{"leader_address": address, "index": leader.index, "term": leader.term, "is_leader": True}]


class SyncControllerClient:
    """A driver's client (``Cluster.call_controller``), safe to share between threads; the same
    rules as the broker's without the long polls (a driver's calls are few; see the module
    docstring). ``controller(index)`` returns the actor handle of controller ``index``."""

    def __init__(self, spec: ClusterSpec, controller: Callable[[int], Any], call_timeout_s: float | None = None):
        self._spec = spec
        self._controller = controller
        self._timeout_s = call_timeout_for(spec) if call_timeout_s is None else call_timeout_s
        self._lock = threading.Lock()
        self._view = LeaderView()
        self._probes: dict[int, tuple[Any, float]] = {}   # index -> (status ref, sent at)

    @property
    def leader(self) -> Leader | None:
        return self._view.leader

    def _probe(self, wait_s: float = 0.0, also: Any = None) -> bool:
        """Ask each controller with no question pending (or one older than the call timeout), at
        most every ``PROBE_PERIOD_S``; wait up to ``wait_s`` for the first answer (or for ``also``,
        an attempt's ref, to be ready: then True) and take in every answer that arrived."""
        now = time.monotonic()
        with self._lock:
            for c in self._spec.controllers:
                ref_at = self._probes.get(c.index)
                if ref_at is not None and (ref_at[0] is not None or now - ref_at[1] < PROBE_PERIOD_S) \
                        and now - ref_at[1] < self._timeout_s:
                    continue
                try:
                    self._probes[c.index] = (self._controller(c.index).leader_status.remote(), now)
                except _TRANSPORT_ERRORS:
                    self._probes[c.index] = (None, now)
            refs = {ref: index for index, (ref, _at) in self._probes.items() if ref is not None}
        waited = list(refs) + ([] if also is None else [also])
        if not waited:
            time.sleep(wait_s)
            return False
        ready, _ = ray.wait(waited, num_returns=1, timeout=wait_s)
        if ready:
            ready, _ = ray.wait(waited, num_returns=len(waited), timeout=0)
        for ref in ready:
            index = refs.get(ref)
            if index is None:
                continue
            try:
                status = ray.get(ref)
            except _TRANSPORT_ERRORS:
                status = None
            with self._lock:
                if self._probes.get(index, (None, 0))[0] is ref:
                    self._probes[index] = (None, self._probes[index][1])
                if status is not None and self._view.observe(status):
                    log.info("controller leader is now controller-%d term=%d", status.index, status.term)
        return also is not None and also in ready

    def _leader(self, deadline: float) -> Leader | None:
        while True:
            with self._lock:
                leader = self._view.leader
            if leader is not None or time.monotonic() >= deadline:
                return leader
            self._probe(wait_s=min(PROBE_PERIOD_S, max(0.0, deadline - time.monotonic())))

    def call(self, request, timeout_s: float = 10.0, call_timeout_s: float | None = None) -> Response:
        """The leader's answer to ``request``; ControllerUnavailable if none within ``timeout_s``.
        One attempt waits at most ``call_timeout_s`` (default: the controllers' request deadline +
        ``CLIENT_MARGIN_S``) unless a new leader shows first."""
        call_timeout_s = self._timeout_s if call_timeout_s is None else call_timeout_s
        deadline = time.monotonic() + timeout_s
        attempts = Attempts(self._view)
        previous: Leader | None = None
        while True:
            leader = self._leader(deadline)
            if leader is None:
                raise ControllerUnavailable(f"no controller leader answered {type(request).__name__} in {timeout_s}s")
            if leader == previous:
                time.sleep(PROBE_PERIOD_S)   # the same leader refused it: do not spin
            with self._lock:
                attempts.sent(leader)
            try:
                ref = self._controller(leader.index).handle.remote(request, leader.term)
            except _TRANSPORT_ERRORS:
                with self._lock:
                    attempts.failed()
                previous = leader
                continue
            response = self._attempt(ref, attempts, deadline, call_timeout_s)
            if response is not None:
                return response
            previous = leader

    def _attempt(self, ref, attempts: Attempts, deadline: float, call_timeout_s: float) -> Response | None:
        sent_at = time.monotonic()
        while True:
            now = time.monotonic()
            elapsed = now - sent_at
            if now >= deadline or elapsed >= call_timeout_s:
                with self._lock:
                    attempts.failed()
                if now >= deadline:
                    raise ControllerUnavailable("no controller leader answered in time")
                return None
            if elapsed < PROBE_AFTER_S:
                ready = bool(ray.wait([ref], timeout=min(PROBE_AFTER_S - elapsed, deadline - now))[0])
            else:   # ask the others meanwhile; an answer that names a later leader ends the wait
                ready = self._probe(wait_s=min(PROBE_PERIOD_S, deadline - now), also=ref)
            if ready:
                try:
                    response = ray.get(ref)
                except _TRANSPORT_ERRORS:
                    with self._lock:
                        attempts.failed()
                    return None
                with self._lock:
                    return attempts.answered(response)
            with self._lock:
                if attempts.give_up():
                    log.info("controller request moves to the new leader %s", self._view.leader)
                    return None


def call_leader_sync(cluster, request, timeout_s: float = 10.0, call_timeout_s: float | None = None) -> Response:
    """Driver-side: the leader's answer to ``request`` through the cluster's shared client."""
    return cluster.controller_client.call(request, timeout_s=timeout_s, call_timeout_s=call_timeout_s)
