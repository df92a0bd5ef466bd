"""Local controller groups for tests and benchmarks (not used by the actors).

`LocalCluster` runs N `ControllerNode`s in this process on loopback ports. `NodeProcess` runs one
node in a child process (`python -m rocketray.controller.local_cluster serve ...`) driven by JSON lines
on stdin/stdout, so tests can SIGKILL it: an abrupt stop with no close(), no flush.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from rocketray.controller.api import (ApplyBrokerIdRequest, ElectMasterRequest, GetReplicaInfoRequest,
                            RegisterBrokerRequest, Response)
from rocketray.controller.config import ControllerConfig
from rocketray.controller.node import ControllerNode


class LocalCluster:
    """N in-process controller nodes on loopback."""

    def __init__(self, base_dir: str | Path, ports: list[int], config: ControllerConfig,
                 secret: str | None = "test-secret", **node_kwargs: Any) -> None:
        self.base_dir = Path(base_dir)
        self.addresses = [f"127.0.0.1:{p}" for p in ports]
        self.config = config
        self.secret = secret
        self.node_kwargs = node_kwargs
        self.nodes: list[ControllerNode | None] = [None] * len(ports)
        for i in range(len(ports)):
            self.start(i)

    def store(self, i: int) -> Path:
        return self.base_dir / f"n{i}"

    def start(self, i: int) -> ControllerNode:
        assert self.nodes[i] is None, f"node {i} is running"
        node = ControllerNode(self.addresses[i], self.addresses, self.store(i), self.config, self.secret,
                              **self.node_kwargs)
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


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.01)
    raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}; last: {last!r}")


# -- child-process node ----------------------------------------------------------------------------

def _response_json(resp: Response) -> dict[str, Any]:
    return {"code": int(resp.code), "header": resp.header, "body": resp.body, "remark": resp.remark}


def _serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = ControllerConfig.for_tests(**json.loads(args.config))
    node = ControllerNode(args.self_address, args.peers.split(","), args.store, config, args.secret or None,
                          alive=lambda name, broker_id: True)
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        msg = json.loads(line)
        op, rid = msg["op"], msg.get("rid")
        try:
            result = _serve_op(node, op, msg)
        except Exception as exc:  # keep serving; the caller sees the error
            logging.exception("op %s failed", op)
            result = {"error": repr(exc)}
        if op == "close":
            node.close()
            out.write(json.dumps({"closed": True, "rid": rid}) + "\n")
            out.flush()
            return 0
        result["rid"] = rid
        out.write(json.dumps(result, default=str) + "\n")
        out.flush()
    node.close()
    return 0


def _serve_op(node: ControllerNode, op: str, msg: dict[str, Any]) -> dict[str, Any]:
    if op == "meta":
        result: Any = node.metadata()
    elif op == "apply":
        result = _response_json(node.handle(ApplyBrokerIdRequest(
            "c", msg["name"], msg.get("id", 1), msg.get("code", f"{msg['name']};1"))))
    elif op == "register":
        result = _response_json(node.handle(RegisterBrokerRequest("c", msg["name"], msg["id"], msg["addr"])))
    elif op == "elect":
        result = _response_json(node.handle(ElectMasterRequest.of_broker_trigger("c", msg["name"], msg["id"])))
    elif op == "read":
        result = _response_json(node.handle(GetReplicaInfoRequest(msg["name"])))
    elif op == "state":
        result = {"state": node.snapshot_state(), "meta": node.metadata()}
    elif op == "events":
        result = node.events(msg.get("after", 0), msg.get("limit", 10_000))
    elif op == "close":
        result = {}
    else:
        result = {"error": f"unknown op {op}"}
    return result


class NodeProcess:
    """One controller node in a child process, driven by JSON lines; `kill()` is SIGKILL."""

    def __init__(self, self_address: str, peers: list[str], store: Path, secret: str,
                 config_overrides: dict[str, Any] | None = None, start_timeout_s: float = 20.0) -> None:
        self.self_address = self_address
        root = Path(__file__).resolve().parent.parent
        env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        store.mkdir(parents=True, exist_ok=True)
        self.stderr_path = store.parent / f"{store.name}.stderr.log"
        self._stderr = open(self.stderr_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rocketray.controller.local_cluster", "serve", "--self-address", self_address,
             "--peers", ",".join(peers), "--store", str(store), "--secret", secret,
             "--config", json.dumps(config_overrides or {})],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True, bufsize=1,
            cwd=str(root), env=env)
        self._rid = 0
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True, name=f"node-proc-{self_address}").start()
        first = self._read(start_timeout_s)
        if not first or not first.get("ready"):
            self.kill()
            raise RuntimeError(f"node {self_address} failed to start: {first!r}")

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self._lines.put(json.loads(line))
            except ValueError:
                continue
        self._lines.put(None)

    def _read(self, timeout_s: float, rid: int | None = None) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                msg = self._lines.get(timeout=remaining)
            except queue.Empty:
                return None
            if msg is None:
                self._lines.put(None)
                return None
            if rid is None or msg.get("rid") == rid:
                return msg
            # a late answer to an earlier call that timed out: drop it

    def call(self, timeout_s: float = 10.0, **msg: Any) -> dict[str, Any] | None:
        """Send one op; None if the process is gone or did not answer in time."""
        if self.proc.poll() is not None:
            return None
        self._rid += 1
        msg["rid"] = self._rid
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            return None
        return self._read(timeout_s, self._rid)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._stderr.close()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass

    def close(self) -> None:
        if self.alive():
            self.call(op="close", timeout_s=10)
        self.kill()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="rocketray.controller.local_cluster")
    sub = parser.add_subparsers(dest="cmd", required=True)
    serve = sub.add_parser("serve")
    serve.add_argument("--self-address", required=True)
    serve.add_argument("--peers", required=True)
    serve.add_argument("--store", required=True)
    serve.add_argument("--secret", default="")
    serve.add_argument("--config", default="{}")
    args = parser.parse_args(argv)
    return _serve(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
