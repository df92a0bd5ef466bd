"""The controller chaos run's workload: client threads, the recorder, and the saved history format.

Each ``Client`` thread picks an operation (a read, a fenced SyncStateSet alteration, or a designated
election) for a random group, sends it to the node it believes leads, records one attempt with its
invoke and completion times and an outcome (``classify``: ``ok``, ``failed`` = definitely no effect,
``unknown``), and learns the leader and the group's state from the answer. ``final_reads`` reads
every group through the leader after heal. ``write_outputs`` (in ``controller_chaos``) saves the
history as ``controller_history.jsonl``; ``load_run`` reads it back as checker ``Operation``s with
the run's initial tables, for checking a saved run again.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Protocol, Sequence

from rocketray.wire.controller_headers import (NO_HEADER, HeaderCodecError, NotLeaderResponseHeader, ResponseHeader,
                                               header_from_fields)
from rocketray.chaos.proxy import Topology
from rocketray.controller.proc import NodeProcess
from rocketray.controller.proc_wire import NOT_LEADER, Lost, NodeClient, NotSent
from rocketray.verify.controller_model import op_args, output_of
from rocketray.verify.linearizability import (AlterInput, AlterOutput, ElectInput, ElectOutput, GroupState,
                                          Operation, Outcome, ReadOutput)

BROKER_IDS = (1, 2, 3)
HISTORY_FILE = "controller_history.jsonl"
INITIAL_STATE_FILE = "initial_state.json"
WRITES = ("elect", "alter")


class Recorder:
    """Thread-safe history, nemesis log and leader observations, with one monotonic origin."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ops: list[dict[str, Any]] = []
        self.nemesis: list[dict[str, Any]] = []
        self.leader_claims: dict[int, set[int]] = defaultdict(set)
        self.counters: dict[tuple[int, int], dict[str, int]] = {}

    def op(self, record: dict[str, Any]) -> None:
        with self.lock:
            record["op_id"] = len(self.ops)
            self.ops.append(record)

    def event(self, kind: str, phase: str, **fields: Any) -> None:
        with self.lock:
            self.nemesis.append({"time_ms": int(time.time() * 1000), "kind": kind, "phase": phase, **fields})

    def claim(self, term: int, node: int) -> None:
        with self.lock:
            self.leader_claims[term].add(node)


def header_of(reply: dict[str, Any]) -> ResponseHeader:
    """A node's answer's typed header (``controller/proc.py``); HeaderCodecError if malformed."""
    return header_from_fields(reply.get("header_type"), reply.get("header"))


def classify(f: str, reply: dict[str, Any]) -> Outcome:
    code = int(reply["code"])
    if code == NOT_LEADER:
        return Outcome.FAILED if reply.get("precheck") or f not in WRITES else Outcome.UNKNOWN
    if code == 1:  # SYSTEM_ERROR: the commit wait timed out, outcome unknown
        return Outcome.UNKNOWN if f in WRITES else Outcome.FAILED
    return Outcome.OK


class WorkloadCluster(Protocol):
    """The controller group the clients talk to (``controller_chaos.ProxiedControllers``)."""

    @property
    def nodes(self) -> Sequence[NodeProcess]: ...
    @property
    def topology(self) -> Topology: ...
    @property
    def recorder(self) -> Recorder: ...
    def client(self, i: int) -> NodeClient: ...
    def call(self, i: int, op: str, args: dict[str, Any] | None = None, timeout_s: float = 2.0) -> Any: ...
    def wait_leader(self, timeout_s: float) -> int: ...


class WorkloadConfig(Protocol):
    """The run settings a client reads (``controller_chaos.RunConfig``)."""

    @property
    def seed(self) -> int: ...
    @property
    def nodes(self) -> int: ...
    @property
    def client_timeout_s(self) -> float: ...
    @property
    def think_s(self) -> float: ...


class Client(threading.Thread):
    """One workload process: picks an op, sends it to its leader guess, records the outcome."""

    def __init__(self, index: int, cluster: WorkloadCluster, cfg: WorkloadConfig, groups: list[str], stop: threading.Event,
                 t0_ns: int) -> None:
        super().__init__(name=f"chaos-client-{index}", daemon=True)
        self.index, self.cluster, self.cfg, self.groups, self.stop_event = index, cluster, cfg, groups, stop
        self.rng = random.Random(f"{cfg.seed}-client-{index}")
        self.known: dict[str, GroupState | None] = {g: None for g in groups}
        self.target = self.rng.randrange(cfg.nodes)
        self.clients: dict[tuple[int, int, int], NodeClient] = {}
        self.t0_ns = t0_ns
        self.error: Exception | None = None

    def _pick(self) -> tuple[str, str, Any]:
        group = self.rng.choice(self.groups)
        s, r = self.known[group], self.rng.random()
        if s is None or s.master is None or r < 0.5:
            return group, "read", None
        if r < 0.85:
            others = [b for b in BROKER_IDS if b != s.master and self.rng.random() < 0.5]
            return group, "alter", AlterInput(s.master, s.master_epoch, tuple(sorted([s.master, *others])),
                                              s.sss_epoch)
        return group, "elect", ElectInput(self.rng.choice(BROKER_IDS), True)

    def _client(self, i: int) -> NodeClient:
        node = self.cluster.nodes[i]
        key = (i, node.incarnation, node.client_port)  # a restarted node listens on a new port
        if key not in self.clients:
            self.clients[key] = self.cluster.client(i)
        return self.clients[key]

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                self.one()
                self.stop_event.wait(self.rng.uniform(0, self.cfg.think_s))
        except Exception as exc:  # noqa: BLE001 - a dropped op would corrupt the history: abort the run
            self.error = exc
            self.stop_event.set()

    def one(self) -> None:
        group, f, inp = self._pick()
        node = self.target
        start_ns, start_ms = time.monotonic_ns(), int(time.time() * 1000)
        reply: dict[str, Any] | None = None
        header: ResponseHeader = NO_HEADER
        error = None
        try:
            reply = self._client(node).call("request", op_args(f, group, inp), self.cfg.client_timeout_s)
            header = header_of(reply)
            outcome = classify(f, reply)
        except NotSent as exc:
            outcome, error = Outcome.FAILED, f"not sent: {exc}"
        except (Lost, RuntimeError) as exc:
            outcome, error = Outcome.UNKNOWN, f"lost: {exc}"
        except HeaderCodecError as exc:   # a malformed answer: as if none came back
            reply, outcome, error = None, Outcome.UNKNOWN, f"bad answer: {exc}"
        end_ns = time.monotonic_ns()
        output = output_of(f, reply["code"], header, reply["body"]) if reply else None
        if reply is not None and int(reply["code"]) == 0 and f in WRITES and reply["term_before"] == reply["term_after"]:
            self.cluster.recorder.claim(int(reply["term_before"]), node)
        self.cluster.recorder.op({
            "process": self.index, "key": group, "f": f, "input": jsonable(inp), "output": jsonable(output),
            "outcome": outcome.value, "start_ns": start_ns - self.t0_ns,
            "end_ns": None if outcome == Outcome.UNKNOWN else end_ns - self.t0_ns,
            "start_ms": start_ms, "end_ms": int(time.time() * 1000), "node": node,
            "code": None if reply is None else int(reply["code"]), "error": error or (reply or {}).get("remark") or None,
            "term": None if reply is None else reply.get("term_after"), "_inp": inp, "_out": output})
        self._learn(group, f, outcome, output, reply, header)

    def _learn(self, group: str, f: str, outcome: Outcome, output: Any, reply: dict[str, Any] | None,
               header: ResponseHeader) -> None:
        if f == "read" and outcome == Outcome.OK and output.code == 0:
            self.known[group] = GroupState(output.master, output.master_epoch, frozenset(output.sss), output.sss_epoch)
        elif f in WRITES:
            self.known[group] = None
        if reply is None or outcome != Outcome.OK or int(reply["code"]) == NOT_LEADER:
            hint = header.leader_address if isinstance(header, NotLeaderResponseHeader) else None
            hinted = self.cluster.topology.node_of(hint)
            self.target = hinted if hinted is not None and hinted != self.target else \
                (self.target + 1) % self.cfg.nodes


def jsonable(value: Any) -> Any:
    if value is None:
        return None
    if hasattr(value, "_asdict"):
        return {k: jsonable(v) for k, v in value._asdict().items()}
    if isinstance(value, (frozenset, set, tuple, list)):
        return sorted(value) if isinstance(value, (set, frozenset)) else list(value)
    return value


def final_reads(cluster: WorkloadCluster, recorder: Recorder, groups: list[str], process: str, t0_ns: int) -> None:
    """One linearizable read per group through the leader, recorded in the history."""
    for group in groups:
        for _ in range(50):
            leader = cluster.wait_leader(30.0)
            start_ns, start_ms = time.monotonic_ns(), int(time.time() * 1000)
            try:
                reply = cluster.call(leader, "request", op_args("read", group, None), timeout_s=5.0)
                header = header_of(reply)
            except (NotSent, Lost, HeaderCodecError):
                continue
            if classify("read", reply) != Outcome.OK:
                continue
            output = output_of("read", reply["code"], header, reply["body"])
            recorder.op({"process": process, "key": group, "f": "read", "input": None, "output": jsonable(output),
                         "outcome": Outcome.OK, "start_ns": start_ns - t0_ns, "end_ns": time.monotonic_ns() - t0_ns,
                         "start_ms": start_ms, "end_ms": int(time.time() * 1000), "node": leader,
                         "code": int(reply["code"]), "error": None, "term": reply.get("term_after"),
                         "_inp": None, "_out": output})
            break
        else:
            raise TimeoutError(f"final read of {group} failed")


def to_operations(records: list[dict[str, Any]]) -> list[Operation]:
    return [Operation(r["op_id"], hash(r["process"]), r["key"], r["f"], r["_inp"], r["_out"], Outcome(r["outcome"]),
                      r["start_ns"], r["end_ns"]) for r in records]


def operation_from_json(r: dict[str, Any]) -> Operation:
    """Inverse of the history line written by ``write_outputs`` (for re-checking a saved run)."""
    f, inp, out = r["f"], r.get("input"), r.get("output")
    if f == "read":
        inp = None
        out = None if out is None else ReadOutput(out["code"], out["master"], out["master_epoch"],
                                                  tuple(out["sss"]), out["sss_epoch"])
    elif f == "elect":
        assert isinstance(inp, dict)
        inp = ElectInput(**inp)
        out = None if out is None else ElectOutput(**out)
    elif f == "alter":
        assert isinstance(inp, dict)
        inp = AlterInput(inp["master_id"], inp["master_epoch"], tuple(inp["new_sss"]), inp["sss_epoch"])
        out = None if out is None else AlterOutput(**out)
    return Operation(r["op_id"], hash(r["process"]), r["key"], f, inp, out, Outcome(r["outcome"]),
                     r["start_ns"], r["end_ns"])


def load_run(out_dir: str | Path) -> tuple[list[Operation], dict[str, Any]]:
    """The operations and the initial tables of a saved run."""
    d = Path(out_dir)
    with open(d / HISTORY_FILE) as fh:
        ops = [operation_from_json(json.loads(line)) for line in fh if line.strip()]
    with open(d / INITIAL_STATE_FILE) as fh:
        return ops, json.load(fh)
