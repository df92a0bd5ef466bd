"""The actors' typed answers (``actors/views.py``): what crosses Ray and what leaves as JSON."""

from __future__ import annotations

import json
import pickle

from rocketray.actors.views import (ControllerMetadata, EpochEntry, HAStatus, MasterView, QueuePosition, Role,
                                    StoredMessage, to_json)

from broker_status_factory import broker_status

HA_DICT = {"broker_id": 2, "role": "NONE", "epoch": 0, "max_offset": 10, "confirm_offset": 5,
           "epoch_entries": [[1, 0]], "sync_state_set": [2], "sync_state_set_view": [2], "pending_proposals": [[1, 2]],
           "synchronizing": False, "connections": [{"slave_id": 3, "peer": "h:1", "ack_offset": 4,
                                                    "async_learner": True, "state": "TRANSFER"}],
           "master_address": None, "slave_connected": False, "slave_last_error": "", "rejected_connections": 1}


def test_status_json_keeps_the_keys_and_writes_roles_by_name():
    """A replica with no role yet reads NONE (it was "slave" as a string); JSON keys are the field names,
    epoch entries stay [epoch, start, end] lists and queues stay objects."""
    st = broker_status(role=Role.NONE, epoch_entries=(EpochEntry(1, 0, 100),),
                       queues=(QueuePosition("T", 0, 0, 3, 2),))
    out = json.loads(json.dumps(to_json(st)))
    assert out["role"] == "NONE" and out["ha"]["role"] == "MASTER"
    assert out["epoch_entries"] == [[1, 0, 100]]
    assert out["queues"] == [{"topic": "T", "queue_id": 0, "min_offset": 0, "max_offset": 3, "visible_offset": 2}]
    assert out["ha"]["connections"][0]["slave_id"] == 2 and out["sync_state_set"] == [1, 2]
    assert not st.is_master and not st.is_running_slave


def test_role_predicates():
    assert broker_status().is_running_master
    assert not broker_status(running=False).is_running_master
    assert broker_status(role=Role.SLAVE).is_running_slave and not broker_status(role=Role.SLAVE).is_master


def test_views_survive_pickle_as_ray_sends_them():
    st = broker_status(epoch_entries=(EpochEntry(1, 0, 100),))
    assert pickle.loads(pickle.dumps(st)) == st
    msg = StoredMessage("T", 0, 1, 64, b"x", {"k": "v"}, 5, 2)
    assert pickle.loads(pickle.dumps(msg)) == msg


def test_ha_status_from_the_ha_service_dict():
    """Every key of ``HAService.status()`` is read; the role string becomes the enum (``none`` -> NONE)."""
    ha = HAStatus.from_dict(HA_DICT)
    assert ha.role is Role.NONE and ha.pending_proposals == ((1, 2),) and ha.connections[0].async_learner
    assert to_json(ha)["epoch_entries"] == [[1, 0]]


NODE_MD = {"self_address": "h:1", "self_id": "n0", "leader_address": "h:1", "leader_id": "n0", "is_leader": True,
           "raft_role": "leader", "term": 4, "peers": ["h:1", "h:2", "h:3"], "commit_index": 9, "last_applied": 9,
           "applied_index": 9, "journal_len": 9, "snapshot_last_index": None, "snapshots_saved": 0,
           "max_tick_ms": 1.25}


def test_controller_metadata_json_is_the_flat_object_status_printed_before():
    """``rocketray status --json`` keeps every key ControllerNode.metadata() has plus the actor's three,
    flat; the typed fields are read from the node's answer (a null snapshot index reads 0)."""
    md = ControllerMetadata.from_node(2, NODE_MD, broker_sessions=3, session_grace_deaths=1)
    assert md.is_leader and md.term == 4 and md.peers == ("h:1", "h:2", "h:3") and md.snapshot_last_index == 0
    out = json.loads(json.dumps(to_json(md)))
    assert set(out) == set(NODE_MD) | {"index", "broker_sessions", "session_grace_deaths"}
    assert out["index"] == 2 and out["journal_len"] == 9 and out["peers"] == ["h:1", "h:2", "h:3"]
    assert pickle.loads(pickle.dumps(md)) == md


def test_master_view_crosses_ray_as_a_value():
    view = MasterView(master_epoch=3, master_broker_id=2, master_address="h:2")
    assert pickle.loads(pickle.dumps(view)) == view and to_json(view)["master_address"] == "h:2"
