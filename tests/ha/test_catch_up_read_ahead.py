"""A catch-up's log is faulted in on the service's reader thread before the event loop sends it: a
backlog no longer in the page cache would otherwise make the master's loop wait for the disk."""

from __future__ import annotations

import threading

from ha_helpers import (commitlog_bytes, fast_config, messages, put_all, run, start_node, stop_node,
                        wait_caught_up)

from rocketray.broker.store import MessageStore


def covered(start: int, end: int, ranges: list[tuple[int, int]]) -> bool:
    """``[start, end)`` lies inside the union of ``ranges``."""
    pos = start
    for a, b in sorted(ranges):
        if a <= pos < b:
            pos = b
    return pos >= end


def test_catch_up_transfers_are_read_ahead_on_the_reader_thread_before_the_loop_reads_them(tmp_path):
    batch = 256 * 1024

    async def body():
        cfg = fast_config(ha_transfer_batch_size=batch)
        master = await start_node(tmp_path, 1, cfg)
        assert await master.ha.change_to_master(1)
        while master.store.max_offset < 12 << 20:
            await put_all(master, messages(64, "bulk", size=4000))
        backlog = master.store.max_offset
        view = master.ha.log_view
        warmed: list[tuple[int, int]] = []
        warm_threads: set[str] = set()
        reads: list[tuple[int, int, bool, str]] = []
        warm, read_raw = view.warm, view.read_raw

        def recording_warm(offset: int, length: int) -> None:
            warm(offset, length)
            warm_threads.add(threading.current_thread().name)
            warmed.append((offset, offset + length))

        def recording_read(offset: int, max_bytes: int):
            body = read_raw(offset, max_bytes)
            reads.append((offset, offset + len(body), covered(offset, offset + len(body), list(warmed)),
                          threading.current_thread().name))
            return body

        view.warm, view.read_raw = recording_warm, recording_read
        slave = await start_node(tmp_path, 2, cfg)
        assert await slave.ha.change_to_slave(master.address, 1)
        await wait_caught_up(master, slave, timeout_s=60)
        assert commitlog_bytes(slave.store) == commitlog_bytes(master.store)

        catch_up = [r for r in reads if backlog - r[0] >= 2 * batch]
        assert len(catch_up) >= 40
        assert all(done for _start, _end, done, _thread in catch_up), \
            [r for r in catch_up if not r[2]][:3]
        assert {thread for *_, thread in reads} == {threading.current_thread().name}  # the loop
        assert warm_threads and all(name.startswith("io-ha-read-1") for name in warm_threads)
        await stop_node(slave)
        await stop_node(master)

    run(body())


def test_warm_clamps_to_the_log_and_ignores_a_closed_store(tmp_path):
    store = MessageStore(tmp_path / "s")
    store.put_messages(messages(10), 0)
    store.warm(-100, 1 << 30)              # beyond both ends: clamped, no error
    store.warm(store.max_offset + 10, 100)
    store.close()
    store.warm(0, 100)                     # closed: nothing to do
