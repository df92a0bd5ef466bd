"""One controller node in its own OS process, and the authenticated client protocol to reach it.

Theory of operation. The chaos runner needs nodes it can SIGKILL, SIGSTOP and restart, so each
``ControllerNode`` runs in a child process started with ``python -m rocketray.controller.proc``.
The child reads its member credentials (the cluster CA, its certificate and key, the members'
secret) as one JSON line from its stdin (never argv: argv is world-readable), starts the node (Raft
on its own address, peers as the proxy plan says), listens for clients on an ephemeral loopback
port, prints one JSON line ``{"ready": true, "client_port": ...}`` and serves until killed.

The wire (authenticated msgpack frames) and the blocking client are ``rocketray.controller.proc_wire``.
Request bodies are maps ``{"id", "op", "args"}``; ops: ``status`` (``node.metadata()``), ``state``
(the replicated tables), ``request`` (one controller API call, see ``build_request``).

A ``request`` answer is ``{"code", "header_type", "header", "body", "remark", ...}``: the header as its
class name and fields (``rocketray.wire.controller_headers.header_fields``; the client rebuilds it with
``header_from_fields``, which refuses anything malformed). ``request`` adds what the runner's checks
need: the Raft term observed just before and just after ``handle`` and whether the node was a ready
leader before it was called. A node that is not a ready leader answers 2007 with ``precheck: true``
*without calling handle*, so such an answer definitely had no effect; a 2007 from inside ``handle``
may come after the events were appended (leadership lost while waiting for the commit) and is an
unknown outcome for a write.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import selectors
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from rocketray.wire.controller_headers import NotLeaderResponseHeader, header_fields
from rocketray.controller.proc_wire import MAX_CONNECTIONS, NOT_LEADER, Lost, NodeClient, NotSent, serve_connection
from rocketray.tls import CertificateAuthority, Identity, MemberCredentials

CLUSTER = "chaos"

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from rocketray.controller.config import ControllerConfig
    from rocketray.controller.node import ControllerNode


# -- server side ----------------------------------------------------------------------------------

def build_request(args: dict[str, Any]) -> Any:
    """A controller API request from a plain map (only the operations the chaos workload uses)."""
    from rocketray.wire.controller_api import (AlterSyncStateSetRequest, ApplyBrokerIdRequest, ElectMasterRequest,
                                               GetReplicaInfoRequest, RegisterBrokerRequest)
    kind, name = args["type"], str(args["broker_name"])
    if kind == "read":
        return GetReplicaInfoRequest(name)
    if kind == "elect":
        broker_id = int(args["broker_id"])
        if broker_id < 0:
            return ElectMasterRequest.of_controller_trigger(name)
        if args.get("designate"):
            return ElectMasterRequest.of_admin_trigger(CLUSTER, name, broker_id)
        return ElectMasterRequest.of_broker_trigger(CLUSTER, name, broker_id)
    if kind == "alter":
        return AlterSyncStateSetRequest(name, int(args["master_id"]), int(args["master_epoch"]),
                                        frozenset(int(b) for b in args["new_sss"]), int(args["sss_epoch"]))
    if kind == "apply":
        return ApplyBrokerIdRequest(CLUSTER, name, int(args["broker_id"]), str(args["check_code"]))
    if kind == "register":
        return RegisterBrokerRequest(CLUSTER, name, int(args["broker_id"]), str(args["address"]))
    raise ValueError(f"unknown request type {kind!r}")


class _Handler(socketserver.BaseRequestHandler):
    server: "_Server"

    def handle(self) -> None:
        serve_connection(self.request, self.server.secret, self.server.dispatch, log.warning)


class _Server(socketserver.ThreadingTCPServer):
    """The node's runner port: one thread per connection, at most ``MAX_CONNECTIONS`` of them."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], node: Any, secret: bytes) -> None:
        super().__init__(address, _Handler)
        self.node = node
        self.secret = secret
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            log.warning("runner port full (%d connections): refusing %s", MAX_CONNECTIONS, client_address)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def meta(self) -> dict[str, Any]:
        """``node.metadata()``, retried: it reads pysyncobj's journal while the tick thread may be
        compacting it, which can raise (e.g. IndexError) for a moment."""
        for attempt in range(20):
            try:
                return self.node.metadata()
            except (IndexError, KeyError, RuntimeError):
                if attempt == 19:
                    raise
                time.sleep(0.005)
        raise AssertionError("unreachable")

    def dispatch(self, op: str, args: dict[str, Any]) -> Any:
        node = self.node
        if op == "status":
            # is_leader is sampled between the two term reads; it is a claim on a term only if
            # the term did not move in between (terms only grow).
            term_before = self.meta()["term"]
            meta = self.meta()
            meta["leader_term_claim"] = meta["term"] if meta["is_leader"] and meta["term"] == term_before else None
            return meta
        if op == "state":
            return {"state": node.snapshot_state(), "meta": self.meta()}
        if op == "request":
            return self._request(args)
        if op == "events":
            return node.events(int(args.get("after", 0)), int(args.get("limit", 10_000)))
        raise ValueError(f"unknown op {op!r}")

    def _request(self, args: dict[str, Any]) -> dict[str, Any]:
        node = self.node
        request = build_request(args)
        term_before = self.meta()["term"]
        if not node.is_leader():
            meta = self.meta()
            hint = NotLeaderResponseHeader(meta["leader_address"])
            return {"code": NOT_LEADER, "header_type": type(hint).__name__, "header": header_fields(hint),
                    "body": None, "remark": "not a ready leader (checked before handle)", "precheck": True,
                    "term_before": term_before, "term_after": meta["term"]}
        response = node.handle(request)
        return {"code": int(response.code), "header_type": type(response.header).__name__,
                "header": header_fields(response.header), "body": response.body, "remark": response.remark,
                "precheck": False, "term_before": term_before, "term_after": self.meta()["term"]}


# -- in-process groups (tests and benchmarks) ---------------------------------------------------

class InProcessControllers:
    """N controller nodes in this process on loopback (tests and benchmarks); not the Ray actors of
    ``actors.cluster.Cluster`` nor the chaos run's ``chaos.controller_chaos.ProxiedControllers``.

    The nodes are controllers ``0..N-1`` of cluster ``cluster`` with certificates of ``ca`` (a new
    CA when None) and one members' secret; a restarted node keeps its credentials."""

    def __init__(self, base_dir: str | Path, ports: list[int], config: ControllerConfig, *,
                 ca: CertificateAuthority | None = None, tls: bool = True, cluster: str = CLUSTER,
                 **node_kwargs: Any) -> None:
        self.base_dir = Path(base_dir)
        self.addresses = [f"127.0.0.1:{p}" for p in ports]
        self.controllers = dict(enumerate(self.addresses))
        self.config = config
        self.tls = tls
        self.ca = ca or CertificateAuthority.create(cluster)
        self.credentials = member_credentials(len(ports), cluster, self.ca)
        self.node_kwargs = node_kwargs
        self.nodes: list[ControllerNode | None] = [None] * len(ports)
        for i in range(len(ports)):
            self.start(i)

    def store(self, i: int) -> Path:
        return self.base_dir / f"n{i}"

    def start(self, i: int) -> ControllerNode:
        assert self.nodes[i] is None, f"node {i} is running"
        from rocketray.controller.node import ControllerNode  # noqa: F811 - the child imports it lazily too

        node = ControllerNode(self.controllers, self.store(i), self.config, credentials=self.credentials[i],
                              tls=self.tls, **self.node_kwargs)
        self.nodes[i] = node
        return node

    def stop(self, i: int) -> None:
        node = self.nodes[i]
        if node is not None:
            node.close()
            self.nodes[i] = None

    def running(self) -> list[ControllerNode]:
        return [n for n in self.nodes if n is not None]

    def leader(self) -> ControllerNode | None:
        ready = [n for n in self.running() if n.is_leader()]
        return ready[0] if len(ready) == 1 else None

    def wait_leader(self, timeout_s: float = 10.0) -> ControllerNode:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader = self.leader()
            if leader is not None:
                return leader
            time.sleep(0.005)
        raise TimeoutError(f"no ready leader within {timeout_s}s: {[n.metadata() for n in self.running()]}")

    def index_of(self, node: ControllerNode) -> int:
        return self.nodes.index(node)

    def close(self) -> None:
        for i in range(len(self.nodes)):
            self.stop(i)


def member_credentials(count: int, cluster: str = CLUSTER, ca: CertificateAuthority | None = None,
                       secret: str | None = None) -> list[MemberCredentials]:
    """Credentials of controllers ``0..count-1`` of ``cluster``: certificates of ``ca`` (a new CA when
    None) and one members' secret (a new one when None). Tests, benchmarks and the chaos runner."""
    ca = ca or CertificateAuthority.create(cluster)
    secret = secret or secrets.token_hex(16)
    return [ca.member(Identity.controller(cluster, i), secret, hosts=["127.0.0.1"]) for i in range(count)]


def _credentials_json(credentials: MemberCredentials, tls: bool) -> bytes:
    return json.dumps({"credentials": credentials.to_json(), "tls": tls}).encode() + b"\n"


def _credentials_from_json(line: str | bytes) -> tuple[MemberCredentials, bool]:
    d = json.loads(line)
    return MemberCredentials.from_json(d["credentials"]), bool(d["tls"])


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.01)
    raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}; last: {last!r}")


# -- parent side: the process handle ------------------------------------------------------------

def _die_with_parent() -> None:
    """Linux: SIGKILL the node if the runner dies, even while SIGSTOPped (no orphans left behind)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class NodeProcess:
    """One controller node process; the same store dir, Raft address and credentials across restarts.

    ``controllers`` are the group's Raft addresses by index, ``credentials`` controller ``index``'s
    (passed on the child's stdin); ``dial`` where this node reaches a peer when not at its Raft
    address (the chaos runner's proxies); ``extra_env`` the child's added environment (e.g.
    libfaketime's, for the chaos run's clock faults). The runner's node port authenticates with the
    members' secret."""

    def __init__(self, index: int, controllers: Mapping[int, str], store_dir: Path, log_path: Path,
                 credentials: MemberCredentials, config: dict[str, Any], *, dial: Mapping[int, str] | None = None,
                 tls: bool = True, extra_env: dict[str, str] | None = None) -> None:
        assert credentials.identity.index == index, (credentials.identity, index)
        self.index, self.controllers, self.dial = index, dict(controllers), dict(dial or {})
        self.self_address = self.controllers[index]
        self.store_dir, self.log_path, self.config = store_dir, log_path, config
        self.credentials, self.tls = credentials, tls
        self.secret = credentials.secret
        self.extra_env = dict(extra_env or {})
        self.proc: subprocess.Popen | None = None
        self.client_port = 0
        self.incarnation = 0
        self.paused = False
        self._client: NodeClient | None = None

    def start(self, timeout_s: float = 30.0) -> None:
        assert self.proc is None or self.proc.poll() is not None
        self.client_port = 0
        self.incarnation += 1
        log = open(self.log_path, "ab")
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""), **self.extra_env)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rocketray.controller.proc", "--index", str(self.index),
             "--controllers", json.dumps(self.controllers), "--dial", json.dumps(self.dial),
             "--store-dir", str(self.store_dir), "--config", json.dumps(self.config)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env, cwd=root,
            preexec_fn=_die_with_parent)
        log.close()
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(_credentials_json(self.credentials, self.tls))
        self.proc.stdin.flush()
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            line = self.proc.stdout.readline() if sel.select(timeout_s) else b""
        ready = json.loads(line) if line.strip() else {}
        if not ready.get("ready"):
            self.kill()
            raise RuntimeError(f"controller node {self.index} failed to start ({ready}); see {self.log_path}")
        self.client_port = int(ready["client_port"])
        self.paused = False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def call(self, op: str, args: dict[str, Any] | None = None, timeout_s: float = 5.0) -> Any:
        """One authenticated call to this node (``status``, ``state``, ``request``, ``events``);
        None if the process is gone or the call was lost or failed (tests and benchmarks)."""
        if not self.running or not self.client_port:
            return None
        if self._client is None or self._client.port != self.client_port:
            self._client = NodeClient("127.0.0.1", self.client_port, self.secret.encode())
        try:
            return self._client.call(op, args, timeout_s)
        except (NotSent, Lost, RuntimeError):
            self._client.close()
            self._client = None
            return None

    def signal(self, sig: int) -> None:
        if self.running:
            assert self.proc is not None
            os.kill(self.proc.pid, sig)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.signal(signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()  # type: ignore[union-attr]
            except OSError:
                pass
        self.paused = False


def serve(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rocketray.controller.proc")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--controllers", required=True, help="JSON map: controller index -> Raft address")
    parser.add_argument("--dial", default="{}", help="JSON map: index -> where to reach it (proxies), if not there")
    parser.add_argument("--store-dir", required=True)
    parser.add_argument("--config", default="{}", help="JSON map of ControllerConfig overrides")
    parser.add_argument("--client-host", default="127.0.0.1")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s node{args.index} %(levelname)s %(name)s: %(message)s")
    try:
        credentials, tls = _credentials_from_json(sys.stdin.readline())
    except (ValueError, KeyError, TypeError) as exc:
        print(json.dumps({"ready": False, "error": f"no member credentials on stdin: {type(exc).__name__}"}),
              flush=True)
        return 2

    from rocketray.controller.config import ControllerConfig
    from rocketray.controller.node import ControllerNode

    config = ControllerConfig.for_tests(**json.loads(args.config))
    controllers = {int(i): str(a) for i, a in json.loads(args.controllers).items()}
    dial = {int(i): str(a) for i, a in json.loads(args.dial).items()}
    node = ControllerNode(controllers, args.store_dir, config, credentials=credentials, tls=tls, dial=dial,
                          alive=lambda name, broker_id: True)
    server = _Server((args.client_host, 0), node, credentials.secret.encode())
    thread = threading.Thread(target=server.serve_forever, name="chaos-client-server", daemon=True)
    thread.start()
    print(json.dumps({"ready": True, "client_port": server.server_address[1], "pid": os.getpid()}), flush=True)
    # Serve until the runner kills us or closes our stdin.
    for _ in sys.stdin:
        pass
    server.shutdown()
    node.close()
    return 0


if __name__ == "__main__":
    sys.exit(serve())
