"""The one executor of the role machine's actions, run by production and the simulator alike.

Theory of operation. ``RoleMachine.step`` decides; this module turns its actions into calls on two
declared ports and the ports' answers back into the machine's inputs, the way etcd's raft hands a
``Ready`` to whatever transport and storage the application plugs in. ``ReplicasManager`` and the
HA service plug the real ports (asyncio, sockets, the store's IO thread); ``rocketray.sim.broker``
plugs simulated ones and runs this same code over virtual time. Nothing here decides: which switch,
whether it is stale, when the role is taken, which SyncStateSet to report are the machine's;
what a put may do is the HA core's. What this module owns is the mechanics every shell shared:

* **feeding** (``Executor.feed``): apply one input, execute its actions in order, and feed the
  inputs they produce before the next one, until none is left;
* **a switch** in its steps on the ``ReplicationPort``: ``BecomeMaster`` -> stop replicating
  (a promotion), start the epoch (cutting a torn tail on a promotion), ``SwitchDone``;
  ``BecomeSlave`` -> stop replicating (another master), ``SwitchDone``; the committed role is
  handed over by ``ServeAsMaster`` / ``FollowMaster``. A step that raises fails the switch
  (``SwitchDone(False)`` is applied) and the exception goes on to the shell;
* **the controller requests and the parsing of their answers** (pure functions below: an
  election, a new term, a SyncStateSet report, a registration, a replica-info poll).

Ports are coroutines so the production shell can await sockets and IO threads; a simulated port
never suspends, and ``run_now`` runs a feed to its end at once. ``ControllerPort.ask`` returns the
answer's input when it has it (production awaits the round trip) or ``None`` and feeds it later
(the simulator's network delivers it after a delay): the executor does not need to know which.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Callable, Coroutine, Protocol, TypeAlias, TypeVar

from rocketray.broker import role as rm
from rocketray.broker.role import MasterInfo, RoleMachine, StoreFacts
from rocketray.wire.controller_api import (AlterSyncStateSetRequest, BrokerHeartbeatRequest, ElectMasterRequest,
                                           GetReplicaInfoRequest, RegisterBrokerRequest, Response)
from rocketray.wire.controller_headers import AlterSyncStateSetResponseHeader
from rocketray.wire.controller_codes import ResponseCode
from rocketray.broker.replication_port import HAPort
from rocketray.schema import INT_MAX

__all__ = ["BrokerNames", "ControllerPort", "Executor", "ReplicationPort", "Then", "alter_request",
           "elect_answer", "elect_request", "heartbeat_request", "new_term_answer", "new_term_request",
           "poll_answer", "poll_request", "register_answer", "register_request", "report_answer",
           "run_now"]

log = logging.getLogger(__name__)

T = TypeVar("T")
Then = Callable[[Response | None], "rm.Input | None"]


# ---------------------------------------------------------------------------------------------
# Ports


class ControllerPort(Protocol):
    """How the executor reaches the controller leader."""

    async def ask(self, request: object, then: Then) -> rm.Input | None:
        """Send ``request``; ``then(answer)`` makes the input (``None`` answer: no answer, outcome
        unknown). Return that input if the answer is in (it runs in this feed), or ``None`` and
        feed it once the answer arrives."""

    def ask_later(self, request: object, then: Then) -> None:
        """Send ``request`` without waiting; feed ``then(answer)`` when it arrives (a report)."""

    async def heartbeat(self, request: BrokerHeartbeatRequest) -> None:
        """Heartbeat the controller leader (on the broker's session; through Ray to every controller
        when the controllers have no session port); a failure is the shell's to log (the next one retries)."""


#: The HA side of a broker as the executor drives it (declared once, in ``rocketray.broker.replication_port``).
ReplicationPort: TypeAlias = HAPort


@dataclass(frozen=True, slots=True)
class BrokerNames:
    """Who the broker is to the controller (the request fields that never change)."""

    cluster_name: str
    broker_name: str
    broker_address: str
    heartbeat_timeout_ms: int = 10000
    election_priority: int = INT_MAX


# ---------------------------------------------------------------------------------------------
# Requests and answers (pure)


def heartbeat_request(names: BrokerNames, broker_id: int, facts: StoreFacts) -> BrokerHeartbeatRequest:
    return BrokerHeartbeatRequest(names.cluster_name, names.broker_name, names.broker_address, broker_id,
                                  epoch=facts.last_epoch, max_offset=facts.max_offset,
                                  confirm_offset=facts.confirm_offset,
                                  heartbeat_timeout_ms=names.heartbeat_timeout_ms,
                                  election_priority=names.election_priority)


def register_request(names: BrokerNames, broker_id: int) -> RegisterBrokerRequest:
    return RegisterBrokerRequest(names.cluster_name, names.broker_name, broker_id, names.broker_address)


def register_answer(resp: Response | None) -> rm.Registered | None:
    """REGISTER_BROKER's answer as the machine's input; None if it failed (the shell retries)."""
    if resp is None or not resp.ok:
        return None
    return rm.Registered(MasterInfo.from_response(resp))


def poll_request(names: BrokerNames) -> GetReplicaInfoRequest:
    return GetReplicaInfoRequest(names.broker_name)


def poll_answer(resp: Response | None) -> rm.ReplicaInfoPolled | None:
    """GET_REPLICA_INFO's answer (reference 10.7); None if it failed."""
    if resp is None or not resp.ok:
        return None
    return rm.ReplicaInfoPolled(MasterInfo.from_response(resp))


def elect_request(names: BrokerNames, broker_id: int) -> ElectMasterRequest:
    return ElectMasterRequest.of_broker_trigger(names.cluster_name, names.broker_name, broker_id)


def elect_answer(resp: Response | None) -> rm.ElectAnswered:
    """brokerElect (reference 10.3): SUCCESS and MASTER_STILL_EXIST both name the master."""
    if resp is None or resp.code not in (ResponseCode.SUCCESS, ResponseCode.CONTROLLER_MASTER_STILL_EXIST):
        return rm.ElectAnswered(None)
    return rm.ElectAnswered(MasterInfo.from_response(resp))


def new_term_request(names: BrokerNames, broker_id: int, facts: StoreFacts) -> ElectMasterRequest:
    """Ranked by what the store holds now, not by the heartbeats of before a restart."""
    return ElectMasterRequest.of_new_term(names.cluster_name, names.broker_name, broker_id, facts.last_epoch,
                                          facts.max_offset)


def new_term_answer(old_epoch: int, resp: Response | None) -> rm.NewTermAnswered:
    if resp is None or not resp.ok:
        return rm.NewTermAnswered(old_epoch, None)
    return rm.NewTermAnswered(old_epoch, MasterInfo.from_response(resp))


def alter_request(names: BrokerNames, broker_id: int, action: rm.ReportSyncStateSet,
                  now_ms: int) -> AlterSyncStateSetRequest:
    return AlterSyncStateSetRequest(names.broker_name, broker_id, action.master_epoch, action.proposal,
                                    action.sync_state_set_epoch, invoke_time_ms=now_ms)


def report_answer(sent: rm.ReportSyncStateSet, resp: Response | None) -> rm.ReportAnswered:
    """ALTER_SYNC_STATE_SET's answer: confirmed (with the set the controller applied), refused
    (an error code: nothing changed there) or unknown (no answer: it may have been applied)."""
    if resp is None:
        return rm.ReportAnswered(rm.ReportOutcome.UNKNOWN)
    if not resp.ok:
        return rm.ReportAnswered(rm.ReportOutcome.REFUSED)
    body = resp.body or {}
    epoch = body.get("sync_state_set_epoch")
    if epoch is None and isinstance(resp.header, AlterSyncStateSetResponseHeader):
        epoch = resp.header.new_sync_state_set_epoch
    return rm.ReportAnswered(rm.ReportOutcome.CONFIRMED, frozenset(body.get("sync_state_set") or sent.proposal),
                             int(epoch or 0))


# ---------------------------------------------------------------------------------------------
# The executor


def run_now(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine whose awaits never suspend (the simulator's ports) to its end, now."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise AssertionError("a simulated port suspended: simulated ports must complete at once")


class Executor:
    """Feeds one ``RoleMachine`` and executes its actions on the ports. See the module docstring.

    ``ha`` may be set later (production builds the HA service once the broker id is known; no
    action needs it before that). ``stepped`` is called after each input's actions ran (the
    simulator records epochs there). ``alive`` stops a feed whose process died (the simulator).
    """

    def __init__(self, machine: RoleMachine, names: BrokerNames, *, controller: ControllerPort | None,
                 ha: ReplicationPort | None, facts: Callable[[], StoreFacts], now_ms: Callable[[], int],
                 alive: Callable[[], bool] = lambda: True, stepped: Callable[[], None] = lambda: None) -> None:
        self.machine = machine
        self.names = names
        self.controller = controller
        self.ha = ha
        self.facts = facts
        self.now_ms = now_ms
        self.alive = alive
        self.stepped = stepped

    async def feed(self, event: rm.Input) -> None:
        """Apply ``event`` and execute its actions, and those of the inputs they produce, in order."""
        pending: list[rm.Input] = [event]
        while pending and self.alive():
            for action in self.machine.step(pending.pop(0), self.facts()):
                follow_up = await self.execute(action)
                if follow_up is not None:
                    pending.append(follow_up)
            self.stepped()

    async def execute(self, action: rm.Action) -> rm.Input | None:
        """One action on the ports; returns the input it produces now, if any."""
        m = self.machine
        if isinstance(action, (rm.BecomeMaster, rm.BecomeSlave)):
            return await self._switch(action)
        if isinstance(action, rm.ServeAsMaster):
            self._ha().serve_as_master(action.new_term)
            return None
        if isinstance(action, rm.FollowMaster):
            self._ha().follow(action.master_address, action.epoch)
            return None
        if isinstance(action, rm.ApplySyncStateSet):
            self._ha().set_sync_state_set(action.members)
            log.info("sync state set confirmed: group=%s set=%s epoch=%s", self.names.broker_name,
                     sorted(action.members), action.epoch)
            return None
        if isinstance(action, rm.ReportSyncStateSet):
            vetted = self._ha().mark_in_flight(action.proposal)   # in the union view before it leaves
            if vetted is None:   # every member it would add lags the confirm offset: nothing to send
                return rm.ReportAnswered(rm.ReportOutcome.REFUSED)
            sent = dataclasses.replace(action, proposal=vetted)
            assert m.broker_id is not None
            self._controller().ask_later(alter_request(self.names, m.broker_id, sent, self.now_ms()),
                                         lambda resp: report_answer(sent, resp))
            return None
        if isinstance(action, rm.SendHeartbeat):
            assert m.broker_id is not None
            await self._controller().heartbeat(heartbeat_request(self.names, m.broker_id, self.facts()))
            return None
        if isinstance(action, rm.RequestElection):
            assert m.broker_id is not None
            return await self._controller().ask(elect_request(self.names, m.broker_id), elect_answer)
        if isinstance(action, rm.RequestNewTerm):
            assert m.broker_id is not None
            log.warning("not resuming master epoch %s from before a restart: group=%s broker_id=%s; asking for "
                        "a new term", action.old_epoch, self.names.broker_name, m.broker_id)
            old = action.old_epoch
            return await self._controller().ask(new_term_request(self.names, m.broker_id, self.facts()),
                                                lambda resp: new_term_answer(old, resp))
        if isinstance(action, rm.SetWritable):
            log.info("writable=%s: group=%s broker_id=%s role=%s epoch=%s", action.writable,
                     self.names.broker_name, m.broker_id, m.role.value, m.master_epoch)
            return None
        raise TypeError(f"unknown role action {action!r}")

    async def _switch(self, action: rm.BecomeMaster | rm.BecomeSlave) -> rm.Input:
        ha = self._ha()
        started = self.now_ms()
        try:
            if not action.same:
                await ha.stop_replication("role change to master" if isinstance(action, rm.BecomeMaster)
                                          else "role change to slave")
            stopped = self.now_ms()
            if isinstance(action, rm.BecomeMaster):
                await ha.start_epoch(action.epoch, action.cut_torn_tail)
        except BaseException:
            # the switch failed: nothing is recorded, the next notification or poll retries it
            self.machine.step(rm.SwitchDone(False), self.facts())
            raise
        ended = self.now_ms()
        log.info("role switch done: group=%s broker_id=%s %r stop_ms=%d epoch_ms=%d", self.names.broker_name,
                 self.machine.broker_id, action, stopped - started, ended - stopped)
        return rm.SwitchDone(True)

    def _ha(self) -> ReplicationPort:
        assert self.ha is not None, "no HA service yet"
        return self.ha

    def _controller(self) -> ControllerPort:
        assert self.controller is not None, "a standalone endpoint has no controller"
        return self.controller
