"""Broker registration: obtaining a persistent broker id from the controller (reference §9).

Theory of operation. A broker's controller id is allocated once by the controller and then kept in
the *identity file* for the life of the store directory. Getting it is a two-phase protocol with a
*temp identity file* in between, so that a crash at any point is recoverable:

    INITIAL --GET_NEXT_BROKER_ID, write temp file--> CREATE_TEMP_METADATA_FILE_DONE
            --APPLY_BROKER_ID(temp id, check code), write identity file, clear temp--> CREATE_METADATA_FILE_DONE
            --REGISTER_BROKER (done by the ReplicasManager)--> REGISTERED

The state is re-derived from disk on every attempt (identity file first, then the temp file), so
whatever the last crash left behind drives the next step: no files -> start over; temp file only ->
re-apply the same id with the same check code (the controller accepts that idempotently); identity
file -> only REGISTER_BROKER remains. An APPLY the controller definitely refused (a non-retriable
code such as CONTROLLER_BROKER_ID_INVALID) clears the temp file and starts over; an APPLY whose
outcome is unknown (the call raised or timed out, or a retriable code: the leader may have
committed it before it answered) keeps the temp file and the next pass re-applies the same id with
the same check code, which the controller accepts idempotently: clearing it would orphan an id the
controller may have applied. A failed identity-file write keeps the temp file so the next attempt
re-applies. An identity file whose
cluster or broker name differs from the configuration is refused (the broker never registers under
somebody else's name; reference §18 item 15 is kept on purpose: renaming needs a wiped store).

This module is the IO shell around those rules: it talks to the controller through the injected
``call`` coroutine and to the disk through an :class:`IdentityStore`.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol

from rocketray.broker.identity import BrokerIdentity, TempBrokerIdentity
from rocketray.wire.controller_api import ApplyBrokerIdRequest, GetNextBrokerIdRequest, Response
from rocketray.wire.controller_codes import is_retriable
from rocketray.identity import Identity, check_code as make_check_code

log = logging.getLogger(__name__)


class RegisterState(enum.IntEnum):
    INITIAL = 0
    CREATE_TEMP_METADATA_FILE_DONE = 1
    CREATE_METADATA_FILE_DONE = 2
    REGISTERED = 3


@dataclass(frozen=True, slots=True)
class Identity:
    cluster_name: str
    broker_name: str
    broker_id: int


@dataclass(frozen=True, slots=True)
class TempIdentity:
    cluster_name: str
    broker_name: str
    broker_id: int
    register_check_code: str


class IdentityStore(Protocol):
    """The two identity files of reference §9.1. Writes are durable; ``load*`` return None if absent."""

    def load(self) -> Identity | None: ...
    def save(self, identity: Identity) -> None: ...
    def clear(self) -> None: ...
    def load_temp(self) -> TempIdentity | None: ...
    def save_temp(self, temp: TempIdentity) -> None: ...
    def clear_temp(self) -> None: ...


class FileIdentityStore:
    """:class:`IdentityStore` on the durable files of :mod:`rocketray.broker.identity` under a store root.

    ``rocketray.broker.identity`` owns the file format (``cluster#name#id`` and ``cluster#name#id#checkCode``)
    and durability (temp, fsync, rename); this adapter only maps it to the registrar's records.
    """

    def __init__(self, root_dir: str) -> None:
        self.root_dir = root_dir

    def load(self) -> Identity | None:
        got = BrokerIdentity.load(self.root_dir)
        return None if got is None else Identity(got.cluster_name, got.broker_name, got.broker_id)

    def save(self, identity: Identity) -> None:
        BrokerIdentity(identity.cluster_name, identity.broker_name, identity.broker_id).save(self.root_dir)

    def clear(self) -> None:
        BrokerIdentity.clear(self.root_dir)

    def load_temp(self) -> TempIdentity | None:
        got = TempBrokerIdentity.load(self.root_dir)
        if got is None:
            return None
        return TempIdentity(got.cluster_name, got.broker_name, got.broker_id, got.register_check_code)

    def save_temp(self, temp: TempIdentity) -> None:
        TempBrokerIdentity(temp.cluster_name, temp.broker_name, temp.broker_id,
                           temp.register_check_code).save(self.root_dir)

    def clear_temp(self) -> None:
        TempBrokerIdentity.clear(self.root_dir)


Call = Callable[[object], Awaitable[Response]]


class Registrar:
    """Steps 1-4 of the register state machine (reference §9.2): ends with a broker id on disk.

    ``ensure_broker_id(call)`` performs at most one pass and returns the broker id once the identity
    file holds it, or None (the reason is logged and ``state`` tells how far it got). It never
    raises for controller errors or file errors: both are expected outcomes here.
    """

    def __init__(self, cluster_name: str, broker_name: str, broker_address: str,
                 files: IdentityStore, now_ms: Callable[[], int], member: Identity | None = None) -> None:
        """``member``: the member identity this broker runs as, recorded in its registration's check
        code (``rocketray.identity.check_code``)."""
        self.cluster_name = cluster_name
        self.member = member
        self.broker_name = broker_name
        self.broker_address = broker_address
        self.files = files
        self.now_ms = now_ms
        self.state = RegisterState.INITIAL
        self.broker_id: int | None = None

    def _confirm_from_disk(self) -> bool:
        """Step 1 and 2: derive the state from the files; False if they belong to another broker."""
        ident = self.files.load()
        if ident is not None:
            if (ident.cluster_name, ident.broker_name) != (self.cluster_name, self.broker_name):
                log.error("identity file belongs to %s/%s, configured %s/%s: refusing to register",
                          ident.cluster_name, ident.broker_name, self.cluster_name, self.broker_name)
                self.state = RegisterState.CREATE_METADATA_FILE_DONE
                return False
            self.state = max(self.state, RegisterState.CREATE_METADATA_FILE_DONE)
            self.broker_id = ident.broker_id
            if self.files.load_temp() is not None:  # crashed between writing the identity and clearing it
                self._clear_quietly(self.files.clear_temp)
            return True
        temp = self.files.load_temp()
        if temp is not None:
            if (temp.cluster_name, temp.broker_name) != (self.cluster_name, self.broker_name):
                log.error("temp identity file belongs to %s/%s, configured %s/%s: refusing to register",
                          temp.cluster_name, temp.broker_name, self.cluster_name, self.broker_name)
                self.state = RegisterState.CREATE_TEMP_METADATA_FILE_DONE
                return False
            self.state = RegisterState.CREATE_TEMP_METADATA_FILE_DONE
            return True
        self.state = RegisterState.INITIAL
        return True

    async def _create_temp(self, call: Call) -> bool:
        try:
            resp = await call(GetNextBrokerIdRequest(self.cluster_name, self.broker_name))
        except Exception as exc:
            log.warning("get next broker id failed: group=%s error=%r", self.broker_name, exc)
            return False
        if not resp.ok:
            log.warning("get next broker id failed: group=%s code=%s %s", self.broker_name, resp.code, resp.remark)
            return False
        next_id = resp.header.next_broker_id
        check_code = make_check_code(self.broker_address, self.now_ms(), self.member)
        try:
            self.files.save_temp(TempIdentity(self.cluster_name, self.broker_name, next_id, check_code))
        except Exception:
            log.exception("writing the temp identity file failed: group=%s", self.broker_name)
            self._clear_quietly(self.files.clear_temp)
            return False
        self.state = RegisterState.CREATE_TEMP_METADATA_FILE_DONE
        return True

    async def _apply(self, call: Call) -> bool:
        temp = self.files.load_temp()
        assert temp is not None
        try:
            resp = await call(ApplyBrokerIdRequest(self.cluster_name, self.broker_name, temp.broker_id,
                                                   temp.register_check_code))
        except Exception as exc:
            log.warning("apply broker id outcome unknown, keeping the temp file to re-apply: group=%s "
                        "broker_id=%s error=%r", self.broker_name, temp.broker_id, exc)
            return False
        if not resp.ok and is_retriable(resp.code):
            log.warning("apply broker id outcome unknown, keeping the temp file to re-apply: group=%s "
                        "broker_id=%s code=%s %s", self.broker_name, temp.broker_id, resp.code, resp.remark)
            return False
        if not resp.ok:
            log.warning("apply broker id refused: group=%s broker_id=%s code=%s %s",
                        self.broker_name, temp.broker_id, resp.code, resp.remark)
            self._clear_quietly(self.files.clear_temp)
            self.state = RegisterState.INITIAL
            return False
        try:
            self.files.save(Identity(self.cluster_name, self.broker_name, temp.broker_id))
            self.files.clear_temp()
        except Exception:
            log.exception("writing the identity file failed: group=%s broker_id=%s", self.broker_name, temp.broker_id)
            self._clear_quietly(self.files.clear)
            return False
        self.broker_id = temp.broker_id
        self.state = RegisterState.CREATE_METADATA_FILE_DONE
        return True

    async def ensure_broker_id(self, call: Call) -> int | None:
        """One pass of steps 1-4; the broker id once it is durable in the identity file, else None.

        A transport error of ``call`` before the temp file exists changes nothing; during APPLY it is
        an unknown outcome: the temp file stays and the next pass re-applies the same id (the
        reference clears it and can orphan an id the controller applied).
        """
        if not self._confirm_from_disk():
            return None
        if self.state == RegisterState.INITIAL and not await self._create_temp(call):
            return None
        if self.state == RegisterState.CREATE_TEMP_METADATA_FILE_DONE and not await self._apply(call):
            return None
        assert self.state >= RegisterState.CREATE_METADATA_FILE_DONE
        assert self.broker_id is not None
        return self.broker_id

    def mark_registered(self) -> None:
        assert self.state >= RegisterState.CREATE_METADATA_FILE_DONE
        self.state = RegisterState.REGISTERED

    def reset(self) -> None:
        """Shutdown (reference §10.10): forget the in-memory progress; the files stay."""
        self.state = RegisterState.INITIAL

    @staticmethod
    def _clear_quietly(fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:
            log.exception("cleanup of an identity file failed")
