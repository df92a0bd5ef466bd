"""Golden bytes: every event and every snapshot section exactly as the journal and the snapshot
store write them. An old journal or snapshot must decode to the same events after any change, so
swapping two type ids, reordering fields or changing an encoding fails here (a round trip alone
would still pass)."""

from __future__ import annotations

import pytest

from rocketray.controller.events import (AlterSyncStateSetEvent, ApplyBrokerIdEvent, CleanBrokerDataEvent,
                                         CreateTopicEvent, DeleteTopicEvent, ElectMasterEvent, ReadEvent,
                                         UpdateBrokerAddressEvent, decode_events, encode_events)
from rocketray.controller.raft import decode_payload, encode_payload
from rocketray.controller.state import ControllerState
from rocketray.snapshot.format import (SECTION_CONTROLLER_STATE, SECTION_RAFT_META, SECTION_SNAPSHOT_META,
                                       SECTION_TOPICS, decode_snapshot, encode_snapshot)

TERM, DECIDED_MS = 7, 1_700_000_000_000
HEADER = "02" "0000000000000007" "0000018bcfe56800"   # payload v2, term 7, decided at DECIDED_MS

# (event, its pinned type id, the journal payload that carries it alone in a batch)
GOLDEN_EVENTS = [
    (AlterSyncStateSetEvent("b", frozenset({1, 2, 3})), 1, HEADER + "9201919301a16293010203"),
    (ApplyBrokerIdEvent("c", "b", "127.0.0.1:9000", "127.0.0.1:9000;1700000000000", 1), 2,
     HEADER + "9201919602a163a162ae3132372e302e302e313a39303030bc3132372e302e302e313a393030303b3137303030303030"
              "303030303001"),
    (ElectMasterEvent(True, "b", 2), 3, HEADER + "9201919403c3a16202"),
    (ElectMasterEvent(False, "b", None), 3, HEADER + "9201919403c2a162c0"),
    (ReadEvent(), 4, HEADER + "9201919104"),
    (CleanBrokerDataEvent("b", frozenset({1, 2})), 5, HEADER + "9201919305a162920102"),
    (CleanBrokerDataEvent("b", None), 5, HEADER + "9201919305a162c0"),
    (UpdateBrokerAddressEvent("c", "b", "10.0.0.1:9000", 3), 6,
     HEADER + "9201919506a163a162ad31302e302e302e313a3930303003"),
    (CreateTopicEvent("t", ("a", "b", "a")), 7, HEADER + "9201919307a17493a161a162a161"),  # order kept
    (DeleteTopicEvent("t"), 8, HEADER + "9201919208a174"),
]


@pytest.mark.parametrize("event,type_id,payload_hex", GOLDEN_EVENTS, ids=lambda v: type(v).__name__)
def test_every_event_encodes_to_its_golden_journal_payload(event, type_id, payload_hex):
    payload = encode_payload(TERM, encode_events([event]), DECIDED_MS)
    assert payload[len(HEADER) // 2 + 4] == type_id     # 92 01 91 9n <type id>: [1, [[type_id, ...]]]
    assert payload.hex() == payload_hex
    term, decided_ms, body = decode_payload(bytes.fromhex(payload_hex))
    assert (term, decided_ms) == (TERM, DECIDED_MS)
    assert decode_events(body) == [event]


def test_version_1_payload_still_decodes():
    payload = bytes.fromhex("01" "0000000000000007" "9201919403c3a16202")
    term, decided_ms, body = decode_payload(payload)
    assert (term, decided_ms, decode_events(body)) == (7, None, [ElectMasterEvent(True, "b", 2)])


def _state() -> ControllerState:
    state = ControllerState()
    for event in [ApplyBrokerIdEvent("c", "b", "127.0.0.1:9000", "127.0.0.1:9000;17", 1),
                  ApplyBrokerIdEvent("c", "b", "127.0.0.1:9001", "127.0.0.1:9001;18", 2),
                  ElectMasterEvent(True, "b", 1), AlterSyncStateSetEvent("b", frozenset({1, 2}))]:
        state.apply(event)
    return state


SECTIONS = {
    SECTION_CONTROLLER_STATE: None,  # filled from _state()
    SECTION_RAFT_META: {"last": [b"\x00", 12, 3], "prev": [b"\x00", 11, 3],
                        "cluster": ["127.0.0.1:7001", "127.0.0.1:7002"]},
    SECTION_SNAPSHOT_META: {"index": 12, "term": 3},
}
STATE_SECTION = ("83a776657273696f6e01ac7265706c6963615f696e666f9194a162a16303929301ae3132372e302e302e313a393030"
                 "30b13132372e302e302e313a393030303b31379302ae3132372e302e302e313a39303031b13132372e302e302e313a"
                 "393030313b3138aa73796e635f73746174659196a162a163010192010202")
RAFT_META_SECTION = ("83a46c61737493c401000c03a47072657693c401000b03a7636c757374657292ae3132372e302e302e313a37303031"
                     "ae3132372e302e302e313a37303032")
SNAPSHOT_META_SECTION = "82a5696e6465780ca47465726d03"
SNAPSHOT_FILE = ("daa320a7" "0001" "00000003" "a0d3198c" "0000000000000000"
                 "0001" "0000007c" + STATE_SECTION + "0002" "0000003e" + RAFT_META_SECTION
                 + "0003" "0000000e" + SNAPSHOT_META_SECTION)


def test_every_snapshot_section_and_the_whole_file_are_golden():
    sections = {**SECTIONS, SECTION_CONTROLLER_STATE: _state().to_snapshot()}
    assert (SECTION_CONTROLLER_STATE, SECTION_RAFT_META, SECTION_SNAPSHOT_META) == (1, 2, 3)
    assert encode_snapshot(sections).hex() == SNAPSHOT_FILE
    decoded = decode_snapshot(bytes.fromhex(SNAPSHOT_FILE))
    assert ControllerState.from_snapshot(decoded[SECTION_CONTROLLER_STATE]).to_snapshot() == _state().to_snapshot()
    assert decoded[SECTION_SNAPSHOT_META] == {"index": 12, "term": 3}
    assert decoded[SECTION_RAFT_META]["last"] == [b"\x00", 12, 3]


TOPICS_SECTION = ("82a776657273696f6e01a6746f706963739292a66f726465727391a16292a17493a161a162a161")
TOPICS_FILE = ("daa320a7" "0001" "00000002" "4c1c22e5" "0000000000000000"
               "0003" "0000000e" + SNAPSHOT_META_SECTION + "0004" "00000027" + TOPICS_SECTION)


def _topic_state() -> ControllerState:
    state = ControllerState()
    state.apply_all([CreateTopicEvent("t", ("a", "b", "a")), CreateTopicEvent("orders", ("b",))])
    return state


def test_topics_section_is_golden_and_loads_back():
    """SECTION_TOPICS (4): {"version": 1, "topics": [[name, [broker name of queue 0, 1, ...]], ...]}
    sorted by name, queue order kept."""
    assert SECTION_TOPICS == 4
    section = _topic_state().topics_to_snapshot()
    assert section == {"version": 1, "topics": [["orders", ["b"]], ["t", ["a", "b", "a"]]]}
    blob = encode_snapshot({SECTION_SNAPSHOT_META: {"index": 12, "term": 3}, SECTION_TOPICS: section})
    assert blob.hex() == TOPICS_FILE
    decoded = decode_snapshot(bytes.fromhex(TOPICS_FILE))
    empty = ControllerState().to_snapshot()
    assert ControllerState.from_snapshot(empty, decoded[SECTION_TOPICS]).topics == {"t": ("a", "b", "a"),
                                                                                    "orders": ("b",)}


def test_a_snapshot_written_before_topics_existed_loads_with_no_topics():
    """The three-section file above (no SECTION_TOPICS) still loads: same tables, no topics."""
    decoded = decode_snapshot(bytes.fromhex(SNAPSHOT_FILE))
    assert SECTION_TOPICS not in decoded
    state = ControllerState.from_snapshot(decoded[SECTION_CONTROLLER_STATE], decoded.get(SECTION_TOPICS))
    assert state == _state() and state.topics == {}
