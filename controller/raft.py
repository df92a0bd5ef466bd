"""pysyncobj glue: the one replicated method, the log payload, journal peeking, snapshot hooks.

Theory of operation.

*One replicated method.* `RaftHost.apply_batch(payload)` is the only method pysyncobj replicates.
The payload is bytes we build: `>BQQ` (payload version 2, term of the leader that decided it,
the leader's clock in ms when it decided; version 1 `>BQ` lacks the clock and is still read)
followed by `rocketray.controller.events.encode_events(...)`, or nothing for a barrier (the leader's
no-op and read barriers). pysyncobj pickles `(method id, (payload,))` around it; nothing of ours
is pickled. At apply time the host passes the entry's log index and term to the node; a payload
whose decided term differs from the term of the entry that carries it is *fenced* (skipped on
every node alike): pysyncobj forwards commands queued on a node that just lost leadership to
the new leader, and a decision taken on the old leader's state must not be applied under the
new one.

*Nothing unpickled from the network.* pysyncobj would unpickle every message and every command
with the unrestricted unpickler. Messages travel as msgpack through ``GuardedTransport``
(``controller/raft_port.py``: TLS between controllers, admission, limits); the command of each
entry is decoded at apply time by ``raft_pickle.decode_command`` (``RaftHost._SyncObj__doApplyCommand``),
which admits only ``(method id, (payload bytes,))``; a command it refuses is logged and skipped on
every replica alike (the same bytes fail the same way everywhere). pysyncobj's membership and
version commands are never written by this cluster and never decoded.

Snapshots, log compaction and what the node loads at start (pysyncobj's serializer hooks, the
recovery plan, the journal peek) are ``controller/raft_snapshots.py``.
"""

from __future__ import annotations

import logging
import os
import struct
import time
from typing import Any, Callable

from pysyncobj import SyncObj, SyncObjConf, replicated

from rocketray.fs import OS_DISK, Disk
from rocketray.controller.journal import DurableJournal
from rocketray.controller.config import ControllerConfig
from rocketray.controller.raft_pickle import UnsafePickle, decode_command
from rocketray.controller.raft_port import GuardedTransport, RaftPortSettings
from rocketray.controller.raft_wire import RAFT_CHUNK_BYTES
# Re-exported: the recovery side lived here before it moved to controller/raft_snapshots.py.
from rocketray.controller.raft_snapshots import (Entry, JournalHead, RecoveryPlan, RecoveryRefused,  # noqa: F401
                                                 SnapshotHooks, import_pysyncobj_journal, peek_journal,
                                                 plan_recovery)

log = logging.getLogger(__name__)

PAYLOAD_VERSION = 2
PAYLOAD_HEADER_V1 = struct.Struct(">BQ")    # version 1, term
PAYLOAD_HEADER = struct.Struct(">BQQ")      # version 2, term, decided_ms (leader clock)
_REGULAR, _NO_OP = b"\x00", b"\x01"         # pysyncobj's _COMMAND_TYPE of an entry's first byte


class PayloadError(ValueError):
    """A log payload that is not ours (wrong version or too short)."""


def encode_payload(term: int, body: bytes = b"", decided_ms: int | None = None) -> bytes:
    """A log payload; ``decided_ms`` None writes version 1 (no decision time), else version 2."""
    assert term >= 0
    if decided_ms is None:
        return PAYLOAD_HEADER_V1.pack(1, term) + body
    assert decided_ms >= 0
    return PAYLOAD_HEADER.pack(PAYLOAD_VERSION, term, decided_ms) + body


def decode_payload(payload: bytes) -> tuple[int, int | None, bytes]:
    """(decided term, decided_ms or None for version 1, encoded events or b"" for a barrier)."""
    if len(payload) < 1:
        raise PayloadError("empty payload")
    version = payload[0]
    header = {1: PAYLOAD_HEADER_V1, PAYLOAD_VERSION: PAYLOAD_HEADER}.get(version)
    if header is None:
        raise PayloadError(f"unknown payload version {version}")
    if len(payload) < header.size:
        raise PayloadError(f"payload of {len(payload)} bytes is shorter than its header")
    if version == 1:
        _, term = header.unpack_from(payload, 0)
        return term, None, bytes(payload[header.size:])
    _, term, decided_ms = header.unpack_from(payload, 0)
    return term, decided_ms, bytes(payload[header.size:])


def sync_obj_conf(config: ControllerConfig, password: str | None, journal_file: str, dump_file: str,
                  hooks: SnapshotHooks, on_state_changed: Callable[[int, int], None], bind_address: str) -> SyncObjConf:
    """pysyncobj settings from a ControllerConfig (all durations converted to seconds). ``password``
    is the members' secret in development mode (TLS off), None with TLS."""
    return SyncObjConf(
        password=password,
        bindAddress=bind_address,
        appendEntriesBatchSizeBytes=RAFT_CHUNK_BYTES,  # raft_wire.WORST_MESSAGE_BYTES is derived from these
        logCompactionBatchSize=RAFT_CHUNK_BYTES,
        autoTick=False,
        autoTickPeriod=config.tick_period_ms / 1000,
        raftMinTimeout=config.raft_min_timeout_ms / 1000,
        raftMaxTimeout=config.raft_max_timeout_ms / 1000,
        appendEntriesPeriod=config.append_entries_period_ms / 1000,
        appendEntriesUseBatch=config.append_entries_use_batch,
        connectionTimeout=config.connection_timeout_ms / 1000,
        connectionRetryTime=config.connection_retry_ms / 1000,
        leaderFallbackTimeout=config.leader_fallback_timeout_ms / 1000,
        commandsQueueSize=config.commands_queue_size,
        journalFile=None,  # RaftHost installs a DurableJournal on journal_file (see controller/journal.py)
        fullDumpFile=dump_file,
        logCompactionMinEntries=2 ** 62,
        logCompactionMinTime=10 ** 9,
        serializer=hooks.serialize,
        deserializer=hooks.deserialize,
        serializeChecker=hooks.check,
        onStateChanged=on_state_changed,
        bindRetryTime=0.1,
        maxBindRetries=50,
        dynamicMembershipChange=False,
    )


# Messages a node may send before its journal is synced: the leader's replication stream (the
# leader counts itself toward a commit only after its own fsync, see RaftHost) and the keepalive,
# which carries nothing. Everything else (a follower's ack `next_node_idx`, a vote, a vote request,
# a forwarded command) reflects entries or a term that must be on disk first.
KEEPALIVE = "rr_keepalive"
UNSYNCED_SENDS = frozenset({"append_entries", KEEPALIVE})
# Messages held back until the end of the poll that produced them, then sent after one journal
# sync for all of them (a follower's group commit: the appends of every append_entries that
# arrived together share one fsync).
DEFERRED_SENDS = frozenset({"next_node_idx"})
KEEPALIVES_PER_TIMEOUT = 4


class SyncingTransport(GuardedTransport):
    """pysyncobj's TCP transport that syncs the host's journal before a message leaves, unless
    the message is in ``UNSYNCED_SENDS``. Acknowledgements (``DEFERRED_SENDS``) wait in an outbox
    that ``flush`` sends after one sync; any other synced message flushes the outbox first, so
    synced messages leave in the order they were sent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._outbox: list[tuple[Any, dict[str, Any]]] = []

    def send(self, node: Any, message: Any) -> bool:
        kind = message.get("type") if isinstance(message, dict) else None
        if kind in UNSYNCED_SENDS:
            return bool(super().send(node, message))
        journal = self._syncObj.journal  # type: ignore[attr-defined]
        if journal is None:
            return bool(super().send(node, message))
        if kind in DEFERRED_SENDS:
            self._defer(node, message)
            return True
        self.flush()
        journal.sync()
        return bool(super().send(node, message))

    def _defer(self, node: Any, message: dict[str, Any]) -> None:
        # A successful ack after a successful ack to the same leader says no less than both
        # (the leader keeps the highest match index), so only the newer of the two is kept.
        outbox = self._outbox
        if outbox and message["success"] and not message["reset"]:
            last_node, last = outbox[-1]
            if last_node is node and last["success"] and not last["reset"] \
                    and last["next_node_idx"] <= message["next_node_idx"]:
                outbox[-1] = (node, message)
                return
        outbox.append((node, message))

    def flush(self) -> None:
        """Sync the journal once, then send every held-back message in order."""
        if not self._outbox:
            return
        journal = self._syncObj.journal  # type: ignore[attr-defined]
        if journal is not None:
            journal.sync()
        outbox, self._outbox = self._outbox, []
        for node, message in outbox:
            super().send(node, message)


class RaftHost(SyncObj):
    """The pysyncobj node. `apply_fn(index, entry_term, payload)` runs on the tick thread.

    The journal is a ``DurableJournal`` on ``journal_file`` (over ``disk``) installed right after
    pysyncobj's constructor (which builds a throwaway in-memory one because the conf names no
    journal file), restoring term, vote and commit index from it as pysyncobj's own constructor
    does. It is synced before every non-``append_entries`` message (``SyncingTransport``), after
    the leader appended new commands (``_checkCommandsToApply``, i.e. after it sent them, so its
    fsync overlaps the followers') and at the start of every tick, before the leader counts
    itself toward a commit; a follower's acknowledgements of one poll leave together after that
    sync (``SyncingTransport.flush``).

    Group commit: the leader appends every command queued since its last tick, then sends one
    ``append_entries`` per follower carrying all of them (pysyncobj sends one per command when
    ``appendEntriesUseBatch`` is false), then syncs once; each follower appends them, syncs once
    and acknowledges once."""

    def __init__(self, self_address: str, other_addresses: list[str], conf: SyncObjConf,
                 apply_fn: Callable[[int, int, bytes], Any], journal_file: str | os.PathLike[str],
                 port: RaftPortSettings, disk: Disk = OS_DISK, journal_fsync: bool = True) -> None:
        self._rr_apply = apply_fn
        self.journal: DurableJournal | None = None
        self.refused_commands = 0
        self.raft_port_settings = port  # read by GuardedTransport, which pysyncobj builds below
        assert conf.journalFile is None
        # A snapshot streamed by the leader is read by our deserializer (snapshot/format.py, no
        # pickle); pysyncobj unpickles it itself only without a dump file or a deserializer.
        assert conf.fullDumpFile and conf.deserializer is not None
        super().__init__(self_address, other_addresses, conf, transportClass=SyncingTransport)
        journal = DurableJournal(journal_file, disk, fsync=journal_fsync)
        if len(journal) == 0:
            journal.add(self._SyncObj__raftLog[0][0], 1, 0)  # type: ignore[attr-defined]  # pysyncobj's NO_OP
            journal.sync()
        self._SyncObj__raftLog = journal
        self.journal = journal
        self._SyncObj__raftCurrentTerm = max(journal.getCurrentTerm(), journal[-1][2])
        self._SyncObj__votedForNodeId = journal.getVotedForNodeId()
        self._SyncObj__raftCommitIndex = journal.getRaftCommitIndex()
        # pysyncobj's leader sends append_entries to every follower right after it applied
        # entries, only to tell them the new commit index; the next append or heartbeat
        # (append_entries_period_ms) carries it anyway. Not sending it halves the messages of a
        # write and keeps the followers' apply out of the next write's round trip.
        self._SyncObj__applyLogEntries = self._apply_log_entries_without_eager_send
        # Keepalives on every peer connection (see _keep_connections_alive).
        self._keepalive_period_s = conf.connectionTimeout / KEEPALIVES_PER_TIMEOUT
        self._next_keepalive = 0.0
        self.keepalives_sent = 0

    def _apply_log_entries_without_eager_send(self) -> bool:
        SyncObj._SyncObj__applyLogEntries(self)  # type: ignore[attr-defined]
        return False

    def doTick(self, timeToWait: float = 0.0) -> None:
        journal = self.journal
        if journal is not None:
            journal.sync()
            self._SyncObj__transport.flush()  # type: ignore[attr-defined]  # acks of the last poll
        self._keep_connections_alive()
        super().doTick(timeToWait)

    def _keep_connections_alive(self) -> None:
        """Send a keepalive on every peer connection a few times per ``connectionTimeout``.

        pysyncobj drops a connection on which nothing was *read* for ``connectionTimeout``, and it
        checks that only when the connection has an event or something is sent on it. Two
        followers never talk to each other, so when the leader dies the first candidate's
        ``request_vote`` to the other follower finds their connection idle for longer than the
        timeout: the send drops it and the vote request is lost (and a receiver would drop it the
        same way on reading), and the election waits another election timeout for a second
        round (measured: a new leader 490-760 ms after the old one died instead of 200-450).
        A keepalive read from a peer every ``connectionTimeout / KEEPALIVES_PER_TIMEOUT`` keeps
        the connection usable; a frozen or dead peer sends none, so it still times out. The
        receiver's pysyncobj ignores a message type it does not know."""
        now = time.monotonic()
        if now < self._next_keepalive:
            return
        self._next_keepalive = now + self._keepalive_period_s
        transport = self._SyncObj__transport  # type: ignore[attr-defined]
        for node in self._SyncObj__otherNodes:  # type: ignore[attr-defined]
            if transport.send(node, {"type": KEEPALIVE}):
                self.keepalives_sent += 1

    def _checkCommandsToApply(self) -> None:
        # pysyncobj calls its private __sendAppendEntries after each command it appends; an
        # instance attribute shadows that method (only the tick thread calls it) so the commands
        # of this tick leave in one append_entries per follower, sent once they are all appended.
        wanted: list[bool] = []
        self._SyncObj__sendAppendEntries = lambda: wanted.append(True)  # type: ignore[attr-defined]
        try:
            super()._checkCommandsToApply()
        finally:
            del self._SyncObj__sendAppendEntries
        if wanted:
            self._SyncObj__sendAppendEntries()  # type: ignore[attr-defined]
        journal = self.journal
        if journal is not None:
            journal.sync()

    def _SyncObj__doApplyCommand(self, command: bytes) -> Any:
        """pysyncobj's apply of one entry's command, with the restricted decoder (module docstring)."""
        kind = command[:1]
        if kind == _NO_OP:
            return None
        try:
            if kind != _REGULAR:
                raise UnsafePickle(f"command type {command[:1]!r}: only regular commands are written here")
            func_id, args = decode_command(command[1:])
            method = self._idToMethod.get(func_id)
            if method is None or len(args) != 1 or type(args[0]) is not bytes:
                raise UnsafePickle(f"method {func_id} with {len(args)} arguments is not apply_batch(payload)")
        except UnsafePickle as exc:
            self.refused_commands += 1
            log.error("log entry command refused, skipped on every replica: %s", exc)
            return None
        return method(args[0], _doApply=True)

    def _SyncObj__parseChangeClusterRequest(self, command: bytes) -> None:
        """Membership changes are off (``dynamicMembershipChange=False``): no command is one, and
        none is unpickled to find out."""
        return None

    def port_stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = self._SyncObj__transport.stats()  # type: ignore[attr-defined]
        stats["refused_commands"] = self.refused_commands
        return stats

    @replicated
    def apply_batch(self, payload: bytes) -> Any:
        index = self.raftLastApplied + 1  # pysyncobj bumps raftLastApplied after the call
        entries = self._SyncObj__getEntries(index, 1)  # type: ignore[attr-defined]
        entry_term = entries[0][2] if entries else -1
        return self._rr_apply(index, entry_term, payload)

    def leader_address(self) -> str | None:
        leader = self._getLeader()
        return None if leader is None else leader.address

    def journal_first_index(self) -> int | None:
        """First index in the journal (None while the tick thread is rewriting it)."""
        try:
            return self._SyncObj__raftLog[0][1]  # type: ignore[attr-defined]
        except IndexError:
            return None

    def journal_len(self) -> int:
        return self._getRaftLogSize()
