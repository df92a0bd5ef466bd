"""A slave killed with SIGKILL mid-stream or in the middle of a handshake truncation converges
to a byte-identical copy of its master after a restart."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

from ha_helpers import (commitlog_bytes, messages, open_store, put_all, run, start_node,
                        stop_node, switch, wait_caught_up, wait_for)

from rr_members import broker, member

HERE = os.path.dirname(__file__)
SEG = 1 << 20


def spawn(store_dir, master, broker_id, epoch, mode=""):
    args = [sys.executable, os.path.join(HERE, "slave_proc.py"), str(store_dir), master.address,
            str(broker_id), str(epoch), str(SEG)] + ([mode] if mode else [])
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdin.write(json.dumps(member(broker(broker_id)).to_json()).encode() + b"\n")
    proc.stdin.close()
    return proc


def slave_ack(master, slave_id):
    for c in master.ha.status()["connections"]:
        if c["slave_id"] == slave_id:
            return c["ack_offset"]
    return -1


async def stop_proc(proc) -> None:
    """Clean stop (SIGTERM: the slave flushes and writes its checkpoint)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    await asyncio.get_running_loop().run_in_executor(None, proc.wait)


def test_slave_killed_mid_stream_converges_after_restart(tmp_path):
    """kill -9 while a 12 MiB backlog streams in 16 KiB batches; restart; byte-identical."""
    async def body():
        m = await start_node(tmp_path, 1)
        await m.ha.change_to_master(1)
        for i in range(12):
            await put_all(m, messages(64, f"b{i}", size=16 * 1024 - 80))
        total = m.store.max_offset
        slave_dir = tmp_path / "slave2"
        for round_ in range(2):   # kill twice at different points
            proc = spawn(slave_dir, m, 2, 1, "throttle")  # slow enough that the kill lands mid-stream
            target = total * (round_ + 1) // 4
            await wait_for(lambda: slave_ack(m, 2) > target, 60, f"slave ack past {target}")
            proc.send_signal(signal.SIGKILL)
            await asyncio.get_running_loop().run_in_executor(None, proc.wait)
            assert proc.returncode == -signal.SIGKILL
            assert slave_ack(m, 2) < total, "stream finished before the kill"
        proc = spawn(slave_dir, m, 2, 1)
        try:
            await wait_for(lambda: slave_ack(m, 2) == total, 60, "restarted slave to catch up")
        finally:
            await stop_proc(proc)
        store = open_store(slave_dir, SEG)
        assert commitlog_bytes(store) == commitlog_bytes(m.store)
        assert store.epoch_file.entries() == m.store.epoch_file.entries()
        store.close()
        await stop_node(m)
    run(body())


def test_slave_killed_inside_handshake_truncation_converges(tmp_path):
    """Old master A keeps 300 unreplicated messages; B becomes master of epoch 2; A follows B as
    a slave and is SIGKILLed inside store.truncate (commit log cut, nothing else updated);
    restarted, it finishes the truncation and ends byte-identical to B."""
    async def body():
        a = await start_node(tmp_path, 1)
        b = await start_node(tmp_path, 2)
        await switch(a, [b], 1)
        await put_all(a, messages(10, "shared"))
        await wait_caught_up(a, b)
        await b.ha.change_to_slave(None, 1)          # B stops following
        await put_all(a, messages(300, "a-only"))
        a_dir = a.store.root
        await stop_node(a)
        assert await b.ha.change_to_master(2)
        await put_all(b, messages(10, "b-epoch2"))
        proc = spawn(a_dir, b, 1, 2, mode="kill-in-truncate")
        await asyncio.get_running_loop().run_in_executor(None, proc.wait)
        assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
        proc = spawn(a_dir, b, 1, 2)
        try:
            await wait_for(lambda: slave_ack(b, 1) == b.store.max_offset, 30,
                           "restarted A to catch up with B")
        finally:
            await stop_proc(proc)
        store = open_store(a_dir, SEG)
        assert commitlog_bytes(store) == commitlog_bytes(b.store)
        assert store.epoch_file.entries() == b.store.epoch_file.entries()
        bodies = [msg.body for msg in store.get_messages("FooBar", 0, 0, 1000)]
        assert len(bodies) == 20 and not any(x.startswith(b"a-only") for x in bodies)
        store.close()
        await stop_node(b)
    run(body())
