"""SCRAM-SHA-256 (RFC 5802, RFC 7677) for users on the client port: key derivation, the stored
credential, and the client and server sides of the exchange as sans-IO state machines.

Theory of operation. A user's secret never reaches a server. The admin tool derives, from the secret,
a random salt and an iteration count, ``SaltedPassword = PBKDF2-HMAC-SHA256(secret, salt, i)``, then
``ClientKey = HMAC(SaltedPassword, "Client Key")``, ``StoredKey = H(ClientKey)`` and
``ServerKey = HMAC(SaltedPassword, "Server Key")``, and the controller keeps only
``ScramCredential(salt, iterations, stored_key, server_key)``. To log in, a client proves it knows
ClientKey without sending it: ``ClientProof = ClientKey XOR HMAC(StoredKey, AuthMessage)``, where
``AuthMessage`` binds every byte of the exchange (both nonces, so a proof is worthless against any
other server nonce) and the optional channel binding. The server recovers ClientKey from the proof
and checks ``H(ClientKey) == StoredKey``; then it proves itself with
``ServerSignature = HMAC(ServerKey, AuthMessage)``, which only a holder of ServerKey can compute.
The derivations are RFC 5802's exactly (``rocketray.scram_keys``, re-exported here; RFC 7677's test
vector checks them); the messages are rocketray's own binary frames, every field bounded:

    frame         type u8 | body length u16 (big-endian) | body
    CLIENT_FIRST  1  version u8 (1) | name length u8 | user name (UTF-8, 1..64 bytes) | client nonce (32)
    SERVER_FIRST  2  nonce (64: client nonce | server nonce) | iterations u32 | salt length u8 | salt (16..64)
    CLIENT_FINAL  3  nonce (64) | client proof (32)
    SERVER_FINAL  4  server signature (32)
    SERVER_ERROR  5  reason u8 (1 authentication failed, 2 unsupported version)

    AuthMessage = "rocketray-scram-sha-256/1" | CLIENT_FIRST frame | SERVER_FIRST frame
                  | CLIENT_FINAL frame without its proof | channel binding length u16 | channel binding

A server asked about an unknown user answers exactly as for a known one (a salt and iteration count
derived from a server-side key and the name, stable per name) and fails at the proof with the same
error as a wrong secret: the exchange does not tell who exists. Proofs are compared in constant time.

The machines follow h11: feed bytes with ``receive_data``, send what ``data_to_send`` returns, read
``state``. Malformed or unexpected bytes raise ``ScramProtocolError`` (close the connection); a
failed authentication is ``ServerState.FAILED`` on the server (its error frame is queued, send it and
close) and ``ScramAuthError`` on the client. Neither side ever holds more than
``MAX_PRE_AUTH_CLIENT_BYTES`` / ``MAX_PRE_AUTH_SERVER_BYTES`` of its peer's bytes before the end of
the exchange; bytes after it are ``trailing_data`` for the next layer. Nonces, salts and the
server-side key are injected (no randomness here); the secret appears in no repr.
"""

from __future__ import annotations

import enum
import hmac
import struct
from typing import Callable

from rocketray.scram_keys import (DEFAULT_ITERATIONS, DEFAULT_SALT_BYTES, KEY_SIZE, MAX_ITERATIONS, MAX_SALT_BYTES,
                                  MIN_ITERATIONS, MIN_SALT_BYTES, ScramCredential, ScramKeys, client_proof,
                                  derive_keys, hmac_sha256, salted_password, secret_bytes, server_signature,
                                  verify_client_proof)

__all__ = [
    "AUTH_MESSAGE_DOMAIN", "ClientState", "DEFAULT_ITERATIONS", "DEFAULT_SALT_BYTES", "ErrorReason", "FrameType",
    "KEY_SIZE", "MAX_ITERATIONS", "MAX_PRE_AUTH_CLIENT_BYTES", "MAX_PRE_AUTH_SERVER_BYTES", "MAX_SALT_BYTES",
    "MAX_USER_NAME_BYTES", "MIN_ITERATIONS", "MIN_SALT_BYTES", "NONCE_SIZE", "PROTOCOL_VERSION", "ScramAuthError",
    "ScramClient", "ScramCredential", "ScramError", "ScramKeys", "ScramProtocolError", "ScramServer", "ServerState",
    "client_proof", "derive_keys", "salted_password", "server_signature", "verify_client_proof",
]

NONCE_SIZE = 32               # each side's nonce; the combined nonce is twice that
MAX_USER_NAME_BYTES = 64
MAX_CHANNEL_BINDING_BYTES = 1024
PROTOCOL_VERSION = 1
AUTH_MESSAGE_DOMAIN = b"rocketray-scram-sha-256/1"

_HEADER = struct.Struct(">BH")
_U32 = struct.Struct(">I")


class FrameType(enum.IntEnum):
    CLIENT_FIRST = 1
    SERVER_FIRST = 2
    CLIENT_FINAL = 3
    SERVER_FINAL = 4
    SERVER_ERROR = 5


class ErrorReason(enum.IntEnum):
    """Why a server refused (the body of SERVER_ERROR). An unknown user is AUTHENTICATION_FAILED too."""

    AUTHENTICATION_FAILED = 1
    UNSUPPORTED_VERSION = 2


#: Inclusive body-length bounds of each frame type.
_BODY_BOUNDS = {
    FrameType.CLIENT_FIRST: (2 + 1 + NONCE_SIZE, 2 + MAX_USER_NAME_BYTES + NONCE_SIZE),
    FrameType.SERVER_FIRST: (2 * NONCE_SIZE + 4 + 1 + MIN_SALT_BYTES, 2 * NONCE_SIZE + 4 + 1 + MAX_SALT_BYTES),
    FrameType.CLIENT_FINAL: (2 * NONCE_SIZE + KEY_SIZE, 2 * NONCE_SIZE + KEY_SIZE),
    FrameType.SERVER_FINAL: (KEY_SIZE, KEY_SIZE),
    FrameType.SERVER_ERROR: (1, 1),
}
#: The most a client sends before the exchange ends (its two frames at their largest): what a server
#: may hold of an unauthenticated peer's bytes.
MAX_PRE_AUTH_CLIENT_BYTES = sum(_HEADER.size + _BODY_BOUNDS[t][1] for t in (FrameType.CLIENT_FIRST,
                                                                           FrameType.CLIENT_FINAL))
#: The most a server sends in an exchange (SERVER_FIRST and SERVER_FINAL at their largest).
MAX_PRE_AUTH_SERVER_BYTES = sum(_HEADER.size + _BODY_BOUNDS[t][1] for t in (FrameType.SERVER_FIRST,
                                                                           FrameType.SERVER_FINAL))


class ScramError(Exception):
    """Base of the SCRAM errors; never retriable with the same credential."""

    retriable = False


class ScramProtocolError(ScramError, ValueError):
    """The peer's bytes are not a valid exchange (malformed frame, wrong order, bounds, nonce)."""


class ScramAuthError(ScramError):
    """Authentication failed: the server refused the credential, or the server failed to prove it
    holds the user's ServerKey."""


# -- frames ---------------------------------------------------------------------------------------

def _frame(frame_type: FrameType, body: bytes) -> bytes:
    low, high = _BODY_BOUNDS[frame_type]
    assert low <= len(body) <= high, f"{frame_type.name} body of {len(body)} bytes"
    return _HEADER.pack(frame_type, len(body)) + body


class _Reader:
    """Takes whole frames off a byte stream, refusing unexpected types and out-of-bound lengths
    from the header alone (before their bodies arrive)."""

    def __init__(self, limit: int) -> None:
        self.buffer = bytearray()
        self.received = 0
        self.limit = limit

    def feed(self, data: bytes) -> None:
        self.received += len(data)
        if self.received > self.limit:
            raise ScramProtocolError(f"peer sent over {self.limit} bytes during authentication")
        self.buffer += data

    def take(self, expected: tuple[FrameType, ...]) -> tuple[FrameType, bytes, bytes] | None:
        """``(type, body, whole frame)`` of the next frame, or None until it is all here."""
        if len(self.buffer) < _HEADER.size:
            if self.buffer and self.buffer[0] not in expected:
                raise ScramProtocolError(f"unexpected frame type {self.buffer[0]}")
            return None
        type_id, length = _HEADER.unpack_from(self.buffer)
        if type_id not in expected:
            raise ScramProtocolError(f"unexpected frame type {type_id}, expected "
                                     f"{'/'.join(t.name for t in expected)}")
        frame_type = FrameType(type_id)
        low, high = _BODY_BOUNDS[frame_type]
        if not low <= length <= high:
            raise ScramProtocolError(f"{frame_type.name} body of {length} bytes is outside {low}..{high}")
        end = _HEADER.size + length
        if len(self.buffer) < end:
            return None
        frame = bytes(self.buffer[:end])
        del self.buffer[:end]
        return frame_type, frame[_HEADER.size:], frame


def _auth_message(client_first: bytes, server_first: bytes, nonce: bytes, channel_binding: bytes) -> bytes:
    final_without_proof = _HEADER.pack(FrameType.CLIENT_FINAL, 2 * NONCE_SIZE + KEY_SIZE) + nonce
    return (AUTH_MESSAGE_DOMAIN + client_first + server_first + final_without_proof
            + struct.pack(">H", len(channel_binding)) + channel_binding)


def _check_channel_binding(channel_binding: bytes) -> bytes:
    if len(channel_binding) > MAX_CHANNEL_BINDING_BYTES:
        raise ValueError(f"channel binding over {MAX_CHANNEL_BINDING_BYTES} bytes")
    return bytes(channel_binding)


def _check_nonce(nonce: bytes) -> bytes:
    if len(nonce) != NONCE_SIZE:
        raise ValueError(f"a nonce is {NONCE_SIZE} bytes, got {len(nonce)}")
    return bytes(nonce)


class _Exchange:
    """What both sides share: output queued for the caller, bytes after the end of the exchange kept
    as ``trailing_data``, and a failed exchange that stays failed (each side sets its own states)."""

    _done: enum.Enum
    _failed: enum.Enum
    state: enum.Enum
    trailing_data: bytes
    _out: bytearray

    def data_to_send(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out

    def receive_data(self, data: bytes) -> None:
        """Feed bytes from the peer; a ``ScramError`` leaves the exchange failed (close the connection)."""
        if self.state is self._done:
            self.trailing_data += bytes(data)
            return
        if self.state is self._failed:
            raise ScramProtocolError("the exchange failed: close the connection")
        try:
            self._advance(bytes(data))
        except ScramError:
            self.state = self._failed
            raise

    def _advance(self, data: bytes) -> None:
        raise NotImplementedError


# -- server ---------------------------------------------------------------------------------------

class ServerState(enum.Enum):
    WAIT_CLIENT_FIRST = "wait-client-first"
    WAIT_CLIENT_FINAL = "wait-client-final"
    DONE = "done"          # the client proved itself; SERVER_FINAL is queued
    FAILED = "failed"      # refused (SERVER_ERROR queued: send it, then close) or a protocol error raised


Lookup = Callable[[str], "ScramCredential | None"]


def _fake_credential(fake_key: bytes, name: bytes, iterations: int) -> ScramCredential:
    """A stable credential for a name nobody holds: its salt looks like any user's."""
    salt = hmac_sha256(fake_key, b"salt|" + name)[:DEFAULT_SALT_BYTES]
    return ScramCredential(salt, iterations, hmac_sha256(fake_key, b"stored|" + name), hmac_sha256(fake_key, b"server|" + name))


class ScramServer(_Exchange):
    """The broker's side of one exchange. ``lookup(name)`` returns the user's stored credential or
    None; ``fake_key`` (a server-side secret, at least 32 bytes, the same for the server's lifetime)
    makes the answers for unknown names. When ``state`` is DONE, ``user`` is the authenticated name.
    ``receive_data`` raises ``ScramProtocolError`` on anything malformed."""

    _done, _failed = ServerState.DONE, ServerState.FAILED

    def __init__(self, lookup: Lookup, server_nonce: bytes, fake_key: bytes, *, channel_binding: bytes = b"",
                 fake_iterations: int = DEFAULT_ITERATIONS) -> None:
        if len(fake_key) < KEY_SIZE:
            raise ValueError(f"the server-side key for unknown users is at least {KEY_SIZE} bytes")
        self._lookup = lookup
        self._server_nonce = _check_nonce(server_nonce)
        self._fake_key = bytes(fake_key)
        self._fake_iterations = fake_iterations
        self._channel_binding = _check_channel_binding(channel_binding)
        self._reader = _Reader(MAX_PRE_AUTH_CLIENT_BYTES)
        self._out = bytearray()
        self._claimed: str | None = None
        self._credential: ScramCredential | None = None
        self._known = False
        self._client_first = b""
        self._server_first = b""
        self.state = ServerState.WAIT_CLIENT_FIRST
        self.failure: ErrorReason | None = None
        self.trailing_data = b""

    def __repr__(self) -> str:
        return f"ScramServer(state={self.state.value}, user={self._claimed!r})"

    @property
    def user(self) -> str | None:
        """The authenticated user name, once DONE (None before and after a failure)."""
        return self._claimed if self.state is ServerState.DONE else None

    @property
    def claimed_user(self) -> str | None:
        """The name the client claimed (for logs of a refusal), known or not."""
        return self._claimed

    def _advance(self, data: bytes) -> None:
        self._reader.feed(data)
        if self.state is ServerState.WAIT_CLIENT_FIRST:
            taken = self._reader.take((FrameType.CLIENT_FIRST,))
            if taken is None:
                return
            self._on_client_first(taken[1], taken[2])
        if self.state is ServerState.WAIT_CLIENT_FINAL:
            taken = self._reader.take((FrameType.CLIENT_FINAL,))
            if taken is None:
                return
            self._on_client_final(taken[1])
        self.trailing_data = bytes(self._reader.buffer)
        self._reader.buffer.clear()

    def _fail(self, reason: ErrorReason) -> None:
        self.state = ServerState.FAILED
        self.failure = reason
        self._out += _frame(FrameType.SERVER_ERROR, bytes([reason]))

    def _on_client_first(self, body: bytes, frame: bytes) -> None:
        version, name_len = body[0], body[1]
        if len(body) != 2 + name_len + NONCE_SIZE or not 1 <= name_len <= MAX_USER_NAME_BYTES:
            raise ScramProtocolError(f"CLIENT_FIRST name length {name_len} does not fit its body of {len(body)} bytes")
        if version != PROTOCOL_VERSION:
            self._fail(ErrorReason.UNSUPPORTED_VERSION)
            return
        raw_name = body[2:2 + name_len]
        try:
            self._claimed = raw_name.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ScramProtocolError("user name is not UTF-8") from exc
        credential = self._lookup(self._claimed)
        self._known = credential is not None
        self._credential = credential or _fake_credential(self._fake_key, raw_name, self._fake_iterations)
        nonce = body[2 + name_len:] + self._server_nonce
        salt = self._credential.salt
        self._client_first = frame
        self._server_first = _frame(FrameType.SERVER_FIRST,
                                     nonce + _U32.pack(self._credential.iterations) + bytes([len(salt)]) + salt)
        self._out += self._server_first
        self.state = ServerState.WAIT_CLIENT_FINAL

    def _on_client_final(self, body: bytes) -> None:
        assert self._credential is not None
        nonce, proof = body[:2 * NONCE_SIZE], body[2 * NONCE_SIZE:]
        expected_nonce = self._client_first[-NONCE_SIZE:] + self._server_nonce
        if not hmac.compare_digest(nonce, expected_nonce):
            raise ScramProtocolError("CLIENT_FINAL nonce is not this exchange's")
        auth_message = _auth_message(self._client_first, self._server_first, nonce, self._channel_binding)
        proved = verify_client_proof(self._credential, auth_message, proof)
        if not (proved and self._known):
            self._fail(ErrorReason.AUTHENTICATION_FAILED)
            return
        self._out += _frame(FrameType.SERVER_FINAL, server_signature(self._credential.server_key, auth_message))
        self.state = ServerState.DONE


# -- client ---------------------------------------------------------------------------------------

class ClientState(enum.Enum):
    WAIT_SERVER_FIRST = "wait-server-first"
    WAIT_SERVER_FINAL = "wait-server-final"
    DONE = "done"          # both sides proved themselves
    FAILED = "failed"      # an error was raised; close the connection


Derive = Callable[[bytes, bytes, int], ScramKeys]


class ScramClient(_Exchange):
    """The application's side of one exchange; CLIENT_FIRST is queued at construction.

    ``derive(secret, salt, iterations)`` computes the keys (``derive_keys``; pass a cached one to
    pay PBKDF2 once per credential). ``min_iterations`` refuses a server that asks for fewer
    rounds than expected (a downgrade); more than ``MAX_ITERATIONS`` is always refused.
    ``receive_data`` raises ``ScramProtocolError`` on malformed bytes and ``ScramAuthError`` when
    the server refuses or fails to prove itself."""

    _done, _failed = ClientState.DONE, ClientState.FAILED

    def __init__(self, user: str, secret: bytes | str, client_nonce: bytes, *, channel_binding: bytes = b"",
                 derive: Derive = derive_keys, min_iterations: int = MIN_ITERATIONS) -> None:
        name = user.encode("utf-8")
        if not 1 <= len(name) <= MAX_USER_NAME_BYTES:
            raise ValueError(f"a user name is 1..{MAX_USER_NAME_BYTES} bytes of UTF-8")
        self.user = user
        self._secret = secret_bytes(secret)
        if not self._secret:
            raise ValueError("the secret is empty")
        self._nonce = _check_nonce(client_nonce)
        self._channel_binding = _check_channel_binding(channel_binding)
        self._derive = derive
        self._min_iterations = max(MIN_ITERATIONS, min_iterations)
        self._reader = _Reader(MAX_PRE_AUTH_SERVER_BYTES)
        self._client_first = _frame(FrameType.CLIENT_FIRST, bytes([PROTOCOL_VERSION, len(name)]) + name + self._nonce)
        self._out = bytearray(self._client_first)
        self._expected_signature = b""
        self.state = ClientState.WAIT_SERVER_FIRST
        self.trailing_data = b""

    def __repr__(self) -> str:
        return f"ScramClient(user={self.user!r}, state={self.state.value})"

    def _advance(self, data: bytes) -> None:
        self._reader.feed(data)
        if self.state is ClientState.WAIT_SERVER_FIRST:
            taken = self._reader.take((FrameType.SERVER_FIRST, FrameType.SERVER_ERROR))
            if taken is None:
                return
            self._on_server_first(*taken)
        if self.state is ClientState.WAIT_SERVER_FINAL:
            taken = self._reader.take((FrameType.SERVER_FINAL, FrameType.SERVER_ERROR))
            if taken is None:
                return
            self._on_server_final(taken[0], taken[1])
        self.trailing_data = bytes(self._reader.buffer)
        self._reader.buffer.clear()

    @staticmethod
    def _refused(body: bytes) -> ScramAuthError:
        try:
            reason = ErrorReason(body[0]).name.lower().replace("_", " ")
        except ValueError:
            reason = f"reason {body[0]}"
        return ScramAuthError(f"the server refused the credential ({reason})")

    def _on_server_first(self, frame_type: FrameType, body: bytes, frame: bytes) -> None:
        if frame_type is FrameType.SERVER_ERROR:
            raise self._refused(body)
        nonce = body[:2 * NONCE_SIZE]
        (iterations,) = _U32.unpack_from(body, 2 * NONCE_SIZE)
        salt_len = body[2 * NONCE_SIZE + 4]
        salt = body[2 * NONCE_SIZE + 5:]
        if len(salt) != salt_len:
            raise ScramProtocolError(f"SERVER_FIRST salt length {salt_len} does not fit its body")
        if not hmac.compare_digest(nonce[:NONCE_SIZE], self._nonce):
            raise ScramProtocolError("SERVER_FIRST nonce does not start with this client's nonce")
        if not self._min_iterations <= iterations <= MAX_ITERATIONS:
            raise ScramProtocolError(f"server asks for {iterations} iterations, outside "
                                     f"{self._min_iterations}..{MAX_ITERATIONS}")
        keys = self._derive(self._secret, salt, iterations)
        self._secret = b""
        auth_message = _auth_message(self._client_first, frame, nonce, self._channel_binding)
        self._out += _frame(FrameType.CLIENT_FINAL, nonce + client_proof(keys, auth_message))
        self._expected_signature = server_signature(keys.server_key, auth_message)
        self.state = ClientState.WAIT_SERVER_FINAL

    def _on_server_final(self, frame_type: FrameType, body: bytes) -> None:
        if frame_type is FrameType.SERVER_ERROR:
            raise self._refused(body)
        if not hmac.compare_digest(body, self._expected_signature):
            raise ScramAuthError("the server's signature is wrong: it does not hold this user's ServerKey")
        self.state = ClientState.DONE
