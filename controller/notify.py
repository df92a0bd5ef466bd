"""Role-change notifications (reference 5.5): what to push after an election, and to whom.

Theory of operation. After an election commits, the controller pushes the new master, its epoch
and the SyncStateSet to the group's brokers so they switch roles without waiting for their next
poll. The node that ran the election builds one ``RoleChangeNotice`` per successful election,
whoever triggered it (broker, admin or the controller's own scans), and hands it to its
``on_role_changed`` callback exactly once; the callback (the controller actor) only delivers it.
Only members the node currently sees alive (its heartbeat table) are targets: a dead member would
only cost a failed call, and it learns the role when it registers again.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable

from rocketray.wire.controller_api import ElectMasterRequest, MasterInfo, Response
from rocketray.wire.controller_codes import ResponseCode
from rocketray.wire.controller_headers import ElectMasterResponseHeader

Alive = Callable[[str, int], bool]


class ElectionTrigger(str, enum.Enum):
    """Who asked for an election (the metric label ``trigger``)."""

    BROKER = "broker"
    ADMIN = "admin"
    CONTROLLER = "controller"

    @classmethod
    def of(cls, request: ElectMasterRequest) -> ElectionTrigger:
        if request.is_controller_trigger:
            return cls.CONTROLLER
        return cls.ADMIN if request.designate_elect else cls.BROKER


@dataclass(frozen=True, slots=True)
class RoleChangeNotice:
    """One election's outcome and the live members to tell (``targets``: (broker_id, address), the new
    master first, then by broker id)."""

    trigger: ElectionTrigger
    broker_name: str
    master_broker_id: int
    master_address: str | None
    master_epoch: int
    sync_state_set_epoch: int
    sync_state_set: tuple[int, ...]
    targets: tuple[tuple[int, str], ...]

    def notification(self) -> MasterInfo:
        """What a broker's ``on_role_change`` receives (the one shape of a notification)."""
        return MasterInfo(self.master_broker_id, self.master_address, self.master_epoch,
                          self.sync_state_set_epoch, frozenset(self.sync_state_set))


def role_change_notice(response: Response, trigger: ElectionTrigger, alive: Alive) -> RoleChangeNotice | None:
    """The notice for a successful election response, or None (failed, or no master elected)."""
    body = response.body or {}
    header = response.header
    group = body.get("broker_member_group")
    if response.code != ResponseCode.SUCCESS or not group or not isinstance(header, ElectMasterResponseHeader) \
            or header.master_broker_id is None or header.master_epoch is None:
        return None
    name = str(group["broker_name"])
    # the new master first: it has a switch to make before it can take writes, the others only follow
    master = header.master_broker_id
    targets = tuple(sorted(((int(bid), str(addr)) for bid, addr in (group.get("broker_addrs") or {}).items()
                            if alive(name, int(bid))), key=lambda t: (t[0] != master, t[0])))
    return RoleChangeNotice(trigger, name, header.master_broker_id, header.master_address, header.master_epoch,
                            int(header.sync_state_set_epoch or 0), tuple(sorted(body.get("sync_state_set") or [])),
                            targets)
