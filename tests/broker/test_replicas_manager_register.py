"""ReplicasManager registration (reference §9.2, §10.2) against a controller made of the real pure core.

Rows of reference §16.4 (ReplicasManagerRegisterTest) plus leader discovery, fencing and §16.7
testRestartWithChangedAddress at the unit level. Each "restart" builds a new manager on the same
store and identity files, which is what a broker actor restarted by Ray does.
"""

from __future__ import annotations

import asyncio

import pytest

from rocketray.broker.register import Identity, RegisterState
from rocketray.broker.replicas_manager import Role, State
from rocketray.wire.controller_api import Response
from rocketray.wire.controller_codes import ResponseCode
import replicas_manager_fakes as fakes

CLUSTER, GROUP = fakes.CLUSTER, fakes.GROUP
A1, A2 = "127.0.0.1:9000", "127.0.0.1:9001"


def identity_stores():
    """The in-memory store with faults, and the real identity files once broker.identity exists."""
    return ["mem", "file"]


@pytest.fixture(params=identity_stores())
def identity(request, tmp_path):
    if request.param == "mem":
        return fakes.MemIdentityStore()
    pytest.importorskip("rocketray.broker.identity")
    from rocketray.broker.register import FileIdentityStore

    return FileIdentityStore(str(tmp_path))


@pytest.fixture
def world():
    clock = fakes.FakeClock()
    return clock, fakes.FakeController(clock)


def run(coro):
    return asyncio.run(coro)


def test_register_success_runs_as_first_master(world, identity):
    """testBrokerRegisterSuccess: id 1 applied, files persisted, elected master 1 at epoch 1, unfenced."""
    clock, ctl = world
    b = fakes.Replica(ctl, clock, identity, A1)
    assert b.rm.fenced and not b.rm.writable
    assert run(b.rm.start_basic_service_once())
    assert b.rm.state == State.RUNNING and b.rm.register_state == RegisterState.REGISTERED
    assert b.rm.broker_id == 1 and b.ha.broker_id == 1
    assert identity.load() == Identity(CLUSTER, GROUP, 1)
    assert identity.load_temp() is None
    assert ctl.master() == (1, A1, 1)
    assert b.ha.roles() == [("change_to_master", 1)]
    assert b.rm.role == Role.MASTER and b.rm.writable and not b.rm.fenced
    assert b.rm.sync_state_set == {1} and b.rm.sync_state_set_epoch == 1
    assert ctl.names() == ["GetNextBrokerIdRequest", "ApplyBrokerIdRequest", "RegisterBrokerRequest",
                           "ElectMasterRequest"]
    assert len(ctl.heartbeat_log) == 1  # one heartbeat before the first election (it needs liveness)


@pytest.mark.parametrize("change", ["group", "cluster"])
def test_restart_with_changed_name_never_registers(world, identity, change):
    """testBrokerRegisterSuccessAndRestartWithChangedBrokerConfig: the identity file refuses a renamed broker."""
    clock, ctl = world
    b = fakes.Replica(ctl, clock, identity, A1)
    assert run(b.rm.start_basic_service_once())
    b.restart(**{change: "renamed"})
    for _ in range(3):
        assert not run(b.rm.start_basic_service_once())
    assert b.rm.register_state == RegisterState.CREATE_METADATA_FILE_DONE
    assert b.rm.state == State.FIRST_TIME_SYNC_CONTROLLER_METADATA_DONE and b.rm.fenced
    assert identity.load() == Identity(CLUSTER, GROUP, 1)


def test_fail_at_get_next_broker_id(world, identity):
    """testRegisterFailedAtGetNextBrokerId: nothing written, back to INITIAL; the next pass succeeds."""
    clock, ctl = world
    b = fakes.Replica(ctl, clock, identity, A1)
    ctl.fail("GetNextBrokerIdRequest")
    assert not run(b.rm.start_basic_service_once())
    assert b.rm.state == State.FIRST_TIME_SYNC_CONTROLLER_METADATA_DONE
    assert b.rm.register_state == RegisterState.INITIAL
    assert identity.load() is None and identity.load_temp() is None and b.rm.broker_id is None
    assert run(b.rm.start_basic_service_once()) and b.rm.broker_id == 1


def test_fail_at_create_temp_file():
    """testRegisterFailedAtCreateTempFile: the temp write fails: INITIAL, no files, no id."""
    clock = fakes.FakeClock()
    ctl = fakes.FakeController(clock)
    files = fakes.MemIdentityStore()
    files.fail_save_temp = True
    b = fakes.Replica(ctl, clock, files, A1)
    assert not run(b.rm.start_basic_service_once())
    assert b.rm.state == State.FIRST_TIME_SYNC_CONTROLLER_METADATA_DONE
    assert b.rm.register_state == RegisterState.INITIAL
    assert files.disk == {} and b.rm.broker_id is None
    files.fail_save_temp = False
    assert run(b.rm.start_basic_service_once()) and b.rm.broker_id == 1


@pytest.mark.parametrize("outcome", ["refuse"])  # a raise is an unknown outcome: tests/broker/test_register_unknown_outcome.py
def test_fail_at_apply_broker_id(world, identity, outcome):
    """testRegisterFailedAtApplyBrokerIdFailed: temp cleared, INITIAL, no identity; a retry starts over."""
    clock, ctl = world
    b = fakes.Replica(ctl, clock, identity, A1)
    ctl.fail("ApplyBrokerIdRequest", None if outcome == "raise" else
             Response.error(ResponseCode.CONTROLLER_BROKER_ID_INVALID, "Fail to apply brokerId"))
    assert not run(b.rm.start_basic_service_once())
    assert b.rm.state == State.FIRST_TIME_SYNC_CONTROLLER_METADATA_DONE
    assert b.rm.register_state not in (RegisterState.CREATE_METADATA_FILE_DONE, RegisterState.REGISTERED)
    assert identity.load() is None and identity.load_temp() is None and b.rm.broker_id is None
    assert run(b.rm.start_basic_service_once())
    assert ctl.names().count("GetNextBrokerIdRequest") == 2 and b.rm.broker_id == 1


def test_fail_at_create_identity_file_then_restart_reapplies():
    """testRegisterFailedAtCreateMetadataFileAndDeleteTemp: the temp file survives; a restarted broker
    re-applies the same id with the same check code (accepted idempotently) and ends with id 1."""
    clock = fakes.FakeClock()
    ctl = fakes.FakeController(clock)
    files = fakes.MemIdentityStore()
    files.fail_save = True
    b = fakes.Replica(ctl, clock, files, A1)
    assert not run(b.rm.start_basic_service_once())
    assert b.rm.register_state == RegisterState.CREATE_TEMP_METADATA_FILE_DONE
    temp = files.load_temp()
    assert temp is not None and temp.broker_id == 1 and temp.register_check_code.startswith(A1 + ";")
    assert files.load() is None and b.rm.broker_id is None
    assert 1 in ctl.state.replica_info[GROUP].broker_id_info  # the controller did apply it

    files.fail_save = False
    clock.advance(5000)  # a new check code would differ: the temp file's must be reused
    b.restart()
    assert run(b.rm.start_basic_service_once())
    assert b.rm.state == State.RUNNING and b.rm.register_state == RegisterState.REGISTERED
    assert files.load_temp() is None and files.load() == Identity(CLUSTER, GROUP, 1) and b.rm.broker_id == 1
    assert ctl.state.replica_info[GROUP].next_assign_broker_id == 2  # id 1 was not handed out twice
    assert "GetNextBrokerIdRequest" not in ctl.names()[ctl.names().index("ApplyBrokerIdRequest") + 1:]


def test_crash_after_temp_file_before_apply(world, identity):
    """Crash after the temp file, before APPLY reached the controller: the restart applies the temp id."""
    clock, ctl = world
    from rocketray.broker.register import TempIdentity

    b = fakes.Replica(ctl, clock, identity, A1)
    identity.save_temp(TempIdentity(CLUSTER, GROUP, 1, f"{A1};{clock()}"))  # what the crash left on disk
    b.restart()
    assert run(b.rm.start_basic_service_once())
    assert b.rm.broker_id == 1 and identity.load() == Identity(CLUSTER, GROUP, 1) and identity.load_temp() is None
    assert "GetNextBrokerIdRequest" not in ctl.names()


def test_fail_at_register_broker_then_restart(world, identity):
    """testRegisterFailedAtRegisterSuccess: identity persisted with id 1; a restart only registers."""
    clock, ctl = world
    b = fakes.Replica(ctl, clock, identity, A1)
    ctl.fail("RegisterBrokerRequest")
    assert not run(b.rm.start_basic_service_once())
    assert b.rm.register_state == RegisterState.CREATE_METADATA_FILE_DONE
    assert identity.load_temp() is None and identity.load() == Identity(CLUSTER, GROUP, 1) and b.rm.broker_id == 1
    b.restart()
    ctl.requests.clear()
    assert run(b.rm.start_basic_service_once())
    assert b.rm.state == State.RUNNING and b.rm.register_state == RegisterState.REGISTERED and b.rm.broker_id == 1
    assert ctl.names() == ["RegisterBrokerRequest", "ElectMasterRequest"]


def test_second_broker_registers_as_slave_of_the_controllers_master_address(world, identity):
    """The slave learns its master's HA address from the controller (no nameserver; quirk 9 fixed)."""
    clock, ctl = world
    b1 = fakes.Replica(ctl, clock, identity, A1)
    assert run(b1.rm.start_basic_service_once())
    b2 = fakes.Replica(ctl, clock, fakes.MemIdentityStore(), A2)
    assert run(b2.rm.start_basic_service_once())
    assert b2.rm.broker_id == 2 and b2.rm.role == Role.SLAVE and not b2.rm.fenced and not b2.rm.writable
    assert b2.ha.roles() == [("change_to_slave", A1, 1)]
    assert (b2.rm.master_broker_id, b2.rm.master_address, b2.rm.master_epoch) == (1, A1, 1)
    assert "ElectMasterRequest" not in ctl.names()[ctl.names().index("RegisterBrokerRequest", 4):]


def test_fenced_until_a_master_is_known(world):
    """Registered but no master electable: stays REGISTER_TO_CONTROLLER_DONE and fenced, heartbeating."""
    clock, ctl = world
    b = fakes.Replica(ctl, clock, fakes.MemIdentityStore(), A1)
    for _ in range(3):
        ctl.fail("ElectMasterRequest", Response.error(ResponseCode.CONTROLLER_ELECT_MASTER_FAILED, "no"))
        assert not run(b.rm.start_basic_service_once())
        assert b.rm.state == State.REGISTER_TO_CONTROLLER_DONE and b.rm.fenced and not b.rm.writable
    assert len(ctl.heartbeat_log) == 3
    assert run(b.rm.start_basic_service_once()) and not b.rm.fenced


def test_no_heartbeat_before_a_broker_id(world):
    """Heartbeats are skipped while the broker has no registered id (isolated)."""
    clock, ctl = world
    b = fakes.Replica(ctl, clock, fakes.MemIdentityStore(), A1)
    assert not run(b.rm.heartbeat_once())
    ctl.fail("GetNextBrokerIdRequest")
    run(b.rm.start_basic_service_once())
    assert not run(b.rm.heartbeat_once()) and ctl.heartbeat_log == []


def test_restart_with_changed_address_keeps_id_and_controller_learns_it(world, identity):
    """§16.7 testRestartWithChangedAddress: same id, still master, controller's master address has the
    new port. Deliberate difference: the restarted master does not resume its old term, it asks for
    a new one, so the epoch is 2 (see test_replicas_manager_roles, new-term tests)."""
    clock, ctl = world
    b = fakes.Replica(ctl, clock, identity, A1)
    assert run(b.rm.start_basic_service_once())
    b.restart(address="127.0.0.1:9555")
    assert run(b.rm.start_basic_service_once())
    assert b.rm.broker_id == 1 and b.rm.role == Role.MASTER and b.rm.master_address == "127.0.0.1:9555"
    master_id, master_address, epoch = ctl.master()
    assert master_id == 1 and master_address == "127.0.0.1:9555" and epoch == 2
    assert ctl.state.replica_info[GROUP].next_assign_broker_id == 2


def test_restart_after_heartbeat_expiry_reclaims_mastership(world, identity):
    """A lone master restarted after its heartbeat expired: registration says no live master, the
    broker-triggered election names it (old master, in the SSS, alive again), and since that term
    predates the restart it asks for a new one: master again at epoch 2."""
    clock, ctl = world
    b = fakes.Replica(ctl, clock, identity, A1)
    assert run(b.rm.start_basic_service_once())
    clock.advance(60_000)
    b.restart()
    assert run(b.rm.start_basic_service_once())
    assert b.rm.role == Role.MASTER and b.rm.master_epoch == 2 and ctl.master() == (1, A1, 2)


def test_leader_discovery_and_not_leader_hint():
    """Metadata is asked node by node (an unreachable node is skipped); NOT_LEADER's hint is followed."""
    clock = fakes.FakeClock()
    nodes = ("127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003")
    ctl = fakes.FakeController(clock, nodes, leader=nodes[2])
    b = fakes.Replica(ctl, clock, fakes.MemIdentityStore(), A1)
    assert run(b.rm.sync_controller_metadata_once()) and b.rm.controller_leader_address == nodes[2]
    b.rm.controller_leader_address = nodes[0]  # stale: the leader moved
    assert run(b.rm.start_basic_service_once())
    assert b.rm.controller_leader_address == nodes[2]
    ctl.leader = nodes[1]
    assert run(b.rm.sync_metadata_once()) is None and b.rm.controller_leader_address == nodes[1]


def test_transport_failure_forgets_the_leader(world):
    clock, ctl = world
    b = fakes.Replica(ctl, clock, fakes.MemIdentityStore(), A1)
    assert run(b.rm.start_basic_service_once())
    ctl.down = True
    with pytest.raises(fakes.ControllerCallError):
        run(b.rm.sync_metadata_once())
    assert b.rm.controller_leader_address is None
    ctl.down = False
    run(b.rm.sync_metadata_once())
    assert b.rm.controller_leader_address == ctl.leader


def test_client_whose_metadata_fans_out_itself():
    """rocketray.actors.controller_client style: ``metadata()`` without an address returns one dict per node."""
    clock = fakes.FakeClock()
    ctl = fakes.FakeController(clock, ("127.0.0.1:7001", "127.0.0.1:7002"), leader="127.0.0.1:7002")

    class FanOut:
        def __init__(self, inner):
            self.inner = inner

        async def call(self, request, address=None):
            return await self.inner.call(request, address)

        async def heartbeat(self, request):
            await self.inner.heartbeat(request)

        async def metadata(self):
            return [{"leader_address": None}, {"leader_address": self.inner.leader}]

    b = fakes.Replica(ctl, clock, fakes.MemIdentityStore(), A1)
    b.rm.client = FanOut(ctl)
    assert run(b.rm.start_basic_service_once()) and b.rm.controller_leader_address == "127.0.0.1:7002"


def test_crash_after_identity_file_before_temp_cleared(world, identity):
    """Both files on disk (crash between writing the identity and clearing the temp): the identity wins."""
    from rocketray.broker.register import TempIdentity

    clock, ctl = world
    b = fakes.Replica(ctl, clock, identity, A1)
    assert run(b.rm.start_basic_service_once())
    identity.save_temp(TempIdentity(CLUSTER, GROUP, 7, f"{A1};1"))
    b.restart()
    ctl.requests.clear()
    assert run(b.rm.start_basic_service_once()) and b.rm.broker_id == 1
    # register only (no id applied again); the restarted master then asks for a new term
    assert ctl.names() == ["RegisterBrokerRequest", "ElectMasterRequest"] and identity.load_temp() is None
