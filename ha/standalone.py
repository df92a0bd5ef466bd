"""A standalone HA endpoint: an ``HAService`` without a broker around it (HA tests, benchmarks, the
HA slave process of the tests).

A broker's HA service is switched by the broker's role machine through the one executor
(``rocketray.broker.executor``). A standalone service has no controller and no manager, so it owns a
role machine of its own (``standalone_machine``) and these methods order it: each one feeds the
machine ``SwitchOrdered`` (or ``SyncStateSetOrdered``), so the same preconditions (no stale switch)
and the same executor steps run as in a broker, and role and epoch still have one owner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, Protocol

from rocketray.broker import role as rm
from rocketray.broker.executor import BrokerNames, Executor, run_now
from rocketray.broker.replication_port import HAPort
from rocketray.broker.role import Lifecycle, Role, RoleMachine, StoreFacts

if TYPE_CHECKING:
    from rocketray.ha.slave_client import SlaveClient

__all__ = ["StandaloneSwitches", "Switched", "parse_address", "standalone_machine"]


def parse_address(address: str | tuple[str, int]) -> tuple[str, int]:
    """``"host:port"`` (or a ``(host, port)`` pair) as a pair; ValueError if malformed."""
    if isinstance(address, tuple):
        return address[0], int(address[1])
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"bad HA address {address!r} (want host:port)")
    return host, int(port)


def standalone_machine(broker_id: int) -> RoleMachine:
    """A role machine for an endpoint with no controller: running (no controller fences it), no
    role yet; its puts are refused NOT_MASTER until it is ordered master (``ha/put_gate.py``)."""
    return RoleMachine(f"ha-{broker_id}", broker_id=broker_id, lifecycle=Lifecycle.RUNNING)


class Switched(HAPort, Protocol):
    """What the mixin needs of the service it is mixed into (``HAService``)."""

    roles: RoleMachine
    standalone: bool
    broker_id: int
    _client: "SlaveClient | None"
    now_ms: Callable[[], int]

    @property
    def role(self) -> Role: ...
    def _facts(self) -> StoreFacts: ...
    async def _order(self, switch: rm.BecomeMaster | rm.BecomeSlave) -> bool: ...
    def _standalone_executor(self) -> Executor: ...


class StandaloneSwitches:
    """The standalone switch methods of ``HAService`` (a mixin: ``self`` is the service)."""

    async def change_to_master(self: Switched, epoch: int) -> bool:
        """Standalone: become master of ``epoch`` (cut a torn tail, start the epoch at the max
        offset, drop the client and old connections, serve slaves). False if ``epoch`` is stale."""
        m = self.roles
        return await self._order(rm.BecomeMaster(epoch, False, m.sync_state_set, m.sync_state_set_epoch))

    async def change_to_master_same(self: Switched, epoch: int) -> bool:
        """Standalone: same master, new epoch: only the epoch entry. False if stale."""
        m = self.roles
        return await self._order(rm.BecomeMaster(epoch, True, m.sync_state_set, m.sync_state_set_epoch))

    async def change_to_slave(self: Switched, master_ha_address: str | tuple[str, int] | None, epoch: int) -> bool:
        """Standalone: replicate from ``master_ha_address`` ("host:port"; the same master: only the
        epoch moves). False if stale."""
        address = None
        if master_ha_address is not None:
            address = "%s:%d" % parse_address(master_ha_address)
        same = (self.role == Role.SLAVE and self._client is not None and address is not None
                and self._client.master_address == parse_address(address))
        return await self._order(rm.BecomeSlave(address, epoch, None, same))

    async def _order(self: Switched, switch: rm.BecomeMaster | rm.BecomeSlave) -> bool:
        assert self.standalone, "a broker's HA service switches through its role machine"
        await self._standalone_executor().feed(rm.SwitchOrdered(switch))
        want = Role.MASTER if isinstance(switch, rm.BecomeMaster) else Role.SLAVE
        return self.roles.switching is None and (self.role, self.roles.master_epoch) == (want, switch.epoch)

    def _order_sync_state_set(self: Switched, ids: Iterable[int]) -> None:
        run_now(self._standalone_executor().feed(rm.SyncStateSetOrdered(frozenset(ids))))

    def _standalone_executor(self: Switched) -> Executor:
        return Executor(self.roles, BrokerNames("", f"ha-{self.broker_id}", self.roles.broker_address),
                        controller=None, ha=self, facts=self._facts, now_ms=self.now_ms)
