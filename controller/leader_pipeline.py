"""The ready leader's request path of a ``ControllerNode``: barrier, decide, propose, commit, answer.

Theory of operation. ``handle`` serves one request: it takes the pipeline lock, makes sure this node
is the *ready* leader of the current term (its barrier, an empty batch, committed: every entry of
earlier terms is applied; ``_ensure_ready``), decides the request on the speculation (the applied
state plus this leader's proposals in flight, ``controller/pipeline.py``), proposes the events (or a
barrier for a read) and releases the lock; it answers once its entry committed and this node applied
it. A proposal that fails or whose outcome is unknown drops the speculation and the ready term, so
the next request commits a barrier first. A new leader commits its barrier from a thread started by
the Raft state-change callback (``_become_ready``).

``LeaderPipeline`` is a mixin of ``ControllerNode`` (``controller/node.py``), which owns the state it
reads: the attributes annotated below.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from rocketray.wire.controller_api import ConsumerHeartbeatRequest, ElectMasterRequest, Response
from rocketray.wire.controller_codes import ResponseCode
from rocketray.controller.config import ControllerConfig
from rocketray.controller.decide import DecideContext, decide, is_write
from rocketray.controller.events import Event, encode_events
from rocketray.controller.heartbeat import HeartbeatTable
from rocketray.controller.notify import ElectionTrigger
from rocketray.controller.pipeline import Proposal, Speculation
from rocketray.controller.raft import RaftHost, encode_payload
from rocketray.controller.state import ControllerState

log = logging.getLogger("rocketray.controller.node")

MAX_BATCH_BYTES = 256 << 10           # one request's encoded events (decide bounds each field far below)
SLOW_REQUEST_S = 0.1                  # a request slower than this logs where its time went

__all__ = ["LeaderPipeline", "MAX_BATCH_BYTES"]


class _ReplicationFailed(Exception):
    def __init__(self, code: ResponseCode, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark


class LeaderPipeline:
    """Mixin: the leader's request path (module docstring). Thread-safe; ``handle`` blocks."""

    config: ControllerConfig
    self_address: str
    state: ControllerState
    heartbeats: HeartbeatTable
    _raft: RaftHost
    _spec: Speculation
    _pipeline: threading.Lock
    _state_lock: threading.Lock
    _applied: threading.Condition
    _clock_ms: Callable[[], int]
    _alive_override: Callable[[str, int], bool] | None
    _ready_term: int | None
    _closed: bool

    if TYPE_CHECKING:  # provided by ControllerNode and ElectionTriggers (no runtime stubs: the MRO stays theirs)
        def consumer_heartbeat(self, request: Any) -> Response: ...
        def _not_leader(self) -> Response: ...
        def _notify(self, response: Response, trigger: ElectionTrigger) -> None: ...

    def _become_ready(self, elected_at: float) -> None:
        """A new leader commits a barrier before it serves (reference 3.3); retried while leader."""
        while not self._closed and self._raft._isLeader():
            with self._pipeline:
                if self._ensure_ready() is not None:
                    log.info("controller leader ready self=%s term=%d barrier_ms=%.1f", self.self_address,
                             self._raft.raftCurrentTerm, (time.monotonic() - elected_at) * 1000)
                    return
            time.sleep(self.config.append_entries_period_ms / 1000)

    def _propose(self, payload: bytes, events: list[Event] | None = None) -> Proposal:
        """Pipeline lock held: hand one payload to Raft (a batch of ``events`` also goes into the
        speculation first). A synchronous refusal (queue full) raises here, before anyone decides
        on the speculation."""
        proposal = Proposal()
        if events:
            self._spec.add(events, payload)
        self._raft.apply_batch(payload, callback=proposal)
        if proposal.done and not proposal.ok:
            self._failed()
            raise _ReplicationFailed(ResponseCode.SYSTEM_ERROR,
                                     f"not proposed (pysyncobj reason {proposal.error})")
        if events:
            self._spec.last = proposal
        return proposal

    def _await(self, proposal: Proposal, timeout_s: float) -> None:
        """Wait until ``proposal`` committed and this node applied it; raise _ReplicationFailed."""
        if not proposal.wait(timeout_s):
            self._failed()  # outcome unknown: the next request re-barriers first
            raise _ReplicationFailed(ResponseCode.SYSTEM_ERROR,
                                     f"not committed within {timeout_s * 1000:.0f} ms; outcome unknown")
        if not proposal.ok:
            self._failed()
            raise _ReplicationFailed(ResponseCode.CONTROLLER_NOT_LEADER,
                                     f"append failed (pysyncobj reason {proposal.error}, result {proposal.result}); "
                                     "leader changed")

    def _failed(self) -> None:
        self._ready_term = None
        self._spec.invalidate("a proposal failed or its outcome is unknown")

    def _replicate(self, term: int, body: bytes, timeout_s: float) -> None:
        """Commit one payload and wait until this node applied it; raise _ReplicationFailed."""
        self._await(self._propose(encode_payload(term, body, self._clock_ms())), timeout_s)

    def _ensure_ready(self, timeout_s: float | None = None) -> int | None:
        """Under the pipeline lock: the term in which this node is a ready leader (its barrier
        committed and applied in that term), or None. Decisions are stamped with this term, so an
        entry that ends up in a later term is fenced at apply time."""
        if not self._raft._isLeader():
            return None
        term = self._raft.raftCurrentTerm
        if self._ready_term == term and self._spec.valid_for(term):
            return term
        try:
            self._replicate(term, b"", self.config.request_timeout_ms / 1000 if timeout_s is None else timeout_s)
        except _ReplicationFailed as exc:
            log.warning("leader barrier failed self=%s term=%d: %s", self.self_address, term, exc.remark)
            return None
        if self._raft._isLeader() and self._raft.raftCurrentTerm == term:
            with self._state_lock:  # the barrier applied behind every earlier proposal
                self._spec.reset(term, self.state)
            self._ready_term = term
            with self._applied:
                self._applied.notify_all()  # wakes wait_ready_leader
            return term
        return None

    def handle(self, request: Any, timeout_ms: int | None = None, term: int | None = None) -> Response:
        """Serve one controller request through the leader pipeline.

        One overall deadline, ``timeout_ms`` (default ``request_timeout_ms``) from now, bounds the
        whole request: waiting for the pipeline, the leader barrier, the read barrier and the
        commit of its events each get only what is left of it, so a caller whose own timeout is
        longer than this one always gets the answer (``actors/controller_client.py``).

        ``term`` fences the request: it is decided only if this node is the ready leader of exactly
        that term, else NOT_LEADER without effect. A client that gave the request up for a ready
        leader of a later term (``controller/leadership.py``) can then never see it take effect late."""
        if self._closed:
            return Response.error(ResponseCode.CONTROLLER_NOT_LEADER, "controller node closed")
        if isinstance(request, ConsumerHeartbeatRequest):
            return self.consumer_heartbeat(request)  # leader-local, never through Raft
        deadline = time.monotonic() + (timeout_ms or self.config.request_timeout_ms) / 1000

        def left() -> float:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _ReplicationFailed(ResponseCode.SYSTEM_ERROR, "request deadline passed")
            return remaining

        t0 = time.monotonic()
        if not self._pipeline.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return Response.error(ResponseCode.SYSTEM_ERROR, "controller busy: request queue timeout")
        t1 = t2 = t3 = time.monotonic()
        try:
            try:
                ready = self._ensure_ready(left())
                t2 = time.monotonic()
                if ready is None or (term is not None and ready != term):
                    return self._not_leader()
                response, proposal = self._decide(request, ready)
                t3 = time.monotonic()
            finally:
                self._pipeline.release()  # the next request decides while this one commits
            if proposal is not None:
                self._await(proposal, left())
            t4 = time.monotonic()
            if t4 - t0 > SLOW_REQUEST_S:
                log.info("slow request %s took_ms=%.1f lock_ms=%.1f ready_ms=%.1f decide_ms=%.1f commit_ms=%.1f",
                         type(request).__name__, (t4 - t0) * 1000, (t1 - t0) * 1000, (t2 - t1) * 1000,
                         (t3 - t2) * 1000, (t4 - t3) * 1000)
        except _ReplicationFailed as exc:
            if not self._raft._isLeader():
                return self._not_leader()
            return Response.error(exc.code, exc.remark)
        if isinstance(request, ElectMasterRequest) and response.ok and not request.is_controller_trigger:
            self._notify(response, ElectionTrigger.of(request))  # controller triggers: trigger_elect_master
        return response

    def _decide(self, request: Any, term: int) -> tuple[Response, Proposal | None]:
        """Pipeline lock held: decide ``request`` and propose what it needs; the answer may be
        given once the returned proposal (if any) committed and applied here.

        Writes decide on the speculation (applied state + proposals in flight); their events go
        into one entry. A read, or a write without events, waits for a barrier entry behind
        everything it saw (``is_process_read_event``); relaxed (false), a read decides on the
        applied state and waits for nothing, an event-less write waits for the newest proposal
        it saw."""
        write = is_write(request)
        if not write and not self.config.is_process_read_event:
            with self._state_lock:
                return decide(self.state, request, self._context())[0], None
        assert self._spec.state is not None
        with self._state_lock:  # the heartbeat table
            response, events = decide(self._spec.state, request, self._context())
        if events:
            body = encode_events(events)
            if len(body) > MAX_BATCH_BYTES:
                return Response.error(ResponseCode.CONTROLLER_INVALID_REQUEST,
                                      f"the request's events encode to {len(body)} bytes, over {MAX_BATCH_BYTES}"), None
            return response, self._propose(encode_payload(term, body, self._clock_ms()), events)
        if self.config.is_process_read_event:
            return response, self._propose(encode_payload(term, b"", self._clock_ms()))
        return response, self._spec.last

    def _context(self) -> DecideContext:
        now_ms = self._clock_ms()
        alive = self._alive_override or self.heartbeats.alive_predicate(now_ms)
        return DecideContext(alive, self.heartbeats.live_info, self.config.enable_elect_unclean_master)
