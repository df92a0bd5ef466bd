"""Loop-stall monitor, the ordered IO thread, and the HA shells' blocking store work off the loop."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest

from rocketray.ha.loop_monitor import LoopStallMonitor, OrderedIO

from ha_helpers import (commitlog_bytes, fast_config, messages, put_all, run, start_node, stop_node,
                        switch, wait_caught_up, wait_for)


def test_monitor_reports_a_blocking_call_and_nothing_on_an_idle_loop():
    """A callback that holds the loop 120 ms is seen as a stall of about that size; an idle loop
    shows none near it."""
    async def main() -> tuple[float, float]:
        monitor = LoopStallMonitor(interval_ms=5).start()
        deadline = time.monotonic() + 5
        while monitor.samples < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        idle = monitor.max_stall_ms
        time.sleep(0.12)                    # blocks the loop on purpose
        samples = monitor.samples
        while monitor.samples <= samples and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        return idle, await monitor.stop()

    idle, worst = asyncio.run(main())
    assert worst >= 100, worst
    assert idle < 100, idle


def test_ordered_io_runs_jobs_one_at_a_time_in_submission_order():
    """Jobs of random length finish in the order they were submitted, never two at once, on one
    thread that is not the loop's."""
    seen: list[int] = []
    running = []
    threads = set()

    def job(i: int, pause_s: float) -> int:
        running.append(i)
        assert len(running) == 1, running
        threads.add(threading.current_thread().name)
        time.sleep(pause_s)
        seen.append(i)
        running.remove(i)
        return i

    async def main() -> list[int]:
        io = OrderedIO("t")
        rng = random.Random(7)
        futs = [io.submit(job, i, rng.random() / 500) for i in range(40)]
        out = await asyncio.gather(*futs)
        io.close()
        return list(out)

    assert asyncio.run(main()) == list(range(40))
    assert seen == list(range(40))
    assert len(threads) == 1 and threading.main_thread().name not in threads


@pytest.mark.slow
def test_a_32_mib_truncation_runs_on_the_receive_thread_not_the_loop(tmp_path):
    """A slave holding 32 MiB the new master lacks truncates them in the handshake: the cut runs on
    the slave's receive thread, the loop keeps ticking (the worst stall is printed), and the slave
    ends byte-identical to the master."""
    seg = 64 << 20

    async def body():
        cfg = fast_config()
        b1 = await start_node(tmp_path, 1, cfg, segment_size=seg)
        b2 = await start_node(tmp_path, 2, cfg, segment_size=seg)
        await switch(b1, [b2], 1)
        await put_all(b1, messages(10, "e1"))
        await wait_caught_up(b1, b2)
        await stop_node(b2)
        await wait_for(lambda: not b1.ha.connections, what="master to notice the slave left")
        big = messages(256, "lost", size=4000)
        while b1.store.max_offset < (32 << 20) + 10_000:
            await put_all(b1, big)
        lost_end = b1.store.max_offset
        await stop_node(b1)
        b2 = await start_node(tmp_path, 2, cfg, segment_size=seg)
        assert await b2.ha.change_to_master(2)
        await put_all(b2, messages(3, "e2"))
        b1 = await start_node(tmp_path, 1, cfg, segment_size=seg)
        assert b1.store.max_offset == lost_end
        cut_threads: list[str] = []
        real_truncate = b1.store.truncate

        def recording_truncate(offset: int) -> None:
            cut_threads.append(threading.current_thread().name)
            real_truncate(offset)

        b1.store.truncate = recording_truncate      # instance attribute: records, then cuts
        monitor = LoopStallMonitor().start()
        assert await b1.ha.change_to_slave(b2.address, 2)
        await wait_caught_up(b2, b1, timeout_s=60)
        worst = await monitor.stop()
        print(f"32 MiB truncation: worst loop stall {worst:.1f} ms")
        assert cut_threads == ["ha-slave-1"], cut_threads
        assert commitlog_bytes(b1.store) == commitlog_bytes(b2.store)
        await stop_node(b1)
        await stop_node(b2)

    run(body())
