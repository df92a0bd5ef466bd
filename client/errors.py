"""The client's exceptions: each says what happened and whether doing the same again may succeed.

Like aiokafka's errors, every exception carries ``retriable``: True when the same call may succeed
later with nothing changed on the caller's side (no master for a while, a timeout before anything
was written), False when it cannot (the topic does not exist, the message is invalid) or when
repeating it could store a message twice (:class:`SendUnknown`). ``code`` is a short stable name
for logs and dashboards.
"""

from __future__ import annotations

import re
from typing import Mapping

from rocketray.client.types import TopicQueue

__all__ = ["ClientError", "ClusterNotFound", "TopicNotFound", "InvalidMessage", "InvalidRequest", "SendFailed",
           "SendUnknown", "CommitFailed", "ClientClosed", "AdminError", "BufferFull", "FlushTimeout", "AccessDenied",
           "AuthenticationFailed", "access_denied"]


class ClientError(Exception):
    """Base of every rocketray client error."""

    code = "CLIENT_ERROR"
    retriable = False

    def __init__(self, message: str, *, retriable: bool | None = None, code: str | None = None) -> None:
        super().__init__(message)
        if retriable is not None:
            self.retriable = retriable
        if code is not None:
            self.code = code


class ClusterNotFound(ClientError):
    """No rocketray cluster of that name runs on the connected Ray (start it, or check the name)."""

    code = "CLUSTER_NOT_FOUND"


class TopicNotFound(ClientError):
    """The topic does not exist: create it (``Admin.create_topic`` or ``rocketray admin update-topic``)."""

    code = "TOPIC_NOT_EXIST"

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} does not exist; create it with Admin(...).create_topic({topic!r}, queues=N) "
                         f"or `rocketray admin update-topic -t {topic} -q N`")
        self.topic = topic


class InvalidMessage(ClientError):
    """The message cannot be sent as it is (too large, a reserved or malformed property, a bad key)."""

    code = "MESSAGE_ILLEGAL"


class InvalidRequest(ClientError):
    """An argument is invalid (a bad topic name, queue count, group name, timeout)."""

    code = "INVALID_REQUEST"


class SendFailed(ClientError):
    """Nothing was written: every attempt was refused before writing (no master, not enough in-sync
    replicas) until the send's deadline. Sending again is safe."""

    code = "SEND_FAILED"
    retriable = True


class SendUnknown(ClientError):
    """The message may have been stored but was not acknowledged (replicas did not confirm it in time,
    the master changed during the wait, or the call was never answered). Sending it again may store a
    second copy; consumers de-duplicate by ``msg_id``. ``status`` is the broker's answer when there was
    one (e.g. ``SendStatus.FLUSH_SLAVE_TIMEOUT``), else None."""

    code = "SEND_UNKNOWN"
    retriable = False

    def __init__(self, message: str, msg_id: str, status: object | None = None) -> None:
        super().__init__(message)
        self.msg_id = msg_id
        self.status = status


class CommitFailed(ClientError):
    """Some offsets were not acknowledged as committed. Committing again is always safe (a group's
    offset never moves backwards), so this is retriable; until it succeeds, a failover may redeliver."""

    code = "COMMIT_FAILED"
    retriable = True

    def __init__(self, message: str, *, retriable: bool | None = None,
                 committed: Mapping[TopicQueue, int] | None = None,
                 failed: Mapping[TopicQueue, int] | None = None) -> None:
        super().__init__(message, retriable=retriable)
        #: ``{TopicQueue: offset}`` this call did get acknowledged (other broker groups).
        self.committed = dict(committed or {})
        #: ``{TopicQueue: offset}`` it did not (commit them again).
        self.failed = dict(failed or {})


class ClientClosed(ClientError):
    """The producer or consumer was closed."""

    code = "CLIENT_CLOSED"


class BufferFull(ClientError):
    """``send_async`` waited ``max_block_ms`` for room in the producer's buffer (``buffer_bytes`` of
    messages queued or in flight) and found none: the cluster is not keeping up, or is unreachable.
    Nothing was queued; sending again later is safe (Kafka's ``max.block.ms``)."""

    code = "BUFFER_FULL"
    retriable = True


class FlushTimeout(ClientError, TimeoutError):
    """``flush(timeout_s)`` (or ``close``) returned before every queued send finished. The sends go
    on; their futures say how each ended. Also a ``TimeoutError``."""

    code = "FLUSH_TIMEOUT"
    retriable = True


class AdminError(ClientError):
    """The controller refused an admin request; ``code`` is its response code name."""

    code = "ADMIN_ERROR"


class AccessDenied(ClientError):
    """The cluster's ACL does not let this client's user do ``action`` (``Pub``, ``Sub``, ``Admin``)
    on ``resource`` (``Topic:orders``, ``Group:billing``, ``Cluster``). Nothing was done. Not
    retriable: an operator must allow it (``rocketray admin acl create -u USER -r RESOURCE -a ACTION
    -d allow``). ``resource`` and ``action`` are None when the refusal did not name them."""

    code = "ACCESS_DENIED"

    def __init__(self, message: str, *, resource: str | None = None, action: str | None = None) -> None:
        super().__init__(message)
        self.resource = resource
        self.action = action


class AuthenticationFailed(ClientError, ConnectionError):
    """The cluster refused the client's user credential (unknown user, wrong secret), or could not
    prove it knows the user. Not retriable with the same credential: check the client configuration
    (``user``, ``secret``/``secret_file``) or ask an operator (``rocketray admin user update``). Also
    a ``ConnectionError``."""

    code = "AUTHENTICATION_FAILED"


#: How a broker or controller words an ACL refusal (``rocketray.acl.AccessDecision``).
_DECISION = re.compile(r"^(?P<user>\S+) denied (?P<action>\w+) on (?P<resource>\S+): ")


def access_denied(detail: str, *, resource: str | None = None, action: str | None = None,
                  doing: str | None = None) -> AccessDenied:
    """An :class:`AccessDenied` for a refusal worded ``detail``; ``resource`` and ``action``, when not
    given, are read from the wording when it names them. ``doing`` says what the client was doing."""
    named = _DECISION.match(detail)
    if named is not None:
        resource = resource or named["resource"]
        action = action or named["action"]
    what = f"{doing}: " if doing else ""
    hint = (f"; an operator can allow it: rocketray admin acl create -u USER -r {resource} -a {action} -d allow"
            if resource and action else "")
    return AccessDenied(f"{what}access denied ({detail}){hint}", resource=resource, action=action)
