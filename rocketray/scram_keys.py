"""SCRAM-SHA-256's key derivations and the stored credential (RFC 5802 section 3, RFC 7677), pure.

From a user's secret, a salt and an iteration count: ``SaltedPassword = PBKDF2-HMAC-SHA256(secret,
salt, i)``, ``ClientKey = HMAC(SaltedPassword, "Client Key")``, ``StoredKey = H(ClientKey)``,
``ServerKey = HMAC(SaltedPassword, "Server Key")``. A server stores only ``ScramCredential(salt,
iterations, stored_key, server_key)``: it checks a ``ClientProof = ClientKey XOR HMAC(StoredKey,
AuthMessage)`` by recovering ClientKey and hashing it (``verify_client_proof``, constant time) and
proves itself with ``ServerSignature = HMAC(ServerKey, AuthMessage)``; neither the secret nor the
SaltedPassword can be computed back from the record. The exchange that carries these is
``rocketray.scram``. No repr here shows a key.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

__all__ = ["DEFAULT_ITERATIONS", "DEFAULT_SALT_BYTES", "KEY_SIZE", "MAX_ITERATIONS", "MAX_SALT_BYTES",
           "MIN_ITERATIONS", "MIN_SALT_BYTES", "ScramCredential", "ScramKeys", "client_proof", "derive_keys",
           "hmac_sha256", "salted_password", "secret_bytes", "server_signature", "verify_client_proof"]

KEY_SIZE = 32                 # SHA-256 output: keys, proofs, signatures
MIN_SALT_BYTES, MAX_SALT_BYTES, DEFAULT_SALT_BYTES = 16, 64, 16
#: RFC 7677 asks for at least 4096. The maximum bounds what a server can make a client compute
#: (1,000,000 rounds take about 0.2 s on a 2-core VM); the default costs about 20 ms.
MIN_ITERATIONS, MAX_ITERATIONS, DEFAULT_ITERATIONS = 4096, 1_000_000, 100_000


def hmac_sha256(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def secret_bytes(secret: bytes | str) -> bytes:
    return secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)


def salted_password(secret: bytes | str, salt: bytes, iterations: int) -> bytes:
    """``Hi(secret, salt, i)``: PBKDF2-HMAC-SHA256 with one 32-byte block."""
    assert iterations >= 1, "PBKDF2 needs at least one iteration"
    return hashlib.pbkdf2_hmac("sha256", secret_bytes(secret), salt, iterations)


@dataclass(frozen=True, slots=True, repr=False)
class ScramKeys:
    """What a client derives from its secret for one (salt, iterations): enough to log in."""

    client_key: bytes
    stored_key: bytes
    server_key: bytes

    def __repr__(self) -> str:
        return "ScramKeys(<hidden>)"


def derive_keys(secret: bytes | str, salt: bytes, iterations: int) -> ScramKeys:
    """ClientKey, StoredKey = H(ClientKey) and ServerKey from the secret (RFC 5802 section 3)."""
    salted = salted_password(secret, salt, iterations)
    client_key = hmac_sha256(salted, b"Client Key")
    return ScramKeys(client_key, hashlib.sha256(client_key).digest(), hmac_sha256(salted, b"Server Key"))


def client_proof(keys: ScramKeys, auth_message: bytes) -> bytes:
    """``ClientKey XOR HMAC(StoredKey, AuthMessage)``."""
    return _xor(keys.client_key, hmac_sha256(keys.stored_key, auth_message))


def server_signature(server_key: bytes, auth_message: bytes) -> bytes:
    """``HMAC(ServerKey, AuthMessage)``: the server's proof that it holds ServerKey."""
    return hmac_sha256(server_key, auth_message)


@dataclass(frozen=True, slots=True, repr=False)
class ScramCredential:
    """What the controller stores for a user: never the secret nor the SaltedPassword. Enough to
    check a client's proof and to sign as the server; not enough to log in as the user."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def __repr__(self) -> str:
        return f"ScramCredential(iterations={self.iterations}, salt=<{len(self.salt)} bytes>, keys=<hidden>)"

    @classmethod
    def from_secret(cls, secret: bytes | str, salt: bytes, iterations: int = DEFAULT_ITERATIONS) -> ScramCredential:
        """The record of ``secret`` under ``salt`` (the caller draws it, e.g. ``os.urandom(16)``)."""
        keys = derive_keys(secret, salt, iterations)
        credential = cls(bytes(salt), iterations, keys.stored_key, keys.server_key)
        problem = credential.problem()
        if problem is not None:
            raise ValueError(problem)
        return credential

    def problem(self) -> str | None:
        """Why this is not a valid stored credential, or None."""
        if type(self.salt) is not bytes or not MIN_SALT_BYTES <= len(self.salt) <= MAX_SALT_BYTES:
            return f"salt must be {MIN_SALT_BYTES}..{MAX_SALT_BYTES} bytes"
        if type(self.iterations) is not int or not MIN_ITERATIONS <= self.iterations <= MAX_ITERATIONS:
            return f"iterations must be an int in {MIN_ITERATIONS}..{MAX_ITERATIONS}"
        for name in ("stored_key", "server_key"):
            value = getattr(self, name)
            if type(value) is not bytes or len(value) != KEY_SIZE:
                return f"{name} must be {KEY_SIZE} bytes"
        return None


def verify_client_proof(credential: ScramCredential, auth_message: bytes, proof: bytes) -> bool:
    """True iff ``proof`` was made with the ClientKey whose hash is ``credential.stored_key``
    (constant-time comparison)."""
    if len(proof) != KEY_SIZE:
        return False
    client_key = _xor(proof, hmac_sha256(credential.stored_key, auth_message))
    return hmac.compare_digest(hashlib.sha256(client_key).digest(), credential.stored_key)
