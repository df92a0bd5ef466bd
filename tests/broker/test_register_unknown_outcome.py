"""A registration whose APPLY_BROKER_ID outcome is unknown keeps its temp identity file and
re-applies the same id (issue 16, problem 4). Before, a timeout (the broker's controller client
gave up after 3 s while the write could still commit) cleared the temp file: the next pass asked for
a new id and the applied one was orphaned."""

from __future__ import annotations

import asyncio

import pytest

from rocketray.broker.register import FileIdentityStore, Registrar, RegisterState
from rocketray.wire.controller_api import ApplyBrokerIdRequest, Response
from rocketray.wire.controller_codes import ResponseCode
from rocketray.controller.decide import DecideContext, decide
from rocketray.controller.state import ControllerState

CLUSTER, GROUP, ADDRESS = "c", "g", "127.0.0.1:9000"


class Controller:
    """The real pure core; ``lose_next_apply`` commits the next APPLY and then loses its answer."""

    def __init__(self) -> None:
        self.state = ControllerState()
        self.lose_next_apply: BaseException | Response | None = None

    async def call(self, request):
        response, events = decide(self.state, request, DecideContext())
        for event in events:
            self.state.apply(event)
        if isinstance(request, ApplyBrokerIdRequest) and self.lose_next_apply is not None:
            lost, self.lose_next_apply = self.lose_next_apply, None
            if isinstance(lost, BaseException):
                raise lost
            return lost
        return response


@pytest.mark.parametrize("lost", [TimeoutError("controller call timed out"),
                                  Response.error(ResponseCode.SYSTEM_ERROR, "not committed within 3000 ms; outcome unknown"),
                                  Response.error(ResponseCode.CONTROLLER_NOT_LEADER, "leader changed")],
                         ids=["timeout", "system-error", "not-leader"])
def test_unknown_apply_outcome_keeps_the_temp_file_and_reapplies_the_same_id(tmp_path, lost):
    files = FileIdentityStore(str(tmp_path))
    controller = Controller()
    controller.lose_next_apply = lost
    registrar = Registrar(CLUSTER, GROUP, ADDRESS, files, now_ms=lambda: 1700000000000)
    assert asyncio.run(registrar.ensure_broker_id(controller.call)) is None
    temp = files.load_temp()
    assert temp is not None and temp.broker_id == 1                   # kept for the retry
    assert registrar.state == RegisterState.CREATE_TEMP_METADATA_FILE_DONE
    assert asyncio.run(registrar.ensure_broker_id(controller.call)) == 1
    assert files.load().broker_id == 1 and files.load_temp() is None
    ids = controller.state.replica_info[GROUP].broker_id_info
    assert sorted(ids) == [1], ids                                    # no orphaned id


def test_a_definite_refusal_still_clears_the_temp_file(tmp_path):
    files = FileIdentityStore(str(tmp_path))
    controller = Controller()
    controller.lose_next_apply = Response.error(ResponseCode.CONTROLLER_BROKER_ID_INVALID, "taken")
    registrar = Registrar(CLUSTER, GROUP, ADDRESS, files, now_ms=lambda: 1)
    assert asyncio.run(registrar.ensure_broker_id(controller.call)) is None
    assert files.load_temp() is None and registrar.state == RegisterState.INITIAL
