"""Field validators for the run-directory readers: one decoded JSON object in, one typed value out.

Each validator reads one key of a decoded line and raises :class:`FieldError` saying which key and
why; the readers (``rocketray.verify.history``) turn that into a ``RunDirError`` naming the file
and the line. Shared by every record kind of a chaos run directory (``history``, ``group_history``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["FieldError", "Number", "Ident", "get", "get_int", "get_number", "get_str", "get_ident"]

Number = int | float
Ident = int | str


class FieldError(ValueError):
    """Raised by the field validators; the readers turn it into a RunDirError with a location."""


# -- validators ------------------------------------------------------------------------------

def get(obj: dict[str, Any], key: str, nullable_default: bool = False) -> Any:
    """``obj[key]``; None when absent and ``nullable_default``; else FieldError."""
    if key in obj:
        return obj[key]
    if nullable_default:
        return None
    raise FieldError(f"missing required key {key!r}")


def get_int(obj: dict[str, Any], key: str, *, nullable: bool = False, minimum: int | None = None,
            absent_is_null: bool = False) -> int | None:
    value = get(obj, key, nullable_default=nullable and absent_is_null)
    if value is None:
        if nullable:
            return None
        raise FieldError(f"key {key!r} must not be null")
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(f"key {key!r} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise FieldError(f"key {key!r} must be >= {minimum}, got {value}")
    return value


def get_number(obj: dict[str, Any], key: str) -> Number:
    value = get(obj, key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FieldError(f"key {key!r} must be a number, got {value!r}")
    return value


def get_str(obj: dict[str, Any], key: str, *, nullable: bool = False, choices: tuple[str, ...] | None = None,
            absent_is_null: bool = False) -> str | None:
    value = get(obj, key, nullable_default=nullable and absent_is_null)
    if value is None:
        if nullable:
            return None
        raise FieldError(f"key {key!r} must not be null")
    if not isinstance(value, str):
        raise FieldError(f"key {key!r} must be a string, got {value!r}")
    if choices is not None and value not in choices:
        raise FieldError(f"key {key!r} must be one of {', '.join(choices)}; got {value!r}")
    return value


def get_ident(obj: dict[str, Any], key: str, *, nullable: bool = False) -> Ident | None:
    value = get(obj, key)
    if value is None:
        if nullable:
            return None
        raise FieldError(f"key {key!r} must not be null")
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise FieldError(f"key {key!r} must be a string or an integer, got {value!r}")
    return value
