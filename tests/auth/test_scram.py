"""SCRAM-SHA-256 (rocketray.scram): RFC 7677's test vector for the derivations; the exchange fed in
every chunking; wrong secrets, unknown users, replays, relays and impostor servers refused; every
field bounded; random bytes only ever ask for more or raise a protocol error."""

from __future__ import annotations

import base64
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketray import scram
from rocketray.scram import (ClientState, ErrorReason, FrameType, ScramAuthError, ScramClient, ScramCredential,
                             ScramError, ScramProtocolError, ScramServer, ServerState)

SECRET = "correct horse battery staple"
SALT = bytes(range(16))
ITERATIONS = 4096          # the RFC minimum keeps these tests fast
CREDENTIAL = ScramCredential.from_secret(SECRET, SALT, ITERATIONS)
FAKE_KEY = b"k" * 32


def nonce(tag: int) -> bytes:
    return bytes([tag]) * scram.NONCE_SIZE


def server(users=None, server_nonce=nonce(2), **kw) -> ScramServer:
    users = {"alice": CREDENTIAL} if users is None else users
    return ScramServer(users.get, server_nonce, FAKE_KEY, fake_iterations=ITERATIONS, **kw)


def client(user="alice", secret=SECRET, client_nonce=nonce(1), **kw) -> ScramClient:
    return ScramClient(user, secret, client_nonce, **kw)


def run(c: ScramClient, s: ScramServer) -> list[bytes]:
    """The whole exchange in order; returns the four frames (client first, server first, ...)."""
    frames = []
    for sender, receiver in ((c, s), (s, c), (c, s), (s, c)):
        data = sender.data_to_send()
        frames.append(data)
        receiver.receive_data(data)
    return frames


# -- RFC 7677 section 3 --------------------------------------------------------------------------

RFC_AUTH_MESSAGE = (b"n=user,r=rOprNGfwEbeRWgbNEkqO,"
                    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,"
                    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_PROOF = base64.b64decode("dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
RFC_SIGNATURE = base64.b64decode("6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")


def test_rfc7677_vector_client_proof_and_server_signature():
    """RFC 7677's example (user "user", password "pencil", 4096 iterations): the derived keys give
    exactly its ClientProof and ServerSignature, and the stored record verifies that proof."""
    keys = scram.derive_keys("pencil", RFC_SALT, 4096)
    assert scram.client_proof(keys, RFC_AUTH_MESSAGE) == RFC_PROOF
    assert scram.server_signature(keys.server_key, RFC_AUTH_MESSAGE) == RFC_SIGNATURE
    record = ScramCredential.from_secret("pencil", RFC_SALT, 4096)
    assert (record.stored_key, record.server_key) == (keys.stored_key, keys.server_key)
    assert scram.verify_client_proof(record, RFC_AUTH_MESSAGE, RFC_PROOF)
    assert not scram.verify_client_proof(record, RFC_AUTH_MESSAGE + b"x", RFC_PROOF)
    assert not scram.verify_client_proof(record, RFC_AUTH_MESSAGE, bytes(32))


def test_the_stored_record_holds_neither_the_secret_nor_the_salted_password():
    """The credential has exactly salt, iterations, StoredKey and ServerKey; none of them is the
    secret or the SaltedPassword, and no repr shows a key."""
    salted = scram.salted_password(SECRET, SALT, ITERATIONS)
    record = ScramCredential.from_secret(SECRET, SALT, ITERATIONS)
    assert [f for f in ScramCredential.__slots__] == ["salt", "iterations", "stored_key", "server_key"]
    assert salted not in (record.stored_key, record.server_key) and SECRET.encode() not in repr(record).encode()
    keys = scram.derive_keys(SECRET, SALT, ITERATIONS)
    c = client()
    for text in (repr(record), repr(keys), repr(c), repr(server())):
        assert record.stored_key.hex() not in text and record.server_key.hex() not in text and SECRET not in text


@pytest.mark.parametrize("kwargs,problem", [
    ({"salt": b"s" * 15}, "salt must be 16..64 bytes"),
    ({"salt": b"s" * 65}, "salt must be 16..64 bytes"),
    ({"iterations": 4095}, "iterations must be an int in 4096..1000000"),
    ({"iterations": 1_000_001}, "iterations must be an int in 4096..1000000"),
    ({"stored_key": b"k" * 31}, "stored_key must be 32 bytes"),
    ({"server_key": "k" * 32}, "server_key must be 32 bytes"),
])
def test_credential_problems(kwargs, problem):
    """A record outside the bounds names its problem (the controller refuses it with that text)."""
    fields = {"salt": SALT, "iterations": ITERATIONS, "stored_key": b"a" * 32, "server_key": b"b" * 32, **kwargs}
    assert ScramCredential(**fields).problem() == problem
    assert ScramCredential(SALT, ITERATIONS, b"a" * 32, b"b" * 32).problem() is None


# -- the exchange ----------------------------------------------------------------------------------

def test_exchange_authenticates_both_sides_and_passes_trailing_bytes_on():
    """A right secret: the server is DONE naming the user, the client DONE after checking the
    server's signature; bytes after the exchange are trailing data on each side."""
    c, s = client(), server()
    frames = run(c, s)
    assert (s.state, s.user, c.state) == (ServerState.DONE, "alice", ClientState.DONE)
    assert [f[0] for f in frames] == [FrameType.CLIENT_FIRST, FrameType.SERVER_FIRST, FrameType.CLIENT_FINAL,
                                      FrameType.SERVER_FINAL]
    assert sum(len(f) for f in frames[0::2]) <= scram.MAX_PRE_AUTH_CLIENT_BYTES
    s.receive_data(b"first request")
    c.receive_data(b"first answer")
    assert (s.trailing_data, c.trailing_data) == (b"first request", b"first answer")


def test_bytes_in_the_same_chunk_as_the_last_frame_are_trailing_data():
    """Whatever follows CLIENT_FINAL / SERVER_FINAL in one read is handed on, not swallowed."""
    c, s = client(), server()
    s.receive_data(c.data_to_send())
    c.receive_data(s.data_to_send())
    s.receive_data(c.data_to_send() + b"PUT")
    c.receive_data(s.data_to_send() + b"OK")
    assert (s.trailing_data, c.trailing_data) == (b"PUT", b"OK")


def _frames_of_a_good_exchange() -> list[bytes]:
    return run(client(), server())


def _receiver_of(index: int):
    """The party that receives frame ``index`` of a good exchange, in the state just before it
    (nonces are fixed, so the frames are the same every time)."""
    frames = _frames_of_a_good_exchange()
    c, s = client(), server()
    c.data_to_send()
    if index >= 2:
        s.receive_data(frames[0])
        s.data_to_send()
    if index >= 3:
        c.receive_data(frames[1])
        c.data_to_send()
    return s if index % 2 == 0 else c


@pytest.mark.parametrize("index", range(4))
def test_every_prefix_asks_for_more_and_every_split_completes(index):
    """Each frame of a good exchange: every strict prefix changes nothing and sends nothing; every
    split into two chunks, and byte-at-a-time feeding, reach the same state as one chunk."""
    frame = _frames_of_a_good_exchange()[index]
    whole = _receiver_of(index)
    whole.receive_data(frame)
    end_state, end_output = whole.state, whole.data_to_send()
    for cut in range(len(frame)):
        party = _receiver_of(index)
        before = party.state
        party.receive_data(frame[:cut])
        assert party.state is before and party.data_to_send() == b""
        party.receive_data(frame[cut:])
        assert (party.state, party.data_to_send()) == (end_state, end_output)
    party = _receiver_of(index)
    for byte in frame:
        party.receive_data(bytes([byte]))
    assert (party.state, party.data_to_send()) == (end_state, end_output)


def test_wrong_secret_fails_at_the_proof_on_both_sides():
    """A wrong secret: the server queues AUTHENTICATION_FAILED and is FAILED (no user); the client
    raises ScramAuthError on it and refuses further bytes."""
    c, s = client(secret="not the secret"), server()
    s.receive_data(c.data_to_send())
    c.receive_data(s.data_to_send())
    s.receive_data(c.data_to_send())
    error = s.data_to_send()
    assert (s.state, s.failure, s.user, s.claimed_user) == (ServerState.FAILED, ErrorReason.AUTHENTICATION_FAILED,
                                                            None, "alice")
    assert error == bytes([FrameType.SERVER_ERROR, 0, 1, ErrorReason.AUTHENTICATION_FAILED])
    with pytest.raises(ScramAuthError, match="refused the credential .authentication failed"):
        c.receive_data(error)
    assert c.state is ClientState.FAILED
    with pytest.raises(ScramProtocolError):
        c.receive_data(b"x")
    with pytest.raises(ScramProtocolError):
        s.receive_data(b"x")


def _first_answer(name: str, s: ScramServer | None = None) -> bytes:
    s = s or server()
    s.receive_data(client(user=name).data_to_send())
    return s.data_to_send()


def test_unknown_user_is_answered_like_a_known_one_and_fails_the_same_way():
    """No user enumeration: an unknown name gets a SERVER_FIRST of the same shape (salt length,
    iteration count), the same salt every time, another salt than other names, and at the end the
    very error frame a wrong secret gets."""
    known, unknown = _first_answer("alice"), _first_answer("mallory")
    assert len(known) == len(unknown) and known[64 + 3:64 + 3 + 5] == unknown[64 + 3:64 + 3 + 5]
    assert _first_answer("mallory", server(server_nonce=nonce(9)))[-16:] == unknown[-16:]
    assert _first_answer("mallory2")[-16:] != unknown[-16:]
    outcomes = []
    for name in ("alice", "mallory"):
        c, s = client(user=name, secret="guess"), server()
        s.receive_data(c.data_to_send())
        c.receive_data(s.data_to_send())
        s.receive_data(c.data_to_send())
        outcomes.append((s.state, s.failure, s.data_to_send()))
    assert outcomes[0] == outcomes[1]


def test_unknown_user_never_authenticates_even_with_a_proof_that_verifies(monkeypatch):
    """The unknown-user gate is not only the fake keys: with the fake record replaced by alice's
    real one (so the proof verifies), a name the lookup does not know is still refused."""
    monkeypatch.setattr(scram, "_fake_credential", lambda key, name, iterations: CREDENTIAL)
    c, s = client(user="ghost"), server()
    s.receive_data(c.data_to_send())
    c.receive_data(s.data_to_send())
    s.receive_data(c.data_to_send())
    assert (s.state, s.failure, s.user) == (ServerState.FAILED, ErrorReason.AUTHENTICATION_FAILED, None)


def test_replayed_client_final_against_a_fresh_server_nonce_is_refused():
    """A captured CLIENT_FINAL replayed to a new server (new server nonce) is a protocol error; with
    its nonce rewritten to the new one, the old proof does not verify."""
    frames = _frames_of_a_good_exchange()
    s = server(server_nonce=nonce(7))
    s.receive_data(frames[0])
    s.data_to_send()
    with pytest.raises(ScramProtocolError, match="nonce is not this exchange's"):
        s.receive_data(frames[2])
    assert s.state is ServerState.FAILED
    s = server(server_nonce=nonce(7))
    s.receive_data(frames[0])
    new_nonce = s.data_to_send()[3:3 + 64]
    s.receive_data(frames[2][:3] + new_nonce + frames[2][3 + 64:])
    assert (s.state, s.failure) == (ServerState.FAILED, ErrorReason.AUTHENTICATION_FAILED)


def test_server_without_the_users_keys_cannot_pass_as_the_server():
    """A server holding a wrong record refuses the client (the client raises); an impostor holding
    the StoredKey but not the ServerKey accepts the proof but its signature is refused; a forged
    SERVER_FINAL is refused."""
    wrong = ScramCredential.from_secret("another secret entirely", SALT, ITERATIONS)
    c, s = client(), server({"alice": wrong})
    with pytest.raises(ScramAuthError, match="refused"):
        run(c, s)
    impostor = ScramCredential(CREDENTIAL.salt, CREDENTIAL.iterations, CREDENTIAL.stored_key, b"\0" * 32)
    c, s = client(), server({"alice": impostor})
    with pytest.raises(ScramAuthError, match="signature is wrong"):
        run(c, s)
    assert s.state is ServerState.DONE and c.state is ClientState.FAILED
    c, s = client(), server()
    s.receive_data(c.data_to_send())
    c.receive_data(s.data_to_send())
    with pytest.raises(ScramAuthError, match="signature is wrong"):
        c.receive_data(bytes([FrameType.SERVER_FINAL, 0, 32]) + b"\x42" * 32)


def test_channel_binding_mismatch_fails_a_relay():
    """Both sides bind the exchange to their TLS channel: a relay between two channels (different
    bindings) makes the proof fail."""
    c, s = client(channel_binding=b"channel-1"), server(channel_binding=b"channel-2")
    with pytest.raises(ScramAuthError):
        run(c, s)
    assert s.failure is ErrorReason.AUTHENTICATION_FAILED
    c, s = client(channel_binding=b"channel-1"), server(channel_binding=b"channel-1")
    run(c, s)
    assert s.state is ServerState.DONE


def test_unsupported_version_is_refused_with_its_reason():
    """A CLIENT_FIRST of another protocol version gets SERVER_ERROR(UNSUPPORTED_VERSION)."""
    frame = bytearray(client().data_to_send())
    frame[3] = 2
    s = server()
    s.receive_data(bytes(frame))
    assert (s.state, s.failure) == (ServerState.FAILED, ErrorReason.UNSUPPORTED_VERSION)
    c = client()
    c.data_to_send()
    with pytest.raises(ScramAuthError, match="unsupported version"):
        c.receive_data(s.data_to_send())


@pytest.mark.parametrize("data,match", [
    (bytes([9]), "unexpected frame type 9"),
    (bytes([FrameType.CLIENT_FINAL, 0, 96]), "unexpected frame type 3"),
    (bytes([FrameType.CLIENT_FIRST, 0xFF, 0xFF]), "outside 35..98"),
    (bytes([FrameType.CLIENT_FIRST, 0, 34]), "outside 35..98"),
    (bytes([FrameType.CLIENT_FIRST, 0, 35, 1, 2]) + b"a" + b"n" * 32, "name length 2 does not fit"),
    (bytes([FrameType.CLIENT_FIRST, 0, 35, 1, 0]) + b"a" + b"n" * 32, "name length 0 does not fit"),
    (bytes([FrameType.CLIENT_FIRST, 0, 35, 1, 1]) + b"\xff" + b"n" * 32, "not UTF-8"),
])
def test_server_refuses_malformed_client_bytes_from_the_header(data, match):
    """Wrong type, a body length outside its bounds (refused from the 3-byte header, before any body
    is buffered), inconsistent name length, non-UTF-8 names: ScramProtocolError, state FAILED."""
    s = server()
    with pytest.raises(ScramProtocolError, match=match):
        s.receive_data(data)
    assert s.state is ServerState.FAILED and s.data_to_send() == b""


def _server_first(iterations=ITERATIONS, salt=SALT, client_nonce=nonce(1), salt_len=None) -> bytes:
    body = (client_nonce + nonce(2) + iterations.to_bytes(4, "big") + bytes([len(salt) if salt_len is None else
                                                                            salt_len]) + salt)
    return bytes([FrameType.SERVER_FIRST]) + len(body).to_bytes(2, "big") + body


@pytest.mark.parametrize("frame,match", [
    (_server_first(iterations=4095), "4095 iterations, outside 4096..1000000"),
    (_server_first(iterations=1_000_001), "outside 4096"),
    (_server_first(client_nonce=nonce(5)), "does not start with this client's nonce"),
    (_server_first(salt_len=17), "salt length 17 does not fit"),
    (_server_first(salt=b"s" * 15), "outside 85..133"),
])
def test_client_refuses_bad_server_first(frame, match):
    """A server asking for too few or too many iterations (downgrade, CPU exhaustion), another
    nonce, or a malformed salt: ScramProtocolError before any key is derived."""
    derived = []
    c = client(derive=lambda *a: derived.append(a) or scram.derive_keys(*a))
    c.data_to_send()
    with pytest.raises(ScramProtocolError, match=match):
        c.receive_data(frame)
    assert derived == [] and c.state is ClientState.FAILED


def test_client_min_iterations_refuses_a_downgrade():
    """A client that expects 8192 rounds refuses a server offering 4096."""
    c = client(min_iterations=8192)
    c.data_to_send()
    with pytest.raises(ScramProtocolError, match="outside 8192"):
        c.receive_data(_server_first())


def test_pre_authentication_bytes_are_bounded():
    """A server never holds more than MAX_PRE_AUTH_CLIENT_BYTES of a peer's bytes: a stream that
    stays plausible (a valid CLIENT_FIRST, then a CLIENT_FINAL header) but keeps sending is cut."""
    s = server()
    s.receive_data(client().data_to_send())
    with pytest.raises(ScramProtocolError, match=f"over {scram.MAX_PRE_AUTH_CLIENT_BYTES} bytes"):
        s.receive_data(bytes([FrameType.CLIENT_FINAL, 0, 96]) + b"\0" * 200)


def test_names_and_nonces_are_checked_locally():
    """The client refuses an empty or over-long name, an empty secret and a short nonce."""
    for bad in ("", "x" * 65, "é" * 33):
        with pytest.raises(ValueError):
            client(user=bad)
    with pytest.raises(ValueError):
        client(secret="")
    with pytest.raises(ValueError):
        client(client_nonce=b"short")
    with pytest.raises(ValueError):
        ScramServer({}.get, nonce(1), b"short")
    assert client(user="é" * 32).state is ClientState.WAIT_SERVER_FIRST


# -- fuzz -----------------------------------------------------------------------------------------

def _feed_server(chunks):
    s = server()
    try:
        for chunk in chunks:
            s.receive_data(chunk)
    except ScramProtocolError:
        assert s.state is ServerState.FAILED
    assert len(s._reader.buffer) <= scram.MAX_PRE_AUTH_CLIENT_BYTES


def _feed_client(chunks):
    c = client()
    c.data_to_send()
    try:
        for chunk in chunks:
            c.receive_data(chunk)
    except ScramError:
        assert c.state is ClientState.FAILED


def _chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    return [data[a:b] for a, b in itertools.pairwise([0, *points, len(data)])]


GOOD = _frames_of_a_good_exchange()


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=6))
def test_random_bytes_to_a_server_ask_for_more_or_raise_a_protocol_error(data, cuts):
    """Random bytes, in any chunking: the server waits, proceeds, or raises ScramProtocolError."""
    _feed_server(_chunked(data, cuts))


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=6))
def test_random_bytes_to_a_client_ask_for_more_or_raise_a_scram_error(data, cuts):
    """Random bytes, in any chunking: the client waits or raises a ScramError, nothing else."""
    _feed_client(_chunked(data, cuts))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 3), st.integers(0, 200), st.binary(min_size=1, max_size=4), st.binary(max_size=200))
def test_mutated_valid_frames_never_raise_anything_else(which, position, patch, tail):
    """A good frame with bytes overwritten and junk appended: still only protocol/auth errors."""
    frame = bytearray(GOOD[which])
    at = position % len(frame)
    frame[at:at + len(patch)] = patch
    if which % 2 == 0:  # frames the server receives
        prefix = [GOOD[0]] if which == 2 else []
        s = server()
        try:
            for chunk in [*prefix, bytes(frame) + tail]:
                s.receive_data(chunk)
        except ScramProtocolError:
            pass
    else:
        prefix = [GOOD[1]] if which == 3 else []
        _feed_client([*prefix, bytes(frame) + tail])
