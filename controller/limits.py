"""Bounds on a controller request's fields, checked before anything is decided or replicated.

A string (UTF-8) or bytes field longer than ``MAX_STRING_BYTES``, a set or list of more than ``MAX_SET_SIZE``
members, or an int outside int64 is answered CONTROLLER_INVALID_REQUEST (2005) with no event. A
committed entry is applied on every replica and at every restart, so anything that could make an
apply fail must be refused at decide time (an ApplyBrokerId with a 1 MiB check code once wedged
every controller: its event-log record exceeded the frame limit at apply time). ``decide`` and the
consumer membership table run this check first.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any

from rocketray.wire.controller_api import Response
from rocketray.wire.controller_codes import ResponseCode as C

__all__ = ["MAX_SET_SIZE", "MAX_STRING_BYTES", "check_request_limits"]

MAX_STRING_BYTES = 4096      # any one string field of a request (names, addresses, check codes)
MAX_SET_SIZE = 1024          # members of a SyncStateSet, broker names in one query
_INT64_MIN, _INT64_MAX = -(2 ** 63), 2 ** 63 - 1


def _field_problem(name: str, value: Any) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, bytes):
        return None if len(value) <= MAX_STRING_BYTES else f"{name} is {len(value)} bytes, over {MAX_STRING_BYTES}"
    if is_dataclass(value) and not isinstance(value, type):  # a record inside a request (a SCRAM credential)
        for f in fields(value):
            problem = _field_problem(f"{name}.{f.name}", getattr(value, f.name))
            if problem is not None:
                return problem
        return None
    if isinstance(value, int):
        return None if _INT64_MIN <= value <= _INT64_MAX else f"{name} is outside int64"
    if isinstance(value, str):
        size = len(value.encode("utf-8", "surrogatepass"))
        return None if size <= MAX_STRING_BYTES else f"{name} is {size} bytes, over {MAX_STRING_BYTES}"
    if isinstance(value, (frozenset, set, tuple, list)):
        if len(value) > MAX_SET_SIZE:
            return f"{name} has {len(value)} members, over {MAX_SET_SIZE}"
        for member in value:
            problem = _field_problem(f"a member of {name}", member)
            if problem is not None:
                return problem
        return None
    return f"{name} has an unsupported type {type(value).__name__}"


def check_request_limits(request: object) -> Response | None:
    """CONTROLLER_INVALID_REQUEST if a field of the request is oversized or of a bad shape, else None."""
    if not is_dataclass(request) or isinstance(request, type):
        return None  # decide answers REQUEST_CODE_NOT_SUPPORTED
    for f in fields(request):
        problem = _field_problem(f.name, getattr(request, f.name))
        if problem is not None:
            return Response.error(C.CONTROLLER_INVALID_REQUEST, f"{type(request).__name__}: {problem}")
    return None
