"""``rocketray admin consumer-progress`` and ``reset-offset``: mqadmin's consumerProgress and
resetOffset for rocketray's consumer groups.

consumer-progress: per queue a group has committed, the broker group holding it, the queue's max
offset, the group's committed offset and the difference (lag), asked of each broker group's master
through ``rocketray.client.Admin.consumer_progress`` (the group's retry topic ``%RETRY%<group>`` is
one of its topics), then the group's retry and dead-letter counts (``Admin.retry_stats``). ``-g
a,b`` reports several groups; ``--json`` prints ``{group: [{"topic", "queue_id", "broker_group",
"committed_offset", "max_offset", "lag"}, ...], "#retries": {group: {"retry_topic", "retry_exists",
"retried", "retry_pending", "dlq_topic", "dlq_exists", "dead_letters"}}}`` ('#' is in no group name).

reset-offset: moves a stopped group's committed offsets of one topic to ``earliest``, ``latest``, an
offset, or a time: an ISO-8601 time (``2026-11-28T09:30:00+01:00``; without an offset it is UTC)
or epoch milliseconds written ``@1764318600000`` (each queue's first message stored at or after it,
as mqadmin's resetOffsetByTime), back or forward (``Admin.reset_offsets``: a reset record per broker
group, which the brokers apply as an assignment; commits only ever raise an offset). Refused while the
group has live members (GROUP_ACTIVE); a member committing past the reset fails it (RESET_OVERTAKEN).
``--json`` prints ``[{"topic", "queue_id", "before", "after", "moved"}, ...]``.
"""

from __future__ import annotations

import argparse
import datetime
from typing import Any

from rocketray.cli.admin_common import AdminError, add_common_flags, add_repeat_flags, run

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def add_group_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("consumer-progress", help="a consumer group's committed offset, max offset and lag per queue")
    add_common_flags(p)
    p.add_argument("-g", "--group", required=True, metavar="GROUP[,GROUP...]", help="consumer group(s)")
    add_repeat_flags(p)
    p.set_defaults(func=run_consumer_progress)

    p = sub.add_parser("reset-offset", help="move a stopped consumer group's offsets of a topic (back or forward)")
    add_common_flags(p)
    p.add_argument("-g", "--group", required=True, help="consumer group (no live members)")
    p.add_argument("-t", "--topic", required=True, help="topic")
    p.add_argument("--to", required=True, type=reset_target, metavar="earliest|latest|OFFSET|TIME",
                   help="earliest (0), latest (each queue's end: skip the backlog), an offset (capped at the end), "
                        "or a time: ISO-8601 (UTC unless it has an offset) or @EPOCH_MS (each queue's first "
                        "message stored at or after it)")
    p.set_defaults(func=run_reset_offset)


def reset_target(text: str) -> str | int | datetime.datetime:
    """``--to``'s value: earliest, latest, an offset >= 0, or a time (an aware datetime): ISO-8601
    (UTC when it names no offset) or ``@`` and epoch milliseconds."""
    if text in ("earliest", "latest"):
        return text
    if text.startswith("@"):
        try:
            ms = int(text[1:])
            if ms >= 0:
                return _EPOCH + datetime.timedelta(milliseconds=ms)
        except (ValueError, OverflowError):
            pass
        raise argparse.ArgumentTypeError(f"@EPOCH_MS is '@' and milliseconds since 1970 (>= 0), not {text!r}")
    try:
        offset = int(text)
    except ValueError:
        try:
            moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected earliest, latest, an offset or a time (ISO-8601 or "
                                             f"@EPOCH_MS), not {text!r}") from None
        return moment if moment.tzinfo is not None else moment.replace(tzinfo=datetime.timezone.utc)
    if offset < 0:
        raise argparse.ArgumentTypeError(f"an offset is >= 0, not {offset}")
    return offset


def target_text(to: str | int | datetime.datetime) -> str:
    """How ``reset-offset`` names its target (a time as ISO-8601 UTC and epoch milliseconds)."""
    if isinstance(to, datetime.datetime):
        utc = to.astimezone(datetime.timezone.utc)
        return f"{utc.isoformat(timespec='milliseconds')} (@{(utc - _EPOCH) // datetime.timedelta(milliseconds=1)})"
    return str(to)


def client_transport(cluster: Any) -> Any:
    """The transport the commands' ``Admin`` uses (Ray calls: the CLI is a Ray driver)."""
    from rocketray.client.ray_transport import RayTransport

    return RayTransport(cluster)


def format_progress(rows_by_group: dict[str, list[dict]], retries: dict[str, dict] | None = None) -> str:
    """mqadmin's consumerProgress layout, one block per group, with its retry and dead-letter counts."""
    out = []
    retries = retries or {}
    for group, rows in rows_by_group.items():
        out.append(f"#Group  {group}")
        out.append(f"{'#Topic':<32}{'#Broker Name':<16}{'#QID':<6}{'#Broker Offset':<16}{'#Consumer Offset':<18}#Diff")
        for r in rows:
            out.append(f"{r['topic']:<32}{r['broker_group']:<16}{r['queue_id']:<6}{r['max_offset']:<16}"
                       f"{r['committed_offset']:<18}{r['lag']}")
        out.append(f"Diff Total: {sum(r['lag'] for r in rows)}")
        if group in retries:
            out.extend(format_retries(retries[group]))
    return "\n".join(out)


def format_retries(stats: dict) -> list[str]:
    """The group's retry and dead-letter lines under its table."""
    retry = (f"{stats['retried']} stored, {stats['retry_pending']} not consumed yet" if stats["retry_exists"]
             else "not created (nothing nacked)")
    dlq = f"{stats['dead_letters']} stored" if stats["dlq_exists"] else "not created (nothing dead-lettered)"
    return [f"Retry topic {stats['retry_topic']}: {retry}", f"Dead-letter topic {stats['dlq_topic']}: {dlq}"]


def format_reset(group: str, topic: str, to: str | int | datetime.datetime, rows: list[dict]) -> str:
    """One line per queue: the committed offset before and after; a queue already there says so."""
    out = [f"#Group  {group}  #Topic  {topic}  reset to {target_text(to)}",
           f"{'#QID':<6}{'#Old Offset':<14}#New Offset"]
    for r in rows:
        old = "-" if r["before"] is None else r["before"]
        note = "" if r["moved"] else "already there"
        out.append(f"{r['queue_id']:<6}{old!s:<14}{r['after']!s:<14}{note}".rstrip())
    out.append(f"moved {sum(r['moved'] for r in rows)} of {len(rows)} queues")
    return "\n".join(out)


def run_consumer_progress(args: argparse.Namespace) -> int:
    from rocketray.client import Admin, ClientError

    groups = [g for g in args.group.split(",") if g]

    def once(cluster):
        client_admin = Admin(transport=client_transport(cluster))
        result: dict[str, list[dict]] = {}
        retries: dict[str, dict] = {}
        try:
            for group in groups:
                result[group] = [{"topic": p.topic, "queue_id": p.queue_id, "broker_group": p.broker_group,
                                  "committed_offset": p.committed_offset, "max_offset": p.max_offset, "lag": p.lag}
                                 for p in client_admin.consumer_progress(group)]
                stats = client_admin.retry_stats(group)
                retries[group] = {name: getattr(stats, name) for name in (
                    "retry_topic", "retry_exists", "retried", "retry_pending", "dlq_topic", "dlq_exists", "dead_letters")}
        except ClientError as exc:
            raise AdminError(str(exc)) from exc
        return format_progress(result, retries), {**result, "#retries": retries}

    return run(args, once)


def run_reset_offset(args: argparse.Namespace) -> int:
    from rocketray.client import Admin, ClientError

    def once(cluster):
        try:
            changes = Admin(transport=client_transport(cluster)).reset_offsets(args.group, args.topic, args.to)
        except ClientError as exc:
            raise AdminError(f"{exc.code}: {exc}") from exc
        rows = [{"topic": c.queue.topic, "queue_id": c.queue.queue_id, "before": c.before, "after": c.after,
                 "moved": c.moved} for c in changes]
        return format_reset(args.group, args.topic, args.to, rows), rows

    return run(args, once)
