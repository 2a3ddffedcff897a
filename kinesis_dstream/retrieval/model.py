"""The retrieval model both Spark APIs share: what a batch reads of a shard, and what it read.

The driver plans a ``ShardRange`` per shard and batch; a task reads it and hands back a
``ReadReport`` (small, no records). Where a shard's next read starts is the batch-range
table's rule (``aws.range_table.start_after``), for the driver and the tasks alike.
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from ..aws.range_table import BatchRange
from ..errors import ConfigurationError
from ..records import AT_TIMESTAMP, LATEST, TRIM_HORIZON, ExtendedSequenceNumber, Record
from .peer_tls import PeerKey

# How long one read of one shard may last. Only a backlog reaches it: a shard that is caught
# up stops at its tip. A batch that reads a backlog is late anyway, and bigger reads spread
# each batch's fixed cost over more records. Record caps bound the batch's size.
MAX_FETCH_TIME_PER_SHARD_S = 5.0
# A handed-back iterator is used while younger than this: Kinesis expires it after 5 minutes.
ITERATOR_TTL_S = 240.0


def shard_name(stream_name: str, shard_id: str) -> str:
    """A shard as log lines and errors name it: with its stream, since one process may read
    shards of several streams (a SQL query of several, a union of DStreams), and two streams
    can both have shardId-000000000000."""
    return f"stream {stream_name!r} shard {shard_id}"


@dataclass(frozen=True)
class ShardRange:
    """One shard's read in one batch: which shard, and what bounds its start.

    ``floor`` is the lease's checkpoint when the lease period began (or a sentinel, with
    ``floor_timestamp`` for AT_TIMESTAMP): the period's first batch starts there. ``since_ms``
    is that batch's time; a range recorded before it belongs to an earlier period. ``start``,
    when the planner knows it, is where the previous batch ended, and ``iterator`` the
    NextShardIterator that batch's read handed back (valid at ``start``). ``record_empty``
    records an empty read's range too, for callers that cannot tell a task which computation
    of the partition is the first. ``max_bytes`` caps a new range's bytes as ``max_records`` its
    records; ``max_bytes_per_s`` and ``min_fetch_period_s`` space its GetRecords calls.
    """

    stream_key: str
    shard_id: str
    batch_ms: int
    floor: ExtendedSequenceNumber
    floor_timestamp: float | None
    since_ms: int
    max_records: int
    time_budget_s: float
    start: ExtendedSequenceNumber | None = None
    start_timestamp: float | None = None
    owner: str | None = None  # the driver's worker id: read only while it holds the lease
    iterator: str | None = field(default=None, repr=False)
    record_empty: bool = False
    max_bytes: int = 0  # a new range stops once it read this many bytes (0: no cap)
    max_bytes_per_s: float = 0.0  # pacing of the read's GetRecords calls (0: none)
    min_fetch_period_s: float = 0.0
    # Under fan-out: the process holding the shard's subscription after the previous
    # batch, asked to read this range, and the driver's key that process serves (see
    # ``subscription_peers``).
    subscriber: str | None = None
    peer_key: PeerKey | None = field(default=None, repr=False)
    # What the shard's previous read returned (records): the heaviest shards get tasks of
    # their own (``shard_groups.group_shards``).
    weight: float = 0.0
    # Epoch s before which the shard is expected to refuse reads: the previous read's pages
    # spent its 2 MiB/s ahead (``BatchRange.ready_at``). A new polling range waits for it.
    not_before: float = 0.0
    # Polling, where the driver asks for it (the SQL source, given ``peer_key``): a reading
    # that leaves the shard on a backlog reads its next page ahead, this many records at
    # most (``prefetch``); 0: nothing is read ahead.
    ahead_records: int = 0


@dataclass(frozen=True)
class ReadReport:
    """What a task tells the planner about one shard's read (small; no records)."""

    batch_range: BatchRange
    millis_behind_latest: int | None = None
    data_bytes: int = 0
    get_records_calls: int = 0
    get_records_ms: float = 0.0
    reader_pid: int = 0
    recorded: bool = True  # the range is in the batch-range table
    next_iterator: str | None = field(default=None, repr=False)  # valid at batch_range.next_start
    iterator_time: float = 0.0  # epoch seconds when Kinesis handed ``next_iterator`` out
    get_shard_iterator_calls: int = 0
    fresh: bool = True  # the computation was allowed to decide a new range
    throttled: int = 0  # reads (GetRecords, GetShardIterator) Kinesis refused for throughput
    faults: int = 0  # other transient failures the read waited out
    get_records_served: int = 0  # GetRecords calls answered (the KCL's getRecords.Success 1)
    # The read stopped at its time budget or record cap, not at the shard's tip: a backlog
    # waits, and the planner reads the next batch as soon as this one is read.
    more_left: bool = False


@dataclass(frozen=True)
class StartingPosition:
    """Where a read of a shard starts, in Kinesis' words: GetShardIterator's iterator types
    and SubscribeToShard's StartingPosition types are the same. The one mapping from a
    checkpoint (a sequence number or a TRIM_HORIZON/LATEST/AT_TIMESTAMP sentinel) for polling
    and push alike, and the one value where a new SQL query starts (``sql.starting_position``
    parses it). The sequence number and the time are passed by keyword: either may be the
    second value, and a time taken for a sequence number would start somewhere else."""

    type: str
    _: KW_ONLY
    sequence_number: str | None = None
    timestamp: float | None = None

    @classmethod
    def at(cls, checkpoint: ExtendedSequenceNumber, timestamp: float | None,
           shard: str) -> "StartingPosition":
        """AT a checkpoint's sequence number (its aggregate's earlier user records come
        again: ``records_after`` drops them), or at the sentinel it is. ``shard``: the
        shard as a refusal names it (``shard_name``)."""
        sequence_number = checkpoint.sequence_number
        if sequence_number in (TRIM_HORIZON, LATEST):
            return cls(sequence_number)
        if sequence_number == AT_TIMESTAMP:
            if timestamp is None:
                raise ConfigurationError(f"{shard} starts AT_TIMESTAMP but "
                                         "initial_position_timestamp is not set")
            return cls(AT_TIMESTAMP, timestamp=timestamp)
        return cls("AT_SEQUENCE_NUMBER", sequence_number=sequence_number)

    @classmethod
    def after(cls, sequence_number: str) -> "StartingPosition":
        return cls("AFTER_SEQUENCE_NUMBER", sequence_number=sequence_number)

    def as_request(self) -> dict[str, Any]:
        """SubscribeToShard's ``StartingPosition``."""
        request: dict[str, Any] = {"Type": self.type}
        if self.sequence_number is not None:
            request["SequenceNumber"] = self.sequence_number
        if self.timestamp is not None:
            request["Timestamp"] = _dt.datetime.fromtimestamp(float(self.timestamp),
                                                              tz=_dt.timezone.utc)
        return request


def records_after(records: list[Record], position: ExtendedSequenceNumber) -> list[Record]:
    """The user records after ``position`` (records come in shard order): a read that starts
    AT a checkpoint's sequence number gets the user records at or before it again."""
    for index, record in enumerate(records):
        if record.extended_sequence_number > position:
            return records[index:]
    return []
