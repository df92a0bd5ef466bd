"""Helpers for the real-store, real-socket HA tests: stores, services, predicate waits."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

from rocketray.broker.config import FlushMode, StoreConfig
from rocketray.broker.role import Role
from rocketray.wire.message import Message
from rocketray.broker.store import MessageStore
from rocketray.wire.put_result import PutResult, PutStatus
from rocketray.ha.config import HAConfig
from rocketray.ha.service import HAService
from rocketray.links import MemberLinks
from rocketray.waiting import wait_for_async
from rr_members import broker, links

TOPIC = "FooBar"


@dataclass
class Roles:
    """The role port the put gate reads (``ha/put_gate.py``), as plain fields tests set."""

    fenced: bool = False
    writable: bool = True
    promoting: bool = False
    role: Role = Role.MASTER
    master_epoch: int = 3


def fast_config(**overrides) -> HAConfig:
    base = dict(all_ack_in_sync_state_set=False, ha_send_heartbeat_interval_ms=150, ha_housekeeping_interval_ms=3000,
                ha_max_time_slave_not_catchup_ms=3000, slave_timeout_ms=1500,
                ha_reconnect_backoff_min_ms=50, ha_reconnect_backoff_max_ms=300)
    base.update(overrides)
    return HAConfig(**base)


def open_store(root: Path, segment_size: int = 1 << 20, sync: bool = False) -> MessageStore:
    return MessageStore(root, StoreConfig(segment_size_bytes=segment_size,
                                          flush_mode=FlushMode.SYNC if sync else FlushMode.ASYNC,
                                          flush_interval_ms=100))


def messages(n: int, tag: str = "m", size: int = 100) -> list[Message]:
    return [Message(TOPIC, 0, (f"{tag}-{i}-".encode() * size)[:size]) for i in range(n)]


def commitlog_bytes(store: MessageStore) -> bytes:
    out = bytearray()
    pos = store.min_offset
    while pos < store.max_offset:
        chunk = store.read_raw(pos, 1 << 20)
        assert len(chunk) > 0
        out += chunk
        pos += len(chunk)
    return bytes(out)


def data_epochs(store: MessageStore) -> list[tuple[int, int]]:
    """Epoch entries that own bytes (a master's entry at its max offset holds none yet, and a
    slave only records an epoch when its first batch of data arrives)."""
    return [(e.epoch, e.start_offset) for e in store.epoch_file.entries()
            if e.start_offset < store.max_offset]


@dataclass
class Node:
    broker_id: int
    root: Path
    store: MessageStore
    ha: HAService
    port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


def node_links(broker_id: int, **kwargs) -> MemberLinks:
    """The test member ``broker_id`` of group broker-a (``rr_members``)."""
    return links(broker(broker_id), **kwargs)


async def start_node(root: Path, broker_id: int, config: HAConfig | None = None,
                     segment_size: int = 1 << 20, store: MessageStore | None = None,
                     member: MemberLinks | None = None) -> Node:
    store = store or open_store(root / f"store{broker_id}", segment_size)
    ha = HAService(store, broker_id, config or fast_config(), links=member or node_links(broker_id))
    port = await ha.start("127.0.0.1", 0)
    return Node(broker_id, root, store, ha, port)


async def stop_node(node: Node, close_store: bool = True) -> None:
    await node.ha.close()
    if close_store:
        node.store.close()


async def switch(master: Node, slaves: list[Node], epoch: int) -> None:
    """The upstream test's "Switch": slaves follow the master, the master takes the epoch."""
    assert await master.ha.change_to_master(epoch)
    for s in slaves:
        assert await s.ha.change_to_slave(master.address, epoch)


async def put_all(node: Node, msgs, expect=None) -> PutResult:
    result = await node.ha.put(msgs, int(time.time() * 1000))
    assert result.status == (expect if expect is not None else PutStatus.PUT_OK), result
    return result


async def wait_for(predicate, timeout_s: float = 15.0, what: str = "condition", interval_s: float = 0.02):
    return await wait_for_async(predicate, timeout_s, what, interval_s, error=AssertionError)


def acked_by(master: Node, slave_id: int) -> int:
    return max((c.ack_offset for c in master.ha.connections if c.slave_id == slave_id),
               default=-1)


async def wait_caught_up(master: Node, slave: Node, timeout_s: float = 15.0) -> None:
    """The slave acked the master's max offset on a live connection (so it handshook, truncated
    and copied everything) and its store is there."""
    await wait_for(lambda: acked_by(master, slave.broker_id) == master.store.max_offset
                   == slave.store.max_offset,
                   timeout_s, f"slave {slave.broker_id} to ack {master.store.max_offset} "
                               f"(acked {acked_by(master, slave.broker_id)}, "
                               f"at {slave.store.max_offset})")


def served(store: MessageStore, n: int, start: int = 0) -> int:
    return len(store.get_messages(TOPIC, 0, start, n))


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at the points ``cuts`` name (modulo its length): any chunking of a stream."""
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:])]
