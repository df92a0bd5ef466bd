"""The broker actor's client port: producers and consumers over TLS, not Ray calls.

A RocketMQ broker serves clients on its remoting port; here each broker actor serves them on its own
TCP port (``BrokerSpec.client_port``) from the same event loop that runs its store, HA service and
controller loop, so a put or a pull costs one socket round trip instead of a Ray actor call. Ray
still places, restarts and discovers the actors; this port only moves the bytes.

The port is a border (``rocketray.border``): a connection is counted against the listener's and its
address's limits from its accept; within ``limits.preauth_timeout_ms`` it completes TLS (the
broker's member certificate; the client verifies it names a broker of the cluster it wants and
presents none of its own) and authenticates its user (``ClientAuthenticator``); then frames of
``rocketray.wire.client_frames``, handled in the transport's read event (``rocketray.direct_reads``:
no loop pass between the socket and the frame). A put runs in that step (``put_start``: checked,
appended and written to the slaves before the next frame is read, so puts are appended in arrival
order) and its answer leaves from the event that decides it (the slaves' acks); a pull too
(``pull_start``: answered at once, or from the step that confirms a message for it); every other
request is served in a task of its own. Answers may leave out of order (a held pull never delays a
put behind it). A connection may have ``limits.max_inflight_requests`` requests in service and a
bounded amount of unsent answers (``rocketray.border.flow_decision``): beyond them it stops reading,
and a peer that does not read its answers for ``limits.write_deadline_ms`` is disconnected as a slow
consumer. A frame that does not decode gets an ERROR frame and its connection is closed; nothing
else is touched.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Callable, Protocol

from rocketray.acl import AccessDecision, Action, ResourceType
from rocketray.border import Border, Flow, LimitsConfig, flow_decision, install_accept_error_filter
from rocketray.wire.batch import EncodedBatch, TopicRefused
from rocketray.broker.client_access import (Need, first_denied, group_needs, guarded, needs, pull_needs,
                                            route_visible)
from rocketray.wire.client_control import (Metadata, decode_control, decode_watch, encode_control_answer,
                                           encode_metadata, encode_watch_answer)
from rocketray.wire.client_frames import (Frame, FrameDecoder, FrameType, WireError, answer_type, encode_frame,
                                          decode_commit_request, decode_pull_request, decode_put_request,
                                          decode_search_request,
                                          encode_offsets_answer, encode_pull_answer, encode_put_answer, pack,
                                          unpack)
from rocketray.wire.pull_result import OffsetsResult, OffsetsStatus, PullResult, PullStatus
from rocketray.wire.controller_api import GetTopicRouteRequest, ListTopicsRequest, Response
from rocketray.wire.controller_codes import ResponseCode
from rocketray.wire.controller_headers import ListTopicsResponseHeader
from rocketray.direct_reads import DirectReads
from rocketray.listener import start_listener
from rocketray.wire.put_result import PutResult, PutStatus
from rocketray.ha.ack import refused

__all__ = ["ClientPort", "ClientEndpoints", "ClientAuthenticator", "ControlEndpoints", "Principal"]

log = logging.getLogger("rocketray.broker")

READ_CHUNK = 1 << 20
JOIN_BYTES = 64 << 10      # an answer smaller than this is written as one buffer (one TLS record)


class ClientEndpoints(Protocol):
    """What the port serves (``actors/broker_service.BrokerService``)."""

    def put_start(self, batch: EncodedBatch, done: Callable[[PutResult], object]) -> PutResult | None: ...

    def pull_start(self, topic: str, queue_id: int, queue_offset: int, max_count: int, max_bytes: int,
                   hold_ms: int, group: str | None, done: Callable[[PullResult], object],
                   tag_filter: str | None = None) -> PullResult | None: ...

    async def commit_offsets(self, group: str, entries: list[tuple[str, int, int]],
                             reset: bool = False) -> PutResult: ...

    async def committed_offsets(self, group: str, topics: list[str] | None = None) -> OffsetsResult: ...

    async def queue_max_offsets(self, queues: list[tuple[str, int]]) -> tuple[tuple[str, int, int], ...]: ...

    async def search_offsets(self, queues: list[tuple[str, int]],
                             timestamp_ms: int) -> tuple[tuple[str, int, int], ...]: ...


class ControlEndpoints(Protocol):
    """What the port's control frames ask (``actors/client_control.ClientControl``)."""

    async def metadata(self) -> Metadata: ...

    async def watch(self, group: str, known_epoch: int, wait_ms: int) -> tuple[int, int | None]: ...

    async def control(self, request: object) -> Response: ...


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a client connection authenticated as."""

    user: str
    superuser: bool = False


Authorizer = Callable[[Principal, ResourceType, str, Action], AccessDecision]


class ClientAuthenticator(Protocol):
    """Authenticates a user on a new connection (after TLS); raises on failure (the connection is
    then closed). Returns the principal and the bytes that arrived after the exchange."""

    async def __call__(self, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> tuple[Principal, bytes]: ...


class _Flow:
    """One connection's requests in service and unsent answers (``rocketray.border.flow_decision``)."""

    __slots__ = ("_transport", "_limits", "_on_close", "inflight", "_paused", "_stalled_since", "_timer", "closed")

    def __init__(self, transport: asyncio.Transport, limits: LimitsConfig, on_close: Callable[[str], None]) -> None:
        self._transport = transport
        self._limits = limits
        self._on_close = on_close
        self.inflight = 0
        self._paused = False
        self._stalled_since: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.closed = False

    def started(self) -> None:
        self.inflight += 1
        self.check()

    def finished(self) -> None:
        self.inflight -= 1
        self.check()

    def check(self) -> None:
        if self.closed:
            return
        unsent = self._transport.get_write_buffer_size()
        now = time.monotonic()
        if unsent > self._limits.max_unsent_bytes // 4:
            if self._stalled_since is None:
                self._stalled_since = now
        else:
            self._stalled_since = None
        stalled_ms = 0.0 if self._stalled_since is None else (now - self._stalled_since) * 1000
        decision = flow_decision(unsent, self.inflight, stalled_ms, self._limits)
        if decision is Flow.CLOSE:
            self.closed = True
            self._on_close(f"slow consumer: {unsent} bytes of answers unread for {stalled_ms:.0f} ms")
            return
        paused = decision is Flow.PAUSE
        if paused != self._paused:
            self._paused = paused
            (self._transport.pause_reading if paused else self._transport.resume_reading)()
        if self._stalled_since is not None and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._limits.write_deadline_ms / 4000, self._recheck)

    def _recheck(self) -> None:
        self._timer = None
        self.check()

    def stop(self) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()


class ClientPort:
    """An asyncio server of client frames for one broker (see the module docstring)."""

    def __init__(self, endpoints: ClientEndpoints, authenticate: ClientAuthenticator,
                 server_context: ssl.SSLContext | None, limits: LimitsConfig = LimitsConfig(),
                 control: ControlEndpoints | None = None, authorize: Authorizer | None = None) -> None:
        """``server_context``: the broker's TLS context for clients (None: plain TCP, development);
        ``control``: who answers METADATA, WATCH and CONTROL (None: those frames are refused);
        ``authorize(principal, resource type, name, action)``: the user's ACL (None: everything
        allowed, for tests of the transport alone)."""
        self._endpoints = endpoints
        self._control = control
        self._authorize = authorize
        self._authenticate = authenticate
        self._context = server_context
        self._limits = limits
        self.border = Border("client port", limits, log)
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()
        self.rejected = 0
        self.slow_consumers = 0
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        install_accept_error_filter(asyncio.get_running_loop(), self._limits.log_interval_ms, log)
        self._server = await start_listener(self._connection, host, port, border=self.border,
                                            ssl_context=self._context,
                                            handshake_timeout_s=self._limits.preauth_timeout_ms / 1000,
                                            limit=READ_CHUNK)
        self.port = self._server.sockets[0].getsockname()[1]
        self.border.name = f"client port {host}:{self.port}"
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            principal, leftover = await asyncio.wait_for(self._authenticate(reader, writer),
                                                         self._limits.preauth_timeout_ms / 1000)
        except (Exception, asyncio.TimeoutError) as exc:  # noqa: BLE001 - any failure closes this connection only
            self.rejected += 1
            reason = "timed out" if isinstance(exc, asyncio.TimeoutError) else f"{type(exc).__name__}: {exc}"
            self.border.log.log(logging.WARNING, "unauthenticated",
                                "client port: dropping unauthenticated peer %s: %s", peer, reason)
            writer.close()
            return
        decoder = FrameDecoder()
        loop = asyncio.get_running_loop()
        access = _Access(principal, self._authorize)

        def slow(reason: str) -> None:
            self.slow_consumers += 1
            log.warning("client port: closing %s (user %s): %s", peer, principal.user, reason)
            writer.transport.abort()

        flow = _Flow(writer.transport, self._limits, slow)

        def on_data(data: bytes) -> None:
            """Every whole frame, in the transport's read event: a put or a pull is started in this
            step, anything else as a task; a malformed frame gets its ERROR and the close."""
            request_id = 0          # the frame being handled: a malformed one's ERROR answers it
            try:
                for frame in decoder.feed(data):
                    request_id = frame.request_id
                    if frame.type is FrameType.PUT:
                        self._put(frame, writer, flow, access)
                    elif frame.type is FrameType.PULL:
                        self._pull(frame, writer, flow, access)
                    else:
                        flow.started()
                        task = loop.create_task(self._serve(frame, writer, flow, access))
                        self._tasks.add(task)
                        task.add_done_callback(self._tasks.discard)
                    request_id = 0      # a frame that does not decode has no id of its own
            except WireError as exc:
                self._refuse(writer, request_id, exc, peer)

        try:
            error = await DirectReads(reader, writer, on_data, leftover).closed
            if error is not None and not isinstance(error, (ConnectionError, ssl.SSLError)):
                log.error("client port: connection from %s failed: %r", peer, error)
        except asyncio.CancelledError:
            pass
        finally:
            flow.stop()
            if not writer.is_closing():
                writer.close()

    def _refuse(self, writer: asyncio.StreamWriter, request_id: int, exc: Exception, peer: object) -> None:
        log.warning("client port: closing %s after a malformed frame: %s", peer, exc)
        if not writer.is_closing():
            writer.writelines(encode_frame(FrameType.ERROR, request_id, pack([1, str(exc)])))
            writer.close()

    @staticmethod
    def _write(writer: asyncio.StreamWriter, flow: _Flow, buffers: list[bytes | memoryview]) -> None:
        if not writer.is_closing():
            if sum(map(len, buffers)) < JOIN_BYTES:
                writer.write(b"".join(buffers))     # one TLS record, not one per buffer
            else:
                writer.writelines(buffers)
        flow.finished()

    def _put(self, frame: Frame, writer: asyncio.StreamWriter, flow: _Flow, access: "_Access") -> None:
        """A put in the read loop's own step, no task: appended (and sent to the slaves) before the
        next frame is read, answered from the event that decides it; the seal asks the user's ACL
        for Pub on each topic it finds (nothing is written if one is refused). Raises WireError."""
        request_id = frame.request_id
        count, data = decode_put_request(frame.body)
        flow.started()

        def answer(result: PutResult) -> None:
            self._write(writer, flow, encode_frame(FrameType.PUT_ANSWER, request_id, encode_put_answer(result)))

        refusal = self._endpoints.put_start(EncodedBatch(data, count, access.topic_check()), answer)
        if refusal is not None:
            answer(refusal)

    def _pull(self, frame: Frame, writer: asyncio.StreamWriter, flow: _Flow, access: "_Access") -> None:
        """A pull in the read loop's own step, no task: answered now, or held and answered from the
        step that confirms a message for it (``ConsumerPath.pull_start``). Raises WireError."""
        request_id = frame.request_id
        r = decode_pull_request(frame.body)
        flow.started()

        def answer(result: PullResult) -> None:
            self._write(writer, flow, encode_frame(FrameType.PULL_ANSWER, request_id, *encode_pull_answer(result)))

        denied = access.first_denied(pull_needs(r.topic, r.group))
        if denied is not None:
            answer(PullResult(PullStatus.ACCESS_DENIED, b"", 0, r.offset, r.offset, -1, str(denied)))
            return
        now = self._endpoints.pull_start(r.topic, r.queue_id, r.offset, r.max_count, r.max_bytes, r.hold_ms, r.group,
                                         answer, r.tag_filter)
        if now is not None:
            answer(now)

    async def _serve(self, frame: Frame, writer: asyncio.StreamWriter, flow: _Flow, access: "_Access") -> None:
        try:
            body = await self._answer(frame, access)
        except WireError as exc:
            flow.finished()
            self._refuse(writer, frame.request_id, exc, writer.get_extra_info("peername"))
            return
        self._write(writer, flow, encode_frame(answer_type(frame.type), frame.request_id, *body))

    async def _answer(self, frame: Frame, access: "_Access") -> list[bytes]:
        e = self._endpoints
        if frame.type is FrameType.COMMIT:
            group, entries, reset = decode_commit_request(frame.body)
            denied = access.first_denied(group_needs(group, (x[0] for x in entries)))
            if denied is not None:
                log.info("client port: %s", denied)
                return [encode_put_answer(refused(PutStatus.ACCESS_DENIED))]
            return [encode_put_answer(await e.commit_offsets(group, entries, reset))]
        if frame.type is FrameType.COMMITTED:
            group, topics = _pair(unpack(frame.body, "committed"), "committed")
            if not isinstance(group, str) or not (topics is None or isinstance(topics, list)):
                raise WireError("committed: expected [group, [topic, ...] or nil]")
            denied = access.first_denied(group_needs(group, (str(t) for t in topics or ())))
            if denied is not None:
                return [encode_offsets_answer(OffsetsResult(OffsetsStatus.ACCESS_DENIED, (), (), str(denied)))]
            return [encode_offsets_answer(await e.committed_offsets(group, topics))]
        if frame.type is FrameType.QUEUE_MAX:
            queues = unpack(frame.body, "queue max")
            if not isinstance(queues, list) or not all(isinstance(q, list) and len(q) == 2 for q in queues):
                raise WireError("queue max: expected [[topic, queue_id], ...]")
            readable = [(str(t), int(q)) for t, q in queues if access.allows(ResourceType.TOPIC, str(t), Action.SUB)]
            return [pack([list(r) for r in await e.queue_max_offsets(readable)])]
        if frame.type is FrameType.SEARCH_OFFSET:
            wanted, timestamp_ms = decode_search_request(frame.body)
            readable = [(t, q) for t, q in wanted if access.allows(ResourceType.TOPIC, t, Action.SUB)]
            return [pack([list(r) for r in await e.search_offsets(readable, timestamp_ms)])]
        control = self._control
        if control is not None and frame.type is FrameType.METADATA:
            return [encode_metadata(await control.metadata())]
        if control is not None and frame.type is FrameType.WATCH:
            return [encode_watch_answer(*await control.watch(*decode_watch(frame.body)))]
        if control is not None and frame.type is FrameType.CONTROL:
            return [encode_control_answer(await self._controller_request(control, decode_control(frame.body), access))]
        raise WireError(f"{frame.type.name} is not a request")

    @staticmethod
    async def _controller_request(control: ControlEndpoints, request: object, access: "_Access") -> Response:
        """A client's controller request, checked against the user's ACL (``broker.client_access``):
        refused with NO_PERMISSION naming the resource and action; a listing keeps only the topics
        the user may see."""
        if isinstance(request, GetTopicRouteRequest):
            decision = access.route(request.topic)
            denied = None if decision is None or decision.allowed else decision
        else:
            denied = access.first_denied(needs(request))
        if denied is not None:
            log.info("client port: %s", denied)
            return Response.error(ResponseCode.NO_PERMISSION, str(denied))
        response = await control.control(request)
        if isinstance(request, ListTopicsRequest) and isinstance(response.header, ListTopicsResponseHeader):
            visible = tuple((t, n) for t, n in response.header.topics if access.sees_route(t))
            response = dataclasses.replace(response, header=ListTopicsResponseHeader(visible))
        return response


class _Access:
    """One connection's user and ACL (``authorize`` None: everything allowed), the scheduler's names
    reserved (``client_access.guarded``)."""

    __slots__ = ("principal", "_decide")

    def __init__(self, principal: Principal, authorize: Authorizer | None) -> None:
        self.principal = principal
        self._decide = None if authorize is None else guarded(
            lambda t, n, a: authorize(principal, t, n, a), principal.user)

    def decide(self, resource_type: ResourceType, name: str, action: Action) -> AccessDecision | None:
        return None if self._decide is None else self._decide(resource_type, name, action)

    def allows(self, resource_type: ResourceType, name: str, action: Action) -> bool:
        decision = self.decide(resource_type, name, action)
        return decision is None or decision.allowed

    def first_denied(self, pairs: list[Need]) -> AccessDecision | None:
        return None if self._decide is None else first_denied(self._decide, pairs)

    def route(self, topic: str) -> AccessDecision | None:
        return None if self._decide is None else route_visible(self._decide, topic)

    def sees_route(self, topic: str) -> bool:
        decision = self.route(topic)
        return decision is None or decision.allowed

    def topic_check(self) -> Callable[[str], None] | None:
        """The put's check of each topic its batch holds (Pub; on ``%SCHEDULE%<topic>``, a delayed
        message's, Pub on ``<topic>``), for ``EncodedBatch.topic_check``."""
        if self._decide is None:
            return None

        def check(topic: str) -> None:
            decision = self.decide(ResourceType.TOPIC, topic, Action.PUB)
            if decision is not None and not decision.allowed:
                log.info("client port: %s", decision)
                raise TopicRefused(str(decision))

        return check


def _pair(value: object, what: str) -> tuple:
    if not (isinstance(value, list) and len(value) == 2):
        raise WireError(f"{what}: expected a pair")
    return value[0], value[1]
