"""``rocketray admin consumer-progress``: mqadmin's consumerProgress for rocketray's consumer groups.

Per queue a group has committed: the broker group holding it, the queue's max offset, the group's
committed offset and the difference (lag), asked of each broker group's master through
``rocketray.client.Admin.consumer_progress``. ``-g a,b`` reports several groups; ``--json`` prints
``{group: [{"topic", "queue_id", "broker_group", "committed_offset", "max_offset", "lag"}, ...]}``.
"""

from __future__ import annotations

import argparse

from rocketray.cli.admin_common import AdminError, add_common_flags, add_repeat_flags, run


def add_group_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("consumer-progress", help="a consumer group's committed offset, max offset and lag per queue")
    add_common_flags(p)
    p.add_argument("-g", "--group", required=True, metavar="GROUP[,GROUP...]", help="consumer group(s)")
    add_repeat_flags(p)
    p.set_defaults(func=run_consumer_progress)


def format_progress(rows_by_group: dict[str, list[dict]]) -> str:
    """mqadmin's consumerProgress layout, one block per group."""
    out = []
    for group, rows in rows_by_group.items():
        out.append(f"#Group  {group}")
        out.append(f"{'#Topic':<32}{'#Broker Name':<16}{'#QID':<6}{'#Broker Offset':<16}{'#Consumer Offset':<18}#Diff")
        for r in rows:
            out.append(f"{r['topic']:<32}{r['broker_group']:<16}{r['queue_id']:<6}{r['max_offset']:<16}"
                       f"{r['committed_offset']:<18}{r['lag']}")
        out.append(f"Diff Total: {sum(r['lag'] for r in rows)}")
    return "\n".join(out)


def run_consumer_progress(args: argparse.Namespace) -> int:
    from rocketray.client import Admin, ClientError
    from rocketray.client.ray_transport import RayTransport

    groups = [g for g in args.group.split(",") if g]

    def once(cluster):
        client_admin = Admin(transport=RayTransport(cluster))
        result: dict[str, list[dict]] = {}
        try:
            for group in groups:
                result[group] = [{"topic": p.topic, "queue_id": p.queue_id, "broker_group": p.broker_group,
                                  "committed_offset": p.committed_offset, "max_offset": p.max_offset, "lag": p.lag}
                                 for p in client_admin.consumer_progress(group)]
        except ClientError as exc:
            raise AdminError(str(exc)) from exc
        return format_progress(result), result

    return run(args, once)
