"""Messages as the client writes and reads them: the stored properties a send sets, the ids it
assigns, and the :class:`ReceivedMessage` objects a pull's records become. Pure: no IO, no clock."""

from __future__ import annotations

import os
import socket
import uuid
from typing import Mapping

from rocketray.wire.message import MessageCodecError, decode_record, encode_properties
from rocketray.wire.delayed import P_DELIVER_AT, SCHEDULE_PROPERTIES, deliver_at_of
from rocketray.client.errors import InvalidMessage
from rocketray.client.retry import RETRY_PROPERTIES, redelivery_fields
from rocketray.client.types import ReceivedMessage

__all__ = ["RESERVED_PROPERTIES", "new_msg_id_prefix", "message_properties", "decode_messages", "deliver_time"]

#: Properties the client sets itself (RocketMQ's names, a retry copy's: ``rocketray.client.retry``, and
#: a delayed message's: ``rocketray.broker.schedule``): a user property may not use them, and a
#: received message's ``properties`` leave them out.
RESERVED_PROPERTIES = frozenset({"KEYS", "TAGS", "UNIQ_KEY"}) | RETRY_PROPERTIES | SCHEDULE_PROPERTIES


def new_client_id() -> str:
    """A producer's or consumer's id when the application names none: ``host@pid@random``."""
    return f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:8]}"


def new_msg_id_prefix() -> str:
    """A producer's random prefix of its message ids (each id: prefix + a 12-digit hex counter)."""
    return uuid.uuid4().hex[:20].upper()


def message_properties(key: str | None, tags: str | None, properties: Mapping[str, str] | None,
                       msg_id: str, system: Mapping[str, str] | None = None) -> bytes:
    """The stored properties (RocketMQ's KEYS, TAGS and UNIQ_KEY, then the user's, then ``system``:
    reserved ones the client itself sets on a retry copy), encoded; InvalidMessage if a user
    property is reserved, not a string or holds a separator."""
    if key is None and tags is None and not properties and not system:
        return b"UNIQ_KEY\x01" + msg_id.encode("ascii") + b"\x02"     # msg_id is hex: nothing to check
    props: dict[str, str] = {}
    for name, value in (properties or {}).items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise InvalidMessage(f"properties must map str to str: {name!r}: {value!r}")
        if name in RESERVED_PROPERTIES:
            raise InvalidMessage(f"property {name!r} is reserved (use key=, tags=; msg_id is assigned)")
        props[name] = value
    for reserved, given in (("KEYS", key), ("TAGS", tags)):
        if given is not None:
            if not isinstance(given, str) or not given:
                raise InvalidMessage(f"{reserved.lower()} must be a non-empty str: {given!r}")
            props[reserved] = given
    props.update(system or {})
    props["UNIQ_KEY"] = msg_id
    try:
        return encode_properties(props)
    except MessageCodecError as exc:
        raise InvalidMessage(str(exc)) from None


def deliver_time(delay_s: float | None, deliver_at_ms: int | None, now_ms: int) -> int | None:
    """A send's delivery time from its ``delay_s`` or ``deliver_at_ms`` (None: neither, send now);
    InvalidMessage for both, or for a value that is not a number of the right kind. Its range is
    ``rocketray.broker.schedule.plan_delay``'s to check."""
    if delay_s is None:
        if deliver_at_ms is None:
            return None
        if isinstance(deliver_at_ms, bool) or not isinstance(deliver_at_ms, int):
            raise InvalidMessage(f"deliver_at_ms must be an int of ms since the epoch, not {deliver_at_ms!r}")
        return deliver_at_ms
    if deliver_at_ms is not None:
        raise InvalidMessage("give delay_s or deliver_at_ms, not both")
    if isinstance(delay_s, bool) or not isinstance(delay_s, (int, float)) or not 0 <= delay_s < 10**9:
        raise InvalidMessage(f"delay_s must be a number of seconds >= 0, not {delay_s!r}")
    return now_ms + round(delay_s * 1000)


def decode_messages(topic: str, records: bytes, count: int) -> list[ReceivedMessage]:
    """The ``count`` stored records of a pull answer as the messages ``poll`` returns."""
    out, pos = [], 0
    for _ in range(count):
        msg, size = decode_record(records, pos)
        pos += size
        props = msg.properties
        out.append(ReceivedMessage(
            topic=topic, queue_id=msg.queue_id, queue_offset=msg.queue_offset, msg_id=props.get("UNIQ_KEY", ""),
            key=props.get("KEYS"), tags=props.get("TAGS"),
            properties={k: v for k, v in props.items() if k not in RESERVED_PROPERTIES},
            body=bytes(msg.body), born_timestamp_ms=msg.born_timestamp_ms, store_timestamp_ms=msg.store_timestamp_ms,
            deliver_at_ms=deliver_at_of(props) if P_DELIVER_AT in props else 0, **redelivery_fields(topic, props)))
    return out
