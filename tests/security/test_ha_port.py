"""Finding 5: the HA port serves only a registered replica of its group, under its own broker id. Real
HA services, stores and sockets; the registrations are the controller's answer as the broker reads it
(``RegisteredPeers`` over a table)."""

from __future__ import annotations

import asyncio

from rocketray.auth import HA_LABEL
from rocketray.ha.peers import RegisteredPeers, handshake_problem, master_problem
from rocketray.wire.ha_protocol import encode_slave_ack, encode_slave_handshake
from ha_helpers import fast_config, messages, put_all, run, start_node, stop_node, wait_caught_up, wait_for
from rr_members import broker, links

REGISTERED = {1: broker(1).uri, 2: broker(2).uri, 3: broker(3).uri}


def peers() -> RegisteredPeers:
    async def registered(group: str) -> dict[int, str | None]:
        assert group == "broker-a"
        return dict(REGISTERED)
    return RegisteredPeers("broker-a", registered)


def test_the_rules_name_who_may_claim_what():
    assert handshake_problem(2, 2) is None and handshake_problem(None, 7) is None
    assert "may not claim slave id 2" in handshake_problem(3, 2)
    assert master_problem("broker-a", broker(1), "h:1") is None
    assert "not a broker of broker-a" in master_problem("broker-a", broker(1, "broker-b"), "h:1")

    async def ids():
        p = peers()
        return [await p.slave_id_of(m) for m in (broker(2), broker(3), broker(9), broker(2, "broker-b"))]
    assert asyncio.run(ids()) == [2, 3, None, None]


def test_a_member_claiming_another_replicas_slave_id_is_closed_and_its_acks_never_count(tmp_path):
    # Today anyone's handshake claiming slave 2 replaces slave 2's connection, reads the whole log
    # and its acks count. Now member broker-a/3 (registered as 3) claiming 2 is closed at its
    # handshake; the real slave 2 keeps its connection and the master's view of it.
    async def body():
        cfg = fast_config(all_ack_in_sync_state_set=True)
        m = await start_node(tmp_path, 1, cfg)
        m.ha.peers, m.ha.group = peers(), "broker-a"
        s = await start_node(tmp_path, 2, cfg)
        assert await m.ha.change_to_master(1)
        m.ha.set_sync_state_set({1, 2})
        assert await s.ha.change_to_slave(m.address, 1)
        await put_all(m, messages(50))
        await wait_caught_up(m, s)
        real = next(c for c in m.ha.connections if c.slave_id == 2)
        reader, writer, _peer = await links(broker(3)).connect("127.0.0.1", m.port, HA_LABEL)
        writer.write(encode_slave_handshake(2) + encode_slave_ack(10 ** 9))
        await writer.drain()
        assert await asyncio.wait_for(reader.read(1 << 20), 5) == b"", "closed without a byte of the log"
        writer.close()
        assert real in m.ha.connections and not real.closed, "the real slave 2 keeps its connection"
        assert max(c.ack_offset for c in m.ha.connections if c.slave_id == 2) <= m.store.max_offset
        await put_all(m, messages(5, "after"))     # all-ack: only the real slave's ack can answer it
        await wait_caught_up(m, s)
        await stop_node(s)
        await stop_node(m)
    run(body())


def test_a_member_of_another_group_or_an_unregistered_one_gets_nothing(tmp_path):
    async def body():
        m = await start_node(tmp_path, 1)
        m.ha.peers, m.ha.group = peers(), "broker-a"
        assert await m.ha.change_to_master(1)
        await put_all(m, messages(5))
        before = m.ha.rejected_connections
        for stranger in (broker(1, "broker-b"), broker(9)):
            reader, writer, _peer = await links(stranger).connect("127.0.0.1", m.port, HA_LABEL)
            writer.write(encode_slave_handshake(stranger.index))
            await writer.drain()
            assert await asyncio.wait_for(reader.read(1 << 20), 5) == b""
            writer.close()
        await wait_for(lambda: m.ha.rejected_connections == before + 2, what="both refused")
        assert not m.ha.connections
        await stop_node(m)
    run(body())


def test_a_peer_without_a_member_certificate_fails_tls(tmp_path):
    # An application holds no member certificate: the HA port refuses it in the TLS handshake.
    import ssl

    from rocketray.tls import ClientTrust
    from rr_members import ca_for

    async def body():
        m = await start_node(tmp_path, 1)
        assert await m.ha.change_to_master(1)
        await put_all(m, messages(5))
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", m.port, server_hostname="x",
                                                           ssl=ClientTrust("test", ca_for().cert_pem).context())
            writer.write(encode_slave_handshake(2))
            got = await asyncio.wait_for(reader.read(1 << 20), 5)
        except (ssl.SSLError, ConnectionError):
            got = b""
        assert got == b""
        await wait_for(lambda: m.ha.border.handshake_failures == 1, what="the failed handshake counted")
        assert not m.ha.connections
        await stop_node(m)
    run(body())


def test_a_slave_refuses_a_master_of_another_group(tmp_path):
    # The slave side: a master whose certificate names a broker of another group is not followed.
    async def body():
        impostor = await start_node(tmp_path, 1, member=links(broker(1, "broker-b")))
        assert await impostor.ha.change_to_master(1)
        await put_all(impostor, messages(5))
        s = await start_node(tmp_path, 2)
        s.ha.peers, s.ha.group = peers(), "broker-a"
        assert await s.ha.change_to_slave(impostor.address, 1)
        await wait_for(lambda: "not a broker of broker-a" in s.ha.status()["slave_last_error"],
                       what="the slave refused the master")
        assert s.store.max_offset == 0
        await stop_node(s)
        await stop_node(impostor)
    run(body())
