"""``leases reset`` and ``leases release``: moving leases through the lease protocol.

Both write with the counter guard every lease write carries, bump the counter and remove the
owner. The holder's next renew or checkpoint then fails its guard: to it the lease is lost
(its processor gets lease_lost, nothing more of its is checkpointed), and whichever worker
takes the unowned lease (the holder itself, often) starts from the checkpoint in the table.
A write that loses the guard to a renew is read again and retried, a few times.

Every input is checked before anything is written: an unknown shard, a finished one, or a
sequence number outside the shard's range stops the command with nothing written.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any, Callable

from ..aws.kinesis import KinesisClient, Shard
from ..aws.lease_table import Lease, LeaseTable
from ..errors import LeaseLostError
from ..records import AT_TIMESTAMP, TRIM_HORIZON, ExtendedSequenceNumber
from .connection import (
    EXIT_OK,
    BadInput,
    Connection,
    add_connection_flags,
    connect,
    emit_json,
    emit_table,
    list_shards,
)
from .positions import SEQUENCE, Target, parse_position, split_lease_key

GUARD_ATTEMPTS = 5
# GetRecords pages read to find the first record at a timestamp (real Kinesis can answer
# with empty pages before it); past them the shard is taken to have none yet.
TIMESTAMP_PAGES = 5
# Looking back for the newest record before a time no record has arrived since: windows
# widen fourfold from 1 s up to a year (Kinesis keeps records at most 365 days).
LOOK_BACK_LIMIT_S = 366 * 86400.0
LOOK_BACK_PAGES = 20


@dataclass
class Move:
    """One lease to write: its state when planned and the checkpoint it gets."""

    lease: Lease
    shard_id: str
    to: ExtendedSequenceNumber
    note: str = ""
    written: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"lease_key": self.lease.lease_key, "shard": self.shard_id,
                "owner_before": self.lease.lease_owner,
                "counter_before": self.lease.lease_counter,
                "checkpoint_before": _checkpoint_json(self.lease.checkpoint),
                "checkpoint_after": _checkpoint_json(self.to) if self.to else None,
                "note": self.note or None, "written": self.written}


def _checkpoint_json(position: ExtendedSequenceNumber) -> dict[str, Any]:
    return {"sequence_number": position.sequence_number,
            "sub_sequence_number": position.sub_sequence_number}


def add_parsers(commands: Any) -> None:
    reset = commands.add_parser("reset", help="move checkpoints, safely while the application runs")
    add_connection_flags(reset, stream_help="the stream (required unless the lease keys name it)")
    which = reset.add_mutually_exclusive_group(required=True)
    which.add_argument("--shard", action="append", metavar="ID",
                       help="a shard id or lease key (repeat for more)")
    which.add_argument("--all", action="store_true", help="every shard not yet finished")
    reset.add_argument("--to", required=True, metavar="POSITION",
                       help="TRIM_HORIZON, LATEST, AT_TIMESTAMP:<ISO 8601>, SEQ or SEQ/SUB")
    reset.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    reset.set_defaults(handler=reset_leases)

    release = commands.add_parser("release", help="hand back the leases of a worker that is gone")
    add_connection_flags(release, stream_help="unused; accepted for symmetry")
    release.add_argument("--worker", required=True, help="the worker id (leaseOwner)")
    release.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    release.set_defaults(handler=release_leases)


def reset_leases(args: argparse.Namespace) -> int:
    target = parse_position(args.to)  # before any call: a typo costs nothing
    connection = connect(args)
    connection.check_table()
    leases = {lease.lease_key: lease for lease in connection.table.list_leases()}
    chosen = _choose(leases, args.shard, args.all, connection.table_name)
    streams = {split_lease_key(lease.lease_key)[0] or args.stream for lease in chosen}
    if None in streams:
        raise BadInput("--stream is needed: the lease keys of table "
                       f"{connection.table_name!r} do not name their stream")
    shards = {stream: list_shards(connection, stream) for stream in streams}
    moves = []
    for lease in chosen:
        stream, shard_id = split_lease_key(lease.lease_key)
        stream = stream or args.stream
        shard = shards[stream].get(shard_id)
        if shard is None:
            raise BadInput(f"shard {shard_id} is in table {connection.table_name!r} but not in "
                           f"stream {stream!r}: wrong --stream?")
        kinesis = connection.kinesis(stream)
        to, note = _resolve(kinesis, shard, target)
        moves.append(Move(lease, shard_id, to, note))
    if not args.dry_run:
        for move in moves:
            def reset(lease: Lease, to: ExtendedSequenceNumber = move.to) -> Lease:
                return connection.table.reset_checkpoint(lease, to)

            _write(connection.table, move, reset)
    _report(args, connection, moves, {"to": str(target)})
    return EXIT_OK


def _choose(leases: dict[str, Lease], wanted: list[str] | None, every: bool,
            table: str) -> list[Lease]:
    if every:
        chosen = [lease for lease in leases.values() if not lease.is_finished]
        if not chosen:
            raise BadInput(f"table {table!r} has no lease to reset")
        return sorted(chosen, key=lambda lease: lease.lease_key)
    by_shard = {split_lease_key(key)[1]: lease for key, lease in leases.items()}
    chosen = []
    for name in dict.fromkeys(wanted or []):
        lease = leases.get(name) or by_shard.get(name)
        if lease is None:
            raise BadInput(f"no lease for shard {name!r} in table {table!r}")
        if lease.is_finished:
            raise BadInput(f"shard {name!r} is finished (SHARD_END): reading it again would "
                           "come after its children")
        chosen.append(lease)
    return chosen


def _resolve(kinesis: KinesisClient, shard: Shard,
             target: Target) -> tuple[ExtendedSequenceNumber, str]:
    """The checkpoint to write for ``target`` on ``shard``, and a note on how it was found."""
    if target.kind == SEQUENCE:
        assert target.position is not None
        _check_in_range(kinesis, shard, target.position.sequence_number)
        return target.position, ""
    if target.kind != AT_TIMESTAMP:
        return ExtendedSequenceNumber(target.kind), ""
    iterator: str | None = kinesis.get_shard_iterator(shard.shard_id, AT_TIMESTAMP,
                                                      timestamp=target.timestamp)
    for _ in range(TIMESTAMP_PAGES):
        if iterator is None:
            break
        answer = kinesis.get_records(iterator, 1, shard_id=shard.shard_id)
        if answer.get("Records"):
            first = str(answer["Records"][0]["SequenceNumber"])
            # Sub-sequence -1: before the record's first sub-record, so reading resumes at it.
            return ExtendedSequenceNumber(first, -1), f"first record at or after: {first}"
        iterator = answer.get("NextShardIterator")
        if not iterator or not answer.get("MillisBehindLatest"):
            break
    assert target.timestamp is not None
    newest = _newest_before(kinesis, shard.shard_id, target.timestamp.timestamp())
    if newest is None:
        return ExtendedSequenceNumber(TRIM_HORIZON), "no record before or after that time: TRIM_HORIZON"
    return newest, f"no record at or after that time yet: after the newest before it, {newest}"


def _newest_before(kinesis: KinesisClient, shard_id: str,
                   timestamp: float) -> ExtendedSequenceNumber | None:
    """The newest user record that arrived before ``timestamp`` (all of its aggregate), or None.

    Used when no record has arrived since ``timestamp``: a checkpoint right after the newest
    record reads every record put later, as LATEST would not (records put between the reset
    and a worker opening the shard would be skipped). Looks back in widening windows, so a
    quiet shard costs a few calls and a busy one reads little before ``timestamp``.
    """
    # Here, not at the top: the KPL module loads protobuf, which only this look-up needs,
    # and every other sub-command (``leases status`` first) would pay for loading it.
    from ..aws.kpl import deaggregate, epoch_ms

    window_s = 1.0
    while window_s <= LOOK_BACK_LIMIT_S:
        iterator: str | None = kinesis.get_shard_iterator(shard_id, AT_TIMESTAMP,
                                                          timestamp=timestamp - window_s)
        newest = None
        for _ in range(LOOK_BACK_PAGES):
            if iterator is None:
                break
            answer = kinesis.get_records(iterator, 10_000, shard_id=shard_id)
            # Records put after the look-up began (at or after the time) are not before it.
            before = [r for r in answer.get("Records", [])
                      if epoch_ms(r.get("ApproximateArrivalTimestamp")) < timestamp * 1000]
            if before:
                newest = deaggregate(before[-1:], shard_id)[-1].extended_sequence_number
            iterator = answer.get("NextShardIterator")
            if not answer.get("MillisBehindLatest"):
                break
        if newest is not None:
            return newest
        window_s *= 4
    return None


def _check_in_range(kinesis: KinesisClient, shard: Shard, sequence: str) -> None:
    """A sequence number within the shard's range and not trimmed, or BadInput."""
    value = int(sequence)
    if shard.starting_sequence_number and value < int(shard.starting_sequence_number):
        raise BadInput(f"sequence number {sequence} is before shard {shard.shard_id}'s first "
                       f"({shard.starting_sequence_number})")
    if shard.ending_sequence_number and value > int(shard.ending_sequence_number):
        raise BadInput(f"sequence number {sequence} is after shard {shard.shard_id}'s last "
                       f"({shard.ending_sequence_number}): the shard is closed")
    answer = kinesis.get_records(kinesis.get_shard_iterator(shard.shard_id, TRIM_HORIZON), 1,
                                 shard_id=shard.shard_id)
    records = answer.get("Records") or []
    if records and value < int(records[0]["SequenceNumber"]):
        raise BadInput(f"sequence number {sequence} of shard {shard.shard_id} is older than its "
                       f"retention: the oldest record kept is {records[0]['SequenceNumber']}")


def release_leases(args: argparse.Namespace) -> int:
    connection = connect(args)
    connection.check_table()
    held = [lease for lease in connection.table.list_leases() if lease.lease_owner == args.worker]
    if not held:
        raise BadInput(f"worker {args.worker!r} holds no lease in table {connection.table_name!r}")
    moves = [Move(lease, split_lease_key(lease.lease_key)[1], lease.checkpoint) for lease in held]
    if not args.dry_run:
        for move in moves:
            _write(connection.table, move, connection.table.evict_lease, owner=args.worker)
    _report(args, connection, moves, {"worker": args.worker})
    return EXIT_OK


def _write(table: LeaseTable, move: Move, write: Callable[[Lease], Lease],
           owner: str | None = None) -> None:
    """``write`` under the counter guard; a renew in between means: read again, try again.
    With ``owner``, a lease that changed hands meanwhile is left alone."""
    lease = move.lease
    for _ in range(GUARD_ATTEMPTS):
        try:
            write(lease)
            move.written = True
            return
        except LeaseLostError:
            fresh = table.get_lease(lease.lease_key)
            if fresh is None:
                raise BadInput(f"lease {lease.lease_key} was deleted meanwhile") from None
            if owner is not None and fresh.lease_owner != owner:
                move.note = f"now held by {fresh.lease_owner or 'nobody'}: left alone"
                return
            lease = fresh
    raise LeaseLostError(f"lease {lease.lease_key} changed at every one of {GUARD_ATTEMPTS} "
                         "tries; nothing written to it")


def _report(args: argparse.Namespace, connection: Connection, moves: list[Move],
            extra: dict[str, Any]) -> None:
    if args.json:
        emit_json({"table": connection.table_name, "application": args.app,
                   "dry_run": args.dry_run, **extra, "leases": [m.to_json() for m in moves]})
        return
    emit_table(["SHARD", "OWNER", "COUNTER", "CHECKPOINT", "->", "NEW CHECKPOINT", "NOTE"],
               [[m.shard_id, m.lease.lease_owner or "-", str(m.lease.lease_counter),
                 str(m.lease.checkpoint), "->", str(m.to) if m.to else "-",
                 m.note or ("written" if m.written else "")] for m in moves])
    verb = "would write" if args.dry_run else "wrote"
    done = len(moves) if args.dry_run else sum(m.written for m in moves)
    sys.stdout.write(f"\n{verb} {done} of {len(moves)} lease(s) in table {connection.table_name}"
                     f"{' (dry run: nothing written)' if args.dry_run else ''}\n")
