"""mqadmin-style output of the admin commands: exact lines for each command and for errors."""

from __future__ import annotations

import pytest

from rocketray.cli.admin_format import (
    format_controller_events,
    format_broker_epoch,
    format_broker_epochs,
    format_clean_broker_metadata,
    format_controller_config,
    format_controller_metadata,
    format_elect_master,
    format_error,
    format_sync_state_set,
    format_update_controller_config,
    java_str,
)
from rocketray.wire.controller_codes import ResponseCode


def test_controller_metadata_with_rocketmq_peer_string():
    """getControllerMetaData: group, leader id/address, one #Peer line per 'id:addr;' entry."""
    meta = {"group": "rocketray", "controller_leader_id": "n1", "controller_leader_address": "10.0.0.2:9878",
            "peers": "n0:10.0.0.1:9878;n1:10.0.0.2:9878;"}
    assert format_controller_metadata(meta) == (
        "#ControllerGroup\trocketray\n"
        "#ControllerLeaderId\tn1\n"
        "#ControllerLeaderAddress\t10.0.0.2:9878\n"
        "#Peer:\tn0:10.0.0.1:9878\n"
        "#Peer:\tn1:10.0.0.2:9878")


def test_controller_metadata_node_keys_peer_map_and_no_leader():
    """The node's own keys (leader_id, leader_address) work; peers as a map print in id order; null leader."""
    meta = {"leader_id": None, "leader_address": None, "peers": {"n1": "b:2", "n0": "a:1"}}
    assert format_controller_metadata(meta) == (
        "#ControllerGroup\tnull\n#ControllerLeaderId\tnull\n#ControllerLeaderAddress\tnull\n"
        "#Peer:\tn0:a:1\n#Peer:\tn1:b:2")


def test_sync_state_set_blocks_per_broker_set():
    """getSyncStateSet: one block per broker set in name order, in-sync count, ReplicaIdentity lines."""
    body = {"replicas_info_table": {
        "broker-b": {"master_broker_id": None, "master_address": None, "master_epoch": 3,
                     "sync_state_set_epoch": 4, "in_sync_replicas": [],
                     "not_in_sync_replicas": [{"broker_name": "broker-b", "broker_id": 1,
                                               "broker_address": "h:2", "alive": False}]},
        "broker-a": {"master_broker_id": 1, "master_address": "h:1", "master_epoch": 2, "sync_state_set_epoch": 5,
                     "in_sync_replicas": [{"broker_name": "broker-a", "broker_id": 1, "broker_address": "h:1",
                                           "alive": True},
                                          {"broker_name": "broker-a", "broker_id": 2, "broker_address": "h:3",
                                           "alive": True}],
                     "not_in_sync_replicas": []},
    }}
    assert format_sync_state_set(body) == (
        "#brokerName\tbroker-a\n"
        "#MasterBrokerId\t1\n"
        "#MasterAddr\th:1\n"
        "#MasterEpoch\t2\n"
        "#SyncStateSetEpoch\t5\n"
        "#SyncStateSetNums\t2\n"
        "InSyncReplica:\tReplicaIdentity{brokerName='broker-a', brokerId=1, brokerAddress='h:1', alive=true}\n"
        "InSyncReplica:\tReplicaIdentity{brokerName='broker-a', brokerId=2, brokerAddress='h:3', alive=true}\n"
        "\n"
        "#brokerName\tbroker-b\n"
        "#MasterBrokerId\tnull\n"
        "#MasterAddr\tnull\n"
        "#MasterEpoch\t3\n"
        "#SyncStateSetEpoch\t4\n"
        "#SyncStateSetNums\t0\n"
        "NotInSyncReplica:\tReplicaIdentity{brokerName='broker-b', brokerId=1, brokerAddress='h:2', alive=false}")


def test_sync_state_set_of_empty_table_is_empty():
    assert format_sync_state_set({"replicas_info_table": {}}) == ""


def test_broker_epoch_last_end_is_max_offset():
    """getBrokerEpoch: header lines, one #Epoch line per entry, the last end offset replaced by max_offset."""
    cache = {"cluster_name": "c1", "broker_name": "broker-a", "broker_id": 0, "max_offset": 900,
             "epoch_list": [{"epoch": 1, "start_offset": 0, "end_offset": 300},
                            {"epoch": 2, "start_offset": 300, "end_offset": 2**63 - 1}]}
    assert format_broker_epoch(cache, "10.0.0.1:10911") == (
        "#clusterName\tc1\n"
        "#brokerName\tbroker-a\n"
        "#brokerAddr\t10.0.0.1:10911\n"
        "#brokerId\t0\n"
        "#Epoch: EpochEntry{epoch=1, startOffset=0, endOffset=300}\n"
        "#Epoch: EpochEntry{epoch=2, startOffset=300, endOffset=900}")


def test_broker_epochs_accept_triples_and_join_blocks():
    """Entries may be [epoch, start, end] triples (replicas.json style); several brokers are blank-line separated."""
    a = {"cluster_name": "c", "broker_name": "b", "broker_id": 0, "epoch_list": [[1, 0, 10]], "max_offset": 10}
    b = {"cluster_name": "c", "broker_name": "b", "broker_id": 1, "epoch_list": [], "max_offset": 0}
    assert format_broker_epochs([("h:1", a), ("h:2", b)]) == (
        "#clusterName\tc\n#brokerName\tb\n#brokerAddr\th:1\n#brokerId\t0\n"
        "#Epoch: EpochEntry{epoch=1, startOffset=0, endOffset=10}\n"
        "\n"
        "#clusterName\tc\n#brokerName\tb\n#brokerAddr\th:2\n#brokerId\t1")


def test_elect_master_prints_member_lines_quirk_14_fixed():
    """electMaster: header lines then one '\\t#Broker\\t<id>\\t<addr>' per member, by id.
    Quirk 14 FIXED: mqadmin never prints the member lines; we do (ids may arrive as strings after JSON)."""
    header = {"master_broker_id": 2, "master_address": "h:2", "master_epoch": 7, "sync_state_set_epoch": 9}
    body = {"sync_state_set": [2], "sync_state_set_epoch": 9,
            "broker_member_group": {"cluster": "c1", "broker_name": "broker-a",
                                    "broker_addrs": {"10": "h:10", "2": "h:2", "1": "h:1"}}}
    assert format_elect_master("c1", "broker-a", header, body) == (
        "#ClusterName\tc1\n"
        "#BrokerName\tbroker-a\n"
        "#BrokerMasterAddr\th:2\n"
        "#MasterEpoch\t7\n"
        "#SyncStateSetEpoch\t9\n"
        "\t#Broker\t1\th:1\n"
        "\t#Broker\t2\th:2\n"
        "\t#Broker\t10\th:10")


def test_elect_master_without_member_group():
    """MASTER_STILL_EXIST-style bodies carry no broker_member_group: no member lines."""
    header = {"master_broker_id": 1, "master_address": "h:1", "master_epoch": 3, "sync_state_set_epoch": 2}
    assert format_elect_master("c", "b", header, {"sync_state_set": [1], "sync_state_set_epoch": 2}) == (
        "#ClusterName\tc\n#BrokerName\tb\n#BrokerMasterAddr\th:1\n#MasterEpoch\t3\n#SyncStateSetEpoch\t2")
    assert format_elect_master("c", "b", header, None).endswith("#SyncStateSetEpoch\t2")


def test_clean_broker_metadata():
    assert format_clean_broker_metadata("broker-a") == "clear broker broker-a metadata from controller success!"


def test_controller_config_banner_and_padded_keys():
    """getControllerConfig: a banner per controller, then '%-50s=  %s' lines in key order."""
    configs = {"h:1": {"scan_not_active_broker_interval_ms": 5000, "enable_elect_unclean_master": False},
               "h:2": {"controller_store_path": ""}}
    assert format_controller_config(configs) == (
        "============h:1============\n"
        "enable_elect_unclean_master" + " " * 23 + "=  false\n"
        "scan_not_active_broker_interval_ms" + " " * 16 + "=  5000\n"
        "============h:2============\n"
        "controller_store_path" + " " * 29 + "=  ")


def test_update_controller_config():
    assert format_update_controller_config(["h:1", "h:2"], "enable_elect_unclean_master", True) == (
        "update controller config success![h:1, h:2]\nenable_elect_unclean_master : true")
    assert format_update_controller_config(None, "k", "v") == "update controller config success!\nk : v"


@pytest.mark.parametrize("code, remark, expected", [
    (ResponseCode.CONTROLLER_NOT_LEADER, "not the leader", "CONTROLLER_NOT_LEADER (2007): not the leader"),
    (16, "Can not update config in black list.", "NO_PERMISSION (16): Can not update config in black list."),
    (2012, "", "CONTROLLER_ELECT_MASTER_FAILED (2012)"),
    (4242, "odd", "UNKNOWN (4242): odd"),
])
def test_error_line(code, remark, expected):
    """Errors: '<CODE_NAME> (<code>): <remark>'."""
    assert format_error(code, remark) == expected


def test_java_str():
    assert [java_str(v) for v in (None, True, False, 0, "x")] == ["null", "true", "false", "0", "x"]


def test_controller_events_one_line_each_with_utc_time_and_the_state_after():
    """Index.seq, UTC decision time, type, group, the event's own fields, then the group's state."""
    events = [
        {"index": 12, "seq": 1, "term": 2, "time_ms": 1_700_000_000_123, "type": "ElectMasterEvent",
         "new_master_elected": True, "broker_name": "broker-a", "new_master_broker_id": 2,
         "master_broker_id": 2, "master_epoch": 3, "sync_state_set": [2], "sync_state_set_epoch": 4},
        {"index": 13, "seq": 0, "term": 2, "time_ms": None, "type": "CleanBrokerDataEvent",
         "broker_name": "broker-b", "broker_id_set_to_clean": None, "master_broker_id": None,
         "master_epoch": None, "sync_state_set": None, "sync_state_set_epoch": None},
    ]
    lines = format_controller_events(events, [[3, 9]]).splitlines()
    assert lines[0] == ("12.1\t2023-11-14T22:13:20.123Z\tElectMasterEvent\tbroker-a\tnew_master_elected=true "
                        "new_master_broker_id=2\t-> master=2 epoch=3 sss=[2]@4")
    assert lines[1] == "13.0\t-\tCleanBrokerDataEvent\tbroker-b\tbroker_id_set_to_clean=null\t-> (group removed)"
    assert lines[2] == "# entries 3..9 were not logged by any reachable controller"
    assert format_controller_events([]) == "(no events)"
