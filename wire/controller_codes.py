"""Response codes of the controller API (reference section 6.2).

Every answer the controller core gives carries one of these codes. The numeric values are the
RocketMQ wire values so that logs and admin output line up with the upstream documentation.
``is_retriable`` tells a caller whether the same request may succeed later without any change on
its side (leader moved, nobody electable yet, internal hiccup) as opposed to a request that is
wrong or fenced and must be rebuilt from fresh metadata.
"""

from __future__ import annotations

from enum import IntEnum


class ResponseCode(IntEnum):
    """RocketMQ response codes used by the controller (values are wire values)."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    REQUEST_CODE_NOT_SUPPORTED = 3
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    CONTROLLER_FENCED_MASTER_EPOCH = 2000
    CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH = 2001
    CONTROLLER_INVALID_MASTER = 2002
    CONTROLLER_INVALID_REPLICAS = 2003
    CONTROLLER_MASTER_NOT_AVAILABLE = 2004
    CONTROLLER_INVALID_REQUEST = 2005
    CONTROLLER_BROKER_NOT_ALIVE = 2006
    CONTROLLER_NOT_LEADER = 2007
    CONTROLLER_BROKER_METADATA_NOT_EXIST = 2008
    CONTROLLER_INVALID_CLEAN_BROKER_METADATA = 2009
    CONTROLLER_BROKER_NEED_TO_BE_REGISTERED = 2010
    CONTROLLER_MASTER_STILL_EXIST = 2011
    CONTROLLER_ELECT_MASTER_FAILED = 2012
    CONTROLLER_ALTER_SYNC_STATE_SET_FAILED = 2013
    CONTROLLER_BROKER_ID_INVALID = 2014
    CONTROLLER_JRAFT_INTERNAL_ERROR = 2015
    CONTROLLER_BROKER_LIVE_INFO_NOT_EXISTS = 2016
    # Users and ACL rules: 3001 and 3002 are RocketMQ's ACL 2.0 codes, 3003.. rocketray's own.
    USER_NOT_EXIST = 3001
    POLICY_NOT_EXIST = 3002           # the user has no rule on that resource (or no rule at all)
    USER_ALREADY_EXIST = 3003
    POLICY_ALREADY_EXIST = 3004       # the user has another rule on that resource
    INVALID_USER_NAME = 3005
    INVALID_POLICY = 3006             # a resource, action or decision that does not parse or apply
    INVALID_CREDENTIAL = 3007         # a SCRAM record outside its bounds


_RETRIABLE = frozenset({
    ResponseCode.SYSTEM_ERROR,
    ResponseCode.CONTROLLER_NOT_LEADER,
    ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE,
    ResponseCode.CONTROLLER_ELECT_MASTER_FAILED,
    ResponseCode.CONTROLLER_BROKER_NOT_ALIVE,
    ResponseCode.CONTROLLER_JRAFT_INTERNAL_ERROR,
    ResponseCode.CONTROLLER_BROKER_LIVE_INFO_NOT_EXISTS,
})


def is_retriable(code: int) -> bool:
    """True if resending the same request later may succeed (leader change, nobody electable yet,
    a replica not alive yet, internal error). Fenced epochs, invalid ids and bad requests are not
    retriable: the caller must refresh its metadata and build a new request."""
    try:
        return ResponseCode(code) in _RETRIABLE
    except ValueError:
        return False
