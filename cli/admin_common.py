"""What every ``rocketray admin`` command shares: its flags, the connection to a running cluster,
the leader call, JSON output and the mapping of errors to exit codes.

The command modules (``cli/commands/admin.py``, ``admin_groups.py``, ``admin_auth.py``) import this
one; it imports none of them. A command is ``run(args, once)`` with ``once(cluster) -> (text,
json_obj)``: ``run`` connects (``connect_cluster``), calls ``once`` (repeatedly with ``-i``),
prints the text, or the JSON object with ``--json``, and turns a refused request
(``ResponseError``: ``<CODE_NAME> (<code>): <remark>`` on stderr, or ``{"code", "code_name",
"remark"}`` on stdout with ``--json``) or an unreachable cluster (``AdminError``) into exit 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any, Callable

from rocketray.cli import admin_format as fmt
from rocketray.cli.options import add_cluster_flags
from rocketray.wire.controller_headers import header_fields

__all__ = ["AdminError", "EXIT_ERROR", "EXIT_OK", "EXIT_USAGE", "ResponseError", "add_common_flags",
           "add_repeat_flags", "call", "code_name", "connect_cluster", "dumps", "response_json", "run", "run_request"]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2


class AdminError(RuntimeError):
    """A command could not run (no cluster, no controller answered, bad arguments)."""


class ResponseError(RuntimeError):
    """A controller answered with a non-SUCCESS code."""

    def __init__(self, code: int, remark: str):
        super().__init__(fmt.format_error(code, remark))
        self.code = int(code)
        self.remark = remark

    def to_json(self) -> dict:
        return {"code": self.code, "code_name": code_name(self.code), "remark": self.remark}


def code_name(code: int) -> str:
    from rocketray.wire.controller_codes import ResponseCode

    try:
        return ResponseCode(code).name
    except ValueError:
        return "UNKNOWN"


def add_common_flags(p: argparse.ArgumentParser) -> None:
    """``--address``, ``--name`` and ``--json``: on every admin command."""
    add_cluster_flags(p)
    p.add_argument("--json", action="store_true", help="print machine-readable JSON instead of mqadmin lines")


def add_repeat_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-i", "--interval", type=float, default=None, metavar="SECONDS",
                   help="repeat every SECONDS until Ctrl-C")
    p.add_argument("--count", type=int, default=None, help="with -i: stop after this many rounds")


def connect_cluster(address: str, name: str):
    """The running cluster ``name``; joins Ray at ``address`` unless this process already has."""
    import ray

    from rocketray.actors.cluster import ClusterError, connect

    if not ray.is_initialized():
        try:
            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise AdminError(f"cannot connect to Ray at {address!r}: {exc}") from exc
    try:
        return connect(name)
    except ClusterError as exc:
        raise AdminError(str(exc)) from exc


def dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=lambda o: sorted(o) if isinstance(o, (set, frozenset)) else str(o))


def call(cluster, request):
    """The leader's SUCCESS response to ``request``; ResponseError / AdminError otherwise."""
    from rocketray.actors.controller_client import ControllerUnavailable

    try:
        response = cluster.call_controller(request)
    except ControllerUnavailable as exc:
        raise AdminError(str(exc)) from exc
    if not response.ok:
        raise ResponseError(int(response.code), response.remark)
    return response


def response_json(response) -> dict:
    return {"code": int(response.code), "code_name": response.code.name, "remark": response.remark,
            "header": header_fields(response.header), "body": response.body}


def run(args: argparse.Namespace, once: Callable[[Any], tuple[str, Any]]) -> int:
    """Connect, run ``once(cluster) -> (text, json_obj)`` (repeatedly with -i), print, map errors."""
    try:
        cluster = connect_cluster(args.address, args.name)
        interval = getattr(args, "interval", None)
        count = getattr(args, "count", None)
        rounds = 0
        while True:
            text, obj = once(cluster)
            print(dumps(obj) if args.json else text, flush=True)
            rounds += 1
            if interval is None or (count is not None and rounds >= count):
                return EXIT_OK
            if not args.json:
                print(flush=True)
            time.sleep(max(0.0, interval))
    except KeyboardInterrupt:
        return EXIT_OK
    except ResponseError as exc:
        if args.json:
            print(dumps(exc.to_json()), flush=True)
        else:
            print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_ERROR
    except AdminError as exc:
        if args.json:
            print(dumps({"code": None, "code_name": "UNAVAILABLE", "remark": str(exc)}), flush=True)
        else:
            print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_ERROR


def run_request(args: argparse.Namespace, request: Any, text_of: Callable[[Any], str]) -> int:
    """``run`` of one leader request: prints ``text_of(response)``, or the answer as JSON."""
    def once(cluster):
        response = call(cluster, request)
        return text_of(response), response_json(response)

    return run(args, once)
