"""The transport of an application outside Ray: everything on the brokers' client ports.

:class:`PortTransport` needs only a :class:`~rocketray.client.bootstrap.Bootstrap`: one or more
brokers' client addresses, the cluster's CA and the application's user credential. Its control
plane uses the control frames every broker answers (``rocketray.wire.client_control``) on one
connection to a bootstrap broker (the next one when it fails): METADATA for the groups, their
brokers' client addresses, their masters and the cluster's client settings; one WATCH per group in
use, always outstanding, which the broker answers the moment the controllers apply a newer master;
CONTROL for the topic and consumer-group requests the controller leader answers. The data path is
:class:`~rocketray.client.port_data.PortData`'s, as for a Ray driver. Neither Ray nor Spark is
imported.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from rocketray.wire.client_control import (Metadata, decode_control_answer, decode_metadata, decode_watch_answer,
                                           encode_control, encode_watch)
from rocketray.wire.client_frames import Frame, FrameType, WireError, pack
from rocketray.client.bootstrap import Bootstrap
from rocketray.client.connections import Connection, ConnectionLost, Dialer, user_login
from rocketray.client.errors import AuthenticationFailed, ClusterNotFound
from rocketray.client.port_data import PortData
from rocketray.wire.controller_api import Response

__all__ = ["PortTransport"]

log = logging.getLogger("rocketray.client")

WATCH_WAIT_MS = 20_000        # one WATCH's wait at the broker (re-armed when it answers)
RETRY_S = 0.2                 # between tries of the bootstrap brokers when none answered


class PortTransport(PortData):
    """See the module docstring. Thread-safe."""

    def __init__(self, bootstrap: Bootstrap, timeout_s: float = 10.0) -> None:
        self.bootstrap = bootstrap
        self._timeout_s = timeout_s
        self._init_ports(Dialer(bootstrap.trust, user_login(bootstrap.user, bootstrap.secret)))
        self._lock = threading.Condition()
        self._control: Connection | None = None
        self._next_server = 0
        self._metadata: Metadata | None = None
        self._master: dict[str, int] = {}
        self._epochs: dict[str, int] = {}
        self._named_at: dict[str, float] = {}
        self._watched: set[str] = set()
        self._armed: set[str] = set()
        self._closed = False
        self._refresh_metadata()
        self._watcher = threading.Thread(target=self._watch_loop, name="rocketray-watch", daemon=True)
        self._watcher.start()

    # --- the control connection -------------------------------------------------------------------
    def _control_connection(self) -> Connection:
        """The control connection, opened to the next bootstrap broker that answers."""
        with self._lock:
            conn = self._control
        if conn is not None and conn.closed is None:
            return conn
        errors = []
        for _ in range(len(self.bootstrap.addresses)):
            with self._lock:
                address = self.bootstrap.addresses[self._next_server % len(self.bootstrap.addresses)]
                self._next_server += 1
            try:
                conn = Connection(address, self._dialer)
            except AuthenticationFailed:
                raise                   # the credential, not the broker: the next one refuses it too
            except OSError as exc:
                errors.append(f"{address[0]}:{address[1]}: {exc!r}")
                continue
            with self._lock:
                self._control, self._armed = conn, set()
            return conn
        raise ConnectionLost("no bootstrap broker answered: " + "; ".join(errors))

    def _ask(self, frame_type: FrameType, body: bytes, timeout_s: float | None = None) -> Frame:
        deadline = time.monotonic() + (timeout_s or self._timeout_s)
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                answer = self._control_connection().request(frame_type, body).result(max(0.0, deadline - time.monotonic()))
            except AuthenticationFailed:
                raise
            except Exception as exc:  # noqa: BLE001 - a lost connection, a timeout: the next broker
                last = exc
                time.sleep(RETRY_S)
                continue
            if answer.type is FrameType.ERROR:
                raise ConnectionLost(f"the broker refused the request: {answer.body!r:.200}")
            return answer
        raise ConnectionLost(f"no answer from the bootstrap brokers in time ({last!r})")

    # --- metadata and masters ---------------------------------------------------------------------
    def _refresh_metadata(self) -> Metadata:
        try:
            md = decode_metadata(self._ask(FrameType.METADATA, pack([])).body)
        except (ConnectionLost, WireError) as exc:
            raise ClusterNotFound(f"cluster {self.bootstrap.cluster!r}: {exc}") from None
        with self._lock:
            self._metadata = md
            for view in md.groups:
                self._learn(view.group, view.epoch, view.master)
        return md

    def _learn(self, group: str, epoch: int, master: int | None) -> None:
        """Take a master the cluster named for ``group`` at ``epoch`` (lock held)."""
        if epoch <= self._epochs.get(group, -1):
            return
        self._epochs[group] = epoch
        self._named_at[group] = time.monotonic()
        if master is None:
            self._master.pop(group, None)
        else:
            self._master[group] = master
        self._lock.notify_all()

    def groups(self) -> list[str]:
        md = self._metadata or self._refresh_metadata()
        return [g.group for g in md.groups]

    def config(self) -> Any:
        from rocketray.config import RocketrayConfig

        md = self._metadata or self._refresh_metadata()
        return RocketrayConfig().with_overrides({f"client.{k}": v for k, v in md.client.items()})

    def master(self, group: str) -> int | None:
        with self._lock:
            self._watched.add(group)
            cached = self._master.get(group)
        if cached is not None:
            return cached
        try:
            self._refresh_metadata()
        except ClusterNotFound as exc:
            log.info("metadata not refreshed: %s", exc)
        with self._lock:
            return self._master.get(group)

    def forget_master(self, group: str) -> None:
        with self._lock:
            self._master.pop(group, None)

    def named_at(self, group: str) -> float:
        with self._lock:
            return self._named_at.get(group, float("-inf"))

    def await_new_master(self, group: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._watched.add(group)
            epoch = self._epochs.get(group, -1)
            while self._epochs.get(group, -1) <= epoch:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return False
                self._lock.wait(left)
            return group in self._master

    def _master_moved(self, group: str, replica: int) -> bool:
        with self._lock:
            named = self._master.get(group)
        return named is not None and named != replica

    def _client_address(self, group: str, replica: int) -> tuple[str, int] | None:
        md = self._metadata or self._refresh_metadata()
        view = md.group(group)
        return None if view is None else view.address_of(replica)

    def _watch_loop(self) -> None:
        """Keep one WATCH outstanding per group in use, on the control connection."""
        while True:
            with self._lock:
                if self._closed:
                    return
                todo = [(g, self._epochs.get(g, -1)) for g in self._watched - self._armed]
                self._armed |= {g for g, _ in todo}
            for group, epoch in todo:
                try:
                    fut = self._control_connection().request(FrameType.WATCH, encode_watch(group, epoch, WATCH_WAIT_MS))
                except ConnectionLost:
                    with self._lock:
                        self._armed.discard(group)
                    continue
                fut.add_done_callback(lambda f, g=group: self._watched_answer(g, f))
            with self._lock:
                self._lock.wait(0.05 if self._watched - self._armed else 1.0)

    def _watched_answer(self, group: str, fut: Any) -> None:
        try:
            epoch, master = decode_watch_answer(fut.result().body)
        except Exception as exc:  # noqa: BLE001 - a lost connection: the loop arms it again
            log.debug("watch of %s ended: %r", group, exc)
            epoch, master = -1, None
        with self._lock:
            self._armed.discard(group)
            self._learn(group, epoch, master)
            self._lock.notify_all()

    # --- controller requests ----------------------------------------------------------------------
    def call_controller(self, request: Any, timeout_s: float = 10.0) -> Response:
        return decode_control_answer(self._ask(FrameType.CONTROL, encode_control(request), timeout_s).body)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conn, self._control = self._control, None
            self._lock.notify_all()
        if conn is not None:
            conn.close("transport closed")
        PortData.close(self)
