"""Actor answers for one-layer tests (metrics, settle, CLI output): a ``BrokerStatus`` of a running master
of broker-a with one caught-up slave connected, a leader's ``ControllerMetadata``; override any field by
keyword."""

from __future__ import annotations

import dataclasses

from rocketray.actors.views import BrokerStatus, ControllerMetadata, HAConnection, HAStatus, Role

_DEFAULT = object()


def ha_connection(slave_id: int | None, ack_offset: int) -> HAConnection:
    return HAConnection(slave_id, "10.0.0.9:1", ack_offset, False, "TRANSFER")


def broker_status(ha=_DEFAULT, **kw) -> BrokerStatus:
    if ha is _DEFAULT:
        ha = HAStatus(broker_id=1, role=Role.MASTER, epoch=2, max_offset=1000, confirm_offset=900,
                      epoch_entries=((2, 0),), sync_state_set=(1, 2), sync_state_set_view=(1, 2),
                      pending_proposals=(), synchronizing=False,
                      connections=(ha_connection(2, 900), ha_connection(3, -1)),
                      master_address=None, slave_connected=False, slave_last_error="", rejected_connections=0)
    st = BrokerStatus(group="broker-a", replica=0, ha_address="10.0.0.1:1", broker_id=1, state="RUNNING",
                      running=True, role=Role.MASTER, fenced=False, master_broker_id=1, master_address="10.0.0.1:1",
                      master_epoch=2, sync_state_set=(1, 2), sync_state_set_epoch=3, min_offset=0, max_offset=1000,
                      confirm_offset=900, epoch_entries=(), queues=(), ha=ha, pid=1, controller_session=None,
                      max_loop_stall_ms=0.0)
    return dataclasses.replace(st, **kw)


def controller_metadata(**kw) -> ControllerMetadata:
    md = ControllerMetadata(index=0, self_address="10.0.0.1:9000", self_id="n0", leader_address="10.0.0.1:9000",
                            leader_id="n0", is_leader=True, raft_role="leader", term=3,
                            peers=("10.0.0.1:9000", "10.0.0.2:9000", "10.0.0.3:9000"), commit_index=40,
                            applied_index=40, snapshot_last_index=0, snapshots_saved=0, broker_sessions=3,
                            session_grace_deaths=0, raft={"journal_len": 40, "max_tick_ms": 1.5})
    return dataclasses.replace(md, **kw)
