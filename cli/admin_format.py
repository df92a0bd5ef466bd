"""Text output of ``rocketray admin``: mqadmin's controller commands, as pure formatting.

Each function takes the plain data a controller (or broker) answered — snake_case header and body
dicts as in ``docs/contracts.md`` — and returns the lines mqadmin prints (reference section 15),
joined by ``\\n`` without a trailing newline. Differences from mqadmin, on purpose:

- no leading blank lines (mqadmin starts many lines with ``\\n``); one blank line between blocks;
- values are rendered as Java would (``null``, ``true``/``false``) so output lines up with upstream
  documentation; maps are printed in key order (mqadmin prints HashMap order);
- ``elect-master`` prints the ``\\t#Broker\\t<id>\\t<addr>`` member lines (quirk 14 FIXED: mqadmin
  decodes the wrong body type and never prints them);
- ``clean-broker-metadata`` drops mqadmin's trailing space;
- the topic commands (``update-topic``, ``delete-topic``, ``topic-route``, ``topic-list``) talk to the
  controller, which holds the topic table here (no nameserver), so their lines name the controller
  and a route lists the broker group of each queue instead of mqadmin's TopicRouteData JSON;
- the user and ACL commands (``user ...``, ``acl ...``, mqadmin's ACL 2.0 ones) name the controller
  too; a user's type is mqadmin's ``Super`` or ``Normal`` and a rule row has no source-IP column.

Errors are one line: ``<CODE_NAME> (<code>): <remark>`` (see ``format_error``).
"""

from __future__ import annotations

import datetime
from typing import Any, Iterable, Mapping, Sequence

from rocketray.wire.controller_codes import ResponseCode

CONFIG_KEY_WIDTH = 50


def java_str(value: Any) -> str:
    """A value as Java's ``String.valueOf`` shows it: ``null``, ``true``/``false``, else ``str``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def format_error(code: int, remark: str = "") -> str:
    """``<CODE_NAME> (<code>): <remark>``; ``UNKNOWN`` for a code outside ``ResponseCode``; no colon
    part when the remark is empty."""
    try:
        name = ResponseCode(code).name
    except ValueError:
        name = "UNKNOWN"
    head = f"{name} ({int(code)})"
    return f"{head}: {remark}" if remark else head


def _lines(*lines: str) -> str:
    return "\n".join(lines)


def _kv(key: str, value: Any) -> str:
    return f"#{key}\t{java_str(value)}"


# -- getControllerMetaData -------------------------------------------------------------------------

def _peer_list(peers: Any) -> list[str]:
    if peers is None:
        return []
    if isinstance(peers, str):  # RocketMQ style "id:addr;id:addr;"
        return [p for p in peers.split(";") if p]
    if isinstance(peers, Mapping):  # id -> address
        return [f"{peer_id}:{addr}" for peer_id, addr in sorted(peers.items(), key=lambda kv: str(kv[0]))]
    return [str(p) for p in peers]


def format_controller_metadata(meta: Mapping[str, Any]) -> str:
    """``getControllerMetaData``: group, leader id and address, one ``#Peer:`` line per peer.

    Keys: ``group``, ``controller_leader_id`` (or ``leader_id``), ``controller_leader_address`` (or
    ``leader_address``), ``peers`` as ``"id:addr;..."``, ``{id: addr}`` or a list of strings."""
    leader_id = meta.get("controller_leader_id", meta.get("leader_id"))
    leader_address = meta.get("controller_leader_address", meta.get("leader_address"))
    lines = [_kv("ControllerGroup", meta.get("group")), _kv("ControllerLeaderId", leader_id),
             _kv("ControllerLeaderAddress", leader_address)]
    lines.extend(f"#Peer:\t{peer}" for peer in _peer_list(meta.get("peers")))
    return _lines(*lines)


# -- getSyncStateSet -------------------------------------------------------------------------------

def _replica_identity(row: Mapping[str, Any]) -> str:
    return (f"ReplicaIdentity{{brokerName='{java_str(row.get('broker_name'))}', "
            f"brokerId={java_str(row.get('broker_id'))}, "
            f"brokerAddress='{java_str(row.get('broker_address'))}', alive={java_str(row.get('alive'))}}}")


def format_sync_state_set(body: Mapping[str, Any]) -> str:
    """``getSyncStateSet`` of a GetSyncStateData body ``{"replicas_info_table": {name: info}}``: per
    broker set (by name) the master, epochs, in-sync count, then one line per replica."""
    blocks = []
    for name, info in sorted(body.get("replicas_info_table", {}).items()):
        in_sync = info.get("in_sync_replicas", [])
        not_in_sync = info.get("not_in_sync_replicas", [])
        lines = [_kv("brokerName", name), _kv("MasterBrokerId", info.get("master_broker_id")),
                 _kv("MasterAddr", info.get("master_address")), _kv("MasterEpoch", info.get("master_epoch")),
                 _kv("SyncStateSetEpoch", info.get("sync_state_set_epoch")), _kv("SyncStateSetNums", len(in_sync))]
        lines.extend(f"InSyncReplica:\t{_replica_identity(r)}" for r in in_sync)
        lines.extend(f"NotInSyncReplica:\t{_replica_identity(r)}" for r in not_in_sync)
        blocks.append(_lines(*lines))
    return "\n\n".join(blocks)


# -- getBrokerEpoch --------------------------------------------------------------------------------

def _epoch_entry(entry: Any) -> tuple[Any, Any, Any]:
    if isinstance(entry, Mapping):
        return entry.get("epoch"), entry.get("start_offset"), entry.get("end_offset")
    epoch, start, end = entry
    return epoch, start, end


def format_broker_epoch(cache: Mapping[str, Any], broker_addr: str | None = None) -> str:
    """``getBrokerEpoch`` of one broker's epoch cache ``{cluster_name, broker_name, broker_id,
    epoch_list, max_offset}`` (entries as ``{epoch, start_offset, end_offset}`` or ``[epoch, start,
    end]``); as in mqadmin the last entry's end offset is replaced by ``max_offset``."""
    addr = broker_addr if broker_addr is not None else cache.get("broker_addr")
    lines = [_kv("clusterName", cache.get("cluster_name")), _kv("brokerName", cache.get("broker_name")),
             _kv("brokerAddr", addr), _kv("brokerId", cache.get("broker_id"))]
    entries = [_epoch_entry(e) for e in cache.get("epoch_list", [])]
    for i, (epoch, start, end) in enumerate(entries):
        if i == len(entries) - 1:
            end = cache.get("max_offset", end)
        lines.append(f"#Epoch: EpochEntry{{epoch={java_str(epoch)}, startOffset={java_str(start)}, "
                     f"endOffset={java_str(end)}}}")
    return _lines(*lines)


def format_broker_epochs(caches: Iterable[tuple[str, Mapping[str, Any]]]) -> str:
    """Several brokers' epoch caches as ``(address, cache)`` pairs, one block each."""
    return "\n\n".join(format_broker_epoch(cache, addr) for addr, cache in caches)


# -- electMaster -----------------------------------------------------------------------------------

def format_elect_master(cluster_name: str, broker_name: str, header: Mapping[str, Any],
                        body: Mapping[str, Any] | None) -> str:
    """``electMaster``: the new master's address and epochs, then one ``\\t#Broker\\t<id>\\t<addr>``
    line per member of ``body["broker_member_group"]["broker_addrs"]`` by id (quirk 14 FIXED)."""
    lines = [_kv("ClusterName", cluster_name), _kv("BrokerName", broker_name),
             _kv("BrokerMasterAddr", header.get("master_address")), _kv("MasterEpoch", header.get("master_epoch")),
             _kv("SyncStateSetEpoch", header.get("sync_state_set_epoch"))]
    group = (body or {}).get("broker_member_group") or {}
    addrs = group.get("broker_addrs") or {}
    for broker_id, addr in sorted(addrs.items(), key=lambda kv: int(kv[0])):
        lines.append(f"\t#Broker\t{int(broker_id)}\t{java_str(addr)}")
    return _lines(*lines)


# -- cleanBrokerMetadata, getControllerConfig, updateControllerConfig ------------------------------

def format_clean_broker_metadata(broker_name: str) -> str:
    return f"clear broker {broker_name} metadata from controller success!"


def format_controller_config(configs: Mapping[str, Mapping[str, Any]]) -> str:
    """``getControllerConfig``: per controller address (in the given order) a banner, then
    ``%-50s=  %s`` lines in key order."""
    lines = []
    for address, config in configs.items():
        lines.append(f"============{address}============")
        lines.extend(f"{key:<{CONFIG_KEY_WIDTH}}=  {java_str(value)}" for key, value in sorted(config.items()))
    return _lines(*lines)


def format_update_controller_config(addresses: Sequence[str] | None, key: str, value: Any) -> str:
    """``updateControllerConfig``: ``update controller config success![a, b]`` then ``<key> : <value>``."""
    servers = "" if not addresses else "[" + ", ".join(addresses) + "]"
    return f"update controller config success!{servers}\n{key} : {java_str(value)}"


# -- topics: updateTopic, deleteTopic, topicRoute, topicList ----------------------------------------

def format_topic_route(header: Mapping[str, Any]) -> str:
    """``topic-route``: ``#Topic``, ``#QueueNums``, then one ``#Queue\t<id>\t<broker name>`` line per
    queue in id order (a GetTopicRoute or CreateTopic header ``{"topic", "queues": [[id, name]]}``)."""
    queues = sorted(header.get("queues") or [], key=lambda q: int(q[0]))
    lines = [_kv("Topic", header.get("topic")), _kv("QueueNums", len(queues))]
    lines.extend(f"#Queue\t{int(queue_id)}\t{java_str(name)}" for queue_id, name in queues)
    return _lines(*lines)


def format_update_topic(header: Mapping[str, Any]) -> str:
    """``update-topic``: ``create topic <t> to controller success.`` (or ``... unchanged.`` when the
    topic already had that many queues), then its route."""
    topic = header.get("topic")
    first = (f"create topic {topic} to controller success." if header.get("created")
             else f"topic {topic} unchanged: it already has {len(header.get('queues') or [])} queues.")
    return _lines(first, format_topic_route(header))


def format_delete_topic(topic: str) -> str:
    """``delete-topic``: mqadmin's ``delete topic [<t>] from cluster [<c>] success.`` with the controller."""
    return f"delete topic [{topic}] from controller success."


def format_topic_list(topics: Mapping[str, Any]) -> str:
    """``topic-list``: one ``<topic>\t<queue count>`` line per topic in name order; ``(no topics)``."""
    if not topics:
        return "(no topics)"
    return _lines(*(f"{name}\t{java_str(count)}" for name, count in sorted(topics.items())))


# -- users and ACL rules: createUser, updateUser, deleteUser, listUser, createAcl, ..., listAcl ------

ACL_ROW_FORMAT = "{:<16}  {:<22}  {:<22}  {}"
AUTH_EVENT_TYPES = ("PutUserEvent", "DeleteUserEvent", "SetAclEvent")


def _user_type(superuser: bool) -> str:
    return "Super" if superuser else "Normal"


def format_user_change(verb: str, name: str, superuser: bool, changed: bool, secret: str | None = None) -> str:
    """``user create|update``: ``<verb> user <name> to controller success.`` (``user <name> unchanged.``
    when nothing was replicated), ``#User``, ``#UserType``, and ``#Secret`` when one was generated."""
    first = f"{verb} user {name} to controller success." if changed else f"user {name} unchanged."
    lines = [first, _kv("User", name), _kv("UserType", _user_type(superuser))]
    if secret is not None:
        lines.append(_kv("Secret", secret))
    return _lines(*lines)


def format_user_deleted(name: str) -> str:
    return f"delete user {name} from controller success."


def format_users(users: Iterable[Sequence[Any]]) -> str:
    """``user list``: ``#User  #UserType`` then one row per ``(name, superuser)``; ``(no users)``."""
    rows = [f"{name:<16}  {_user_type(bool(superuser))}" for name, superuser in users]
    if not rows:
        return "(no users)"
    return _lines(f"{'#User':<16}  #UserType", *rows)


def format_acl_rules(rows: Iterable[Sequence[Any]], first_line: str | None = None) -> str:
    """``acl ...``: an optional first line, then mqadmin's columns ``#User #Resource #Actions
    #Decision``, one row per ``(user, resource, actions, decision)``; ``(no rules)`` when none."""
    lines = [] if first_line is None else [first_line]
    body = [ACL_ROW_FORMAT.format(user, resource, ",".join(actions), decision)
            for user, resource, actions, decision in rows]
    if body:
        lines.append(ACL_ROW_FORMAT.format("#User", "#Resource", "#Actions", "#Decision"))
        lines.extend(body)
    else:
        lines.append("(no rules)")
    return _lines(*lines)


# -- getControllerEvents (rocketray's own) ----------------------------------------------------------

_EVENT_STATE_KEYS = ("index", "seq", "term", "time_ms", "type", "broker_name", "master_broker_id", "master_epoch",
                     "sync_state_set", "sync_state_set_epoch")


def _utc(time_ms: Any) -> str:
    if time_ms is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(int(time_ms) / 1000, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(time_ms) % 1000:03d}Z"


def _event_field(key: str, value: Any) -> str:
    if key == "broker_names" and isinstance(value, (list, tuple)):  # a topic's queues: the count
        return f"queues={len(value)}"
    if key == "credential" and isinstance(value, Mapping):  # a user's record: its rounds, never a key
        return f"iterations={java_str(value.get('iterations'))}"
    if key == "rules" and isinstance(value, (list, tuple)):
        return "rules=[" + "; ".join(map(str, value)) + "]"
    return f"{key}={java_str(value)}"


def format_controller_events(events: Sequence[Mapping[str, Any]], uncovered: Sequence[Sequence[int]] = ()) -> str:
    """One line per event: ``<index>.<seq> <UTC time> <type> <group> <event fields> ->
    master=<id> epoch=<e> sss=[...]@<e>``, then a warning line per index range no controller logged.
    Topic events have no group (``-``), show their queue count and end with ``-> (topic table)``;
    user and ACL events likewise end with ``-> (users and ACLs)`` (a user's record shows only its
    iteration count)."""
    lines = []
    for e in events:
        details = " ".join(_event_field(k, v) for k, v in e.items() if k not in _EVENT_STATE_KEYS)
        if e.get("master_epoch") is not None:
            after = (f"master={java_str(e.get('master_broker_id'))} epoch={e.get('master_epoch')} "
                     f"sss={e.get('sync_state_set')}@{e.get('sync_state_set_epoch')}")
        elif e["type"] in AUTH_EVENT_TYPES:
            after = "(users and ACLs)"
        else:
            after = "(topic table)" if "topic" in e else "(group removed)"
        lines.append(f"{e['index']}.{e.get('seq', 0)}\t{_utc(e.get('time_ms'))}\t{e['type']}\t"
                     f"{e.get('broker_name') or '-'}\t{details}\t-> {after}")
    for first, last in uncovered:
        lines.append(f"# entries {first}..{last} were not logged by any reachable controller")
    return "\n".join(lines) if lines else "(no events)"

