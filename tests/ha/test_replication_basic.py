"""Real stores and sockets: a slave catches up a master and stays byte-identical."""

from __future__ import annotations

from ha_helpers import (commitlog_bytes, messages, put_all, run, served, start_node, stop_node,
                        wait_caught_up, wait_for)


def test_slave_catches_up_backlog_and_live_writes(tmp_path):
    """Backlog written before the slave connects plus writes afterwards arrive byte-identical,
    with the same epoch entries and a confirm offset on the slave."""
    async def body():
        m = await start_node(tmp_path, 1)
        s = await start_node(tmp_path, 2)
        assert await m.ha.change_to_master(1)
        await put_all(m, messages(50, "backlog"))
        assert await s.ha.change_to_slave(m.address, 1)
        await wait_caught_up(m, s)
        await put_all(m, messages(30, "live"))
        await wait_caught_up(m, s)
        assert commitlog_bytes(s.store) == commitlog_bytes(m.store)
        assert s.store.epoch_file.entries() == m.store.epoch_file.entries()
        await wait_for(lambda: s.store.confirm_offset == m.store.max_offset, what="confirm")
        assert served(s.store, 100) == 80
        await stop_node(s)
        await stop_node(m)
    run(body())
