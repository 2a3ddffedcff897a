"""``kinesis-dstream leases``: ``status``, ``reset``, ``release`` and ``create-table``.

Exit codes (every sub-command of the operator's command line):
0 done; 1 done, and found something to act on (``status --expiry``: expired leases);
2 usage or bad input (an unknown application, table, stream or shard, a malformed position),
nothing written; 3 the service could not be reached, refused the credentials or failed.
"""
from __future__ import annotations

import argparse
import sys

from . import create_table, reset, status
from .connection import main_of

EPILOG = ("exit codes: 0 done; 1 a finding (status --expiry: expired leases); 2 usage or "
          "bad input, nothing written; 3 service unreachable, credentials refused or failing")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="kinesis-dstream leases", epilog=EPILOG,
                                  description="Read and move the leases of a KCL application.")
    # No required=True: amazon-kclpy pulls in the PyPI argparse 1.4, which lacks it.
    commands = top.add_subparsers(dest="command", metavar="COMMAND")
    status.add_parser(commands)
    reset.add_parsers(commands)
    create_table.add_parser(commands)
    for name in ("status", "reset", "release", "create-table"):
        commands.choices[name].epilog = EPILOG
    return top


def main(argv: list[str]) -> int:
    return main_of(parser, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
