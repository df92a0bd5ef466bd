"""Fakes for the ReplicasManager tests: a controller built from the real pure core, HA, store, files.

``FakeController`` is the real controller logic without Raft: ``rocketray.controller.decide.decide`` on a
``ControllerState``, events applied with ``ControllerState.apply``, liveness from the real
``HeartbeatTable`` at the fake clock's time. It adds what a test needs around it: several node
addresses (only the leader answers, the others say NOT_LEADER with a hint), scripted failures per
request type, and a record of every request.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rocketray.broker.register import Identity, TempIdentity
from rocketray.broker.replicas_manager import ControllerCallError, ReplicasManager, ReplicasManagerConfig
from rocketray.wire.controller_headers import NotLeaderResponseHeader
from rocketray.wire.controller_api import BrokerHeartbeatRequest, Response
from rocketray.wire.controller_codes import ResponseCode
from rocketray.controller.decide import DecideContext, decide
from rocketray.controller.heartbeat import HeartbeatTable
from rocketray.controller.state import ControllerState

CLUSTER = "cluster-a"
GROUP = "broker-set-a"


class FakeClock:
    def __init__(self, now_ms: int = 1_000_000) -> None:
        self.now = now_ms

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


class FakeController:
    def __init__(self, clock: FakeClock, addresses: tuple[str, ...] = ("127.0.0.1:8888",),
                 leader: str | None = None) -> None:
        self.clock = clock
        self.addresses = addresses
        self.leader = leader or addresses[0]
        self.state = ControllerState()
        self.heartbeats = HeartbeatTable()
        self.requests: list[tuple[str, Any]] = []
        self.heartbeat_log: list[BrokerHeartbeatRequest] = []
        # type name -> list of scripted outcomes (an Exception to raise or a Response to return)
        self.script: dict[str, list[Any]] = {}
        self.down = False

    def fail(self, request_type: str, outcome: Any = None, times: int = 1) -> None:
        outcome = outcome or ControllerCallError(f"injected failure of {request_type}")
        self.script.setdefault(request_type, []).extend([outcome] * times)

    def ctx(self) -> DecideContext:
        return DecideContext.from_heartbeats(self.heartbeats, self.clock())

    async def call(self, request: Any, address: str | None = None) -> Response:
        name = type(request).__name__
        self.requests.append((name, request))
        if self.down:
            raise ControllerCallError("controller unreachable")
        if address != self.leader:
            return Response.error(ResponseCode.CONTROLLER_NOT_LEADER, "The controller is not in leader state",
                                  NotLeaderResponseHeader(self.leader))
        scripted = self.script.get(name)
        if scripted:
            outcome = scripted.pop(0)
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome
        resp, events = decide(self.state, request, self.ctx())
        for event in events:
            self.state.apply(event)
        return resp

    async def heartbeat(self, request: BrokerHeartbeatRequest) -> None:
        if self.down:
            raise ControllerCallError("controller unreachable")
        self.heartbeat_log.append(request)
        self.heartbeats.on_heartbeat(request, self.clock())

    async def metadata(self) -> list[dict]:
        """Every reachable node's metadata (the ControllerClient port)."""
        if self.down:
            return []
        return [{"leader_address": self.leader, "is_leader": address == self.leader} for address in self.addresses]

    def names(self) -> list[str]:
        return [n for n, _ in self.requests]

    def master(self, group: str = GROUP) -> tuple[int | None, str | None, int]:
        sync = self.state.sync_state[group]
        return sync.master_broker_id, self.state.replica_info[group].address_of(sync.master_broker_id), \
            sync.master_epoch


class FakeEpochFile:
    def __init__(self) -> None:
        self.epochs: list[int] = []

    def last_epoch(self) -> int:
        return self.epochs[-1] if self.epochs else -1


class FakeStore:
    def __init__(self) -> None:
        self.max_offset = 0
        self.confirm_offset = 0
        self.epoch_file = FakeEpochFile()


class FakeHA:
    """A ``rocketray.broker.replication_port.HAPort``: records the switch steps as the role switches they make
    (``change_to_master``, ``change_to_master_same``, ``change_to_slave``); may fail a promotion."""

    def __init__(self, store: FakeStore, broker_id: int | None = None) -> None:
        self.store = store
        self.calls: list[tuple] = []
        self.listeners: list[Any] = []
        self.sync_state_set: set[int] = set()
        self.shrink_result: set[int] | None = None
        self.fail_master = False
        self.broker_id = broker_id

    async def stop_replication(self, reason: str) -> None:
        self.calls.append(("stop_replication", reason))

    async def start_epoch(self, epoch: int, cut_torn_tail: bool) -> None:
        if self.fail_master:
            raise RuntimeError("HA failed during the promotion")
        self.calls.append(("change_to_master" if cut_torn_tail else "change_to_master_same", epoch))
        self.store.epoch_file.epochs.append(epoch)

    def serve_as_master(self, new_term: bool) -> None:
        self.calls.append(("serve_as_master", new_term))

    def follow(self, master_address: str | None, epoch: int) -> None:
        self.calls.append(("change_to_slave", master_address, epoch))

    def set_sync_state_set(self, ids: set[int]) -> None:
        self.calls.append(("set_sync_state_set", frozenset(ids)))
        self.sync_state_set = set(ids)

    def mark_in_flight(self, proposal) -> frozenset[int]:
        self.calls.append(("mark_in_flight", frozenset(proposal)))
        return frozenset(proposal)

    def add_sss_listener(self, cb: Any) -> None:
        self.listeners.append(cb)

    def maybe_shrink_sync_state_set(self, now_ms: int) -> set[int]:
        return set(self.sync_state_set if self.shrink_result is None else self.shrink_result)

    def roles(self) -> list[tuple]:
        """The role switches made, in order."""
        return [c for c in self.calls if c[0] in ("change_to_master", "change_to_master_same", "change_to_slave")]


class MemIdentityStore:
    """An IdentityStore on a dict that outlives manager instances (the "disk"), with injected faults."""

    def __init__(self) -> None:
        self.disk: dict[str, Any] = {}
        self.fail_save = False
        self.fail_save_temp = False

    def load(self) -> Identity | None:
        return self.disk.get("identity")

    def save(self, identity: Identity) -> None:
        if self.fail_save:
            raise OSError("injected: identity file write failed")
        self.disk["identity"] = identity

    def clear(self) -> None:
        self.disk.pop("identity", None)

    def load_temp(self) -> TempIdentity | None:
        return self.disk.get("temp")

    def save_temp(self, temp: TempIdentity) -> None:
        if self.fail_save_temp:
            raise OSError("injected: temp identity file write failed")
        self.disk["temp"] = temp

    def clear_temp(self) -> None:
        self.disk.pop("temp", None)


@dataclasses.dataclass
class Replica:
    """One broker replica's pieces; ``restart()`` builds a new manager on the same store and files."""

    controller: FakeController
    clock: FakeClock
    identity: Any
    address: str
    cluster: str = CLUSTER
    group: str = GROUP
    store: FakeStore = dataclasses.field(default_factory=FakeStore)
    ha: FakeHA | None = None
    rm: ReplicasManager | None = None

    def __post_init__(self) -> None:
        self.restart()

    def restart(self, address: str | None = None, group: str | None = None, cluster: str | None = None) -> None:
        self.address = address or self.address
        self.group = group or self.group
        self.cluster = cluster or self.cluster
        ha = self.ha = FakeHA(self.store)

        async def ha_factory(broker_id: int, roles: Any) -> FakeHA:
            ha.broker_id = broker_id
            return ha

        self.rm = ReplicasManager(
            cluster_name=self.cluster, broker_name=self.group, broker_address=self.address,
            controller_client=self.controller, ha_factory=ha_factory,
            store=self.store, identity=self.identity, now_ms=self.clock, config=ReplicasManagerConfig())
