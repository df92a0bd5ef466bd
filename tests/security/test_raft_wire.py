"""The Raft port's pure cores: frames, message shapes, the restricted unpickler, admission rules."""

from __future__ import annotations

import os
import pickle
import resource
import struct
import time

import pytest
from pysyncobj.encryptor import getEncryptor

from rocketray.controller.config import ControllerConfig
from rocketray.controller.leader_pipeline import MAX_BATCH_BYTES
from rocketray.controller.raft import encode_payload
from rocketray.controller.raft_admission import ConnectionCounts, LogThrottle, claim_problem, identity_problem
from rocketray.controller.raft_pickle import UnsafePickle, decode_command, decode_entry, restricted_loads
from rocketray.controller.raft_wire import (RAFT_CHUNK_BYTES, WORST_MESSAGE_BYTES, FrameReader, WireError,
                                            decode_message, encode_frame, encode_message, message_problem)
from rocketray.tls import Identity

CONTROLLERS = {0: "10.0.0.1:9878", 1: "10.0.0.2:9878", 2: "10.0.0.3:9878"}


class OpenFile:
    """Finding 1's gadget: unpickling it opens (creates) ``path`` for writing."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


# -- frames --------------------------------------------------------------------------------------

def test_a_length_over_the_bound_is_refused_at_its_prefix_before_any_body_is_kept():
    reader = FrameReader(1024)
    reader.push(struct.pack("<I", 0x7FFFFFFF))
    with pytest.raises(WireError, match="2147483647 bytes announced"):
        reader.pop()
    assert reader.buffered == 4  # nothing of a body was waited for


def test_a_negative_signed_length_is_an_oversized_unsigned_one():
    # pysyncobj packs lengths with "i" (signed); -1 reads as 0xffffffff here and is refused.
    reader = FrameReader(1 << 20)
    reader.push(struct.pack("i", -1) + b"junk")
    with pytest.raises(WireError, match="4294967295"):
        reader.pop()


def test_frames_split_anywhere_come_out_whole_and_the_bound_may_rise_between_two():
    bodies = [b"a" * 10, b"", b"b" * 3000, b"c" * 5]
    stream = b"".join(encode_frame(b) for b in bodies)
    reader = FrameReader(4096)
    out = []
    for i in range(0, len(stream), 7):
        reader.push(stream[i:i + 7])
        while (body := reader.pop()) is not None:
            out.append(body)
    assert out == bodies and reader.buffered == 0
    small = FrameReader(16)
    small.push(encode_frame(b"hello") + encode_frame(b"x" * 100))
    assert small.pop() == b"hello"
    small.max_frame = 100  # admitted between two frames
    assert small.pop() == b"x" * 100


# -- messages ------------------------------------------------------------------------------------

VALID = [
    {"type": "request_vote", "term": 3, "last_log_index": 10, "last_log_term": 2},
    {"type": "response_vote", "term": 3},
    {"type": "timeout_now", "term": 3},
    {"type": "append_entries", "term": 3, "commit_index": 9, "entries": ((b"\x01", 10, 3), (b"\x00xyz", 11, 3)),
     "prevLogIdx": 9, "prevLogTerm": 2},
    {"type": "append_entries", "term": 3, "commit_index": 9, "entries": (), "prevLogIdx": 9, "prevLogTerm": 2},
    {"type": "append_entries", "term": 3, "commit_index": 9, "transmission": "start", "data": b"x",
     "prevLogIdx": 9, "prevLogTerm": 2},
    {"type": "append_entries", "term": 3, "commit_index": 9, "serialized": (b"dump", True, False)},
    {"type": "append_entries", "term": 3, "commit_index": 9, "serialized": None},
    {"type": "next_node_idx", "next_node_idx": 12, "reset": False, "success": True},
    {"type": "apply_command", "command": b"\x00payload", "request_id": 4},
    {"type": "apply_command_response", "request_id": 4, "log_idx": 12, "log_term": 3},
    {"type": "apply_command_response", "request_id": 4, "error": 2},
    {"type": "rr_keepalive"},
]


@pytest.mark.parametrize("message", VALID, ids=lambda m: m["type"])
def test_every_message_pysyncobj_sends_passes_and_survives_the_codec(message):
    assert message_problem(message) is None
    decoded = decode_message(encode_message(message))
    assert decoded == message and message_problem(decoded) is None


@pytest.mark.parametrize("message, problem", [
    ("127.0.0.1:9878", "a message is a map"),
    ({"type": "status"}, "unknown message type"),
    ({"term": 1}, "unknown message type"),
    ({"type": "response_vote"}, "lacks term"),
    ({"type": "response_vote", "term": True}, "term is malformed"),          # a bool is not a term
    ({"type": "response_vote", "term": -1}, "term is malformed"),
    ({"type": "response_vote", "term": 2 ** 63}, "term is malformed"),
    ({"type": "response_vote", "term": 1, "extra": 1}, "unknown field"),
    ({"type": "append_entries", "term": 1, "commit_index": 1, "entries": ((b"\x02membership", 2, 1),),
      "prevLogIdx": 1, "prevLogTerm": 1}, "entries is malformed"),            # pysyncobj membership change
    ({"type": "append_entries", "term": 1, "commit_index": 1, "entries": ((b"\x03version", 2, 1),),
      "prevLogIdx": 1, "prevLogTerm": 1}, "entries is malformed"),            # pysyncobj code version
    ({"type": "append_entries", "term": 1, "commit_index": 1, "entries": [(b"\x00", 2, 1)],
      "prevLogIdx": 1, "prevLogTerm": 1}, "entries is malformed"),
    ({"type": "append_entries", "term": 1, "commit_index": 1, "entries": ()}, "prevLogIdx"),
    ({"type": "append_entries", "term": 1, "commit_index": 1, "transmission": "finish", "data": b"x"},
     "transmission chunk"),
    ({"type": "append_entries", "term": 1, "commit_index": 1, "transmission": "again", "data": b"x",
      "prevLogIdx": 1, "prevLogTerm": 1}, "transmission is malformed"),
    ({"type": "apply_command", "command": b"\x01"}, "command is malformed"),   # only regular commands travel
    ({"type": "apply_command", "command": "\x00text"}, "command is malformed"),
    ({"type": "apply_command_response", "request_id": 1}, "needs log_idx"),
])
def test_messages_of_other_shapes_are_refused_with_a_reason(message, problem):
    assert problem in (message_problem(message) or "")


def test_undecodable_bodies_are_wire_errors():
    for body in (b"", b"\xc1", pickle.dumps({"type": "rr_keepalive"}), encode_message({"x": 1}) + b"trailing",
                 encode_message({1: 2})):
        with pytest.raises(WireError):
            decode_message(body)


def test_the_largest_messages_pysyncobj_sends_fit_the_default_frame_bound():
    # append_entries carries entries until their commands reach RAFT_CHUNK_BYTES, so at most that
    # plus one whole entry; an entry's command is pysyncobj's protocol-2 pickle of the largest
    # payload (incompressible bytes above 0x7f double in protocol 2's latin-1 text).
    payload = encode_payload(7, bytes(range(128, 256)) * (MAX_BATCH_BYTES // 128), 1)
    big = b"\x00" + pickle.dumps((0, (payload,)), 2)
    small = b"\x00" + pickle.dumps((0, (b"\xff" * 1000,)), 2)
    entries = tuple((small, i, 7) for i in range(RAFT_CHUNK_BYTES // len(small))) + ((big, 10_000, 7),)
    batch = {"type": "append_entries", "term": 7, "commit_index": 9_999, "entries": entries,
             "prevLogIdx": 1, "prevLogTerm": 1}
    chunk = {"type": "append_entries", "term": 7, "commit_index": 1, "transmission": "process",
             "data": os.urandom(RAFT_CHUNK_BYTES), "prevLogIdx": 1, "prevLogTerm": 1}
    snapshot = {"type": "append_entries", "term": 7, "commit_index": 1,
                "serialized": (os.urandom(RAFT_CHUNK_BYTES), False, False)}
    fernet = getEncryptor("members-secret")
    bound = ControllerConfig().raft_max_frame_bytes
    for message in (batch, chunk, snapshot):
        assert message_problem(message) is None
        body = fernet.encrypt_at_time(encode_message((os.urandom(32), message)), int(time.monotonic()))
        assert len(body) <= WORST_MESSAGE_BYTES <= bound, (len(body), WORST_MESSAGE_BYTES, bound)
    with pytest.raises(ValueError, match="raft_max_frame_bytes"):
        ControllerConfig(raft_max_frame_bytes=WORST_MESSAGE_BYTES - 1).validate()


# -- the restricted unpickler ---------------------------------------------------------------------

def test_the_reduce_gadget_raises_instead_of_running(tmp_path):
    target = tmp_path / "pwned"
    for protocol in (2, 5):
        gadget = pickle.dumps((0, (OpenFile(str(target)),)), protocol)
        with pytest.raises(UnsafePickle, match="builtins.open|io.open"):
            decode_command(gadget)
        with pytest.raises(UnsafePickle):
            decode_entry(pickle.dumps((OpenFile(str(target)), 3, 1), protocol))  # a chunked entry
    assert not target.exists()
    for name in (b"cos\nsystem\n", b"cposix\nsystem\n", b"cbuiltins\neval\n", b"csubprocess\nPopen\n"):
        with pytest.raises(UnsafePickle):
            restricted_loads(b"\x80\x02" + name + b"X\x04\x00\x00\x00true\x85R.")


def test_commands_and_entries_pysyncobj_writes_decode_to_plain_values():
    for payload in (b"", b"\x00\x01\xff" * 50, encode_payload(3, b"events", 123)):
        command = pickle.dumps((5, (payload,)), 2)  # what pysyncobj's @replicated writes
        assert decode_command(command) == (5, (payload,))
        entry = (b"\x00" + command, 42, 3)
        assert decode_entry(pickle.dumps(entry, 2)) == entry


@pytest.mark.parametrize("data, problem", [
    (b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00xX\x04\x00\x00\x00zlib\x86R.", "latin-1"),
    (b"\x80\x02c__builtin__\nbytes\nJ\x00\xca\x9a;\x85R.", "without arguments"),  # bytes(10**9)
    (b"\x80\x02K\x01Q.", "persistent"),
    (pickle.dumps(5, 2), "a command is"),
    (pickle.dumps((1, [b"x"]), 2), "a command is"),
])
def test_restricted_decoding_admits_only_the_exact_uses(data, problem):
    with pytest.raises(UnsafePickle, match=problem):
        decode_command(data)


def test_a_memo_index_of_two_billion_allocates_nothing():
    # The C unpickler grows its memo array to the index a LONG_BINPUT names (16 GiB here).
    bomb = b"\x80\x02K\x01r" + struct.pack("<I", 0x7FFFFFFF) + b"\x85."
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert restricted_loads(bomb) == (1,)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024  # KiB


# -- admission rules --------------------------------------------------------------------------------

@pytest.mark.parametrize("identity, expected, problem", [
    (Identity.controller("c", 1), None, None),
    (Identity.controller("c", 1), 1, None),
    (Identity.controller("c", 1), 2, "dialed controller 2"),
    (Identity.controller("other", 1), None, "another cluster"),
    (Identity.broker("c", "broker-a", 1), None, "not a controller"),
    (Identity.controller("c", 7), None, "names no controller"),
    (Identity.controller("c", 0), None, "own identity"),
])
def test_who_may_speak_raft_with_controller_0(identity, expected, problem):
    found = identity_problem(identity, "c", CONTROLLERS, 0, expected)
    assert (found is None) if problem is None else (problem in (found or ""))


@pytest.mark.parametrize("identity, claim, problem", [
    (Identity.controller("c", 1), "10.0.0.2:9878", None),
    (Identity.controller("c", 2), "10.0.0.2:9878", "but its Raft address is"),
    (Identity.controller("c", 1), "readonly", "but its Raft address is"),
    (Identity.controller("c", 1), ["add", "10.9.9.9:1"], "must be the peer's Raft address"),
    (None, "10.0.0.3:9878", None),                                   # development mode: peers only
    (None, "10.0.0.1:9878", "not a peer"),
    (None, "readonly", "not a peer"),
    (None, b"10.0.0.2:9878", "must be the peer's Raft address"),
])
def test_the_first_message_claims_the_certificate_s_own_address(identity, claim, problem):
    peers = {"10.0.0.2:9878", "10.0.0.3:9878"}
    found = claim_problem(identity, claim, CONTROLLERS, peers)
    assert (found is None) if problem is None else (problem in (found or ""))


def test_connection_counts_per_listener_and_per_host():
    counts = ConnectionCounts(max_total=3, max_per_address=2)
    assert counts.open("a") is None and counts.open("a") is None
    assert "limit per address" in counts.open("a")
    assert counts.open("b") is None
    assert "its limit" in counts.open("c")
    counts.close("a")
    assert counts.open("c") is None and counts.total == 3 and counts.by_host == {"a": 1, "b": 1, "c": 1}
    with pytest.raises(AssertionError):
        counts.close("z")


def test_log_throttle_admits_one_line_per_interval_and_counts_the_rest():
    throttle = LogThrottle(5.0)
    assert throttle.admit(100.0) == 0
    assert [throttle.admit(100.0 + i) for i in range(1, 5)] == [None] * 4
    assert throttle.admit(105.0) == 4
    assert throttle.admit(109.9) is None and throttle.admit(110.0) == 1

