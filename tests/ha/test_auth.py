"""Mutual HMAC-SHA256 challenge/response before the HA handshake."""

from __future__ import annotations

import os

import pytest

from rocketray.auth import AuthError, Authenticator


def run(client: Authenticator, server: Authenticator, extra: bytes = b"") -> None:
    for _ in range(10):
        c_out = client.data_to_send()
        if c_out:
            server.receive_data(c_out)
        s_out = server.data_to_send()
        if s_out:
            client.receive_data(s_out)
        if client.done and server.done and not c_out and not s_out:
            return


def test_same_secret_both_sides_authenticate_one_byte_at_a_time():
    c = Authenticator("client", b"secret", os.urandom(32))
    s = Authenticator("server", b"secret", os.urandom(32))
    for _ in range(5):
        for b in c.data_to_send():
            s.receive_data(bytes([b]))
        for b in s.data_to_send():
            c.receive_data(bytes([b]))
    assert c.done and s.done


def test_wrong_secret_is_rejected_by_the_server_before_it_proves_anything():
    c = Authenticator("client", b"wrong", os.urandom(32))
    s = Authenticator("server", b"secret", os.urandom(32))
    s.receive_data(c.data_to_send())
    c.receive_data(s.data_to_send())
    with pytest.raises(AuthError):
        s.receive_data(c.data_to_send())
    assert s.data_to_send() == b""     # no server proof leaked


def test_client_rejects_a_master_without_the_secret():
    c = Authenticator("client", b"secret", os.urandom(32))
    s = Authenticator("server", b"other", os.urandom(32))
    s.receive_data(c.data_to_send())
    c.receive_data(s.data_to_send())
    # a master without the secret cannot produce a valid proof
    with pytest.raises(AuthError):
        c.receive_data(b"\x00" * 32)


def test_reflection_and_garbage_are_rejected():
    c = Authenticator("client", b"secret", os.urandom(32))
    with pytest.raises(AuthError):          # a peer claiming the client role to a client
        c.receive_data(Authenticator("client", b"secret", os.urandom(32)).data_to_send())
    s = Authenticator("server", b"secret", os.urandom(32))
    with pytest.raises(AuthError):          # RocketMQ packet without auth
        s.receive_data(b"\x00\x00\x00\x01" + bytes(12))


def test_leftover_bytes_after_auth_are_kept():
    c = Authenticator("client", b"k", os.urandom(32))
    s = Authenticator("server", b"k", os.urandom(32))
    s.receive_data(c.data_to_send())
    c.receive_data(s.data_to_send())
    s.receive_data(c.data_to_send() + b"HA-bytes")
    assert s.done and s.leftover == b"HA-bytes"


def _tampered(proof: bytes, position: int) -> bytes:
    return proof[:position] + bytes([proof[position] ^ 0x01]) + proof[position + 1:]


@pytest.mark.parametrize("position", [4, 16, 31])
def test_server_checks_the_client_proof_over_its_full_length(position):
    # A proof right in its first bytes and wrong anywhere after is refused: a prefix
    # comparison (e.g. the first 4 bytes) would accept these.
    c = Authenticator("client", b"secret", os.urandom(32))
    s = Authenticator("server", b"secret", os.urandom(32))
    s.receive_data(c.data_to_send())
    c.receive_data(s.data_to_send())
    proof = c.data_to_send()
    assert len(proof) == 32
    with pytest.raises(AuthError):
        s.receive_data(_tampered(proof, position))
    assert not s.done and s.data_to_send() == b""


@pytest.mark.parametrize("position", [4, 16, 31])
def test_client_checks_the_server_proof_over_its_full_length(position):
    c = Authenticator("client", b"secret", os.urandom(32))
    s = Authenticator("server", b"secret", os.urandom(32))
    s.receive_data(c.data_to_send())
    c.receive_data(s.data_to_send())
    s.receive_data(c.data_to_send())
    server_proof = s.data_to_send()
    assert s.done and len(server_proof) == 32
    with pytest.raises(AuthError):
        c.receive_data(_tampered(server_proof, position))
    assert not c.done


def test_a_peer_that_echoes_our_nonce_is_refused_before_any_proof():
    # Echoing the nonce would let a peer bounce our own proof back at us (both proofs would be
    # over the same pair of nonces): the echo is refused on both sides before anything keyed is sent.
    nonce = os.urandom(32)
    c = Authenticator("client", b"secret", nonce)
    c.data_to_send()
    echo_server = Authenticator("server", b"secret", nonce)
    with pytest.raises(AuthError, match="echoed"):
        c.receive_data(echo_server.data_to_send())
    assert c.data_to_send() == b""          # the client sent no proof
    s = Authenticator("server", b"secret", nonce)
    s.data_to_send()
    with pytest.raises(AuthError, match="echoed"):
        s.receive_data(Authenticator("client", b"secret", nonce).data_to_send())
    assert s.data_to_send() == b""


def test_a_proof_made_for_the_ha_port_is_refused_on_the_session_port():
    """Each protocol proves over its own label: the same secret under the HA label does not open a
    controller session (a captured or reflected HA proof is worthless there)."""
    from rocketray.auth import HA_LABEL, SESSION_LABEL

    c = Authenticator("client", b"secret", os.urandom(32), HA_LABEL)
    s = Authenticator("server", b"secret", os.urandom(32), SESSION_LABEL)
    s.receive_data(c.data_to_send())
    c.receive_data(s.data_to_send())
    with pytest.raises(AuthError):
        s.receive_data(c.data_to_send())
    assert not s.done and s.data_to_send() == b"", "the server proves nothing to a client that failed"
