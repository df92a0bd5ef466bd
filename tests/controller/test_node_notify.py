"""Role-change notifications: once per election, to live members only, with the trigger label
(issue 16, problem 3). Before, a broker- or admin-triggered election was notified twice (by the
node's callback and again by the actor's handle) and counted under the label "controller"."""

from __future__ import annotations

import pytest

from rocketray.wire.controller_api import (AlterSyncStateSetRequest, ApplyBrokerIdRequest, ElectMasterRequest,
                                           RegisterBrokerRequest)
from rocketray.wire.controller_codes import ResponseCode as C
from rocketray.controller.config import ControllerConfig
from rocketray.controller.notify import ElectionTrigger
from rocketray.controller.proc import InProcessControllers

CLUSTER, NAME = "c", "g"


@pytest.fixture
def one_node(tmp_path, port_factory):
    alive = {1, 2, 3}
    notices = []
    cluster = InProcessControllers(tmp_path / "n", [port_factory()], ControllerConfig.for_tests(),
                           alive=lambda name, broker_id: broker_id in alive, on_role_changed=notices.append)
    yield cluster.wait_leader(), alive, notices
    cluster.close()


def register(node, broker_id):
    address = f"127.0.0.1:{9000 + broker_id}"
    assert node.handle(ApplyBrokerIdRequest(CLUSTER, NAME, broker_id, f"{address};1")).ok
    assert node.handle(RegisterBrokerRequest(CLUSTER, NAME, broker_id, address)).ok


@pytest.mark.slow
def test_each_election_is_notified_once_to_live_members_with_its_trigger(one_node):
    node, alive, notices = one_node
    for broker_id in (1, 2, 3):
        register(node, broker_id)
    alive.discard(3)
    assert node.handle(ElectMasterRequest.of_broker_trigger(CLUSTER, NAME, 1)).ok
    assert len(notices) == 1
    notice = notices[0]
    assert notice.trigger is ElectionTrigger.BROKER and notice.master_broker_id == 1 and notice.master_epoch == 1
    assert [broker_id for broker_id, _ in notice.targets] == [1, 2]          # 3 is dead: not told

    assert node.handle(AlterSyncStateSetRequest(NAME, 1, 1, frozenset({1, 2}), 1)).ok
    alive.discard(1)                                                          # the master dies
    response = node.trigger_elect_master(NAME)
    assert response.ok, response
    assert len(notices) == 2
    notice = notices[1]
    assert notice.trigger is ElectionTrigger.CONTROLLER and notice.master_broker_id == 2
    assert [broker_id for broker_id, _ in notice.targets] == [2]
    assert notice.notification().sync_state_set == frozenset({2})

    # an election that elects nobody new (the master is alive) notifies nobody
    assert node.handle(ElectMasterRequest.of_broker_trigger(CLUSTER, NAME, 2)).code == C.CONTROLLER_MASTER_STILL_EXIST
    assert len(notices) == 2


def test_trigger_labels():
    assert ElectionTrigger.of(ElectMasterRequest.of_broker_trigger(CLUSTER, NAME, 1)) is ElectionTrigger.BROKER
    assert ElectionTrigger.of(ElectMasterRequest.of_admin_trigger(CLUSTER, NAME, 1)) is ElectionTrigger.ADMIN
    assert ElectionTrigger.of(ElectMasterRequest.of_controller_trigger(NAME)) is ElectionTrigger.CONTROLLER


@pytest.mark.parametrize("master, alive_ids, order", [
    (3, {1, 2, 3}, [3, 1, 2]),
    (1, {1, 2, 3}, [1, 2, 3]),
    (2, {2, 3}, [2, 3]),
    (2, {1, 3}, [1, 3]),        # a master no longer alive is not told (the live ones are)
])
def test_the_new_master_is_told_first(master, alive_ids, order):
    """It has a switch to make before it takes writes; the others only follow it."""
    from rocketray.wire.controller_api import Response
    from rocketray.wire.controller_headers import ElectMasterResponseHeader
    from rocketray.controller.notify import role_change_notice

    response = Response(C.SUCCESS, ElectMasterResponseHeader(master, f"h:{master}", 4, 5),
                        {"broker_member_group": {"broker_name": NAME,
                                                 "broker_addrs": {b: f"h:{b}" for b in (1, 2, 3)}},
                         "sync_state_set": [master]})
    notice = role_change_notice(response, ElectionTrigger.CONTROLLER, lambda name, b: b in alive_ids)
    assert notice is not None and [b for b, _ in notice.targets] == order
