"""How a package's config dataclass declares one configuration key.

Each package's frozen config dataclass (``rocketray.controller.config.ControllerConfig``,
``rocketray.broker.replicas_model.ReplicasManagerConfig``, ``rocketray.broker.config.StoreConfig``,
``rocketray.ha.config.HAConfig``) is the schema of its section of ``rocketray.config``: every field
declared with ``key(default, meaning, fast=...)`` is a user-settable ``section.key``, with its
meaning (shown in the README's generated table) and, optionally, its value in the ``fast`` profile.
A field declared with ``internal(default, why)`` is not a configuration key (a test hook).

Standard library only, so that the pure cores can import it.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
INT_MAX = 2**31 - 1


def key(default: Any, meaning: str, fast: Any = None) -> Any:
    """A configuration key: its default, its meaning and (optionally) its ``fast``-profile value."""
    metadata: dict[str, Any] = {"meaning": meaning}
    if fast is not None:
        metadata["fast"] = fast
    return field(default=default, metadata=metadata)


def internal(default: Any, why: str) -> Any:
    """A field of the dataclass that is not a configuration key (not settable from files or --set)."""
    return field(default=default, metadata={"internal": why})


def niceness_key(actor: str) -> Any:
    """``process_niceness`` of an actor's section (``actors/priority.py`` applies it at start)."""
    return key(0, f"niceness the {actor} actor's process asks for at start (Ray starts workers at 15; "
                  "none keeps Ray's)")


def niceness_problem(value: int | None) -> str | None:
    """Why ``value`` is not a ``process_niceness`` (Linux takes -20..19; None keeps Ray's), or None."""
    if value is not None and not -20 <= value <= 19:
        return "process_niceness must be within -20..19 (or none)"
    return None
