"""The fault-injecting proxy: the address plan fits pysyncobj's dial rule, bytes stall and flow per
direction, and a real pysyncobj cluster elects, fails over and heals through it."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from rocketray.chaos.proxy import (LinkPlan, ProxyNetwork, Topology, allocate_addresses, plan_topology,
                                reserve_ports)

from rr_testing import wait_until


def pysyncobj_dialer(self_address: str, peer_entry: str) -> bool:
    """pysyncobj's ``TCPTransport._shouldConnect`` rule for a non-readonly node."""
    return self_address > peer_entry


def pair_count(n: int) -> int:
    return n * (n - 1) // 2


def addresses(host, ports):
    return sorted(f"{host}:{p}" for p in ports)


@pytest.mark.parametrize("nodes, proxies", [
    (addresses("127.0.0.2", [9999, 10000, 20000]), addresses("127.0.0.1", [40000, 40001, 5])),
    (addresses("127.0.0.2", range(25000, 25005)), addresses("127.0.0.1", range(41000, 41010))),
    (addresses("127.0.0.1", [50001, 50002, 50003]), addresses("127.0.0.1", [40001, 40002, 40003])),
    (["127.0.0.2:1"], []),
])
def test_plan_matches_pysyncobj_dial_and_identify_rules(nodes, proxies):
    # For every pair exactly one node dials, it dials a proxy in front of the other, and the other
    # knows it by the very address it announces (its own), as TCPTransport requires.
    topo = plan_topology(nodes, proxies)
    n = len(nodes)
    assert len(topo.links) == pair_count(n)
    for i in range(n):
        assert len(topo.peer_addresses[i]) == n - 1
        for j in range(n):
            if i == j:
                continue
            entry_ij = topo.peer_addresses[i][j if j < i else j - 1]
            entry_ji = topo.peer_addresses[j][i if i < j else i - 1]
            dial_ij = pysyncobj_dialer(topo.self_addresses[i], entry_ij)
            dial_ji = pysyncobj_dialer(topo.self_addresses[j], entry_ji)
            assert dial_ij != dial_ji, (i, j)
            dialer, acceptor, entry = (i, j, entry_ij) if dial_ij else (j, i, entry_ji)
            link = topo.link_between(i, j)
            assert (link.dialer, link.acceptor) == (dialer, acceptor)
            assert entry == link.listen and link.upstream == topo.self_addresses[acceptor]
            acceptor_entry = entry_ji if dial_ij else entry_ij
            assert acceptor_entry == topo.self_addresses[dialer]
            assert topo.node_of(entry_ij) == j and topo.node_of(entry_ji) == i


@pytest.mark.parametrize("nodes, proxies", [
    (["127.0.0.2:2", "127.0.0.2:1"], ["127.0.0.1:1"]),            # nodes not ascending
    (["127.0.0.1:20000", "127.0.0.1:20001"], ["127.0.0.1:30000"]),  # a proxy sorts above a node
])
def test_plan_refuses_addresses_that_break_the_dial_rule(nodes, proxies):
    with pytest.raises(AssertionError):
        plan_topology(nodes, proxies)


def test_allocated_addresses_fit_the_plan_and_avoid_ephemeral_ports():
    nodes, sockets = allocate_addresses(5, random.Random(1))
    try:
        topo = plan_topology(nodes, sorted(sockets))
        assert topo.size == 5
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        assert all(not low <= int(a.rsplit(":", 1)[1]) <= high for a in nodes)
    finally:
        for s in sockets.values():
            s.close()


class Echo:
    """A loopback TCP server that records what it receives and can send back."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.server.getsockname()[1]
        self.conn: socket.socket | None = None

    def accept(self) -> socket.socket:
        self.server.settimeout(5)
        self.conn, _ = self.server.accept()
        self.conn.settimeout(0.05)
        return self.conn


def recv_some(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except socket.timeout:
        return b""


def recv_exactly(sock: socket.socket, want: bytes, what: str) -> None:
    got = bytearray()
    wait_until(lambda: (got.extend(recv_some(sock)) or bytes(got) == want), 5, what=what)


@pytest.fixture
def two_nodes():
    # node 0 is an echo-ish server; "node 1" is the test, dialing node 0 through the pair proxy.
    echo = Echo()
    listen = reserve_ports(1)[0]
    listen_address = "127.0.0.1:%d" % listen.getsockname()[1]
    topo = Topology((echo.address, "127.0.0.1:1"), ((listen_address,), (echo.address,)),
                    (LinkPlan(1, 0, listen_address, echo.address),))
    net = ProxyNetwork(topo)
    net.start({listen_address: listen})
    host, port = topo.links[0].listen.rsplit(":", 1)
    client = socket.create_connection((host, int(port)), timeout=5)
    client.settimeout(0.05)
    server_side = echo.accept()
    yield net, client, server_side
    client.close()
    server_side.close()
    echo.server.close()
    net.close()


def test_bytes_flow_both_ways_when_healthy(two_nodes):
    net, client, server = two_nodes
    client.sendall(b"hello")
    recv_exactly(server, b"hello", "dialer -> acceptor bytes")
    server.sendall(b"world")
    recv_exactly(client, b"world", "acceptor -> dialer bytes")
    # the counter moves after the write completes, so the peer may see the bytes first
    wait_until(lambda: net.bytes_forwarded[(1, 0)] == 5 and net.bytes_forwarded[(0, 1)] == 5, 5,
               what="both directions counted")


def test_one_way_block_stalls_one_direction_and_heal_delivers_in_order(two_nodes):
    # Blocking 1->0 holds the dialer's bytes; 0->1 keeps flowing; heal delivers the held bytes.
    net, client, server = two_nodes
    net.block({(1, 0)})
    client.sendall(b"held-1;")
    client.sendall(b"held-2;")
    server.sendall(b"still-flows")
    recv_exactly(client, b"still-flows", "the open direction")
    assert recv_some(server) == b""
    net.heal()
    recv_exactly(server, b"held-1;held-2;", "stalled bytes after heal, in order")


def test_close_aborts_connections_stops_listening_and_the_loop(two_nodes):
    """The shared loop scaffolding (chaos/loop.py): close ends live connections, the listener and the
    thread; a second close and a close of a proxy never started are no-ops."""
    net, client, server = two_nodes
    host, port = net.topology.links[0].listen.rsplit(":", 1)
    assert net.running
    net.close()
    assert not net.running
    client.settimeout(5)
    try:
        assert client.recv(1) == b""
    except ConnectionError:
        pass
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=2)
    net.close()
    ProxyNetwork(net.topology).close()


def test_block_with_reset_closes_the_connection(two_nodes):
    net, client, server = two_nodes
    net.block({(0, 1), (1, 0)}, reset=True)

    def closed() -> bool:
        try:
            return server.recv(1) == b""
        except socket.timeout:
            return False
        except ConnectionError:
            return True
    wait_until(closed, 5, what="the acceptor side to see the reset")
    assert net.connections_reset >= 1


# -- a real pysyncobj cluster through the proxies ---------------------------------------------------

@pytest.fixture
def raft_cluster():
    import pysyncobj  # noqa: F401 - a missing dependency fails here, by name
    from pysyncobj import SyncObj, SyncObjConf, replicated

    class Counter(SyncObj):
        def __init__(self, self_address, peers, conf):
            super().__init__(self_address, peers, conf)
            self.value = 0

        @replicated
        def incr(self):
            self.value += 1
            return self.value

    n = 3
    node_addresses, proxy_sockets = allocate_addresses(n, random.Random())
    topo = plan_topology(node_addresses, sorted(proxy_sockets))
    net = ProxyNetwork(topo)
    net.start(proxy_sockets)
    nodes = []
    for i in range(n):
        # No bindAddress: this bare pysyncobj group binds the wildcard address (ControllerNode binds its own).
        conf = SyncObjConf(password="chaos-test", connectionTimeout=1.0, raftMinTimeout=0.3, raftMaxTimeout=0.6,
                           appendEntriesPeriod=0.05, connectionRetryTime=0.3, dynamicMembershipChange=False)
        nodes.append(Counter(topo.self_addresses[i], list(topo.peer_addresses[i]), conf))
    yield topo, net, nodes
    for node in nodes:
        node.destroy()
    net.close()


def leader_of(topo, nodes, among):
    """The node index every node in ``among`` agrees leads, or None."""
    seen = set()
    for i in among:
        status = nodes[i].getStatus()
        leader = status["leader"]
        seen.add(i if leader is not None and leader.address == topo.self_addresses[i] else
                 topo.node_of(leader.address) if leader is not None else None)
    return seen.pop() if len(seen) == 1 else None


@pytest.mark.slow
def test_pysyncobj_elects_fails_over_and_heals_through_the_proxies(raft_cluster):
    topo, net, nodes = raft_cluster
    wait_until(lambda: leader_of(topo, nodes, range(3)) is not None, 20, what="a leader all three agree on")
    leader = leader_of(topo, nodes, range(3))
    assert nodes[leader].incr(sync=True, timeout=5) == 1
    wait_until(lambda: all(node.value == 1 for node in nodes), 10, what="replication through the proxies")
    term_before = nodes[leader].getStatus()["raft_term"]

    others = [i for i in range(3) if i != leader]
    net.block({(leader, o) for o in others} | {(o, leader) for o in others})
    wait_until(lambda: leader_of(topo, nodes, others) not in (None, leader), 20,
               what="a new leader among the majority")
    new_leader = leader_of(topo, nodes, others)
    assert nodes[new_leader].getStatus()["raft_term"] > term_before
    assert nodes[new_leader].incr(sync=True, timeout=5) == 2
    assert nodes[leader].value == 1  # the isolated node saw nothing

    net.heal()
    wait_until(lambda: all(node.value == 2 for node in nodes), 20, what="the old leader catching up after heal")
    wait_until(lambda: leader_of(topo, nodes, range(3)) is not None, 20, what="one leader after heal")
