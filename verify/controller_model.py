"""The controller workload's operations, as the checker sees them, and the model backed by the real core.

Theory of operation. The chaos workload issues three operations on one broker group's metadata:
``read`` (getReplicaInfo), ``elect`` (electMaster, usually admin-designated) and ``alter``
(alterSyncStateSet with master-epoch and SyncStateSet-epoch fencing). ``op_args`` turns an
operation's input into the request map the node process understands; ``output_of`` reduces a
response to the hashable output the checker compares (the parts of the response the state
machine determines: code, master, epochs, SyncStateSet).

``CoreGroupModel`` is the sequential specification used by the runner: the project's own pure core
(``ControllerState`` + ``decide`` with an always-alive context, exactly what every node runs), so a
linearizability failure means the *replicated* machine misbehaved, not that two specs disagree. Its
state is a ``GroupState`` tuple; each step rebuilds a one-group ``ControllerState`` from the tuple and
the group's fixed registration, decides, applies the events and projects back. The hand-written
``ControllerGroupModel`` in ``linearizability`` is an independent spec the tests compare it with.
"""

from __future__ import annotations

from typing import Any, Hashable

from rocketray.wire.controller_headers import (AlterSyncStateSetResponseHeader, ElectMasterResponseHeader,
                                               GetReplicaInfoResponseHeader, ResponseHeader)
from rocketray.controller.proc import build_request
from rocketray.verify.linearizability import (AlterInput, AlterOutput, ElectInput, ElectOutput, GroupState,
                                          Operation, Outcome, ReadOutput)

MASTER_FIELDS_CODES = (0, 2011)  # SUCCESS and MASTER_STILL_EXIST carry the master in the header


def op_args(f: str, group: str, inp: Any) -> dict[str, Any]:
    """The node-process request map for operation ``f`` with input ``inp`` on ``group``."""
    if f == "read":
        return {"type": "read", "broker_name": group}
    if f == "elect":
        assert isinstance(inp, ElectInput)
        return {"type": "elect", "broker_name": group, "broker_id": inp.broker_id, "designate": inp.designate}
    if f == "alter":
        assert isinstance(inp, AlterInput)
        return {"type": "alter", "broker_name": group, "master_id": inp.master_id,
                "master_epoch": inp.master_epoch, "new_sss": list(inp.new_sss), "sss_epoch": inp.sss_epoch}
    raise ValueError(f"unknown op {f!r}")


def output_of(f: str, code: int, header: ResponseHeader, body: dict[str, Any] | None) -> Hashable:
    """The checker's view of a response (same function for recorded and modelled responses)."""
    body = body or {}
    code = int(code)
    if f == "read":
        if code != 0 or not isinstance(header, GetReplicaInfoResponseHeader):
            return ReadOutput(code, None, None, (), None)
        return ReadOutput(code, header.master_broker_id, header.master_epoch,
                          tuple(sorted(int(b) for b in body.get("sync_state_set", ()))),
                          body.get("sync_state_set_epoch"))
    if f == "elect":
        if code in MASTER_FIELDS_CODES and isinstance(header, ElectMasterResponseHeader):
            return ElectOutput(code, header.master_broker_id, header.master_epoch)
        return ElectOutput(code, None, None)
    if f == "alter":
        if code == 0 and isinstance(header, AlterSyncStateSetResponseHeader):
            return AlterOutput(code, header.new_sync_state_set_epoch)
        return AlterOutput(code, None)
    raise ValueError(f"unknown op {f!r}")


def group_state_of(snapshot: dict[str, Any], group: str) -> GroupState:
    """Project one group's SyncStateInfo out of ``ControllerState.to_snapshot()``."""
    for name, _cluster, master, master_epoch, sss, sss_epoch in snapshot["sync_state"]:
        if name == group:
            return GroupState(None if master is None else int(master), int(master_epoch),
                              frozenset(int(b) for b in sss), int(sss_epoch))
    raise KeyError(group)


def group_states(snapshot: dict[str, Any]) -> dict[str, GroupState]:
    return {row[0]: group_state_of(snapshot, row[0]) for row in snapshot["sync_state"]}


class CoreGroupModel:
    """The real controller core as the sequential spec of one group (see module doc)."""

    def __init__(self, base_snapshot: dict[str, Any]) -> None:
        from rocketray.controller.decide import DecideContext

        self.base = base_snapshot
        self.ctx = DecideContext()  # always alive, no live info, unclean election off
        self._replica_rows = {row[0]: row for row in base_snapshot["replica_info"]}
        self._sync_rows = {row[0]: row for row in base_snapshot["sync_state"]}

    def init(self, key: str) -> Hashable:
        return group_state_of(self.base, key)

    def _state(self, key: str, s: GroupState) -> Any:
        from rocketray.controller.state import ControllerState

        cluster = self._sync_rows[key][1]
        return ControllerState.from_snapshot({
            "version": self.base["version"],
            "replica_info": [self._replica_rows[key]],
            "sync_state": [[key, cluster, s.master, s.master_epoch, sorted(s.sss), s.sss_epoch]],
        })

    def run(self, key: str, s: GroupState, f: str, inp: Any) -> tuple[Hashable, GroupState]:
        """(output, next state) of one operation."""
        from rocketray.controller.decide import decide

        state = self._state(key, s)
        response, events = decide(state, build_request(op_args(f, key, inp)), self.ctx)
        state.apply_all(events)
        return output_of(f, response.code, response.header, response.body), group_state_of(state.to_snapshot(), key)

    def step(self, state: Hashable, op: Operation) -> tuple[bool, Hashable]:
        assert isinstance(state, GroupState)
        output, new = self.run(op.key, state, op.f, op.input)
        return op.outcome == Outcome.UNKNOWN or op.output == output, new
