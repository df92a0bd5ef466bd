"""The outcome of one client operation, one spelling for every workload, history and checker.

``OK``: acknowledged (a send stored and replicated as the ack policy requires, a read answered, a
commit applied). ``FAILED``: certainly not applied (refused, or never sent). ``UNKNOWN``: it may or
may not have been applied (the answer was lost, or the client gave up waiting), so a checker must
accept both and a retry may duplicate it. Histories store the value (``"ok"``, ``"failed"``,
``"unknown"``); being a ``str`` enum, an ``Outcome`` compares equal to its value.
"""

from __future__ import annotations

import enum

__all__ = ["Outcome"]


class Outcome(str, enum.Enum):
    OK = "ok"
    FAILED = "failed"
    UNKNOWN = "unknown"
