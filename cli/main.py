"""The ``rocketray`` command line.

Each subcommand lives in its own module under ``cli/commands/`` and exposes
``add_parser(subparsers)`` (which registers its arguments and sets ``func``)
so that independent features never edit the same file.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from rocketray import __version__

#: Subcommand modules, in the order ``rocketray --help`` lists them.
COMMAND_MODULES = (
    "demo",
    "cluster",
    "admin",
    "chaos",
    "analytics",
    "simulate",
)

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rocketray",
        description="RocketMQ controller-mode high availability on Ray actors.",
    )
    parser.add_argument("--version", action="version", version=f"rocketray {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"rocketray.cli.commands.{name}").add_parser(subparsers)
    return parser


#: What the ``server`` extra installs: a command that needs one of them says how to get it.
SERVER_MODULES = frozenset({"ray", "raydp", "pyspark", "pysyncobj", "pandas", "pyarrow", "matplotlib", "yaml", "tqdm"})


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        func = getattr(args, "func", None)
        if func is None:
            parser.print_help()
            return EXIT_USAGE
        return int(func(args) or 0)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in SERVER_MODULES:
            raise
        print(f"error: this command needs the cluster's packages ({exc.name} is not installed); install them "
              "with: pip install 'rocketray[server]' (the base install is the client library alone)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
