"""The retrieval model both Spark APIs share: what a batch reads of a shard, and what it read.

The driver plans a ``ShardRange`` per shard and batch; a task reads it and hands back a
``ReadReport`` (small, no records). ``start_after`` is the one rule for where a shard's next
read starts, for the driver (from a report) and for a task that looks the previous batch up.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..aws.range_table import BatchRange
from ..records import ExtendedSequenceNumber

# How long one read of one shard may last. Only a backlog reaches it: a shard that is caught
# up stops at its tip. A batch that reads a backlog is late anyway, and bigger reads spread
# each batch's fixed cost over more records. Record caps bound the batch's size.
MAX_FETCH_TIME_PER_SHARD_S = 5.0
# A handed-back iterator is used while younger than this: Kinesis expires it after 5 minutes.
ITERATOR_TTL_S = 240.0


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


def start_after(previous: BatchRange | None, floor: ExtendedSequenceNumber,
                floor_timestamp: float | None) -> tuple[ExtendedSequenceNumber, float | None]:
    """Where a shard's next read starts: where its previous batch in this lease period ended,
    or the period's floor. The one rule, for the driver (from a read's report) and for a task
    that looks the previous batch up."""
    if previous is not None:
        return previous.next_start, previous.start_timestamp
    return floor, floor_timestamp
