"""``kinesis-dstream consumers``: ``list`` a stream's fan-out consumers, ``deregister`` one.

A registered consumer is billed per shard-hour and a stream allows 20. The SQL source
deregisters its consumer when its query stops, as the options say, but one outlives its
query when the query failed, when the options keep it (Databricks' default), when the
driver was killed, or when it was stopped before its first batch: ``list`` shows them,
marks those the SQL source names after a query (``kinesis-dstream-sql-<query id>``, no
``consumerName`` given) and says how long each has been registered; ``deregister`` removes
one by name. A worker (DStream, multilang) never deregisters its consumer: list it here
when the application is retired.

Exit codes as ``leases``: 0 done; 1 ``list --older-than-minutes`` found some; 2 usage or a
name that does not exist; 3 the service unreachable, refusing or failing.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import sys
from typing import Any

from ..aws.kinesis import KinesisClient
from ..aws.stream_consumer import (
    QUERY_CONSUMER_PREFIX,
    consumer_arn_named,
    deregister_stream_consumer,
    list_stream_consumers,
)
from ..config import ConsumerConfig
from ..errors import StreamNotFoundError
from .connection import (
    EXIT_FINDING,
    EXIT_OK,
    OPERATOR_RETRY,
    BadInput,
    emit_json,
    emit_table,
    main_of,
)

EPILOG = ("exit codes: 0 done; 1 a finding (list --older-than-minutes: some are); 2 usage or "
          "bad input; 3 service unreachable, credentials refused or failing")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="kinesis-dstream consumers", epilog=EPILOG,
                                  description="The enhanced fan-out consumers of a stream.")
    commands = top.add_subparsers(dest="command", metavar="COMMAND")
    listing = commands.add_parser("list", help="every consumer, its status and age",
                                  epilog=EPILOG)
    _stream_flags(listing)
    listing.add_argument("--older-than-minutes", type=float,
                         help="only those registered longer; exit 1 if there are any")
    listing.set_defaults(handler=list_consumers)
    removing = commands.add_parser("deregister", help="deregister one consumer by name",
                                   epilog=EPILOG)
    _stream_flags(removing)
    removing.add_argument("--name", required=True, help="the consumer's name")
    removing.set_defaults(handler=deregister)
    return top


def _stream_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stream", required=True, help="the stream")
    parser.add_argument("--region", help="AWS region (default: AWS_REGION, AWS_DEFAULT_REGION)")
    parser.add_argument("--kinesis-endpoint",
                        help="Kinesis endpoint URL (default: AWS_ENDPOINT_URL_KINESIS, else AWS)")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


def _kinesis(args: argparse.Namespace) -> KinesisClient:
    config = ConsumerConfig(application_name="kinesis-dstream-consumers",
                            stream_name=args.stream, metrics_level="NONE",
                            kinesis_endpoint=args.kinesis_endpoint,
                            **({"region_name": args.region} if args.region else {}),
                            **OPERATOR_RETRY)
    return KinesisClient(config)


def describe(consumer: dict[str, Any], now: _dt.datetime) -> dict[str, Any]:
    """One consumer as the command shows it."""
    created = consumer.get("ConsumerCreationTimestamp")
    if isinstance(created, (int, float)):  # our clients leave timestamps as epoch seconds
        created = _dt.datetime.fromtimestamp(created, _dt.timezone.utc)
    age_min = round((now - created).total_seconds() / 60.0, 1) \
        if isinstance(created, _dt.datetime) else None
    name = consumer["ConsumerName"]
    return {"name": name, "status": consumer.get("ConsumerStatus"),
            "created": created.isoformat() if isinstance(created, _dt.datetime) else None,
            "age_minutes": age_min, "arn": consumer.get("ConsumerARN"),
            "sql_query": name[len(QUERY_CONSUMER_PREFIX):]
            if name.startswith(QUERY_CONSUMER_PREFIX) else None}


def list_consumers(args: argparse.Namespace) -> int:
    try:
        found = list_stream_consumers(_kinesis(args))
    except StreamNotFoundError as exc:
        raise BadInput(f"no stream {args.stream!r}: {exc}") from None
    now = _dt.datetime.now(_dt.timezone.utc)
    rows = sorted((describe(c, now) for c in found), key=lambda c: c["name"])
    if args.older_than_minutes is not None:
        rows = [r for r in rows if r["age_minutes"] is not None
                and r["age_minutes"] >= args.older_than_minutes]
    if args.json:
        emit_json({"stream": args.stream, "consumers": rows})
    else:
        emit_table(["consumer", "status", "registered", "age (min)", "named after SQL query"],
                   [[r["name"], str(r["status"]), str(r["created"]), str(r["age_minutes"]),
                     r["sql_query"] or "-"] for r in rows])
    return EXIT_FINDING if args.older_than_minutes is not None and rows else EXIT_OK


def deregister(args: argparse.Namespace) -> int:
    kinesis = _kinesis(args)
    try:
        arn = consumer_arn_named(kinesis, args.name)
    except StreamNotFoundError as exc:
        raise BadInput(f"no stream {args.stream!r}: {exc}") from None
    if arn is None or not deregister_stream_consumer(kinesis, arn):
        raise BadInput(f"stream {args.stream!r} has no consumer {args.name!r}")
    if args.json:
        emit_json({"stream": args.stream, "deregistered": args.name, "arn": arn})
    else:
        sys.stdout.write(f"deregistered consumer {args.name} of stream {args.stream}\n")
    return EXIT_OK


def main(argv: list[str]) -> int:
    return main_of(parser, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
