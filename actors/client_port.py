"""The broker actor's client port: producers and consumers over an authenticated socket, not Ray calls.

A RocketMQ broker serves clients on its remoting port; here each broker actor serves them on its own
TCP port (``BrokerSpec.client_port``) from the same event loop that runs its store, HA service and
controller loop, so a put or a pull costs one socket round trip instead of a Ray actor call. Ray
still places, restarts and discovers the actors; this port only moves the bytes.

Each connection first runs the mutual challenge/response with the cluster secret
(``rocketray.auth``, ``CLIENT_LABEL``); then frames of ``rocketray.broker.client_wire``, handled
in the transport's read event (``rocketray.direct_reads``: no loop pass between the socket and the
frame). A put runs in that step (``put_start``: checked, appended and written to the slaves
before the next frame is read, so puts are appended in arrival order) and its answer leaves from
the event that decides it (the slaves' acks); a pull too (``pull_start``: answered at once, or
from the step that confirms a message for it); every other request is served in a task of its
own. Answers may leave out of order (a held pull never delays a put behind it). A frame that does
not decode gets an ERROR frame and its connection is closed; nothing else is touched.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Callable, Protocol

from rocketray.auth import CLIENT_LABEL, AuthError, authenticate
from rocketray.broker.batch import EncodedBatch
from rocketray.broker.client_wire import (Frame, FrameDecoder, FrameType, WireError, answer_type, encode_frame,
                                          decode_put_request, encode_offsets_answer, encode_pull_answer,
                                          encode_put_answer, pack, unpack)
from rocketray.broker.pull import OffsetsResult, PullResult
from rocketray.direct_reads import DirectReads
from rocketray.ha.ack import PutResult

log = logging.getLogger("rocketray.broker")

READ_CHUNK = 1 << 20


class ClientEndpoints(Protocol):
    """What the port serves (``actors/broker_service.BrokerService``)."""

    def put_start(self, batch: EncodedBatch, done: Callable[[PutResult], object]) -> PutResult | None: ...

    def pull_start(self, topic: str, queue_id: int, queue_offset: int, max_count: int, max_bytes: int,
                   hold_ms: int, group: str | None, done: Callable[[PullResult], object]) -> PullResult | None: ...

    async def commit_offsets(self, group: str, entries: list[tuple[str, int, int]]) -> PutResult: ...

    async def committed_offsets(self, group: str, topics: list[str] | None = None) -> OffsetsResult: ...

    async def queue_max_offsets(self, queues: list[tuple[str, int]]) -> tuple[tuple[str, int, int], ...]: ...


class ClientPort:
    """An asyncio server of client frames for one broker (see the module docstring)."""

    def __init__(self, endpoints: ClientEndpoints, secret: str | bytes, auth_timeout_ms: int = 5000) -> None:
        if not secret:
            raise ValueError("the client port needs the cluster secret")
        self._endpoints = endpoints
        self._secret = secret
        self._auth_timeout_ms = auth_timeout_ms
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()
        self.rejected = 0
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._on_accept, host, port, limit=READ_CHUNK)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()

    async def _on_accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            leftover = await authenticate(reader, writer, "server", self._secret, self._auth_timeout_ms, CLIENT_LABEL)
        except (AuthError, asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError) as exc:
            self.rejected += 1
            log.warning("client port: dropping unauthenticated peer %s: %s", peer, exc)
            writer.close()
            return
        decoder = FrameDecoder()
        loop = asyncio.get_running_loop()

        def on_data(data: bytes) -> None:
            """Every whole frame, in the transport's read event: a put or a pull is started in this
            step, anything else as a task; a malformed frame gets its ERROR and the close."""
            request_id = 0          # the frame being handled: a malformed one's ERROR answers it
            try:
                for frame in decoder.feed(data):
                    request_id = frame.request_id
                    if frame.type is FrameType.PUT:
                        self._put(frame, writer)
                    elif frame.type is FrameType.PULL:
                        self._pull(frame, writer)
                    else:
                        task = loop.create_task(self._serve(frame, writer))
                        self._tasks.add(task)
                        task.add_done_callback(self._tasks.discard)
                    request_id = 0      # a frame that does not decode has no id of its own
            except WireError as exc:
                self._refuse(writer, request_id, exc, peer)

        try:
            error = await DirectReads(reader, writer, on_data, leftover).closed
            if error is not None and not isinstance(error, ConnectionError):
                log.error("client port: connection from %s failed: %r", peer, error)
        except asyncio.CancelledError:
            pass
        finally:
            if not writer.is_closing():
                writer.close()

    def _refuse(self, writer: asyncio.StreamWriter, request_id: int, exc: Exception, peer: object) -> None:
        log.warning("client port: closing %s after a malformed frame: %s", peer, exc)
        if not writer.is_closing():
            writer.writelines(encode_frame(FrameType.ERROR, request_id, pack([1, str(exc)])))
            writer.close()

    def _put(self, frame: Frame, writer: asyncio.StreamWriter) -> None:
        """A put in the read loop's own step, no task: appended (and sent to the slaves) before the
        next frame is read, answered from the event that decides it. Raises WireError."""
        request_id = frame.request_id
        count, data = decode_put_request(frame.body)

        def answer(result: PutResult) -> None:
            if not writer.is_closing():
                writer.writelines(encode_frame(FrameType.PUT_ANSWER, request_id, encode_put_answer(result)))

        refusal = self._endpoints.put_start(EncodedBatch(data, count), answer)
        if refusal is not None:
            answer(refusal)

    def _pull(self, frame: Frame, writer: asyncio.StreamWriter) -> None:
        """A pull in the read loop's own step, no task: answered now, or held and answered from the
        step that confirms a message for it (``ConsumerPath.pull_start``). Raises WireError."""
        request_id = frame.request_id
        args = unpack(frame.body, "pull")
        if not (isinstance(args, list) and len(args) == 7 and isinstance(args[0], str)
                and all(isinstance(a, int) and not isinstance(a, bool) for a in args[1:6])
                and (args[6] is None or isinstance(args[6], str))):
            raise WireError("pull: expected [topic, queue_id, offset, max_count, max_bytes, hold_ms, group]")

        def answer(result: PullResult) -> None:
            if not writer.is_closing():
                writer.writelines(encode_frame(FrameType.PULL_ANSWER, request_id, *encode_pull_answer(result)))

        now = self._endpoints.pull_start(*args, answer)
        if now is not None:
            answer(now)

    async def _serve(self, frame: Frame, writer: asyncio.StreamWriter) -> None:
        try:
            body = await self._answer(frame)
        except WireError as exc:
            self._refuse(writer, frame.request_id, exc, writer.get_extra_info("peername"))
            return
        if not writer.is_closing():
            writer.writelines(encode_frame(answer_type(frame.type), frame.request_id, *body))

    async def _answer(self, frame: Frame) -> list[bytes]:
        e = self._endpoints
        if frame.type is FrameType.COMMIT:
            group, entries = _pair(unpack(frame.body, "commit"), "commit")
            if not isinstance(group, str) or not isinstance(entries, list):
                raise WireError("commit: expected [group, [[topic, queue_id, offset], ...]]")
            return [encode_put_answer(await e.commit_offsets(group, [tuple(x) for x in entries if isinstance(x, list)]))]
        if frame.type is FrameType.COMMITTED:
            group, topics = _pair(unpack(frame.body, "committed"), "committed")
            if not isinstance(group, str) or not (topics is None or isinstance(topics, list)):
                raise WireError("committed: expected [group, [topic, ...] or nil]")
            return [encode_offsets_answer(await e.committed_offsets(group, topics))]
        if frame.type is FrameType.QUEUE_MAX:
            queues = unpack(frame.body, "queue max")
            if not isinstance(queues, list) or not all(isinstance(q, list) and len(q) == 2 for q in queues):
                raise WireError("queue max: expected [[topic, queue_id], ...]")
            return [pack([list(r) for r in await e.queue_max_offsets([(str(t), int(q)) for t, q in queues])])]
        raise WireError(f"{frame.type.name} is not a request")


def _pair(value: object, what: str) -> tuple:
    if not (isinstance(value, list) and len(value) == 2):
        raise WireError(f"{what}: expected a pair")
    return value[0], value[1]

