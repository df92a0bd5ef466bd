"""Controller-triggered elections of a ``ControllerNode``: dead masters found by heartbeat expiry, by a
closed broker session or by the inactive-master scan, and the role-change notifications they send.

Theory of operation. Liveness is local to each node (``HeartbeatTable``, the session listener). When
the ready leader learns that a group's master is gone it re-elects the group through its own request
path (``handle(ElectMastersRequest)``, the same election rules as a broker's request: only live
SyncStateSet members), up to ``elect_master_max_retry_count`` attempts. Groups whose masters died
together go in one Raft entry per ``MAX_ELECTIONS_PER_ENTRY`` groups, and a session close while a
batch commits joins the next batch (``_elect_coalesced``), so a node that held dozens of masters
costs a few round trips. Each successful election is handed once to ``on_role_changed``.

``ElectionTriggers`` is a mixin of ``ControllerNode`` (``controller/node.py``), which owns the state
it reads: the attributes annotated below.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from rocketray.wire.controller_api import ElectMasterRequest, ElectMastersRequest, Response
from rocketray.controller.consumers import ConsumerGroups
from rocketray.wire.controller_codes import ResponseCode
from rocketray.controller.config import ControllerConfig
from rocketray.controller.decide import (DecideContext, election_answers, master_session_closed,
                                        scan_need_reelect_broker_sets)
from rocketray.controller.heartbeat import HeartbeatTable
from rocketray.controller.notify import ElectionTrigger, RoleChangeNotice, role_change_notice
from rocketray.controller.state import ControllerState

log = logging.getLogger("rocketray.controller.node")

MAX_ELECTIONS_PER_ENTRY = 256         # groups one ElectMastersRequest elects (one Raft entry)

__all__ = ["ElectionTriggers", "MAX_ELECTIONS_PER_ENTRY"]


class ElectionTriggers:
    """Mixin: elections the controller itself triggers (module docstring). Calls block on Raft."""

    config: ControllerConfig
    state: ControllerState
    heartbeats: HeartbeatTable
    _state_lock: threading.Lock
    _consumers_lock: threading.Lock
    _elect_lock: threading.Lock
    _elect_pending: dict[str, None]
    _electing: bool
    _clock_ms: Callable[[], int]
    _on_role_changed: Callable[[RoleChangeNotice], None] | None

    if TYPE_CHECKING:  # provided by ControllerNode and LeaderPipeline (no runtime stubs: the MRO stays theirs)
        def handle(self, request: Any, timeout_ms: int | None = None, term: int | None = None) -> Response: ...
        def is_leader(self) -> bool: ...
        def _context(self) -> DecideContext: ...
        def _consumer_table(self) -> ConsumerGroups: ...

    def expire_heartbeats(self) -> list[tuple[str, str, int]]:
        """Drop expired heartbeat rows; on the leader, a dead master triggers an election (5.4).

        Returns the expired `(cluster_name, broker_name, broker_id)`. Call on a timer every
        `scan_not_active_broker_interval_ms`, in a worker thread.
        """
        with self._state_lock:
            expired = self.heartbeats.expire(self._clock_ms())
        with self._consumers_lock:
            self._consumer_table().expire(self._clock_ms())
        if expired and self.is_leader():
            with self._state_lock:
                dead = [(name, bid) for _cluster, name, bid in expired if master_session_closed(self.state, name, bid)]
            for name, broker_id in dead:
                log.info("master inactive, electing group=%s broker_id=%d", name, broker_id)
            if dead:
                self.trigger_elect_masters([name for name, _ in dead])
        return expired

    def on_broker_session_closed(self, broker_name: str, broker_id: int) -> Response | None:
        """A broker's session connection closed without a bye: its process is gone (RocketMQ's
        ``onBrokerChannelClose``). Its heartbeat row goes now instead of at expiry, and on the ready
        leader a group whose master it was is re-elected at once (``trigger_elect_masters``, the same
        path as expiry), batched with the other groups whose masters' sessions closed meanwhile.
        Returns the election's answer, or None when none was needed or another caller's batch
        carries it. Blocks on Raft: call from a worker thread (``SessionServer`` does)."""
        with self._state_lock:
            self.heartbeats.remove(broker_name, broker_id)
            elect = master_session_closed(self.state, broker_name, broker_id)
        if not elect or not self.is_leader():
            return None
        log.info("master session closed, electing group=%s broker_id=%d", broker_name, broker_id)
        return self._elect_coalesced(broker_name)

    def _elect_coalesced(self, broker_name: str) -> Response | None:
        """One batch of elections at a time: a call while a batch commits adds its group to the next
        batch and returns None at once (the running caller elects it after its batch), so a machine
        that held dozens of masters costs a few Raft round trips, not one per group.

        After each batch, a group whose new master's session has meanwhile closed is elected again
        (up to ``elect_master_max_retry_count`` batches): that close was handled while the broker
        was not yet master (``master_session_closed`` said no), so nothing else would elect until
        the dead-master scan. CI on 2026-11-25: a master and a slave killed together, the slave
        elected as the first's successor just as it died."""
        with self._elect_lock:
            self._elect_pending[broker_name] = None
            if self._electing:
                return None
            self._electing = True
        answer: Response | None = None
        again: list[str] = []
        rounds = 0
        try:
            while True:
                with self._elect_lock:
                    self._elect_pending.update(dict.fromkeys(again))
                    names = list(self._elect_pending)
                    self._elect_pending.clear()
                    if not names:
                        self._electing = False
                        return answer
                answers = self.trigger_elect_masters(names)
                answer = answers.get(broker_name, answer)
                rounds += 1
                again = []
                if rounds < self.config.elect_master_max_retry_count and self.is_leader():
                    with self._state_lock:
                        again = scan_need_reelect_broker_sets(self.state, self._context().alive,
                                                              [n for n in names if answers[n].ok])
                    for name in again:
                        log.info("elected master's session closed meanwhile, electing again group=%s", name)
        except BaseException:
            with self._elect_lock:
                self._electing = False
            raise

    def scan_inactive_masters(self) -> list[tuple[str, Response]]:
        """Leader only: re-elect every set whose master is dead but some replica lives (3.3).

        Call on a timer every `scan_inactive_master_interval_ms`, in a worker thread.
        """
        if not self.is_leader():
            return []
        with self._state_lock:
            names = scan_need_reelect_broker_sets(self.state, self._context().alive)
        return list(self.trigger_elect_masters(names).items()) if names else []

    def trigger_elect_master(self, broker_name: str) -> Response:
        """Controller-triggered election with up to `elect_master_max_retry_count` attempts (5.4)."""
        response = Response.error(ResponseCode.CONTROLLER_NOT_LEADER, "not attempted")
        for attempt in range(self.config.elect_master_max_retry_count):
            response = self.handle(ElectMasterRequest.of_controller_trigger(broker_name),
                                   self.config.elect_master_attempt_timeout_ms)
            log.info("controller-triggered election group=%s attempt=%d code=%s", broker_name, attempt + 1,
                     response.code.name)
            if response.ok:
                self._notify(response, ElectionTrigger.CONTROLLER)
                break
            if response.code == ResponseCode.CONTROLLER_NOT_LEADER:
                break
        return response

    def trigger_elect_masters(self, broker_names: list[str]) -> dict[str, Response]:
        """``trigger_elect_master`` for many groups: each attempt decides every group still without an
        answer as one ``ElectMastersRequest`` (one Raft entry per ``MAX_ELECTIONS_PER_ENTRY``
        groups), up to ``elect_master_max_retry_count`` attempts; each group elected is notified."""
        answers: dict[str, Response] = {}
        pending = list(dict.fromkeys(broker_names))
        for attempt in range(self.config.elect_master_max_retry_count):
            retry: list[str] = []
            for start in range(0, len(pending), MAX_ELECTIONS_PER_ENTRY):
                chunk = pending[start:start + MAX_ELECTIONS_PER_ENTRY]
                started = time.monotonic()
                batch = self.handle(ElectMastersRequest(tuple(chunk)), self.config.elect_master_attempt_timeout_ms)
                took_ms = (time.monotonic() - started) * 1000
                got = election_answers(batch)
                for name in chunk:
                    answers[name] = response = got.get(name, batch)
                    if response.ok:
                        self._notify(response, ElectionTrigger.CONTROLLER)
                    elif response.code != ResponseCode.CONTROLLER_NOT_LEADER:
                        retry.append(name)
                log.info("controller-triggered elections groups=%d attempt=%d code=%s elected=%d took_ms=%.1f",
                         len(chunk), attempt + 1, batch.code.name, sum(answers[n].ok for n in chunk), took_ms)
            if not retry or any(a.code == ResponseCode.CONTROLLER_NOT_LEADER for a in answers.values()):
                break
            pending = retry
        return answers

    def _notify(self, response: Response, trigger: ElectionTrigger) -> None:
        """Hand one successful election to ``on_role_changed``, once, with its live members."""
        if self._on_role_changed is None or not self.config.notify_broker_role_changed:
            return
        notice = role_change_notice(response, trigger, self._context().alive)
        if notice is None:
            return
        try:
            self._on_role_changed(notice)
        except Exception:
            log.exception("role-change notification failed")
