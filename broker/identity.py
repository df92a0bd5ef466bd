"""Broker identity files (reference 9.1).

Theory of operation
-------------------
A broker keeps its controller-assigned id across restarts in ``<storeRoot>/brokerIdentity``
(``<cluster>#<brokerName>#<brokerId>``).  While it is applying for an id it first records the
attempt in ``<storeRoot>/brokerIdentity-temp`` (``<cluster>#<brokerName>#<brokerId>#<checkCode>``)
so that a crash in the middle can repeat the same ApplyBrokerId idempotently.  ``load`` returns
``None`` for a missing or malformed file ("not loaded"); ``save`` writes durably (temp file, fsync,
rename, directory fsync) so a crash leaves the old or the new identity, never a torn one;
``clear`` deletes the file durably.  ``matches`` is the validation the register state machine
does on start: the names must equal the configured ones (quirk 18.15 is the caller's decision).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:  # typing.Self is 3.11+; annotations are never evaluated at run time
    from typing_extensions import Self

from rocketray.fs import OS_DISK, Disk, ensure_dir, read_file
from rocketray.durable import write_durably

__all__ = ["BrokerIdentity", "TempBrokerIdentity", "IDENTITY_FILE", "TEMP_IDENTITY_FILE"]

IDENTITY_FILE = "brokerIdentity"
TEMP_IDENTITY_FILE = "brokerIdentity-temp"


def _read_fields(path: Path, count: int, disk: Disk) -> list[str] | None:
    data = read_file(disk, path)
    try:
        text = data.decode("utf-8").strip() if data is not None else None
    except UnicodeDecodeError:
        return None
    if text is None:
        return None
    fields = text.split("#")
    if len(fields) != count or not fields[0] or not fields[1]:
        return None
    return fields


def _clear(path: Path, disk: Disk) -> None:
    try:
        disk.unlink(path)
    except FileNotFoundError:
        return
    disk.fsync_dir(path.parent)


def _check_names(cluster_name: str, broker_name: str) -> None:
    for value in (cluster_name, broker_name):
        if not value or "#" in value or "\n" in value:
            raise ValueError(f"invalid name {value!r}: non-empty, without '#' or newlines")


class _IdentityFile:
    """What both identity files share: a one-line ``#``-separated file in the store root, loaded
    (``None`` if missing or malformed), written durably, cleared, and matched against the config."""

    __slots__ = ()
    FILE_NAME: ClassVar[str]
    FIELD_COUNT: ClassVar[int]
    cluster_name: str
    broker_name: str

    @classmethod
    def path(cls, root_dir: str | os.PathLike[str]) -> Path:
        return Path(root_dir) / cls.FILE_NAME

    def encode(self) -> str:
        raise NotImplementedError

    @classmethod
    def _parse(cls, fields: list[str]) -> Self:
        raise NotImplementedError

    @classmethod
    def load(cls, root_dir: str | os.PathLike[str], disk: Disk = OS_DISK) -> Self | None:
        """The file stored under ``root_dir``; ``None`` if missing or malformed (not loaded)."""
        fields = _read_fields(cls.path(root_dir), cls.FIELD_COUNT, disk)
        if fields is None:
            return None
        try:
            return cls._parse(fields)
        except ValueError:
            return None

    def save(self, root_dir: str | os.PathLike[str], disk: Disk = OS_DISK) -> None:
        """Write durably (temp, fsync, rename, directory fsync)."""
        ensure_dir(disk, root_dir)
        write_durably(self.path(root_dir), self.encode().encode("utf-8"), disk=disk)

    @classmethod
    def clear(cls, root_dir: str | os.PathLike[str], disk: Disk = OS_DISK) -> None:
        """Delete the file (durably); a missing file is fine."""
        _clear(cls.path(root_dir), disk)

    def matches(self, cluster_name: str, broker_name: str) -> bool:
        """Whether this file belongs to the configured cluster and broker name."""
        return self.cluster_name == cluster_name and self.broker_name == broker_name


@dataclass(frozen=True, slots=True)
class BrokerIdentity(_IdentityFile):
    """``brokerIdentity``: the persistent id this broker got from the controller."""

    FILE_NAME: ClassVar[str] = IDENTITY_FILE
    FIELD_COUNT: ClassVar[int] = 3
    cluster_name: str
    broker_name: str
    broker_id: int

    def __post_init__(self) -> None:
        _check_names(self.cluster_name, self.broker_name)

    def encode(self) -> str:
        return f"{self.cluster_name}#{self.broker_name}#{self.broker_id}"

    @classmethod
    def _parse(cls, fields: list[str]) -> BrokerIdentity:
        return cls(fields[0], fields[1], int(fields[2]))


@dataclass(frozen=True, slots=True)
class TempBrokerIdentity(_IdentityFile):
    """``brokerIdentity-temp``: an id being applied for, with its register check code."""

    FILE_NAME: ClassVar[str] = TEMP_IDENTITY_FILE
    FIELD_COUNT: ClassVar[int] = 4
    cluster_name: str
    broker_name: str
    broker_id: int
    register_check_code: str

    def __post_init__(self) -> None:
        _check_names(self.cluster_name, self.broker_name)
        if not self.register_check_code or "#" in self.register_check_code or "\n" in self.register_check_code:
            raise ValueError(f"invalid check code {self.register_check_code!r}")

    def encode(self) -> str:
        return f"{self.cluster_name}#{self.broker_name}#{self.broker_id}#{self.register_check_code}"

    @classmethod
    def _parse(cls, fields: list[str]) -> TempBrokerIdentity:
        return cls(fields[0], fields[1], int(fields[2]), fields[3])

    def to_identity(self) -> BrokerIdentity:
        """The identity to persist once ApplyBrokerId succeeded."""
        return BrokerIdentity(self.cluster_name, self.broker_name, self.broker_id)
