"""Issue 15 violation 2 over real sockets: a put must not be acknowledged without a member whose
expand is in flight, even after the shrink check drops a lagging member (also against the old
rule). Slave 2 lags because a test proxy between it and the master stops forwarding."""

from __future__ import annotations

import asyncio
import time

from ha_helpers import (fast_config, messages, put_all, run, start_node, stop_node, switch,
                        wait_caught_up, wait_for)
from ha_old_rules import old_maybe_shrink
from rocketray.wire.put_result import PutStatus
from rocketray.ha.sync_state import SyncStateTracker


class PausableProxy:
    """Loopback TCP proxy to ``upstream``; while paused it forwards nothing in either direction
    and reads nothing (so the sender's socket buffers fill up, as with a stalled slave)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.running = asyncio.Event()
        self.running.set()
        self.server: asyncio.AbstractServer | None = None
        self.tasks: set[asyncio.Task] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return "127.0.0.1:%d" % self.server.sockets[0].getsockname()[1]

    async def _accept(self, reader, writer) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        pumps = [asyncio.create_task(self._pump(reader, up_writer)),
                 asyncio.create_task(self._pump(up_reader, writer))]
        self.tasks.update(pumps)
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for w in (writer, up_writer):
            w.close()

    async def _pump(self, reader, writer) -> None:
        while True:
            await self.running.wait()
            data = await reader.read(64 * 1024)
            if not data:
                return
            writer.write(data)
            await writer.drain()

    async def close(self) -> None:
        self.running.set()
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.server is not None:
            self.server.close()


async def violation_2(tmp_path) -> PutStatus:
    cfg = fast_config(all_ack_in_sync_state_set=True, slave_timeout_ms=600,
                      ha_max_time_slave_not_catchup_ms=300, ha_housekeeping_interval_ms=20_000)
    m = await start_node(tmp_path, 1, cfg)
    s2 = await start_node(tmp_path, 2, cfg)
    proxy = PausableProxy(m.port)
    via_proxy = await proxy.start()
    assert await m.ha.change_to_master(1)
    assert await s2.ha.change_to_slave(via_proxy, 1)
    m.ha.set_sync_state_set({1, 2})                            # confirmed {1,2}
    await put_all(m, messages(5, "a"))
    await wait_caught_up(m, s2)
    proxy.running.clear()                                      # 2 stalls
    s3 = await start_node(tmp_path, 3, cfg)
    assert await s3.ha.change_to_slave(m.address, 1)
    big = messages(160, "big", size=64 * 1024)                 # ~10 MiB: fills 2's buffers
    for i in range(0, len(big), 16):
        m.store.put_messages(big[i:i + 16], 0)
        m.ha.notify_new_data()
    await wait_caught_up(m, s3, timeout_s=30)
    await wait_for(lambda: {1, 2, 3} in m.ha.tracker.pending, what="expand {1,2,3} in flight")
    await wait_for(lambda: m.ha.maybe_shrink_sync_state_set(int(time.time() * 1000)) == {1, 3}
                   or m.ha.tracker.latest() == {1},
                   what="the shrink check to drop lagging member 2 (and keep 3)")
    # 3 stops before 2 catches up again: a caught-up 3 acking meanwhile would be proposed anew
    # (expand {1,3}, then {1,2,3}), and the old rule would then fail this put too, by luck.
    await stop_node(s3)                                        # 3 stops
    await wait_for(lambda: all(c.slave_id != 3 for c in m.ha.connections), what="3 gone")
    proxy.running.set()                                        # 2 catches up again
    await wait_caught_up(m, s2, timeout_s=30)
    status = (await m.ha.put(messages(1, "after"), 0)).status
    await proxy.close()
    await stop_node(s2)
    await stop_node(m)
    return status


def test_violation_2_no_ack_without_the_joining_member(tmp_path):
    """Issue 15 #2: the controller may already hold {1,2,3}; the put waits for 3 and times out."""
    assert run(violation_2(tmp_path)) == PutStatus.FLUSH_SLAVE_TIMEOUT


def test_violation_2_old_rule_is_caught_over_sockets(tmp_path, monkeypatch):
    monkeypatch.setattr(SyncStateTracker, "maybe_shrink", old_maybe_shrink)
    assert run(violation_2(tmp_path)) == PutStatus.PUT_OK
