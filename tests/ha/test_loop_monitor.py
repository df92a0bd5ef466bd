"""Loop-stall monitor, the ordered IO thread, and the HA shells' blocking store work off the loop."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest

from rocketray.ha.loop_monitor import LoopStallMonitor, OrderedIO
from rocketray.ha.transport import RECV_BUFFER, RECV_MIN_FREE, ChunkReceiver

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
def test_a_32_mib_truncation_runs_on_the_io_thread_not_the_loop(tmp_path):
    """A slave holding 32 MiB the new master lacks truncates them in the handshake: the cut runs on
    the broker's IO thread, the loop keeps ticking (the worst stall is printed), and the slave ends
    byte-identical to the master."""
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
        assert cut_threads and threading.main_thread().name not in cut_threads, cut_threads
        assert commitlog_bytes(b1.store) == commitlog_bytes(b2.store)
        await stop_node(b1)
        await stop_node(b2)

    run(body())


class _Transport:
    """The two calls ChunkReceiver makes on its transport (flow control)."""

    def __init__(self) -> None:
        self.paused = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


def _receive(rx: ChunkReceiver, data: bytes) -> None:
    buf = rx.get_buffer(-1)
    buf[:len(data)] = data
    rx.buffer_updated(len(data))


def test_chunk_receiver_hands_out_read_only_chunks_and_reuses_only_unreferenced_buffers():
    """Received ranges come out as read-only views in order; a receive buffer is reused only once
    no chunk of it is alive (a live chunk is never overwritten)."""
    async def main() -> None:
        rx = ChunkReceiver(_Transport())       # type: ignore[arg-type]
        fill = RECV_BUFFER - RECV_MIN_FREE + 1
        _receive(rx, b"a" * fill)              # leaves less than RECV_MIN_FREE: next buffer
        kept = rx.take()
        assert [c.readonly for c in kept] == [True] and bytes(kept[0]) == b"a" * fill
        _receive(rx, b"b" * fill)              # second buffer
        dropped = rx.take()
        del dropped                            # the second buffer is free again
        _receive(rx, b"c" * 10)                # needs a new buffer: reuses the free one
        third = rx.take()
        assert bytes(kept[0]) == b"a" * fill   # the live chunk's buffer was not reused
        assert bytes(third[0]) == b"c" * 10
        assert len(rx._pool) == 2

    asyncio.run(main())


@pytest.mark.parametrize("flush", ["async", "sync"])
def test_the_slave_loop_does_only_bounded_store_work_itself(tmp_path, flush):
    """Which received actions the slave's loop applies itself (no job queued) and which go to the
    IO thread: a small append at the log's end (not fsynced), a small confirm-offset dispatch, acks
    and closes stay on the loop; truncations, epoch entries (fsynced), large or fsynced appends, an
    append that restarts the log and a large dispatch go to the IO thread."""
    from rocketray.broker.config import FlushMode, StoreConfig
    from rocketray.broker.batch import encode_batch
    from rocketray.broker.store import MessageStore
    from rocketray.ha.config import HAConfig
    from rocketray.ha.service import HAService
    from rocketray.ha.session import Append, Close, RecordEpoch, Send, SetConfirmOffset, Truncate
    from rocketray.ha.transport import INLINE_MAX_BYTES, SlaveClient

    store = MessageStore(tmp_path, StoreConfig(flush_mode=FlushMode(flush), background_thread=False))
    store.put_batch(encode_batch(messages(10)), now_ms=1)
    client = SlaveClient(HAService(store, 2, HAConfig(), b"secret"), ("127.0.0.1", 1))
    end = store.max_offset
    small, large = b"x" * 1024, b"x" * (INLINE_MAX_BYTES + 1)
    synced = flush == "sync"
    table = [
        (Send(b"ack"), True),
        (Close("bye"), True),
        (Append(end, small), not synced),
        (Append(end, large), False),
        (Append(end + 4096, small), False),          # not at the end: the store restarts its log
        (SetConfirmOffset(end), True),               # dispatches at most the whole (small) log
        (SetConfirmOffset(store.dispatched_offset + INLINE_MAX_BYTES + 1), False),
        (Truncate(0), False),
        (RecordEpoch(2, end), False),
    ]
    assert [client._light(action) for action, _ in table] == [light for _, light in table]
    store.close()
