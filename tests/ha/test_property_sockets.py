"""Small Hypothesis property on real stores and sockets: random appends, role changes (clean or
not) and detach/attach across 3 replicas; once everyone follows the final master and caught up,
every replica is byte-identical to it with the same epoch entries."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ha_helpers import (commitlog_bytes, data_epochs, messages, put_all, run, start_node, stop_node,
                        wait_caught_up)

ops = st.lists(st.one_of(
    st.tuples(st.just("elect"), st.integers(0, 2)),
    st.tuples(st.just("append"), st.integers(1, 8)),
    st.tuples(st.just("detach"), st.integers(0, 2)),
    st.tuples(st.just("attach"), st.integers(0, 2)),
    st.tuples(st.just("settle"), st.just(0)),
), min_size=1, max_size=12)


@settings(max_examples=int(os.environ.get("HA_PROPERTY_EXAMPLES", "10")), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_random_histories_converge_byte_identical(history):
    async def body(root: Path):
        nodes = [await start_node(root, i + 1) for i in range(3)]
        try:
            await scenario(nodes)
        finally:
            for n in nodes:
                await stop_node(n)

    async def scenario(nodes):
        master, epoch, attached = 0, 1, {1, 2}
        await nodes[0].ha.change_to_master(epoch)
        for i in attached:
            await nodes[i].ha.change_to_slave(nodes[0].address, epoch)
        for op, arg in history:
            if op == "elect" and arg != master:
                epoch += 1
                master = arg
                attached.discard(arg)
                assert await nodes[arg].ha.change_to_master(epoch)
                for i in attached:
                    assert await nodes[i].ha.change_to_slave(nodes[master].address, epoch)
            elif op == "append":
                await put_all(nodes[master], messages(arg, f"e{epoch}"))
            elif op == "detach" and arg in attached:
                attached.discard(arg)
                await nodes[arg].ha.change_to_slave(None, epoch)
            elif op == "attach" and arg != master and arg not in attached:
                attached.add(arg)
                await nodes[arg].ha.change_to_slave(nodes[master].address, epoch)
            elif op == "settle":
                for i in attached:
                    await wait_caught_up(nodes[master], nodes[i])
        m = nodes[master]
        for i in range(3):
            if i != master and i not in attached:
                await nodes[i].ha.change_to_slave(m.address, epoch)
        for i in range(3):
            if i != master:
                await wait_caught_up(m, nodes[i])
                assert commitlog_bytes(nodes[i].store) == commitlog_bytes(m.store)
                assert data_epochs(nodes[i].store) == data_epochs(m.store)

    with tempfile.TemporaryDirectory() as d:
        run(body(Path(d)))
