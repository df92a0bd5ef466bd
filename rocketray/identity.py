"""Who a cluster member is: ``rocketray://<cluster>/controller/<index>`` or
``rocketray://<cluster>/broker/<group>/<replica>`` (pure, standard library only).

The identity travels in a member certificate's URI subject alternative name (``rocketray.tls``);
listeners check it against what the peer says (``rocketray.controller.session.hello_problem``,
the HA port's slave id check).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Identity", "IdentityError", "URI_SCHEME", "check_code", "member_of_check_code"]

URI_SCHEME = "rocketray://"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class IdentityError(ValueError):
    """A certificate or URI that does not name a rocketray member."""


@dataclass(frozen=True, slots=True)
class Identity:
    """A member of cluster ``cluster``: controller ``index``, or replica ``index`` of broker ``group``."""

    cluster: str
    role: str                   # "controller" or "broker"
    index: int
    group: str | None = None    # brokers only

    def __post_init__(self) -> None:
        if self.role not in ("controller", "broker"):
            raise IdentityError(f"unknown member role {self.role!r}")
        if not _NAME.match(self.cluster):
            raise IdentityError(f"bad cluster name {self.cluster!r}")
        if type(self.index) is not int or not 0 <= self.index < 1 << 16:
            raise IdentityError(f"bad member index {self.index!r}")
        if (self.role == "broker") != (self.group is not None):
            raise IdentityError("a broker identity names its group; a controller's does not")
        if self.group is not None and not _NAME.match(self.group):
            raise IdentityError(f"bad group name {self.group!r}")

    @classmethod
    def controller(cls, cluster: str, index: int) -> "Identity":
        return cls(cluster, "controller", index)

    @classmethod
    def broker(cls, cluster: str, group: str, replica: int) -> "Identity":
        return cls(cluster, "broker", replica, group)

    @property
    def uri(self) -> str:
        if self.role == "controller":
            return f"{URI_SCHEME}{self.cluster}/controller/{self.index}"
        return f"{URI_SCHEME}{self.cluster}/broker/{self.group}/{self.index}"

    @classmethod
    def parse(cls, uri: str) -> "Identity":
        if not uri.startswith(URI_SCHEME):
            raise IdentityError(f"not a rocketray member URI: {uri!r}")
        parts = uri[len(URI_SCHEME):].split("/")
        try:
            if len(parts) == 3 and parts[1] == "controller":
                return cls.controller(parts[0], int(parts[2]))
            if len(parts) == 4 and parts[1] == "broker":
                return cls.broker(parts[0], parts[2], int(parts[3]))
        except ValueError as exc:
            raise IdentityError(f"not a rocketray member URI: {uri!r}: {exc}") from None
        raise IdentityError(f"not a rocketray member URI: {uri!r}")

    def __str__(self) -> str:
        return self.uri


def check_code(address: str, now_ms: int, member: Identity | None) -> str:
    """A broker's registration check code (reference 9.2: ``address;time``), with the member identity
    that registered appended: the controller's registration then says which member a broker id
    belongs to, whatever address it moves to."""
    code = f"{address};{now_ms}"
    return code if member is None else f"{code};{member.uri}"


def member_of_check_code(code: str | None) -> Identity | None:
    """The member identity a registration check code names (None: registered without one)."""
    last = (code or "").rsplit(";", 1)[-1]
    if not last.startswith(URI_SCHEME):
        return None
    try:
        return Identity.parse(last)
    except IdentityError:
        return None
