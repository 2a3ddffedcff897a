"""What the operator's sub-commands share: flags, clients with bounded retries, exit codes.

A command line must answer within seconds even when an endpoint is down or a name is wrong,
so its clients time out fast and retry little (``OPERATOR_RETRY``), unlike a worker's, which
waits out any outage. Errors become one line on stderr and an exit code (``EXIT_*``).
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import botocore.exceptions

from ..aws.clients import call, make_client
from ..aws.kinesis import KinesisClient, Shard
from ..aws.lease_table import LeaseTable
from ..config import ConsumerConfig
from ..errors import ConfigurationError, KinesisDStreamError, StreamNotFoundError

EXIT_OK = 0
EXIT_FINDING = 1      # the command worked and found something to act on (expired leases)
EXIT_BAD_INPUT = 2    # usage, or a name or position that does not exist or does not parse
EXIT_SERVICE = 3      # AWS (or the emulator) unreachable, refusing our credentials, or failing

# Two tries, short timeouts: an unreachable endpoint fails in a few seconds, not minutes.
OPERATOR_RETRY: dict[str, Any] = {"retry_max_attempts": 2, "retry_wait_time_ms": 200,
                  "connect_timeout_s": 2.0, "read_timeout_s": 5.0}


class BadInput(Exception):
    """A name or value given on the command line that is wrong: exit 2, nothing written."""


def add_connection_flags(parser: argparse.ArgumentParser, *, stream_help: str) -> None:
    parser.add_argument("--app", required=True, help="application name (KCL applicationName)")
    parser.add_argument("--table", help="lease table, when not named after the application")
    parser.add_argument("--stream", help=stream_help)
    parser.add_argument("--region", help="AWS region (default: AWS_REGION, AWS_DEFAULT_REGION)")
    parser.add_argument("--kinesis-endpoint",
                        help="Kinesis endpoint URL (default: AWS_ENDPOINT_URL_KINESIS, else AWS)")
    parser.add_argument("--dynamodb-endpoint",
                        help="DynamoDB endpoint URL (default: AWS_ENDPOINT_URL_DYNAMODB, else AWS)")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


@dataclass
class Connection:
    """The lease table of one application and, when a stream is known, its Kinesis client."""

    app: str
    table: LeaseTable
    config: ConsumerConfig
    _kinesis_api: Any = field(default=None, repr=False)

    @property
    def table_name(self) -> str:
        return self.table.table_name

    def kinesis_api(self) -> Any:
        """The one Kinesis client, made on first use: every stream of the table shares it
        (making one parses botocore's models, a noticeable share of a command's time)."""
        if self._kinesis_api is None:
            self._kinesis_api = make_client(self.config, "kinesis")
        return self._kinesis_api

    def kinesis(self, stream: str) -> KinesisClient:
        return KinesisClient(self.config.replace(stream_name=stream), client=self.kinesis_api())

    def check_table(self) -> None:
        """The table exists, or BadInput naming it (the application has no lease table)."""
        try:
            assert self.table.client is not None
            call(self.table.retry, self.table.client.describe_table,
                 f"describing lease table {self.table_name}",
                 expected=("ResourceNotFoundException",), TableName=self.table_name)
        except botocore.exceptions.ClientError:
            where = self.config.dynamodb_endpoint or "AWS"
            raise BadInput(f"no lease table {self.table_name!r} for application {self.app!r} "
                           f"at {where} (region {self.config.region_name}); is --app or "
                           "--table right?") from None


def connect(args: argparse.Namespace) -> Connection:
    table = args.table or args.app
    config = ConsumerConfig(
        application_name=table, stream_name=args.stream or table,
        **({"region_name": args.region} if args.region else {}),
        kinesis_endpoint=args.kinesis_endpoint, dynamodb_endpoint=args.dynamodb_endpoint,
        metrics_level="NONE", **OPERATOR_RETRY)
    return Connection(app=args.app, table=LeaseTable(config), config=config)


def list_shards(connection: Connection, stream: str) -> dict[str, Shard]:
    """The stream's shards by id, or BadInput naming a stream that does not exist."""
    try:
        return {s.shard_id: s for s in connection.kinesis(stream).list_shards()}
    except StreamNotFoundError as exc:
        raise BadInput(f"no stream {stream!r}: {exc}") from None


def main_of(parser: Callable[[], argparse.ArgumentParser], argv: list[str]) -> int:
    """A sub-command family's ``main``: parse (a usage error or a missing COMMAND is exit 2,
    ``--help`` is 0), then ``run`` the chosen handler."""
    try:
        args = parser().parse_args(argv)
        if args.command is None:
            parser().error("a COMMAND is required")
    except SystemExit as exc:
        return int(exc.code or 0) and EXIT_BAD_INPUT
    return run(args.handler, args)


def run(handler: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a sub-command; its errors become one line on stderr and an exit code.

    botocore's INFO lines (where it found credentials and endpoints) would bury the answer."""
    for name in ("botocore", "boto3"):
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        return handler(args)
    except (BadInput, ConfigurationError) as exc:
        sys.stderr.write(f"kinesis-dstream: {exc}\n")
        return EXIT_BAD_INPUT
    except KinesisDStreamError as exc:  # unreachable, credentials refused, retries spent
        sys.stderr.write(f"kinesis-dstream: {exc}\n")
        return EXIT_SERVICE


def emit_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=False) + "\n")


def emit_table(headers: list[str], rows: list[list[str]]) -> None:
    """Columns padded to their widest cell, for people."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    for line in [headers] + rows:
        cells = (cell.ljust(w) for cell, w in zip(line, widths, strict=True))
        sys.stdout.write("  ".join(cells).rstrip() + "\n")

