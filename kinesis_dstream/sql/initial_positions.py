"""Where each shard of a new query starts: ``kinesis.startingPosition``, or the checkpoints
of a KCL lease table (``kinesis.leaseTableName`` / ``kinesis.applicationName``).

A job moved to Structured Streaming from our DStream driver, our worker or multilang daemon
or the Java KCL 2.x/3.x (one table format) continues where it stopped. A checkpoint names
the last record processed, sub-sequence number included, and the offset position
``{"after": seq, "sub": k}`` means the same: reading resumes at the next user record, the
next one of a KPL aggregate processed in part. A SHARD_END checkpoint means the shard is
done; a shard without a row is done when a child has one (the KCL's lease clean-up deletes
finished parents), starts like a child (from its beginning) when its parents come from the
table, and otherwise where ``kinesis.startingPosition`` says. The table is read once, when
Spark asks a new query for its initial offset, and never written: a restarted query follows
its own checkpointLocation.
"""
from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any, Callable, Mapping, Sequence

from ..aws.kinesis import Shard
from ..aws.lease_table import LeaseTable
from ..config import ConsumerConfig
from ..errors import ConfigurationError, KinesisDStreamError, StreamNotFoundError
from ..records import AT_TIMESTAMP, LATEST, TRIM_HORIZON, ExtendedSequenceNumber
from ..retrieval import StartingPosition
from .option_table import APPLICATION_NAME, LEASE_TABLE_NAME, STARTING_POSITION

log = logging.getLogger(__name__)

# The table is read as the query starts: a wrong name, missing credentials or a dead
# endpoint fails it within seconds, not after the source's patient retries.
READ_RETRY: Mapping[str, Any] = {"retry_max_attempts": 2, "retry_wait_time_ms": 200,
                                 "connect_timeout_s": 2.0, "read_timeout_s": 5.0}


def child_start(start: StartingPosition) -> dict[str, Any]:
    """A shard read from its beginning (TRIM_HORIZON, or the AT_TIMESTAMP asked for): a
    child of a shard the query reads, or any shard when not starting at LATEST."""
    if start.type == AT_TIMESTAMP and start.timestamp is not None:
        return {"at": AT_TIMESTAMP, "ts": float(start.timestamp)}
    return {"at": TRIM_HORIZON}


def _from_checkpoint(shard: Shard, checkpoint: ExtendedSequenceNumber, start: StartingPosition,
                     pinned: float, table: str, name: str) -> dict[str, Any]:
    if checkpoint.is_shard_end:
        return {"ended": True}
    kind = checkpoint.sequence_number
    if kind == TRIM_HORIZON:
        return {"at": TRIM_HORIZON}
    if kind == LATEST:
        return {"ended": True} if shard.is_closed else {"at": AT_TIMESTAMP, "ts": pinned}
    if kind == AT_TIMESTAMP:
        if start.type != AT_TIMESTAMP or start.timestamp is None:
            raise ConfigurationError(
                f"shard {name} is checkpointed at AT_TIMESTAMP in lease table "
                f"{table!r}, which carries no time (each KCL worker reads it with its own "
                f"initial timestamp): give {STARTING_POSITION} AT_TIMESTAMP <ISO time>")
        return {"at": AT_TIMESTAMP, "ts": float(start.timestamp)}
    return {"after": kind, "sub": int(checkpoint.sub_sequence_number)}


# A sub-sequence number past any KPL aggregate's last user record: "after" it is after the
# whole Kinesis record (qubole's AFTER_SEQUENCE_NUMBER); -1 is before its first (AT_...).
_AFTER_WHOLE_RECORD, _BEFORE_WHOLE_RECORD = 2**31 - 1, -1


def _from_shard_start(shard: Shard, start: StartingPosition, pinned: float) -> dict[str, Any]:
    """qubole's per-shard start of one shard as an offset position."""
    if start.type == "SHARD_END" or (start.type == LATEST and shard.is_closed):
        return {"ended": True}
    if start.type == LATEST:
        return {"at": AT_TIMESTAMP, "ts": pinned}
    if start.type == AT_TIMESTAMP and start.timestamp is not None:
        return {"at": AT_TIMESTAMP, "ts": float(start.timestamp)}
    if start.type in ("AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER") and start.sequence_number:
        return {"after": start.sequence_number,
                "sub": _BEFORE_WHOLE_RECORD if start.type == "AT_SEQUENCE_NUMBER"
                else _AFTER_WHOLE_RECORD}
    return {"at": TRIM_HORIZON}


def initial_positions(listing: Sequence[Shard], start: StartingPosition, pinned: float,
                      checkpoints: Mapping[str, ExtendedSequenceNumber] | None = None,
                      table: str = "", key: Callable[[str], str] = str,
                      shard_starts: Mapping[str, StartingPosition] | None = None,
                      ) -> dict[str, dict[str, Any]]:
    """Each listed shard's offset position for a new query (pure: tested on its own).

    ``pinned`` is the query's start (epoch s), LATEST's fixed meaning so a re-run of the
    first reading reads the same records; ``checkpoints`` the lease table's, by shard id;
    ``shard_starts`` qubole's per-shard starts (a named shard's children start from their
    beginning and its parents are done, as with a checkpoint).
    A shard not to be read before its listed parents end says ``"wait": [parents]``.
    ``key`` names a shard in errors as the query knows it (``StreamSet.key``).
    """
    shard_starts = shard_starts or {}
    unknown = sorted(set(shard_starts) - {s.shard_id for s in listing})
    if unknown:
        log.warning("%s names shards the stream does not list (expired or mistyped): %s; "
                    "they are left out", STARTING_POSITION, ", ".join(key(s) for s in unknown))
    checkpoints = {**(checkpoints or {}),
                   **{s: ExtendedSequenceNumber(TRIM_HORIZON) for s in shard_starts}}
    listed = {s.shard_id: s for s in listing}
    children: dict[str, list[str]] = {}
    for shard in listing:
        for parent in shard.parent_shard_ids:
            children.setdefault(parent, []).append(shard.shard_id)

    @lru_cache(maxsize=None)
    def row_below(shard_id: str) -> bool:
        return any(c in checkpoints or row_below(c) for c in children.get(shard_id, ()))

    @lru_cache(maxsize=None)
    def from_table(shard_id: str) -> bool:
        return shard_id in checkpoints or any(
            p in listed and from_table(p) for p in listed[shard_id].parent_shard_ids)

    positions: dict[str, dict[str, Any]] = {}
    for shard_id in sorted(listed):
        shard = listed[shard_id]
        if shard_id in shard_starts:
            entry = _from_shard_start(shard, shard_starts[shard_id], pinned)
        elif shard_id in checkpoints:
            entry = _from_checkpoint(shard, checkpoints[shard_id], start, pinned, table,
                                     key(shard_id))
        elif row_below(shard_id):
            entry = {"ended": True}
        elif from_table(shard_id) or start.type != LATEST:
            entry = child_start(start)
        else:
            positions[shard_id] = ({"ended": True} if shard.is_closed
                                   else {"at": AT_TIMESTAMP, "ts": pinned})
            continue
        parents = [p for p in shard.parent_shard_ids if p in listed]
        if parents and not entry.get("ended"):
            entry["wait"] = parents
        positions[shard_id] = entry
    return positions


def lease_shard_id(lease_key: str, stream_name: str, several: bool = False) -> str | None:
    """The shard of a lease key of ``stream_name``: the key itself in a single-stream table,
    the last part of the KCL's multi-stream ``account:stream:creationEpoch:shardId``, None
    for another stream's. A query of ``several`` streams takes multi-stream keys only: a
    single-stream key does not say which stream it is of."""
    parts = lease_key.split(":")
    if len(parts) == 4:
        return parts[3] if parts[1] == stream_name else None
    return None if several else lease_key


def read_checkpoints(config: ConsumerConfig, table: str, application: str,
                     listing: Sequence[Shard], several: bool = False,
                     ) -> dict[str, ExtendedSequenceNumber]:
    """The checkpoints of ``config.stream_name``'s shards in lease ``table``, read only.

    Raises ConfigurationError naming the table and application when it does not exist or
    holds no lease of a listed shard (a wrong name must not start the query at LATEST), and
    our error with the same names when it cannot be read (credentials, endpoint).
    """
    where = (f"lease table {table!r} of application {application!r} (DynamoDB "
             f"{config.dynamodb_endpoint or 'endpoint of region ' + config.region_name})")
    try:
        leases = LeaseTable(config.replace(application_name=table, **READ_RETRY)).list_leases()
    except StreamNotFoundError as exc:  # DynamoDB's ResourceNotFoundException
        raise ConfigurationError(f"no {where}: is {APPLICATION_NAME} (or {LEASE_TABLE_NAME}) "
                                 f"right? ({exc})") from None
    except KinesisDStreamError as exc:
        raise type(exc)(f"reading {where} to start the query: {exc}") from exc
    checkpoints = {}
    for lease in leases:
        shard_id = lease_shard_id(lease.lease_key, config.stream_name, several)
        if shard_id is not None:
            checkpoints[shard_id] = lease.checkpoint
    listed = {s.shard_id for s in listing}
    if not set(checkpoints) & listed:
        raise ConfigurationError(
            f"the {where} holds no lease of a shard of stream {config.stream_name!r} "
            f"({len(leases)} leases): is it the table of this stream's application?")
    return checkpoints
