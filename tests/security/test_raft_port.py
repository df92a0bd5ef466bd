"""The controller's Raft port is a border only the cluster's controllers cross (issue 38, findings 1-3).

Real nodes on loopback, attacked over real sockets. In most tests only controller 0 of a group of
three runs and the test plays the others (or strangers): node 0 has the lowest address, so it
dials nobody and accepts the rest. Each finding's test fails on the code before the port was
guarded: there a pickle frame encrypted with the cluster secret ran on the controller, the port
listened on 0.0.0.0, a node accepted no secret on loopback, and a 0x7fffffff length made it
buffer whatever followed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import resource
import socket
import ssl
import struct
import tempfile
import threading
import time
import zlib
from pathlib import Path

import pytest
from pysyncobj.encryptor import getEncryptor
from pysyncobj.poller import createPoller

from controller_cluster import everyone_alive, make_cluster, raft_ca, raft_credentials  # noqa: F401 - fixtures
from rocketray.wire.controller_api import ApplyBrokerIdRequest, GetReplicaInfoRequest
from rocketray.controller.config import ControllerConfig
from rocketray.controller.events import ApplyBrokerIdEvent, encode_events
from rocketray.controller.node import ControllerNode, InsecureRaftBindError
from rocketray.controller.proc import CLUSTER, member_credentials
from rocketray.controller.raft import encode_payload
from rocketray.controller.raft_admission import PortLimits
from rocketray.controller.raft_port import GuardedServer
from rocketray.controller.raft_wire import RAFT_CHUNK_BYTES, encode_frame, encode_message
from rocketray.tls import CertificateAuthority, Identity, MemberCredentials
from rocketray.waiting import wait_for

APP_SECRET = "the-cluster-secret-every-application-held"


class OpenFile:
    """Finding 1's gadget: unpickling it creates ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def pysyncobj_frame(obj, secret: str | None) -> bytes:
    """A frame as pysyncobj's own TcpConnection writes it (finding 1's attack)."""
    data = zlib.compress(pickle.dumps(obj), 3)
    if secret:
        data = getEncryptor(secret).encrypt_at_time(data, int(time.monotonic()))
    return struct.pack("i", len(data)) + data


def frame(message) -> bytes:
    return encode_frame(encode_message(message))


def addresses(port_factory, n=3) -> dict[int, str]:
    return dict(enumerate(sorted(f"127.0.0.1:{port_factory()}" for _ in range(n))))


def host_port(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


def start(controllers, creds, tmp_path, index=0, tls=True, **config) -> ControllerNode:
    return ControllerNode(controllers, tmp_path / f"n{index}-{tls}", ControllerConfig.for_tests(**config),
                          credentials=creds[index], tls=tls, alive=everyone_alive)


def refusals(node: ControllerNode) -> dict[str, int]:
    return node.metadata()["raft_port"]["refused"]


def wait_refused(node: ControllerNode, kind: str, count: int = 1) -> None:
    wait_for(lambda: refusals(node).get(kind, 0) >= count, 5, f"{count} refusal(s) of kind {kind}")


def closed_by_peer(sock: socket.socket, timeout_s: float = 5.0) -> bool:
    sock.settimeout(timeout_s)
    try:
        while sock.recv(65536):
            pass
        return True
    except (ConnectionError, ssl.SSLError):
        return True
    except TimeoutError:
        return False


def attacker_context(credentials: MemberCredentials | None = None) -> ssl.SSLContext:
    """A TLS client that trusts anything and presents ``credentials``' certificate, if any."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if credentials is not None:
        with tempfile.NamedTemporaryFile(suffix=".pem") as chain:
            chain.write(credentials.cert_pem + b"\n" + credentials.key_pem)
            chain.flush()
            context.load_cert_chain(chain.name)
    return context


def tls_connect(address: str, context: ssl.SSLContext) -> ssl.SSLSocket:
    raw = socket.create_connection(host_port(address), timeout=5)
    return context.wrap_socket(raw)


@pytest.fixture
def group(tmp_path, port_factory, raft_credentials):
    """Controller 0 of a group of three (TLS), its addresses and every member's credentials."""
    controllers = addresses(port_factory)
    creds = raft_credentials(3)
    node = start(controllers, creds, tmp_path)
    yield node, controllers, creds
    node.close()


# -- finding 1: nobody but a controller gets in, and nothing from the wire is unpickled ---------------

def test_finding1_the_gadget_frame_built_with_the_old_secret_runs_nothing(group, tmp_path):
    node, controllers, creds = group
    target = tmp_path / "pwned-old-secret"
    for secret in (APP_SECRET, creds[1].secret, None):
        with socket.create_connection(host_port(controllers[0]), timeout=5) as sock:
            sock.sendall(pysyncobj_frame(controllers[1], secret) + pysyncobj_frame(OpenFile(str(target)), secret))
            assert closed_by_peer(sock)
    wait_refused(node, "tls", 3)
    assert not target.exists()


def test_finding1_no_certificate_or_another_ca_fails_the_handshake(group, tmp_path):
    node, controllers, _ = group
    target = tmp_path / "pwned-no-cert"
    stranger = member_credentials(3, ca=CertificateAuthority.create(CLUSTER))[1]  # a controller of another CA
    for context in (attacker_context(), attacker_context(stranger)):
        try:
            sock = tls_connect(controllers[0], context)
        except (ssl.SSLError, ConnectionError):
            continue  # refused inside the handshake
        with sock:
            try:
                sock.sendall(frame(controllers[1]) + pysyncobj_frame(OpenFile(str(target)), None))
            except (ssl.SSLError, ConnectionError):
                pass
            assert closed_by_peer(sock)
    wait_refused(node, "tls", 2)
    assert not target.exists() and node.metadata()["raft_port"]["admitted"] == 0


def test_finding1_a_broker_certificate_of_this_cluster_is_refused(group, raft_ca):
    node, controllers, creds = group
    broker = raft_ca.member(Identity.broker(CLUSTER, "broker-a", 1), creds[0].secret)
    with tls_connect(controllers[0], attacker_context(broker)) as sock:
        assert closed_by_peer(sock)
    wait_refused(node, "identity")
    assert node.metadata()["raft_port"]["admitted"] == 0


def test_finding1_a_controller_claiming_another_controllers_address_is_refused(group, tmp_path):
    node, controllers, creds = group
    target = tmp_path / "pwned-claim"
    with tls_connect(controllers[0], attacker_context(creds[2])) as sock:
        sock.sendall(frame(controllers[1]))   # controller 2 claims to be controller 1
        assert closed_by_peer(sock)
    wait_refused(node, "claim")
    for claim in ("readonly", ["add", "127.0.0.1:1"], controllers[0]):  # pysyncobj's other first messages
        with tls_connect(controllers[0], attacker_context(creds[2])) as sock:
            sock.sendall(frame(claim))
            assert closed_by_peer(sock)
    wait_refused(node, "claim", 4)
    assert node.metadata()["raft_port"]["admitted"] == 0 and not target.exists()


def test_finding1_even_an_admitted_controller_cannot_make_a_node_unpickle_a_gadget(group, tmp_path):
    node, controllers, creds = group
    target = tmp_path / "pwned-member"
    gadget_command = b"\x00" + pickle.dumps((0, (OpenFile(str(target)),)), 2)
    term = 10_000

    def as_controller_1(*messages) -> ssl.SSLSocket:
        sock = tls_connect(controllers[0], attacker_context(creds[1]))
        sock.sendall(frame(controllers[1]) + b"".join(m if isinstance(m, bytes) else frame(m) for m in messages))
        return sock

    # 1. A log entry whose command is the gadget: appended, committed, refused at apply on the node.
    with as_controller_1({"type": "append_entries", "term": term, "commit_index": 2, "prevLogIdx": 1,
                          "prevLogTerm": 0, "entries": ((gadget_command, 2, term),)}):
        wait_for(lambda: node.metadata()["raft_port"]["refused_commands"] == 1, 5, "the command refused at apply")
        assert node.metadata()["last_applied"] >= 2
    # 2. A pickle where a message belongs, and a chunked entry that is the gadget itself.
    raw = pysyncobj_frame({"type": "apply_command", "command": gadget_command}, None)
    chunked = {"type": "append_entries", "term": term, "commit_index": 2, "prevLogIdx": 2, "prevLogTerm": term,
               "transmission": "finish", "data": pickle.dumps((OpenFile(str(target)), 3, term), 2)}
    membership = {"type": "append_entries", "term": term, "commit_index": 2, "prevLogIdx": 2, "prevLogTerm": term,
                  "entries": ((b"\x02" + pickle.dumps(["add", "x", OpenFile(str(target))], 2), 3, term),)}
    for message, kind in ((raw, "frame"), (chunked, "message"), (membership, "message")):
        with as_controller_1(message) as sock:
            assert closed_by_peer(sock)
        wait_refused(node, kind)
    assert node.metadata()["raft_port"]["admitted"] == 4
    assert not target.exists()


def test_finding1_in_development_mode_a_gadget_with_the_members_secret_runs_nothing(tmp_path, port_factory,
                                                                                     raft_credentials):
    controllers, creds = addresses(port_factory), raft_credentials(3)
    node = start(controllers, creds, tmp_path, tls=False)
    target = tmp_path / "pwned-dev"
    try:
        for secret in (creds[0].secret, APP_SECRET):
            with socket.create_connection(host_port(controllers[0]), timeout=5) as sock:
                sock.sendall(pysyncobj_frame(os.urandom(32), secret) + pysyncobj_frame(OpenFile(str(target)), secret))
                assert closed_by_peer(sock)
        wait_refused(node, "frame", 2)
        assert not target.exists()
    finally:
        node.close()


# -- finding 2: the configured address only, and no node without credentials --------------------------

def _listening_hosts(port: int) -> set[str]:
    hosts = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            host, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                hosts.add(host)
    return hosts


def test_finding2_the_port_listens_on_its_configured_address_only(group):
    node, controllers, _ = group
    host, port = host_port(controllers[0])
    assert node.metadata()["raft_port"]["bound"] == [host, port]
    assert _listening_hosts(port) == {"0100007F"}  # 127.0.0.1, not 00000000 (0.0.0.0)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", port), timeout=2).close()


def test_finding2_a_node_without_member_credentials_is_refused_before_it_binds(tmp_path, port_factory,
                                                                               raft_credentials, raft_ca):
    creds = raft_credentials(1)[0]
    broker = raft_ca.member(Identity.broker(CLUSTER, "broker-a", 0), "s")
    cases = [
        (None, True, "needs the members' credentials"),
        ("a-secret", False, "needs the members' credentials"),
        (dataclasses.replace(creds, cert_pem=b""), True, "one of them is empty"),
        (dataclasses.replace(creds, key_pem=b""), True, "one of them is empty"),
        (dataclasses.replace(creds, identity=Identity.controller(CLUSTER, 1)), True, "not among|certificate is"),
        (broker, True, "not a controller"),
    ]
    for host in ("127.0.0.1", "10.1.2.3"):
        address = f"{host}:{port_factory()}"
        for credentials, tls, problem in cases:
            with pytest.raises(InsecureRaftBindError, match=problem):
                ControllerNode({0: address}, tmp_path / "x", ControllerConfig.for_tests(), credentials=credentials,
                               tls=tls)
        if host == "127.0.0.1":
            with pytest.raises(ConnectionRefusedError):  # nothing was bound
                socket.create_connection(host_port(address), timeout=2).close()
    for wildcard in ("0.0.0.0", "::", ""):
        with pytest.raises(InsecureRaftBindError, match="every interface"):
            ControllerNode({0: f"{wildcard}:{port_factory()}"}, tmp_path / "x", ControllerConfig.for_tests(),
                           credentials=creds)
    with pytest.raises(ValueError, match="secret"):
        dataclasses.replace(creds, secret="")


# -- finding 3: bounded frames, bounded memory ----------------------------------------------------------

def _rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _send_until_refused(sock: socket.socket, head: bytes, junk: memoryview) -> int:
    sock.sendall(head)
    sent = len(head)
    try:
        for i in range(0, len(junk), 1 << 20):
            sock.sendall(junk[i:i + (1 << 20)])
            sent += min(1 << 20, len(junk) - i)
    except (ConnectionError, ssl.SSLError, TimeoutError):
        pass
    return sent


def test_finding3_a_huge_length_is_refused_at_its_prefix_and_the_node_does_not_grow(tmp_path, port_factory,
                                                                                     raft_credentials):
    controllers, creds = addresses(port_factory), raft_credentials(3)
    node = start(controllers, creds, tmp_path, tls=False)  # no handshake to pass: straight to the reader
    junk = memoryview(b"\xa5" * (48 << 20))
    try:
        before = _rss_bytes()
        with socket.create_connection(host_port(controllers[0]), timeout=5) as sock:
            sent = _send_until_refused(sock, struct.pack("<I", 0x7FFFFFFF), junk)
        wait_refused(node, "frame")
        grown = _rss_bytes() - before
        assert sent < len(junk), "the node read all 48 MiB"
        assert grown < 16 << 20, f"the node's process grew by {grown >> 20} MiB"
        with socket.create_connection(host_port(controllers[0]), timeout=5) as sock:
            sock.sendall(struct.pack("i", -2) + b"junk")  # a negative signed length
            assert closed_by_peer(sock)
        wait_refused(node, "frame", 2)
    finally:
        node.close()


def test_finding3_an_admitted_controller_is_bounded_by_raft_max_frame_bytes(group):
    node, controllers, creds = group
    for head in (struct.pack("<I", 0x7FFFFFFF), struct.pack("i", -1),
                 struct.pack("<I", ControllerConfig().raft_max_frame_bytes + 1)):
        with tls_connect(controllers[0], attacker_context(creds[1])) as sock:
            sent = _send_until_refused(sock, frame(controllers[1]) + head, memoryview(b"\0" * (8 << 20)))
            assert sent < 8 << 20
            assert closed_by_peer(sock)
    wait_refused(node, "frame", 3)


# -- limits -------------------------------------------------------------------------------------------

def test_connections_per_address_and_the_handshake_timeout_are_bounded(tmp_path, port_factory, raft_credentials):
    controllers, creds = addresses(port_factory), raft_credentials(3)
    node = start(controllers, creds, tmp_path, raft_max_connections_per_address=2, raft_handshake_timeout_ms=400)
    try:
        silent = [socket.create_connection(host_port(controllers[0]), timeout=5) for _ in range(2)]
        with socket.create_connection(host_port(controllers[0]), timeout=5) as third:
            assert closed_by_peer(third, 2.0)
        wait_refused(node, "limit")
        for sock in silent:      # closed by the node at the handshake deadline, not by the test
            assert closed_by_peer(sock, 3.0)
            sock.close()
        wait_refused(node, "timeout", 2)
        with tls_connect(controllers[0], creds[1].client_context()) as sock:  # the listener serves on
            sock.sendall(frame(controllers[1]))
            wait_for(lambda: node.metadata()["raft_port"]["admitted"] == 1, 5, "controller 1 admitted")
    finally:
        node.close()


# -- the group works with TLS on -------------------------------------------------------------------------

def test_three_tls_controllers_replicate_and_a_restarted_node_rejoins(make_cluster):
    cluster = make_cluster()
    leader = cluster.wait_leader()
    for i in range(20):
        assert leader.handle(ApplyBrokerIdRequest(CLUSTER, f"g{i}", 1, f"g{i};1")).ok
    follower = next(i for i, n in enumerate(cluster.nodes) if n is not leader)
    cluster.stop(follower)
    for i in range(20, 30):
        assert leader.handle(ApplyBrokerIdRequest(CLUSTER, f"g{i}", 1, f"g{i};1")).ok
    back = cluster.start(follower)  # same store, same credentials
    wait_for(lambda: back.applied_index >= leader.applied_index, 10, "the restarted node to catch up")
    assert back.snapshot_state() == leader.snapshot_state()
    wait_for(lambda: all(n.metadata()["raft_port"]["admitted"] >= 2 for n in cluster.running()), 5,
             "every node connected to both peers")
    assert all(n.metadata()["raft_port"]["refused"] == {} for n in cluster.running())


def test_an_entry_too_large_for_one_message_is_chunked_and_applied_everywhere(make_cluster):
    cluster = make_cluster()
    leader = cluster.wait_leader()
    events = [ApplyBrokerIdEvent(CLUSTER, f"big-{i:05d}", f"127.0.0.1:{i}", f"big-{i};1", 1) for i in range(1500)]
    payload = encode_payload(leader.metadata()["term"], encode_events(events), int(time.time() * 1000))
    assert len(pickle.dumps((0, (payload,)), 2)) >= RAFT_CHUNK_BYTES  # pysyncobj sends it in chunks
    done = threading.Event()
    leader._raft.apply_batch(payload, callback=lambda res, err: done.set())
    assert done.wait(10)
    for node in cluster.running():
        wait_for(lambda n=node: len(n.snapshot_state()["replica_info"]) == 1500, 10, "the big batch applied")
        assert node.metadata()["raft_port"]["refused"] == {}
    assert sum(n.metadata()["raft_port"]["chunked_entries"] for n in cluster.running()) >= 2  # both followers
    # a loaded machine may elect another leader while the big entry travels: read from the current one
    wait_for(lambda: cluster.wait_leader().handle(GetReplicaInfoRequest("big-01499")).ok, 20,
             "a linearizable read of the big batch")
    # Bytes above 0x7f double in pickle protocol 2, so pysyncobj marks chunks before the last as the
    # finish (it compares the pickled entry's offset with the command's length): still one entry.
    noise = encode_payload(leader.metadata()["term"], os.urandom(150_000), int(time.time() * 1000))
    done.clear()
    leader._raft.apply_batch(noise, callback=lambda res, err: done.set())
    assert done.wait(10)
    last = leader._raft.journal[-1]
    for node in cluster.running():
        wait_for(lambda n=node: n._raft.raftLastApplied >= last[1], 10, "the noise entry applied")
        assert node._raft.journal[last[1] - node._raft.journal[0][1]] == last
    assert sum(n.metadata()["raft_port"]["chunked_entries"] for n in cluster.running()) >= 4


def test_a_controller_of_another_ca_never_joins(make_cluster, port_factory, tmp_path):
    cluster = make_cluster()
    leader = cluster.wait_leader()
    term = leader.metadata()["term"]
    rogue_address = f"127.0.0.2:{port_factory()}"  # sorts above the group's: the rogue dials them
    rogue_creds = member_credentials(4, ca=CertificateAuthority.create(CLUSTER))
    controllers = {**cluster.controllers, 3: rogue_address}
    rogue = ControllerNode(controllers, tmp_path / "rogue", ControllerConfig.for_tests(), credentials=rogue_creds[3],
                           alive=everyone_alive)
    try:
        wait_for(lambda: sum(refusals(n).get("tls", 0) for n in cluster.running()) >= 1, 10,
                 "the members to refuse the rogue")
        assert leader.handle(ApplyBrokerIdRequest(CLUSTER, "good", 1, "g;1")).ok
        assert cluster.leader() is leader and leader.metadata()["term"] == term
        assert rogue.metadata()["leader_address"] in (None, rogue_address)
        assert rogue.metadata()["raft_port"]["admitted"] == 0
    finally:
        rogue.close()


def test_accept_failures_are_logged_once_per_interval_and_the_listener_serves_on(caplog, port_factory):
    # Finding 7 on the Raft listener: EMFILE made pysyncobj's listener unbind; here it rests
    # accept_pause_s, logs one line per log_interval_s, and accepts again once descriptors are free.
    poller = createPoller("auto")
    accepted: list[socket.socket] = []
    limits = PortLimits(max_frame_bytes=1 << 20, handshake_timeout_s=5, max_connections=64,
                        max_connections_per_address=64, max_unsent_bytes=1 << 20, accept_pause_s=0.01,
                        log_interval_s=60)
    port = port_factory()
    server = GuardedServer(poller, "127.0.0.1", port, lambda sock, host: accepted.append(sock), limits,
                           lambda *refusal: None)
    server.bind()
    clients = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(6)]  # in the backlog
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fds = {int(fd) for fd in os.listdir("/proc/self/fd")}
    limit = next(n for n in range(3, soft) if n - len({fd for fd in fds if fd < n}) == 2)  # room for 2 or 3 more
    try:
        with caplog.at_level(logging.ERROR, logger="rocketray.controller.raft"):
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
            try:
                deadline = time.monotonic() + 0.3
                while time.monotonic() < deadline:
                    poller.poll(0.005)
                    server.maybe_resume(time.monotonic())
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert 2 <= len(accepted) <= 3 and server.accept_failures >= 3  # (the listing's own fd was free again)
        lines = [r for r in caplog.records if "cannot accept" in r.getMessage()]
        assert len(lines) == 1 and "Too many open files" in lines[0].getMessage()
        wait_for(lambda: (poller.poll(0.005), server.maybe_resume(time.monotonic()), len(accepted) == 6)[2], 5,
                 "the rest of the backlog accepted")
    finally:
        for sock in accepted + clients:
            sock.close()
        server.unbind()
