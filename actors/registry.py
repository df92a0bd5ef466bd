"""A tiny named actor holding a cluster's spec, so any driver can ``connect`` by name."""

from __future__ import annotations

import os


class Registry:
    def __init__(self, spec: dict):
        self._spec = spec

    def spec(self) -> dict:
        return self._spec

    def pid(self) -> int:
        return os.getpid()
