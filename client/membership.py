"""A consumer's membership of its group, kept by a background thread.

Theory of operation. Every ``consumer_heartbeat_interval_ms`` the thread heartbeats the group to
the controller leader, whose answer is the group's live members, and every ``route_refresh_ms`` it
asks the controller for the routes of the subscribed topics. When either changed (a member joined
or left, a topic gained queues), the assignment is *stale*: the consumer's next ``poll`` computes
it again from the members and the routes (``rocketray.client.core.allocate_averagely``), so a queue
added to a topic is read within ``route_refresh_ms`` plus a heartbeat (while members' routes
differ, a queue may briefly have two readers or none: at-least-once, as during any rebalance).

A member that does not poll for ``max_poll_interval_ms`` leaves the group (its queues go to the
others at their next heartbeat, instead of waiting behind a stuck application forever); its next
``poll`` joins again.

Leaving is ordered after every heartbeat: one lock covers each heartbeat call and the leave, and a
member that left sends no heartbeat until it joins again, so a heartbeat still in flight when the
consumer closes cannot reach the controller after the leave and add the member back.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Sequence

from rocketray.client.errors import AccessDenied, ClientError, access_denied
from rocketray.client.routes import Routes
from rocketray.client.transport import Transport
from rocketray.wire.controller_api import ConsumerHeartbeatRequest
from rocketray.wire.controller_headers import ConsumerHeartbeatResponseHeader
from rocketray.wire.controller_codes import ResponseCode

__all__ = ["Membership", "HEARTBEAT_TIMEOUT_S", "LEAVE_TIMEOUT_S"]

log = logging.getLogger("rocketray.client")

HEARTBEAT_TIMEOUT_S = 5.0
LEAVE_TIMEOUT_S = 3.0


class Membership:
    """Heartbeats, route refreshes and leaving for one member (module docstring)."""

    def __init__(self, transport: Transport, routes: Routes, group: str, client_id: str, topics: Sequence[str],
                 heartbeat_interval_s: float, route_refresh_s: float, max_poll_interval_s: float,
                 watch: Sequence[str] = ()) -> None:
        self._transport = transport
        self._routes = routes
        self.group = group
        self.client_id = client_id
        self.topics = tuple(topics)
        # read but not subscribed in the heartbeat, and quietly absent until created: the group's retry topic
        self.watch = tuple(t for t in watch if t not in self.topics)
        self._heartbeat_interval_s = heartbeat_interval_s
        self._route_refresh_s = route_refresh_s
        self._max_poll_interval_s = max_poll_interval_s
        self._state = threading.Lock()       # members, queue counts, flags
        self._calls = threading.Lock()       # one heartbeat or leave at a time, none after leaving
        self.members: tuple[str, ...] = ()
        self._queue_counts: dict[str, int] = {}
        self._stale = threading.Event()
        self._stop = threading.Event()
        self._left = False                   # left the group (closed, or for the poll interval)
        self._denied: AccessDenied | None = None   # the ACL refused the last heartbeat: poll raises it
        self.left_for_poll_interval = 0      # times it left because poll was not called
        self._last_poll = time.monotonic()
        self._next_refresh = time.monotonic() + route_refresh_s
        self._thread = threading.Thread(target=self._loop, name="rocketray-consumer-heartbeat", daemon=True)

    def start(self) -> None:
        """Join now (one heartbeat), then keep the membership from the background thread."""
        self._note_routes()
        self.heartbeat()
        denied = self.take_denied()
        if denied is not None:
            raise denied
        self._thread.start()

    def take_denied(self) -> AccessDenied | None:
        """The ACL's refusal of the last heartbeat, if any (cleared: the next heartbeat asks again)."""
        denied, self._denied = self._denied, None
        return denied

    def stale(self) -> bool:
        """Whether the assignment must be computed again (clears the flag)."""
        if self._stale.is_set():
            self._stale.clear()
            return True
        return False

    def polled(self) -> None:
        """``poll`` was called: the member is active (and joins again if it had left for not polling)."""
        self._last_poll = time.monotonic()
        with self._calls:
            rejoin = self._left and not self._stop.is_set()
            if rejoin:
                self._left = False
        if rejoin:
            log.info("consumer %s group=%s: polling again, joining the group", self.client_id, self.group)
            self.heartbeat()

    # --- the background thread ------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self._heartbeat_interval_s):
            if time.monotonic() - self._last_poll > self._max_poll_interval_s:
                self._leave_idle()
            else:
                self.heartbeat()
            if time.monotonic() >= self._next_refresh:
                self._next_refresh = time.monotonic() + self._route_refresh_s
                self._refresh_routes()

    def heartbeat(self) -> None:
        """One heartbeat (unless the member left); a changed member list makes the assignment stale."""
        with self._calls:
            if self._left or self._stop.is_set():
                return
            try:
                resp = self._transport.call_controller(
                    ConsumerHeartbeatRequest(self.group, self.client_id, self.topics), timeout_s=HEARTBEAT_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - keep the last membership; try again next beat
                log.info("consumer %s: heartbeat failed: %s", self.client_id, exc)
                return
        if resp.code == ResponseCode.NO_PERMISSION:
            log.warning("consumer %s: heartbeat denied: %s", self.client_id, resp.remark)
            self._denied = access_denied(resp.remark, doing=f"joining consumer group {self.group!r}")
            return
        if not resp.ok or not isinstance(resp.header, ConsumerHeartbeatResponseHeader):
            log.info("consumer %s: heartbeat refused: %s %s", self.client_id, resp.code.name, resp.remark)
            return
        self._set_members(tuple(sorted(resp.header.members)))

    def _set_members(self, members: tuple[str, ...]) -> None:
        with self._state:
            if members != self.members:
                self.members = members
                self._stale.set()

    def _refresh_routes(self) -> None:
        for topic in self.topics + self.watch:
            try:
                self._routes.refresh(topic)
            except ClientError as exc:
                log.log(logging.DEBUG if topic in self.watch else logging.INFO,
                        "consumer %s: route of %r not refreshed: %s", self.client_id, topic, exc)
        self._note_routes()

    def routes_changed(self) -> None:
        """A topic was created or extended here: compute the assignment again at the next poll."""
        self._stale.set()

    def _note_routes(self) -> None:
        """Remember each topic's queue count as cached; a change makes the assignment stale."""
        counts = {}
        for topic in self.topics + self.watch:
            route = self._routes.cached(topic)
            if route is not None:
                counts[topic] = len(route.queues)
        with self._state:
            changed = {t: n for t, n in counts.items() if self._queue_counts.get(t) != n}
            self._queue_counts.update(counts)
        if changed:
            self._stale.set()

    def _leave_idle(self) -> None:
        with self._calls:
            if self._left:
                return
            self._left = True
            self.left_for_poll_interval += 1
            self._send_leave()
            self._set_members(())
        log.warning("consumer %s group=%s left the group: poll not called for %.0f s (max_poll_interval_ms)",
                    self.client_id, self.group, self._max_poll_interval_s)

    # --- leaving --------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the thread and leave the group, after any heartbeat in flight has returned."""
        self._stop.set()
        with self._calls:
            was_in = not self._left
            self._left = True
            if was_in:
                self._send_leave()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=HEARTBEAT_TIMEOUT_S + 1)

    def abandon(self) -> None:
        """Stop heartbeating without leaving (a crash, for tests and chaos runs): the controller
        drops the member after its heartbeat timeout."""
        self._stop.set()

    def _send_leave(self) -> None:
        try:
            self._transport.call_controller(ConsumerHeartbeatRequest(self.group, self.client_id, self.topics,
                                                                     leaving=True), timeout_s=LEAVE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - the controller expires it later
            log.info("consumer %s: leave not confirmed (%s); it expires by timeout", self.client_id, exc)
