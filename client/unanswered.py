"""A call to the cluster that never answered: what a transport returns instead of an answer."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Unanswered"]


@dataclass(frozen=True, slots=True)
class Unanswered:
    """A call that never answered (timeout, actor death, master moved): it may or may not have run.
    ``unsent``: nothing left the client (no master known, no connection could be made), so it
    certainly did not run."""

    error: str
    master_moved: bool = False
    unsent: bool = False
