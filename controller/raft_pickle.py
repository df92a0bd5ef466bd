"""The restricted unpickler for what pysyncobj pickles inside the Raft log (pure).

Theory of operation. The wire carries no pickle (``controller/raft_wire.py``), but pysyncobj
pickles (protocol 2) two things that travel inside its messages and are decoded later:

- the *command* of every log entry, ``(method id, args)``: our only replicated method is
  ``RaftHost.apply_batch(payload: bytes)``, so a command is ``(int, (bytes,))``. It is decoded at
  apply time, on every replica and at every restart (``RaftHost._SyncObj__doApplyCommand``);
- an *entry* ``(command, index, term)`` whose command is too large for one ``append_entries``: the
  leader pickles it and sends the pickle in chunks (``GuardedTransport`` reassembles it).

Both are decoded by ``restricted_loads``: pickle's own pure-Python unpickler (its memo is a dict;
the C unpickler grows its memo array to the largest index a ``LONG_BINPUT`` names, so a 10-byte
pickle can make it allocate gigabytes) whose ``find_class`` admits only the two globals a protocol-2
pickle of plain bytes needs, each replaced by a function that accepts exactly that use:
``_codecs.encode(text, "latin1")`` (how protocol 2 writes non-empty bytes) and ``bytes()`` (empty
bytes). Every other global, persistent ids and extension codes raise ``UnsafePickle``, so a pickle
whose ``__reduce__`` names ``open``, ``os.system`` or any other callable never calls it. The result
is then checked for the exact shape expected (``decode_command``, ``decode_entry``).
"""

from __future__ import annotations

import io
import pickle
from typing import Any

__all__ = ["UnsafePickle", "decode_command", "decode_entry", "restricted_loads"]


class UnsafePickle(pickle.UnpicklingError):
    """A pickle that names a global (or shape) outside what pysyncobj's log entries are made of."""


def _latin1_bytes(text: Any, encoding: Any) -> bytes:
    if type(text) is not str or encoding != "latin1":
        raise UnsafePickle("_codecs.encode is admitted only as protocol 2's latin-1 bytes")
    return text.encode("latin1")


def _empty_bytes(*args: Any) -> bytes:
    if args:
        raise UnsafePickle("bytes() is admitted only without arguments (protocol 2's empty bytes)")
    return b""


_ALLOWED = {
    ("_codecs", "encode"): _latin1_bytes,
    ("__builtin__", "bytes"): _empty_bytes,
    ("builtins", "bytes"): _empty_bytes,
}


class _Restricted(pickle._Unpickler):  # type: ignore[name-defined,misc]  # the pure-Python unpickler
    def find_class(self, module: str, name: str) -> Any:
        allowed = _ALLOWED.get((module, name))
        if allowed is None:
            raise UnsafePickle(f"global {module:.60}.{name:.60} refused")
        return allowed

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickle("persistent ids refused")


def restricted_loads(data: bytes) -> Any:
    """Unpickle ``data`` admitting plain values only; UnsafePickle (an UnpicklingError) on a
    refused global, other exceptions on a malformed pickle."""
    return _Restricted(io.BytesIO(data)).load()


def decode_command(command: bytes) -> tuple[int, tuple[Any, ...]]:
    """``(method id, args)`` of a regular command's pickle (without pysyncobj's type byte)."""
    try:
        value = restricted_loads(command)
    except UnsafePickle:
        raise
    except Exception as exc:
        raise UnsafePickle(f"malformed command: {type(exc).__name__}: {exc}") from None
    if not (type(value) is tuple and len(value) == 2 and type(value[0]) is int and type(value[1]) is tuple):
        raise UnsafePickle(f"a command is (method id, args), not {type(value).__name__}")
    return value[0], value[1]


def decode_entry(data: bytes) -> tuple[bytes, int, int]:
    """A log entry pysyncobj pickled for a chunked transmission: ``(command, index, term)``."""
    value = restricted_loads(data)
    if not (type(value) is tuple and len(value) == 3 and type(value[0]) is bytes
            and type(value[1]) is int and type(value[2]) is int):
        raise UnsafePickle("a transmitted entry is (command bytes, index, term)")
    return value
