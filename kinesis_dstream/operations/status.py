"""``leases status``: every shard's owner, checkpoint and lag, and a summary.

Live or expired: the lease items hold no time, so a lease is known to be live the way the
KCL's taker knows it: its counter moved between two reads a failover time apart (the holder
renews every third of it). That costs the failover time and a second scan, so it is done on
request (``--expiry``); without it liveness is not reported. A lease with no owner is
neither: it waits for a taker.

Lag: one GetShardIterator and one GetRecords (``Limit`` 1) at each checkpoint, whose
``MillisBehindLatest`` says how far the checkpoint is behind the shard's tip. That is one
call of each per shard, well within the 5 a second per shard that Kinesis allows, though
it does share them with the application's readers; ``--no-lag`` makes no Kinesis call.
The shards are measured many at a time (the limits are per shard), and the Kinesis client
is made while DynamoDB answers, so a table of hundreds of shards takes seconds, not minutes.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import sys
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..aws.lease_table import Lease
from ..errors import KinesisDStreamError
from ..records import AT_TIMESTAMP, LATEST, TRIM_HORIZON
from .connection import (
    EXIT_FINDING,
    EXIT_OK,
    Connection,
    add_connection_flags,
    connect,
    emit_json,
    emit_table,
)
from .positions import split_lease_key

# Calls in flight at once: one per shard, so no shard's limits are approached; within the
# client's connection pool (50).
LAG_THREADS = 32


@dataclass
class ShardStatus:
    lease: Lease
    stream: str | None
    shard_id: str
    live: bool | None = None          # None: not checked, or nobody owns it
    stalled: bool = False             # lags, and its checkpoint did not move while watched
    lag_ms: int | None = None
    lag_note: str | None = None       # why there is no lag figure
    earlier: Lease | None = None      # with --expiry: the lease as the first read saw it

    def to_json(self) -> dict[str, Any]:
        lease = self.lease
        return {
            "lease_key": lease.lease_key, "stream": self.stream, "shard": self.shard_id,
            "owner": lease.lease_owner, "lease_counter": lease.lease_counter,
            "checkpoint": {"sequence_number": lease.checkpoint.sequence_number,
                           "sub_sequence_number": lease.checkpoint.sub_sequence_number},
            "pending_checkpoint": lease.pending_checkpoint,
            "parents": sorted(lease.parent_shard_ids),
            "finished": lease.is_finished, "live": self.live, "stalled": self.stalled,
            "lag_ms": self.lag_ms, "lag_note": self.lag_note,
        }


@dataclass
class Report:
    table: str
    application: str
    checked_at: str
    expiry_interval_ms: int | None
    shards: list[ShardStatus] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        leases = [s.lease for s in self.shards]
        workers: dict[str, int] = {}
        for lease in leases:
            if lease.lease_owner:
                workers[lease.lease_owner] = workers.get(lease.lease_owner, 0) + 1
        lagging = [s for s in self.shards if s.lag_ms is not None]
        worst = max(lagging, key=lambda s: s.lag_ms or 0, default=None)
        checked = self.expiry_interval_ms is not None
        return {
            "shards": len(leases),
            "owned": sum(1 for lease in leases if lease.lease_owner),
            "unowned": sum(1 for lease in leases if not lease.lease_owner and not lease.is_finished),
            "finished": sum(1 for lease in leases if lease.is_finished),
            "expired": sum(1 for s in self.shards if s.live is False) if checked else None,
            "workers": dict(sorted(workers.items())),
            "max_lag_ms": worst.lag_ms if worst else None,
            "max_lag_shard": worst.lease.lease_key if worst else None,
            "stalled": [s.lease.lease_key for s in self.shards if s.stalled] if checked else None,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table, "application": self.application, "checked_at": self.checked_at,
            "liveness": {"checked": self.expiry_interval_ms is not None,
                         "rule": "lease counter moved between two reads failover_ms apart",
                         "failover_ms": self.expiry_interval_ms},
            "shards": [s.to_json() for s in self.shards],
            "summary": self.summary(),
        }


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("status", help="every shard's owner, checkpoint and lag")
    add_connection_flags(parser, stream_help="stream, for the lag, when the lease keys do not "
                                             "name it (KCL single-stream tables)")
    parser.add_argument("--no-lag", action="store_true", help="make no Kinesis call")
    parser.add_argument("--expiry", action="store_true",
                        help="tell live from expired leases: read twice, --failover-ms apart")
    parser.add_argument("--failover-ms", type=int, default=10000,
                        help="the application's failover time (default 10000, the KCL's)")
    parser.set_defaults(handler=status)


def status(args: argparse.Namespace) -> int:
    connection = connect(args)
    with ThreadPoolExecutor(max_workers=LAG_THREADS) as pool:
        kinesis_ready = None if args.no_lag else pool.submit(connection.kinesis_api)
        report = read_report(args, connection)
        if kinesis_ready is not None:
            kinesis_ready.result()
            measure_lag(connection, report.shards, pool)
    if args.json:
        emit_json(report.to_json())
    else:
        print_report(report)
    return EXIT_FINDING if report.summary()["expired"] else EXIT_OK


def read_report(args: argparse.Namespace, connection: Connection) -> Report:
    """The table's leases (read twice with ``--expiry``), one row per shard, no lag yet."""
    connection.check_table()
    first = connection.table.list_leases()
    interval_ms = args.failover_ms if args.expiry else None
    leases = first
    if interval_ms is not None:
        time.sleep(interval_ms / 1000.0)
        leases = connection.table.list_leases()
    before = {lease.lease_key: lease for lease in first}
    report = Report(table=connection.table_name, application=args.app,
                    checked_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                    expiry_interval_ms=interval_ms)
    for lease in sorted(leases, key=lambda lease: lease.lease_key):
        stream, shard_id = split_lease_key(lease.lease_key)
        row = ShardStatus(lease, stream or args.stream, shard_id)
        earlier = before.get(lease.lease_key)
        if interval_ms is not None and lease.lease_owner and earlier is not None:
            row.live = earlier.lease_counter != lease.lease_counter
        row.earlier = earlier if interval_ms is not None else None
        report.shards.append(row)
    return report


def measure_lag(connection: Connection, rows: list[ShardStatus], pool: Executor) -> None:
    """Each row's lag at its checkpoint, many shards at a time; a failure is a note. With
    ``--expiry``, a row that lags and whose checkpoint did not move between the reads is
    stalled."""
    clients: dict[str, Any] = {}
    for row in rows:
        if row.stream is None:
            row.lag_note = "needs --stream"
        elif row.lease.is_finished:
            row.lag_note = "finished"
        elif row.lease.checkpoint.sequence_number == AT_TIMESTAMP:
            row.lag_note = "AT_TIMESTAMP: the time is the workers' setting"
        elif row.stream not in clients:
            clients[row.stream] = connection.kinesis(row.stream)
    todo = [row for row in rows if row.lag_note is None]
    for row, (lag, note) in zip(todo, pool.map(
            lambda r: _lag_of(clients[r.stream], r), todo), strict=True):
        row.lag_ms, row.lag_note = lag, note
    for row in rows:
        row.stalled = bool(row.earlier is not None and row.lag_ms
                           and row.earlier.checkpoint == row.lease.checkpoint)


def _lag_of(kinesis: Any, row: ShardStatus) -> tuple[int | None, str | None]:
    checkpoint = row.lease.checkpoint
    try:
        if checkpoint.sequence_number in (TRIM_HORIZON, LATEST):
            iterator = kinesis.get_shard_iterator(row.shard_id, checkpoint.sequence_number)
        else:
            iterator = kinesis.get_shard_iterator(row.shard_id, "AT_SEQUENCE_NUMBER",
                                                  sequence_number=checkpoint.sequence_number)
        answer = kinesis.get_records(iterator, 1, shard_id=row.shard_id)
    except KinesisDStreamError as exc:
        return None, str(exc)
    lag = answer.get("MillisBehindLatest")
    return (int(lag), None) if lag is not None else (None, "no MillisBehindLatest")


def print_report(report: Report) -> None:
    checked = report.expiry_interval_ms is not None
    rows = []
    for s in report.shards:
        lease = s.lease
        live = "-" if s.live is None else ("live" if s.live else "EXPIRED")
        lag = f"{s.lag_ms} ms" if s.lag_ms is not None else f"- ({s.lag_note})" if s.lag_note else "-"
        rows.append([s.stream or "-", s.shard_id, lease.lease_owner or "-",
                     str(lease.lease_counter), str(lease.checkpoint),
                     lease.pending_checkpoint or "-", ",".join(sorted(lease.parent_shard_ids)) or "-",
                     live, lag + (" STALLED" if s.stalled else "")])
    emit_table(["STREAM", "SHARD", "OWNER", "COUNTER", "CHECKPOINT", "PENDING", "PARENTS",
                "LIVE" if checked else "LIVE(--expiry)", "LAG"], rows)
    summary = report.summary()
    workers = ", ".join(f"{w}: {n}" for w, n in summary["workers"].items()) or "none"
    lines = [f"table {report.table}: {summary['shards']} shards, {summary['owned']} owned, "
             f"{summary['unowned']} unowned, {summary['finished']} finished",
             f"workers: {workers}"]
    if checked:
        lines.append(f"expired: {summary['expired']} (counter still after "
                     f"{report.expiry_interval_ms} ms); stalled: "
                     f"{', '.join(summary['stalled']) or 'none'}")
    else:
        lines.append("expired: not checked (--expiry reads twice, a failover time apart)")
    if summary["max_lag_ms"] is not None:
        lines.append(f"largest lag: {summary['max_lag_ms']} ms ({summary['max_lag_shard']})")
    sys.stdout.write("\n" + "\n".join(lines) + "\n")
