"""``Consumer``: a member of a consumer group reading topics, with offsets committed in the cluster.

    >>> from rocketray.client import Consumer
    >>> with Consumer("demo", group="billing", topics=["orders"]) as c:   # doctest: +SKIP
    ...     for m in c.poll(timeout_s=1.0):
    ...         handle(m.body)
    ...     c.commit()

Group membership (``rocketray.client.membership``). Every consumer heartbeats its group to the
controller leader, whose answer is the group's live members; each member computes the same split of
every topic's queues (RocketMQ's allocate-averagely), so each queue is read by one live member. The
split is computed again when the members change or a topic gains queues (routes are refreshed every
``route_refresh_ms``). A member that closes leaves at once; one that dies leaves when the controller
stops hearing from it; one that stops calling ``poll`` for ``max_poll_interval_ms`` leaves until it
polls again. A :class:`~rocketray.client.types.RebalanceListener` hears ``on_revoked`` before queues
leave (so it can commit) and ``on_assigned`` after new ones arrive, inside ``poll``.

Reading (``rocketray.client.fetcher``). A newly owned queue starts at the group's committed offset
(or ``auto_offset_reset``: ``earliest`` or ``latest`` when the group never committed it), unless the
application seeks it. ``poll`` keeps one held pull in flight per owned, unpaused queue and
returns as soon as any has messages; never a message beyond the confirm offset. What ``poll`` took
it returns: an error met on the way is raised by the next ``poll`` when messages came with it.
``topics={topic: "a || b"}`` reads only messages so tagged, filtered on the brokers
(``rocketray.client.filters``); every member of a group must subscribe alike (docs/client.md).

Committing (``rocketray.client.consumer_commits``, ``rocketray.client.committer``). ``commit()`` stores, for every queue ``poll`` returned
messages of, one past the last one returned (``commit(offsets=...)``: exactly the given offsets), as
a record replicated like a message, every broker group concurrently. A commit never moves a group's
offset backwards (the brokers keep the maximum), so a late commit after a rebalance is harmless and
a failed commit can simply be retried (only an admin's reset of the stopped group moves it back). Delivery is at-least-once: what was polled but not committed
is delivered again after a crash or a rebalance.

Retries (``rocketray.client.retry``, ``rocketray.client.redelivery``). ``nack`` stores a copy of a
failed message in the group's retry topic ``%RETRY%<group>``, which every member also reads (from
the group's first nack on), and holds ``commit`` short of the message until the copy is
acknowledged; a copy reaches the application at or after its time, and after ``max_deliveries`` a
nacked message goes to ``%DLQ%<group>`` instead.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from typing import Any, Iterable, Mapping, Sequence

from rocketray.client.config import ClientConfig, client_config
from rocketray.client.consumer_commits import CommitCallback, Commits, queue_key
from rocketray.client.core import allocate_averagely
from rocketray.client.errors import AccessDenied, ClientClosed, ClientError, InvalidRequest, TopicNotFound
from rocketray.client.fetcher import RETRY_AFTER_S, Fetcher
from rocketray.client.filters import subscriptions
from rocketray.client.membership import Membership
from rocketray.client.messages import new_client_id
from rocketray.client.metrics import ConsumerMetrics, Tally
from rocketray.client.routes import Routes
from rocketray.client.transport import Transport, connect_transport
from rocketray.client.redelivery import Redelivery
from rocketray.client.retry import retry_topic
from rocketray.client.types import RebalanceListener, ReceivedMessage, SendResult, TopicQueue

__all__ = ["Consumer", "CommitCallback"]

log = logging.getLogger("rocketray.client")


class Consumer:
    """One member of consumer group ``group`` reading ``topics`` (see the module docstring).

    Keyword arguments override the cluster's ``client`` configuration (``poll_max_messages``,
    ``poll_max_bytes``, ``request_timeout_ms``, ``send_timeout_ms`` (a commit's deadline),
    ``consumer_heartbeat_interval_ms``, ``route_refresh_ms``, ``max_poll_interval_ms``,
    ``max_deliveries``, ``retry_delays``); an unknown
    or out-of-range one raises :class:`InvalidRequest` here, as does a topic that does not exist
    (:class:`TopicNotFound`). Not thread-safe: one thread polls (``commit_async``, ``nack`` and
    ``close`` may come from others)."""

    def __init__(self, cluster: str = "default", *, group: str, topics: Iterable[str] | Mapping[str, str],
                 transport: Transport | None = None, client_id: str | None = None,
                 auto_offset_reset: str = "earliest", listener: RebalanceListener | None = None,
                 **settings: Any) -> None:
        if not isinstance(group, str) or not group:
            raise InvalidRequest("a consumer needs a group name and at least one topic")
        subscribed = subscriptions(topics)       # {topic: tag expression} filters on the brokers
        if auto_offset_reset not in ("earliest", "latest"):
            raise InvalidRequest(f"auto_offset_reset must be 'earliest' or 'latest', not {auto_offset_reset!r}")
        self.group = group
        self.topics = sorted(subscribed)
        self.auto_offset_reset = auto_offset_reset
        self.client_id = client_id or new_client_id()
        self._listener = listener
        self._owns_transport = transport is None
        self._transport = transport if transport is not None else connect_transport(cluster)
        try:
            self.config: ClientConfig = client_config(self._transport, settings)
            refresh_s = self.config.route_refresh_ms / 1000
            # the membership thread refreshes the routes every route_refresh_ms: a poll rarely asks itself
            self._routes = Routes(self._transport, 2 * refresh_s)
            for topic in self.topics:
                self._routes.get(topic)                      # TopicNotFound now, not in the first poll
        except ClientError:
            if self._owns_transport:
                self._transport.close()
            raise
        self._fetcher = Fetcher(self._transport, group, self.config, auto_offset_reset, subscribed)
        self._paused: set[TopicQueue] = set()
        self._error: ClientError | None = None       # met by a poll that returned messages: raised next
        self._closed = False
        self._tally = Tally("received", "polls", "committed", "commit_failures", "rebalances", "nacked",
                            "dead_lettered")
        self._commits = Commits(self._transport, self._routes, group, self.config, self._tally, self.client_id)
        self._retry_topic = retry_topic(group)
        self._membership = Membership(self._transport, self._routes, group, self.client_id, self.topics,
                                      self.config.consumer_heartbeat_interval_ms / 1000, refresh_s,
                                      self.config.max_poll_interval_ms / 1000, watch=[self._retry_topic])
        self._redelivery = Redelivery(self._transport, self._routes, self.config, group,
                                      self._membership.routes_changed)
        try:
            self._redelivery.learn_retry_topic()
            self._membership.start()
        except BaseException:          # the ACL denied the group: nothing of this consumer stays
            self._commits.close(wait=False)
            if self._owns_transport:
                self._transport.close()
            raise

    # --- reading ----------------------------------------------------------------------------------
    def poll(self, timeout_s: float = 1.0) -> list[ReceivedMessage]:
        """Messages of the queues this member owns, waiting up to ``timeout_s`` for the first."""
        self._check_open()
        if self._error is not None:
            stashed, self._error = self._error, None
            raise stashed
        denied = self._membership.take_denied()
        if denied is not None:
            raise denied
        deadline = time.monotonic() + max(0.0, timeout_s)
        self._membership.polled()
        if self._membership.stale():
            self._rebalance()
        out: list[ReceivedMessage] = []
        error: ClientError | None = None
        while True:
            out.extend(self._redelivery.release(self._paused))     # retry copies now due
            if out or error:
                break
            self._commits.started(self._fetcher.start_positions())
            self._fetcher.issue_pulls(deadline, self._paused | self._redelivery.hold.queues())
            pending = self._fetcher.in_flight()
            left = self._redelivery.wait_s(deadline - time.monotonic(), self._paused)
            if pending:
                done, _ = concurrent.futures.wait(list(pending), timeout=left,
                                                  return_when=concurrent.futures.FIRST_COMPLETED)
                for fut in done:
                    messages, problem = self._fetcher.take(pending[fut], fut, self._paused)
                    out.extend(self._redelivery.arrived(messages, self._paused))
                    error = error or problem
            elif left > 0:
                time.sleep(min(left, RETRY_AFTER_S))    # nothing to read yet (positions unknown, all paused)
            if time.monotonic() >= deadline:
                break
        self._hand_over(out)
        if error is not None:
            if not out:
                raise error
            self._error = error
        return out

    def _hand_over(self, messages: list[ReceivedMessage]) -> None:
        """``messages`` go to the application: their queues' positions move past them."""
        ends: dict[TopicQueue, int] = {}
        for m in messages:
            key = TopicQueue(m.topic, m.queue_id)
            ends[key] = max(ends.get(key, 0), m.queue_offset + 1)
        for key, passed in self._fetcher.take_passed().items():    # filtered queues: past skipped messages
            ends[key] = max(ends.get(key, 0), passed)
        self._commits.returned(ends)
        self._tally.add("received", len(messages))
        self._tally.add("polls")

    # --- retries -----------------------------------------------------------------------------------
    def nack(self, message: ReceivedMessage, delay_s: float | None = None) -> SendResult:
        """``message`` failed: deliver it to the group again after ``delay_s`` (None: the
        ``retry_delays`` schedule by its ``delivery_count``), or, once it was delivered
        ``max_deliveries`` times, put it in the group's dead-letter topic (``rocketray.client.retry``).
        Returns where its copy was stored, once acknowledged; until then, and for good if this
        raises (the ClientError of the send), ``commit`` stops short of ``message``, so a crash
        delivers it again from its own queue: a nack never loses a message. Thread-safe."""
        self._check_open()
        plan = self._redelivery.plan(message, (*self.topics, self._retry_topic), delay_s)
        self._commits.hold(message.queue, message.queue_offset)
        result = self._redelivery.publish(message, plan)           # raises: the hold stays
        self._commits.release(message.queue, message.queue_offset)
        self._tally.add("dead_lettered" if plan.dead else "nacked")
        return result

    # --- committing -------------------------------------------------------------------------------
    def commit(self, offsets: Mapping[TopicQueue, int] | None = None,
               timeout_s: float | None = None) -> dict[TopicQueue, int]:
        """Commit ``offsets`` (``{TopicQueue: next offset to read}``), or by default, for every queue
        ``poll`` returned messages of, the offset after the last one returned. Returns what this
        call committed once each is acknowledged, else raises :class:`CommitFailed` (retriable
        unless the broker refused an offset as invalid; the queues that were acknowledged stay
        committed and are in its ``committed``), or :class:`AccessDenied` when the ACL does not let
        the user Sub as the group."""
        self._check_open()
        return self._commits.commit(self._commits.todo(offsets), timeout_s)

    def commit_async(self, offsets: Mapping[TopicQueue, int] | None = None,
                     callback: CommitCallback | None = None) -> concurrent.futures.Future:
        """``commit`` in the background: what to commit is taken now, the commit runs on the
        consumer's commit thread (commits in call order), then ``callback(offsets, error)`` runs on
        that thread. The future gives the committed offsets or raises :class:`CommitFailed`."""
        self._check_open()
        return self._commits.commit_async(self._commits.todo(offsets), callback)

    def pending_commits(self) -> dict[TopicQueue, int]:
        """What ``commit()`` would commit now: per queue ``poll`` returned messages of (or ``seek``
        moved forward) whose position is past what was acknowledged."""
        return self._commits.pending()

    # --- assignment, pause, seek --------------------------------------------------------------------
    def assignment(self) -> list[TopicQueue]:
        """The queues this member owns now."""
        return sorted(self._fetcher.queues)

    def pause(self, *queues: TopicQueue) -> None:
        """Stop reading these owned queues (``poll`` returns none of their messages) until ``resume``;
        the member keeps them. A paused queue leaves with a rebalance like any other."""
        self._paused |= self._owned(queues)

    def resume(self, *queues: TopicQueue) -> None:
        """Read these queues again, from where reading stopped."""
        self._paused -= {queue_key(q) for q in queues}

    def paused(self) -> list[TopicQueue]:
        return sorted(self._paused)

    def seek(self, topic: str, queue_id: int, offset: int) -> None:
        """Read queue ``queue_id`` of ``topic`` (owned by this member) from ``offset`` on, below the
        group's committed offset too (a replay). ``commit`` then commits the new position if it is
        ahead of the committed one; a commit never moves the group's offset back, so a member that
        joins later starts at the highest offset committed (``rocketray admin reset-offset`` of the
        stopped group is what moves it back)."""
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidRequest(f"a seek offset must be an int >= 0, not {offset!r}")
        (key,) = self._owned([TopicQueue(topic, queue_id)])
        self._seek(key, offset)

    def seek_to_beginning(self, *queues: TopicQueue) -> None:
        """Read these owned queues (none given: every owned queue) from their first stored message."""
        for key in self._owned(queues or self.assignment()):
            self._seek(key, 0)

    def seek_to_end(self, *queues: TopicQueue) -> None:
        """Skip to the end of these owned queues (none given: every owned queue): only messages
        stored from now on are read."""
        keys = self._owned(queues or self.assignment())
        for key, end in self._fetcher.end_offsets(keys, self.config.request_timeout_ms / 1000).items():
            self._seek(key, end)

    def seek_to_time(self, timestamp_ms: int, *queues: TopicQueue) -> dict[TopicQueue, int]:
        """Read these owned queues (none given: every owned queue) from their first message stored
        at or after ``timestamp_ms`` (ms since the epoch; each queue's end when all its messages are
        older), as RocketMQ's searchOffset: the brokers binary-search their consume queues by store
        time. Returns the offset each queue was moved to."""
        keys = self._owned(queues or self.assignment())
        found = self._fetcher.offsets_for_time(keys, timestamp_ms, self.config.request_timeout_ms / 1000)
        for key, offset in found.items():
            self._seek(key, offset)
        return found

    def position(self, topic: str, queue_id: int) -> int | None:
        """The next offset this member reads of an owned queue (None until it is known)."""
        (key,) = self._owned([TopicQueue(topic, queue_id)])
        return self._fetcher.queues[key].next_offset

    def _seek(self, key: TopicQueue, offset: int) -> None:
        self._fetcher.seek(key, offset)
        self._redelivery.hold.drop(key)
        self._commits.sought(key, offset)

    def _owned(self, queues: Iterable[Any]) -> set[TopicQueue]:
        keys = {queue_key(q) for q in queues}
        missing = sorted(keys - set(self._fetcher.queues))
        if missing:
            raise InvalidRequest(f"{', '.join(map(str, missing))} not assigned to this member (assignment: "
                                 f"{', '.join(map(str, self.assignment())) or 'none yet: poll first'})")
        return keys

    # --- membership -------------------------------------------------------------------------------
    def _rebalance(self) -> None:
        """Own the queues the members and routes give this member now; the listener hears both sides."""
        members = self._membership.members
        wanted: dict[TopicQueue, str] = {}
        for topic in (*self.topics, self._retry_topic):
            try:
                route = self._routes.get(topic)
            except TopicNotFound:
                if topic != self._retry_topic:     # the retry topic exists from the group's first nack
                    log.warning("consumer %s: topic %r no longer exists; its queues are not read", self.client_id,
                                topic)
                continue
            except AccessDenied:
                if topic != self._retry_topic:     # a retry topic hidden from this user: others read it
                    raise
                continue
            for queue_id in allocate_averagely([q.queue_id for q in route.queues], members, self.client_id):
                wanted[TopicQueue(topic, queue_id)] = route.group_of(queue_id)
        revoked = sorted(set(self._fetcher.queues) - set(wanted))
        assigned = sorted(set(wanted) - set(self._fetcher.queues))
        if not (revoked or assigned):
            return
        self._tally.add("rebalances")
        errors = [e for e in [self._call_listener("on_revoked", revoked)] if e is not None]
        for key in revoked:
            self._fetcher.drop(key)
            self._redelivery.hold.drop(key)
            self._paused.discard(key)
        for key in assigned:
            self._fetcher.add(key, wanted[key])
        errors += [e for e in [self._call_listener("on_assigned", assigned)] if e is not None]
        log.info("consumer %s group=%s members=%d owns=%s", self.client_id, self.group, len(members),
                 [str(k) for k in self.assignment()])
        if errors:
            raise errors[0]

    def _call_listener(self, method: str, queues: Sequence[TopicQueue]) -> Exception | None:
        if self._listener is None or not queues:
            return None
        try:
            getattr(self._listener, method)(list(queues))
        except Exception as exc:  # noqa: BLE001 - the rebalance completes, then poll raises it
            log.warning("consumer %s: rebalance listener %s raised: %r", self.client_id, method, exc)
            return exc
        return None

    def metrics(self) -> ConsumerMetrics:
        """The consumer's counters now (``rocketray.client.metrics``)."""
        counts = self._tally.snapshot()
        lag = self._fetcher.lag()
        return ConsumerMetrics(counts["received"], counts["polls"], counts["committed"], counts["commit_failures"],
                               counts["rebalances"], len(self._fetcher.queues), sum(lag.values()), lag,
                               counts["nacked"], counts["dead_lettered"], len(self._redelivery.hold))

    def close(self) -> None:
        """Leave the group (its queues go to the other members at once), after the listener's
        ``on_revoked`` of every owned queue and every ``commit_async`` already made. Does not commit."""
        if self._closed:
            return
        self._closed = True
        error = self._call_listener("on_revoked", self.assignment())
        if error is not None:
            log.warning("consumer %s: on_revoked raised while closing: %r", self.client_id, error)
        self._membership.close()
        self._redelivery.close()
        self._commits.close()
        if self._owns_transport:
            self._transport.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed("consumer is closed")

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

