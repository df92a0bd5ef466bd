"""The OS-level nemeses' shells, the parts that need no cluster: who the members are and which
ports they own, which files of a real store a fault may hit (a preallocated segment's data ends at
its last record, not its size), and the controller run's direct Raft topology."""

from __future__ import annotations

from pathlib import Path

from rocketray.broker.config import StoreConfig
from rocketray.wire.message import Message
from rocketray.broker.store import MessageStore
from rocketray.chaos.controller_faults import direct_topology
from rocketray.chaos.os_nemesis import CLIENT, members_of, store_files
from rocketray.spec import BrokerSpec, ClusterSpec, ControllerSpec


def test_members_own_their_advertised_ha_port_and_client_port_not_the_proxied_listen_port():
    spec = ClusterSpec("n", "c", "/d", "fast",
                       (ControllerSpec(0, "127.0.0.1", 9001, "/c0", session_port=9101),
                        ControllerSpec(1, "127.0.0.1", 9002, "/c1")),
                       (BrokerSpec("broker-a", 0, "127.0.0.1", 9200, "/b0", listen_port=9300, client_port=9400),))
    assert members_of(spec) == [("controller-0", (9001, 9101)), ("controller-1", (9002,)),
                                ("broker-a/r0", (9200, 9400)), (CLIENT, ())]


def test_store_files_name_every_target_and_where_a_segment_s_data_ends(tmp_path: Path):
    with MessageStore(tmp_path, StoreConfig(segment_size_bytes=4096, background_thread=False)) as store:
        store.epoch_file.append(1, 0)
        store.put_messages([Message("T", 0, b"x" * 100)], now_ms=1)
        store.confirm_offset = store.max_offset
        end = store.max_offset
    files = {f.path: f for f in store_files(tmp_path)}
    seg = files["commitlog/00000000000000000000"]
    assert seg.size == 4096 and seg.data_end == end          # preallocated: only its records are data
    assert {"epochFileCheckpoint", "epochFileCheckpoint.bak", "storeCheckpoint",
            "consumequeue/T/0/00000000000000000000"} <= set(files)
    assert not any(p.startswith("brokerIdentity") for p in files)


def test_direct_topology_peers_are_the_other_nodes_real_addresses():
    topo = direct_topology(["127.0.0.2:1", "127.0.0.2:2", "127.0.0.2:3"])
    assert topo.peer_addresses[1] == ("127.0.0.2:1", "127.0.0.2:3") and topo.links == ()
    assert topo.node_of("127.0.0.2:3") == 2 and topo.node_of("127.0.0.1:9") is None
