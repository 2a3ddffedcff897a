"""``kinesis-dstream`` command line: one sub-command per role, each living in its module."""
from __future__ import annotations

import importlib
import logging
import sys

# sub-command -> module whose ``main(argv) -> int`` runs it
COMMANDS = {
    "local": ("kinesis_dstream.local_command", "start local Kinesis and DynamoDB emulators"),
    "worker": ("kinesis_dstream.worker.process", "run one shard worker process"),
    "multilang": ("kinesis_dstream.multilang.daemon", "run a KCL properties file (MultiLangDaemon)"),
    "leases": ("kinesis_dstream.operations.leases", "status, reset, release, create-table of a lease table"),
    "checkpoint": ("kinesis_dstream.operations.checkpoint", "show a Structured Streaming checkpoint"),
    "consumers": ("kinesis_dstream.operations.consumers", "list or deregister a stream's fan-out consumers"),
}


def usage() -> str:
    lines = ["usage: kinesis-dstream COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(usage() + "\n")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        sys.stderr.write(f"kinesis-dstream: unknown command {command!r}\n{usage()}\n")
        return 2
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    module = importlib.import_module(COMMANDS[command][0])
    return int(module.main(rest) or 0)
